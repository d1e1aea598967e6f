"""Like with like: the comparison key that says which runs may share one Δ val loss table.

A run's comparison key (comparison_key) has three parts:

- its validation set: the data fingerprint (corpus content, tokenizer and split; summary.json `data_fingerprint`),
  `data_seed` (which sequences are drawn), `train.eval_sequences` (how many) and the sequence length. A val loss
  difference means something only between runs scored on one set: runs that differ in any of these are refused
  in one table (check_like), or with --split-by KEY compared in separate tables (split). A run that recorded no
  data fingerprint (an older run) is checked by its config alone (gptlab.compare.reading.group.check_same_task), with a
  warning when other runs have one;
- its budget: `train.max_steps` and tokens per step (train.batch_size × sequence length). A budget difference is an
  arm difference: it shows in the arm's label and is named in a note (arm_notes); runs of different tokens per
  step are compared at equal tokens where an eval point allows it (gptlab.compare.reading.align). So is a start from
  another run's checkpoint (summary.json `init_from`) when not every arm made the same one;
- its identity (gptlab.compare.reading.identity): a copied run dir counts once.

What a run was run with beyond its config, for reading/study.py and --split-by: `code` (provenance.json's git commit,
with a digest of the uncommitted changes to gptlab/ its git.diff kept) and `machine` (the hostname, GPU or CPU it
recorded); both "unset" for a run that recorded no provenance (older runs).

Keys that only observe (probes, extra validation sets, diagnostics, checkpoints, log rows) never make two runs
different arms, but their time is inside a run's wall time: runs that differ in them are named (overhead_warnings),
since equal-time readings and time to target on wall time would charge one side for it. On training time
(reading/clock.py) only the keys that add work or host syncs inside a step are named.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from typing import Any

from gptlab.compare.reading.clock import TRAIN, WALL, Clock
from gptlab.compare.reading.group import Group, show
from gptlab.compare.reading.identity import identity
from gptlab.compare.reading.runs import Run, where
from gptlab.errors import ConfigError
from gptlab.util.note import Note, note, warning
from gptlab.util.tree import flatten

VAL_SET_KEYS = ("data_fingerprint", "data_seed", "train.eval_sequences", "seq_len")
BUDGET_KEYS = ("train.max_steps", "tokens_per_step")
CODE, MACHINE = "code", "machine"  # read from provenance.json (and git.diff): the code version and the machine
UNSET = "unset"  # a key the run's files do not record
_DERIVED = frozenset({"data_fingerprint", "seq_len", "tokens_per_step", CODE, MACHINE})  # read from files or computed
PACKAGE = "gptlab/"  # the code whose uncommitted changes make another code version (docs or tests do not)


def _config(run: Run, dotted: str) -> Any:
    node: Any = run.config
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if float(value).is_integer() and value > 0 else None


def seq_len(run: Run) -> int | None:
    """Tokens per sequence: summary.json `seq_len`, else the config's data.seq_len, else model.block_size."""
    for value in (run.summary.get("seq_len"), _config(run, "data.seq_len"), _config(run, "model.block_size")):
        if (n := _int(value)) is not None:
            return n
    return None


def batch_size(run: Run) -> int | None:
    """Sequences per optimizer step: summary.json `batch_size`, else the config's train.batch_size."""
    for value in (run.summary.get("batch_size"), _config(run, "train.batch_size")):
        if (n := _int(value)) is not None:
            return n
    return None


def tokens_per_step(run: Run) -> int | None:
    """Tokens one optimizer step trains on (batch_size × seq_len); None when either is unrecorded."""
    batch, length = batch_size(run), seq_len(run)
    return batch * length if batch is not None and length is not None else None


def _package_diff(run: Run) -> str | None:
    """The part of the run's git.diff that changes gptlab/ ('' when it changes nothing there); None without one."""
    path = run.path / "git.diff"
    if not path.is_file():
        return None
    blocks = path.read_text(errors="replace").split("diff --git ")
    return "".join(b for b in blocks[1:] if b.startswith(f"a/{PACKAGE}"))


def code_version(run: Run) -> str:
    """The code the run trained with: its git commit, `+<digest>` of its uncommitted changes to gptlab/ (git.diff), or
    `+dirty` when the checkout was dirty and no diff was kept; UNSET without a recorded commit."""
    git = run.provenance.get("git")
    git = git if isinstance(git, dict) else {}
    commit = git.get("commit")
    if not isinstance(commit, str) or not commit:
        return UNSET
    if not git.get("dirty"):
        return commit[:12]
    diff = _package_diff(run)
    if diff is None:
        return f"{commit[:12]}+dirty"
    return f"{commit[:12]}+{hashlib.sha256(diff.encode()).hexdigest()[:8]}" if diff else commit[:12]


def machine(run: Run) -> str:
    """The machine the run trained on: its hostname where recorded, and its GPU model, else its CPU model."""
    hardware = run.provenance.get("hardware")
    hardware = hardware if isinstance(hardware, dict) else {}
    host = hardware.get("hostname") or run.provenance.get("hostname")
    model = hardware.get("gpu") or hardware.get("cpu")
    named = [str(x) for x in (host, model) if x]
    return " ".join(named[:1]) + (f" ({named[1]})" if len(named) > 1 else "") if named else UNSET


def value(run: Run, key: str) -> str:
    """The run's value of a comparison-key name (code and machine included), a config group (its choice) or a dotted
    config key; UNSET if none."""
    if key == CODE:
        return code_version(run)
    if key == MACHINE:
        return machine(run)
    if key == "data_fingerprint":
        fp = run.summary.get(key)
        return fp if isinstance(fp, str) and fp else UNSET
    if key in ("seq_len", "tokens_per_step"):
        n = seq_len(run) if key == "seq_len" else tokens_per_step(run)
        return str(n) if n is not None else UNSET
    if key in run.choices:
        return run.choices[key]
    flat = flatten(run.config, empty_as_leaf=True)
    return show(flat[key]) if key in flat and flat[key] is not None else UNSET


@dataclass(frozen=True)
class Key:
    """One run's comparison key: validation-set identity, budget and run identity (see the module docstring)."""

    val_set: dict[str, str]
    budget: dict[str, str]
    identity: str


def comparison_key(run: Run) -> Key:
    """The run's comparison key."""
    return Key({k: value(run, k) for k in VAL_SET_KEYS}, {k: value(run, k) for k in BUDGET_KEYS}, identity(run).key)


def _root(runs: list[Run]) -> str:
    return os.path.commonpath([str(r.path) for r in runs]) if len(runs) > 1 else str(runs[0].path.parent)


def _first_of_each(runs: list[Run], key: str) -> dict[str, Run]:
    """Distinct values of key -> the first run that has it, in run order."""
    out: dict[str, Run] = {}
    for run in runs:
        out.setdefault(value(run, key), run)
    return out


def _listing(firsts: dict[str, Run], root: str, limit: int = 4) -> str:
    items = [f"{v} in {where(r, root)}" for v, r in list(firsts.items())[:limit]]
    return ", ".join(items) + (", ..." if len(firsts) > limit else "")


def check_like(runs: list[Run]) -> list[Note]:
    """Refuse runs scored on different validation sets (ConfigError, one line naming the key, two runs and
    --split-by); returns warnings for runs whose data fingerprint is unrecorded while others have one."""
    root = _root(runs)
    warnings = []
    for key in VAL_SET_KEYS:
        firsts = _first_of_each(runs, key)
        if key == "data_fingerprint" and UNSET in firsts:
            unrecorded = [where(r, root) for r in runs if value(r, key) == UNSET]
            del firsts[UNSET]
            if firsts:
                shown = ", ".join(unrecorded[:4]) + (", ..." if len(unrecorded) > 4 else "")
                warnings.append(
                    warning(
                        f"{shown}: no data_fingerprint recorded (older runs), so their validation data is checked by "
                        "config only (data, tokenizer, data_seed, train.eval_sequences, sequence length)",
                        subject=shown,
                    )
                )
        if len(firsts) > 1:
            raise ConfigError(
                f"runs differ in {key} ({_listing(firsts, root)}): their val losses are on different validation "
                f"sets; compare them separately or pass --split-by {key}"
            )
    return warnings


@dataclass
class Part:
    """The runs that share one value of each --split-by key (values: key -> value)."""

    values: dict[str, str]
    runs: list[Run]

    @property
    def title(self) -> str:
        """`key=value, ...`: how reports name the part."""
        return ", ".join(f"{k}={v}" for k, v in self.values.items())

    @property
    def slug(self) -> str:
        """The title as a folder name (characters other than letters, digits and ._=,- become _)."""
        return re.sub(r"[^A-Za-z0-9._=,-]+", "_", self.title.replace(", ", ","))


def _known(runs: list[Run], key: str) -> bool:
    if key in VAL_SET_KEYS or key in BUDGET_KEYS or key in (CODE, MACHINE):
        return True
    return any(key in r.choices or key in flatten(r.config, empty_as_leaf=True) for r in runs)


def _order(text: str) -> tuple:
    try:
        return (0, float(text), text)
    except ValueError:
        return (1, 0.0, text)


def split(runs: list[Run], keys: list[str]) -> list[Part]:
    """The runs split by the values of `keys` (comparison-key names, config groups or dotted config keys), parts in
    value order (numbers numerically); a key no run has is a ConfigError listing what is allowed."""
    for key in keys:
        if not _known(runs, key):
            groups = sorted({g for r in runs for g in r.choices})
            raise ConfigError(
                f"--split-by {key}: no run has this key; allowed: {', '.join(VAL_SET_KEYS + BUDGET_KEYS)}, {CODE}, "
                f"{MACHINE}, "
                f"a config group ({', '.join(groups[:6])}{', ...' if len(groups) > 6 else ''}) "
                "or a dotted config key (e.g. train.batch_size)"
            )
    parts: dict[tuple[str, ...], Part] = {}
    for run in runs:
        values = tuple(value(run, k) for k in keys)
        parts.setdefault(values, Part(dict(zip(keys, values)), [])).runs.append(run)
    return [parts[v] for v in sorted(parts, key=lambda vs: [_order(x) for x in vs])]


def _shared(g: Group, key: str) -> str | None:
    values = {value(r, key) for r in g.runs}
    return values.pop() if len(values) == 1 else None


def init_from(run: Run) -> str | None:
    """`<checkpoint> at step <k>` when the run started from another run's checkpoint (summary.json `init_from`)."""
    record = run.summary.get("init_from")
    if not isinstance(record, dict) or not record.get("checkpoint"):
        return None
    return f"{record['checkpoint']} at step {record.get('step', '?')}"


# Keys outside the arm (reading.group ignores them) whose work runs inside a run's time, per clock: wall time holds
# every eval, probe and checkpoint; training time only what runs inside a step (a per-step read-back, the pipeline
# drained by a sync, the diagnostics' sync)
OVERHEAD_KEYS = {
    WALL: (
        "probes",
        "data.val_sets",
        "train.diagnostics",
        "train.spike_factor",
        "train.detect_anomaly",
        "train.ckpt_interval",
        "train.log_interval",
    ),
    TRAIN: ("train.diagnostics", "train.spike_factor", "train.detect_anomaly", "train.log_interval"),
}


def overhead_warnings(runs: list[Run], clock: Clock) -> list[Note]:
    """One warning naming the observing keys the runs differ in whose work is inside `clock`'s time, so equal-time
    readings and time to target charge the runs unequally (step, token and FLOP readings are unaffected)."""
    differ = [key for key in OVERHEAD_KEYS[clock.key] if len({value(r, key) for r in runs}) > 1]
    if not differ:
        return []
    keys = ", ".join(differ)
    return [
        warning(
            f"the runs differ in {keys}, whose work is inside their {clock.name}: equal-time readings and "
            f"{clock.name} to target charge some runs more than others",
            subject=keys,
            fix="read the step and FLOP readings, or rerun the arms alike",
        )
    ]


def arm_notes(groups: list[Group], base: Group) -> list[Note]:
    """One note per arm whose budget (train.max_steps or tokens per step) differs from the baseline's, and one per
    group that started from another run's checkpoint when not every group did the same."""
    starts = {id(g): init_from(g.runs[0]) for g in groups}
    notes = [
        note(
            f"note: '{g.label}' starts from another run's checkpoint ({starts[id(g)]}), not from scratch: its val "
            "loss includes that run's training",
            subject=g.label,
        )
        for g in groups
        if starts[id(g)] and len(set(starts.values())) > 1
    ]
    for g in groups:
        if g is base:
            continue
        steps, base_steps = _shared(g, "train.max_steps"), _shared(base, "train.max_steps")
        if steps != base_steps and not {steps, base_steps} & {UNSET, None}:
            notes.append(
                note(
                    f"note: '{g.label}' differs from the baseline in budget: train.max_steps {steps} vs {base_steps}, "
                    "an arm difference (at one step their learning-rate schedules are at different points)",
                    subject=g.label,
                )
            )
        tps, base_tps = _shared(g, "tokens_per_step"), _shared(base, "tokens_per_step")
        if tps != base_tps and not {tps, base_tps} & {UNSET, None}:
            run, ref = g.runs[0], base.runs[0]
            notes.append(
                note(
                    f"note: '{g.label}' differs from the baseline in tokens per step: {tps} vs {base_tps} "
                    f"(batch size {batch_size(run)} vs {batch_size(ref)} × sequence length {seq_len(run)}), "
                    "an arm difference: it sees other numbers of tokens at one step",
                    subject=g.label,
                )
            )
    return notes
