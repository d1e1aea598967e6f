"""The memory-lean loss and the padded vocabulary (gptlab/model/gpt.py, gptlab/model/config.py, gptlab/costs/memory.py).

- `chunked_cross_entropy` is `F.cross_entropy(logits.float(), targets, ignore_index=-100)` (the mean over scored
  targets), value and gradient, in fp32 and from bf16 logits, without an fp32 copy of all the logits.
- GPT's loss: fp32 logits take torch's own kernel (bit for bit the old loss: the default CPU curve is unchanged),
  bf16 logits (autocast) the chunked one in eager mode, torch's again under torch.compile (inductor fuses the upcast).
- The cost model's activation estimate keeps s bytes per logit for bf16 (was s + 4: the fp32 copy), 8 for fp32.
- model.vocab_multiple pads embedding + LM head rows; padded ids are never predicted, null keeps GPT-2's 124,439,808.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from gptlab.config.build import build_model, compose, cost_report
from gptlab.config.schema import check_schema
from gptlab.costs.memory import activation_bytes
from gptlab.costs.structure import describe
from gptlab.errors import ConfigError
from gptlab.model import gpt
from gptlab.model.config import GPTConfig
from gptlab.model.gpt import chunked_cross_entropy
from helpers.model import tiny_model, tokens
from helpers.train import rows, run_inprocess


def _logits_and_targets(n: int, vocab: int, dtype: torch.dtype, seed: int = 0):
    """(n, vocab) logits with a spread like a trained head's, targets with every 5th row unscored (-100)."""
    g = torch.Generator().manual_seed(seed)
    logits = (4 * torch.randn(n, vocab, generator=g)).to(dtype)
    targets = torch.randint(0, vocab, (n,), generator=g)
    targets[::5] = -100
    return logits, targets


def _old_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The loss GPT computed before: an fp32 copy of all the logits into torch's cross-entropy."""
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100)


def _value_and_grad(loss_fn, logits: torch.Tensor, targets: torch.Tensor):
    x = logits.clone().requires_grad_()
    loss = loss_fn(x, targets)
    loss.backward()
    return loss.detach(), x.grad


# ---- chunked_cross_entropy against torch's cross-entropy -------------------------------------------------------


@pytest.mark.parametrize("rows", [1, 7, 64, 1000])  # 1000 > n: one chunk; 7 does not divide n
def test_chunked_equals_cross_entropy_in_fp32(monkeypatch, rows):
    """fp32: loss and gradient equal torch's within fp32 rounding (rtol 1e-6), whatever the chunking."""
    vocab = 97
    monkeypatch.setattr(gpt, "LOSS_CHUNK_ELEMENTS", rows * vocab)
    logits, targets = _logits_and_targets(300, vocab, torch.float32)
    ref_loss, ref_grad = _value_and_grad(_old_loss, logits, targets)
    loss, grad = _value_and_grad(chunked_cross_entropy, logits, targets)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=0)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-9)
    assert grad[::5].abs().max() == 0  # unscored rows get no gradient, as with ignore_index
    assert grad.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_chunked_equals_cross_entropy_from_low_precision_logits(monkeypatch, dtype):
    """bf16/fp16 logits: the loss equals torch's on the fp32 upcast (both compute in fp32); the gradient, in the
    logits' dtype, within one rounding of that dtype."""
    vocab = 101
    monkeypatch.setattr(gpt, "LOSS_CHUNK_ELEMENTS", 16 * vocab)
    logits, targets = _logits_and_targets(200, vocab, dtype)
    ref_loss, ref_grad = _value_and_grad(_old_loss, logits, targets)
    loss, grad = _value_and_grad(chunked_cross_entropy, logits, targets)
    assert loss.dtype == torch.float32 and grad.dtype == dtype
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=0)
    torch.testing.assert_close(grad, ref_grad)  # torch's default tolerance for bf16/fp16


def test_chunked_with_no_scored_target_is_nan_like_cross_entropy():
    logits, targets = _logits_and_targets(8, 11, torch.float32)
    targets[:] = -100
    assert torch.isnan(_old_loss(logits, targets)) and torch.isnan(chunked_cross_entropy(logits, targets))


def test_chunked_loss_never_holds_an_fp32_copy_of_all_logits(monkeypatch):
    """bf16 logits (n, V): no fp32 tensor of more than one chunk (rows x V) is ever created in forward or backward,
    and backward keeps no fp32 tensor of the logits' size; torch's path (the old loss) makes several."""
    n, vocab, rows = 512, 300, 32
    monkeypatch.setattr(gpt, "LOSS_CHUNK_ELEMENTS", rows * vocab)
    logits, targets = _logits_and_targets(n, vocab, torch.bfloat16)

    class LargestFp32(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                    self.largest = max(self.largest, t.numel())
            return out

    def largest_fp32(loss_fn) -> tuple[int, int]:
        saved = []
        x = logits.clone().requires_grad_()
        with (
            LargestFp32() as mode,
            torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t),
        ):
            loss_fn(x, targets).backward()
        kept = max((t.numel() for t in saved if t.dtype == torch.float32), default=0)
        return mode.largest, kept

    created, kept = largest_fp32(chunked_cross_entropy)
    assert created <= rows * vocab and kept <= n  # one chunk at a time; kept: the per-row log-sum-exp only
    old_created, old_kept = largest_fp32(_old_loss)
    assert old_created == n * vocab and old_kept == n * vocab  # the fp32 copy and its saved log-softmax


# ---- GPT's loss ------------------------------------------------------------------------------------------------


def test_gpt_fp32_loss_is_bit_identical_to_before():
    """fp32 logits take torch's kernel: loss and every parameter gradient identical to the old formula's."""
    x, y = tokens(), tokens(seed=1)
    y[:, :3] = -100
    grads = {}
    for name, loss_fn in (("new", None), ("old", _old_loss)):
        model = tiny_model().train()
        logits, loss = model(x, y)
        if loss_fn is not None:
            loss = loss_fn(logits, y)
        loss.backward()
        grads[name] = (loss.detach(), [p.grad.clone() for p in model.parameters()])
    assert torch.equal(grads["new"][0], grads["old"][0])
    assert all(torch.equal(a, b) for a, b in zip(grads["new"][1], grads["old"][1]))


def test_gpt_bf16_autocast_loss_and_gradients_match_the_fp32_copy_path(monkeypatch):
    """Under bf16 autocast (logits bf16): the chunked loss equals the old fp32-copy loss on the same logits, and the
    parameter gradients agree to bf16 precision (several chunks: 7 rows each)."""
    monkeypatch.setattr(gpt, "LOSS_CHUNK_ELEMENTS", 7 * 61)
    x, y = tokens(B=3), tokens(B=3, seed=2)
    y[0, :5] = -100
    out = {}
    for name in ("chunked", "old"):
        model = tiny_model().train()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits, loss = model(x, y)
            assert logits.dtype == torch.bfloat16
            ref = _old_loss(logits, y)
            if name == "old":
                loss = ref
        torch.testing.assert_close(loss, ref, rtol=1e-6, atol=0)  # same logits: same value (fp32 arithmetic)
        loss.backward()
        out[name] = (loss.detach(), {n: p.grad.float() for n, p in model.named_parameters()})
    torch.testing.assert_close(out["chunked"][0], out["old"][0], rtol=1e-6, atol=0)
    for n, g in out["chunked"][1].items():
        torch.testing.assert_close(g, out["old"][1][n], rtol=1.6e-2, atol=1e-5, msg=n)  # bf16 tolerance


def test_compiled_gpt_takes_torchs_loss_with_the_same_value_and_gradients(monkeypatch):
    """Under torch.compile the bf16 loss is torch's cross-entropy, which inductor fuses with the upcast; the chunked
    Function's slice writes became one whole-gradient copy per chunk there (an H200's d12 step: 47.3 -> 37.1 ms,
    docs/GPU.md). The compiled loss and gradients equal the eager chunked ones (aot_eager: the real trace and
    autograd graph, without a C++ build)."""
    monkeypatch.setattr(gpt, "LOSS_CHUNK_ELEMENTS", 7 * 61)  # the eager side runs several chunks
    x, y = tokens(B=3), tokens(B=3, seed=2)
    y[0, :5] = -100
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.backends.debugging.aot_eager(gm, example_inputs)

    out = {}
    for name in ("eager", "compiled"):
        model = tiny_model().train()
        step = torch.compile(model, backend=backend) if name == "compiled" else model
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = step(x, y)
        loss.backward()
        out[name] = (loss.detach(), {n: p.grad.float() for n, p in model.named_parameters()})
    torch._dynamo.reset()
    code = "\n".join(g.code for g in graphs)
    assert "cross_entropy" in code and "ChunkedCrossEntropy" not in code
    torch.testing.assert_close(out["compiled"][0], out["eager"][0], rtol=1e-5, atol=0)
    for n, g in out["eager"][1].items():
        torch.testing.assert_close(out["compiled"][1][n], g, rtol=1.6e-2, atol=1e-5, msg=n)  # bf16 tolerance


# ---- the cost model ------------------------------------------------------------------------------------------


def test_activation_estimate_drops_the_fp32_logits_copy_for_d12():
    """experiment=d12 at 32 x 1024 tokens: the logits' share of the activation estimate is 2 bytes per logit in bf16
    (it was 2 + 4: the fp32 copy, 6.59e9 bytes, is gone; + 4 bytes per token of log-sum-exp) and 4 + 4 in fp32."""
    cfg = compose(["experiment=d12"])
    shape = describe(build_model(cfg, vocab_size=50257, device="meta"))
    batch, seq, vocab, tokens_ = 32, 1024, 50257, 32 * 1024

    def logits_share(s: int) -> float:  # the estimate minus the same model's with no logits at all
        no_logits = dataclasses.replace(shape, vocab_size=0)
        return activation_bytes(shape, batch, seq, s, True) - activation_bytes(no_logits, batch, seq, s, True)

    assert logits_share(2) == tokens_ * vocab * 2
    assert logits_share(4) == tokens_ * vocab * (4 + 4)  # fp32: torch's kernel, its log-softmax kept beside
    old_bf16_share = tokens_ * vocab * (2 + 4)
    assert old_bf16_share - logits_share(2) == 6_587_285_504  # the fp32 copy of (32·1024, 50257) logits
    report = cost_report(cfg, batch, seq, vocab_size=vocab, dtype="bf16").to_dict()["memory"]
    fp32 = cost_report(cfg, batch, seq, vocab_size=vocab, dtype="fp32").to_dict()["memory"]
    # the whole estimate moves by the same amount: its other terms do not depend on the logits
    assert report["activations_bytes"] == activation_bytes(shape, batch, seq, 2, True)
    assert fp32["activations_bytes"] == activation_bytes(shape, batch, seq, 4, True)


# ---- model.vocab_multiple --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "vocab,multiple,padded", [(50257, None, 50257), (50257, 1, 50257), (50257, 64, 50304), (64, 64, 64), (65, 64, 128)]
)
def test_padded_vocab(vocab, multiple, padded):
    assert GPTConfig(vocab_size=vocab, vocab_multiple=multiple).padded_vocab == padded


def test_gpt2_parameter_count_unchanged_and_padding_counted_honestly():
    """null: GPT-2 small's exact 124,439,808; 64: the 47 padded rows of the tied table (47 x 768) are allocated and
    counted."""
    counts = {
        extra: build_model(compose(["experiment=d12", *extra]), vocab_size=50257, device="meta").num_params()
        for extra in ((), ("model.vocab_multiple=64",))
    }
    assert counts[()] == 124_439_808
    assert counts[("model.vocab_multiple=64",)] == 124_439_808 + 47 * 768


@pytest.mark.parametrize("value", [0, -64, 1.5, "x"])
def test_vocab_multiple_schema_refuses_in_one_line(value):
    with pytest.raises(ConfigError, match=r"^model.vocab_multiple=") as err:
        check_schema(compose([f"model.vocab_multiple={value}"]))
    assert "\n" not in str(err.value)


def _padded_pair(tie: bool):
    """A model with vocab 61 padded to 64 (ids 61..63 padded) and the same model unpadded, same real weights."""
    tied = f"model.tie_embeddings={str(tie).lower()}"
    padded = tiny_model(tied, "model.vocab_multiple=64", seed=3)
    plain = tiny_model(tied, seed=3)
    return padded, plain


@pytest.mark.parametrize("tie", [True, False])
def test_padding_changes_nothing_but_the_shapes(tie):
    """Same seed: every weight of the padded model equals the unpadded one's (padded rows start at 0, draw no
    randomness); logits cover the real vocabulary only and equal the unpadded model's; so does the loss."""
    padded, plain = _padded_pair(tie)
    assert padded.lm_head.weight.shape == (64, 32) and padded.wte.weight.shape == (64, 32)
    for (name, p), q in zip(padded.named_parameters(), plain.parameters()):
        if p.shape != q.shape:
            assert torch.equal(p[:61], q) and p[61:].abs().max() == 0, name
        else:
            assert torch.equal(p, q), name
    x, y = tokens(), tokens(seed=1)
    (lp, loss_p), (lq, loss_q) = padded(x, y), plain(x, y)
    assert lp.shape == lq.shape == (2, 24, 61)
    torch.testing.assert_close(lp, lq, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(loss_p, loss_q, rtol=1e-6, atol=0)


@pytest.mark.parametrize("tie", [True, False])
def test_padded_ids_are_never_predicted_and_get_no_gradient(tie):
    """Padded rows given weights that would make their logits win (x 1000) still never come out of argmax or
    sampling, take no probability from the loss (same loss as with zero rows) and receive zero gradient."""
    padded, plain = _padded_pair(tie)
    with torch.no_grad():
        padded.lm_head.weight[61:] = 1000 * padded.lm_head.weight[:3]  # huge logits for ids 61, 62, 63
    x, y = tokens(), tokens(seed=1)
    logits, loss = padded.train()(x, y)
    assert logits.size(-1) == 61
    torch.testing.assert_close(loss, plain(x, y)[1], rtol=1e-6, atol=0)
    loss.backward()
    assert padded.lm_head.weight.grad[61:].abs().max() == 0
    gen = torch.Generator().manual_seed(0)
    prompt = tokens(B=4, T=4)
    for kwargs in ({"temperature": 0.0}, {"temperature": 1.0}, {"temperature": 2.0, "top_k": 10}):
        out = padded.eval().generate(prompt, 40, generator=gen, **kwargs)
        assert int(out.max()) < 61, kwargs
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the chunked (bf16) path masks the same columns
        logits16, loss16 = padded(x, y)
    assert logits16.size(-1) == 61 and torch.isfinite(loss16)


def test_vocab_multiple_trains_like_the_unpadded_model(tmp_path):
    """gptlab-train model.vocab_multiple=64 (the char vocabulary padded to 64·k): the loss falls, and each step's
    loss is the unpadded run's up to fp32 rounding of the wider matmuls."""
    summary = run_inprocess(tmp_path / "padded", "model.vocab_multiple=64")
    summary_plain = run_inprocess(tmp_path / "plain")
    loss = [r["train/loss"] for r in rows(tmp_path / "padded") if "train/loss" in r]
    loss_plain = [r["train/loss"] for r in rows(tmp_path / "plain") if "train/loss" in r]
    assert len(loss) == 6 and loss[-1] < loss[0] - 0.3
    assert loss == pytest.approx(loss_plain, rel=1e-5)
    vocab = summary["params"] - summary_plain["params"]  # the padded rows of the tied table, d_model 64 each
    assert vocab > 0 and vocab % 64 == 0
