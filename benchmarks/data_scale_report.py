"""The 10 GB extrapolation and the markdown table `python -m benchmarks.data_scale` prints: tokenize rows, the
cached-corpus training figures and the extrapolation (the measurements themselves: benchmarks/data_scale.py)."""

from __future__ import annotations

from pathlib import Path

PINNED = "null, pinned to 1 core"
TEN_GB = 10 * 10**9
ISSUE_BEFORE = {
    "50 MB .txt": {"tokenize_s": 7.6, "peak_rss_mib": 934},  # issue 16, same machine, before the rewrite
    "100 MB .txt": {"tokenize_s": 14.5, "peak_rss_mib": 1651},
    "100 MB .jsonl": {"tokenize_s": 16.5, "peak_rss_mib": 361},
}


def extrapolate(rows: list[dict]) -> list[dict]:
    """10 GB from the largest size: time, tokens and cache linear in text bytes; peak RSS as measured (flat)."""
    label = max(rows, key=lambda r: r["text_bytes"])["label"]
    return [
        {
            "corpus": f"10GB .{r['format']}",
            "num_proc": r["num_proc"],
            "from": r["corpus"],
            **{key: r[key] * TEN_GB / r["text_bytes"] for key in ("tokenize_s", "hash_s", "tokens", "cache_bytes")},
            "peak_rss_mib": r["peak_rss_mib"],
        }
        for r in rows
        if r["label"] == label
    ]


def _mb(b: float) -> str:  # MB (decimal)
    return f"{b / 1e6:,.0f}" if b >= 1e7 else f"{b / 1e6:,.1f}"


def _f(v, fmt: str = "{:.2f}") -> str:
    return "n/a" if v is None else fmt.format(v)


def _pct(v) -> str:
    return "n/a" if v is None else f"{100 * v:.0f} %"


def markdown(res: dict) -> str:
    out = [
        "| corpus | num_proc | full hash s | tokenize s | MB/s | cores used | peak RSS MiB | tokens | "
        "cache MB (× text) | progress lines | outside load |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    out += [
        f"| {r['corpus']} ({_mb(r['text_bytes'])} MB) | {r['num_proc'] or PINNED} | {r['hash_s']:.1f} | "
        f"{r['tokenize_s']:.1f} | {r['mb_per_s']:.1f} | {r['cores_used']:.2f} | {r['peak_rss_mib']:,.0f} | "
        f"{r['tokens']:,} | {_mb(r['cache_bytes'])} ({r['cache_over_text']:.2f}×) | {r['progress_lines']} | "
        f"{_pct(r['foreign'])} |"
        for r in res["tokenize"]
    ]
    out += [
        "",
        "| cached corpus | TextData on a hit s | command → first step s: median (runs) | of it: launch → "
        "loop | of it: eval at step 0 + step 1 | whole command s | outside load |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in res["train"]:
        runs = ", ".join(_f(r["first_step_s"]) for r in t["first_step"])
        out.append(
            f"| {Path(t['corpus']).name}{'' if t['cache_hit'] else ' (NOT a cache hit)'} | "
            f"{t['data_ready_s']:.2f} | {_f(t['first_step_s'])} ({runs}) | {_f(t['setup_s'])} | "
            f"{_f(t['loop_s'])} | {_f(t['total_s'])} | {_pct(t['foreign'])} |"
        )
    out += [
        "",
        "| cached corpus | train.prefetch | batch wait ms/step (median) | step ms (median) | data share | "
        "outside load (the run's own figure) |",
        "|---|---|---|---|---|---|",
    ]
    out += [
        f"| {Path(t['corpus']).name} | {_f(s['prefetch'], '{}')} | {_f(s['data_ms_median'], '{:.3f}')} | "
        f"{_f(s['step_ms_median'], '{:.1f}')} | {_f(s['data_share'] and 100 * s['data_share'], '{:.2f} %')} | "
        f"{_pct(s['run_outside_load'])} |"
        for t in res["train"]
        for s in t["data_share"]
    ]
    out += [
        "",
        "| 10 GB (extrapolated from) | num_proc | tokenize | full hash | peak RSS MiB | tokens | cache GB |",
        "|---|---|---|---|---|---|---|",
    ]
    out += [
        f"| {e['corpus']} ({e['from']}) | {e['num_proc'] or PINNED} | {e['tokenize_s'] / 60:.0f} min | "
        f"{e['hash_s'] / 60:.1f} min | {e['peak_rss_mib']:,.0f} | {e['tokens'] / 1e9:.2f} B | "
        f"{e['cache_bytes'] / 1e9:.1f} |"
        for e in res["extrapolation_10GB"]
    ]
    return "\n".join(out)
