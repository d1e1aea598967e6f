"""The decode table in words: its cells from the decode rows, and the table as a section of the report."""

from __future__ import annotations

from gptlab.compare.render import words
from gptlab.compare.render.sections import Document, Table
from gptlab.compare.statistics import stats
from gptlab.compare.statistics.speed import mem_text
from gptlab.compare.statistics.verdict import Status, Verdict
from gptlab.compare.tables.decode import DecodeRow

HEADERS = [
    "label",
    "batch",
    "context",
    "cache",
    "decode tokens/s",
    "speed-up (95% CI)",
    "p50 ms/token",
    "p50 latency speed-up (95% CI)",
    "p99 ms/token",
    "prefill ms",
    "KV measured",
    "KV predicted",
    "measured/predicted",
    "peak Δ mem",
]


NOTE = (
    "decode: mean ± std over the timed repeats of each group's runs (gptlab-decode); speed-ups are vs the "
    "baseline's same (batch, context, cache) point: ratio of geometric means with a 95% CI and a Welch verdict "
    f"on the logs (p < {stats.ALPHA}) of one value per run (the geometric mean of its repeats; with one run on a "
    "side, the repeats of that one process, flagged); p50 latency speed-up = baseline latency / this latency; "
    "KV measured from the cache tensors vs gptlab-flops' prediction."
)


def _pm(values: list[float], fmt: str) -> str:
    if not values:
        return "–"
    std = stats.std(values)
    return format(stats.mean(values), fmt) + ("" if std is None else f" ± {format(std, fmt)}")


def _up(up: Verdict | None) -> str:
    if up is None or up.effect is None:
        return "–"
    if up.status is Status.BASELINE:
        return "1.00× baseline"
    show_ci = up.interval and up.status is not Status.IDENTICAL  # an identical model's gap is noise
    ci = f" [{up.interval[0]:.2f}, {up.interval[1]:.2f}]" if show_ci and up.interval else ""
    return f"{up.effect:.2f}×{ci} {words.speed(up)}"


def cells(rows: list[DecodeRow]) -> list[list[str]]:
    """Display strings per row, in HEADERS order (a skipped point names its reason)."""
    body = []
    for r in rows:
        head = [r.label, str(r.batch), str(r.context), r.cache]
        if r.status != "measured":
            body.append(head + [f"skipped: {r.reason}"] + ["–"] * (len(HEADERS) - 5))
            continue
        ratio = "–" if r.kv_bytes_ratio is None else f"{r.kv_bytes_ratio:.4f}"
        body.append(
            head
            + [
                _pm(r.tokens_per_s, ",.0f"),
                _up(r.speedup),
                _pm(r.latency_p50_ms, ".2f"),
                _up(r.latency_speedup),
                _pm(r.latency_p99_ms, ".2f"),
                _pm(r.prefill_ms, ".1f"),
                mem_text(r.kv_bytes_measured),
                mem_text(r.kv_bytes_predicted),
                ratio,
                mem_text(r.peak_mem_delta_bytes),
            ]
        )
    return body


def table(rows: list[DecodeRow], baseline: str) -> Table:
    """The decode table as a section of the report document, its note under it."""
    title = f"gptlab-compare: decode vs baseline '{baseline}'"
    body = tuple(tuple(line) for line in cells(rows))
    return Table("", title, tuple(HEADERS), body, heading="Decode", left=("label", "cache"), note=NOTE)


def page(rows: list[DecodeRow], baseline: str) -> Document:
    """A decode-only comparison's report document: the decode table alone."""
    return Document(f"Decode comparison (baseline: {baseline})", "", (table(rows, baseline),))
