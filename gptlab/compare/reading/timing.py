"""A timing session read back (timing.json, written by gptlab/train/timing.py), the session that covers a set of runs
found, and its timed arms matched to compare's groups, so a run's speed figures come from the timing and are the
same in every report that holds it.

- every value compare uses is checked through gptlab/util/stored.py: a damaged or hand-edited file is one line
  naming the file and what is wrong, never read as empty or silently dropped;
- the figures of a timed arm are the session's alone: its step time is the median of its windows' median step times,
  tokens/s its tokens per step over that time, MFU its FLOPs per token x tokens/s / the session's one measured peak,
  and an arm's steps become seconds at that step time (the equal-training-time lens). No run's own tokens/s is read;
- a compare group is timed by the arm whose timed run dir is one of the group's runs, else by the first arm (baseline
  first) that builds the group's model (fingerprint) with the settings that set speed (SPEED_KEYS) equal to every
  run's that recorded them; a timed run dir whose group builds another model or trained with other settings is
  mismatched, never matched; a group no arm stands for is untimed, and an arm no group holds is unmatched.

Values only: the speed verdicts are compare/statistics/timed.py's, their words compare/render/words.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from gptlab.compare.reading.group import Group
from gptlab.compare.reading.runs import Run
from gptlab.errors import ConfigError
from gptlab.sweep.layout import SWEEP_FILE, TIMING_FILE
from gptlab.util.note import Note, warning
from gptlab.util.stored import Check, read_json

VERSION = 1  # the timing.json version read here (gptlab/train/timing.py VERSION; compare imports nothing of training)
FIX = "move it aside and time the sweep again (a session relaunched in the folder times only what it lacks)"
SPEED_KEYS = ("device", "batch_size", "seq_len", "grad_accum", "dtype", "compile", "threads")
STATUSES = ("running", "finished")
AXIS = "timed_s"  # the equal-training-time axis: each arm's steps at its timed step time (TimedArm.seconds)
EQUAL_TIME_METRIC = f"val/loss@{AXIS}"  # the metric of a val-loss verdict at equal training time
TIME_TO_TARGET_METRIC = f"time_to_target@{AXIS}"  # the metric of a speed-up to a target in time (tables/target.py)


@dataclass(frozen=True)
class TimedArm:
    """One arm of a session: the run it was built from, the model and the settings it timed, and its figures (None
    before its first window)."""

    name: str
    run_dir: Path
    fingerprint: str
    flops_per_token: float | None
    tokens_per_step: int
    settings: dict[str, Any]  # SPEED_KEYS as timed (device as its kind: cpu, cuda)
    windows: int
    step_ms: float | None
    tokens_per_s: float | None
    mfu: float | None
    outside_load: float | None  # the worst outside load over its windows' timed steps; None when none was measured

    def seconds(self, steps: float) -> float | None:
        """`steps` training steps in seconds at the arm's timed step time (the equal-training-time lens)."""
        return None if self.step_ms is None else steps * self.step_ms / 1000.0


@dataclass(frozen=True)
class Source:
    """Where the figures come from, for a report to word: rounds complete for every arm (of `planned`), steps and
    warm-up per window, the machine (its GPU, else its CPU) and host, and whether the session ran to its end."""

    rounds: int
    planned: int
    steps: int
    warmup: int
    machine: str
    hostname: str
    finished: bool


@dataclass(frozen=True)
class Session:
    """A timing.json read back: the baseline, the arms in plan order (baseline first), the window records as stored
    (what compare/statistics/rounds.py reads), the one peak FLOP/s and the source."""

    path: Path
    baseline: str
    arms: dict[str, TimedArm]
    windows: list[dict]
    peak_flops: float
    source: Source


def _check_plan(check: Check, doc: dict) -> dict:
    plan = check.mapping("plan", doc.get("plan"))
    if not isinstance(plan.get("arms"), list) or not plan["arms"]:
        raise check.fail("plan.arms: expected a non-empty list")
    for arm in plan["arms"]:
        check.mapping("plan.arms[]", arm)
        check.text("plan.arms[].name", arm.get("name"))
        check.text("plan.arms[].run_dir", arm.get("run_dir"))
    for key in ("rounds", "steps", "warmup"):
        check.number(f"plan.{key}", plan.get(key), ">= 1", int)
    check.number("plan.seed", plan.get("seed"), ">= 0", int)
    names = [a["name"] for a in plan["arms"]]
    if len(set(names)) != len(names) or doc.get("baseline") != names[0]:
        raise check.fail(f"plan.arms {names} with baseline {doc.get('baseline')!r}: each arm once, the baseline first")
    return plan


def _check_arm(check: Check, name: str, arm: Any) -> dict:
    arm = check.mapping(f"arms.{name}", arm)
    check.text(f"arms.{name}.run_dir", arm.get("run_dir"))
    check.text(f"arms.{name}.model_fingerprint", arm.get("model_fingerprint"))
    check.number(f"arms.{name}.flops_per_token", arm.get("flops_per_token"), "> 0", null=True)
    for key in ("tokens_per_step", "batch_size", "seq_len", "grad_accum"):
        check.number(f"arms.{name}.{key}", arm.get(key), ">= 1", int)
    check.number(f"arms.{name}.threads", arm.get("threads"), ">= 1", int, null=True)
    check.text(f"arms.{name}.device", arm.get("device"))
    check.text(f"arms.{name}.dtype", arm.get("dtype"))
    if not isinstance(arm.get("compile"), (bool, str)):
        raise check.fail(f"arms.{name}.compile={arm.get('compile')!r}: must be true, false or a compile mode")
    return arm


def _check_window(check: Check, w: Any, plan: dict, arms: dict) -> dict:
    w = check.mapping("windows[]", w)
    at = f"windows[round {w.get('round')}, position {w.get('position')}]"
    check.number(f"{at}.round", w.get("round"), f"[0, {plan['rounds']})", int)
    check.number(f"{at}.position", w.get("position"), f"[0, {len(plan['arms']) + 1})", int)
    check.one_of(f"{at}.arm", w.get("arm"), tuple(arms))
    check.one_of(f"{at}.repeat", w.get("repeat"), (0, 1) if w["arm"] == plan["arms"][0]["name"] else (0,))
    check.number(f"{at}.tokens_per_s", w.get("tokens_per_s"), "> 0")
    check.number(f"{at}.step_ms_median", w.get("step_ms_median"), "> 0")
    check.number(f"{at}.outside_load", w.get("outside_load"), "[0, 1]", null=True)
    tokens = arms[w["arm"]]["tokens_per_step"]  # the rate is the arm's tokens per step over the median step
    if abs(w["tokens_per_s"] * w["step_ms_median"] / 1000.0 - tokens) > 1e-6 * tokens:
        raise check.fail(
            f"{at}: tokens_per_s={w['tokens_per_s']!r} is not {tokens} tokens per step_ms_median={w['step_ms_median']!r}"
        )
    return w


def _check(path: Path, doc: Any) -> dict:
    """The document, every value compare reads checked (damaged -> one line naming the file)."""
    check = Check(path, FIX)
    doc = check.mapping("timing.json", doc)
    if doc.get("version") != VERSION:
        raise check.fail(f"version={doc.get('version')!r}, this gptlab reads version {VERSION}")
    plan = _check_plan(check, doc)
    check.one_of("status", doc.get("status"), STATUSES)
    check.number("peak.flops", check.mapping("peak", doc.get("peak")).get("flops"), "> 0")
    machine = check.mapping("machine", doc.get("machine"))
    for key in ("hostname", "cpu", "gpu"):
        check.text(f"machine.{key}", machine.get(key), null=key != "hostname")
    arms = check.mapping("arms", doc.get("arms"))
    planned = {a["name"] for a in plan["arms"]}
    for name, arm in arms.items():
        check.one_of("arms (a timed arm)", name, tuple(planned))
        _check_arm(check, name, arm)
    if not isinstance(doc.get("windows"), list):
        raise check.fail("windows: expected a list")
    seen: set[tuple[int, int]] = set()
    for w in doc["windows"]:
        _check_window(check, w, plan, arms)
        if (w["round"], w["position"]) in seen:
            raise check.fail(f"windows: round {w['round']} position {w['position']} is recorded twice")
        seen.add((w["round"], w["position"]))
    return doc


def _arm(name: str, record: dict, windows: list[dict], peak: float) -> TimedArm:
    """A timed arm's figures from its windows (see the module docstring)."""
    mine = [w for w in windows if w["arm"] == name]
    step_ms = median(float(w["step_ms_median"]) for w in mine) if mine else None
    tokens_per_s = record["tokens_per_step"] / (step_ms / 1000.0) if step_ms else None
    flops = record.get("flops_per_token")
    loads = [float(w["outside_load"]) for w in mine if w.get("outside_load") is not None]
    settings = {key: record.get(key) for key in SPEED_KEYS}
    settings["device"] = str(settings["device"]).split(":")[0]
    return TimedArm(
        name=name,
        run_dir=Path(record["run_dir"]),
        fingerprint=record["model_fingerprint"],
        flops_per_token=float(flops) if flops is not None else None,
        tokens_per_step=int(record["tokens_per_step"]),
        settings=settings,
        windows=len(mine),
        step_ms=step_ms,
        tokens_per_s=tokens_per_s,
        mfu=flops * tokens_per_s / peak if flops is not None and tokens_per_s is not None else None,
        outside_load=max(loads) if loads else None,
    )


def complete_rounds(windows: list[dict], names: list[str]) -> int:
    """Rounds that hold a window of every arm and both of the baseline's (names[0])."""
    want = {(n, 0) for n in names} | {(names[0], 1)}
    by_round: dict[int, set] = {}
    for w in windows:
        by_round.setdefault(w["round"], set()).add((w["arm"], w["repeat"]))
    return sum(want <= have for have in by_round.values())


def read_timing(path: Path) -> Session | None:
    """The session in timing.json at `path` (None when there is none); a damaged one is a one-line ConfigError."""
    path = Path(path)
    doc = read_json(path, FIX)
    if doc is None:
        return None
    doc = _check(path, doc)
    plan, peak = doc["plan"], float(doc["peak"]["flops"])
    names = [a["name"] for a in plan["arms"]]
    arms = {n: _arm(n, doc["arms"][n], doc["windows"], peak) for n in names if n in doc["arms"]}
    machine = doc["machine"]
    source = Source(
        rounds=complete_rounds(doc["windows"], names),
        planned=plan["rounds"],
        steps=plan["steps"],
        warmup=plan["warmup"],
        machine=str(machine.get("gpu") or machine.get("cpu") or "unknown machine"),
        hostname=str(machine["hostname"]),
        finished=doc["status"] == "finished",
    )
    return Session(path, names[0], arms, list(doc["windows"]), peak, source)


def sweep_dir_of(run: Run) -> Path | None:
    """The sweep dir a run belongs to: its nearest parent folder with a sweep.yaml (None for a run of no sweep)."""
    return next((p for p in run.path.parents if (p / SWEEP_FILE).is_file()), None)


def find_timings(runs: list[Run], given: Path | None = None) -> list[Session]:
    """The sessions that cover `runs`: the one at `given` (a timing.json or the folder holding it; missing is a
    ConfigError), else each timed sweep dir's timing.json, in the runs' order. Speed-ups pair only within a session."""
    if given is not None:
        path = Path(given) / TIMING_FILE if Path(given).is_dir() else Path(given)
        session = read_timing(path)
        if session is None:
            raise ConfigError(f"--timing {given}: no {TIMING_FILE} there; time the sweep first (gptlab-sweep time DIR)")
        return [session]
    found: dict[Path, Session | None] = {}
    for run in runs:
        sweep_dir = sweep_dir_of(run)
        if sweep_dir is not None and sweep_dir not in found:
            found[sweep_dir] = read_timing(sweep_dir / TIMING_FILE)
    return [s for s in found.values() if s is not None]


def run_settings(run: Run) -> dict[str, Any]:
    """The SPEED_KEYS a run recorded (summary, provenance hardware, config); a key it did not record is left out."""
    recorded = run.provenance.get("hardware")
    hardware: dict = recorded if isinstance(recorded, dict) else {}
    config = run.config

    def at(dotted: str) -> Any:
        node: Any = config
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node

    found = {
        "device": hardware.get("device") or at("hardware.device"),
        "batch_size": run.summary.get("batch_size", at("train.batch_size")),
        "seq_len": run.summary.get("seq_len", at("model.block_size")),
        "grad_accum": at("train.grad_accum"),
        "dtype": hardware.get("dtype") or at("hardware.dtype"),
        "compile": at("hardware.compile"),
        "threads": hardware.get("cpu_threads"),
    }
    if isinstance(found["device"], str):
        found["device"] = found["device"].split(":")[0]
    return {k: v for k, v in found.items() if v is not None and not (isinstance(v, str) and "${" in v)}


def differences(arm: TimedArm, group: Group, timed_there: bool = False) -> list[str]:
    """What tells the timed arm from the group's runs: 'model_fingerprint' where a run recorded another model (or,
    unless the arm was timed from one of them, none recorded one) and each speed key where a run recorded another
    value than the arm timed ([]: the arm stands for the group)."""
    out = []
    recorded = {r.summary.get("model_fingerprint") for r in group.runs} - {None}
    if recorded - {arm.fingerprint} or not (recorded or timed_there):
        out.append("model_fingerprint")
    for key in SPEED_KEYS:
        if any(key in s and s[key] != arm.settings.get(key) for s in map(run_settings, group.runs)):
            out.append(key)
    return out


@dataclass
class Matching:
    """Compare's groups against one session: (group, its arm) for each group timed, the groups left untimed, the arms
    no group holds (a mismatched arm is not listed again), and (group, arm, what differs) for each timed run dir
    whose group the arm cannot stand for."""

    session: Session
    timed: list[tuple[Group, TimedArm]] = field(default_factory=list)
    untimed: list[Group] = field(default_factory=list)
    unmatched: list[TimedArm] = field(default_factory=list)
    mismatched: list[tuple[Group, TimedArm, list[str]]] = field(default_factory=list)

    def arm_of(self, group: Group) -> TimedArm | None:
        """The timed arm that stands for `group` (None: untimed)."""
        return next((arm for g, arm in self.timed if g is group), None)


def match(session: Session, groups: list[Group]) -> Matching:
    """Each group's timed arm (see the module docstring)."""
    out = Matching(session)
    used: set[str] = set()
    for group in groups:
        paths = {r.path.resolve() for r in group.runs}
        arms = session.arms.values()
        there = [(a, differences(a, group, timed_there=True)) for a in arms if a.run_dir.resolve() in paths]
        out.mismatched += [(group, a, diff) for a, diff in there if diff]
        fits = [a for a, diff in there if not diff] if there else [a for a in arms if not differences(a, group)]
        if fits:
            out.timed.append((group, fits[0]))
            used.add(fits[0].name)
        else:
            out.untimed.append(group)
    used |= {a.name for _, a, _ in out.mismatched}  # said once, as mismatched
    out.unmatched = [a for a in session.arms.values() if a.name not in used]
    return out


def notes(matching: Matching, unmatched: bool = True) -> list[Note]:
    """One warning per timed run dir whose group built or trained otherwise, per other group left untimed and (with
    `unmatched`) per arm no group holds (call it once the groups are labelled: a note's subject is the group's label
    or the arm). A report of some of a sweep's arms leaves the others unmatched by design: it passes False."""
    path, again = matching.session.path, f"move {matching.session.path} aside and time the sweep again"
    out = [
        warning(
            f"timing {path}: arm {arm.name} was timed from {arm.run_dir}, a run of group {group.label}, but the group's "
            f"runs recorded another {', '.join(diff)}: the timing does not stand for the group",
            subject=group.label,
            fix=again,
        )
        for group, arm, diff in matching.mismatched
    ]
    said = [g for g, _, _ in matching.mismatched]
    out += [
        warning(
            f"timing {path}: no timed arm builds group {group.label} as it trained: its speed is not timed",
            subject=group.label,
            fix=again,
        )  # fmt: skip
        for group in matching.untimed
        if not any(group is g for g in said)
    ]
    out += [
        warning(
            f"timing {path}: timed arm {arm.name} ({arm.run_dir}) matches none of the compared groups", subject=arm.name
        )  # fmt: skip
        for arm in (matching.unmatched if unmatched else [])
    ]
    return out
