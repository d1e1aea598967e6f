"""gptlab's GPT <-> Hugging Face transformers' GPT-2 (GPT2LMHeadModel): the one mapping of configs and weights.

GPT-2 in gptlab's choices (experiment=d12): position=learned, norm=layernorm (placement=pre, a final LayerNorm),
mlp=gelu (GELU, tanh approximation), attention=mha (no window, no QK-norm), model.bias=true, tied embeddings.
Every other choice is either mapped exactly or refused in one line naming it:

- mapped: mlp=relu2 (HF's "relu2" activation); model.bias=false / norm.bias=false (HF's biases, all zero);
  model.tie_embeddings=false (tie_word_embeddings=false); model.vocab_multiple (the padded rows are dropped);
  position=sinusoidal / none (written as GPT-2's position table: the fixed encodings / zeros, so HF computes the
  same logits for sequences up to model.block_size, but cannot run past it); attention.impl (all kernels compute
  the same attention); model.dropout -> embd_pdrop and resid_pdrop, attention.dropout -> attn_pdrop.
- refused: position=rope/alibi, norm=rmsnorm, norm.placement=post, mlp=swiglu/none, attention.n_kv_head < n_head
  (GQA/MQA), attention.window, attention.qk_norm, mlp.dropout > 0 (GPT-2 has no dropout inside its MLP).
  `hf_architecture` / `to_hf_model` then try Hugging Face's Llama (gptlab/interop/llama.py: rope + rmsnorm + swiglu,
  any n_kv_head) and refuse in one line naming what neither can express.

Coming in (`train.init_from=hf:...`), the run's config must describe the HF model: sizes, epsilon and activation
equal, GPT-2's attention scaling, position=learned; HF biases or an untied head that the run cannot hold are refused
unless they are exactly zero / equal to the embedding. A shorter model.block_size keeps the first rows of the
HF position table (the same model on shorter sequences).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from gptlab.errors import ConfigError
from gptlab.interop.llama import llama_config, to_llama
from gptlab.interop.quiet import no_progress_bars
from gptlab.interop.tokenizer import check_same
from gptlab.model.attention.gqa import GroupedQueryAttention
from gptlab.model.gpt import GPT
from gptlab.model.mlp.gelu import GeluMLP
from gptlab.model.mlp.relu2 import Relu2MLP
from gptlab.model.norm.layernorm import LayerNorm
from gptlab.model.position.learned import LearnedPosition
from gptlab.model.position.none import NoPosition
from gptlab.model.position.sinusoidal import SinusoidalPosition
from gptlab.state.resume import HF_PREFIX
from gptlab.util.extras import require

log = logging.getLogger(__name__)

# gptlab's MLP -> HF GPT-2's activation_function (gelu: F.gelu(approximate="tanh"), the same kernel)
ACTIVATION = {GeluMLP: "gelu_pytorch_tanh", Relu2MLP: "relu2"}
# HF activation names that compute gptlab's MLP (GPT-2's own "gelu_new" is the same tanh formula, written out)
ACTIVATION_IN = {"gelu_new": GeluMLP, "gelu_pytorch_tanh": GeluMLP, "gelu_fast": GeluMLP, "relu2": Relu2MLP}
# HF GPT-2 config field -> the gptlab key that sets it (for refusals)
KEYS = {
    "n_layer": "model.n_layer",
    "n_head": "model.n_head",
    "n_embd": "model.d_model",
    "vocab_size": "model.vocab_size (the tokenizer's)",
    "n_inner": "mlp.ratio (the MLP hidden width over model.d_model)",
    "layer_norm_epsilon": "norm.eps",
    "activation_function": "mlp",
}


def _choice(family: str, module: object) -> str:
    """`family=name` of a component, the module name being the choice name (conf/<family>/<name>.yaml)."""
    return f"{family}={type(module).__module__.rsplit('.', 1)[-1]}"


def _refuse(what: str, why: str) -> ConfigError:
    return ConfigError(f"{what}: Hugging Face's GPT-2 cannot express it ({why})")


def _norms(model: GPT) -> list:
    blocks = list(model.blocks)
    return [model.norm_f, *(b.norm1 for b in blocks), *(b.norm2 for b in blocks if b.norm2 is not None)]


def _check_position(model: GPT) -> None:
    if type(model.position) not in (LearnedPosition, SinusoidalPosition, NoPosition):
        raise _refuse(_choice("position", model.position), "its positions are a table added to the input")


def _check_norms(model: GPT) -> float:
    """The one LayerNorm epsilon of every norm (pre-norm blocks)."""
    for norm in _norms(model):
        if type(norm) is not LayerNorm:
            raise _refuse(_choice("norm", norm), "LayerNorm only")
    if any(block.placement != "pre" for block in model.blocks):
        raise _refuse("norm.placement=post", "pre-norm blocks only")
    eps = {norm.eps for norm in _norms(model)}
    if len(eps) != 1:
        raise _refuse(f"norm eps {sorted(eps)}", "one layer_norm_epsilon")
    return float(eps.pop())


def _check_attention(model: GPT) -> float:
    """The attention-probability dropout of every layer (full causal multi-head attention)."""
    drops = set()
    for block in model.blocks:
        attn = block.attn
        if type(attn) is not GroupedQueryAttention:
            raise _refuse(_choice("attention", attn), "multi-head attention only")
        if attn.n_kv_head != attn.n_head:
            raise _refuse(f"attention.n_kv_head={attn.n_kv_head}", f"one key/value head per query head, {attn.n_head}")
        if attn.window is not None:
            raise _refuse(f"attention.window={attn.window}", "full causal attention only")
        if attn.q_norm is not None:
            raise _refuse("attention.qk_norm=true", "no norm on queries and keys")
        drops.add(attn.dropout)
    if len(drops) != 1:
        raise _refuse(f"attention dropout {sorted(drops)}", "one attn_pdrop")
    return float(drops.pop())


def _check_mlp(model: GPT) -> tuple[str, int]:
    """(HF activation_function, hidden width) of every block's MLP."""
    found = set()
    for block in model.blocks:
        mlp: Any = block.mlp  # a Module attribute: typed Tensor | Module
        if type(mlp) not in ACTIVATION:
            raise _refuse(_choice("mlp", mlp), f"two matrices with one of {', '.join(ACTIVATION.values())}")
        if mlp.dropout:
            raise _refuse(f"mlp.dropout={mlp.dropout}", "no dropout inside the MLP, only resid_pdrop = model.dropout")
        found.add((ACTIVATION[type(mlp)], int(mlp.hidden)))
    if len(found) != 1:
        raise _refuse(f"mlp {sorted(found)}", "the same MLP in every block")
    return found.pop()


def gpt2_config(model: GPT, eot_id: int | None = None) -> dict:
    """GPT2Config's arguments for `model` (the same function), or a one-line ConfigError naming what it cannot be."""
    if type(model) is not GPT or model.layer_counts is not None:
        raise _refuse(type(model).__name__, "a plain gptlab GPT only")
    cfg = model.cfg
    if cfg.parametrization != "sp":  # its logits x 1/m and q·k/head_dim scores are no HF config's
        raise _refuse(f"model.parametrization={cfg.parametrization}", "the standard parametrization only")
    _check_position(model)
    eps = _check_norms(model)
    attn_pdrop = _check_attention(model)
    activation, hidden = _check_mlp(model)
    return {
        "vocab_size": cfg.vocab_size,  # model.vocab_multiple's padded rows are never predicted: not exported
        "n_positions": cfg.block_size,
        "n_embd": cfg.d_model,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_inner": hidden,
        "activation_function": activation,
        "layer_norm_epsilon": eps,
        "resid_pdrop": cfg.dropout,
        "embd_pdrop": cfg.dropout,
        "attn_pdrop": attn_pdrop,
        "initializer_range": cfg.init_std,
        "tie_word_embeddings": cfg.tie_embeddings,
        "scale_attn_weights": True,  # 1/sqrt(head_dim), as gptlab's kernels
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "bos_token_id": eot_id,
        "eos_token_id": eot_id,
    }


def _pairs(n_layer: int) -> list[tuple[str, str, bool]]:
    """(HF name, gptlab name, transposed): HF's Conv1D stores (in, out), nn.Linear (out, in)."""
    pairs = [
        ("transformer.wte.weight", "wte.weight", False),
        ("transformer.wpe.weight", "position.wpe.weight", False),
        ("transformer.ln_f.weight", "norm_f.weight", False),
        ("transformer.ln_f.bias", "norm_f.bias", False),
    ]
    for i in range(n_layer):
        h, g = f"transformer.h.{i}.", f"blocks.{i}."
        for hf_name, ours, transposed in (
            ("ln_1", "norm1", False),
            ("attn.c_attn", "attn.qkv", True),
            ("attn.c_proj", "attn.proj", True),
            ("ln_2", "norm2", False),
            ("mlp.c_fc", "mlp.up", True),
            ("mlp.c_proj", "mlp.down", True),
        ):
            pairs.append((f"{h}{hf_name}.weight", f"{g}{ours}.weight", transposed))
            pairs.append((f"{h}{hf_name}.bias", f"{g}{ours}.bias", False))
    pairs.append(("lm_head.weight", "lm_head.weight", False))
    return pairs


def _position_table(model: GPT) -> torch.Tensor:
    """(block_size, d_model): what the position choice adds to the input at positions 0..block_size-1."""
    position, cfg = model.position, model.cfg
    if isinstance(position, LearnedPosition):
        return position.wpe.weight.detach()
    pos = torch.arange(cfg.block_size, device=model.wte.weight.device)
    if isinstance(position, SinusoidalPosition):
        return position.scale * position.table(pos, torch.float32)  # what embed() adds
    return torch.zeros(cfg.block_size, cfg.d_model, device=pos.device)  # position=none adds nothing


@torch.no_grad()
def to_hf_state(model: GPT) -> dict[str, torch.Tensor]:
    """HF GPT-2 tensors of `model` (fp32 copies): biases it lacks as zeros, the padded vocabulary rows dropped."""
    ours = model.state_dict()
    vocab, tied = model.cfg.vocab_size, model.cfg.tie_embeddings
    out: dict[str, torch.Tensor] = {}
    for hf_name, name, transposed in _pairs(model.cfg.n_layer):
        if name == "lm_head.weight" and tied:
            continue  # HF ties it to transformer.wte.weight
        if name == "position.wpe.weight":
            value = _position_table(model)
        elif name in ours:
            value = ours[name]
        else:  # a bias this model has none of (model.bias=false, norm.bias=false): adding zero is the same
            value = torch.zeros(ours[name.replace(".bias", ".weight")].shape[0])
        value = value[:vocab] if name in ("wte.weight", "lm_head.weight") else value
        out[hf_name] = (value.t() if transposed else value).float().contiguous().clone()
    return out


def to_hf(model: GPT, eot_id: int | None = None):
    """A transformers GPT2LMHeadModel (fp32, eval mode) computing what `model` computes."""
    require("transformers", "hf", "Hugging Face GPT-2")
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(**gpt2_config(model, eot_id))
    with torch.device("meta"):
        hf = GPT2LMHeadModel(config)
    hf.load_state_dict(to_hf_state(model), strict=False, assign=True)
    if config.tie_word_embeddings:
        hf.tie_weights()
    missing = [n for n, p in hf.named_parameters() if p.is_meta]
    if missing:
        raise RuntimeError(f"gptlab -> HF GPT-2: no value for {missing[:3]}")
    return hf.float().eval()


def hf_architecture(model: GPT) -> str:
    """'gpt2', else 'llama' (gptlab/interop/llama.py): the HF architecture computing `model`; a one-line refusal naming
    the choices neither can express."""
    try:
        gpt2_config(model)
        return "gpt2"
    except ConfigError as gpt2_refusal:
        try:
            llama_config(model)
            return "llama"
        except ConfigError as llama_refusal:
            raise ConfigError(f"{gpt2_refusal}; and {llama_refusal}") from None


def to_hf_model(model: GPT, eot_id: int | None = None):
    """`model` as the HF model that computes it: GPT2LMHeadModel where GPT-2 can express it, else LlamaForCausalLM."""
    return to_hf(model, eot_id) if hf_architecture(model) == "gpt2" else to_llama(model, eot_id)


def _hf_field(config, name: str):
    value = getattr(config, name)
    return 4 * config.n_embd if name == "n_inner" and value is None else value


def _family_refusals(model: GPT) -> tuple[dict, list[str]]:
    """({GPT-2 field: this model's value} for the families GPT-2 can express, a refusal for each family it cannot)."""
    refusals = []
    if type(model) is not GPT or model.layer_counts is not None:
        refusals.append(str(_refuse(type(model).__name__, "a plain gptlab GPT only")))
    if not isinstance(model.position, LearnedPosition):
        refusals.append(
            f"{_choice('position', model.position)} here, HF GPT-2's positions are learned: use position=learned "
            f"(experiment=d12)"
        )
    found: dict[str, Any] = {}
    for family, check in (("norm", _check_norms), ("attention", _check_attention), ("mlp", _check_mlp)):
        try:  # every family checked, so that each refusal is named at once
            found[family] = check(model)
        except ConfigError as err:
            refusals.append(str(err))
    want: dict = {}
    if "norm" in found:
        want["layer_norm_epsilon"] = found["norm"]
    if "mlp" in found:
        want["activation_function"], want["n_inner"] = found["mlp"]
    return want, refusals


def config_differences(config, model: GPT) -> list[str]:
    """Every way the HF GPT-2 `config` differs from `model`'s architecture, a phrase each (none: it describes it)."""
    cfg = model.cfg
    want, diffs = _family_refusals(model)
    want |= {"n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_embd": cfg.d_model, "vocab_size": cfg.vocab_size}
    for name in ("n_layer", "n_head", "n_embd", "vocab_size", "n_inner", "layer_norm_epsilon"):
        if name in want and _hf_field(config, name) != want[name]:
            here = f"{KEYS[name]}={want[name]}"
            if name == "n_inner":  # a width gptlab sets as a ratio of d_model: say both, never a width as a ratio
                ratio, have = _hf_field(config, name) / cfg.d_model, want[name] / cfg.d_model
                here = f"an MLP hidden width of {want[name]} (mlp.ratio={have:g}; {ratio:g} would match)"
            diffs.append(f"{name}={_hf_field(config, name)} there, {here} here")
    hf_act = ACTIVATION_IN.get(config.activation_function)
    if "activation_function" in want and (hf_act is None or ACTIVATION[hf_act] != want["activation_function"]):
        diffs.append(f"activation_function={config.activation_function} there, mlp={want['activation_function']} here")
    if config.n_positions < cfg.block_size:
        diffs.append(f"n_positions={config.n_positions} there, model.block_size={cfg.block_size} here")
    unlike = [
        f
        for f, v in (
            ("scale_attn_weights", True),
            ("scale_attn_by_inverse_layer_idx", False),
            ("add_cross_attention", False),
        )
        if bool(getattr(config, f, v)) != v
    ]
    diffs += [f"{f}={getattr(config, f)} there (gptlab's attention has no such option)" for f in unlike]
    return diffs


def _refused(key: str, diffs: list[str]) -> ConfigError:
    return ConfigError(f"{key}: the HF model differs from this run's model: {'; '.join(diffs)}")


def check_config(config, model: GPT, key: str) -> None:
    """The HF GPT-2 `config` describes `model`'s architecture, or a one-line ConfigError listing every difference."""
    if getattr(config, "model_type", None) != "gpt2":
        raise ConfigError(f"{key}: a {config.model_type} model; only GPT-2 (model_type gpt2) maps onto gptlab's GPT")
    diffs = config_differences(config, model)
    if diffs:
        raise _refused(key, diffs)


def weight_differences(hf_state: dict[str, torch.Tensor], n_layer: int, model: GPT) -> list[str]:
    """HF GPT-2 tensors (of `n_layer` blocks) that `model` cannot hold, a phrase per kind: non-zero biases where it has
    none (model.bias / norm.bias), an untied head where it ties it to the embedding. Shape-free: checkable whatever
    the sizes."""
    has_bias = {
        "model.bias": model.cfg.bias,
        "norm.bias": all(getattr(n, "bias", None) is not None for n in _norms(model)),
    }
    nonzero: dict[str, list[str]] = {}
    for hf_name, _, _ in _pairs(n_layer):
        which = "norm.bias" if ".ln_" in hf_name else "model.bias"
        value = hf_state.get(hf_name)
        if hf_name.endswith(".bias") and not has_bias[which] and value is not None and value.count_nonzero():
            nonzero.setdefault(which, []).append(hf_name)
    diffs = [
        f"non-zero {names[0]}{f' (and {len(names) - 1} more)' if len(names) > 1 else ''} there, no such bias here "
        f"({which}=false): use {which}=true"
        for which, names in nonzero.items()
    ]
    head, wte = hf_state.get("lm_head.weight"), hf_state["transformer.wte.weight"]
    if model.cfg.tie_embeddings and head is not None and not torch.equal(head, wte):
        diffs.append(
            "the HF model's lm_head differs from its embedding there, tied here (model.tie_embeddings=true): "
            "use model.tie_embeddings=false"
        )
    return diffs


@torch.no_grad()
def from_hf_state(hf_state: dict[str, torch.Tensor], model: GPT, key: str) -> dict[str, torch.Tensor]:
    """`model`'s state dict (its dtype) holding the HF GPT-2 weights; check_config first. A one-line ConfigError
    naming every tensor kind the run cannot hold."""
    diffs = weight_differences(hf_state, model.cfg.n_layer, model)
    if diffs:
        raise _refused(key, diffs)
    ours = model.state_dict()
    cfg = model.cfg
    hf_head = hf_state.get("lm_head.weight", hf_state["transformer.wte.weight"])
    out: dict[str, torch.Tensor] = {}
    for hf_name, name, transposed in _pairs(cfg.n_layer):
        if name not in ours and hf_name.endswith(".bias"):  # a bias this run has none of: zero there
            continue
        value = hf_head if hf_name == "lm_head.weight" else hf_state[hf_name]
        value = value.t() if transposed else value
        if name == "position.wpe.weight":
            value = value[: cfg.block_size]  # a shorter block_size: the same model on shorter sequences
        if name in ("wte.weight", "lm_head.weight") and cfg.padded_vocab > cfg.vocab_size:
            value = torch.cat([value, value.new_zeros(cfg.padded_vocab - cfg.vocab_size, value.size(1))])
        out[name] = value.to(ours[name].dtype).contiguous().clone()
    return out


def load_pretrained(source: str, key: str):
    """A transformers GPT2LMHeadModel (fp32) from a local folder or a Hub name; one-line ConfigError otherwise."""
    require("transformers", "hf", key)
    from safetensors import SafetensorError
    from transformers import AutoConfig, GPT2LMHeadModel

    if not Path(source).is_dir() and (source.startswith((".", "/", "~")) or Path(source).exists()):
        raise ConfigError(f"{key}: '{source}' is not a folder (a save_pretrained folder or a Hub name is allowed)")
    try:
        config = AutoConfig.from_pretrained(source)
        if getattr(config, "model_type", None) != "gpt2":
            raise ConfigError(
                f"{key}: '{source}' is a {config.model_type} model; only GPT-2 (model_type gpt2) maps onto gptlab's GPT"
            )
        return GPT2LMHeadModel.from_pretrained(source, dtype=torch.float32).eval()
    except SafetensorError as err:  # a truncated or damaged weights file (a copy cut short, a full disk)
        first = " ".join(str(err).split())[:160]
        raise ConfigError(
            f"{key}: the weights in '{source}' cannot be read ({first}): a truncated or damaged model.safetensors; "
            "save or download the model again"
        ) from None
    except (OSError, ValueError) as err:
        first = " ".join(str(err).split())[:200]
        if Path(source).is_dir():  # a local folder never went to the Hub: its own files are what failed
            raise ConfigError(
                f"{key}: the folder '{source}' is not a loadable save_pretrained model ({first})"
            ) from None
        raise ConfigError(
            f"{key}: cannot load '{source}' (not a local model folder, and the Hugging Face Hub "
            f"could not provide it: offline, HF_HUB_OFFLINE=1 or no network, only local folders work; "
            f"{first})"
        ) from None


def _check_tokenizer(source: str, tokenizer, where: str) -> tuple[list[str], list[str]]:
    """(differences, notes): the HF model's tokenizer (when its folder has one) must encode as the run's; a note when
    there is none."""
    from transformers import AutoTokenizer

    try:
        theirs = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError, TypeError):
        note = f"no tokenizer files with the HF model: its token ids were not checked against {tokenizer.identity()}"
        log.warning("%s: %s", where, note)
        return [], [note]
    try:
        check_same(theirs, tokenizer, f"its tokenizer there, data.tokenizer={tokenizer.name} here")
    except ConfigError as err:
        return [str(err)], []
    return [], []


def init_state(source: str, model: GPT, tokenizer, key: str = "train.init_from") -> tuple[dict, list[str]]:
    """(`model`'s state dict from HF GPT-2 `source`, notes for the run's init_from record); the HF config must
    describe `model`, its tensors fit it and its tokenizer (if it has one) encode as `tokenizer`, else a one-line
    ConfigError naming every difference at once."""
    where = f"{key}={HF_PREFIX}{source}"
    with no_progress_bars():  # transformers' "Loading weights"
        theirs = load_pretrained(source, where)
        diffs = config_differences(theirs.config, model)
        tokenizer_diffs, notes = _check_tokenizer(source, tokenizer, where)
    hf_state = theirs.state_dict()
    diffs += tokenizer_diffs + weight_differences(hf_state, theirs.config.n_layer, model)
    if diffs:
        raise _refused(where, diffs)
    state = from_hf_state(hf_state, model, where)
    if theirs.config.n_positions > model.cfg.block_size:
        notes.append(
            f"n_positions={theirs.config.n_positions} there, model.block_size={model.cfg.block_size} here "
            f"(the first {model.cfg.block_size} position rows kept)"
        )
    return state, notes


def export_notes(model: GPT) -> list[str]:
    """What the HF GPT-2 form of `model` writes differently from gptlab's (same logits, other parameters)."""
    if hf_architecture(model) == "llama":
        return ["written as Hugging Face Llama (LlamaForCausalLM): rope, rmsnorm, swiglu are not GPT-2's"]
    notes = []
    if isinstance(model.position, SinusoidalPosition):
        notes.append(
            "position=sinusoidal: written as GPT-2's position table (the fixed encodings of positions "
            f"0..{model.cfg.block_size - 1}; HF cannot run past n_positions, and would train the table)"
        )
    elif isinstance(model.position, NoPosition):
        notes.append(f"position=none: written as an all-zero position table (n_positions={model.cfg.block_size})")
    if not model.cfg.bias:
        notes.append("model.bias=false: HF GPT-2's linear biases written as zeros")
    if any(getattr(n, "bias", None) is None for n in _norms(model)):
        notes.append("norm.bias=false: HF GPT-2's LayerNorm biases written as zeros")
    if model.cfg.padded_vocab != model.cfg.vocab_size:
        notes.append(f"model.vocab_multiple: the {model.cfg.padded_vocab - model.cfg.vocab_size} padded rows dropped")
    return notes
