"""data.val_sets: named extra validation sets, each scored at every eval as val/<name>/loss.

A real short run with two sets (prose and code-like text) logs both at every eval in metrics.jsonl and in the offline
W&B run, records them in summary.json, and each logged loss equals the saved checkpoint evaluated independently on
that set's windows; a resume with other sets, or an edited set file, is refused; bad sets are one line each, before
anything is written; a set read as a hub dataset (a local dataset folder) holds the tokens its files would.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gptlab.config.build import build_model, compose
from gptlab.data.streams import indexed_ints
from gptlab.data.val_sets import STREAM
from gptlab.errors import ConfigError
from gptlab.state import checkpoint, resume
from gptlab.state.rundir import saved_tokenizer
from helpers.cli import run_cli
from helpers.train import TINY, rows, run_inprocess, train_env

PROSE = "It was a bright cold day in April, and the clocks were striking thirteen. " * 40
CODE = "def area(r):\n    return 3.14159 * r ** 2  # the circle's area\n\nfor i in range(10):\n    print(i)\n" * 30
CORPUS = "The quick brown fox jumps over the lazy dog while the cat sleeps by the fire.\n" * 300


def _files(tmp: Path) -> dict[str, Path]:
    paths = {"corpus": tmp / "corpus.txt", "prose": tmp / "prose.txt", "code": tmp / "code.txt"}
    for name, text in (("corpus", CORPUS), ("prose", PROSE), ("code", CODE)):
        paths[name].write_text(text)
    return paths


def _sets(files: dict[str, Path], code_sequences: int = 4) -> str:
    return (
        f"data.val_sets=[{{name: prose, paths: ['{files['prose']}']}}, "
        f"{{name: code, paths: ['{files['code']}'], sequences: {code_sequences}}}]"
    )


def _args(files: dict[str, Path]) -> list[str]:
    return [*TINY, "data=text", f"data.paths=[{files['corpus']}]", "data.tokenizer=char", _sets(files)]


def _train(run: Path, files: dict[str, Path], *extra: str, steps: int = 4) -> dict:
    return run_inprocess(run, *_args(files), *extra, steps=steps, eval_interval=2)


def _checkpoint(run: Path, args: list[str]):
    """(the model with the run's newest checkpoint's weights, in eval mode; the tokenizer the run saved; its step)."""
    state = checkpoint.load_latest(run, resume=False)
    tokenizer = saved_tokenizer(run, state["identity"]["data"])
    model = build_model(compose(args), vocab_size=tokenizer.vocab_size)
    resume.load_weights(model, None, state)
    return model.eval(), tokenizer, int(state["step"])


def _independent_loss(model, tokenizer, text: str, data_seed: int, count: int, T: int) -> float:
    """The checkpoint's mean loss on a set's fixed windows, computed here from the file's text: its tokens, the
    window starts (the set's own stream of data_seed) and the cross-entropy over every scored token."""
    tokens = np.asarray(tokenizer.encode(text), dtype=np.int64)  # a .txt is one document; char has no end token
    starts = indexed_ints(data_seed, STREAM, np.arange(count), len(tokens) - T)
    window = torch.from_numpy(tokens[starts[:, None] + np.arange(T + 1)])  # (count, T+1)
    with torch.no_grad():
        logits, _ = model(window[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), window[:, 1:].reshape(-1)).item()


def test_each_val_set_is_logged_at_every_eval_and_is_the_checkpoints_loss_on_its_windows(tmp_path):
    from helpers.wandb_read import history, inspect_records

    files = _files(tmp_path)
    run = tmp_path / "run"
    summary = _train(run, files, "logger=wandb")
    evals = [r for r in rows(run) if "val/loss" in r]
    assert [r["step"] for r in evals] == [0, 2, 4]
    for row in evals:  # every eval row has both sets, beside the pooled val loss
        assert {"val/prose/loss", "val/code/loss"} <= set(row)
    last = evals[-1]
    assert last["val/prose/loss"] != last["val/code/loss"]  # two different sets, two different numbers

    written = json.loads((run / "summary.json").read_text())["val_sets"]
    assert written == summary["val_sets"]
    assert written["prose"]["final_loss"] == last["val/prose/loss"]
    assert written["code"]["final_loss"] == last["val/code/loss"]
    assert (written["prose"]["sequences"], written["code"]["sequences"]) == (8, 4)  # train.eval_sequences; its own
    assert written["prose"]["tokens"] == len(PROSE) and written["code"]["tokens"] == len(CODE)  # char: one per char
    assert written["prose"]["fingerprint"] != written["code"]["fingerprint"]

    model, tokenizer, step = _checkpoint(run, _args(files))
    assert step == 4
    for name, source in (("prose", PROSE), ("code", CODE)):
        want = _independent_loss(model, tokenizer, source, 1337, written[name]["sequences"], 32)
        torch.testing.assert_close(last[f"val/{name}/loss"], want, rtol=1e-5, atol=1e-5)

    (offline,) = sorted((run / "wandb").glob("offline-run-*"))
    logged = [h for h in history(inspect_records(offline)) if "val/code/loss" in json.dumps(h)]
    assert len(logged) == 3, "val/<name>/loss missing from the W&B history"
    assert json.dumps(last["val/code/loss"])[:8] in json.dumps(logged[-1])  # the value itself, not only the key


def test_a_resume_with_other_val_sets_or_an_edited_set_is_refused(tmp_path):
    files = _files(tmp_path)
    run = tmp_path / "run"
    _train(run, files, "logger=none", steps=2)
    fewer = [*_args(files)[:-1], f"data.val_sets=[{{name: prose, paths: ['{files['prose']}']}}]"]  # one set fewer
    with pytest.raises(ConfigError) as other:
        run_inprocess(run, *fewer, "logger=none", steps=2, eval_interval=2)
    assert "train.resume" in str(other.value) and "data.val_sets=" in str(other.value)
    files["code"].write_text(CODE.replace("circle", "square"))  # the same config, an edited file
    with pytest.raises(ConfigError) as edited:
        _train(run, files, "logger=none", steps=2)
    assert "data.val_sets fingerprints" in str(edited.value) and "\n" not in str(edited.value)


def _bad(tmp: Path) -> list[tuple[str, str, str]]:
    """(val_sets override, what the error names, what it says)."""
    ok = tmp / "ok.txt"
    ok.write_text(PROSE)
    (tmp / "empty.txt").write_text("")
    return [
        (f"[{{name: code, paths: ['{tmp}/missing.txt']}}]", "data.val_sets.code.paths", "no file matches"),
        ("[{name: code, paths: []}]", "data.val_sets.code.paths", "no files given (an empty set)"),
        (f"[{{name: code, paths: ['{tmp}/empty.txt']}}]", "data.val_sets.code.paths", "is empty"),
        ("[{name: code}]", "data.val_sets.code", "no source; allowed: paths="),
        (f"[{{name: a, paths: ['{ok}']}}, {{name: a, paths: ['{ok}']}}]", "data.val_sets.a", "named twice"),
        (f"[{{name: 'my set', paths: ['{ok}']}}]", "data.val_sets.my set", "not a simple identifier; allowed:"),
        (f"[{{name: 2code, paths: ['{ok}']}}]", "data.val_sets.2code", "not a simple identifier; allowed:"),
        (f"[{{name: a, paths: ['{ok}'], split: test}}]", "data.val_sets.a.split", "allowed: name, paths, column"),
        (f"[{{name: a, paths: ['{ok}'], sequences: 0}}]", "data.val_sets.a.sequences=0", "must be >= 1"),
    ]


def test_bad_val_sets_are_one_line_each_before_anything_is_written(tmp_path):
    for i, (value, key, says) in enumerate(_bad(tmp_path)):
        run = tmp_path / f"r{i}"
        with pytest.raises(ConfigError) as err:
            run_inprocess(run, *TINY, f"data.val_sets={value}", "logger=none", steps=1, eval_interval=1)
        text = str(err.value)
        assert text.startswith(f"{key}:") or text.startswith(f"{key} "), text
        assert says in text and "\n" not in text, text
        assert not any(run.iterdir()), f"{value}: wrote {sorted(p.name for p in run.iterdir())}"


def test_the_cli_refuses_a_missing_val_set_file_in_one_line_and_leaves_no_run_dir(tmp_path):
    run = tmp_path / "run"
    proc = run_cli(
        "gptlab.cli.train",
        *TINY,
        "logger=none",
        "train.max_steps=1",
        f"data.val_sets=[{{name: code, paths: ['{tmp_path}/missing.txt']}}]",
        f"hydra.run.dir={run}",
        cwd=tmp_path,
        env=train_env(),
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: data.val_sets.code.paths: no file matches '{tmp_path}/missing.txt'"
    ]
    assert not run.exists()


APART = "allowed: files apart from the training corpus (a val set scores text the model never trained on)"


def test_a_val_set_of_the_training_files_is_refused_in_one_line(tmp_path):
    """A named set that is the training corpus (by path, or a copy of it by content) would score windows the model
    trained on: refused, naming the set and the file, before anything is written."""
    from gptlab.data.text import TextData

    files = _files(tmp_path)
    copy = tmp_path / "copy" / "corpus.txt"
    copy.parent.mkdir()
    copy.write_text(CORPUS)
    train = [*TINY, "data=text", f"data.paths=[{files['corpus']}]", "data.tokenizer=char", "logger=none"]
    same = (
        f"data.val_sets=[{{name: prose, paths: ['{files['prose']}']}}, {{name: heldout, paths: ['{tmp_path}/c*.txt']}}]"
    )
    run = tmp_path / "r"
    with pytest.raises(ConfigError) as err:
        run_inprocess(run, *train, same, steps=1, eval_interval=1)
    corpus = files["corpus"].resolve()
    assert str(err.value) == f"data.val_sets.heldout.paths: {corpus} is a training file (data.paths); {APART}"
    assert not run.exists() or not any(run.iterdir())
    with pytest.raises(ConfigError) as err:  # a copy elsewhere: the same bytes, found by content when data is built
        TextData(seed=1, block_size=8, cache_dir=tmp_path / "cache", paths=[str(files["corpus"])], tokenizer="char",
                 val_sets=[{"name": "heldout", "paths": [str(copy)]}])  # fmt: skip
    assert str(err.value) == (
        f"data.val_sets.heldout.paths: {copy.resolve()} has the content of training file {corpus} (data.paths); {APART}"
    )


def test_a_val_set_reading_training_text_as_a_dataset_is_refused(tmp_path):
    """The training file given as a local dataset folder (`dataset:`), or the training hub dataset's own split: both
    were accepted, and 59 of 64 windows of such a set occurred verbatim in the train split. Another split of the
    same folder stays allowed."""
    from gptlab.data.hf import HFData
    from gptlab.data.text import TextData

    folder = tmp_path / "corpus"
    folder.mkdir()
    rows = [PROSE[i : i + 300] for i in range(0, 1200, 300)]
    (folder / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in rows))
    (folder / "test.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in [CODE[:400], CODE[400:800]]))
    train = folder / "train.jsonl"
    common = dict(seed=1, block_size=8, cache_dir=tmp_path / "cache", tokenizer="char")
    with pytest.raises(ConfigError) as err:
        TextData(**common, paths=[str(train)], val_sets=[{"name": "held", "dataset": str(folder)}])
    assert str(err.value) == f"data.val_sets.held.dataset: {train.resolve()} is a training file (data.paths); {APART}"
    fine = TextData(**common, paths=[str(train)], val_sets=[{"name": "held", "dataset": str(folder), "split": "test"}])
    assert [s.name for s in fine.val_sets] == ["held"]
    with pytest.raises(ConfigError) as err:
        HFData(**common, name=str(folder), val_sets=[{"name": "held", "dataset": str(folder)}])
    assert str(err.value) == (
        f"data.val_sets.held.dataset: {folder} (config None, split train) is the training data (data.name, "
        "data.config_name, data.split); allowed: another split or dataset (a val set scores text the model never "
        "trained on)"
    )


def test_val_sets_need_a_text_data_choice(tmp_path):
    sets = f"+data.val_sets=[{{name: a, paths: ['{tmp_path}']}}]"
    with pytest.raises(ConfigError, match=r"^data\.val_sets: not a key of this data choice \(AssocRecallData\)"):
        run_inprocess(tmp_path / "r", "data=assoc_recall", sets, steps=1, eval_interval=1)


def test_a_hub_dataset_set_holds_the_same_tokens_as_its_files(tmp_path):
    from gptlab.data.tokenizers import CharTokenizer
    from gptlab.data.val_sets import open_val_sets

    folder = tmp_path / "held_out"
    folder.mkdir()
    lines = [PROSE[:200], CODE[:300], PROSE[100:400]]
    (folder / "rows.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
    tok = CharTokenizer(CORPUS)  # another corpus's vocabulary: the run's own tokenizer, never fitted on the set
    hub, files = open_val_sets(
        [{"name": "hub", "dataset": str(folder)}, {"name": "files", "paths": [str(folder / "rows.jsonl")]}],
        tok,
        seed=1337,
        block_size=32,
        cache_dir=tmp_path / "cache",
    )
    assert np.array_equal(np.asarray(hub.tokens[: len(hub.tokens)]), np.asarray(files.tokens[: len(files.tokens)]))
    assert len(hub.tokens) == sum(map(len, lines)) and hub.fingerprint != files.fingerprint  # other sources
    assert torch.equal(hub.samples(4)[0], files.samples(4)[0])  # windows: a function of the tokens and data_seed
