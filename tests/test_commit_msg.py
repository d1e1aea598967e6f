"""The commit-msg hook (scripts/check_commit_msg.py, wired in .pre-commit-config.yaml): a subject of at most 72
characters, a blank line before any body; what git strips from a message is not counted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "check_commit_msg.py"


def check(tmp_path: Path, message: str) -> subprocess.CompletedProcess:
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message)
    return subprocess.run([sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    "message",
    [
        "x" * 72,
        "Move the profiler under train/\n\nWhy it moved, and the figures: 3 files, 0 arrows up.\n",
        "\n\nShort subject after git-stripped blank lines\n",
        "Subject\n# a comment line git strips, however long " + "y" * 80 + "\n\nBody\n",
        "Subject\n\n" + "a body line may be as long as it needs " * 5 + "\n",
        "Subject\n" + "# ------------------------ >8 ------------------------\n" + "diff that is not the message\n",
        "fixup! " + "z" * 80,
        "",
    ],
    ids=["72", "subject-and-body", "leading-blanks", "comments", "long-body", "scissors", "fixup", "empty"],
)
def test_a_good_message_passes(tmp_path, message):
    done = check(tmp_path, message)
    assert (done.returncode, done.stderr) == (0, "")


def test_a_subject_over_72_characters_is_refused_with_its_length(tmp_path):
    done = check(tmp_path, "x" * 73 + "\n\nBody.\n")
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "commit message: subject is 73 characters, at most 72: say what changed in one short line and put the why "
        "and the figures in the body"
    ]


def test_a_body_without_a_blank_line_is_refused(tmp_path):
    done = check(tmp_path, "Subject\nbody straight under it\n")
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "commit message: no blank line between the subject and the body (line 2 must be empty)"
    ]


def test_both_rules_are_reported_at_once(tmp_path):
    done = check(tmp_path, "x" * 100 + "\nbody\n")
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 2


def test_the_hook_is_wired_for_the_commit_msg_stage():
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    assert "commit-msg" in config["default_install_hook_types"]  # `pre-commit install` installs it
    hooks = {hook["id"]: hook for repo in config["repos"] for hook in repo["hooks"]}
    hook = hooks["commit-msg"]
    assert hook["stages"] == ["commit-msg"] and hook["language"] == "system"
    assert hook["entry"].split()[-1] == "scripts/check_commit_msg.py" and (ROOT / hook["entry"].split()[-1]).is_file()
