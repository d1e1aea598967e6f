"""gptlab-train end to end: files and fields, W&B read back, fairness, resume, determinism, every choice."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

from gptlab.config.build import build_data, compose
from gptlab.optim.schedule import WSD, Constant, Cosine, Linear
from gptlab.util.metric_names import AXES
from helpers.cli import run_cli
from helpers.model import choices
from helpers.train import FAST, rows, run_inprocess, train_env
from helpers.wandb_read import inspect_records

SUMMARY_KEYS = {
    "final_val_loss",
    "best_val_loss",
    "steps",
    "tokens",
    "tokens_per_s_median",
    "step_ms_median",
    "mfu_median",
    "peak_mem_bytes",
    "params",
    "flops_per_token",
    "wall_s",
    "choices",
}
ROW_KEYS = {
    "train/loss", "train/lr", "train/grad_norm", "tokens", "perf/tokens_per_s", "perf/step_ms", "perf/mfu", "mem/peak_bytes",
}  # fmt: skip


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """The default gptlab-train, shortened, through the real CLI with W&B offline."""
    tmp = tmp_path_factory.mktemp("default")
    run_dir = tmp / "run"
    proc = run_cli(
        "gptlab.cli.train",
        "train.max_steps=60",
        "train.eval_interval=20",
        "sample.tokens=20",
        "hardware.peak_flops=2e12",
        f"hydra.run.dir={run_dir}",
        cwd=tmp,
        env=train_env(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir, proc


def test_default_run_reduces_val_loss_and_writes_files(default_run):
    run_dir, proc = default_run
    evals = [r for r in rows(run_dir) if "val/loss" in r]
    assert [r["step"] for r in evals] == [0, 20, 40, 60]
    assert evals[-1]["val/loss"] < evals[0]["val/loss"] - 0.8  # char-level: ~4.2 -> < 3.4 in 60 steps
    train_rows = [r for r in rows(run_dir) if "train/loss" in r]
    assert all(ROW_KEYS <= set(r) for r in train_rows)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary)
    assert summary["final_val_loss"] == pytest.approx(evals[-1]["val/loss"])
    assert summary["steps"] == 60 and summary["tokens"] == 60 * 32 * 128
    assert summary["choices"]["attention"] == "mha" and summary["choices"]["model"] == "tiny"
    assert 0 < summary["mfu_median"] < 1
    prov = json.loads((run_dir / "provenance.json").read_text())
    assert {"git", "packages", "hardware", "command"} <= set(prov) and prov["packages"]["torch"]
    assert (run_dir / ".hydra" / "config.yaml").is_file() and (run_dir / ".hydra" / "overrides.yaml").is_file()
    assert "run dir" in proc.stdout and "wandb sync" in proc.stdout


def test_wandb_offline_run_matches_local_files(default_run):
    run_dir, _ = default_run
    wandb_runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(wandb_runs) == 1
    records = inspect_records(wandb_runs[0])
    text = json.dumps(records)
    assert '"default"' in text  # the W&B group of a single run
    assert "attention=mha" not in text  # a default run has no tags (only non-default choices are tagged)
    logged = {k for rec in records for item in _history_items(rec) for k in item if not k.startswith("_")}
    assert {"train/lr", "train/grad_norm", "perf/tokens_per_s", "perf/step_ms", "perf/mfu", "mem/peak_bytes"} <= logged
    assert all("/" in k or k in AXES for k in logged), sorted(logged)  # every metric in its section, beside the axes
    local = {r["step"]: r["val/loss"] for r in rows(run_dir) if "val/loss" in r}
    remote = {}
    for rec in records:
        for item in _history_items(rec):
            if "val/loss" in item and "step" in item:
                remote[int(item["step"])] = float(item["val/loss"])
    assert remote == pytest.approx(local)


def _history_items(record):
    """History rows from one `wandb leet inspect --json` record, whatever its nesting."""
    if isinstance(record, dict):
        if "val/loss" in record or "train/loss" in record:
            yield record
        for value in record.values():
            yield from _history_items(value)
    elif isinstance(record, list):
        for value in record:
            yield from _history_items(value)


def _group_cases():
    out = []
    for group in ("optimizer", "schedule", "hardware", "logger", "data"):
        for choice in choices(group):
            out.append((group, choice))
    return out


@pytest.mark.parametrize("group,choice", _group_cases(), ids=lambda v: str(v))
def test_every_run_choice_trains(tmp_path, group, choice):
    extra = []
    if (
        group == "hardware"
        and compose([f"hardware={choice}"]).hardware.device == "cuda"
        and not torch.cuda.is_available()
    ):
        pytest.skip("no CUDA device on this machine (the profile is exercised where a GPU exists)")
    if group == "data" and choice == "hf":
        pytest.skip("a hub dataset needs the network; its offline error is tested in test_bad_input")
    if group == "data" and choice == "text":
        corpus = tmp_path / "corpus.jsonl"
        corpus.write_text(
            "".join(json.dumps({"text": f"line {i}: the quick brown fox jumps. " * 3}) + "\n" for i in range(300))
        )
        extra = [f"data.paths=[{corpus}]", "data.tokenizer=byte"]
    summary = run_inprocess(tmp_path / "run", f"{group}={choice}", *extra)
    assert summary["steps"] == 6
    losses = [r["train/loss"] for r in rows(tmp_path / "run") if "train/loss" in r]
    assert len(losses) == 6 and all(torch.isfinite(torch.tensor(losses)))


def test_runs_with_different_models_see_identical_batches():
    a = build_data(compose(["attention=mha", *FAST]), 64)
    b = build_data(compose(["attention=gqa", "mlp=swiglu", *FAST]), 64)
    for first in (0, 56, 984):
        for x, y in zip(a.train_samples(first, 8), b.train_samples(first, 8)):
            assert torch.equal(x, y)
    for xa, xb in zip(a.val_samples(24), b.val_samples(24)):
        assert torch.equal(xa, xb)


def test_same_seed_twice_gives_identical_losses(tmp_path):
    run_inprocess(tmp_path / "a", "data=assoc_recall")
    run_inprocess(tmp_path / "b", "data=assoc_recall")
    strip = lambda rs: [
        {k: v for k, v in r.items() if k in ("step", "train/loss", "val/loss", "val/acc", "train/grad_norm")}
        for r in rs
    ]
    assert strip(rows(tmp_path / "a")) == strip(rows(tmp_path / "b"))
    assert any("val/acc" in r for r in rows(tmp_path / "a"))


def _stopped_at_step_4(run_dir, *overrides: str) -> dict:
    """8 steps with evals every 2, stopped at step 4 by SIGUSR1 (as SLURM sends): the first attempt's summary."""
    import gptlab.train.loop as loop

    original, real_emit = signal.getsignal(signal.SIGUSR1), loop._emit

    def emit_then_signal(sinks, ctx, row, step):
        real_emit(sinks, ctx, row, step)
        if step == 4 and "train/loss" in row:
            os.kill(os.getpid(), signal.SIGUSR1)

    loop._emit = emit_then_signal
    try:
        return run_inprocess(run_dir, *overrides, steps=8, eval_interval=2)
    finally:
        loop._emit = real_emit
        signal.signal(signal.SIGUSR1, original)


def test_resume_continues_the_same_curve(tmp_path):
    """Stop at step 4 (SIGUSR1, as SLURM sends), resume with train.resume=auto: same rows as one run."""
    full = tmp_path / "full"
    run_inprocess(full, steps=8, eval_interval=2)
    part = tmp_path / "part"
    first = _stopped_at_step_4(part)
    assert first["status"] == "preempted" and first["steps"] == 4
    second = run_inprocess(part, steps=8, eval_interval=2)
    assert second["status"] == "finished" and second["steps"] == 8
    keys = ("step", "train/loss", "val/loss", "train/grad_norm", "train/lr", "tokens")
    strip = lambda rs: [{k: r[k] for k in keys if k in r} for r in rs]
    assert strip(rows(part)) == strip(rows(full))
    assert second["final_val_loss"] == json.loads((full / "summary.json").read_text())["final_val_loss"]


def test_train_s_counts_training_steps_alone_across_a_resume(tmp_path):
    """train_s, the training-only clock: every step's time (perf/step_ms, warm-up steps too) summed, nothing else
    (evals and probes every 2 steps fall outside it, as wall_s holds them), kept across a resume, and on an eval row
    the same as on that step's train row. A checkpoint from before it was kept resumes with it unknown (None), never
    restarted at 0."""
    from gptlab.state import checkpoint

    run = tmp_path / "r"
    _stopped_at_step_4(run, "probes=[induction]")
    last = run_inprocess(run, "probes=[induction]", steps=8, eval_interval=2)
    train_rows = [r for r in rows(run) if "train/loss" in r]
    assert [r["step"] for r in train_rows] == list(range(1, 9))  # both processes' steps, each once
    clock = 0.0
    for r in train_rows:
        clock += r["perf/step_ms"] / 1000
        assert r["train_s"] == pytest.approx(clock, rel=1e-9, abs=1e-12)
        assert r["train_s"] < r["wall_s"]
    at = {r["step"]: r["train_s"] for r in train_rows}
    evals = [r for r in rows(run) if "val/loss" in r and r["step"] > 0]
    assert evals and all(r["train_s"] == at[r["step"]] for r in evals)
    assert last["train_s"] == pytest.approx(clock, rel=1e-9) and last["wall_s"] > last["train_s"]

    older = tmp_path / "older"  # the same run stopped at step 4, its checkpoint as an older gptlab wrote it
    _stopped_at_step_4(older)
    path = checkpoint.latest_path(older)
    state = torch.load(path, weights_only=False)
    del state["progress"]["train_s"]
    torch.save(state, path)
    resumed = run_inprocess(older, steps=8, eval_interval=2)
    assert resumed["steps"] == 8 and resumed["train_s"] is None
    assert not any("train_s" in r for r in rows(older) if r["step"] > 4)


@pytest.mark.parametrize("cls", [Cosine, Linear, WSD])
def test_schedules_warmup_and_end_at_min(cls):
    s = cls(max_steps=100, warmup_steps=10, min_lr_ratio=0.1)
    assert s(0) == pytest.approx(1 / 11)
    assert s(10) == pytest.approx(1.0)
    assert s(100) == pytest.approx(0.1)
    assert all(s(i) >= s(i + 1) - 1e-12 for i in range(10, 100))


def test_wsd_cools_down_over_the_last_fraction_of_the_post_warmup_steps():
    """As conf/schedule/wsd.yaml says: max_steps 500, warmup 50, decay_fraction 0.2 -> flat to step 410, then 90
    linear steps to min_lr_ratio (the fraction is of the steps after warmup, as every shape's progress is)."""
    s = WSD(max_steps=500, warmup_steps=50, min_lr_ratio=0.0, decay_fraction=0.2)
    assert s(50) == s(410) == 1.0 and s(411) == pytest.approx(89 / 90) and s(455) == pytest.approx(0.5)
    assert s(500) == 0.0


def test_constant_schedule():
    s = Constant(max_steps=50, warmup_steps=5)
    assert s(0) == pytest.approx(1 / 6) and s(5) == 1.0 and s(50) == 1.0
    with pytest.raises(TypeError):  # nothing decays: a min_lr_ratio would be silently ignored, so it is not taken
        Constant(max_steps=50, warmup_steps=5, min_lr_ratio=0.1)


# Bad input (config, data, environment, resume) is one table in test_bad_input.py.


def test_bad_run_does_not_touch_a_finished_run(default_run, tmp_path):
    run_dir, _ = default_run
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    proc = run_cli(
        "gptlab.cli.train", "train.eval_interval=0", f"hydra.run.dir={run_dir}", cwd=tmp_path, env=train_env()
    )
    assert proc.returncode == 2
    after = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file() and p.name in before}
    assert {k: v for k, v in after.items() if k != "train.log"} == {k: v for k, v in before.items() if k != "train.log"}
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ckpts


def test_sample_cli_prints_text_from_the_checkpoint(default_run, tmp_path):
    run_dir, _ = default_run
    proc = run_cli("gptlab.cli.sample", str(run_dir), "--prompt", "ROMEO:", "--tokens", "40", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("ROMEO:") and len(proc.stdout.strip()) >= 40
    assert "@ step 60" in proc.stderr
    missing = run_cli("gptlab.cli.sample", str(tmp_path), timeout=None)
    assert missing.returncode == 2 and "not a run directory" in missing.stderr


def test_warmup_seconds_is_the_warmup_steps_beyond_steady_ones(tmp_path):
    """summary warmup_s = the first train.speed_warmup steps' time minus as many steady (median) steps, read back
    from metrics.jsonl's per-step times; those steps stay out of the speed median."""
    import statistics

    summary = run_inprocess(tmp_path, "train.log_interval=1", "train.speed_warmup=3", steps=9)
    ms = {r["step"]: r["perf/step_ms"] for r in rows(tmp_path) if "perf/step_ms" in r}
    steady = statistics.median(ms[s] for s in range(4, 10))
    assert summary["step_ms_median"] == pytest.approx(steady)
    assert summary["warmup_s"] == pytest.approx((sum(ms[s] for s in (1, 2, 3)) - 3 * steady) / 1000)
