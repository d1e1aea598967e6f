"""What every probe shares: scored forwards over a fixed set (eager, eval mode, no grad) and a set's fingerprint."""

from __future__ import annotations

import contextlib
import hashlib
import sys
import time
from collections.abc import Iterator

import torch

IGNORE = -100


def set_fingerprint(name: str, *tensors: torch.Tensor) -> str:
    """A short hash of a probe's name and its set's tensors (shapes and values): equal sets, equal fingerprints."""
    h = hashlib.blake2b(name.encode(), digest_size=8)
    for t in tensors:
        h.update(str(tuple(t.shape)).encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return f"{name}:{h.hexdigest()}"


@contextlib.contextmanager
def probing(model) -> Iterator[None]:
    """Eval mode, no grad and eager (a model compiled in place would recompile for every new probe length)."""
    # torch._dynamo not imported: nothing was compiled, and importing it for set_stance would cost ~1 s
    eager = torch.compiler.set_stance("force_eager") if "torch._dynamo" in sys.modules else contextlib.nullcontext()
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), eager:
            yield
    finally:
        model.train(was_training)


def rows_per_forward(tokens_per_forward: int, seq_len: int) -> int:
    """How many sequences of seq_len one forward takes: no more tokens than a training micro-batch (at least 1)."""
    return max(1, tokens_per_forward // seq_len)


def answers(model, x: torch.Tensor, y: torch.Tensor, hardware, tokens_per_forward: int) -> torch.Tensor:
    """(N, T) bool: argmax of the model's logits equals y, at every position (y = -100: False); CPU."""
    device, rows = hardware.device, rows_per_forward(tokens_per_forward, x.size(1))
    out = []
    for i in range(0, len(x), rows):
        xb, yb = x[i : i + rows].to(device), y[i : i + rows].to(device)
        with hardware.autocast():
            logits, _ = model(xb)  # (b, T, V)
        out.append(((logits.argmax(-1) == yb) & (yb != IGNORE)).cpu())
    return torch.cat(out)


def mean_loss(model, x: torch.Tensor, y: torch.Tensor, hardware, tokens_per_forward: int) -> float:
    """Token-weighted mean of the model's own loss over every scored target of (x, y) (N, T)."""
    device, rows = hardware.device, rows_per_forward(tokens_per_forward, x.size(1))
    total, count = 0.0, 0
    for i in range(0, len(x), rows):
        xb, yb = x[i : i + rows].to(device), y[i : i + rows].to(device)
        with hardware.autocast():
            _, loss = model(xb, yb)
        n = int((yb != IGNORE).sum().item())
        total += float(loss.item()) * n
        count += n
    return total / max(1, count)


def measure_probes(probes: list, model, hardware, tokens_per_forward: int) -> tuple[dict[str, float], float]:
    """Every probe's {probe/...: value} at this eval, and the seconds they took (the model left as it was)."""
    if not probes:
        return {}, 0.0
    t0 = time.perf_counter()
    out: dict[str, float] = {}
    with probing(model):
        for probe in probes:
            out |= probe.measure(model, hardware, tokens_per_forward)
    return out, time.perf_counter() - t0
