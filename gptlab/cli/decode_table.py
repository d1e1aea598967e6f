"""gptlab-decode's printed output: one progress line per measured (or skipped) point and the final aligned table
(mean ± std over repeats, skipped points with their reason, the peak-memory method and the outside load)."""

from __future__ import annotations


def progress(p: dict) -> str:
    head = f"[decode] batch {p['batch']} context {p['context']} cache={p['cache']}:"
    if p["status"] != "measured":
        return f"{head} skipped ({p['reason']})"
    return f"{head} {p['decode_tokens_per_s']['mean']:,.0f} tokens/s, p50 {p['latency_ms_p50']['mean']:.2f} ms/token"


def _pm(fig: dict | None, fmt: str) -> str:
    if not fig:
        return "–"
    return format(fig["mean"], fmt) + ("" if fig["std"] is None else f" ± {format(fig['std'], fmt)}")


def _mib(x) -> str:
    return "–" if x is None else f"{x / 2**20:,.2f}"


TABLE = [
    "batch",
    "context",
    "cache",
    "prefill ms",
    "decode tokens/s",
    "p50 ms",
    "p90 ms",
    "p99 ms",
    "KV MiB measured",
    "KV MiB predicted",
    "ratio",
    "peak Δ MiB",
]


def table(doc: dict) -> str:
    """The points as an aligned text table (mean ± std over repeats), skipped points with their reason."""
    rows = [TABLE]
    for p in doc["points"]:
        head = [str(p["batch"]), str(p["context"]), p["cache"]]
        if p["status"] != "measured":
            rows.append(head + [f"skipped: {p['reason']}"])
            continue
        ratio = "–" if p["kv_bytes_ratio"] is None else f"{p['kv_bytes_ratio']:.4f}"
        rows.append(
            head
            + [_pm(p["prefill_ms"], ".1f"), _pm(p["decode_tokens_per_s"], ",.0f")]
            + [_pm(p[f"latency_ms_p{q}"], ".2f") for q in (50, 90, 99)]
            + [
                _mib(p["kv_bytes_measured"]),
                _mib(p["kv_bytes_predicted"]),
                ratio,
                _mib(p["peak_mem_delta_bytes"]["mean"]),
            ]
        )
    widths = [max(len(r[i]) for r in rows if len(r) > i and len(r) == len(TABLE)) for i in range(len(TABLE))]
    lines = [
        "  ".join(c.rjust(w) for c, w in zip(r, widths))
        if len(r) == len(TABLE)
        else "  ".join(c.rjust(w) for c, w in zip(r[:3], widths)) + "  " + r[3]
        for r in rows
    ]
    load = doc.get("outside_load")
    foot = [
        f"mean ± std over {doc['settings']['repeats']} repeats; {doc['hardware']['device']} "
        f"{doc['hardware']['dtype']}, {doc['hardware']['threads']} threads; peak memory: {doc['peak_mem_method']}",
        "outside load: " + ("n/a" if load is None else f"{100 * load:.0f}% of the cores used by other processes"),
    ]
    return "\n".join(lines + foot)
