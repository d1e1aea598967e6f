"""gptlab-compare on synthetic run dirs: table numbers, verdicts, warnings, reports, W&B, bad input."""

from __future__ import annotations

import base64
import json
import re
import statistics
import subprocess
from pathlib import Path

import matplotlib.image as mpimg
import pytest

from gptlab.cli.compare import main
from gptlab.compare.statistics import stats
from helpers.cli import cli_env, python_bin, run_cli
from helpers.compare import (
    bad_acc_vs_lm,
    bad_mixed_data,
    bad_no_common_step,
    default_loss,
    speed_words,
    write_run,
    write_sweep,
)
from helpers.paths import REPO
from helpers.wandb_read import inspect_records, inspect_summary, of_type

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _shifted(delta: float):
    return lambda step: default_loss(step) + delta


def _sweep(tmp_path: Path, gqa_shift=(0.10, 0.11), mha_shift=(0.0, 0.01), **extra) -> Path:
    """2 configs x 2 seeds: gqa is slower in loss by ~0.1 and 1.25x faster."""
    specs = [dict(seed=i, loss_at=_shifted(d), **extra) for i, d in enumerate(mha_shift)]
    specs += [
        dict(
            seed=i,
            choices={"attention": "gqa"},
            loss_at=_shifted(d),
            tokens_per_s=1250.0,
            step_ms=40.0,
            peak_mem_bytes=48 * 2**20,
            params=110_000,
            **extra,
        )
        for i, d in enumerate(gqa_shift)
    ]
    return write_sweep(tmp_path / "sweeps" / "attn", specs)


def _run(args: list, capsys) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _compare_json(tmp_path, capsys, *args) -> dict:
    rc, _, err = _run([*args, "--out", tmp_path / "out", "--no-wandb"], capsys)
    assert rc == 0, err
    return json.loads((tmp_path / "out" / "comparison.json").read_text())


def test_welch_and_t_distribution_match_reference_values():
    w = stats.welch_test([1.0, 2.0, 3.0], [4.0, 5.0, 7.0])
    assert w.t == pytest.approx(-3.1622776601683795) and w.df == pytest.approx(3.4482758620689653)
    assert w.p == pytest.approx(0.041914517471454034, rel=1e-9)
    assert stats.welch_test([3.01, 3.02], [3.0, 3.05, 2.99]).p == pytest.approx(0.9379363769319057, rel=1e-9)
    assert stats.t_two_sided_p(3.0, 2.5) == pytest.approx(0.07257609554903183, rel=1e-12)
    assert stats.welch_test([1.0], [2.0, 3.0]) is None
    assert stats.welch_test([1.0, 1.0], [2.0, 2.0]).p == 0.0  # zero noise: any gap is real


def test_table_values_equal_what_the_files_say(tmp_path, capsys):
    sweep = _sweep(tmp_path)
    doc = _compare_json(tmp_path, capsys, sweep)
    runs = sorted((p for p in sweep.iterdir() if p.is_dir()), key=lambda p: p.name)
    evals = {
        p: {
            r["step"]: r["val/loss"]
            for r in map(json.loads, (p / "metrics.jsonl").read_text().splitlines())
            if "val/loss" in r
        }
        for p in runs
    }
    step = max(set.intersection(*(set(v) for v in evals.values())))
    assert doc["step"] == step == 100
    assert doc["baseline"] == "attention=mha"
    summaries = {p: json.loads((p / "summary.json").read_text()) for p in runs}
    by_label = {r["label"]: r for r in doc["rows"]}
    assert [r["label"] for r in doc["rows"]] == ["attention=mha", "attention=gqa, attention.n_kv_head=2"]
    for label, members in (("attention=mha", runs[:2]), ("attention=gqa, attention.n_kv_head=2", runs[2:])):
        row, losses = by_label[label], [evals[p][step] for p in members]
        assert row["n_seeds"] == 2 and row["choices"]["attention"] == label.split("=")[1].split(",")[0]
        assert row["val_loss_mean"] == pytest.approx(statistics.mean(losses))
        assert row["val_loss_std"] == pytest.approx(statistics.stdev(losses))
        assert row["tokens_per_s"] == pytest.approx(
            statistics.median(summaries[p]["tokens_per_s_median"] for p in members)
        )
        assert row["step_ms"] == pytest.approx(summaries[members[0]]["step_ms_median"])
        assert row["peak_mem_bytes"] == max(summaries[p]["peak_mem_bytes"] for p in members)
        assert row["params"] == summaries[members[0]]["params"]
        assert row["flops_per_token"] == summaries[members[0]]["flops_per_token"]
    base, gqa = by_label["attention=mha"], by_label["attention=gqa, attention.n_kv_head=2"]
    assert base["delta_val_loss"] == 0.0
    # the training runs' 1.25x is a record (tokens/s during training); no timing session: no speed-up, no MFU
    assert gqa["tokens_per_s_gmean"] / base["tokens_per_s_gmean"] == pytest.approx(1.25)
    assert base["speedup"] is gqa["speedup"] is gqa["mfu"] is gqa["timed_tokens_per_s"] is None
    assert gqa["speed"]["status"] == "not_measured" and gqa["mfu_during_training"] == pytest.approx(0.01)
    assert gqa["delta_val_loss"] == pytest.approx(gqa["val_loss_mean"] - base["val_loss_mean"])
    assert set(doc["rows"][0]) >= {
        "label",
        "choices",
        "n_seeds",
        "val_loss_mean",
        "val_loss_std",
        "delta_val_loss",
        "significant",
        "tokens_per_s",
        "step_ms",
        "mfu",
        "peak_mem_bytes",
        "speedup",
        "params",
        "flops_per_token",
        "timed_tokens_per_s",
        "timed_step_ms",
        "mfu_during_training",
    }


@pytest.mark.parametrize(
    "gqa_shift, mha_shift, expected",
    [
        ((0.200, 0.201), (0.000, 0.001), True),  # far apart, tiny seed noise
        ((0.010, -0.010), (0.000, 0.020), False),  # overlapping seeds
    ],
)
def test_significance_verdict_flips_with_the_seed_noise(tmp_path, capsys, gqa_shift, mha_shift, expected):
    doc = _compare_json(tmp_path, capsys, _sweep(tmp_path, gqa_shift, mha_shift))
    gqa = doc["rows"][1]
    assert gqa["significant"] is expected
    assert (gqa["p_value"] < 0.05) is expected
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert ("not significant" in md) is (not expected)


def test_one_seed_gives_no_verdict(tmp_path, capsys):
    write_run(tmp_path / "a", seed=0)
    write_run(tmp_path / "b", seed=0, choices={"mlp": "swiglu"}, loss_at=_shifted(0.5))
    doc = _compare_json(tmp_path, capsys, tmp_path / "a", tmp_path / "b")
    assert doc["rows"][1]["label"] == "mlp=swiglu" and doc["rows"][1]["significant"] is None
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "| +0.5000 n/a: 1 seed |" in md and "n/a (1 seed)" not in md  # one vocabulary: words.py's


def test_crashed_and_short_runs_are_compared_at_the_common_step_with_a_warning(tmp_path, capsys):
    sweep = write_sweep(
        tmp_path / "sw",
        [
            dict(seed=0),
            dict(seed=1, stop_at=60),
            dict(seed=0, choices={"attention": "gqa"}, stop_at=80, status="finished"),
        ],
    )
    rc, _, err = _run([sweep, "--out", tmp_path / "out", "--no-wandb"], capsys)
    assert rc == 0
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2
    assert "/1: status failed, last val/loss at step 50" in warnings[0] and "compared at step 50" in warnings[0]
    assert "/2: stopped early, last val/loss at step 75" in warnings[1]
    doc = json.loads((tmp_path / "out" / "comparison.json").read_text())
    assert doc["step"] == 50 and doc["warnings"] == warnings
    assert doc["rows"][0]["val_loss_mean"] == pytest.approx(default_loss(50))
    assert _compare_json(tmp_path, capsys, sweep, "--step", "25")["step"] == 25


def test_all_outputs_exist_pngs_are_valid_and_html_is_self_contained(tmp_path, capsys):
    sweep = _sweep(tmp_path)
    before = {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()}
    rc, out, _ = _run([sweep, "--no-wandb"], capsys)  # default --out for a sweep dir: <sweep>/comparison
    assert rc == 0 and "attention=gqa" in out and "not timed" in out
    outdir = sweep / "comparison"
    pngs = [
        "val_loss_vs_step",
        "train_loss_vs_step",
        "delta_val_loss_vs_step",
        "val_loss_vs_training_time",
        "val_loss_vs_tokens",
        "val_loss_vs_flops",  # these older-format runs get their flops from flops_per_token x tokens
        "tokens_per_s",
        "peak_memory",
    ]
    for name in ["comparison.md", "comparison.json", "comparison.html"] + [f"{n}.png" for n in pngs]:
        assert (outdir / name).is_file(), name
    for n in pngs:
        assert (outdir / f"{n}.png").read_bytes()[:8] == PNG_MAGIC
        img = mpimg.imread(outdir / f"{n}.png")
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    page = (outdir / "comparison.html").read_text()
    assert not re.search(r"<script|<link|https?://|url\(", page)
    srcs = re.findall(r'src="([^"]+)"', page)
    assert len(srcs) == len(pngs) == 8 and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert all(base64.b64decode(s.split(",", 1)[1])[:8] == PNG_MAGIC for s in srcs)
    md = (outdir / "comparison.md").read_text().splitlines()
    assert sum(line.startswith("| attention=") for line in md) == 3  # the table's 2 rows, the arm's matrix row
    assert {p: p.read_bytes() for p in before} == before  # inputs untouched


@pytest.mark.skipif(
    not Path("/usr/bin/chromium").exists(), reason="chromium not installed (CI: apt-get install chromium)"
)
def test_html_opens_in_headless_chromium_without_console_errors(tmp_path, capsys):
    assert _compare_json(tmp_path, capsys, _sweep(tmp_path))["rows"]
    proc = subprocess.run(
        [
            "/usr/bin/chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'chr'}",
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
            (tmp_path / "out" / "comparison.html").as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ":CONSOLE" not in proc.stderr  # any console message (error, warning, log) would be listed here
    assert "attention=gqa" in proc.stdout and proc.stdout.count("data:image/png;base64,") == 8  # the 8 PNGs, inlined


def test_labels_group_seeds_and_show_leaf_values(tmp_path, capsys):
    for s in (0, 1):  # different seed, name and paths.* per run: still one group
        write_run(tmp_path / "runs" / f"base{s}", seed=s)
        write_run(tmp_path / "runs" / f"ratio{s}", seed=s, leaves={"mlp.ratio": 3})
    write_run(tmp_path / "runs" / "kv4", choices={"attention": "gqa"}, leaves={"attention.n_kv_head": 4})
    write_run(tmp_path / "runs" / "gqa", choices={"attention": "gqa"})  # default n_kv_head: named all the same
    doc = _compare_json(tmp_path, capsys, str(tmp_path / "runs" / "*"))  # a glob
    labels = [(r["label"], r["n_seeds"]) for r in doc["rows"]]
    # The baseline is labelled by how it differs from the others; the rest by how they differ from it.
    assert labels == [
        ("attention=mha, mlp.ratio=4", 2),
        ("attention=gqa, attention.n_kv_head=2", 1),
        ("attention=gqa, attention.n_kv_head=4", 1),
        ("mlp.ratio=3", 2),
    ]
    assert doc["rows"][3]["differs"] == {"mlp.ratio": "3"}


def test_labels_stay_distinct_without_overrides_yaml(tmp_path, capsys):
    for name, kv in (("b", 1), ("c", 4)):
        write_run(tmp_path / name, choices={"attention": "gqa"}, leaves={"attention.n_kv_head": kv})
        (tmp_path / name / ".hydra" / "overrides.yaml").write_text("[]\n")
    rows = _compare_json(tmp_path, capsys, write_run(tmp_path / "a"), tmp_path / "b", tmp_path / "c")["rows"]
    assert [r["label"] for r in rows][1:] == [
        "attention=gqa, attention.n_kv_head=1",
        "attention=gqa, attention.n_kv_head=4",
    ]


def test_baseline_option_and_summary_fallback(tmp_path, capsys):
    sweep = _sweep(tmp_path)
    doc = _compare_json(tmp_path, capsys, sweep, "--baseline", "attention=gqa")
    assert [r["label"] for r in doc["rows"]] == ["attention=gqa, attention.n_kv_head=2", "attention=mha"]
    assert doc["rows"][1]["tokens_per_s_gmean"] / doc["rows"][0]["tokens_per_s_gmean"] == pytest.approx(0.8)
    assert (
        _compare_json(tmp_path, capsys, sweep, "--baseline", sweep / "3")["baseline"]
        == "attention=gqa, attention.n_kv_head=2"
    )
    (sweep / "0" / "summary.json").unlink()  # crashed before writing a summary: speeds come from metrics.jsonl
    write_run(sweep / "0", seed=0, tokens_per_s=900.0, summary=False)
    doc = _compare_json(tmp_path, capsys, sweep)
    speeds = [
        r["tokens_per_s"]
        for r in map(json.loads, (sweep / "0" / "metrics.jsonl").read_text().splitlines())
        if "tokens_per_s" in r
    ]
    assert doc["rows"][0]["tokens_per_s"] == pytest.approx(statistics.median([statistics.median(speeds), 1000.0]))
    assert any("/0: status missing" in w for w in doc["warnings"])


def test_claims_add_claimed_vs_measured(tmp_path, capsys):
    claims = tmp_path / "claims.yaml"
    claims.write_text("attention=gqa: {speedup: 1.25, delta_val_loss: -0.02}\n")
    doc = _compare_json(tmp_path, capsys, _sweep(tmp_path), "--claims", claims)
    assert doc["rows"][1]["claimed"] == {"speedup": 1.25, "delta_val_loss": -0.02} and doc["rows"][0]["claimed"] is None
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "claimed vs measured" in md and "speed-up 1.25× claimed / – measured" in md  # not timed: no measured one


@pytest.mark.parametrize(
    "setup, fragment",
    [
        (lambda t: [t / "nope"], "path '{t}/nope' does not exist"),
        (lambda t: [(t / "empty").mkdir() or t / "empty"], "'{t}/empty' is an empty directory"),
        (lambda t: [(t / "d" / "sub").mkdir(parents=True) or t / "d"], "'{t}/d' contains no run directories"),
        (bad_no_common_step, "no common step: the runs share no step with val/loss (a: 25..50, b: 30..90)"),
        (bad_mixed_data, "mixed tasks: data is shakespeare in {t}/lm but assoc_recall in {t}/ar"),
        (bad_acc_vs_lm, "mixed tasks: {t}/acc reports val/acc but {t}/lm does not"),
        (
            lambda t: [_sweep(t), "--baseline", "attention=flash"],
            "--baseline 'attention=flash' matches no group; labels: attention=mha; attention=gqa",
        ),
        (lambda t: [_sweep(t), "--step", "70"], "--step 70: run "),
    ],
)
def test_bad_input_gives_one_line_error_and_exit_2(tmp_path, capsys, setup, fragment):
    args = setup(tmp_path)
    rc, out, err = _run([*args, "--out", tmp_path / "out", "--no-wandb"], capsys)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("gptlab-compare: error: ")
    assert fragment.format(t=tmp_path) in err
    assert not (tmp_path / "out").exists()


def test_out_dir_never_overwrites_a_run_dir(tmp_path, capsys):
    sweep = _sweep(tmp_path)
    rc, _, err = _run([sweep, "--out", sweep / "0", "--no-wandb"], capsys)
    assert rc == 2 and "is a run directory" in err and not (sweep / "0" / "comparison.json").exists()


def test_wandb_offline_run_has_table_and_plots(tmp_path, capsys, monkeypatch):
    sweep = _sweep(tmp_path)
    rc, out, err = _run([sweep, "--out", tmp_path / "out"], capsys)  # WANDB_MODE=offline (conftest) turns it on
    assert rc == 0, err
    run_dir = Path(re.search(r"W&B: logged comparison run to (\S+)", out).group(1))
    run_rec = of_type(inspect_records(run_dir), "run")[0]
    assert run_rec["job_type"] == "comparison" and run_rec["run_group"] == "attn"
    summary = inspect_summary(run_dir)
    assert summary["comparison"]["_type"] == "table-file" and summary["comparison"]["nrows"] == 2
    assert summary["plots/val_loss_vs_step"]["_type"] == "image-file"
    table = json.loads((run_dir / "files" / summary["comparison"]["path"]).read_text())
    assert [row[0] for row in table["data"]] == ["attention=mha", "attention=gqa, attention.n_kv_head=2"]
    # the equal-compute verdicts, word for word as comparison.md gives them
    md = (tmp_path / "out" / "comparison.md").read_text()
    sentences = [line.removeprefix("- ") for line in md.splitlines() if line.startswith("- Val loss at equal ")]
    equal = json.loads((run_dir / "files" / summary["equal_compute"]["path"]).read_text())
    logged = [row[0] for row in equal["data"]]
    assert len(sentences) == 2 and [line for line in logged if line.startswith("Val loss at equal ")] == sentences
    assert all(line in md for line in logged)  # and its other lines (runs whose FLOPs were rebuilt) are the report's


def test_wandb_failure_only_warns(tmp_path, capsys, monkeypatch):
    import wandb

    def broken(**_):
        raise RuntimeError("No API key configured")

    monkeypatch.setattr(wandb, "init", broken)
    rc, _, err = _run([_sweep(tmp_path), "--out", tmp_path / "out", "--wandb"], capsys)
    assert rc == 0 and "warning: W&B logging failed (No API key configured)" in err
    assert (tmp_path / "out" / "comparison.html").is_file()


def test_python_dash_m_entry_point(tmp_path):
    sweep = _sweep(tmp_path)
    proc = run_cli(
        "gptlab.cli.compare", str(sweep), "--no-wandb", cwd=REPO, timeout=120, env=cli_env(PYTHONPATH=str(REPO))
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads((sweep / "comparison" / "comparison.json").read_text())["baseline"] == "attention=mha"


def test_compare_imports_nothing_of_training():
    code = (
        "import sys, gptlab.cli.compare, gptlab.compare.render.plots, gptlab.compare.render.report, gptlab.compare.render.wandb_log; "
        "print(sorted(m for m in ('torch', 'hydra', 'omegaconf', 'wandb', 'datasets') if m in sys.modules))"
    )
    proc = subprocess.run(
        [python_bin(), "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(PYTHONPATH=str(REPO)),
    )
    assert proc.stdout.strip() == "[]", proc.stderr


@pytest.mark.slow
def test_real_short_runs_two_configs_two_seeds(tmp_path, capsys):
    choices = sorted(p.stem for p in (REPO / "conf" / "attention").glob("*.yaml"))
    pair = ["mha", "gqa"] if {"mha", "gqa"} <= set(choices) else choices[:2]
    if len(pair) < 2:
        pytest.skip("fewer than two attention choices in conf/attention")
    proc = run_cli(
        "gptlab.cli.train",
        "-m",
        "model=tiny",
        "model.n_layer=1",  # the smallest model that still makes gqa (n_kv_head 4 of n_head 4) mha's twin
        "train.batch_size=4",
        "train.max_steps=20",
        "train.eval_interval=10",
        "train.eval_sequences=16",
        f"attention={','.join(pair)}",
        "seed=0,1",
        "logger=none",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
        timeout=900,
        env=cli_env(PYTHONPATH=str(REPO)),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = _compare_json(tmp_path, capsys, tmp_path / "sweep", "--baseline", f"attention={pair[0]}")
    assert doc["step"] == 20 and [r["n_seeds"] for r in doc["rows"]] == [2, 2]
    assert doc["rows"][0]["speedup"] is None and doc["rows"][0]["delta_val_loss"] == 0.0  # not timed
    if pair == ["mha", "gqa"]:  # model=tiny has n_head 4 and gqa's default n_kv_head is 4: the same model twice
        twin = doc["rows"][1]
        assert twin["identical_to"] == [doc["rows"][0]["label"]] and twin["model_fingerprint"]
        assert twin["significant"] is False and speed_words(twin) == "not timed"
    for row in doc["rows"]:
        losses = []
        for run in row["runs"]:
            recs = [json.loads(line) for line in Path(run, "metrics.jsonl").read_text().splitlines()]
            losses.append(next(r["val/loss"] for r in recs if r["step"] == 20 and "val/loss" in r))
        assert row["val_loss_mean"] == pytest.approx(statistics.mean(losses))
        assert row["val_loss_std"] == pytest.approx(statistics.stdev(losses))
