"""gptlab's GPT -> Hugging Face transformers' Llama (LlamaForCausalLM), for the modern choices GPT-2 cannot express.

Llama in gptlab's choices: position=rope (gptlab rotates the two halves of each head, as Llama's rotate_half, with
the same base^(-2i/head_dim) frequencies; rope_theta = position.base), norm=rmsnorm (placement=pre, a final norm;
rms_norm_eps = norm.eps), mlp=swiglu (gate/up/down; intermediate_size = its hidden width), attention=mha/gqa/mqa
(num_key_value_heads = attention.n_kv_head), model.bias -> attention_bias and mlp_bias, tied or untied head,
attention.dropout -> attention_dropout. Refused in one line: anything else (a window, QK-norm, post-norm, another
norm/MLP/position, model.dropout or mlp.dropout > 0: Llama has no residual or MLP dropout). Export only: a Llama
checkpoint does not come back in through train.init_from.
"""

from __future__ import annotations

from typing import Any

import torch

from gptlab.errors import ConfigError
from gptlab.model.attention.gqa import GroupedQueryAttention
from gptlab.model.gpt import GPT
from gptlab.model.mlp.swiglu import SwiGLU
from gptlab.model.norm.rmsnorm import RMSNorm
from gptlab.model.position.rope import RotaryPosition
from gptlab.util.extras import require


def _refuse(what: str, why: str) -> ConfigError:
    return ConfigError(f"{what}: Hugging Face's Llama cannot express it ({why})")


def _name(family: str, module: object) -> str:
    return f"{family}={type(module).__module__.rsplit('.', 1)[-1]}"


def _one(values: set, what: str):
    if len(values) != 1:
        raise _refuse(f"{what} {sorted(values)}", "the same in every layer")
    return values.pop()


def _check_norms(model: GPT) -> float:
    blocks = list(model.blocks)
    norms = [model.norm_f, *(b.norm1 for b in blocks), *(b.norm2 for b in blocks if b.norm2 is not None)]
    for norm in norms:
        if type(norm) is not RMSNorm:
            raise _refuse(_name("norm", norm), "RMSNorm only")
    if any(b.placement != "pre" for b in blocks):
        raise _refuse("norm.placement=post", "pre-norm blocks only")
    return float(_one({n.eps for n in norms}, "norm eps"))


def _check_attention(model: GPT) -> tuple[int, float]:
    """(key/value heads, attention-probability dropout) of every layer."""
    found = set()
    for block in model.blocks:
        attn: Any = block.attn
        if type(attn) is not GroupedQueryAttention:
            raise _refuse(_name("attention", attn), "grouped-query attention only")
        if attn.window is not None:
            raise _refuse(f"attention.window={attn.window}", "full causal attention only")
        if attn.q_norm is not None:
            raise _refuse("attention.qk_norm=true", "no norm on queries and keys")
        found.add((attn.n_kv_head, attn.dropout))
    return _one(found, "attention (n_kv_head, dropout)")


def _check_mlp(model: GPT) -> int:
    hidden = set()
    for block in model.blocks:
        mlp: Any = block.mlp
        if type(mlp) is not SwiGLU:
            raise _refuse(_name("mlp", mlp), "SwiGLU only")
        if mlp.dropout:
            raise _refuse(f"mlp.dropout={mlp.dropout}", "no dropout inside the MLP")
        hidden.add(int(mlp.hidden))
    return int(_one(hidden, "mlp hidden width"))


def llama_config(model: GPT, eot_id: int | None = None) -> dict:
    """LlamaConfig's arguments for `model` (the same function), or a one-line ConfigError naming what it cannot be."""
    if type(model) is not GPT or model.layer_counts is not None:
        raise _refuse(type(model).__name__, "a plain gptlab GPT only")
    cfg = model.cfg
    if cfg.parametrization != "sp":  # its logits x 1/m and q·k/head_dim scores are no HF config's
        raise _refuse(f"model.parametrization={cfg.parametrization}", "the standard parametrization only")
    if type(model.position) is not RotaryPosition:
        raise _refuse(_name("position", model.position), "rotary positions only")
    eps = _check_norms(model)
    n_kv_head, attn_dropout = _check_attention(model)
    hidden = _check_mlp(model)
    if cfg.dropout:
        raise _refuse(f"model.dropout={cfg.dropout}", "no dropout on the embeddings or the residual stream")
    return {
        "vocab_size": cfg.vocab_size,  # model.vocab_multiple's padded rows are never predicted: not exported
        "hidden_size": cfg.d_model,
        "intermediate_size": hidden,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": n_kv_head,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.block_size,  # the trained length; RoPE itself runs past it
        "rms_norm_eps": eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": float(model.position.base)},
        "attention_bias": cfg.bias,
        "mlp_bias": cfg.bias,
        "attention_dropout": attn_dropout,
        "initializer_range": cfg.init_std,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": eot_id,
        "eos_token_id": eot_id,
    }


@torch.no_grad()
def to_llama_state(model: GPT) -> dict[str, torch.Tensor]:
    """HF Llama tensors of `model` (fp32 copies): qkv split into q/k/v, the padded vocabulary rows dropped."""
    ours = {k: v.float() for k, v in model.state_dict().items()}
    cfg, vocab = model.cfg, model.cfg.vocab_size
    attn: Any = next(iter(model.blocks)).attn
    kv = int(attn.n_kv_head) * cfg.head_dim
    out = {"model.embed_tokens.weight": ours["wte.weight"][:vocab], "model.norm.weight": ours["norm_f.weight"]}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = ours["lm_head.weight"][:vocab]
    for i in range(cfg.n_layer):
        g, h = f"blocks.{i}.", f"model.layers.{i}."
        out[h + "input_layernorm.weight"] = ours[g + "norm1.weight"]
        out[h + "post_attention_layernorm.weight"] = ours[g + "norm2.weight"]
        for kind in ("weight", "bias") if cfg.bias else ("weight",):
            q, k, v = ours[f"{g}attn.qkv.{kind}"].split([cfg.n_head * cfg.head_dim, kv, kv])  # rows: q | k | v
            out |= {
                f"{h}self_attn.q_proj.{kind}": q,
                f"{h}self_attn.k_proj.{kind}": k,
                f"{h}self_attn.v_proj.{kind}": v,
            }
            out[f"{h}self_attn.o_proj.{kind}"] = ours[f"{g}attn.proj.{kind}"]
            for theirs, mine in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
                out[f"{h}mlp.{theirs}.{kind}"] = ours[f"{g}mlp.{mine}.{kind}"]
    return {k: v.contiguous().clone() for k, v in out.items()}


def to_llama(model: GPT, eot_id: int | None = None):
    """A transformers LlamaForCausalLM (fp32, eval mode) computing what `model` computes."""
    require("transformers", "hf", "Hugging Face Llama")
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**llama_config(model, eot_id))
    hf = LlamaForCausalLM(config)  # on the CPU: the rotary frequencies are a buffer made here
    missing, unexpected = hf.load_state_dict(to_llama_state(model), strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"gptlab -> HF Llama: missing {missing[:3]}, unexpected {unexpected[:3]}")
    if config.tie_word_embeddings:
        hf.tie_weights()
    return hf.float().eval()
