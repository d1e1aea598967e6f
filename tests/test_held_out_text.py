"""A data.val_sets entry is checked against the text the run trains on by content, not by file: the bundled corpus,
any stretch of it, or a prefix of a data=text file is refused in one line naming the set; honest held-out text passes.

Before, only a whole training file (by path or by the file's hash) was refused: a val set holding the first half of
the training file, or a slice of the bundled corpus, was scored as if held out.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptlab.data.shakespeare import ShakespeareData, load_shakespeare_text
from gptlab.data.text import TextData
from gptlab.errors import ConfigError
from helpers.train import TINY, run_inprocess

WORDS = (
    "river lantern copper window orbit velvet engine meadow signal harbor puzzle crystal thunder garden "
    "ladder marble pocket rocket silver tunnel violet wander yellow zephyr anchor basket candle dolphin"
).split()
CORPUS = load_shakespeare_text()
SETTINGS = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _honest(rng: np.random.Generator, words: int) -> str:
    """Prose no corpus holds: random words from a list the plays never string together."""
    return " ".join(rng.choice(WORDS, words)) + ".\n"


def _refusal(name: str, source: str) -> str:
    return rf"^data\.val_sets\.{name}: \d+% of its 32-token passages occur in the training text \({source}\); allowed"


@SETTINGS
@given(start=st.integers(0, len(CORPUS) - 20_000), length=st.integers(1_000, 20_000), honest=st.integers(0, 400))
def test_any_stretch_of_the_bundled_corpus_is_refused_as_a_val_set(tmp_path_factory, start, length, honest):
    """A slice of the training text, even padded with honest prose up to a fifth of it, is refused."""
    tmp = tmp_path_factory.mktemp("stretch")
    piece = CORPUS[start : start + length]
    if start + length > len(CORPUS) * 0.9:  # the corpus's own val tail is not training text: keep to the train split
        piece = CORPUS[: len(piece)]
    text = piece + _honest(np.random.default_rng(start), min(honest, length // 40))
    (tmp / "held.txt").write_text(text)
    with pytest.raises(ConfigError, match=_refusal("held", "the bundled corpus, data=shakespeare")) as err:
        ShakespeareData(seed=1, block_size=32, cache_dir=tmp_path_factory.getbasetemp() / "cache",
                        val_sets=[{"name": "held", "paths": [str(tmp / "held.txt")]}])  # fmt: skip
    assert "\n" not in str(err.value)


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), words=st.integers(200, 3_000))
def test_honest_held_out_text_passes(tmp_path_factory, seed, words):
    tmp = tmp_path_factory.mktemp("honest")
    (tmp / "held.txt").write_text(_honest(np.random.default_rng(seed), words))
    data = ShakespeareData(seed=1, block_size=32, cache_dir=tmp_path_factory.getbasetemp() / "cache",
                           val_sets=[{"name": "held", "paths": [str(tmp / "held.txt")]}])  # fmt: skip
    assert [s.name for s in data.val_sets] == ["held"]


def test_a_prefix_of_a_training_file_is_refused_before_any_run_file(tmp_path):
    """data=text, the val set the first half of the (only) training file: refused naming the set, nothing written."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS[:200_000])
    (tmp_path / "half.txt").write_text(CORPUS[:100_000])
    (tmp_path / "other.txt").write_text(_honest(np.random.default_rng(0), 2_000))
    sets = f"data.val_sets=[{{name: other, paths: ['{tmp_path}/other.txt']}}, {{name: half, paths: ['{tmp_path}/half.txt']}}]"
    run = tmp_path / "run"
    with pytest.raises(ConfigError, match=_refusal("half", "data.paths")):
        run_inprocess(run, *TINY, "data=text", f"data.paths=[{corpus}]", "data.tokenizer=char", sets, steps=1)
    assert not run.exists() or not any(run.iterdir())
    data = TextData(seed=1, block_size=32, cache_dir=tmp_path / "cache", paths=[str(corpus)], tokenizer="char",
                    val_sets=[{"name": "other", "paths": [str(tmp_path / "other.txt")]}])  # fmt: skip
    assert [s.name for s in data.val_sets] == ["other"]


@settings(max_examples=50, deadline=None)
@given(
    a=st.lists(st.integers(0, 3), min_size=1, max_size=300),
    b=st.lists(st.integers(0, 3), min_size=0, max_size=300),
    k=st.integers(1, 40),
)
def test_the_shared_fraction_is_the_share_of_distinct_passages_found(a, b, k):
    """Against a plain set of tuples: the hashed, chunked count is exact on small streams."""
    from gptlab.data.overlap import shared_fraction  # new with the check: the tests above fail on the old code alone

    k = min(k, len(a))
    mine = {tuple(a[i : i + k]) for i in range(len(a) - k + 1)}
    theirs = {tuple(b[i : i + k]) for i in range(len(b) - k + 1)}
    assert shared_fraction(np.array(a), np.array(b, dtype=np.int64), k) == pytest.approx(len(mine & theirs) / len(mine))
