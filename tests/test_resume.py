"""Every number is the run's own: exact resume over every optimizer/schedule, data that depends only on the data
seed, per-run peaks, re-reported summaries, init_from, and signals that checkpoint before stopping.

Refusals of a resume under another config are rows of the bad-input table (test_bad_input.py)."""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path

import pytest
import torch
from test_reliability import CURVE, freeze, kill_at_random, launch, wait_for_step

from gptlab.runtime.metrics import mfu
from gptlab.state import checkpoint
from gptlab.train.signals import StopFlag
from helpers.cli import cli_env, run_cli
from helpers.train import FAST, rows, run_inprocess

# dropout (RNG state matters) and two micro-batches per step (accumulation order matters)
HARD = [
    *FAST,
    "model.dropout=0.1",
    "train.grad_accum=2",
    "train.eval_interval=5",
    "train.ckpt_interval=3",
    "hardware.threads=1",
    "train.max_steps=24",
]
CONF = Path(__file__).resolve().parents[1] / "conf"
OPTIMIZERS = sorted(p.stem for p in (CONF / "optimizer").glob("*.yaml"))
SCHEDULES = sorted(p.stem for p in (CONF / "schedule").glob("*.yaml"))
# every shipped optimizer and every shipped schedule at least once, paired in turn: a new YAML in either folder is
# resumed (cleanly and after a kill -9) with no new test code, at max(optimizers, schedules) runs, not their product
PAIRS = [
    (OPTIMIZERS[i % len(OPTIMIZERS)], SCHEDULES[i % len(SCHEDULES)])
    for i in range(max(len(OPTIMIZERS), len(SCHEDULES)))
]
PAIR_IDS = [f"{optimizer}-{schedule}" for optimizer, schedule in PAIRS]


def every_row(run_dir: Path) -> list[dict]:
    return [{k: r[k] for k in CURVE if k in r} for r in rows(run_dir)]


def _finish(run: Path, args: list[str]) -> None:
    assert launch(run, *args).wait(timeout=300) == 0, Path(f"{run}.err").read_text()[-2000:]


@pytest.fixture(scope="session")
def straight(tmp_path_factory):
    """The uninterrupted HARD run of an (optimizer, schedule) pair, run once per session; its curve."""
    done: dict[tuple[str, str], list[dict]] = {}

    def curve(optimizer: str, schedule: str) -> list[dict]:
        if (optimizer, schedule) not in done:
            run = tmp_path_factory.mktemp("straight") / f"{optimizer}-{schedule}"
            _finish(run, [*HARD, f"optimizer={optimizer}", f"schedule={schedule}"])
            done[optimizer, schedule] = every_row(run)
        return done[optimizer, schedule]

    return curve


@pytest.mark.slow
@pytest.mark.parametrize("optimizer,schedule", PAIRS, ids=PAIR_IDS)
def test_stop_then_resume_is_exact_for_every_optimizer_and_schedule(tmp_path, straight, optimizer, schedule):
    """SIGUSR2 mid-run: the checkpoint at the stop step (between ckpt_interval ones) resumes to the same curve."""
    args = [*HARD, f"optimizer={optimizer}", f"schedule={schedule}"]
    run = tmp_path / "stopped"
    proc = launch(run, *args)
    assert wait_for_step(proc, run, 10), Path(f"{run}.err").read_text()[-2000:]
    freeze(proc)  # the signal lands while the run is held, so a busy machine cannot let it run on to the end
    proc.send_signal(signal.SIGUSR2)
    proc.send_signal(signal.SIGCONT)
    assert proc.wait(timeout=120) == 0
    assert 10 <= checkpoint.load(checkpoint.latest_path(run))["step"] < 24  # stopped early, at a step of its own
    _finish(run, args)
    assert every_row(run) == straight(optimizer, schedule)  # every row, exactly: loss, lr, grad norm, val loss


@pytest.mark.slow
@pytest.mark.parametrize("optimizer,schedule", PAIRS, ids=PAIR_IDS)
def test_sigkill_then_resume_is_exact_for_every_optimizer_and_schedule(tmp_path, straight, optimizer, schedule):
    args = [*HARD, f"optimizer={optimizer}", f"schedule={schedule}"]
    run = tmp_path / "killed"
    killed = kill_at_random(launch(run, *args), run, random.Random(f"{optimizer}{schedule}"), last=21)
    _finish(run, args)
    assert killed["killed"], killed
    assert every_row(run) == straight(optimizer, schedule)  # every row, exactly: loss, lr, grad norm, val loss


def test_the_pairs_cover_every_shipped_optimizer_and_schedule():
    assert {o for o, _ in PAIRS} == set(OPTIMIZERS) >= {"adamw", "sgd", "lion", "muon"}
    assert {s for _, s in PAIRS} == set(SCHEDULES) >= {"cosine", "linear", "wsd", "constant"}
    assert len(PAIRS) == max(len(OPTIMIZERS), len(SCHEDULES))


@pytest.mark.slow
def test_fp16_grad_scaler_state_resumes_exactly(tmp_path):
    """fp16 on CPU autocast with the GradScaler: the scale (and its growth tracker) is checkpointed too."""
    args = [*HARD, "hardware.dtype=fp16", "optimizer=adamw", "schedule=constant"]
    assert launch(tmp_path / "straight", *args).wait(timeout=300) == 0
    state = checkpoint.load(checkpoint.latest_path(tmp_path / "straight"))
    assert state["scaler"]["scale"] > 0 and "_growth_tracker" in state["scaler"]
    run = tmp_path / "killed"
    proc = launch(run, *args)
    assert wait_for_step(proc, run, 13)
    proc.kill(), proc.wait()
    assert launch(run, *args).wait(timeout=300) == 0
    assert every_row(run) == every_row(tmp_path / "straight")


def test_val_loss_and_training_data_do_not_depend_on_grad_accum(tmp_path):
    """Same weights, same fixed val set: step-0 val loss is equal whatever the micro-batch; the global batch is the
    same samples, so the curves agree to float-summation noise (issue: 4.3404 / 4.3454 / 4.3386 before)."""
    curves = {}
    for accum in (1, 2, 4):
        run_inprocess(tmp_path / f"a{accum}", f"train.grad_accum={accum}", steps=6, eval_interval=3)
        curves[accum] = rows(tmp_path / f"a{accum}")
    for accum in (2, 4):
        for want, got in zip(curves[1], curves[accum]):
            assert want["step"] == got["step"]
            for key in ("val/loss", "train/loss"):
                if key in want:
                    assert got[key] == pytest.approx(want[key], rel=2e-5, abs=2e-5), (accum, want["step"], key)


def test_batch_size_arms_see_the_same_stream(tmp_path):
    """Batch 16 for one step trains on exactly the samples that batch 8 sees in steps 0 and 1 (global sample index)."""
    from gptlab.config.build import build_data, compose

    data = build_data(compose([*FAST]), 64)
    x16, _ = data.train_samples(0 * 16, 16)
    x8a, _ = data.train_samples(0 * 8, 8)
    x8b, _ = data.train_samples(1 * 8, 8)
    assert torch.equal(x16, torch.cat([x8a, x8b]))


def test_rerunning_a_finished_run_reports_its_summary_unchanged(tmp_path):
    run = tmp_path / "run"
    run_inprocess(run, "train.speed_warmup=1")
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".gptlab.lock"}
    again = run_inprocess(run, "train.speed_warmup=1")
    after = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".gptlab.lock"}
    assert after == before  # no file touched: summary, metrics, provenance
    summary = json.loads(before["summary.json"])
    assert again["tokens_per_s_median"] == summary["tokens_per_s_median"] is not None
    assert again["wall_s"] == summary["wall_s"] > 0.001
    assert 0.0 <= summary["outside_load"] <= 1.0  # the share of the cores other processes used meanwhile


def test_summary_lost_in_a_kill_is_recomputed_from_the_checkpoint(tmp_path):
    """A kill between the last checkpoint and summary.json: the rerun reports the whole run's figures, not nulls."""
    run = tmp_path / "run"
    first = run_inprocess(run, "train.speed_warmup=1")
    (run / "summary.json").unlink()
    (run / ".summary.json.4242.tmp").write_text('{"half": ')
    again = run_inprocess(run, "train.speed_warmup=1")
    for key in (
        "final_val_loss",
        "best_val_loss",
        "steps",
        "tokens",
        "tokens_per_s_median",
        "step_ms_median",
        "mfu_median",
        "peak_mem_bytes",
        "wall_s",
        "train_s",
    ):
        assert again[key] == first[key], key
    assert not (run / ".summary.json.4242.tmp").exists()


def test_extending_max_steps_under_a_constant_schedule_continues_the_same_curve(tmp_path):
    run_inprocess(tmp_path / "straight", "schedule=constant", steps=10, eval_interval=5)
    run_inprocess(tmp_path / "grown", "schedule=constant", steps=6, eval_interval=5)
    summary = run_inprocess(tmp_path / "grown", "schedule=constant", steps=10, eval_interval=5)
    assert summary["steps"] == 10
    want = [r for r in every_row(tmp_path / "straight") if r["step"] != 6 or "train/loss" in r]
    got = [r for r in every_row(tmp_path / "grown") if r["step"] != 6 or "train/loss" in r]  # 6: the old last eval
    assert got == want


def test_init_from_starts_a_new_run_with_the_configs_hyper_parameters(tmp_path):
    run_inprocess(tmp_path / "old", "optimizer.lr=0.003", steps=6, eval_interval=3)
    ckpt = checkpoint.latest_path(tmp_path / "old")
    summary = run_inprocess(tmp_path / "new", f"train.init_from={ckpt}", "optimizer.lr=0.03", steps=9, eval_interval=3)
    new_rows = rows(tmp_path / "new")
    old_eval = rows(tmp_path / "old")[-1]
    assert {k: new_rows[0][k] for k in ("step", "val/loss", "tokens")} == {
        "step": 6,
        "val/loss": pytest.approx(old_eval["val/loss"], rel=1e-6),
        "tokens": old_eval["tokens"],
    }
    assert set(new_rows[0]) == {"step", "val/loss", "tokens", "wall_s", "train_s", "flops"}  # x-axes, the loss
    lr_rows = [r for r in new_rows if "train/lr" in r]
    assert [r["step"] for r in lr_rows] == [7, 8, 9]
    base_lr = (
        lr_rows[0]["train/lr"] / 0.03
    )  # the schedule factor at step 6 of 9, times the CONFIG's lr (not the file's)
    assert 0 < base_lr <= 1
    record = summary["init_from"]
    assert (record["checkpoint"], record["step"], record["optimizer_state"]) == (str(ckpt), 6, True)
    assert record["differences"] == ["optimizer.lr=0.003 there, 0.03 here"]  # max_steps is not a curve difference
    prov = json.loads((tmp_path / "new" / "provenance.json").read_text())
    assert prov["init_from"]["checkpoint"] == str(ckpt) and prov["init_from"]["step"] == 6


def test_init_from_runs_draw_from_their_own_seed(tmp_path):
    """An init_from run is a new run: it took the source checkpoint's RNG state, so with dropout seed 0 and seed 7
    drew the same masks and gave bit-identical curves, which a comparison reads as no seed noise at all."""
    run_inprocess(tmp_path / "old", "model.dropout=0.1", steps=4, eval_interval=2)
    ckpt = checkpoint.latest_path(tmp_path / "old")

    def losses(name: str, seed: int) -> list[float]:
        run_inprocess(tmp_path / name, f"train.init_from={ckpt}", "model.dropout=0.1", f"seed={seed}", steps=6)
        return [r["train/loss"] for r in rows(tmp_path / name) if "train/loss" in r]

    seed0, again, seed7 = losses("s0", 0), losses("s0-again", 0), losses("s7", 7)
    assert len(seed0) == 2 and seed0 == again  # one seed: the same run
    assert all(a != b for a, b in zip(seed0, seed7))  # another seed: other dropout masks at every step


def test_every_start_keeps_its_first_speed_warmup_steps_out_of_the_speed_medians(tmp_path):
    """train.speed_warmup counted absolute steps: a resume past it timed its first steps (a new process's compile and
    allocations) into step_ms and tokens/s, and an init_from run starting past it had no warm-up at all."""
    knobs = ("schedule=constant", "train.speed_warmup=2")
    run_inprocess(tmp_path / "run", *knobs, steps=6, eval_interval=3)
    run_inprocess(tmp_path / "run", *knobs, steps=10, eval_interval=3)  # resumed at step 6
    progress = checkpoint.load(checkpoint.latest_path(tmp_path / "run"))["progress"]
    assert (len(progress["warmup_ms"]), len(progress["step_ms"])) == (2 + 2, 4 + 2)  # steps 1-2, 7-8 warm up
    ckpt = checkpoint.latest_path(tmp_path / "run")
    summary = run_inprocess(tmp_path / "new", *knobs, f"train.init_from={ckpt}", steps=14, eval_interval=2)
    progress = checkpoint.load(checkpoint.latest_path(tmp_path / "new"))["progress"]
    assert (len(progress["warmup_ms"]), len(progress["step_ms"])) == (2, 2) and summary["warmup_s"] is not None


def test_a_resumed_run_reports_when_it_first_started(tmp_path):
    """compare's run-order check reads started_at: a resumed run recorded its last process's start, so an arm-major
    sweep with one run resumed after the other arm's block passed the check (its speed medians cover both starts)."""
    first = run_inprocess(tmp_path / "run", "schedule=constant", steps=6, eval_interval=3)
    again = run_inprocess(tmp_path / "run", "schedule=constant", steps=10, eval_interval=3)
    assert again["steps"] == 10 and again["started_at"] == first["started_at"] < first["ended_at"] < again["ended_at"]


def test_optimizer_set_param_groups_follow_load_state_dict():
    """Muon's OptimizerSet: after load_state_dict the schedule must reach the live groups (it kept stale dicts)."""
    from gptlab.config.build import build_model, build_optimizer, compose

    cfg = compose([*FAST, "optimizer=muon"])
    model = build_model(cfg, vocab_size=65)
    opt = build_optimizer(cfg, model)
    opt.load_state_dict(opt.state_dict())
    for group in opt.param_groups:
        group["lr"] = 0.123
    assert all(g["lr"] == 0.123 for member in opt.optimizers for g in member.param_groups)


@pytest.mark.slow
def test_peak_memory_is_each_runs_own(tmp_path, monkeypatch):
    """A big then a tiny model in ONE process (Hydra multirun): each peak within 15 % of the same run alone
    (before: both reported the big run's ru_maxrss). Every run is a fresh interpreter, as a user's: a child of the
    worker's fork server holds fewer resident pages (those it did not touch since the fork are not counted), so
    mixing the two, as the fork server's first-request rule did in a worker that had not asked before, read the
    tiny run's 355 MB in the multirun against 294 MB alone."""
    monkeypatch.setenv("GPTLAB_TEST_FORKSERVER", "0")
    base = [
        *(o for o in FAST if not o.startswith(("model.d_model", "model.n_layer", "model.n_head"))),
        "train.max_steps=3",
        "train.eval_interval=3",
        "hardware.threads=1",
        "model.n_layer=4",
        "model.n_head=8",
    ]

    def cli(*args, multirun=False):
        env = cli_env(OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="1")
        out = run_cli(
            "gptlab.cli.train", *(["-m"] if multirun else []), *base, *args, cwd=tmp_path, env=env, timeout=600
        )
        assert out.returncode == 0, out.stderr[-2000:]

    peak = lambda run: json.loads((run / "summary.json").read_text())["peak_mem_bytes"]  # noqa: E731
    cli(f"hydra.sweep.dir={tmp_path / 'm'}", "model.d_model=512,32", multirun=True)
    together = [peak(tmp_path / "m" / str(i)) for i in (0, 1)]
    alone = []
    for width in (512, 32):
        cli(f"hydra.run.dir={tmp_path / str(width)}", f"model.d_model={width}")
        alone.append(peak(tmp_path / str(width)))
    assert together[0] == pytest.approx(alone[0], rel=0.15), (together, alone)
    assert together[1] == pytest.approx(alone[1], rel=0.15), (together, alone)
    assert together[0] > together[1] * 1.2  # and the two runs really differ


def test_stop_signals_checkpoint_then_hand_on(tmp_path):
    """SIGUSR2 (submitit's pre-timeout signal): the loop's flag is set, and forward() calls the handler it replaced."""
    called = []
    previous = signal.signal(signal.SIGUSR2, lambda s, f: called.append(s))
    try:
        flag = StopFlag()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert flag.signum == signal.SIGUSR2 and called == []
        flag.forward()
        assert called == [signal.SIGUSR2]
        assert signal.getsignal(signal.SIGTERM) is not flag._set
    finally:
        signal.signal(signal.SIGUSR2, previous)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGUSR2, signal.SIGTERM], ids=["SIGUSR2", "SIGTERM"])
def test_signal_mid_run_checkpoints_the_current_step_and_resumes_exactly(tmp_path, sig):
    args = [*FAST, "train.max_steps=30", "train.eval_interval=10", "train.ckpt_interval=0", "hardware.threads=1"]
    assert launch(tmp_path / "straight", *args).wait(timeout=300) == 0
    run = tmp_path / "run"
    proc = launch(run, *args)
    assert wait_for_step(proc, run, 12)
    proc.send_signal(sig)
    assert proc.wait(timeout=120) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "preempted"
    assert checkpoint.latest_path(run).name == f"step_{summary['steps']:07d}.pt"  # the step it stopped at
    assert launch(run, *args).wait(timeout=300) == 0
    assert every_row(run) == every_row(tmp_path / "straight")


def test_mfu_is_per_device():
    """Global tokens/s over N devices: MFU is not multiplied by the world size."""
    assert mfu(1e6, 4e5, 1e12, devices=1) == pytest.approx(0.4)
    assert mfu(1e6, 4e5, 1e12, devices=2) == pytest.approx(0.2)


def test_every_cuda_devices_rng_is_saved_and_restored(monkeypatch):
    """CUDA cannot run here: torch.cuda's RNG calls are mocked (2 devices) to check what resume saves and restores."""
    from gptlab.state import resume

    states = [torch.tensor([1, 2], dtype=torch.uint8), torch.tensor([3, 4], dtype=torch.uint8)]
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: list(states))
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda s: restored.append(s))
    saved = resume.rng_state()
    assert [t.tolist() for t in saved["cuda"]] == [[1, 2], [3, 4]] and "python" in saved and "torch" in saved
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    saved = resume.rng_state()
    torch.rand(5)  # move on, then restore: the next draws repeat
    resume.set_rng_state(saved)
    assert torch.equal(torch.rand(3), expected)
    assert [t.tolist() for t in restored[0]] == [[1, 2], [3, 4]]
