"""The JSON documents gptlab-compare writes, where a value becomes words: comparison.json from a Comparison, and any
study's JSON-ready document with its Note values as the lines the reports print (ladder.json, factorial.json).

A warning or note is stored as the one line every report prints for it (words.note: `warning: <text>`, its fix
after the text), so comparison.json's `warnings` and `notes` read as they always have; the --power decisions as the
table's cells (words.seeds_to_decide).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from gptlab.compare.render import words
from gptlab.compare.statistics.power import POWER, Power
from gptlab.compare.statistics.stats import ALPHA
from gptlab.compare.tables import decode, evals, probes, val_sets
from gptlab.compare.tables.analysis import Comparison, Row
from gptlab.util.note import Note


def plain(doc: Any) -> Any:
    """A copy of a JSON-ready document with every Note in it as its report line (words.note)."""
    if isinstance(doc, Note):
        return words.note(doc)
    if isinstance(doc, dict):
        return {k: plain(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [plain(v) for v in doc]
    return doc


def power(p: Power | None) -> dict[str, Any] | None:
    """A row's `power`: the detectable differences, the seeds that would decide it and each decision in words."""
    if p is None:
        return None
    return {
        **asdict(p),
        "val_loss_decision": words.seeds_to_decide(p.val_loss_decision, p.seeds_val_loss),
        "speed_decision": words.rounds_to_decide(p.speed_decision, p.seeds_speed),
    }


def row(r: Row) -> dict[str, Any]:
    """One row of comparison.json: the row's figures and verdicts, and its power."""
    return {**r.to_json(), "power": power(r.power)}


def timing(cmp: Comparison) -> dict[str, Any] | None:
    """Where the speed figures come from: the timing session's file, its source in figures and words, its peak and
    which arm times which row (None: not timed)."""
    if cmp.timing is None:
        return None
    session = cmp.timing.session
    return {
        "path": str(session.path),
        "source": asdict(session.source),
        "said": words.timed_alone(session.source),
        "peak_flops": session.peak_flops,
        "arms": {r.label: r.timed_arm for r in cmp.rows},
    }


def comparison(cmp: Comparison) -> dict[str, Any]:
    """The comparison.json document (`targets`/`thresholds` only when asked for, each extra table when it has rows)."""
    doc: dict[str, Any] = {
        "step": cmp.step,
        "compared_at": {"by": cmp.point.by, "value": cmp.point.value} if cmp.point else None,
        "baseline": cmp.baseline,
        "alpha": ALPHA,
        "power": POWER,
        "clock": cmp.clock.key,
        "validation_set": cmp.validation_set,
        "peak_flops": cmp.peak.flops if cmp.peak else None,
        "peak_flops_source": cmp.peak.source if cmp.peak else None,
        "rows": [row(r) for r in cmp.rows],
        "warnings": [words.note(n) for n in cmp.warnings],
        "notes": [words.note(n) for n in cmp.notes],
        "logged": [x.to_json() for x in cmp.logged],
        "timing": timing(cmp),
        "noise_floor": {
            "measured": asdict(cmp.noise_floor) if cmp.noise_floor else None,
            "load_limit": cmp.load_limit,
            "note": cmp.floor_note,
        },
    }
    if cmp.split:
        doc["split"] = cmp.split
    if cmp.compute is not None:
        doc["equal_compute"] = cmp.compute.to_json()
    if cmp.matrix is not None:
        doc["verdict_matrix"] = cmp.matrix.to_json()
    doc.update(
        {k: [x.to_json() for x in v] for k, v in (("targets", cmp.targets), ("thresholds", cmp.thresholds)) if v}
    )
    tables = (
        ("probes", cmp.probes, probes.to_json),
        ("evals", cmp.evals, evals.to_json),
        ("val_sets", cmp.val_sets, val_sets.to_json),
        ("decode", cmp.decode, decode.to_json),
    )
    doc.update({key: to_json(rows) for key, rows, to_json in tables if rows})
    return doc
