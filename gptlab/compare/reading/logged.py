"""What each run said while it trained: the WARNING and ERROR lines of its train.log, grouped by arm for the report.

gptlab-train logs through Hydra's job log (conf/hydra/job_logging/gptlab.yaml), one line per record:
`[2026-11-27 08:02:13,826][gptlab.train.run][WARNING] - schedule.warmup_steps=50 is 100% of ...`. A warning said at
the start of a run (most of it lr warm-up, a no-op choice, an unused data fraction) or during it (a loss spike, a
slow data loader) qualifies the figures of that run's arm, so the report shows it beside the arm: the message, and
in how many of the arm's runs it was logged. Only the first line of a record is kept, and each message once per run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

LOG_FILE = "train.log"
MAX_BYTES = 4 * 2**20  # read at most this much of a train.log: the warnings of a run's start and of its steps
_RECORD = re.compile(r"^\[[^\]]*\]\[([^\]]*)\]\[(WARNING|ERROR|CRITICAL)\] - (.+)$")


@dataclass(frozen=True)
class Logged:
    """One message the runs of one arm logged: its level, the text, and in how many of the arm's runs."""

    arm: str
    level: str
    message: str
    runs: int
    of: int

    def to_json(self) -> dict:
        return {"arm": self.arm, "level": self.level, "message": self.message, "runs": self.runs, "of": self.of}

    def describe(self) -> str:
        """`gqa (2 of 3 runs): warning: schedule.warmup_steps=50 is ...`"""
        return f"{self.arm} ({self.runs} of {self.of} run{'s' * (self.of != 1)}): {self.level.lower()}: {self.message}"


def run_messages(run_dir: Path) -> list[tuple[str, str]]:
    """(level, message) of each WARNING/ERROR record in run_dir's train.log, in order, each once; [] without one."""
    try:
        with open(run_dir / LOG_FILE, "rb") as fh:
            text = fh.read(MAX_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return []
    found: dict[tuple[str, str], None] = {}
    for line in text.splitlines():
        match = _RECORD.match(line)
        if match:
            found.setdefault((match.group(2), match.group(3).strip()), None)
    return list(found)


EVERY_ARM = "every arm"


def by_arm(arms: Sequence[tuple[str, Sequence[Path]]]) -> list[Logged]:
    """Each arm's (label, run dirs) -> the messages its runs logged, arm by arm in the order given; a message every
    run of every arm logged (a setting they share) is one entry for `every arm`, first."""
    per_arm = []
    for label, run_dirs in arms:
        counts: dict[tuple[str, str], int] = {}
        for run_dir in run_dirs:
            for key in run_messages(run_dir):
                counts[key] = counts.get(key, 0) + 1
        per_arm.append((label, len(run_dirs), counts))
    total = sum(n for _, n, _ in per_arm)
    shared = (
        [k for k, n in per_arm[0][2].items() if all(c.get(k) == m for _, m, c in per_arm) and n == per_arm[0][1]]
        if len(per_arm) > 1
        else []
    )
    out = [Logged(EVERY_ARM, level, message, total, total) for level, message in shared]
    for label, n_runs, counts in per_arm:
        out += [Logged(label, lvl, msg, n, n_runs) for (lvl, msg), n in counts.items() if (lvl, msg) not in shared]
    return out
