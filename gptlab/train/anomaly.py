"""train.detect_anomaly=true: when a step goes non-finite, run it again to find the first op that did it.

Forward: hooks on every module note the first (in execution order) whose output holds a NaN/inf. Backward: under
torch.autograd.detect_anomaly(check_nan=True), autograd names the first backward function that returned NaN and warns
with the forward traceback of the op that created it. One line goes to the log; the traceback to
`diagnostics/anomaly_step_N.txt`. The replay runs on the unwrapped model (no DDP all-reduce; under FSDP2 every rank
replays, as every rank saw the same non-finite step) and leaves no gradients behind.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from gptlab.train.loss import training_loss


def _first_nonfinite(found: list):
    def hook(module, args, out):
        tensors = out if isinstance(out, (tuple, list)) else (out,)
        if not found and any(
            isinstance(t, torch.Tensor) and t.is_floating_point() and not torch.isfinite(t).all() for t in tensors
        ):
            found.append(module)

    return hook


def find_anomaly(model, batches: list, hardware, device: str, run_dir: Path, step: int) -> str:
    """Replay `batches` (this step's micro-batches) through `model`; returns the one-line report."""
    names = {m: n or type(m).__name__ for n, m in model.named_modules()}
    found: list = []
    hooks = [m.register_forward_hook(_first_nonfinite(found)) for m in model.modules()]
    backward_error, trace = None, []
    try:
        for x, y, *docs in batches:  # docs: [the document ids] with data.doc_mask
            x, y = x.to(device), y.to(device)
            with warnings.catch_warnings(record=True) as caught, torch.autograd.detect_anomaly(check_nan=True):
                warnings.simplefilter("always")
                # eager even when compiled in place (hardware.compile): the hooks must see each module's own output
                with hardware.autocast(), torch.compiler.set_stance("force_eager"):
                    loss = training_loss(model, x, y, docs[0].to(device) if docs else None).total
                try:
                    loss.backward()
                except RuntimeError as err:
                    backward_error = str(err).splitlines()[0]
            trace += [str(w.message) for w in caught if "detect_anomaly" not in str(w.message)[:80]]
            if found or backward_error:
                break
    finally:
        for h in hooks:
            h.remove()
        model.zero_grad(set_to_none=True)
    parts = []
    if found:
        parts.append(f"forward: first non-finite output from {names[found[0]]} ({type(found[0]).__name__})")
    if backward_error:
        parts.append(f"backward: {backward_error}")
    if not parts:
        parts.append("the replay stayed finite (the non-finite value came from the optimizer or the reduction)")
    out = Path(run_dir) / "diagnostics" / f"anomaly_step_{step:07d}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(parts) + "\n\n" + "\n\n".join(trace) + "\n")
    return f"anomaly at step {step}: {'; '.join(parts)}; trace: {out}"
