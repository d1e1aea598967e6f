"""gptlab-flops' table: a summary (accounting, intensity per op class, verdicts) and one row per op."""

from __future__ import annotations

import shutil


def _si(x: float | None, unit: str = "") -> str:
    """1.23G-style number: binary prefixes for a size in bytes ("B": KiB, GiB), decimal ones for everything else,
    rates included ("B/s": GB/s, as datasheets and hardware.mem_bandwidth state bandwidth)."""
    if x is None:
        return "-"
    base, prefixes = (
        (1024.0, ["", "Ki", "Mi", "Gi", "Ti", "Pi"]) if unit == "B" else (1000.0, ["", "k", "M", "G", "T", "P"])
    )
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
        f"(useful causal FLOPs, what MFU counts; the step's kernel FLOPs incl. backward {_si(f['step_total_kernel'])})",
        f"attention     kernel {_si(f['attention_kernel'])}   useful {_si(f['attention_useful'])} FLOPs (forward)",
        f"bytes (fwd)   naive {_si(b['naive_total'], 'B')}   fused {_si(b['fused_total'], 'B')}   "
        f"score-matrix traffic {_si(b['score_matrix_traffic'], 'B')}",
        f"KV cache      {_si(kv['bytes_per_token'], 'B')}/token   {_si(kv['total_bytes'], 'B')} total   "
        + (
            f"{_si(kv['total_bytes_windowed'], 'B')} held (windowed layers keep their window)   "
            if kv["total_bytes_windowed"] != kv["total_bytes"]
            else ""
        )
        + f"weights {_si(d['weights']['bytes'], 'B')}",
        f"inference mem {_si(mem['inference_estimate_bytes'], 'B')} = weights + KV cache"
        if d["mode"] != "train"
        else f"train memory  {_si(mem['train_estimate_bytes'], 'B')} = weights {_si(mem['weights_bytes'], 'B')} + grads "
        f"{_si(mem['grads_bytes'], 'B')} + optimizer {_si(mem['optimizer_bytes'], 'B')} + "
        + (f"autocast copies {_si(mem['autocast_copy_bytes'], 'B')} + " if mem.get("autocast_copy_bytes") else "")
        + f"activations {_si(mem['activations_bytes'], 'B')} (naive {_si(mem['activations_naive_bytes'], 'B')}, fused "
        f"{_si(mem['activations_fused_bytes'], 'B')}, checkpointed {_si(mem['activations_checkpointed_bytes'], 'B')})"
        + (
            f" at micro-batch {mem['micro_batch']} (batch / train.grad_accum)"
            if mem.get("micro_batch", d["batch_size"]) != d["batch_size"]
            else ""
        ),
        f"roofline      peak {_si(hw['peak_flops'], 'FLOP/s')}   bandwidth {_si(hw['mem_bandwidth'], 'B/s')}   "
        f"ridge {hw['ridge_point']:.0f} FLOP/byte",
        f"verdict       [bold]{d['bound']}-bound[/]: step >= {_secs(t['lower_bound_s'])} "
        f"(compute {_secs(t['compute_s'])}, memory {_secs(t['memory_s'])})",
        _accounting_line(d["accounting"]),
        *([_documents_line(d["documents"])] if d.get("documents") else []),
    ]


def _documents_line(doc: dict) -> str:
    """data.doc_mask: what the document mask saves of the attention FLOPs (costs/documents.py), and what MFU counts."""
    how = (
        "flex skips tiles with no pair of one document"
        if doc["skips_masked_blocks"]
        else "this kernel computes every score, then masks (sdpa, naive): no FLOPs saved"
    )
    if doc["doc_length"] is None:
        figure = "give doc_length=<tokens per document> for a figure"
    else:
        figure = (
            f"at {doc['doc_length']:,}-token documents attention kernel {_si(doc['attention_kernel'])} -> "
            f"{_si(doc['attention_kernel_documents'])} FLOPs ({100 * doc['kernel_saved_share']:.0f}% saved), useful "
            f"{_si(doc['attention_useful'])} -> {_si(doc['attention_useful_documents'])}"
        )
    return f"documents     data.doc_mask: {how}; {figure}; MFU counts the unmasked causal FLOPs"


def _accounting_line(acc: dict) -> str:
    """The conventions the figures were counted with (conf/flops.yaml: mask_pass, elementwise, blocks_only)."""
    own = ", ".join(acc["unfused"]) or "none"
    return (
        f"accounting    mask {'its own pass' if acc['mask_pass'] else 'folded into scores'}; "
        f"element-wise own passes: {own}; "
        f"{'transformer blocks only' if acc['blocks_only'] else 'embeddings and LM head counted'}"
    )


def _intensity_table(d: dict):
    """Forward arithmetic intensity per op class and of the whole forward, with a verdict against the ridge."""
    from rich.table import Table

    ridge, it = d["hardware"]["ridge_point"], d["intensity"]
    table = Table(title=f"forward intensity ({d['attention_path']}; ridge {ridge:.0f})")
    for col in ("op class", "FLOPs", "bytes", "FLOP/byte", "bound"):
        table.add_column(col, justify="left" if col == "op class" else "right")
    rows = [(name, c) for name, c in it["classes"].items()]
    rows.append(
        (
            "forward (all)",
            {
                "flops": it["forward_flops"],
                "bytes": it["forward_bytes"],
                "intensity": it["forward"],
                "bound": it["forward_bound"],
            },
        )
    )
    for name, c in rows:
        value = "-" if c["intensity"] is None else f"{c['intensity']:.3g}"
        table.add_row(name, _si(c["flops"]), _si(c["bytes"], "B"), value, c["bound"])
    return table


_MEMORY_ROWS = (
    ("params_bytes", "parameters (fp32 master)"),
    ("grads_bytes", "gradients (fp32)"),
    ("optimizer_bytes", "optimizer state"),
    ("autocast_copy_bytes", "autocast weight copies (ddp)"),
    ("unsharded_bytes", "gathered params + unsharded grads (fsdp)"),
    ("activations_bytes", "activations"),
)


def _memory_table(sh: dict):
    """Per-rank memory, term by term (sharding.per_rank's dict); an fsdp rank on its own runs unwrapped, as ddp."""
    from rich.table import Table

    n, mem, p = sh["world_size"], sh["memory"], sh["params"]["total"]
    whole = sh["strategy"] == "ddp" or n == 1
    kept = ("replicated" if n > 1 else "whole (one process, not wrapped)") if whole else f"1/{n} (ceil of dim-0 rows)"
    table = Table(
        title=f"per rank: {sh['strategy']} over N={n} ranks, micro-batch {sh['micro_batch']} x "
        f"{sh['seq_len']} (batch {sh['batch_size']} / grad_accum {sh['grad_accum']} / {n}); "
        f"weights, grads, state {kept}"
    )
    for col in ("term", "bytes/param", "per rank"):
        table.add_column(col, justify="left" if col == "term" else "right")
    skip = "unsharded_bytes" if whole else "autocast_copy_bytes"
    for key, label in (row for row in _MEMORY_ROWS if row[0] != skip):
        table.add_row(label, f"{mem[key] / p:.3g}", _si(mem[key], "B"))
    table.add_row("[bold]total[/]", f"{mem['total_bytes'] / p:.3g}", f"[bold]{_si(mem['total_bytes'], 'B')}[/]")
    if mem["host_bytes"]:
        table.add_row(
            "host: params, grads, state (cpu_offload)", f"{mem['host_bytes'] / p:.3g}", _si(mem["host_bytes"], "B")
        )
    return table


def _communication_table(sh: dict):
    """Bytes each rank sends per optimizer step, per collective, with its formula and time at the link's bandwidth."""
    from rich.table import Table

    comm, params = sh["communication"], sh["params"]
    link = comm["link_bandwidth"]
    counts = f"P = {params['total']:,} params"
    if sh["strategy"] == "fsdp":
        counts += f", Ps = {params['sharded']:,} per rank, Ps_blocks = {params['sharded_blocks']:,} of them in blocks"
    table = Table(title=f"communication per optimizer step: bytes each rank sends (ring; {counts})")
    for col in ("collective", "formula", "calls", "bytes/step", f"time at {link / 1e9:.3g} GB/s" if link else "time"):
        table.add_column(col, justify="left" if col in ("collective", "formula") else "right")
    for c in comm["collectives"]:
        table.add_row(
            c["name"],
            c["formula"],
            str(c["calls_per_step"]),
            _si(c["bytes_per_step"], "B"),
            _secs(c["bytes_per_step"] / link) if link and c["bytes_per_step"] else "-",
        )
    table.add_row(
        "[bold]total[/]", "", "", _si(comm["bytes_per_step"], "B"), _secs(comm["time_s"]) if comm["time_s"] else "-"
    )
    return table


def _verdict_line(sh: dict) -> str:
    """Fits or not on the device, with the smallest world size that fits."""
    dev = sh["device"]
    if dev is None or dev.get("memory_bytes") is None:
        return "verdict       no device memory known: give gpu=<GPU name> or gpu_memory=<bytes>"
    shared = f" for {sh['world_size']} ranks" if dev["shared_by_ranks"] else " per rank"
    word = "[bold]fits[/]" if dev["fits"] else "[bold]does not fit[/]"
    smallest = dev["smallest_world_size"]
    tried = " ".join(str(k) for k in dev["world_sizes_tried"])
    best = (
        f"smallest N that fits: {smallest}"
        if smallest is not None
        else "fits at no N; raise train.grad_accum, turn on hardware.activation_checkpointing, or pick a smaller model"
    )
    return (
        f"verdict       {word}: {_si(dev['need_bytes'], 'B')}{shared} vs {_si(dev['memory_bytes'], 'B')} on "
        f"{dev['name']} ({dev['source']}); {best} (N tried: {tried})"
    )


def render_table(d: dict) -> None:
    """Print the report as a summary plus one row per op (rich)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(120, shutil.get_terminal_size((120, 40)).columns))
    for line in _summary_lines(d):
        console.print(line, highlight=False)
    console.print(_intensity_table(d))
    table = Table(title="ops (forward FLOPs/bytes; time bound is per step of the mode)")
    for col in (
        "op",
        "layers",
        "kernel FLOPs",
        "useful",
        "bytes naive",
        "bytes fused",
        "FLOP/byte",
        "time >=",
        "share",
        "bound",
    ):
        table.add_column(col, justify="left" if col == "op" else "right")
    total = d["time"]["lower_bound_s"] or 1.0
    for op in d["ops"]:
        intensity = "-" if op["intensity"] is None else f"{op['intensity']:.3g}"
        table.add_row(
            op["name"],
            str(op["layers"]),
            _si(op["flops"]),
            _si(op["flops_useful"]),
            _si(op["bytes_naive"], "B"),
            _si(op["bytes_fused"], "B"),
            intensity,
            _secs(op["time_lower_bound_s"]),
            f"{100 * op['time_lower_bound_s'] / total:.1f}%",
            op["bound"],
        )
    console.print(table)
    if d.get("sharding"):
        console.print(_memory_table(d["sharding"]))
        console.print(_communication_table(d["sharding"]))
        console.print(_verdict_line(d["sharding"]), highlight=False)
