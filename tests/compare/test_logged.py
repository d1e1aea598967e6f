"""Each run's train.log warnings appear beside its arm: in the terminal, comparison.md, .html and .json."""

from __future__ import annotations

import json

from rich.console import Console

from gptlab.compare import modes
from gptlab.compare.reading.logged import EVERY_ARM, by_arm, run_messages
from gptlab.compare.render import document, html_page, json_report, markdown, terminal
from tests.helpers.compare import write_run

WARMUP = "schedule.warmup_steps=50 is 100% of train.max_steps=40: most of this run is lr warm-up (lower ...)"
SPIKE = "step 30: loss spike 4.1 > 3 x the median of the last 20 steps"


def log(run, *records: tuple[str, str, str]) -> None:
    lines = [f"[2026-11-27 08:02:13,826][{name}][{level}] - {msg}" for name, level, msg in records]
    (run / "train.log").write_text("\n".join([*lines, "  a continuation line of the record", "step 0/2 | val 4.3"]))


def test_a_runs_warnings_are_read_once_each_with_their_level(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    log(
        run,
        ("gptlab.train.run", "INFO", "device cpu"),
        ("gptlab.train.run", "WARNING", WARMUP),
        ("gptlab.train.loop", "WARNING", SPIKE),
        ("gptlab.train.loop", "WARNING", SPIKE),
        ("gptlab.sinks", "ERROR", "W&B: logging failed: disk full; training goes on"),
    )
    assert run_messages(run) == [
        ("WARNING", WARMUP),
        ("WARNING", SPIKE),
        ("ERROR", "W&B: logging failed: disk full; training goes on"),
    ]
    assert run_messages(tmp_path / "no-such-run") == []


def test_a_message_every_run_logged_is_one_line_and_the_rest_sit_beside_their_arm(tmp_path):
    runs = {}
    for arm in ("mha", "gqa"):
        for seed in (0, 1):
            runs[arm, seed] = run = tmp_path / arm / f"seed{seed}"
            run.mkdir(parents=True)
    for (arm, seed), run in runs.items():
        log(
            run,
            ("gptlab.train.run", "WARNING", WARMUP),
            *[("gptlab.train.loop", "WARNING", SPIKE)] * (arm == "gqa" and seed == 1),
        )
    found = by_arm([(arm, [runs[arm, 0], runs[arm, 1]]) for arm in ("mha", "gqa")])
    assert [x.describe() for x in found] == [
        f"{EVERY_ARM} (4 of 4 runs): warning: {WARMUP}",
        f"gqa (1 of 2 runs): warning: {SPIKE}",
    ]


def test_the_report_shows_each_arms_logged_warnings(tmp_path):
    for arm, attention in (("mha", "mha"), ("gqa", "gqa")):
        for seed in (0, 1):
            run = write_run(tmp_path / arm / f"seed{seed}", seed=seed, choices={"attention": attention})
            if arm == "gqa":
                log(run, ("gptlab.train.loop", "WARNING", SPIKE))
    found = modes.tables(modes.Request([str(tmp_path)], baseline="attention=mha", out=str(tmp_path / "cmp")))
    cmp = found.comparisons[0]
    label = next(r.label for r in cmp.rows if "gqa" in r.label)
    expected = f"{label} (2 of 2 runs): warning: {SPIKE}"
    report = document.build(cmp)
    console = Console(width=400, record=True)
    terminal.print_document(report, console)
    assert [line for line in console.export_text().splitlines() if line.startswith("logged:")] == [
        f"logged: {expected}"
    ]
    assert f"- {expected}" in markdown.write(report)
    page = html_page.write(report)
    assert "What the runs logged while training" in page and "2 of 2" in page and "loss spike 4.1 &gt; 3" in page
    doc = json.loads(json.dumps(json_report.comparison(cmp)))
    assert doc["logged"] == [{"arm": label, "level": "WARNING", "message": SPIKE, "runs": 2, "of": 2}]
