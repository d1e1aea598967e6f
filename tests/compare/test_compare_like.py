"""Verdicts a researcher would publish: like with like by construction, one machine peak, power, plots that carry the
verdict. Every expected figure is worked out here from the files and scipy.stats, independently of gptlab.compare."""

from __future__ import annotations

import json
import math
import re
import shutil
import statistics
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from matplotlib.collections import PathCollection, PolyCollection
from scipy import stats as sps

from gptlab.cli.compare import main
from gptlab.compare.reading.runs import discover, load_run
from gptlab.compare.render.plots import make_plots
from gptlab.compare.render.report import LOADED
from gptlab.compare.statistics import power
from gptlab.compare.tables import curves
from gptlab.compare.tables.analysis import compare
from helpers.compare import default_loss, write_run, write_sweep, write_timing


def _shifted(delta: float):
    return lambda step: default_loss(step) + delta


def _run(tmp: Path, capsys, *args) -> tuple[int, str, str]:
    rc = main([*(str(a) for a in args), "--no-wandb"])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _ok(tmp: Path, capsys, *args) -> tuple[dict, str, str]:
    """Compare into tmp/out; (comparison.json, stdout, stderr)."""
    rc, out, err = _run(tmp, capsys, *args, "--out", tmp / "out")
    assert rc == 0, err
    return json.loads((tmp / "out" / "comparison.json").read_text()), out, err


def _refused(tmp: Path, capsys, *args) -> str:
    """The one-line error of a refused comparison (exit 2, nothing written)."""
    rc, out, err = _run(tmp, capsys, *args, "--out", tmp / "out")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith("gptlab-compare: error: ") and not (tmp / "out").exists()
    return err.strip().removeprefix("gptlab-compare: error: ")


def _patch_summary(run: Path, **values) -> None:
    path = run / "summary.json"
    summary = json.loads(path.read_text())
    summary.update(values)
    path.write_text(json.dumps(summary))


# ---------------------------------------------------------------- like with like: the validation set


@pytest.mark.parametrize(
    "key, a, b, shown",
    [
        (
            "train.eval_sequences",
            dict(leaves={"train.eval_sequences": 32}),
            dict(leaves={"train.eval_sequences": 8}),
            ("32", "8"),
        ),
        ("data_seed", dict(leaves={"data_seed": 1}), dict(leaves={"data_seed": 2}), ("1", "2")),
        (
            "data_fingerprint",
            dict(data_fingerprint="text:aaa"),
            dict(data_fingerprint="text:bbb"),
            ("text:aaa", "text:bbb"),
        ),
        ("seq_len", dict(leaves={"model.block_size": 32}), dict(leaves={"model.block_size": 64}), ("32", "64")),
    ],
)
def test_runs_on_different_validation_sets_are_refused_naming_the_key(tmp_path, capsys, key, a, b, shown):
    write_run(tmp_path / "A" / "seed0", seed=0, **a)
    write_run(tmp_path / "B" / "seed0", seed=0, choices={"attention": "gqa"}, **b)
    assert _refused(tmp_path, capsys, tmp_path) == (
        f"runs differ in {key} ({shown[0]} in A/seed0, {shown[1]} in B/seed0): their val losses are on different "
        f"validation sets; compare them separately or pass --split-by {key}"
    )


def test_seeds_of_one_arm_on_different_validation_sets_are_never_pooled(tmp_path, capsys):
    write_run(tmp_path / "A" / "seed0", seed=0, leaves={"train.eval_sequences": 32})
    write_run(tmp_path / "A" / "seed1", seed=1, leaves={"train.eval_sequences": 8})
    # runs are named relative to their common folder (A/ here), as every compare message does
    assert _refused(tmp_path, capsys, tmp_path).startswith(
        "runs differ in train.eval_sequences (32 in seed0, 8 in seed1)"
    )


def test_split_by_gives_one_table_per_validation_set(tmp_path, capsys):
    shifts = {32: (0.0, 0.01, 0.2, 0.21), 8: (0.5, 0.51, 0.6, 0.62)}  # mha seed 0/1, gqa seed 0/1
    for n, (m0, m1, g0, g1) in shifts.items():
        for seed, d in ((0, m0), (1, m1)):
            write_run(
                tmp_path / f"e{n}" / "mha" / f"seed{seed}",
                seed=seed,
                loss_at=_shifted(d),
                leaves={"train.eval_sequences": n},
            )
        for seed, d in ((0, g0), (1, g1)):
            write_run(
                tmp_path / f"e{n}" / "gqa" / f"seed{seed}",
                seed=seed,
                choices={"attention": "gqa"},
                loss_at=_shifted(d),
                leaves={"train.eval_sequences": n},
            )
    index, out, err = _ok(
        tmp_path, capsys, tmp_path, "--split-by", "train.eval_sequences", "--baseline", "attention=mha"
    )
    assert index["split_by"] == ["train.eval_sequences"]
    assert [p["out"] for p in index["parts"]] == ["train.eval_sequences=8", "train.eval_sequences=32"]  # numeric order
    for n, (m0, m1, g0, g1) in shifts.items():
        folder = tmp_path / "out" / f"train.eval_sequences={n}"
        doc = json.loads((folder / "comparison.json").read_text())
        assert doc["split"] == {"train.eval_sequences": str(n)}
        assert doc["validation_set"]["train.eval_sequences"] == str(n)
        base, gqa = doc["rows"]
        assert all(f"/e{n}/" in run for row in doc["rows"] for run in row["runs"])  # never the other set's runs
        assert base["val_loss_mean"] == pytest.approx(default_loss(100) + (m0 + m1) / 2)
        assert gqa["delta_val_loss"] == pytest.approx((g0 + g1) / 2 - (m0 + m1) / 2)
        assert (folder / "comparison.md").read_text().startswith(f"# Comparison at step 100 [train.eval_sequences={n}]")
        assert (
            f"[train.eval_sequences={n}](train.eval_sequences={n}/comparison.md)"
            in (tmp_path / "out" / "comparison.md").read_text()
        )
    assert "wrote" in out and "the 2 tables split by train.eval_sequences" in out


def test_split_by_a_key_no_run_has_is_refused(tmp_path, capsys):
    write_run(tmp_path / "a", seed=0)
    message = _refused(tmp_path, capsys, tmp_path / "a", "--split-by", "train.nope")
    assert message.startswith("--split-by train.nope: no run has this key; allowed: data_fingerprint, data_seed, ")
    assert "a config group (" in message and "or a dotted config key (e.g. train.batch_size)" in message


def test_a_run_without_data_fingerprint_is_checked_by_config_with_a_warning(tmp_path, capsys):
    write_run(tmp_path / "a", seed=0, data_fingerprint="text:aaa")
    write_run(tmp_path / "b", seed=1)  # an older run: no fingerprint
    doc, _, err = _ok(tmp_path, capsys, tmp_path / "a", tmp_path / "b")
    line = (
        "warning: b: no data_fingerprint recorded (older runs), so their validation data is checked by config only "
        "(data, tokenizer, data_seed, train.eval_sequences, sequence length)"
    )
    assert line in err.splitlines() and line in doc["warnings"]
    assert doc["validation_set"] == {
        "data_fingerprint": "text:aaa",
        "data_seed": "1234",
        "train.eval_sequences": "16",
        "seq_len": "32",
    }


# ---------------------------------------------------------------- like with like: the budget


def test_arms_of_other_batch_sizes_are_compared_at_equal_tokens(tmp_path, capsys):
    # tokens per step 4 x 32 = 128 and 6 x 32 = 192; evals every 25 steps: 9,600 tokens is batch 4's step 75 and
    # batch 6's step 50, the one token count both evaluated at
    for seed, d in ((0, 0.0), (1, 0.01)):
        write_run(tmp_path / "b4" / f"seed{seed}", seed=seed, loss_at=_shifted(d))
        write_run(tmp_path / "b6" / f"seed{seed}", seed=seed, loss_at=_shifted(d + 0.1), leaves={"train.batch_size": 6})
    doc, out, err = _ok(tmp_path, capsys, tmp_path)
    assert doc["compared_at"] == {"by": "tokens", "value": 9600} and doc["step"] == 75
    base, arm = doc["rows"]
    assert (base["label"], arm["label"]) == ("train.batch_size=4", "train.batch_size=6")
    assert (base["at_step"], arm["at_step"]) == (75, 50)
    assert base["val_loss_mean"] == pytest.approx(default_loss(75) + 0.005)
    assert arm["val_loss_mean"] == pytest.approx(default_loss(50) + 0.105)
    assert arm["budget"] == {"train.max_steps": "100", "tokens_per_step": "192"}
    *notes, untimed = doc["notes"]
    assert untimed.startswith("note: speed not timed: no timing session covers the baseline")
    assert notes == [
        "note: 'train.batch_size=6' differs from the baseline in tokens per step: 192 vs 128 (batch size 6 vs 4 × "
        "sequence length 32), an arm difference: it sees other numbers of tokens at one step",
        "note: compared at equal tokens, 9,600, since the arms differ in tokens per step ('train.batch_size=4' step "
        "75, 'train.batch_size=6' step 50)",
    ]
    assert [line for line in err.splitlines() if line.startswith("note:")] == doc["notes"]
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert md.startswith("# Comparison at 9,600 tokens") and "| val loss @ 9,600 tokens |" in md
    assert (tmp_path / "out" / "delta_val_loss_vs_tokens.png").is_file()


def test_batch_sizes_without_an_equal_token_eval_are_compared_at_equal_step_with_a_warning(tmp_path, capsys):
    write_run(tmp_path / "b4", seed=0)
    write_run(tmp_path / "b5", seed=0, leaves={"train.batch_size": 5})  # 160 per step: 4,000, 8,000, ... never 3,200k
    doc, _, err = _ok(tmp_path, capsys, tmp_path)
    line = (
        "warning: the runs differ in tokens per step and are compared at equal step 100 (no eval point has equal "
        "tokens in every run): there they have seen 12,800, 16,000 tokens, so a val loss difference mixes the arm "
        "with the amount of data"
    )
    assert doc["compared_at"] == {"by": "step", "value": 100} and line in doc["warnings"] and line in err


def test_another_step_budget_is_named_as_an_arm_difference(tmp_path, capsys):
    write_run(tmp_path / "short", seed=0)
    write_run(tmp_path / "long", seed=0, max_steps=200)
    doc, _, err = _ok(tmp_path, capsys, tmp_path / "short", tmp_path / "long")
    *notes, untimed = doc["notes"]
    assert notes == [
        "note: 'train.max_steps=200' differs from the baseline in budget: train.max_steps 200 vs 100, an arm "
        "difference (at one step their learning-rate schedules are at different points)"
    ]
    # loose run dirs: the one command that times them is compare's own --time, with the paths and --out given
    assert untimed.endswith(f"{tmp_path / 'short'} {tmp_path / 'long'} --out {tmp_path / 'out'} --time)")
    assert doc["step"] == 100 and not any("stopped early" in w for w in doc["warnings"])  # it finished its budget


def test_an_arm_started_from_another_runs_checkpoint_is_named(tmp_path, capsys):
    write_run(tmp_path / "scratch", seed=0)
    warm = write_run(tmp_path / "warm", seed=0, leaves={"train.init_from": "/ckpt/step_40.pt"}, loss_at=_shifted(-0.2))
    _patch_summary(warm, init_from={"checkpoint": "/ckpt/step_40.pt", "step": 40, "differences": []})
    doc, _, err = _ok(tmp_path, capsys, tmp_path / "scratch", warm)
    note = (
        "note: 'train.init_from=/ckpt/step_40.pt' starts from another run's checkpoint (/ckpt/step_40.pt at step "
        "40), not from scratch: its val loss includes that run's training"
    )
    assert doc["notes"][:-1] == [note] and note in err.splitlines() and "speed not timed" in doc["notes"][-1]


# ---------------------------------------------------------------- like with like: one run counts once


def _two_by_two(tmp: Path) -> Path:
    specs = [dict(seed=s, loss_at=_shifted(0.01 * s)) for s in (0, 1)]
    specs += [dict(seed=s, choices={"attention": "gqa"}, loss_at=_shifted(0.1 + 0.02 * s)) for s in (0, 1)]
    return write_sweep(tmp / "sw", specs)


def test_a_copied_run_dir_counts_once(tmp_path, capsys):
    sweep = _two_by_two(tmp_path)
    before, _, _ = _ok(tmp_path / "before", capsys, sweep)
    shutil.copytree(sweep / "1", sweep / "4")
    doc, _, err = _ok(tmp_path, capsys, sweep)
    line = "warning: 4 is a copy of 1 (identical metrics.jsonl, summary.json and config): counted once, as 1"
    assert line in err.splitlines() and doc["warnings"] == [line]
    assert [r["n_seeds"] for r in doc["rows"]] == [2, 2]
    assert doc["rows"][0]["val_loss_std"] == before["rows"][0]["val_loss_std"]
    assert doc["rows"][1]["p_value"] == before["rows"][1]["p_value"]


def test_a_config_rerun_with_the_same_seeds_counts_once(tmp_path, capsys):
    """The 2x2 sweep run again (same configs and seeds, other timings: not a copy) and both dirs given: the replays
    agreed to the bit and were pooled as four seeds per arm, which read as no seed noise (p 0.0, a decided gap)."""
    sweep = _two_by_two(tmp_path)
    before, _, _ = _ok(tmp_path / "before", capsys, sweep)
    specs = [dict(seed=s, loss_at=_shifted(0.01 * s), step_ms=51.0) for s in (0, 1)]
    specs += [
        dict(seed=s, choices={"attention": "gqa"}, loss_at=_shifted(0.1 + 0.02 * s), step_ms=51.0) for s in (0, 1)
    ]
    again = write_sweep(tmp_path / "again", specs)
    doc, _, err = _ok(tmp_path, capsys, sweep, again)
    replays = [w for w in doc["warnings"] if "a replay is not a new sample" in w]
    assert [r["n_seeds"] for r in doc["rows"]] == [2, 2] and len(replays) == 4 and set(replays) <= set(err.splitlines())
    assert replays[0] == (
        "warning: again/2026-01-01_12-00-00/0 repeats sw/2026-01-01_12-00-00/0's config and seeds (data_seed 1234, "
        "seed 0): a replay is not a new sample; counted once, as sw/2026-01-01_12-00-00/0"
    )
    assert doc["rows"][1]["p_value"] == before["rows"][1]["p_value"] > 0


def test_a_replay_left_out_moves_neither_the_point_nor_the_warnings(tmp_path, capsys):
    """The baseline's seed 0 run again in another dir and stopped at step 50: counted once (as the finished run), yet
    it used to set the comparison point (step 50 for every arm, where all counted runs reach 100) and add a 'status
    failed' warning about a run the table does not hold."""
    sweep = _two_by_two(tmp_path)
    before, _, _ = _ok(tmp_path / "before", capsys, sweep)
    again = write_sweep(tmp_path / "again", [dict(seed=0, loss_at=_shifted(0.0), stop_at=50)])
    doc, _, err = _ok(tmp_path, capsys, sweep, again)
    assert doc["step"] == before["step"] == 100
    assert doc["warnings"] == [
        "warning: again/2026-01-01_12-00-00/0 repeats sw/2026-01-01_12-00-00/0's config and seeds (data_seed 1234, "
        "seed 0): a replay is not a new sample; counted once, as sw/2026-01-01_12-00-00/0"
    ]
    assert [r["val_loss_mean"] for r in doc["rows"]] == [r["val_loss_mean"] for r in before["rows"]]


@pytest.mark.parametrize("key", ["val/loss", "probe/length/4x/loss"])
def test_a_non_finite_figure_in_metrics_jsonl_is_refused_in_one_line(tmp_path, capsys, key):
    """gptlab writes a figure it could not measure as null; a NaN seed read from a damaged or foreign file made the
    main table crash in the power step and the probe table call the arm "within noise" (p NaN)."""
    sweep = _two_by_two(tmp_path)
    metrics = sweep / "3" / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    rows[-1][key] = math.nan
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    step = rows[-1]["step"]
    assert _refused(tmp_path, capsys, sweep) == (
        f"{metrics} step {step}: {key}=nan is not finite (gptlab writes a figure it could not measure as null: a "
        "damaged or hand-edited file?)"
    )


@pytest.mark.parametrize(
    "train_clock,clock,keys",
    [(False, "wall time", "train.diagnostics, train.ckpt_interval"), (True, "training time", "train.diagnostics")],
)
def test_runs_that_differ_in_observing_keys_are_named_for_their_time(train_clock, clock, keys, tmp_path, capsys):
    """Probes, extra val sets, diagnostics and checkpoints never make two arms, but their time is inside wall_s: an
    arm run with probes read 1.07 lower at equal wall time and 2.76x faster to target than its identical twin. Runs
    without a training clock (train_s) are read on wall time, where every such key is named; training time leaves
    checkpoints (and evals, probes) out, so only the diagnostics, which sync inside the step, are."""
    specs = [dict(seed=s, loss_at=_shifted(0.01 * s), train_clock=train_clock) for s in (0, 1)]
    specs += [
        dict(seed=s, choices={"attention": "gqa"}, loss_at=_shifted(0.1 + 0.02 * s), train_clock=train_clock)
        for s in (0, 1)
    ]
    specs[2]["leaves"] = specs[3]["leaves"] = {"train.ckpt_interval": 10, "train.diagnostics": True}
    doc, _, err = _ok(tmp_path, capsys, write_sweep(tmp_path / "sw", specs))
    line = (
        f"warning: the runs differ in {keys}, whose work is inside their {clock}: equal-time readings and {clock} to "
        "target charge some runs more than others (read the step and FLOP readings, or rerun the arms alike)"
    )
    assert doc["clock"] == ("train_s" if train_clock else "wall_s") and doc["warnings"] == [line]
    assert line in err.splitlines() and len(doc["rows"]) == 2


def test_one_wandb_run_in_two_dirs_counts_once_as_the_dir_that_got_further(tmp_path, capsys):
    full = write_run(tmp_path / "full", seed=0)
    _patch_summary(full, wandb={"id": "abc123", "project": "gptlab"})
    part = tmp_path / "early"
    shutil.copytree(full, part)  # a copy taken at step 50: fewer rows, another summary
    rows = [r for r in map(json.loads, (part / "metrics.jsonl").read_text().splitlines()) if r["step"] <= 50]
    (part / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _patch_summary(part, steps=50, status="running")
    other_seed = write_run(tmp_path / "seed1", seed=1, loss_at=_shifted(0.01))
    _patch_summary(other_seed, wandb={"id": "abc123"})  # the same id for another config: a different run
    doc, _, err = _ok(tmp_path, capsys, part, full, other_seed)
    assert "warning: early is a copy of full (the same W&B run id abc123 and config): counted once, as full" in err
    assert doc["step"] == 100 and doc["rows"][0]["n_seeds"] == 2
    assert sorted(Path(r).name for r in doc["rows"][0]["runs"]) == ["full", "seed1"]


def test_two_val_rows_at_one_step_are_refused_as_a_damaged_file(tmp_path, capsys):
    run = write_run(tmp_path / "a", seed=0)
    metrics = run / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    first = 1 + next(i for i, line in enumerate(lines) if '"val/loss"' in line and json.loads(line)["step"] == 50)
    metrics.write_text("\n".join(lines + [json.dumps({"step": 50, "val/loss": 2.0})]) + "\n")
    assert _refused(tmp_path, capsys, run) == (
        f"{metrics}: two val/loss rows at step 50 (lines {first} and {len(lines) + 1}): a damaged metrics file "
        "(one run evaluates once per step); keep one of them or leave this run out"
    )


# ---------------------------------------------------------------- which runs a folder stands for


def _gptlab_sweep(folder: Path, arms: dict[str, dict], seeds=(0, 1), shift: float = 0.0) -> Path:
    """A gptlab-sweep dir: sweep.yaml and <arm>/seed<k> run dirs (val loss + shift + 0.01·seed), started a minute
    apart with the arms interleaved, as gptlab-sweep launches them."""
    folder.mkdir(parents=True)
    (folder / "sweep.yaml").write_text("arms: {}\n")
    for i, (arm, spec) in enumerate(arms.items()):
        for k, s in enumerate(seeds):
            start = 1.8e9 + 60.0 * (k * len(arms) + i)
            write_run(folder / arm / f"seed{s}", seed=s, loss_at=_shifted(shift + 0.01 * s), started_at=start, **spec)
    return folder


def test_a_folder_holding_several_sweeps_lists_them_and_asks_which(tmp_path, capsys):
    root = tmp_path / "sweeps"
    _gptlab_sweep(root / "attn", {"mha": {}, "gqa": dict(choices={"attention": "gqa"})})
    _gptlab_sweep(root / "mlp", {"gelu": {}, "swiglu": dict(choices={"mlp": "swiglu"})}, shift=0.003)
    assert _refused(tmp_path, capsys, root) == (
        f"'{root}' holds 2 sweeps: attn/ (sweep.yaml), mlp/ (sweep.yaml); compare one of them (give its folder), "
        "or give each folder on the command line to compare across sweeps on purpose"
    )
    doc, _, _ = _ok(tmp_path, capsys, root / "attn", "--baseline", "attention=mha")
    assert [r["label"] for r in doc["rows"]] == ["attention=mha", "attention=gqa, attention.n_kv_head=2"]
    doc, _, _ = _ok(tmp_path, capsys, root / "attn", root / "mlp")  # on purpose: both named
    # mha and gelu are one config (the default), run with seeds 0 and 1 in each sweep: 2 samples, not 4
    assert [(r["label"], r["n_seeds"]) for r in doc["rows"]][1:] == [
        ("attention=gqa, attention.n_kv_head=2", 2),
        ("mlp=swiglu", 2),
    ]
    assert doc["rows"][0]["n_seeds"] == 2 and len(doc["warnings"]) == 2
    assert all(" repeats " in w and "a replay is not a new sample; counted once" in w for w in doc["warnings"])


def test_two_named_sweep_dirs_given_on_purpose_are_compared(tmp_path, capsys):
    """Runs gptlab-sweep wrote carry their sweep's name: one folder's check must not count the other folder's runs
    (it refused `gptlab-compare A B` as "A holds 2 sweeps", asking for what was done)."""
    first = _gptlab_sweep(tmp_path / "first", {"mha": dict(leaves={"sweep": "first"})})
    second = _gptlab_sweep(tmp_path / "second", {"mqa": dict(choices={"attention": "mqa"}, leaves={"sweep": "second"})})
    doc, _, _ = _ok(tmp_path, capsys, first, second)
    assert [(r["label"], r["n_seeds"]) for r in doc["rows"]] == [
        ("attention=mha", 2),
        ("attention=mqa, attention.n_kv_head=1", 2),
    ]


def test_runs_of_several_sweep_names_in_one_folder_are_not_pooled(tmp_path, capsys):
    write_run(tmp_path / "runs" / "a", seed=0, leaves={"sweep": "attn"})
    write_run(tmp_path / "runs" / "b", seed=1, leaves={"sweep": "lr"})
    assert _refused(tmp_path, capsys, tmp_path / "runs").startswith(
        f"'{tmp_path / 'runs'}' holds 2 sweeps: sweep=attn in a, sweep=lr in b; "
    )


def test_a_partial_sweep_compares_what_finished_and_names_what_is_missing(tmp_path, capsys):
    sweep = _gptlab_sweep(tmp_path / "attn", {"mha": {}}, seeds=(0, 1))
    write_run(sweep / "gqa" / "seed0", seed=0, choices={"attention": "gqa"}, loss_at=_shifted(0.1))
    write_run(sweep / "gqa" / "seed1", seed=1, choices={"attention": "gqa"}, stop_at=50, summary=False)  # training
    plan = [{"name": f"{a}__seed{s}", "arm": a, "seed": s, "overrides": []} for a in ("gqa", "mqa") for s in (0, 1)]
    plan[-1]["subdir"] = "mqa/seed1"  # plans of gptlab-sweep name the run's folder; older ones only arm and seed
    (sweep / ".plan").mkdir()
    (sweep / ".plan" / "plan.json").write_text(json.dumps(plan))
    write_run(sweep / "mqa" / "seed1", seed=1, choices={"attention": "mqa"}, loss_at=_shifted(0.3))
    (sweep / "gqa" / "seed2" / ".hydra").mkdir(parents=True)  # launched, nothing logged yet
    plan.append({"arm": "gqa", "seed": 2, "subdir": "gqa/seed2"})
    (sweep / ".plan" / "plan.json").write_text(json.dumps(plan))
    doc, _, err = _ok(tmp_path, capsys, sweep, "--baseline", "attention=mha")
    line = (
        f"warning: sweep {sweep}: 3 of its runs have not finished (no summary.json; 5 in its latest launch) and are "
        "left out: gqa/seed1 (metrics up to step 50: still training, or killed), gqa/seed2 (started, no metrics "
        "yet), mqa/seed0 (not started); compared: the 4 that finished"
    )
    assert line in err.splitlines() and doc["warnings"][0] == line
    assert doc["step"] == 100  # the unfinished run's step 50 does not hold the others back
    assert [(r["label"], r["n_seeds"]) for r in doc["rows"]] == [
        ("attention=mha", 2),
        ("attention=gqa, attention.n_kv_head=2", 1),
        ("attention=mqa, attention.n_kv_head=1", 1),
    ]


def test_a_partial_lr_grid_sweep_names_its_missing_runs_by_their_folder(tmp_path, capsys):
    sweep = tmp_path / "attn"
    (sweep).mkdir()
    (sweep / "sweep.yaml").write_text("arms: {}\n")
    plan = []
    for lr in ("0.001", "0.003"):
        for s in (0, 1):
            plan.append({"arm": "mha", "seed": s, "lr": float(lr), "subdir": f"mha/lr{lr}/seed{s}"})
            if (lr, s) != ("0.003", 1):
                write_run(sweep / "mha" / f"lr{lr}" / f"seed{s}", seed=s, leaves={"optimizer.lr": float(lr)})
    (sweep / ".plan").mkdir()
    (sweep / ".plan" / "plan.json").write_text(json.dumps(plan))
    doc, _, _ = _ok(tmp_path, capsys, sweep)
    assert doc["warnings"][0] == (
        f"warning: sweep {sweep}: 1 of its runs has not finished (no summary.json; 4 in its latest launch) and is "
        "left out: mha/lr0.003/seed1 (not started); compared: the 3 that finished"
    )


def test_a_planned_sweep_with_nothing_finished_is_refused(tmp_path, capsys):
    sweep = tmp_path / "attn"
    write_run(sweep / "mha" / "seed0", seed=0, stop_at=25, summary=False)
    (sweep / ".plan").mkdir()
    (sweep / ".plan" / "plan.json").write_text(json.dumps([{"arm": "mha", "seed": 0}]))
    assert _refused(tmp_path, capsys, sweep) == (
        f"sweep {sweep}: none of its runs has finished yet (no summary.json); see gptlab-sweep status {sweep}"
    )


# ---------------------------------------------------------------- one machine peak per comparison


def _peaked(tmp: Path) -> list[Path]:
    """A and B, 2 seeds each, every run at 1e12 FLOP/s peak but B/seed1 (2e12, MFU 0.02)."""
    runs = [
        write_run(tmp / "A" / "seed0", seed=0),
        write_run(tmp / "A" / "seed1", seed=1),
        write_run(tmp / "B" / "seed0", seed=0, choices={"attention": "gqa"}),
        write_run(tmp / "B" / "seed1", seed=1, choices={"attention": "gqa"}, mfu=0.02),
    ]
    for run in runs:
        _patch_summary(run, peak_flops=2e12 if run.parts[-2:] == ("B", "seed1") else 1e12)
    return runs


def test_mfu_uses_one_peak_and_recomputes_runs_measured_against_another(tmp_path, capsys):
    _peaked(tmp_path)
    doc, _, err = _ok(tmp_path, capsys, tmp_path / "A", tmp_path / "B")
    assert doc["peak_flops"] == 1e12 and doc["peak_flops_source"] == "recorded by 3 of 4 runs"
    a, b = doc["rows"]
    assert a["mfu_during_training"] == pytest.approx(0.01)
    assert b["mfu_during_training"] == pytest.approx(statistics.median([0.01, 0.02 * 2e12 / 1e12]))
    assert a["mfu"] is b["mfu"] is None  # the table's MFU is the timing session's: not timed, "–"
    line = (
        "warning: MFU: runs were measured against different peaks (2e+12 in B/seed1; common 1e+12 FLOP/s, recorded "
        "by 3 of 4 runs); their MFU is recomputed against the common peak as MFU × own peak / 1e+12"
    )
    assert line in err.splitlines() and line in doc["warnings"]
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert (
        "- MFU during training (comparison.json mfu_during_training, a record): every run against one machine peak, "
        "1e+12 FLOP/s (recorded by 3 of 4 runs)."
    ) in md
    assert "2.50%" not in md  # B's MFU record, median(1%, 4%), is no table figure: only a timing session's MFU is


def test_peak_flops_option_puts_every_mfu_on_the_given_peak(tmp_path, capsys):
    _peaked(tmp_path)
    doc, _, _ = _ok(tmp_path, capsys, tmp_path / "A", tmp_path / "B", "--peak-flops", "4e12")
    assert doc["peak_flops"] == 4e12 and doc["peak_flops_source"] == "--peak-flops"
    assert doc["rows"][0]["mfu_during_training"] == pytest.approx(0.01 * 1e12 / 4e12)
    assert doc["rows"][1]["mfu_during_training"] == pytest.approx(
        statistics.median([0.01 * 1e12 / 4e12, 0.02 * 2e12 / 4e12])
    )
    assert _refused(tmp_path / "bad", capsys, tmp_path / "A", "--peak-flops", "fast") == (
        "--peak-flops: 'fast' is not allowed; give the machine peak in FLOP/s, a positive number (e.g. 3.12e14)"
    )


def test_an_mfu_without_its_peak_is_left_out_and_other_machines_are_named(tmp_path, capsys):
    runs = _peaked(tmp_path)
    summary = json.loads((runs[1] / "summary.json").read_text())
    del summary["peak_flops"]
    (runs[1] / "summary.json").write_text(json.dumps(summary))
    for run, gpu in zip(runs, ("NVIDIA H100", "NVIDIA H100", "NVIDIA A100", "NVIDIA A100")):
        (run / "provenance.json").write_text(json.dumps({"hardware": {"device": "cuda", "gpu": gpu, "cpu": "x86"}}))
    doc, _, err = _ok(tmp_path, capsys, tmp_path / "A", tmp_path / "B")
    assert doc["rows"][0]["mfu_during_training"] == pytest.approx(0.01)  # A/seed0 alone
    assert (
        "warning: MFU of A/seed1 left out: an MFU without a recorded peak_flops cannot be put on the common peak "
        "1e+12 FLOP/s"
    ) in err
    assert (
        "warning: the runs trained on different machines (NVIDIA A100 (2 runs: B/seed0, B/seed1); NVIDIA H100 "
        "(2 runs: A/seed0, A/seed1)): their tokens/s and MFU during training compare the machines as well as the "
        "arms (a timing session times every arm on one machine)"
    ) in err


# ---------------------------------------------------------------- power


def _welch_by_hand(sd_a: float, n_a: int, sd_b: float, n_b: int) -> tuple[float, float]:
    """(se, Welch-Satterthwaite df) from the textbook formulas."""
    va, vb = sd_a**2 / n_a, sd_b**2 / n_b
    return math.sqrt(va + vb), (va + vb) ** 2 / (va**2 / (n_a - 1) + vb**2 / (n_b - 1))


def _power_by_hand(nc: float, df: float) -> float:
    """P(T > t_crit) + P(T < -t_crit) for T ~ nct(df, nc); scipy's far lower tail is NaN where it is < 1e-16."""
    crit = sps.t.ppf(0.975, df)
    far = sps.nct.cdf(-crit, df, nc)
    return float(sps.nct.sf(crit, df, nc) + (0.0 if math.isnan(far) else far))


def _mde_by_hand(sd_a: float, n_a: int, sd_b: float, n_b: int) -> float:
    """Bisection on the noncentral t's power for the noncentrality that reaches 0.8, times the standard error."""
    se, df = _welch_by_hand(sd_a, n_a, sd_b, n_b)
    lo, hi = 0.0, 60.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if _power_by_hand(mid, df) >= 0.8 else (mid, hi)
    return hi * se


def test_minimum_detectable_difference_matches_a_hand_computed_figure():
    # 3 seeds a side, sd 0.01 each: se = 0.01·sqrt(2/3), df = 4, t_crit = 2.776; noncentrality 3.761 for 80%
    expected = _mde_by_hand(0.01, 3, 0.01, 3)
    assert expected == pytest.approx(0.0307089, abs=1e-6)
    assert power.detectable(0.01, 3, 0.01, 3) == pytest.approx(expected, rel=1e-7)
    se, df = _welch_by_hand(0.01, 3, 0.01, 3)
    assert df == pytest.approx(4.0) and _power_by_hand(power.detectable(0.01, 3, 0.01, 3) / se, df) == pytest.approx(
        0.8
    )
    assert power.detectable(0.02, 2, 0.005, 4) == pytest.approx(_mde_by_hand(0.02, 2, 0.005, 4), rel=1e-7)
    assert power.detectable(0.01, 1, 0.01, 3) is None and power.detectable(0.0, 3, 0.0, 3) == 0.0


def test_seeds_to_decide_is_the_first_seed_count_that_reaches_the_power():
    def by_hand(n: int, delta: float, sd_a: float, sd_b: float) -> float:
        se, df = _welch_by_hand(sd_a, n, sd_b, n)
        return _power_by_hand(delta / se, df)

    for delta, sd_a, sd_b in ((0.01, 0.01, 0.01), (0.02, 0.03, 0.01), (0.005, 0.002, 0.002)):
        n = power.seeds_to_decide(delta, sd_a, sd_b)
        assert n is not None and n >= 2
        assert by_hand(n, delta, sd_a, sd_b) >= 0.8 and (n == 2 or by_hand(n - 1, delta, sd_a, sd_b) < 0.8)
    assert power.seeds_to_decide(0.01, 0.01, 0.01) == 17  # normal approximation: 2·(1.96 + 0.84)² ≈ 15.7, +t
    assert power.seeds_to_decide(0.0, 0.01, 0.01) is None and power.seeds_to_decide(1e-5, 0.01, 0.01) is None


# ---------------------------------------------------------------- the verdict fixture: plots agree with the table

BASE_SHIFT = (0.0, 0.01, 0.02)
# arm -> (seed shifts, tokens/s per seed, write_run kwargs); mqa: worse beyond noise, one seed under outside load
ARMS = {
    "mha": (BASE_SHIFT, (1000.0, 1010.0, 990.0), dict(fingerprint="fp-mha")),
    "mqa": ((0.10, 0.11, 0.12), (1500.0, 1520.0, 1480.0), dict(fingerprint="fp-mqa")),
    "gqa2": (
        (0.01, 0.03, 0.02),
        (1180.0, 1195.0, 1210.0),
        dict(fingerprint="fp-gqa2", leaves={"attention.n_kv_head": 2}),
    ),
    "gqa4": (
        (0.05, 0.051, 0.052),
        (730.0, 731.0, 729.0),
        dict(fingerprint="fp-mha", leaves={"attention.n_kv_head": 4}),
    ),
}
LOADS = {("mqa", 1): 0.6}
LABELS = [
    "attention=mha",
    "attention=mqa, attention.n_kv_head=1",
    "attention=gqa, attention.n_kv_head=2",
    "attention=gqa, attention.n_kv_head=4",
]


def _write_arms(root: Path) -> Path:
    specs = []
    for arm, (shifts, tps, extra) in ARMS.items():
        choice = {"attention": "gqa" if arm.startswith("gqa") else arm}
        for s in range(3):
            load = LOADS.get((arm, s))
            specs.append(
                dict(
                    seed=s,
                    choices=choice,
                    loss_at=_shifted(shifts[s]),
                    tokens_per_s=tps[s],
                    step_ms=128_000 / tps[s],
                    **({"outside_load": load} if load else {}),
                    **extra,
                )
            )
    return write_sweep(root, specs)


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    """(comparison, open figures, output dir) of the four-arm sweep, built once."""
    out = tmp_path_factory.mktemp("verdicts")
    cmp = compare([load_run(p) for p in discover([str(_write_arms(out / "sweep"))])], baseline="attention=mha")
    figures: dict = {}
    make_plots(cmp, out, figures=figures)
    yield cmp, figures, out
    for fig in figures.values():
        plt.close(fig)


def _losses(arm: str) -> list[float]:
    return [default_loss(100) + d for d in ARMS[arm][0]]


def test_delta_plot_data_is_the_tables_delta_and_its_interval_sign_is_the_verdict(verdicts):
    cmp, _, _ = verdicts
    assert [r.label for r in cmp.rows] == LABELS
    found = curves.delta_curves(cmp)
    assert [c.label for c in found] == LABELS[1:]
    for curve, row, arm in zip(found, cmp.rows[1:], list(ARMS)[1:]):
        assert curve.x == [25.0, 50.0, 75.0, 100.0] and curve.at == 100.0
        delta, lo, hi = curve.at_point()
        a, b = _losses(arm), _losses("mha")
        assert delta == pytest.approx(row.delta_val_loss) == pytest.approx(statistics.mean(a) - statistics.mean(b))
        assert [lo, hi] == pytest.approx(row.delta_ci)
        se, df = _welch_by_hand(statistics.stdev(a), 3, statistics.stdev(b), 3)
        assert hi - delta == pytest.approx(sps.t.ppf(0.975, df) * se)
        excludes = bool(lo > 0 or hi < 0)
        assert excludes is bool(sps.ttest_ind(a, b, equal_var=False).pvalue < 0.05)
        if curve.identical:
            assert row.significant is False and arm == "gqa4"
        else:
            assert excludes is row.significant
    assert [row.significant for row in cmp.rows[1:]] == [True, False, False]


def test_delta_figure_draws_that_data_with_a_zero_line_per_arm(verdicts):
    cmp, figures, _ = verdicts
    axes = figures["delta_val_loss_vs_step"].axes
    assert len(axes) == 3
    titles = [ax.get_title() for ax in axes]
    for ax, curve in zip(axes, curves.delta_curves(cmp)):
        zero = [line for line in ax.get_lines() if list(line.get_ydata()) == [0, 0]]
        assert len(zero) == 1
        drawn = next(line for line in ax.get_lines() if line.get_label().startswith("Δ val loss"))
        assert list(drawn.get_ydata()) == pytest.approx(curve.delta)
        band = next(c for c in ax.collections if isinstance(c, PolyCollection)).get_paths()[0].vertices[:, 1]
        assert (band.min(), band.max()) == pytest.approx((min(curve.lo), max(curve.hi)))
    assert titles[0].startswith("attention=mqa, attention.n_kv_head=1: Δ +0.1000 [") and titles[0].endswith(
        "at step 100: higher val loss"
    )
    assert titles[1].endswith("at step 100: within noise")
    gqa4 = next(r for r in cmp.rows if r.label == "attention=gqa, attention.n_kv_head=4")  # the table's row
    assert titles[2] == (
        f"attention=gqa, attention.n_kv_head=4: Δ {gqa4.delta_val_loss:+.4f} at step 100: within noise (identical model)"
    )


def test_speed_plots_mark_the_run_under_outside_load_as_the_table_does(verdicts):
    cmp, figures, _ = verdicts
    for g, row in zip(cmp.groups, cmp.rows):
        points = curves.speed_points(g)
        assert [v for v, _ in points] == row.tokens_per_s_seeds
        assert any(hot for _, hot in points) is row.under_load
    assert [r.under_load for r in cmp.rows] == [False, True, False, False]
    ax = figures["tokens_per_s"].axes[0]
    assert [bar.get_hatch() for bar in ax.patches[:4]] == [None, "//", None, None]
    crosses = [c for c in ax.collections if isinstance(c, PathCollection) and c.get_label() == f"one run, {LOADED}"]
    assert len(crosses) == 1 and list(crosses[0].get_offsets()[:, 1]) == [1520.0]
    legend = [t.get_text() for t in figures["tokens_per_s"].legends[0].get_texts()]  # below the tick labels
    assert f"one run, {LOADED}" in legend and LOADED in legend
    wall = figures["val_loss_vs_training_time"].axes[0]
    marked = [line for line in wall.get_lines() if line.get_label() == f"one run, {LOADED}"]
    assert len(marked) == 1 and marked[0].get_color() == "grey"
    assert marked[0].get_xdata()[-1] == pytest.approx(100 * 128_000 / 1520.0 / 1000)  # its own training time, in s
    hatched = [c for c in wall.collections if isinstance(c, PolyCollection) and c.get_hatch() == "//"]
    assert len(hatched) == 1  # the loaded group's seed band
    assert "attention=mqa, attention.n_kv_head=1 (n=3, under outside load)" in [
        t.get_text() for t in wall.get_legend().get_texts()
    ]
    assert not any(line.get_label().startswith("one run") for line in figures["val_loss_vs_step"].axes[0].get_lines())


def test_train_loss_is_smoothed_and_shown_beside_val_loss(verdicts):
    cmp, figures, _ = verdicts
    ax = figures["train_loss_vs_step"].axes[0]
    assert "trailing mean over 10% of the logged steps" in ax.get_title()
    mean = next(line for line in ax.get_lines() if line.get_label().startswith("attention=mha"))
    # write_run logs train loss = val curve + 0.05 every 5 steps: 20 points, a window of 2
    last = statistics.mean([statistics.mean([default_loss(s) + d + 0.05 for s in (95, 100)]) for d in BASE_SHIFT])
    assert mean.get_xdata()[-1] == 100 and mean.get_ydata()[-1] == pytest.approx(last)
    assert list(figures)[:3] == ["val_loss_vs_step", "train_loss_vs_step", "delta_val_loss_vs_step"]


# the four arms timed alone: 3 rounds, mha's A/A windows under mha#2; mqa 1.4x, gqa2 as fast as mha, gqa4 mha's model
RATES = {
    "mha": [1000.0, 990.0, 1010.0],
    "mha#2": [1004.0, 985.0, 1012.0],
    "mqa": [1400.0, 1380.0, 1420.0],
    "gqa2": [1003.0, 992.0, 1009.0],
    "gqa4": [1001.0, 988.0, 1011.0],
}
SOURCE = "timed alone: 3 interleaved rounds on Golden CPU"


def _timing(sweep: Path, folder: Path) -> Path:
    """The session of the four arms, each timed from its seed-0 run (write_sweep's jobs 0, 3, 6, 9)."""
    arms = {arm: (sweep / str(3 * i), ARMS[arm][2]["fingerprint"]) for i, arm in enumerate(ARMS)}
    return write_timing(folder, arms, RATES)


def _paired_by_hand(arm: str) -> tuple[float, float, float]:
    """(speed-up, 95% low, high) of `arm` over the rounds by hand: mean log of arm / sqrt(mha x mha#2), Student t."""
    logs = [math.log(x / math.sqrt(b1 * b2)) for x, b1, b2 in zip(RATES[arm], RATES["mha"], RATES["mha#2"])]
    half = sps.t.ppf(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    mean = statistics.mean(logs)
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def _sentence_by_hand(label: str, arm: str, speed: str = "speed not timed") -> str:
    a, b = _losses(arm), _losses("mha")
    delta = statistics.mean(a) - statistics.mean(b)
    se, df = _welch_by_hand(statistics.stdev(a), 3, statistics.stdev(b), 3)
    half = sps.t.ppf(0.975, df) * se
    mde = _mde_by_hand(statistics.stdev(a), 3, statistics.stdev(b), 3)
    assert sps.ttest_ind(a, b, equal_var=False).pvalue >= 0.05  # the sentence below is a within-noise one
    return f"{label}: val loss {delta:+.4f} ± {half:.4f} (within noise, could have detected ≥ {mde:.4f}); {speed}."


def test_each_arm_has_a_one_sentence_verdict_at_the_top_of_every_report(tmp_path, capsys):
    sweep = _write_arms(tmp_path / "sw")
    doc, out, _ = _ok(tmp_path, capsys, sweep, "--baseline", "attention=mha")
    md = (tmp_path / "out" / "comparison.md").read_text().splitlines()
    table = md.index(next(line for line in md if line.startswith("| label")))
    reconciled = [line[2:] for line in md[: md.index("## At equal steps")] if line.startswith("- ")]
    assert [r.split(":", 1)[0] for r in reconciled] == LABELS[1:]  # the verdict matrix's sentence per arm first
    sentences = [line[2:] for line in md[md.index("## At equal steps") : table] if line.startswith("- ")]
    assert len(sentences) == 3
    mqa, gqa2, gqa4 = sentences
    assert (
        mqa.startswith("attention=mqa, attention.n_kv_head=1: val loss +0.1000 ± ")
        and "(higher than the baseline beyond noise, p=" in mqa
    )
    # not timed: the training runs' 1.5x (one of them under outside load) is no speed verdict
    assert mqa.endswith("; speed not timed.") and "faster" not in mqa
    assert gqa2 == _sentence_by_hand(LABELS[2], "gqa2")
    assert gqa4 == (
        f"{LABELS[3]}: the identical model to attention=mha (equal fingerprint), so every difference is noise "
        "(Δ val loss +0.0410)."
    )
    page = (tmp_path / "out" / "comparison.html").read_text()
    assert page.index('<ul class="verdicts">') < page.index("<table>")
    assert re.findall(r'<ul class="verdicts">(.*?)</ul>', page)[0].count("<li>") == 3
    assert out.index(gqa2) < out.index("gptlab-compare: val loss @ step 100")  # the terminal says it first too
    # timed alone: each sentence carries the paired speed-up of the rounds and names its source
    timing = _timing(sweep, tmp_path / "timing")
    doc, out, _ = _ok(tmp_path, capsys, sweep, "--baseline", "attention=mha", "--timing", str(timing))
    md = (tmp_path / "out" / "comparison.md").read_text().splitlines()
    table = md.index(next(line for line in md if line.startswith("| label")))
    mqa, gqa2, gqa4 = [line[2:] for line in md[md.index("## At equal steps") : table] if line.startswith("- ")]
    up, lo, hi = _paired_by_hand("mqa")
    assert mqa.endswith(f"; {up:.2f}× faster [{lo:.2f}, {hi:.2f}] ({SOURCE}).") and "outside load" not in mqa
    up, lo, hi = _paired_by_hand("gqa2")
    could = doc["rows"][2]["power"]["mde_speedup"]
    assert gqa2 == _sentence_by_hand(
        LABELS[2], "gqa2", f"{up:.2f}× within noise [{lo:.2f}, {hi:.2f}] (could have detected ≥ {could:.2f}×; {SOURCE})"
    )
    assert gqa4.endswith(f"(Δ val loss +0.0410, speed {doc['rows'][3]['speedup']:.2f}×, {SOURCE}).")
    assert doc["rows"][3]["speed"]["status"] == "identical"


def test_power_option_and_the_power_line_of_every_report(tmp_path, capsys):
    sweep = _write_arms(tmp_path / "sw")
    doc, out, _ = _ok(tmp_path, capsys, sweep, "--baseline", "attention=mha")
    md = (tmp_path / "out" / "comparison.md").read_text()
    line = next(n for n in md.splitlines() if n.startswith("- Power (α = 0.05, power 0.8; val loss: two-sided Welch t"))
    b, a = _losses("mha"), _losses("gqa2")
    mde = _mde_by_hand(statistics.stdev(a), 3, statistics.stdev(b), 3)
    needed = power.seeds_to_decide(statistics.mean(a) - statistics.mean(b), statistics.stdev(a), statistics.stdev(b))
    assert (
        f"'{LABELS[2]}' Δ val loss ≥ {mde:.4f}, speed not timed" in line
        and f"val loss needs {needed} seeds per arm" in line
    )
    assert "## Power" not in md and "Power (α = 0.05" in (tmp_path / "out" / "comparison.html").read_text()
    gqa2 = doc["rows"][2]["power"]
    assert gqa2["mde_val_loss"] == pytest.approx(mde, rel=1e-6)
    assert gqa2["seeds_val_loss"] == needed and gqa2["val_loss_decision"] == f"{needed} seeds per arm"
    assert doc["rows"][1]["power"]["val_loss_decision"] == "decided"
    assert doc["rows"][3]["power"]["val_loss_decision"] == "never: the identical model (every difference is noise)"
    assert doc["rows"][0]["power"] is None and doc["power"] == 0.8 and doc["alpha"] == 0.05

    doc, out, _ = _ok(tmp_path, capsys, sweep, "--baseline", "attention=mha", "--power")
    md = (tmp_path / "out" / "comparison.md").read_text()
    table = md[md.index("## Power") :].splitlines()
    row = next(r for r in table if r.startswith(f"| {LABELS[2]} |"))
    assert row == f"| {LABELS[2]} | 3 vs 3 | {mde:.4f} | {needed} seeds per arm | not timed | unknown: not timed |"
    assert "power (α = 0.05, power 0.8)" in out and f"{needed} seeds per arm" in out
    assert '<table class="power">' in (tmp_path / "out" / "comparison.html").read_text()


def test_the_document_mask_is_an_arm_and_runs_from_before_it_read_as_unmasked(tmp_path, capsys):
    """data.doc_mask changes how the model reads the same windows, not the task: masked and unmasked runs compare
    (it was refused as "mixed tasks"), and a run written before the key existed groups with the unmasked ones."""
    specs = [dict(seed=0), dict(seed=1, leaves={"data.doc_mask": False})]  # seed 0: a run from before the key
    specs += [dict(seed=s, leaves={"data.doc_mask": True}, loss_at=_shifted(0.01 * s)) for s in (0, 1)]
    sweep = write_sweep(tmp_path / "sw", specs)
    doc, _, _ = _ok(tmp_path, capsys, sweep)
    assert [(r["label"], r["n_seeds"]) for r in doc["rows"]] == [
        ("data.doc_mask=false", 2),
        ("data.doc_mask=true", 2),
    ]
