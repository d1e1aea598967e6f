"""In-process GPU checks: the device and its datasheet peak, every attention x position x impl against naive,
which SDPA kernel masked GQA lands on, flex with and without torch.compile, and attention memory at long T.

Each check takes (device, sizes) and returns {"ok": bool, "detail": one line, ...figures}.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from gptlab.config.build import build_model, compose
from gptlab.errors import ConfigError
from gptlab.model.attention.kernels import check_impl

CONF = Path(__file__).resolve().parents[1] / "conf"
BASE = ["~data", "model.n_layer=2", "model.n_head=8"]
D_MODEL = 512  # a sizes dict may give its own "d_model" (the study's CPU dry run: 64, as bf16 is emulated there)
VOCAB = 256
IMPLS = ("sdpa", "flash", "flex")
MATH_OP = "aten::_scaled_dot_product_attention_math"


def choices(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def model(overrides: list[str], T: int, impl: str, device: str, state: dict | None = None, d_model: int = D_MODEL):
    """A 2-layer GPT (8 heads, d_model 512 unless told) with this attention impl; weights from `state` when given."""
    cfg = compose([*BASE, f"model.d_model={d_model}", f"model.block_size={T}", *overrides, f"attention.impl={impl}"])
    torch.manual_seed(0)
    net = build_model(cfg, vocab_size=VOCAB, device=device)
    if state is not None:
        net.load_state_dict(state)
    return net


def batch(B: int, T: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.randint(0, VOCAB, (B, T + 1), generator=torch.Generator().manual_seed(0)).to(device)
    return idx[:, :-1], idx[:, 1:]


def loss_and_grads(net, x, y, dtype=torch.bfloat16) -> tuple[float, dict]:
    """Forward + backward under autocast; (loss, {param name: grad as fp32})."""
    net.zero_grad(set_to_none=True)
    with torch.autocast(device_type=x.device.type, dtype=dtype, enabled=dtype != torch.float32):
        _, loss = net(x, y)
    loss.backward()
    return loss.item(), {n: p.grad.float() for n, p in net.named_parameters() if p.grad is not None}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def check_device(device: str, sizes: dict) -> dict:
    """The GPU, its capability, the datasheet peak gptlab measures MFU against (bf16; fp32 with TF32 on/off), and
    the dense matmul peak measured the way a GPU without a datasheet entry gets it: within 30-115 % of the sheet."""
    from gptlab.runtime.hardware import Hardware

    index = torch.device(device).index or 0
    out = {
        "name": torch.cuda.get_device_name(index),
        "capability": list(torch.cuda.get_device_capability(index)),
        "count": torch.cuda.device_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    try:
        out |= {
            f"peak_{k}": Hardware(device=device, dtype=d, tf32=t).resolved_peak_flops(None)
            for k, d, t in (("bf16", "bf16", True), ("fp32_tf32", "fp32", True), ("fp32_ieee", "fp32", False))
        }
    except ConfigError as err:
        return out | {"ok": False, "detail": str(err)}
    # The path a GPU without a datasheet entry takes (MFU's measured denominator), run here against the datasheet.
    out |= {
        f"measured_{k}": Hardware(device=device, dtype=d, tf32=True)._measured_gpu_peak(index, None)
        for k, d in (("bf16", "bf16"), ("fp32_tf32", "fp32"))
    }
    ratio = {k: out[f"measured_{k}"] / out[f"peak_{k}"] for k in ("bf16", "fp32_tf32")}
    return out | {
        "ok": all(0.3 <= r <= 1.15 for r in ratio.values()),
        "detail": f"{out['name']} sm_{out['capability'][0]}{out['capability'][1]}: bf16 peak "
        f"{out['peak_bf16'] / 1e12:.0f} TFLOP/s, TF32 {out['peak_fp32_tf32'] / 1e12:.0f} (datasheet); measured "
        f"dense matmul {out['measured_bf16'] / 1e12:.0f} and {out['measured_fp32_tf32'] / 1e12:.0f} "
        f"({100 * ratio['bf16']:.0f} % and {100 * ratio['fp32_tf32']:.0f} % of the datasheet)",
    }


def _combo(att: str, pos: str, impl: str, T: int, device: str, ref: tuple, d_model: int) -> dict:
    """One attention/position/impl against the naive model's loss and gradients (same weights, same batch)."""
    net = model([f"attention={att}", f"position={pos}"], T, impl, device, state=ref[2], d_model=d_model)
    a = net.blocks[0].attn
    try:
        check_impl(
            impl,
            device=device,
            dtype=torch.bfloat16,
            window=a.window,
            uses_bias=net.position.has_score_bias,
            dropout=a.dropout,
        )
    except ConfigError as err:
        return {"ok": True, "refused": str(err)}  # e.g. flash with a window: refused at build time by design
    loss, grads = loss_and_grads(net, *ref[3])
    worst = max(rel_err(grads[n], g) for n, g in ref[1].items())
    ok = abs(loss - ref[0]) <= 2e-2 * abs(ref[0]) and worst <= 5e-2  # bf16: both sides round differently
    return {"ok": ok, "loss": loss, "naive_loss": ref[0], "worst_grad_rel_err": worst}


def check_attention_matrix(device: str, sizes: dict) -> dict:
    """Every attention x position x impl at T in bf16, forward and backward, against the naive kernel."""
    T, d_model, rows = sizes["T"], sizes.get("d_model", D_MODEL), {}
    xy = batch(2, T, device)
    for att in choices("attention"):
        for pos in choices("position"):
            naive = model([f"attention={att}", f"position={pos}"], T, "naive", device, d_model=d_model)
            loss, grads = loss_and_grads(naive, *xy)
            ref = (loss, grads, naive.state_dict(), xy)
            for impl in IMPLS:
                # each model's flex is compiled afresh: past dynamo's recompile limit (8) flex falls back to its
                # unfused eager path (seen on the H200, 2026-11-27), and the compiled kernel would go unchecked
                torch._dynamo.reset()
                rows[f"{att}/{pos}/{impl}"] = _combo(att, pos, impl, T, device, ref, d_model)
            del naive, ref
    bad = [k for k, r in rows.items() if not r["ok"]]
    ran = sum("refused" not in r for r in rows.values())
    shape = f"T={T}" + (f", d_model {d_model}" if d_model != D_MODEL else "")
    detail = f"{ran} combinations match naive at {shape} bf16" if not bad else f"differ from naive: {', '.join(bad)}"
    return {"ok": not bad, "detail": detail, "rows": rows}


def _sdpa_ops(overrides: list[str], T: int, device: str, dtype) -> set[str]:
    """The SDPA aten ops a forward+backward of this model runs (torch.profiler)."""
    net = model(overrides, T, "sdpa", device)
    xy = batch(2, T, device)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        loss_and_grads(net, *xy, dtype=dtype)
        torch.cuda.synchronize()
    return {e.key for e in prof.key_averages() if "scaled_dot_product" in e.key or "attention" in e.key.lower()}


def check_masked_gqa_kernels(device: str, sizes: dict) -> dict:
    """GQA with a mask (ALiBi, sliding window) and GQA in fp32 never run SDPA's math kernel."""
    cases = {
        "gqa+alibi bf16": (["attention=gqa", "position=alibi"], torch.bfloat16),
        "gqa+sliding bf16": (["attention=sliding", "attention.n_kv_head=2"], torch.bfloat16),
        "mqa+sliding bf16": (["attention=sliding", "attention.n_kv_head=1"], torch.bfloat16),
        "gqa fp32": (["attention=gqa"], torch.float32),
    }
    ops = {name: sorted(_sdpa_ops(o, sizes["T"], device, dt)) for name, (o, dt) in cases.items()}
    math = [name for name, names in ops.items() if MATH_OP in names]
    return {
        "ok": not math,
        "ops": ops,
        "detail": f"math kernel in: {', '.join(math)}" if math else "no math SDPA kernel in any masked/fp32 GQA case",
    }


def _timed_step(net, xy, repeats: int = 5) -> float:
    """Median seconds of forward+backward (after one warm-up, which includes any compilation)."""
    loss_and_grads(net, *xy)
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss_and_grads(net, *xy)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def check_flex_compile(device: str, sizes: dict) -> dict:
    """flex in an eager model (flex compiled on its own) and in a torch.compile'd model: no graph breaks, same loss."""
    T, over = sizes["T"], ["attention=sliding", "attention.n_kv_head=2", "position=alibi"]
    xy = batch(2, T, device)
    eager = model(over, T, "flex", device)
    ref_loss, _ = loss_and_grads(model(over, T, "naive", device, state=eager.state_dict()), *xy)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(eager)(xy[0])
    compiled = torch.compile(model(over, T, "flex", device, state=eager.state_dict()))
    out = {
        "graph_breaks": explained.graph_break_count,
        "eager_ms": 1e3 * _timed_step(eager, xy),
        "compiled_ms": 1e3 * _timed_step(compiled, xy),
        "naive_loss": ref_loss,
        "eager_loss": loss_and_grads(eager, *xy)[0],
        "compiled_loss": loss_and_grads(compiled, *xy)[0],
    }
    close = all(abs(out[k] - ref_loss) <= 2e-2 * abs(ref_loss) for k in ("eager_loss", "compiled_loss"))
    ok = out["graph_breaks"] == 0 and close
    return out | {
        "ok": ok,
        "detail": f"{out['graph_breaks']} graph breaks; fwd+bwd {out['eager_ms']:.1f} ms eager "
        f"(flex compiled alone), {out['compiled_ms']:.1f} ms whole model compiled",
    }


def _peak_bytes(impl: str, T: int, device: str) -> int:
    """Peak memory a forward+backward adds on top of the model (B=1, bf16), for this attention impl."""
    net = model(["attention=gqa", "position=rope"], T, impl, device)
    xy = batch(1, T, device)
    loss_and_grads(net, *xy)  # warm-up: compiled flex, cuBLAS workspaces, gradients allocated
    net.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    loss_and_grads(net, *xy)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated(device) - base


def check_attention_memory(device: str, sizes: dict) -> dict:
    """Peak memory of sdpa and flex vs naive at long T (naive writes the (B, H, T, T) scores)."""
    T = sizes["T_mem"]
    peaks = {impl: _peak_bytes(impl, T, device) for impl in ("naive", "sdpa", "flex")}
    ok = peaks["sdpa"] < peaks["naive"] and peaks["flex"] < peaks["naive"]
    mib = {k: v / 2**20 for k, v in peaks.items()}
    return {
        "ok": ok,
        "peak_bytes": peaks,
        "detail": f"T={T}: naive {mib['naive']:.0f} MiB, sdpa {mib['sdpa']:.0f} "
        f"MiB, flex {mib['flex']:.0f} MiB above the model",
    }
