"""Nothing lost, nothing silently wrong: every writer asks state/rundir.py's guard before it writes, and a run started
with train.init_from is exactly the run its config asks for.

Each refusal is checked for its one-line message and for the files it must leave byte-identical.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from gptlab.config.build import compose, group_choices
from gptlab.config.validate import validate
from gptlab.errors import ConfigError
from gptlab.state import checkpoint
from gptlab.train.run import execute
from helpers.cli import run_cli
from helpers.train import FAST, rows, run_inprocess


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under folder -> its sha256 (the lock file included)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def one_line_refusal(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> tuple[Path, Path]:
    """Two finished 4-step runs of the real CLI (checkpoints at steps 2 and 4, .hydra/ written), seeds 0 and 1."""
    base = tmp_path_factory.mktemp("runs")
    for seed in (0, 1):
        args = [*FAST, f"seed={seed}", "train.ckpt_interval=2", "train.max_steps=4", "train.eval_interval=2"]
        done = run_cli("gptlab.cli.train", *args, f"hydra.run.dir={base / f'seed{seed}'}", cwd=base)
        assert done.returncode == 0, done.stderr[-2000:]
    return base / "seed0", base / "seed1"


def test_resume_of_another_runs_checkpoint_into_a_dir_holding_a_third_run_is_refused(two_runs):
    source, target = two_runs
    before = snapshot(target)
    with pytest.raises(ConfigError) as err:
        run_inprocess(target, "seed=1", f"train.resume={checkpoint.latest_path(source)}", steps=6, eval_interval=2)
    assert str(err.value).startswith(f"train.resume='{checkpoint.latest_path(source)}': hydra.run.dir '{target}'")
    assert "holds another run" in str(err.value) and "\n" not in str(err.value)
    assert snapshot(target) == before


def test_resume_into_a_new_dir_and_the_same_command_again_are_accepted(two_runs, tmp_path):
    source, _ = two_runs
    ckpt = sorted(checkpoint.ckpt_dir(source).glob("step_*"))[0]  # step 2 (4 is the newest)
    target = tmp_path / "continued"
    first = run_inprocess(target, f"train.resume={ckpt}", "train.ckpt_interval=2", steps=4, eval_interval=2)
    again = run_inprocess(target, f"train.resume={ckpt}", "train.ckpt_interval=2", steps=4, eval_interval=2)
    assert first["final_val_loss"] == again["final_val_loss"]
    assert first["final_val_loss"] == json.loads((source / "summary.json").read_text())["final_val_loss"]


@pytest.mark.parametrize("name", [".gptlab.lock", "metrics.jsonl", "checkpoints/x.csv", "../out.csv", ".hidden.csv"])
def test_a_logger_file_never_lands_on_the_runs_own_files_or_the_lock(name):
    with pytest.raises(ConfigError, match=r"^logger\.csv\.filename='.*': must be a new name inside the run dir"):
        validate(compose(["logger=csv", f"logger.csv.filename={name}"]))


def test_decode_out_on_a_runs_summary_is_refused_and_the_summary_kept(two_runs, tmp_path):
    run = two_runs[0]
    before = snapshot(run)
    done = run_cli(
        "gptlab.cli.decode", f"run={run}", f"out={run / 'summary.json'}", "batch_sizes=[1]", "contexts=[4]",
        "new_tokens=2", "repeats=1", "warmup=0", cwd=tmp_path,
    )  # fmt: skip
    line = one_line_refusal(done)
    assert f"out={run / 'summary.json'}: that is the run dir {run}'s own summary.json" in line
    assert snapshot(run) == before


def test_export_onto_another_run_is_refused_and_that_run_kept(two_runs, tmp_path):
    a, b = two_runs
    before = snapshot(b)
    done = run_cli("gptlab.cli.export", str(a), "--out", str(b), cwd=tmp_path)
    line = one_line_refusal(done)
    assert line.startswith("gptlab: --out=") or "--out=" in line
    assert snapshot(b) == before
    out = tmp_path / "export"
    assert run_cli("gptlab.cli.export", str(a), "--out", str(out), cwd=tmp_path).returncode == 0
    assert run_cli("gptlab.cli.export", str(a), "--out", str(out), cwd=tmp_path).returncode == 0  # its own export


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_init_from_trains_at_the_new_runs_own_lr(two_runs, tmp_path, optimizer):
    """The loaded optimizer state brings the source run's initial_lr: the new run must still use its own lr."""
    source = tmp_path / "source"
    flat = ["schedule=constant", "schedule.warmup_steps=0", f"optimizer={optimizer}"]
    run_inprocess(source, *flat, "optimizer.lr=1e-3", steps=3, eval_interval=3)
    new = tmp_path / "new"
    summary = run_inprocess(
        new, *flat, "optimizer.lr=3e-3", f"train.init_from={checkpoint.latest_path(source)}", steps=6, eval_interval=3
    )
    lrs = [r["train/lr"] for r in rows(new) if "train/lr" in r]
    assert len(lrs) == 3 and all(lr == pytest.approx(3e-3) for lr in lrs), lrs
    assert summary["init_from"]["step"] == 3


def test_init_from_record_survives_a_resume(tmp_path):
    source = tmp_path / "source"
    run_inprocess(source, steps=2, eval_interval=2)
    new = tmp_path / "new"
    init = f"train.init_from={checkpoint.latest_path(source)}"
    flat = ["schedule=constant", "schedule.warmup_steps=0", "train.ckpt_interval=2"]
    first = run_inprocess(new, *flat, init, steps=4, eval_interval=2)
    resumed = run_inprocess(new, *flat, init, steps=6, eval_interval=2)  # train.resume=auto: its own checkpoint
    assert first["init_from"]["step"] == 2
    assert resumed["init_from"] == first["init_from"]
    assert json.loads((new / "summary.json").read_text())["init_from"] == first["init_from"]


def test_init_from_with_max_steps_at_or_below_its_step_is_refused(two_runs, tmp_path):
    ckpt = checkpoint.latest_path(two_runs[0])  # step 4
    target = tmp_path / "nothing"
    for steps in (4, 2):
        with pytest.raises(ConfigError, match=rf"^train\.max_steps={steps}: train\.init_from starts at step 4"):
            run_inprocess(target, f"train.init_from={ckpt}", steps=steps, eval_interval=1)
    assert not (target / "metrics.jsonl").exists() and checkpoint.latest_path(target) is None


def test_the_memory_check_counts_the_validation_set(tmp_path):
    args = ["train.eval_sequences=1000000000", "logger=none", "train.max_steps=2", "sample.tokens=0"]
    cfg = compose(args)
    with pytest.raises(ConfigError, match=r"validation set [^)]+ GiB\)") as err:
        execute(cfg, tmp_path, group_choices(cfg), args)
    assert "train.eval_sequences" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "override, message",
    [
        ("+foo=1", "foo: not a config key; allowed: arm, attention,"),
        ("+seeds=3", "seeds: not a config key (did you mean seed?); allowed:"),
        ("+schedule.decay_fraction=0.5", "schedule.decay_fraction: not a key of this schedule choice (Cosine)"),
        ("+data.bar=2", "data.bar: not a key of this data choice (ShakespeareData)"),
        ("+optimizer.momentum=0.9", "optimizer.momentum: not a key of this optimizer choice (adamw)"),
        ("+logger.wandb.foo=1", "logger.wandb.foo: not a key of this logger.wandb choice (WandbSink)"),
    ],
)
def test_a_key_nothing_reads_is_refused_not_ignored(override, message):
    with pytest.raises(ConfigError) as err:
        validate(compose([override]))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_root_keys_follow_an_edit_of_the_primary_config(tmp_path, monkeypatch):
    """The root keys come from train.yaml's text, parsed once per text: an edited file is read anew, never served
    from an earlier parse."""
    from gptlab.config import schema

    monkeypatch.setattr(schema, "CONF_DIR", tmp_path)
    (tmp_path / "model").mkdir()
    for keys in (["seed", "train"], ["seed", "train", "extra"], ["seed", "train"]):
        (tmp_path / "train.yaml").write_text("defaults: [_self_]\n" + "".join(f"{k}: 1\n" for k in keys))
        assert schema.root_keys("train") == {"hydra", "model", *keys}


def test_sampling_refuses_a_run_whose_corpus_changed_since_training(tmp_path):
    """A char tokenizer fitted on an edited corpus maps ids to other characters: a run saved before runs kept their
    tokenizer (no tokenizer.json) is refused, never served garbage; a run that kept it samples with it, and only its
    default prompt (the corpus's val text) is refused (tests/test_run_tokenizer.py)."""
    from gptlab.config.trained import load_trained
    from gptlab.state.layout import TOKENIZER_FILE

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 400)
    run = tmp_path / "run"
    args = [*FAST, "data=text", f"data.paths=[{corpus}]", "data.tokenizer=char", "train.max_steps=2"]
    done = run_cli("gptlab.cli.train", *args, "train.eval_interval=2", f"hydra.run.dir={run}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    model, data, step = load_trained(run)
    # one id per character of the corpus + U+FFFD (a one-segment corpus once fitted on nothing: vocab 1, loss 0)
    assert step == 2 and data.vocab_size == len(set(corpus.read_text())) + 1
    corpus.write_text("THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG\n" * 400)  # same size, other characters
    assert load_trained(run)[1].tokenizer.chars == data.tokenizer.chars  # the tokenizer it saved when it started
    with pytest.raises(ConfigError, match=r"changed since training .* so the default prompt \(its val text\) would"):
        load_trained(run)[1].sample_prompt()
    (run / TOKENIZER_FILE).unlink()  # an older run dir
    with pytest.raises(ConfigError, match=r"changed since training .* so its tokenizer would differ"):
        load_trained(run)


def test_speculative_out_never_lands_on_a_runs_own_files(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "provenance.json").write_text("{}\n")
    (run / "summary.json").write_text('{"final_val_loss": 3.1}\n')
    before = snapshot(run)
    done = run_cli(
        "gptlab.cli.speculative", "--target", str(run), "--draft", str(run), "--out", str(run / "summary.json")
    )
    assert one_line_refusal(done).startswith(f"error: --out={run / 'summary.json'}: that is the run dir {run}'s own")
    assert snapshot(run) == before


def test_compare_out_never_lands_inside_a_runs_own_folders(tmp_path):
    from gptlab.compare.modes import out_dir

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "provenance.json").write_text("{}\n")
    with pytest.raises(ConfigError) as err:
        out_dir(str(run / "checkpoints"), str(run), [run])
    assert str(err.value).startswith(
        f"--out={run / 'checkpoints' / 'comparison.json'}: that is the run dir {run}'s own"
    )
    assert out_dir(str(run / "reports"), str(run), [run]) == run / "reports"  # beside the run's files: allowed
