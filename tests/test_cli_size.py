"""A CLI parses, prints and picks exit codes; the work lives in the library: every gptlab/cli/*.py stays within
CLI_MAX_LINES. Not a size-driven split (library modules have no cap): a CLI module past it holds work (a loop, a
report, a config read) that belongs to a library room, e.g. the until-decided looks in gptlab/study/.

The walls of gptlab/study/ (above sweep/ and compare/, below cli/; nothing below it imports it) are
tests/test_layout.py's ROOMS order, checked there with every other room's."""

from __future__ import annotations

from pathlib import Path

import pytest

CLI = Path(__file__).resolve().parents[1] / "gptlab" / "cli"
CLI_MAX_LINES = 300


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


@pytest.mark.parametrize("module", sorted(p.name for p in CLI.glob("*.py")))
def test_every_cli_module_stays_small(module):
    lines = _lines(CLI / module)
    assert lines <= CLI_MAX_LINES, (
        f"gptlab/cli/{module} has {lines} lines (> {CLI_MAX_LINES}): move the work it holds into the library room "
        "it belongs to, and keep parsing, printing and exit codes here"
    )


def test_the_size_check_counts_lines(tmp_path):
    small, big = tmp_path / "small.py", tmp_path / "big.py"
    small.write_text('"""One line."""\n')
    big.write_text("x = 1\n" * (CLI_MAX_LINES + 1))
    assert _lines(small) == 1 and _lines(big) == CLI_MAX_LINES + 1
