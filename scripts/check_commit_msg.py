"""The commit-msg hook: a subject of at most 72 characters, then a blank line before any body.

Usage (pre-commit runs it with the message file):  python3 scripts/check_commit_msg.py .git/COMMIT_EDITMSG

`git log --oneline` shows the subject alone, so it must say what changed in one short line; the why and the figures
go in the body. Lines git strips (comments, everything under the `git commit -v` scissors) are not counted, and a
fixup!/squash!/amend! subject, which `git rebase --autosquash` folds away, is let through.
"""

from __future__ import annotations

import sys
from pathlib import Path

MAX_SUBJECT = 72
SCISSORS = "# ------------------------ >8 ------------------------"
TEMPORARY = ("fixup! ", "squash! ", "amend! ")


def message_lines(text: str) -> list[str]:
    """The message as git keeps it: no comment lines, nothing under the scissors, no leading or trailing blanks."""
    lines = []
    for line in text.splitlines():
        if line.startswith(SCISSORS):
            break
        if not line.startswith("#"):
            lines.append(line.rstrip())
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


def problems(text: str) -> list[str]:
    """One line per broken rule; empty when the message is fine (an empty message is git's own to refuse)."""
    lines = message_lines(text)
    if not lines or lines[0].startswith(TEMPORARY):
        return []
    found = []
    if len(lines[0]) > MAX_SUBJECT:
        found.append(
            f"subject is {len(lines[0])} characters, at most {MAX_SUBJECT}: say what changed in one short line "
            f"and put the why and the figures in the body"
        )
    if len(lines) > 1 and lines[1]:
        found.append("no blank line between the subject and the body (line 2 must be empty)")
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: check_commit_msg.py MESSAGE_FILE", file=sys.stderr)
        return 2
    found = problems(Path(argv[0]).read_text(encoding="utf-8", errors="replace"))
    for problem in found:
        print(f"commit message: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
