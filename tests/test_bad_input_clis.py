"""Bad input through gptlab-sample and gptlab-sweep: ONE table of (command, arguments, exit code, needle).

Each row must end in exactly one stderr line `error: ...` containing the needle, no traceback, exit code 2,
and nothing written ({tmp}/out must not appear). Rows run in-process (main(argv)); rows marked `process`
run as real `python -m gptlab.cli.<command>` processes too. {tmp} is an empty folder, not a run dir: the
flags are checked before the run dir is read, so a flag check that is missing shows up as another error.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import pytest

from helpers.cli import run_cli


@dataclass
class Row:
    id: str
    cli: str  # gptlab.cli.<cli>
    args: list[str]
    needle: str
    process: bool = False


TABLE = [
    Row(
        "sample-temperature-negative",
        "sample",
        ["{tmp}", "--temperature", "-1"],
        "--temperature=-1.0: must be >= 0 (0 = greedy)",
        process=True,
    ),
    Row(
        "sample-temperature-nan",
        "sample",
        ["{tmp}", "--temperature", "nan"],
        "--temperature=nan: must be a finite number >= 0 (0 = greedy)",
    ),
    Row("sample-tokens-negative", "sample", ["{tmp}", "--tokens", "-5"], "--tokens=-5: must be >= 0"),
    Row("sample-top-k-zero", "sample", ["{tmp}", "--top-k", "0"], "--top-k=0: must be >= 1"),
    Row("sample-top-k-negative", "sample", ["{tmp}", "--top-k=-3"], "--top-k=-3: must be >= 1"),
    Row("sample-seed-negative", "sample", ["{tmp}", "--seed=-1"], "--seed=-1: must be in [0, 2**63)"),
    Row("sample-seed-too-big", "sample", ["{tmp}", f"--seed={2**64}"], f"--seed={2**64}: must be in [0, 2**63)"),
    Row(
        "sample-tokens-not-int",
        "sample",
        ["{tmp}", "--tokens", "abc"],
        "gptlab-sample: argument --tokens: invalid int value: 'abc'",
    ),
    Row(
        "sample-unknown-flag",
        "sample",
        ["{tmp}", "--top_p", "0.9"],
        "gptlab-sample: unrecognized arguments: --top_p 0.9",
    ),
    Row("sample-not-a-run-dir", "sample", ["{tmp}"], "{tmp}: not a run directory (no .hydra/config.yaml)"),
    Row(
        "sweep-seeds-letters",
        "sweep",
        ["fast", "--seeds", "a,b", "--out", "{tmp}/out"],
        "--seeds: 'a,b' is not a comma-separated list of integers",
        process=True,
    ),
    Row(
        "sweep-seeds-empty-item",
        "sweep",
        ["fast", "--seeds", "1,,2", "--out", "{tmp}/out"],
        "--seeds: '1,,2' is not a comma-separated list of integers",
    ),
    Row(
        "sweep-seeds-float",
        "sweep",
        ["fast", "--seeds", "0.5", "--out", "{tmp}/out"],
        "--seeds: '0.5' is not a comma-separated list of integers",
    ),
    Row(
        "sweep-seeds-negative",
        "sweep",
        ["fast", "--seeds=-1,2", "--out", "{tmp}/out"],
        "--seeds: seed -1 is out of range; allowed: integers in [0, 2**63)",
    ),
    Row(
        "sweep-seeds-too-big",
        "sweep",
        ["fast", f"--seeds=0,{2**63}", "--out", "{tmp}/out"],
        f"--seeds: seed {2**63} is out of range; allowed: integers in [0, 2**63)",
    ),
    Row(
        "sweep-unknown-name",
        "sweep",
        ["nosuch", "--out", "{tmp}/out"],
        "sweep 'nosuch': no such sweep file; available:",
    ),
]


def check(code, stderr: str, needle: str, tmp) -> list[str]:
    """What is wrong with one outcome (empty when it behaved)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    problems = []
    if code != 2:
        problems.append(f"exit code {code!r}, expected 2")
    if len(lines) != 1 or not lines[0].startswith("error: ") or needle not in lines[0]:
        problems.append(f"stderr is not one line 'error: ...{needle}...': {stderr[-1500:]!r}")
    if (tmp / "out").exists():
        problems.append("wrote the sweep dir")
    return problems


@pytest.mark.parametrize("row", TABLE, ids=lambda r: r.id)
def test_bad_cli_input(row, tmp_path, capsys):
    args = [a.format(tmp=tmp_path) for a in row.args]
    needle = row.needle.format(tmp=tmp_path)
    main = importlib.import_module(f"gptlab.cli.{row.cli}").main
    try:
        code = main(args)
    except SystemExit as stop:
        code = stop.code
    problems = check(code, capsys.readouterr().err, needle, tmp_path)
    assert not problems, problems
    if row.process:
        proc = run_cli(f"gptlab.cli.{row.cli}", *args, timeout=120, cwd=tmp_path)
        problems = check(proc.returncode, proc.stderr, needle, tmp_path)
        assert not problems, f"as a process: {problems}"


def test_table_is_named_and_covers_both_commands():
    assert len({r.id for r in TABLE}) == len(TABLE)
    assert {r.cli for r in TABLE} == {"sample", "sweep"}


def test_broken_sweep_yaml_and_non_numeric_summary_are_one_line_errors(tmp_path):
    """A sweep file that is not YAML, and a summary whose val loss is text, end in one named line (exit 2)."""
    import json as _json

    bad = tmp_path / "broken.yaml"
    bad.write_text("arms: {a: [x=1]\nseeds: [0")
    out = run_cli("gptlab.cli.sweep", str(bad), "--dry-run", timeout=120)
    assert out.returncode == 2 and out.stderr.strip().splitlines()[-1].startswith(f"error: {bad}: not valid YAML (")
    assert len(out.stderr.strip().splitlines()) == 1
    run = tmp_path / "runs" / "r0"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(_json.dumps({"final_val_loss": "abc", "status": "finished", "steps": 4}))
    (run / "metrics.jsonl").write_text('{"step": 4, "val/loss": 2.5}\n')
    out = run_cli("gptlab.cli.compare", str(tmp_path / "runs"), "--out", str(tmp_path / "cmp"), timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        f"gptlab-compare: error: {run / 'summary.json'}: final_val_loss='abc' is not a number (a damaged or hand-edited file?)"
    ]
    assert not (tmp_path / "cmp").exists()
