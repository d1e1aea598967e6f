"""gptlab's GPT and Hugging Face transformers' GPT-2 compute the same function: weights copied either way give equal
logits and loss (fp32), every component choice is either mapped exactly or refused in one line, and a run goes out
(`gptlab-export --format hf`) and comes in (`train.init_from=hf:`) through real save_pretrained folders, offline."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="gptlab[hf] not installed: make setup installs it")

from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from gptlab.config.build import build_model, compose  # noqa: E402
from gptlab.errors import ConfigError  # noqa: E402
from gptlab.interop import hf  # noqa: E402
from helpers.model import choices  # noqa: E402

TOL = 1e-4  # fp32: the two models run the same ops in a different order (HF's SDPA vs gptlab's naive kernel)
GPT2 = ["experiment=d12", "~data", "model.n_layer=2"]  # GPT-2's architecture at reduced depth
SIZES = {  # HF name: (gptlab model= preset, n_embd, n_head); reduced depth and vocabulary keep it fast
    "gpt2": ("gpt2", 768, 12),
    "gpt2-medium": ("gpt2-medium", 1024, 16),
    "gpt2-large": ("gpt2-large", 1280, 20),
    "gpt2-xl": ("gpt2-xl", 1600, 25),
}
# the two widest shapes take ~10 s each way on 2 busy cores: slow (run in CI), small and medium stay fast
SIZE_PARAMS = [pytest.param(s, marks=pytest.mark.slow) if s in ("gpt2-large", "gpt2-xl") else s for s in SIZES]


def _gptlab(*overrides: str, vocab: int = 50257, seed: int = 0):
    torch.manual_seed(seed)
    model = build_model(compose([*GPT2, *overrides]), vocab_size=vocab).eval()
    with torch.no_grad():  # non-trivial norms and biases, so a dropped or swapped one shows
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def _tokens(vocab: int, B: int = 2, T: int = 33) -> torch.Tensor:
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(1))


def _assert_same(ours, theirs, vocab: int) -> None:
    """Equal logits at every position and equal next-token loss (HF shifts labels itself)."""
    idx = _tokens(vocab)
    with torch.no_grad():
        logits, _ = ours(idx)
        _, loss = ours(idx[:, :-1], idx[:, 1:])
        out = theirs(idx, labels=idx)
    assert logits.shape == out.logits.shape
    torch.testing.assert_close(logits, out.logits, atol=TOL, rtol=0)
    torch.testing.assert_close(loss, out.loss, atol=TOL, rtol=0)
    assert logits.std() > 0.1  # a real signal, not two near-zero outputs


@pytest.mark.parametrize("size", SIZE_PARAMS)
def test_hf_gpt2_weights_into_gptlab_give_equal_logits_and_loss(size):
    preset, n_embd, n_head = SIZES[size]
    vocab = 50257 if size == "gpt2" else 512
    torch.manual_seed(0)
    theirs = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=n_embd, n_head=n_head, vocab_size=vocab)).eval()
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if ".ln_" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    ours = build_model(compose([*GPT2, f"model={preset}", "model.n_layer=2"]), vocab_size=vocab).eval()
    hf.check_config(theirs.config, ours, "test")
    ours.load_state_dict(hf.from_hf_state(theirs.state_dict(), ours, "test"))
    assert ours.cfg.d_model == n_embd and ours.cfg.n_head == n_head
    _assert_same(ours, theirs, vocab)


@pytest.mark.parametrize("size", SIZE_PARAMS)
def test_gptlab_weights_into_hf_gpt2_give_equal_logits_and_loss(size):
    preset = SIZES[size][0]
    vocab = 50257 if size == "gpt2" else 512
    ours = _gptlab(f"model={preset}", "model.n_layer=2", vocab=vocab)
    theirs = hf.to_hf(ours)
    assert theirs.config.n_embd == SIZES[size][1] and theirs.config.n_layer == 2
    _assert_same(ours, theirs, vocab)


def test_d12_exports_as_gpt2s_own_config():
    """experiment=d12 is GPT-2 small: the exported config is GPT-2's, bar the exact-kernel GELU name."""
    config = hf.gpt2_config(build_model(compose(["experiment=d12", "~data"]), vocab_size=50257, device="meta"))
    reference = GPT2Config()
    for name in (
        "vocab_size",
        "n_positions",
        "n_embd",
        "n_layer",
        "n_head",
        "layer_norm_epsilon",
        "initializer_range",
        "tie_word_embeddings",
        "scale_attn_weights",
    ):
        assert config[name] == getattr(reference, name), name
    assert config["n_inner"] == 4 * reference.n_embd
    assert reference.activation_function == "gelu_new" and hf.ACTIVATION_IN["gelu_new"] is hf.GeluMLP


# every option of the families GPT-2 is made of: mapped exactly, or refused naming itself
MAPPED = {
    "attention=mha": [],
    "mlp=gelu": [],
    "mlp=relu2": [],
    "norm=layernorm": [],
    "position=learned": [],
    "position=sinusoidal": [],
    "position=none": [],
}
REFUSED = {  # choice: (what the refusal names, further overrides)
    "attention=gqa": ("attention.n_kv_head=2", ["attention.n_kv_head=2"]),  # n_kv_head = n_head would be MHA
    "attention=mqa": ("attention.n_kv_head=1", []),
    "attention=sliding": ("attention.window=", []),
    "attention=hybrid": ("attention.window=", []),
    "mlp=swiglu": ("mlp=swiglu", []),
    "mlp=none": ("mlp=none", ["~mlp.ratio"]),
    "norm=rmsnorm": ("norm=rmsnorm", []),
    "position=rope": ("position=rope", []),
    "position=alibi": ("position=alibi", []),
}
KNOBS_MAPPED = [
    ["model.bias=false", "norm.bias=false"],
    ["model.tie_embeddings=false"],
    ["model.vocab_multiple=64"],
    ["attention.impl=sdpa"],
    ["model.dropout=0.1", "attention.dropout=0.1"],
]
KNOBS_REFUSED = {
    "norm.placement=post": ("norm.placement=post", []),
    "attention.qk_norm=true": ("attention.qk_norm=true", []),
    "mlp.dropout=0.1": ("mlp.dropout=0.1", []),
}


def test_every_choice_of_gpt2s_families_is_listed():
    listed = {*MAPPED, *REFUSED}
    found = {f"{g}={c}" for g in ("attention", "mlp", "norm", "position") for c in choices(g)}
    assert found == listed


SMALL = ["model.d_model=64", "model.n_head=4", "model.block_size=64"]


@pytest.mark.parametrize("overrides", [[c] for c in MAPPED] + KNOBS_MAPPED, ids=str)
def test_mapped_choices_compute_the_same_in_hf(overrides):
    ours = _gptlab(*SMALL, *overrides, vocab=97)
    theirs = hf.to_hf(ours)
    _assert_same(ours, theirs, 97)


@pytest.mark.parametrize("overrides", KNOBS_MAPPED + [["model.bias=false", "model.tie_embeddings=false"]], ids=str)
def test_gptlab_to_hf_and_back_is_the_same_state(overrides):
    """gptlab -> HF -> gptlab gives back every tensor exactly (zero biases into a bias-free run, padded rows as 0)."""
    ours = _gptlab(*SMALL, *overrides, vocab=97)
    theirs = hf.to_hf(ours)
    hf.check_config(theirs.config, ours, "k")
    back = hf.from_hf_state(theirs.state_dict(), ours, "k")
    assert back.keys() == ours.state_dict().keys()
    for name, value in ours.state_dict().items():
        assert torch.equal(back[name], value), name


@pytest.mark.parametrize(("override", "refusal"), [*REFUSED.items(), *KNOBS_REFUSED.items()], ids=str)
def test_inexpressible_choices_are_refused_in_one_line(override, refusal):
    named, extra = refusal
    model = build_model(compose([*GPT2, *SMALL, override, *extra]), vocab_size=97, device="meta")
    with pytest.raises(ConfigError) as err:
        hf.gpt2_config(model)
    message = str(err.value)
    assert named in message and "cannot express" in message and "\n" not in message


def test_import_refuses_a_different_architecture():
    theirs = GPT2LMHeadModel(GPT2Config(n_layer=3, n_embd=64, n_head=4, vocab_size=97, n_positions=64))
    ours = build_model(compose([*GPT2, *SMALL]), vocab_size=97, device="meta")
    with pytest.raises(ConfigError, match=r"n_layer=3 there, model.n_layer=2 here"):
        hf.check_config(theirs.config, ours, "train.init_from=hf:x")
    exact = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=97, activation_function="gelu"))
    with pytest.raises(ConfigError, match=r"activation_function=gelu there"):
        hf.check_config(exact.config, ours, "k")
    rope = build_model(compose([*GPT2, *SMALL, "position=rope"]), vocab_size=97, device="meta")
    with pytest.raises(ConfigError, match=r"position=rope here, HF GPT-2's positions are learned"):
        hf.check_config(exact.config, rope, "k")
    # a width mismatch names the width as a width and the ratio that would match, never a width as mlp.ratio=<width>
    wide = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=97, n_inner=192, n_positions=64))
    with pytest.raises(
        ConfigError, match=r"n_inner=192 there, an MLP hidden width of 256 \(mlp.ratio=4; 3 would match\) here"
    ):
        hf.check_config(wide.config, ours, "k")


def test_import_refuses_weights_the_run_cannot_hold():
    """Biases into a bias-free run only when they are zero; an untied head into a tied run only when equal."""
    theirs = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=97, n_positions=64))
    no_bias = build_model(compose([*GPT2, *SMALL, "model.bias=false"]), vocab_size=97)
    with torch.no_grad():
        theirs.transformer.h[1].mlp.c_fc.bias.fill_(0.5)
    with pytest.raises(ConfigError, match=r"non-zero transformer.h.0.attn.c_attn.bias|non-zero .*c_fc.bias"):
        hf.from_hf_state(theirs.state_dict(), no_bias, "k")
    untied = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=97, tie_word_embeddings=False))
    tied = build_model(compose([*GPT2, *SMALL]), vocab_size=97)
    with pytest.raises(ConfigError, match=r"lm_head differs from its embedding.*model.tie_embeddings=false"):
        hf.from_hf_state(untied.state_dict(), tied, "k")


# ---- the tokenizer, the export CLI and train.init_from=hf: (real save_pretrained folders, offline) ----

GPT2_RUN = ["attention=mha", "mlp=gelu", "norm=layernorm", "position=learned", "model.bias=true"]


def _train(run, *overrides: str, steps: int = 2) -> dict:
    """A run trained in-process, with the .hydra/config.yaml gptlab-train's Hydra would have saved beside it."""
    from omegaconf import OmegaConf

    from gptlab.config.build import plain_config
    from helpers.train import FAST, run_inprocess

    summary = run_inprocess(run, *overrides, steps=steps, eval_interval=1)
    cfg = compose([*FAST, f"train.max_steps={steps}", "train.eval_interval=1", *overrides])
    (run / ".hydra").mkdir(exist_ok=True)
    OmegaConf.save(OmegaConf.create(plain_config(cfg)), run / ".hydra" / "config.yaml")
    return summary


@pytest.mark.parametrize("name", ["gpt2", "bpe", "byte", "char"])
def test_every_tokenizer_has_an_exact_hf_form(name, tmp_path):
    """The HF tokenizer written beside an export encodes and decodes as the run's (the PROBE check), read back."""
    from transformers import AutoTokenizer

    from gptlab.data.tokenizers import make_tokenizer
    from gptlab.interop.tokenizer import PROBE, check_same, to_hf_tokenizer

    tok = make_tokenizer(name, "Hello, world. The end of a short fitting text.\n" * 20, tmp_path, bpe_vocab_size=300)
    to_hf_tokenizer(tok).save_pretrained(tmp_path / "tok")
    back = AutoTokenizer.from_pretrained(tmp_path / "tok")
    check_same(back, tok, name)
    assert back(PROBE, add_special_tokens=False)["input_ids"] == tok.encode(PROBE)
    assert len(back) == tok.vocab_size


def _hf_folder(path, **config):
    """A random tiny GPT-2 saved with save_pretrained, with a byte tokenizer (vocabulary 256) beside it."""
    from gptlab.data.tokenizers import ByteTokenizer
    from gptlab.interop.tokenizer import to_hf_tokenizer

    torch.manual_seed(3)
    sizes = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=128) | config
    model = GPT2LMHeadModel(GPT2Config(**sizes)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln_" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(path)
    to_hf_tokenizer(ByteTokenizer()).save_pretrained(path)
    return model


def test_import_names_every_mismatch_at_once(tmp_path):
    """One try names every difference, in one line: two config fields (depth, activation), HF biases a bias-free run has
    no place for (the weights) and tokenizer files that encode differently (the run's char vocabulary); none is left
    for a second try."""
    from gptlab.data.tokenizers import make_tokenizer

    _hf_folder(tmp_path / "hf", n_layer=3, activation_function="relu")  # its biases are non-zero; a byte tokenizer
    ours = build_model(compose([*GPT2, *SMALL, "model.bias=false"]), vocab_size=256)
    char = make_tokenizer("char", "".join(chr(i) for i in range(32, 288)), tmp_path / "tok")  # 256 ids, not bytes
    with pytest.raises(ConfigError) as err:
        hf.init_state(str(tmp_path / "hf"), ours, char)
    message = str(err.value)
    assert message.startswith(f"train.init_from=hf:{tmp_path / 'hf'}: the HF model differs from this run's model: ")
    named = message.split(": the HF model differs from this run's model: ", 1)[1].split("; ")
    assert named[0] == "n_layer=3 there, model.n_layer=2 here"
    assert named[1] == "activation_function=relu there, mlp=gelu_pytorch_tanh here"
    assert named[2].startswith("its tokenizer there, data.tokenizer=char here: the Hugging Face tokenizer encodes")
    assert named[3].startswith("non-zero transformer.h.0.attn.c_attn.bias (and 11 more) there, no such bias here")
    assert named[3].endswith("(model.bias=false): use model.bias=true") and len(named) == 4 and "\n" not in message


@pytest.mark.slow  # trains, then exports through the CLI: ~30 s on 2 busy cores
def test_init_from_hf_then_export_hf_round_trips(tmp_path):
    """HF folder -> train.init_from=hf:DIR (lr 1e-30: the weights stay) -> gptlab-export --format hf -> from_pretrained:
    the same logits as the HF model we started from; the run records where it started."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gptlab.interop.tokenizer import PROBE
    from helpers.cli import run_cli

    source = _hf_folder(tmp_path / "hf-in")
    run = tmp_path / "run"
    summary = _train(
        run,
        *GPT2_RUN,
        "data.tokenizer=byte",
        f"train.init_from=hf:{tmp_path / 'hf-in'}",
        "optimizer=sgd",
        "optimizer.lr=1e-30",  # the weights stay what HF's were (a step of 1e-30 is below fp32's resolution)
        steps=2,
    )
    assert summary["init_from"]["checkpoint"] == f"hf:{tmp_path / 'hf-in'}"
    assert summary["init_from"]["step"] == 0 and summary["init_from"]["optimizer_state"] is False
    assert any("first 64 position rows kept" in d for d in summary["init_from"]["differences"])
    out = tmp_path / "hf-out"
    done = run_cli("gptlab.cli.export", str(run), "--format", "hf", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "gptlab_export.json"} <= {
        p.name for p in out.iterdir()
    }
    back = AutoModelForCausalLM.from_pretrained(out).eval()
    idx = _tokens(256, T=64)
    with torch.no_grad():
        torch.testing.assert_close(back(idx).logits, source(idx).logits, atol=TOL, rtol=0)
    assert AutoTokenizer.from_pretrained(out)(PROBE, add_special_tokens=False)["input_ids"] == list(PROBE.encode())
    again = run_cli("gptlab.cli.export", str(run), "--format", "hf", "--out", str(out))  # its own earlier export
    assert again.returncode == 0, again.stderr


@pytest.mark.slow  # trains, then exports through the CLI: ~30 s on 2 busy cores
def test_init_from_hf_refusals_are_one_line_and_write_nothing(tmp_path):
    from helpers.train import run_inprocess

    _hf_folder(tmp_path / "deep", n_layer=3)
    cases = {
        f"hf:{tmp_path / 'deep'}": "n_layer=3 there, model.n_layer=2 here",
        "hf:no-such-org/no-such-model": "cannot load 'no-such-org/no-such-model'",
        f"hf:{tmp_path / 'missing'}": "is not a folder",
    }
    for value, named in cases.items():
        run = tmp_path / f"run{len(named)}"
        with pytest.raises(ConfigError) as err:
            run_inprocess(run, *GPT2_RUN, "data.tokenizer=byte", f"train.init_from={value}", steps=1)
        assert named in str(err.value) and "\n" not in str(err.value)
        assert not (run / "metrics.jsonl").exists() and not (run / "provenance.json").exists()


def test_export_hf_refuses_what_gpt2_cannot_express(tmp_path):
    from helpers.cli import run_cli

    _train(tmp_path / "rope", steps=1)  # the default model: rmsnorm, rope
    done = run_cli("gptlab.cli.export", str(tmp_path / "rope"), "--format", "hf", "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert done.stderr.strip().startswith("error: ") and len(done.stderr.strip().splitlines()) == 1
    assert "position=rope: Hugging Face's GPT-2 cannot express it" in done.stderr
    assert not (tmp_path / "out").exists()


def test_missing_extra_is_one_line(monkeypatch):
    from gptlab.util import extras

    monkeypatch.setattr(extras, "missing", lambda module: module == "transformers")
    model = build_model(compose([*GPT2, *SMALL]), vocab_size=97)
    with pytest.raises(ConfigError, match=r"needs the 'transformers' package.*pip install 'gptlab\[hf\]'"):
        hf.to_hf(model)


def test_training_never_imports_transformers():
    import subprocess
    import sys

    code = (
        "import sys, gptlab.train.run, gptlab.cli.train, gptlab.interop.hf, gptlab.interop.export, gptlab.cli.export;"
        "assert 'transformers' not in sys.modules and 'lm_eval' not in sys.modules"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# ---- what GPT-2 cannot express goes out as Hugging Face Llama (rope, rmsnorm, swiglu, gqa) ----

LLAMA = ["position=rope", "norm=rmsnorm", "mlp=swiglu", "model.bias=false"]
LLAMA_MAPPED = [
    [],
    ["attention=gqa", "model.n_head=8", "attention.n_kv_head=2"],
    ["attention=mqa", "model.n_head=8"],
    ["model.bias=true"],
    ["model.tie_embeddings=false", "model.vocab_multiple=64"],
    ["position.base=500.0", "norm.eps=1e-5", "attention.dropout=0.1"],
]


@pytest.mark.parametrize("overrides", LLAMA_MAPPED, ids=str)
def test_llama_shaped_models_compute_the_same_as_hf_llama(overrides):
    ours = _gptlab(*SMALL, *LLAMA, *overrides, vocab=97)
    assert hf.hf_architecture(ours) == "llama"
    theirs = hf.to_hf_model(ours)
    assert type(theirs).__name__ == "LlamaForCausalLM"
    _assert_same(ours, theirs, 97)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["attention=sliding"], "attention.window="),
        (["attention.qk_norm=true"], "attention.qk_norm=true"),
        (["norm.placement=post"], "norm.placement=post"),
        (["model.dropout=0.1"], "model.dropout=0.1"),
        (["mlp=gelu"], "mlp=gelu"),
        (["position=alibi"], "position=alibi"),
    ],
)
def test_what_neither_gpt2_nor_llama_expresses_is_refused_in_one_line(overrides, named):
    model = build_model(compose([*GPT2, *SMALL, *LLAMA, *overrides]), vocab_size=97, device="meta")
    with pytest.raises(ConfigError) as err:
        hf.hf_architecture(model)
    message = str(err.value)
    assert "Hugging Face's GPT-2 cannot express it" in message and "\n" not in message
    assert f"{named}" in message.split("; and ")[1] and "Hugging Face's Llama cannot express it" in message


@pytest.mark.slow  # trains, then exports and reads back: ~30 s on 2 busy cores
def test_a_llama_shaped_run_exports_as_llama(tmp_path):
    from transformers import AutoModelForCausalLM

    from gptlab.config.trained import load_trained
    from gptlab.interop.export import export_hf

    run = tmp_path / "run"
    _train(run, *LLAMA, "attention=gqa", "attention.n_kv_head=2", "data.tokenizer=byte")
    record = export_hf(run, tmp_path / "hf")
    assert record["architecture"] == "llama" and record["max_abs_logit_diff"] <= TOL
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert back.config.model_type == "llama" and back.config.num_key_value_heads == 2
    model, _, _ = load_trained(run)
    _assert_same(model, back, 256)


def test_a_local_folder_that_does_not_load_is_not_blamed_on_the_hub(tmp_path):
    """A local folder whose files are wrong (here a config.json with no model type) never went to the Hub; its
    refusal named the Hub's absence first."""
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "config.json").write_text('{"hidden_size": 64}')
    with pytest.raises(ConfigError) as err:
        hf.load_pretrained(str(folder), "train.init_from")
    message = str(err.value)
    assert message.startswith(f"train.init_from: the folder '{folder}' is not a loadable save_pretrained model (")
    assert "Hub" not in message and "\n" not in message
