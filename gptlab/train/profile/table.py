"""Plain-text tables of a gptlab.train.profile.steps.ProfileResult: time per module kind, then time per layer."""

from __future__ import annotations

from gptlab.costs.ops import GROUPS

# Kinds measured inside a block (columns of the per-layer table); "other" there = residual adds and dropout.
LAYER_KINDS = ("norms", "attention projections", "attention kernel", "mlp", "other")
SHORT = {
    "norms": "norms",
    "attention projections": "attn proj",
    "attention kernel": "attn kernel",
    "mlp": "mlp",
    "other": "residual",
}


def _pct(x: float | None, width: int) -> str:
    return f"{'-':>{width}}" if x is None else f"{100 * x:>{width - 1}.1f}%"


def format_kinds(result) -> str:
    """Kind, measured ms/step, measured share, predicted share; last line the measured step and its attributed share."""
    lines = [f"{'module kind':<24}{'ms/step':>10}{'measured':>10}{'predicted':>11}"]
    for kind in GROUPS:
        pred = result.predicted_share.get(kind)
        lines.append(
            f"{kind:<24}{1e3 * result.seconds[kind]:>10.2f}{100 * result.seconds[kind] / result.step_s:>9.1f}%"
            + _pct(pred, 11)
        )
    lines.append(
        f"{'step (measured)':<24}{1e3 * result.step_s:>10.2f}{100 * result.attributed_s / result.step_s:>9.1f}%"
        "  attributed"
    )
    return "\n".join(lines)


def format_layers(result) -> str:
    """One row per layer (ms/step per kind inside the block, total, measured and predicted share), then the rest."""
    head = (
        f"{'layer':<16}"
        + "".join(f"{SHORT[k]:>12}" for k in LAYER_KINDS)
        + f"{'total ms':>10}{'measured':>10}{'predicted':>11}"
    )
    lines = [head]
    for row in result.layer_rows():
        cells = "".join(f"{1e3 * row['seconds'][k]:>12.2f}" for k in LAYER_KINDS)
        lines.append(
            f"{row['layer']:<16}{cells}{1e3 * row['total_s']:>10.2f}"
            f"{_pct(row['measured_share'], 10)}{_pct(row['predicted_share'], 11)}"
        )
    outside = sum(result.outside_layers().values())
    pred = None if not result.predicted_layers else 1.0 - sum(result.predicted_layers)
    lines.append(
        f"{'outside blocks':<16}{'':>{12 * len(LAYER_KINDS)}}{1e3 * outside:>10.2f}"
        f"{_pct(outside / result.step_s, 10)}{_pct(pred, 11)}"
    )
    return "\n".join(lines)


def format_breakdown(result) -> str:
    """The per-kind table, then the per-layer table when the result has layers (what profile=true prints)."""
    text = format_kinds(result)
    if getattr(result, "layers", None):
        text += "\n\n" + format_layers(result)
    return text
