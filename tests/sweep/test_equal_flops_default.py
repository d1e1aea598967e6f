"""Equal FLOPs is the default path: a sweep whose arms differ in cost plans the shared train.eval_flops grid without
being asked (arms of equal cost plan nothing; `equal_flops: false` opts out), the sweep dir records the grid, and a
sweep grows in place: arms added to its file and launched into its dir get the recorded grid, finished runs are
reused, and an added arm whose budget falls short of the grid is refused in one line with the fix."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml

from gptlab.cli.sweep import main as sweep_main
from gptlab.errors import ConfigError
from gptlab.sweep.equal_flops import arm_cost, grid
from gptlab.sweep.plan import pending, planned_overrides
from gptlab.sweep.spec import load_sweep, record_definition, resolve
from helpers.cli import cli_env, run_cli

TINY = [
    "model.n_layer=1", "model.d_model=32", "model.n_head=4", "model.block_size=32", "train.batch_size=4",
    "train.eval_sequences=8", "sample.tokens=0", "logger=none", "hardware.dtype=fp32", "hardware.peak_flops=1e12",
    "train.max_steps=4", "train.eval_interval=2",
]  # fmt: skip
DIFFERENT = {"wide": ["mlp.ratio=4"], "narrow": ["mlp.ratio=2"]}  # the narrow MLP costs less per token
EQUAL = {"naive": ["attention.impl=naive"], "sdpa": ["attention.impl=sdpa"]}  # the same math: the same FLOPs


def sweep_file(tmp_path: Path, arms: dict, name: str = "mini", **extra) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"seeds": [0, 1], "overrides": TINY, "arms": arms, **extra}, sort_keys=False))
    return path


def dry_run(path: Path, out: Path, capsys, *args: str) -> tuple[str, dict[str, str | None]]:
    """(stdout, run name -> the train.eval_flops it gets, None for none) of a dry run."""
    assert sweep_main([str(path), "--out", str(out), "--dry-run", *args]) == 0
    text = capsys.readouterr().out
    runs = {}
    for line in text.splitlines():
        if ": gptlab-train " in line:
            found = re.search(r"train\.eval_flops=(\[[0-9,]+\])", line)
            runs[line.split("] ", 1)[1].split(":", 1)[0]] = found.group(1) if found else None
    return text, runs


def test_arms_of_different_cost_get_one_grid_without_being_asked(tmp_path, capsys):
    text, runs = dry_run(sweep_file(tmp_path, DIFFERENT), tmp_path / "out", capsys)
    name, spec, _ = load_sweep(str(tmp_path / "mini.yaml"))
    costs = [arm_cost(arm, planned_overrides(name, spec, arm, [])) for arm in spec["arms"]]
    expected = grid(costs, 2)  # the cheapest arm's evals: 4 steps // eval_interval 2
    assert len(runs) == 4 and set(runs.values()) == {f"[{','.join(str(v) for v in expected)}]"}
    assert expected[-1] == math.floor(min(c.total for c in costs))  # the cheapest arm's budget, rounded down
    note = next(line for line in text.splitlines() if line.startswith("note: equal FLOPs"))
    assert "(the default: the arms differ in cost; equal_flops: false or --equal-flops off opts out)" in note
    assert "every arm evaluated at 2 shared points" in note and "(narrow, 4 steps)" in note
    assert not (tmp_path / "out").exists()  # a dry run writes nothing
    sweep = resolve(str(tmp_path / "mini.yaml"), [], out=tmp_path / "out", note=lambda _: None)
    record_definition(sweep.sweep_dir, sweep.spec, sweep.extra, sweep.seeds)
    assert yaml.safe_load((tmp_path / "out" / "sweep.yaml").read_text())["flops_grid"] == expected  # recorded


def test_arms_of_equal_cost_plan_nothing_new(tmp_path, capsys):
    text, runs = dry_run(sweep_file(tmp_path, EQUAL), tmp_path / "out", capsys)
    assert len(runs) == 4 and set(runs.values()) == {None}
    assert "note: equal FLOPs: the arms cost the same per step" in text and "no grid planned" in text
    sweep = resolve(str(tmp_path / "mini.yaml"), [], out=tmp_path / "out", note=lambda _: None)
    name, spec, _ = load_sweep(str(tmp_path / "mini.yaml"))
    assert sweep.spec == spec  # the definition as the file gives it: nothing recorded beyond it
    todo = pending(sweep.name, sweep.spec, sweep.seeds, sweep.sweep_dir, sweep.extra)
    assert {r.overrides for r in todo.runs} == {
        (*planned_overrides(name, spec, arm, []), f"seed={seed}") for arm in EQUAL for seed in (0, 1)
    }  # the very runs a sweep planned before equal FLOPs was the default


@pytest.mark.parametrize(("extra", "args"), [({"equal_flops": False}, []), ({}, ["--equal-flops", "off"])])
def test_the_opt_out_is_honoured_and_said(tmp_path, capsys, extra, args):
    text, runs = dry_run(sweep_file(tmp_path, DIFFERENT, **extra), tmp_path / "out", capsys, *args)
    assert len(runs) == 4 and set(runs.values()) == {None}
    assert "note: equal FLOPs: not planned (opted out)" in text


def _launch(path: Path, out: Path):
    done = run_cli("gptlab.cli.sweep", str(path), "--out", str(out), env=cli_env(OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def test_a_sweep_grows_in_place_on_its_recorded_grid(tmp_path):
    """A finished two-arm sweep (MHA vs MQA, so a grid) and the same file with a FLOP-matched MQA added, launched
    into its dir: only the new arm's runs launch, on the grid the first launch recorded; the finished runs are
    reused untouched. An arm added too short for the grid is refused in one line, and nothing is written."""
    out = tmp_path / "out"
    arms = {"mha": ["attention=mha"], "mqa": ["attention=mqa"]}
    _launch(sweep_file(tmp_path, arms, seeds=[0]), out)
    record = yaml.safe_load((out / "sweep.yaml").read_text())
    recorded = record["flops_grid"]
    finished = {p: p.stat().st_mtime_ns for p in out.glob("*/seed0/summary.json")}
    assert len(finished) == 2 and len(recorded) == 2
    grown = {**arms, "mqa_matched": ["attention=mqa", "model.match=flops"]}
    done = _launch(sweep_file(tmp_path, grown, seeds=[0]), out)
    assert "[mini] the sweep grows by arm(s) mqa_matched in place: finished runs are reused" in done.stdout
    assert "local queue: 1 runs" in done.stdout and "(2 finished runs skipped)" in done.stdout
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/seed0/summary.json") if p in finished} == finished
    config = yaml.safe_load((out / "mqa_matched" / "seed0" / ".hydra" / "config.yaml").read_text())
    assert config["train"]["eval_flops"] == recorded and config["model"]["match"] == "flops"
    assert json.loads((out / "mqa_matched" / "seed0" / "summary.json").read_text())["status"] == "finished"
    after = yaml.safe_load((out / "sweep.yaml").read_text())
    assert list(after["arms"]) == ["mha", "mqa", "mqa_matched"] and after["flops_grid"] == recorded
    before = (out / "sweep.yaml").read_bytes()
    short = sweep_file(tmp_path, {**grown, "short": ["attention=mqa", "train.max_steps=2"]}, seeds=[0])
    for flags in (["--dry-run"], []):
        refused = run_cli("gptlab.cli.sweep", str(short), "--out", str(out), *flags, env=cli_env())
        err = refused.stderr.strip()
        assert refused.returncode == 2 and "\n" not in err, err
        assert err.startswith("error: equal FLOPs: arm 'short' trains ") and "short of the shared FLOPs grid" in err
        assert "give it train.max_steps=4 so its budget covers the grid, or launch it into a new dir" in err
    assert (out / "sweep.yaml").read_bytes() == before and not (out / "short").exists()


def _record(tmp_path: Path, arms: dict, **extra):
    sweep = resolve(str(sweep_file(tmp_path, arms, **extra)), [], out=tmp_path / "out", note=lambda _: None)
    record_definition(sweep.sweep_dir, sweep.spec, sweep.extra, sweep.seeds)
    return sweep


def test_a_dir_planned_without_a_grid_keeps_none_and_says_how_to_get_one(tmp_path):
    """Equal-cost arms recorded no grid; an arm of another cost added there would need one that changes the finished
    runs: refused with the fix. A dir launched before grids were the default (its arms already differ) goes on."""
    _record(tmp_path, EQUAL)
    odd = {**EQUAL, "narrow": ["mlp.ratio=2"]}
    with pytest.raises(ConfigError, match=r"^equal FLOPs: arm 'narrow' costs .* launched without a shared FLOPs grid"):
        resolve(str(sweep_file(tmp_path, odd)), [], out=tmp_path / "out", note=lambda _: None)
    notes: list[str] = []
    opted = resolve(str(sweep_file(tmp_path, odd, equal_flops=False)), [], out=tmp_path / "out", note=notes.append)
    assert record_definition(opted.sweep_dir, opted.spec, opted.extra, opted.seeds) == []  # grown, still no grid
    assert "flops_grid" not in yaml.safe_load((tmp_path / "out" / "sweep.yaml").read_text())
    old = tmp_path / "old"
    old.mkdir()
    doc = {"seeds": [0, 1], "overrides": TINY, "arms": DIFFERENT, "extra_overrides": []}
    (old / "sweep.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))  # as a launch before the default wrote it
    again = resolve(str(sweep_file(tmp_path, DIFFERENT)), [], out=old, note=notes.append)
    assert "flops_grid" not in again.spec and not any("train.eval_flops" in o for o in again.spec["overrides"])


def test_a_dir_with_a_grid_refuses_another_grid_or_none(tmp_path):
    first = _record(tmp_path, DIFFERENT)
    assert len(first.spec["flops_grid"]) == 2
    path = str(sweep_file(tmp_path, DIFFERENT))
    with pytest.raises(ConfigError, match=r"^--equal-flops 3: this sweep dir's runs evaluate at the 2 shared FLOPs"):
        resolve(path, [], out=tmp_path / "out", equal_flops="3", note=lambda _: None)
    with pytest.raises(ConfigError, match=r"^equal FLOPs off: this sweep dir's runs evaluate at the shared FLOPs grid"):
        resolve(path, [], out=tmp_path / "out", equal_flops="off", note=lambda _: None)
    again = resolve(path, [], out=tmp_path / "out", equal_flops="2", note=lambda _: None)
    assert again.spec["flops_grid"] == first.spec["flops_grid"]


def test_a_corpus_with_a_fixed_vocabulary_is_costed_without_reading_it(tmp_path):
    """data=hf with the gpt2 tokenizer: 50,257 ids and windows of block_size tokens, known without the corpus (a
    launching machine that cannot reach the hub, or should not tokenize it, still plans the grid)."""
    from gptlab.config.build import build_cost_model, compose
    from gptlab.costs.report import train_flops_per_token

    given = [*TINY, "data=hf", "data.name=nobody/no-such-corpus", "data.tokenizer=gpt2"]
    cost = arm_cost("hub", given)
    per_token = train_flops_per_token(build_cost_model(compose(given), 50257), 32)
    assert cost.flops_per_step == pytest.approx(4 * 32 * per_token, rel=0) and cost.eval_interval == 2


def test_a_grid_recorded_by_an_earlier_equal_flops_launch_is_reused(tmp_path):
    """A dir whose grid was asked for with --equal-flops before flops_grid was recorded (the grid only as the override
    among its shared overrides): an added arm joins that grid, not one planned from the new arm set."""
    planned = [*TINY, "train.eval_flops=[1000,2000]"]  # an earlier grid, unlike what these arms would plan now
    doc = {"seeds": [0, 1], "overrides": planned, "arms": DIFFERENT, "equal_flops": 2, "extra_overrides": []}
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "sweep.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    grown = resolve(str(sweep_file(tmp_path, {**DIFFERENT, "gqa": ["attention=gqa", "attention.n_kv_head=2"]})), [],
                    out=tmp_path / "out", note=lambda _: None)  # fmt: skip
    assert grown.spec["overrides"] == planned and grown.spec["flops_grid"] == [1000, 2000]
    assert record_definition(grown.sweep_dir, grown.spec, grown.extra, grown.seeds) == []
    assert list(yaml.safe_load((tmp_path / "out" / "sweep.yaml").read_text())["arms"]) == ["wide", "narrow", "gqa"]
