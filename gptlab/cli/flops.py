"""gptlab-flops: params, FLOPs, bytes, intensity, KV cache, memory and roofline for any training config.

Takes the same overrides as gptlab-train plus `mode=train|prefill|decode batch_size=B seq_len=N
format=table|json`. Touches no data and writes no files: the model is built on the meta device, one block
per distinct layer kind, and vocab_size comes from model.vocab_size, or 50257 (the GPT-2 tokenizer) when null.
"""

from __future__ import annotations

import json
import shutil
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from gptlab.cli import fail
from gptlab.errors import ConfigError
from gptlab.paths import CONF_DIR

DEFAULT_VOCAB = 50257  # GPT-2 BPE, the tokenizer default when model.vocab_size is null
FORMATS = ("table", "json")


def _int_key(cfg: DictConfig, key: str, fallback_key: str) -> int:
    value = OmegaConf.select(cfg, key)
    if value is None:
        value = OmegaConf.select(cfg, fallback_key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key}={value!r}: expected a positive integer (null = {fallback_key})")
    return value


def _roofs(cfg: DictConfig) -> tuple[float, float, str]:
    """(peak FLOP/s, bandwidth bytes/s, dtype) of the hardware profile; 'auto' is measured once and cached."""
    import torch

    from gptlab.build import build_hardware, cache_dir

    hw = cfg.hardware
    device = str(hw.get("device", "cpu"))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    peak, bw = hw.get("peak_flops", "auto"), hw.get("mem_bandwidth", "auto")
    if "auto" in (peak, bw) and device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"hardware.device={device}: no such device here to measure 'auto' roofs; "
                          "set hardware.peak_flops=<FLOP/s> and hardware.mem_bandwidth=<bytes/s>")
    for key, value in (("peak_flops", peak), ("mem_bandwidth", bw)):
        if value != "auto" and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise ConfigError(f"hardware.{key}={value!r}: expected a positive number or auto")
    if peak == "auto":
        peak = build_hardware(cfg).resolved_peak_flops(cache_dir())
    if bw == "auto":
        from gptlab.costs.peak import cached_bandwidth

        bw = cached_bandwidth(device, cache_dir())
    return float(peak), float(bw), _dtype(str(hw.get("dtype", "bf16")), device)


def _dtype(dtype: str, device: str) -> str:
    """hardware.dtype, with auto resolved as training would resolve it here (bf16 for a GPU not present)."""
    if dtype != "auto":
        return dtype
    import torch

    from gptlab.hardware import native_low_precision

    if device.startswith("cuda") and not torch.cuda.is_available():
        return "bf16"  # costing a GPU profile elsewhere: the datasheet GPUs gptlab targets run bf16
    return native_low_precision(device)


def run(cfg: DictConfig):
    """The CostReport the composed flops config asks for (raises ConfigError on bad input)."""
    from gptlab.build import cost_report
    from gptlab.costs import MODES

    mode, fmt = str(cfg.mode), str(cfg.format)
    if mode not in MODES:
        raise ConfigError(f"mode={mode}: not allowed; allowed: {', '.join(MODES)}")
    if fmt not in FORMATS:
        raise ConfigError(f"format={fmt}: not allowed; allowed: {', '.join(FORMATS)}")
    batch = _int_key(cfg, "batch_size", "train.batch_size")
    seq = _int_key(cfg, "seq_len", "model.block_size")
    if seq > cfg.model.block_size:
        raise ConfigError(f"seq_len={seq}: exceeds model.block_size={cfg.model.block_size}; use seq_len <= block_size")
    peak, bw, dtype = _roofs(cfg)
    # one block per distinct layer kind, times its layers: model.n_layer=100000 costs seconds, not a build of each
    return cost_report(cfg, batch, seq, vocab_size=DEFAULT_VOCAB, mode=mode, dtype=dtype, peak_flops=peak,
                       mem_bandwidth=bw)


def _si(x: float | None, unit: str = "") -> str:
    """1.23G-style number (binary prefixes for bytes)."""
    if x is None:
        return "-"
    base, prefixes = (1024.0, ["", "Ki", "Mi", "Gi", "Ti", "Pi"]) if unit == "B" else (1000.0, ["", "k", "M", "G", "T", "P"])
    i = 0
    while abs(x) >= base and i < len(prefixes) - 1:
        x, i = x / base, i + 1
    return f"{x:.3g}{prefixes[i]}{unit}"


def _secs(x: float) -> str:
    """Seconds as µs/ms/s with 3 significant digits."""
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if x >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x / 1e-9:.3g}ns"


def _summary_lines(d: dict) -> list[str]:
    p, f, b, kv, mem, hw, t = (d[k] for k in ("params", "flops", "bytes", "kv_cache", "memory", "hardware", "time"))
    comps = ", ".join(f"{k} {_si(v)}" for k, v in p["per_component"].items() if v)
    return [
        f"[bold]{d['mode']}[/]: batch {d['batch_size']} x seq_len {d['seq_len']} = {d['tokens']:,} tokens "
        f"({d['dtype_bytes']} bytes/element, attention {d['attention_path']})",
        f"params        total {p['total']:,}   non-embedding {p['non_embedding']:,}   ({comps})",
        f"FLOPs/token   forward {_si(f['forward_per_token'])}   train {_si(f['train_per_token'])}   "
        f"(useful; step total incl. backward/kernels {_si(f['step_total_kernel'])})",
        f"attention     kernel {_si(f['attention_kernel'])}   useful {_si(f['attention_useful'])} FLOPs (forward)",
        f"bytes (fwd)   naive {_si(b['naive_total'], 'B')}   fused {_si(b['fused_total'], 'B')}   "
        f"score-matrix traffic {_si(b['score_matrix_traffic'], 'B')}",
        f"KV cache      {_si(kv['bytes_per_token'], 'B')}/token   {_si(kv['total_bytes'], 'B')} total   "
        f"weights {_si(d['weights']['bytes'], 'B')}",
        f"inference mem {_si(mem['inference_estimate_bytes'], 'B')} = weights + KV cache"
        if d["mode"] != "train" else
        f"train memory  {_si(mem['train_estimate_bytes'], 'B')} = weights {_si(mem['weights_bytes'], 'B')} + grads "
        f"{_si(mem['grads_bytes'], 'B')} + optimizer {_si(mem['optimizer_bytes'], 'B')} + activations "
        f"{_si(mem['activations_bytes'], 'B')} (naive {_si(mem['activations_naive_bytes'], 'B')}, fused "
        f"{_si(mem['activations_fused_bytes'], 'B')}, checkpointed {_si(mem['activations_checkpointed_bytes'], 'B')})",
        f"roofline      peak {_si(hw['peak_flops'], 'FLOP/s')}   bandwidth {_si(hw['mem_bandwidth'], 'B')}/s   "
        f"ridge {hw['ridge_point']:.0f} FLOP/byte",
        f"verdict       [bold]{d['bound']}-bound[/]: step >= {_secs(t['lower_bound_s'])} "
        f"(compute {_secs(t['compute_s'])}, memory {_secs(t['memory_s'])})",
    ]


def render_table(d: dict) -> None:
    """Print the report as a summary plus one row per op (rich)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(120, shutil.get_terminal_size((120, 40)).columns))
    for line in _summary_lines(d):
        console.print(line, highlight=False)
    table = Table(title="ops (forward FLOPs/bytes; time bound is per step of the mode)")
    for col in ("op", "layers", "FLOPs", "useful", "bytes naive", "bytes fused", "FLOP/byte", "time >=", "share", "bound"):
        table.add_column(col, justify="left" if col == "op" else "right")
    total = d["time"]["lower_bound_s"] or 1.0
    for op in d["ops"]:
        intensity = "-" if op["intensity"] is None else f"{op['intensity']:.3g}"
        table.add_row(op["name"], str(op["layers"]), _si(op["flops"]), _si(op["flops_useful"]),
                      _si(op["bytes_naive"], "B"), _si(op["bytes_fused"], "B"), intensity,
                      _secs(op["time_lower_bound_s"]), f"{100 * op['time_lower_bound_s'] / total:.1f}%",
                      op["bound"])
    console.print(table)


@hydra.main(config_path=str(CONF_DIR), config_name="flops", version_base=None)
def main(cfg: DictConfig) -> None:
    """Print the cost report for the composed config (table or one JSON object)."""
    try:
        report = run(cfg)
    except ConfigError as err:
        fail(err)
    try:
        if str(cfg.format) == "json":
            print(json.dumps(report.to_dict()), flush=True)
        else:
            render_table(report.to_dict())
    except BrokenPipeError:  # e.g. piped into `head`
        sys.stderr.close()


if __name__ == "__main__":
    sys.exit(main())
