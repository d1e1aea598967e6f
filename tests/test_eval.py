"""gptlab-eval runs lm-evaluation-harness (its HF backend) on a trained run, offline on a local task: the accuracy it
writes to eval.json equals the one computed by hand from gptlab's own model, W&B (offline, read back) gets the same
numbers, refusals are one line, and gptlab-compare shows the eval metrics with seed statistics."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval", reason="gptlab[eval] not installed: make setup installs it")

from gptlab.compare.statistics import stats  # noqa: E402
from gptlab.errors import ConfigError  # noqa: E402
from helpers.cli import cli_env, run_cli  # noqa: E402
from helpers.compare import write_sweep  # noqa: E402

ANIMALS = ["cat", "dog", "cow", "hen", "pig", "fox", "owl", "bee"]
CHOICES = [" moo", " woof", " meow", " oink"]


def _task(folder: Path) -> Path:
    """A multiple-choice task read from a local jsonl (lm-eval's `dataset_path: json`): works offline."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"question": f"The {a} says", "choices": CHOICES, "answer": i % 4} for i, a in enumerate(ANIMALS * 2)]
    (folder / "tiny.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "tiny_mc.yaml").write_text(
        "task: tiny_mc\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {folder / 'tiny.jsonl'}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        'doc_to_text: "{{question}}"\n'
        'doc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{answer}}"\n'
        'target_delimiter: ""\n'
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
    )
    return folder


def _train(run: Path, *overrides: str) -> None:
    """A 2-step GPT-2-shaped byte-level run, with the .hydra/config.yaml gptlab-train would have saved."""
    from omegaconf import OmegaConf

    from gptlab.config.build import compose, plain_config
    from helpers.train import FAST, run_inprocess

    args = ["attention=mha", "mlp=gelu", "norm=layernorm", "position=learned", "data.tokenizer=byte", *overrides]
    run_inprocess(run, *args, steps=2, eval_interval=1)
    cfg = compose([*FAST, "train.max_steps=2", "train.eval_interval=1", *args])
    (run / ".hydra").mkdir(exist_ok=True)
    OmegaConf.save(OmegaConf.create(plain_config(cfg)), run / ".hydra" / "config.yaml")


def _accuracy_by_hand(run: Path) -> float:
    """Multiple-choice accuracy from gptlab's model: argmax over choices of log P(choice | question)."""
    from gptlab.config.trained import load_trained

    model, text, _ = load_trained(run)
    tok, right = text.tokenizer, 0
    rows = [(f"The {a} says", i % 4) for i, a in enumerate(ANIMALS * 2)]
    for question, answer in rows:
        scores = []
        for choice in CHOICES:
            ctx, whole = tok.encode(question), tok.encode(question + choice)
            idx = torch.tensor([whole[:-1]])
            with torch.no_grad():
                logp = torch.log_softmax(model(idx)[0][0].float(), dim=-1)  # (T-1, vocab)
            scores.append(sum(float(logp[i - 1, whole[i]]) for i in range(len(ctx), len(whole))))
        right += int(max(range(len(CHOICES)), key=scores.__getitem__) == answer)
    return right / len(rows)


@pytest.mark.slow  # trains, then runs lm-eval in a subprocess: ~40 s on 2 busy cores
def test_gptlab_eval_on_a_local_task_matches_a_hand_computed_accuracy(tmp_path):
    from helpers.wandb_read import inspect_records, of_type

    run = tmp_path / "run"
    _train(run, "logger=wandb")
    tasks = _task(tmp_path / "tasks")
    env = cli_env(HF_HOME=str(tmp_path / "hf-home"))
    done = run_cli("gptlab.cli.eval", str(run), "--tasks", "tiny_mc", "--include-path", str(tasks), env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((run / "eval.json").read_text())
    entry = record["tasks"]["tiny_mc"]
    assert entry["step"] == 2 and entry["samples"] == 16 and entry["num_fewshot"] == 0 and entry["limit"] is None
    assert entry["metrics"]["acc"] == pytest.approx(_accuracy_by_hand(run), abs=1e-12)
    assert f"eval/tiny_mc/acc = {entry['metrics']['acc']:.4f}" in done.stdout
    # the run's own W&B run, resumed offline: its summary holds the same number
    run_id = (run / "wandb_run_id").read_text().strip()
    folders = sorted((run / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(folders) == 2  # the training start and the eval's resume
    summary = {}
    for payload in of_type(inspect_records(folders[-1]), "summary"):
        summary.update(payload["update"])
    assert summary["eval/tiny_mc/acc"] == pytest.approx(entry["metrics"]["acc"])


@pytest.mark.slow  # trains two runs: ~25 s on 2 busy cores
def test_gptlab_eval_refusals_are_one_line(tmp_path, capsys, monkeypatch):
    from gptlab.cli.eval import main

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    run = tmp_path / "run"
    _train(run)
    rope = tmp_path / "rope"
    _train(rope, "position=rope")
    tasks = _task(tmp_path / "tasks")
    cases = [
        ([str(run), "--tasks", "no_such_task"], "--tasks: unknown task 'no_such_task'"),
        ([str(rope), "--tasks", "tiny_mc", "--include-path", str(tasks)], "position=rope: Hugging Face's GPT-2"),
        ([str(run), "--tasks", "tiny_mc", "--limit", "0"], "--limit=0: must be >= 1"),
        ([str(run), "--tasks", "tiny_mc", "--include-path", str(tmp_path / "nope")], "not a folder of task YAMLs"),
        ([str(run), "--tasks", "lambada_openai"], "tasks from the Hugging Face Hub need a network"),  # offline here
    ]
    capsys.readouterr()
    for args, named in cases:
        with pytest.raises(SystemExit) as code:
            main(args)
        err = capsys.readouterr().err.strip()
        assert code.value.code == 2 and err.splitlines() == [err] and err.startswith("error: ") and named in err
    assert not (run / "eval.json").exists() and not (rope / "eval.json").exists()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # get_task_dict: in lm-eval 0.4.10 (the floor) and now
def test_tasks_all_in_the_include_path_skip_lm_evals_registry_and_shadow_it(tmp_path, monkeypatch):
    """Plain tasks of --include-path are read from that folder alone (indexing lm-eval's ~15,000 YAMLs costs ~6 s),
    and a local task named like a registry one is the local one, as it is with the whole registry loaded."""
    import lm_eval.tasks

    from gptlab.interop.harness import _task_manager

    tasks = _task(tmp_path / "tasks")
    shadow = (tasks / "tiny_mc.yaml").read_text().replace("task: tiny_mc", "task: hellaswag")
    (tasks / "hellaswag.yaml").write_text(shadow)
    (tasks / "animals.yaml").write_text("group: animals\ntask:\n  - tiny_mc\n")
    manager = _task_manager(tasks, ["tiny_mc", "hellaswag"])
    assert sorted(manager.all_subtasks) == ["hellaswag", "tiny_mc"]  # the folder's, not lm-eval's registry
    loaded = lm_eval.tasks.get_task_dict(["hellaswag"], manager)
    assert [t.config.dataset_path for t in loaded.values()] == ["json"]  # the local YAML, not the Hub's hellaswag

    built = []

    class Recording(lm_eval.tasks.TaskManager):
        def __init__(self, *args, **kwargs):
            built.append(kwargs.get("include_defaults", True))
            if built[-1]:
                raise RuntimeError("the whole registry")  # what a group or an unknown name needs: not built here
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", Recording)
    for asked in (["animals"], ["tiny_mc", "arc_easy"]):  # a group, a task outside the folder: the whole registry
        built.clear()
        with pytest.raises(RuntimeError, match="the whole registry"):
            _task_manager(tasks, asked)
        assert built == [False, True], asked


def test_missing_extra_is_one_line(monkeypatch):
    from gptlab.interop import harness
    from gptlab.util import extras

    monkeypatch.setattr(extras, "missing", lambda module: module == "lm_eval")
    with pytest.raises(ConfigError, match=r"needs the 'lm_eval' package.*pip install 'gptlab\[eval\]'"):
        harness.evaluate(Path("anything"), ["tiny_mc"])


# ---- gptlab-compare: eval columns with seed statistics ----


def _eval_json(run: Path, acc: float, **entry) -> None:
    task = {"metrics": {"acc": acc, "acc_stderr": 0.1}, "step": 100, "samples": 16, "num_fewshot": 0, "limit": None}
    task |= {"version": 1, "config_sha256": "abc", "lm_eval": "0.4.13", "prefix_token_id": 10} | entry
    (run / "eval.json").write_text(json.dumps({"format": 1, "tasks": {"tiny_mc": task}}))


def _sweep(tmp_path: Path, accs: dict[str, list[float]]) -> Path:
    specs = [dict(seed=i) for i in range(len(accs["mha"]))]
    specs += [dict(seed=i, choices={"attention": "gqa"}) for i in range(len(accs["gqa"]))]
    sweep = write_sweep(tmp_path / "sweeps" / "attn", specs)
    runs = sorted((p for p in sweep.iterdir() if p.is_dir()), key=lambda p: p.name)
    for run, acc in zip(runs, [*accs["mha"], *accs["gqa"]]):
        _eval_json(run, acc)
    return sweep


def _compare(tmp_path, capsys, sweep) -> tuple[dict, str]:
    from gptlab.cli.compare import main

    assert main([str(sweep), "--out", str(tmp_path / "out"), "--no-wandb"]) == 0
    out = capsys.readouterr()
    return json.loads((tmp_path / "out" / "comparison.json").read_text()), out.out + out.err


def test_compare_shows_eval_metrics_with_seed_statistics(tmp_path, capsys):
    accs = {"mha": [0.25, 0.30, 0.28], "gqa": [0.60, 0.65, 0.62]}
    doc, printed = _compare(tmp_path, capsys, _sweep(tmp_path, accs))
    (row,) = doc["evals"]  # acc only: the per-run stderr is not pooled
    assert row["metric"] == "eval/tiny_mc/acc"
    base, gqa = row["cells"]
    assert base["label"] == "attention=mha" and gqa["label"] == "attention=gqa, attention.n_kv_head=2"
    assert base["mean"] == pytest.approx(statistics.mean(accs["mha"]))
    assert base["std"] == pytest.approx(statistics.stdev(accs["mha"]))
    assert gqa["delta"] == pytest.approx(statistics.mean(accs["gqa"]) - statistics.mean(accs["mha"]))
    assert gqa["verdict"]["p"] == pytest.approx(stats.welch_test(accs["gqa"], accs["mha"]).p)
    assert gqa["verdict"]["status"] == "decided" and gqa["verdict"]["direction"] == 1
    assert "eval/tiny_mc/acc" in printed
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "## Downstream evals" in md and "eval/tiny_mc/acc" in md


@pytest.mark.parametrize(
    ("entry", "named"),
    [({"limit": 8}, "different limit"), ({"num_fewshot": 5}, "different num_fewshot"), ({"step": 50}, "at step 50")],
)
def test_compare_never_pools_evals_measured_differently(tmp_path, capsys, entry, named):
    sweep = _sweep(tmp_path, {"mha": [0.25, 0.30], "gqa": [0.60, 0.65]})
    runs = sorted((p for p in sweep.iterdir() if p.is_dir()), key=lambda p: p.name)
    _eval_json(runs[-1], 0.65, **entry)
    doc, printed = _compare(tmp_path, capsys, sweep)
    assert "evals" not in doc
    assert any(named in w and "eval/tiny_mc" in w for w in doc["warnings"]), doc["warnings"]


def test_compare_refuses_a_damaged_eval_json(tmp_path, capsys):
    from gptlab.cli.compare import main

    sweep = _sweep(tmp_path, {"mha": [0.25, 0.30], "gqa": [0.60, 0.65]})
    run = sorted(p for p in sweep.iterdir() if p.is_dir())[0]
    _eval_json(run, "high")  # type: ignore[arg-type]
    assert main([str(sweep), "--out", str(tmp_path / "out"), "--no-wandb"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and "eval.json: task tiny_mc acc='high' is not a number" in err


def test_gptlab_eval_refuses_a_run_still_training(tmp_path):
    import fcntl
    import os

    from gptlab.interop import harness

    run = tmp_path / "run"
    run.mkdir()
    fd = os.open(run / ".gptlab.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # what a live gptlab-train holds
        with pytest.raises(ConfigError, match=r"a gptlab-train is running in it"):
            harness.evaluate(run, ["tiny_mc"])
    finally:
        os.close(fd)
    assert not (run / "eval.json").exists()
