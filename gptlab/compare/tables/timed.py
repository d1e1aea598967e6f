"""Speed from the timing session that covers a comparison (compare/reading/timing.py; the session is
gptlab/train/timing.py's): the one session its speed-ups pair in, each group's timed figures and speed verdict, and
what the report says where a group is not timed.

- the session used is the first (in the runs' order) that times the baseline group: speed-ups pair only within one
  session, so a group timed by another session only is not timed here, and a warning says where it was timed;
- a timed group's tokens/s, step ms and MFU are its arm's, the session's own figures, so they are the same in every
  report that holds the group (MFU against the session's one measured peak, or --peak-flops when given); its
  speed-up, interval and verdict are the paired rounds' against the session's own A/A (compare/statistics/timed.py);
  two groups that one timed arm stands for build one model with one set of speed settings: speed-up 1, IDENTICAL;
- a group without a timing gets no speed verdict: Status.NOT_MEASURED (worded "not timed"); when no session times
  the baseline the report carries one note with the one command that times the runs: `gptlab-sweep time DIR` for
  the runs of one sweep, else `gptlab-compare PATH... --time`. Training runs' tokens/s stay records, never verdicts.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from gptlab.compare.reading.group import Group
from gptlab.compare.reading.runs import Run
from gptlab.compare.reading.timing import Matching, Session, TimedArm, match, notes, sweep_dir_of
from gptlab.compare.statistics import verdict
from gptlab.compare.statistics.rounds import METRIC, RoundSpeed
from gptlab.compare.statistics.stats import ALPHA
from gptlab.compare.statistics.timed import group_speeds
from gptlab.compare.statistics.verdict import Status, Verdict
from gptlab.util.note import Note, note, warning


@dataclass(frozen=True)
class GroupSpeed:
    """One group's speed: the arm that times it (None: not timed), its timed figures, its verdict against the
    baseline group and, where paired rounds made it, their statistics (for the power of the rounds)."""

    arm: TimedArm | None
    tokens_per_s: float | None
    step_ms: float | None
    mfu: float | None
    verdict: Verdict
    rounds: RoundSpeed | None = None


def not_timed() -> Verdict:
    """The speed verdict of a group without a timing: NOT_MEASURED (worded "not timed")."""
    return Verdict(METRIC, Status.NOT_MEASURED, ratio=True)


def covering(sessions: Sequence[Session], groups: list[Group], base: Group) -> tuple[Matching | None, list[Note]]:
    """(the matching of the first session that times `base`, or None; the warnings on the groups: mismatched or
    untimed in the session used, timed by another session only). Call once the groups are labelled."""
    matchings = [match(s, groups) for s in sessions]
    used = next((m for m in matchings if m.arm_of(base) is not None), None)
    if used is None:
        return None, [n for m in matchings for n in notes(m, unmatched=False)]
    elsewhere = {
        id(g): m.session.path for m in matchings if m is not used for g, _ in m.timed if used.arm_of(g) is None
    }
    out = [
        n for n in notes(used, unmatched=False) if not any(n.subject == g.label for g in groups if id(g) in elsewhere)
    ]
    out += [
        warning(
            f"'{g.label}' is timed in {elsewhere[id(g)]}, the baseline in {used.session.path}: speed-ups pair only "
            "within one session, so its speed is not timed here",
            subject=g.label,
            fix="time the arms together in one session (gptlab-compare PATH... --time)",
        )
        for g in groups
        if id(g) in elsewhere
    ]
    return used, out


def command(runs: Sequence[Run], paths: Sequence[str] = ()) -> str:
    """The one command that times these runs' arms: `gptlab-sweep time DIR` when they are one sweep's, else
    `gptlab-compare PATH... --time` (the paths given, else the run dirs)."""
    dirs = {sweep_dir_of(r) for r in runs}
    if len(dirs) == 1 and None not in dirs:
        return f"gptlab-sweep time {shlex.quote(str(dirs.pop()))}"
    return shlex.join(["gptlab-compare", *(paths or [str(r.path) for r in runs]), "--time"])


def untimed_note(runs: Sequence[Run], paths: Sequence[str] = ()) -> Note:
    """The note of a comparison no session times: no speed verdict, and the command that times its arms."""
    return note(
        "note: speed not timed: no timing session covers the baseline, so no arm has a speed verdict, an MFU or a val "
        "loss at equal training time (the training runs' tokens/s are records of what the machine gave them, never a "
        "verdict)",
        fix=f"time every arm alone, in interleaved rounds with an A/A: {command(runs, paths)}",
    )


def _figures(arm: TimedArm, peak_flops: float | None) -> tuple[float | None, float | None, float | None]:
    """(tokens/s, step ms, MFU) of a timed arm; MFU against `peak_flops` when given, else the session's peak."""
    mfu = arm.mfu
    if peak_flops is not None and arm.flops_per_token is not None and arm.tokens_per_s is not None:
        mfu = arm.flops_per_token * arm.tokens_per_s / peak_flops
    return arm.tokens_per_s, arm.step_ms, mfu


def group_figures(
    groups: list[Group], base: Group, matching: Matching | None, peak_flops: float | None = None, alpha: float = ALPHA
) -> list[GroupSpeed]:
    """Each group's GroupSpeed, in `groups`' order (see the module docstring)."""
    base_arm = matching.arm_of(base) if matching is not None else None
    found = {id(g): s for g, s in group_speeds(matching, base, alpha)} if matching and base_arm else {}
    out = []
    for g in groups:
        arm = matching.arm_of(g) if matching is not None else None
        if arm is None:
            out.append(GroupSpeed(None, None, None, None, not_timed()))
            continue
        tps, ms, mfu = _figures(arm, peak_flops)
        if base_arm is None:
            found_verdict, rounds = not_timed(), None
        elif g is base:
            found_verdict, rounds = verdict.baseline(METRIC, ratio=True), None
        elif arm.name == base_arm.name:  # one build, one set of speed settings: the same timing
            found_verdict, rounds = Verdict(METRIC, Status.IDENTICAL, 1.0, ratio=True), None
        else:
            rounds = found.get(id(g))
            found_verdict = rounds.verdict if rounds is not None else not_timed()
        out.append(GroupSpeed(arm, tps, ms, mfu, found_verdict, rounds))
    return out
