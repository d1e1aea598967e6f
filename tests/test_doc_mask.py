"""data.doc_mask: packed documents attend only within themselves, with positions restarting at each, for every kernel,
position and attention choice; the default path is today's bit for bit; the boundaries come from the data (the
bundled corpus's works, a folder's files, a dataset's rows) without changing x, y or the token cache; training,
eval, resume, timing and the cost model carry the mask."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from gptlab.config.build import compose, plain_config
from gptlab.costs.documents import document_pairs, documents_cost
from gptlab.costs.scores import blocked_pairs, useful_pairs
from gptlab.costs.structure import describe
from gptlab.data.documents import DOCUMENTS_FILE, count_document_starts
from gptlab.data.hf import HFData
from gptlab.data.shakespeare import ShakespeareData, load_shakespeare_text, work_starts
from gptlab.data.text import TextData
from gptlab.errors import ConfigError
from gptlab.model.attention.kernels import check_impl
from gptlab.model.base import KVCache
from gptlab.model.documents import Documents, positions_in_documents
from gptlab.state.resume import differences
from gptlab.train import prefetch
from gptlab.train.loop import evaluate
from helpers.model import TINY as TINY_MODEL
from helpers.model import choices, tiny_model, tokens
from helpers.train import TINY, rows, run_inprocess

POSITIONS = choices("position")
KERNELS = ("naive", "sdpa", "flex")  # flex runs forward-only on this CPU: every check here is a forward
ATTENTION = {
    "mha": [],
    "gqa": ["attention=gqa", "attention.n_kv_head=2"],
    "sliding": ["attention=sliding", "attention.window=5"],
}


@pytest.fixture(autouse=True)
def _quiet_flex():
    with warnings.catch_warnings():  # flex uncompiled on CPU says it materialises the scores: that is the point here
        warnings.filterwarnings("ignore", message=".*flex_attention.*")
        yield


def packed_ids() -> torch.Tensor:
    """(2, 24) document ids: row 0 holds two documents (the second from position 10), row 1 three (3 and 15)."""
    ids = torch.zeros(2, 24, dtype=torch.int32)
    ids[0, 10:] = 1
    ids[1, 3:], ids[1, 15:] = 1, 2
    return ids


def model_for(kernel: str, position: str, attention: str):
    return tiny_model(f"position={position}", f"attention.impl={kernel}", *ATTENTION[attention])


# 1. isolation ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("attention", list(ATTENTION))
@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_a_packed_document_gives_the_logits_it_gives_alone(kernel, position, attention):
    model, x, ids = model_for(kernel, position, attention), tokens(2, 24), packed_ids()
    with torch.no_grad():
        packed, _ = model(x, docs=ids)
        for b in range(2):
            for d in ids[b].unique():
                where = (ids[b] == d).nonzero().flatten()  # the document's positions in the window
                alone, _ = model(x[b : b + 1, where])  # the same tokens as a sequence of their own
                torch.testing.assert_close(packed[b, where], alone[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attention", choices("attention"))
def test_every_attention_choice_keeps_documents_apart(attention):
    """Every conf/attention choice (a new one too: found by globbing), on the default kernel, its window shortened."""
    windowed = compose([*TINY_MODEL, f"attention={attention}"]).attention.get("window") is not None
    extra = ["attention.window=4", "attention.global_layers=[1]"] if windowed else []
    model, x, ids = tiny_model(f"attention={attention}", *extra), tokens(2, 24), packed_ids()
    with torch.no_grad():
        packed, _ = model(x, docs=ids)
        alone, _ = model(x[1:2, 3:15])
    torch.testing.assert_close(packed[1, 3:15], alone[0], rtol=1e-4, atol=1e-5)


def test_positions_restart_at_every_document():
    pos = positions_in_documents(packed_ids())
    assert pos[0].tolist() == [*range(10), *range(14)]
    assert pos[1].tolist() == [*range(3), *range(12), *range(9)]


def test_the_mask_is_causal_windowed_and_within_one_document():
    docs = Documents(packed_ids(), position=None)
    ok = docs.allowed(window=3)  # (B, 1, T, T)
    assert ok.shape == (2, 1, 24, 24) and docs.allowed(window=3) is ok  # built once per forward
    q, k = torch.meshgrid(torch.arange(24), torch.arange(24), indexing="ij")
    ids = packed_ids()
    for b in range(2):
        want = (k <= q) & (k > q - 3) & (ids[b][q] == ids[b][k])
        assert torch.equal(ok[b, 0], want)


# 2. masked vs unmasked ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("position", ["rope", "alibi", "learned"])
def test_the_mask_changes_only_what_follows_a_boundary(kernel, position):
    model, x = model_for(kernel, position, "mha"), tokens(2, 24)
    one = torch.zeros(2, 24, dtype=torch.int32)  # a window inside one document
    two = torch.zeros(2, 24, dtype=torch.int32)
    two[:, 12:] = 1  # a window across a boundary at 12
    with torch.no_grad():
        plain, _ = model(x)
        inside, _ = model(x, docs=one)
        across, _ = model(x, docs=two)
    torch.testing.assert_close(inside, plain, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(across[:, :12], plain[:, :12], rtol=1e-5, atol=1e-6)
    assert (across[:, 12:] - plain[:, 12:]).abs().amax(-1).min() > 1e-4  # every position after it changed


def test_generation_is_one_document_and_takes_no_document_ids():
    model, x = tiny_model(), tokens(1, 8)
    with pytest.raises(ValueError, match="generation is one document"):
        model(x, caches=[KVCache() for _ in model.blocks], docs=torch.zeros(1, 8, dtype=torch.int32))
    out = model.generate(x, 4, temperature=0)  # the KV-cache path as always
    assert out.shape == (1, 12)


def test_flash_is_refused_with_the_document_mask_in_one_line():
    with pytest.raises(ConfigError, match=r"^attention.impl=flash: .*document mask of data.doc_mask=true; use"):
        check_impl(
            "flash", device="cpu", dtype=torch.float32, window=None, uses_bias=False, dropout=0.0, documents=True
        )


# 3. the default path is today's ------------------------------------------------------------------------------------


def test_position_hooks_give_todays_bits_for_absolute_positions():
    """The hooks that learned to take (B, T) positions compute (T,) ones with today's formulas, bit for bit."""
    pos = torch.arange(37)
    rope = tiny_model("position=rope").position
    q = torch.randn(2, 4, 37, 8)
    angles = pos.float()[:, None] * rope.inv_freq[None, :]  # the formula before data.doc_mask
    want = rope._rotate(q, angles.cos(), angles.sin())
    assert torch.equal(rope.rotate(q, q, pos)[0], want)
    sin = tiny_model("position=sinusoidal").position
    half = torch.arange(0, sin.d_model, 2, dtype=torch.float32)
    angles = pos.float()[:, None] * torch.exp(-math.log(sin.base) * half / sin.d_model)[None, :]
    assert torch.equal(sin.table(pos, torch.float32), torch.stack([angles.sin(), angles.cos()], -1).flatten(1))
    alibi = tiny_model("position=alibi").position
    distance = (pos[:, None] - pos[None, :]).clamp(min=0).float()
    assert torch.equal(alibi.score_bias(pos, pos), -alibi.slopes[:, None, None] * distance)


def test_without_the_key_and_with_false_train_the_same_curve_bit_for_bit(tmp_path):
    """A run composed without data.doc_mask and one with false: equal losses, equal batches (x, y pairs only)."""
    assert "doc_mask" in compose([]).data and compose([]).data.doc_mask is False
    without = run_inprocess(tmp_path / "without", "~data.doc_mask", *TINY, steps=4, eval_interval=2)
    off = run_inprocess(tmp_path / "off", "data.doc_mask=false", *TINY, steps=4, eval_interval=2)
    curve = [(r["step"], r.get("train/loss"), r.get("val/loss")) for r in rows(tmp_path / "without")]
    assert curve == [(r["step"], r.get("train/loss"), r.get("val/loss")) for r in rows(tmp_path / "off")]
    assert without["final_val_loss"] == off["final_val_loss"]


# 4. the data -------------------------------------------------------------------------------------------------------


def test_shakespeare_records_its_nine_works_and_keeps_x_y(tmp_path):
    text = load_shakespeare_text()
    starts = work_starts(text)
    assert len(starts) == 9 and starts[0] == 0 and all(text[s - 2 : s] == "\n\n" for s in starts[1:])
    plain = ShakespeareData(seed=0, block_size=32, cache_dir=tmp_path)
    index = (plain.cache_path / "index.json").read_bytes()
    masked = ShakespeareData(seed=0, block_size=32, cache_dir=tmp_path, doc_mask=True)  # an entry from before: kept
    assert masked.from_cache and (masked.cache_path / "index.json").read_bytes() == index
    assert masked.fingerprint == plain.fingerprint and not plain.doc_mask and masked.doc_mask
    recorded = np.load(masked.cache_path / DOCUMENTS_FILE)
    assert recorded.tolist() == list(starts)  # char tokenizer: one token per character
    for a, b in zip(plain.train_samples(7, 16), masked.train_samples(7, 16)):
        assert torch.equal(a, b)
    for a, b in zip(plain.val_samples(8), masked.val_samples(8)):
        assert torch.equal(a, b)
    assert masked.val_starts.tolist() == [0, starts[-1] - len(masked.train_tokens)]  # Twelfth Night starts in val


def test_gpt2_tokens_of_a_work_start_at_its_title(tmp_path):
    d = ShakespeareData(seed=0, block_size=32, cache_dir=tmp_path, tokenizer="gpt2", doc_mask=True)
    stream = np.concatenate([np.asarray(d.train_tokens), np.asarray(d.val_tokens)])
    starts = np.load(d.cache_path / DOCUMENTS_FILE)
    titles = [d.tokenizer.decode(stream[s : s + 20].tolist()) for s in starts]
    assert len(starts) == 9 and all("\n\nby William Shakespeare" in t for t in titles)
    assert all(d.tokenizer.decode(stream[s - 2 : s].tolist()).endswith("\n") for s in starts[1:])


def write_docs(folder, n=12):
    """n short documents as .txt files: each shorter than a 32-token window, so windows cross boundaries."""
    folder.mkdir(parents=True, exist_ok=True)
    docs = [f"Document {i}: " + " ".join(f"word{i}{j}" for j in range(3 + i % 5)) + "\n" for i in range(n)]
    for i, doc in enumerate(docs):
        (folder / f"doc{i:02d}.txt").write_text(doc)
    return docs


@pytest.mark.parametrize("tokenizer", ["byte", "gpt2"])
def test_text_records_each_file_as_a_document(tmp_path, tokenizer):
    docs = write_docs(tmp_path / "docs")
    kw = dict(seed=0, block_size=16, cache_dir=tmp_path / "c", paths=[str(tmp_path / "docs" / "*.txt")])
    plain = TextData(**kw, tokenizer=tokenizer, val_fraction=0.2)
    masked = TextData(**kw, tokenizer=tokenizer, val_fraction=0.2, doc_mask=True)
    tok = masked.tokenizer
    lengths = [len(tok.encode(d)) + (tok.eot_id is not None) for d in docs]
    assert np.load(masked.cache_path / DOCUMENTS_FILE).tolist() == [0, *np.cumsum(lengths)[:-1].tolist()]
    x, y = masked.train_samples(0, 64)
    assert all(torch.equal(a, b) for a, b in zip((x, y), plain.train_samples(0, 64)))
    ids = masked.train_documents(0, 64)  # (64, 16): +1 exactly where a file starts
    first = torch.from_numpy(prefetch_starts(masked, 64))
    boundary = np.isin(first[:, None] + torch.arange(16), masked.train_starts)
    assert torch.equal(torch.diff(ids, dim=1) == 1, torch.from_numpy(boundary[:, 1:]))
    assert ids.dtype == torch.int32 and int(ids[:, 0].abs().sum()) == 0 and (ids.max(1).values > 0).any()


def prefetch_starts(data, count: int) -> np.ndarray:
    from gptlab.data.lm import window_starts

    return window_starts(data.train_tokens, data.seed, "train", 0, count, data.seq_len)


def test_hf_records_each_row_and_a_cache_hit_then_loads_nothing(tmp_path, monkeypatch):
    import datasets

    folder = tmp_path / "ds"
    folder.mkdir()
    rows_ = [f"row {i}: " + "alpha beta " * (1 + i % 4) for i in range(40)]
    (folder / "train.jsonl").write_text("".join(json.dumps({"body": r}) + "\n" for r in rows_))
    kw = dict(seed=0, block_size=16, cache_dir=tmp_path / "c", name=str(folder), column="body", tokenizer="gpt2")
    plain, masked = HFData(**kw, val_fraction=0.1), HFData(**kw, val_fraction=0.1, doc_mask=True)
    stream = np.concatenate([np.asarray(masked.train_tokens), np.asarray(masked.val_tokens)])
    after_eot = (np.flatnonzero(stream == 50256) + 1)[:-1]  # each row ends with <|endoftext|>
    assert np.load(masked.cache_path / DOCUMENTS_FILE).tolist() == [0, *after_eot.tolist()]
    assert torch.equal(plain.val_samples(4)[0], masked.val_samples(4)[0])

    def refuse(*a, **k):
        raise AssertionError("a token-cache hit with its documents recorded loaded the dataset")

    monkeypatch.setattr(datasets, "load_dataset", refuse)
    again = HFData(**kw, val_fraction=0.1, doc_mask=True)
    assert again.from_cache and np.array_equal(again.train_starts, masked.train_starts)


def test_a_validation_set_carries_its_own_document_ids(tmp_path):
    write_docs(tmp_path / "train")
    (tmp_path / "held").mkdir()
    held = [f"Quite another text, number {i}, " + "zebra " * (i + 2) + "\n" for i in range(6)]
    for i, doc in enumerate(held):
        (tmp_path / "held" / f"h{i}.txt").write_text(doc)
    kw = dict(seed=0, block_size=8, cache_dir=tmp_path / "c", paths=[str(tmp_path / "train" / "*.txt")])
    sets = [{"name": "held", "paths": [str(tmp_path / "held" / "*.txt")]}]
    plain = TextData(**kw, tokenizer="byte", val_sets=sets).val_sets[0]
    masked = TextData(**kw, tokenizer="byte", val_sets=sets, doc_mask=True).val_sets[0]
    assert len(plain.samples(4)) == 2 and plain.fingerprint == masked.fingerprint
    x, y, ids = masked.samples(4)
    assert all(torch.equal(a, b) for a, b in zip((x, y), plain.samples(4)))
    assert masked.documents.tolist() == [0, *np.cumsum([len(d) for d in held])[:-1].tolist()]
    assert ids.shape == x.shape and int(ids[:, 0].abs().sum()) == 0


def test_a_capped_stream_keeps_the_starts_inside_it_and_a_changed_source_is_refused(tmp_path):
    write_docs(tmp_path / "docs", n=30)
    kw = dict(seed=0, block_size=8, cache_dir=tmp_path / "c", paths=[str(tmp_path / "docs" / "*.txt")])
    capped = TextData(**kw, tokenizer="byte", max_tokens=300, doc_mask=True)
    starts = np.load(capped.cache_path / DOCUMENTS_FILE)
    assert starts[-1] < 300 and len(starts) > 5
    source = type("Short", (), {"segments": lambda self: iter([("abc", True)]), "document_starts": ()})()
    assert count_document_starts(source, capped.tokenizer)[1] == 3
    (capped.cache_path / DOCUMENTS_FILE).write_bytes(b"junk")
    with pytest.raises(ConfigError, match=r"^data.doc_mask: the token cache .* unreadable documents.npy"):
        TextData(**kw, tokenizer="byte", max_tokens=300, doc_mask=True)


def test_assoc_recall_refuses_the_key_in_one_line():
    """Each MQAR sequence is one document already: the key is not one of its keys (refused before anything runs)."""
    from gptlab.config.validate import validate

    with pytest.raises(ConfigError, match=r"^data.doc_mask: not a key of this data choice \(AssocRecallData\)"):
        validate(compose(["data=assoc_recall", "+data.doc_mask=true"]))
    with pytest.raises(ConfigError, match=r"^data.doc_mask='yes': expected true or false"):
        validate(compose(["data.doc_mask=yes"]))


# 5. through training -----------------------------------------------------------------------------------------------


def text_run(tmp_path, *extra: str):
    folder = tmp_path / "docs"
    if not folder.exists():
        write_docs(folder, n=40)
    return [
        *TINY,
        "data=text",
        f"data.paths=[{folder}/*.txt]",
        "data.tokenizer=byte",
        "model.vocab_size=256",
        *extra,
    ]


@pytest.mark.parametrize(
    "arm", [["position=rope"], ["position=alibi", "attention=sliding", "attention.window=8", "attention.impl=naive"]]
)
def test_training_with_the_mask_through_the_composed_config(tmp_path, arm):
    plain = run_inprocess(tmp_path / "plain", *text_run(tmp_path, *arm), steps=4, eval_interval=2)
    masked = run_inprocess(
        tmp_path / "masked", *text_run(tmp_path, *arm, "data.doc_mask=true"), steps=4, eval_interval=2
    )
    losses = {k: [r.get("train/loss") for r in rows(tmp_path / k) if "train/loss" in r] for k in ("plain", "masked")}
    assert all(math.isfinite(v) for v in losses["masked"]) and len(losses["masked"]) == 4
    assert losses["masked"][0] != losses["plain"][0]  # step 1's batch crosses documents: the mask changed its loss
    assert masked["final_val_loss"] != plain["final_val_loss"]  # val loss goes through the mask too
    assert masked["data_fingerprint"] == plain["data_fingerprint"]  # the same validation tokens


def test_probes_and_diagnostics_run_with_the_mask(tmp_path):
    """Probes build their own sequences (one document each) and still run; the diagnostics' scores follow the mask."""
    args = text_run(tmp_path, "data.doc_mask=true", "train.diagnostics=true", "probes=[induction,length]")
    run_inprocess(tmp_path / "run", *args, steps=2, eval_interval=2)
    last = rows(tmp_path / "run")
    probed = [r for r in last if "probe/induction/acc" in r]
    assert probed and all(0 <= r["probe/induction/acc"] <= 1 for r in probed)
    entropy = [v for r in last for k, v in r.items() if k.endswith("/attn/entropy")]
    assert entropy and all(math.isfinite(v) and v >= 0 for v in entropy)


def test_a_resume_under_another_doc_mask_is_refused(tmp_path):
    args = text_run(tmp_path, "train.ckpt_interval=2")
    run_inprocess(tmp_path / "run", *args, steps=2, eval_interval=2)
    with pytest.raises(ConfigError, match=r"data.doc_mask=False there, True here"):
        run_inprocess(tmp_path / "run", *args, "data.doc_mask=true", steps=4, eval_interval=2)


def test_a_checkpoint_from_before_the_key_resumes_and_one_with_it_does_not():
    now = plain_config(compose([]))
    before = {**now, "data": {k: v for k, v in now["data"].items() if k != "doc_mask"}}
    assert differences({"config": before}, {"config": now}, ()) == []
    masked = plain_config(compose(["data.doc_mask=true"]))
    assert differences({"config": before}, {"config": masked}, ()) == ["data.doc_mask=False there, True here"]


def test_the_batches_eval_and_timing_carry_the_document_ids(tmp_path, monkeypatch):
    """prefetch draws (x, y, ids); evaluate and the timing session's step (the loop's train_step) pass them on."""
    from gptlab.model.gpt import GPT
    from gptlab.train.bundle import build_bundle
    from gptlab.train.timing import timed_steps

    cfg = compose(text_run(tmp_path, "data.doc_mask=true"))
    from gptlab.config.validate import validate

    bundle = build_bundle(cfg, validate(cfg), tmp_path / "run", {})
    batches = prefetch.draw(bundle.data, 0, 4, 1, 0, 1, pin=False)
    assert len(batches) == 1 and len(batches[0]) == 3 and batches[0][2].shape == batches[0][0].shape
    seen: list = []
    forward = GPT.forward
    monkeypatch.setattr(GPT, "forward", lambda self, *a, **k: seen.append(k.get("docs")) or forward(self, *a, **k))
    timed_steps(bundle, warmup=1, steps=1)
    assert len(seen) == 2 and all(d is not None and d.shape == (4, 32) for d in seen)
    val = (*bundle.data.val_samples(4), bundle.data.val_documents(4))
    evaluate(bundle.model, val, 2, bundle.hardware, "cpu")
    assert len(seen) == 4 and all(d is not None for d in seen[2:])


# the cost model ----------------------------------------------------------------------------------------------------


def test_flex_saves_the_cross_document_tiles_and_dense_kernels_save_nothing():
    T = 1024
    for window in (None, 100):
        k, u = document_pairs(T, window, 10**9, skips_blocks=True)  # one document: today's figures
        assert (k, u) == (blocked_pairs(T, T, window), useful_pairs(T, T, window))
    k, u = document_pairs(T, None, 128, skips_blocks=True)
    assert u < 0.15 * useful_pairs(T, T, None) and k < 0.5 * blocked_pairs(T, T, None)
    assert document_pairs(T, None, 128, skips_blocks=False)[0] == T * T  # sdpa, naive: every score either way


def test_gptlab_flops_says_what_the_mask_saves_and_keeps_mfu(tmp_path):
    from gptlab.config.costing import flops_report

    def report(*extra):
        base = ["hardware.peak_flops=1e12", "hardware.mem_bandwidth=1e10", "model=tiny", "model.block_size=1024"]
        return flops_report(compose([*base, *extra], config_name="flops"))

    flex = report("data.doc_mask=true", "attention.impl=flex", "doc_length=64")
    sdpa = report("data.doc_mask=true", "doc_length=64")
    assert flex.documents["kernel_saved_share"] > 0.3 and sdpa.documents["kernel_saved_share"] == 0
    assert flex.documents["attention_useful_documents"] < flex.documents["attention_useful"]
    assert report().documents is None and report("attention.impl=flex").flops == flex.flops  # MFU's FLOPs unchanged
    assert report("data.doc_mask=true").documents == {
        "doc_length": None,
        "skips_masked_blocks": False,
        "mfu_counts": "unmasked causal FLOPs",
    }
    model = describe(tiny_model())
    assert (
        documents_cost(model, 2, 32, 8)["attention_kernel"]
        == documents_cost(model, 2, 32, 10**6)["attention_kernel_documents"]
    )
    assert OmegaConf.select(compose([], config_name="flops"), "doc_length") is None
    with pytest.raises(ConfigError, match=r"^doc_length=64: costs the document mask .* with data.doc_mask=true"):
        report("doc_length=64")  # without the mask it would change nothing: refused, never ignored
