"""Per-layer diagnostics across arms (runs trained with train.diagnostics=true): one figure per metric, one panel per
arm side by side on a shared y-axis, one line per layer (mean over the arm's seeds at each logged step); and a note
with each arm's largest value at the compared step, e.g. the max attention logit with and without QK-norm."""

from __future__ import annotations

import re
from statistics import mean

from gptlab.compare.reading.group import Group
from gptlab.util.note import Note, note

# (metric under diag/layerNN/, title): the per-layer curves drawn when at least one arm logged them
METRICS = (
    ("attn/max_logit", "max attention logit (pre-softmax)"),
    ("attn/entropy", "mean attention entropy (nats)"),
    ("block/act_rms", "block output RMS"),
    ("attn/grad_norm", "attention grad norm"),
)
_LAYER = re.compile(r"diag/(layer\d+)/(.+)")


def layer_curves(g: Group, metric: str) -> dict[str, tuple[list[int], list[float]]]:
    """{'layer03': (steps, mean over seeds)} of diag/<layer>/<metric>; a step counts once every seed logged it."""
    per: dict[str, dict[int, list[float]]] = {}
    for run in g.runs:
        for step, rec in run.by_step.items():
            for key, value in rec.items():
                m = _LAYER.fullmatch(key)
                if m and m[2] == metric and isinstance(value, (int, float)):
                    per.setdefault(m[1], {}).setdefault(step, []).append(float(value))
    n = len(g.runs)
    return {
        layer: ([s for s in sorted(by) if len(by[s]) == n], [mean(by[s]) for s in sorted(by) if len(by[s]) == n])
        for layer, by in sorted(per.items())
    }


def layer_figures(groups: list[Group], labels: list[str]) -> dict:
    """name -> matplotlib figure, for each metric some arm logged (arms without it get an empty, labelled panel)."""
    import matplotlib.pyplot as plt

    figures = {}
    for metric, title in METRICS:
        curves = [layer_curves(g, metric) for g in groups]
        if not any(curves):
            continue
        fig, axes = plt.subplots(1, len(groups), figsize=(4.5 * len(groups), 4), sharey=True, squeeze=False)
        for ax, label, by_layer in zip(axes[0], labels, curves):
            cmap = plt.get_cmap("viridis", max(2, len(by_layer)))
            for i, (layer, (steps, values)) in enumerate(by_layer.items()):
                ax.plot(steps, values, color=cmap(i), label=layer, linewidth=1.2)
            ax.set_title(label if by_layer else f"{label}: not logged", fontsize=9)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            if by_layer:
                ax.legend(fontsize=7, ncol=2)
        axes[0][0].set_ylabel(title)
        fig.suptitle(f"{title} per layer (mean over seeds)")
        fig.tight_layout()
        figures[f"layers_{metric.replace('/', '_')}"] = fig
    return figures


def layer_notes(groups: list[Group], labels: list[str], step: int) -> list[Note]:
    """One line per metric two or more arms logged: each arm's largest per-layer value at the last logged step
    <= `step` (the comparison's step), e.g. 'max attention logit ... : mha 14.2 (layer03), qk_norm 4.1 (layer01)'."""
    lines: list[Note] = []
    for metric, title in METRICS[:1]:  # the max logit: the one the QK-norm question asks about
        parts = []
        for g, label in zip(groups, labels):
            best = None
            for layer, (steps, values) in layer_curves(g, metric).items():
                at = [v for s, v in zip(steps, values) if s <= step]
                if at and (best is None or at[-1] > best[0]):
                    best = (at[-1], layer)
            if best is not None:
                parts.append(f"{label} {best[0]:.3g} ({best[1]})")
        if len(parts) >= 2:
            lines.append(
                note(
                    f"{title}, largest over layers at the last diagnostics step <= {step} "
                    f"(mean over seeds): " + ", ".join(parts) + "."
                )
            )
    return lines
