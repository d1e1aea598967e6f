"""How the width sets a GPT's init, its per-matrix learning rates and its output scale: `model.parametrization`.

`sp` (the default) is the standard parametrization: GPT-2's init (std `model.init_std` whatever the width) and one
`optimizer.lr` for every parameter. Its best lr moves as the model widens.

`mup` is the maximal update parametrization (Yang et al. 2022, "Tensor Programs V"; the conventions of the
microsoft/mup package, multiplier form): with the width multiplier m = d_model / model.mup_base_width, each parameter
is scaled by its role, so the hyper-parameters tuned at the base width hold at any width:

    role     what                                  init std         Adam-like lr    weight decay
    hidden   matrices inside the blocks            x 1/sqrt(m)      x 1/m           x m
    input    token (and position) embeddings       unchanged        unchanged       unchanged
    output   an untied LM head                     unchanged        unchanged       unchanged
    vector   norm gains, biases (any < 2-D)        unchanged        unchanged       (none)

and the logits are multiplied by 1/m (the output multiplier: it acts the same on an untied head and on tied
embeddings, whose shared table must keep the input's init and lr), and attention scores are q·k/head_dim instead of
q·k/sqrt(head_dim). A hidden group's weight decay is multiplied by m so that lr·weight_decay, the factor torch's
AdamW and Lion shrink a weight by per step, stays the one tuned at the base width (microsoft/mup's MuAdamW default).
At m = 1 muP is SP except for the attention scale: the same init bits, lrs and logits.

Roles: a parameter of an nn.Embedding or of the position module is `input`, the LM head's own (untied) weight
`output`, any other parameter with fewer than 2 dimensions `vector`, every other one `hidden`. A component whose
parameters this misreads (a matrix with only one dimension that grows with d_model, say) defines
`mup_roles() -> {parameter name, as its own named_parameters() spells it: role}`; it overrides the defaults for
those parameters. An attention opts into the 1/head_dim scores by having a `mup_q_scale` attribute (None under
SP) that scales q before `self.attend(...)`; one without it is refused under mup in one line.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn

from gptlab.errors import ConfigError

ROLES = ("input", "hidden", "output", "vector")
ADAM_LIKE = "adamw or lion"  # the optimizers whose groups get muP's lr multipliers (entry-wise normalised updates)


def _cfg(model: nn.Module) -> Any:
    return getattr(model, "cfg", None)


def is_mup(model: nn.Module) -> bool:
    """Whether `model` (a GPT: anything with a GPTConfig `cfg`) is built under model.parametrization=mup."""
    return getattr(_cfg(model), "parametrization", "sp") == "mup"


def width_multiplier(model: nn.Module) -> float:
    """m = d_model / model.mup_base_width under mup; 1.0 under sp."""
    cfg = _cfg(model)
    return cfg.d_model / cfg.mup_base_width if is_mup(model) else 1.0


def _default_roles(model: nn.Module) -> dict[int, str]:
    """{id(parameter): role} by the rules in the module docstring (shared tensors once: a tied head is input)."""
    inputs = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    position = getattr(model, "position", None)
    if isinstance(position, nn.Module):
        inputs |= {id(p) for p in position.parameters()}
    head = getattr(model, "lm_head", None)
    output = id(head.weight) if isinstance(head, nn.Linear) else None
    out = {}
    for p in model.parameters():
        if id(p) in inputs:
            out[id(p)] = "input"
        elif id(p) == output:
            out[id(p)] = "output"
        else:
            out[id(p)] = "vector" if p.dim() < 2 else "hidden"
    return out


def roles(model: nn.Module) -> dict[int, str]:
    """{id(parameter): its muP role} for every parameter of `model`; components override with `mup_roles()`."""
    found = _default_roles(model)
    for module in model.modules():
        declared = getattr(module, "mup_roles", None)
        if not callable(declared):
            continue
        params = dict(module.named_parameters())
        for pname, role in declared().items():
            if role not in ROLES or pname not in params:
                raise ConfigError(
                    f"model.parametrization=mup: {type(module).__name__}.mup_roles() names {pname!r} as {role!r}; "
                    f"allowed: its own parameters ({', '.join(params) or 'none'}) as one of {', '.join(ROLES)}"
                )
            found[id(params[pname])] = role
    return found


def prepare(model: nn.Module) -> float | None:
    """Set each attention's `mup_q_scale` (1/sqrt(head_dim)) under mup; returns the logits' multiplier, 1/m (None
    under sp: the forward then multiplies nothing). Draws nothing from the RNG."""
    if not is_mup(model):
        return None
    for block in getattr(model, "blocks", ()):
        attn = block.attn
        if not hasattr(attn, "mup_q_scale"):
            raise ConfigError(
                f"model.parametrization=mup: attention {type(attn).__name__} cannot score q·k/head_dim (give it a "
                "mup_q_scale attribute that scales q before attend, gptlab/model/parametrization.py); allowed: sp"
            )
        attn.mup_q_scale = 1 / math.sqrt(attn.head_dim)
    m = width_multiplier(model)
    return None if m == 1 else 1 / m


@torch.no_grad()
def rescale_init(model: nn.Module) -> None:
    """Under mup, hidden matrices as drawn x 1/sqrt(m) (their std: init_std/sqrt(m), the fan-in rule); a no-op under
    sp and at m = 1. Runs after the components' own init, so it draws nothing and every other weight is as under sp."""
    m = width_multiplier(model)
    if m == 1:
        return
    role = roles(model)
    for p in model.parameters():
        if role[id(p)] == "hidden":
            p.mul_(1 / math.sqrt(m))


def lr_groups(model: nn.Module, groups: list[dict], lr: float | None) -> list[dict]:
    """`groups` (optimizer param groups) as they are under sp; under mup each split into its hidden matrices (lr x
    1/m, weight_decay x m) and the rest, every group with its `lr_mult` and its own `lr` (= lr x lr_mult, so the
    optimizer as built is already muP and the loop's schedule scales each group's own lr). The first group keeps
    multiplier 1 (train/lr logs it)."""
    if not is_mup(model):
        return groups
    if lr is None:
        raise ConfigError(
            "model.parametrization=mup: this optimizer builds its groups without lr (pass lr= to "
            f"gptlab.optim.param_groups); allowed: optimizer={ADAM_LIKE}, or model.parametrization=sp"
        )
    m, role = width_multiplier(model), roles(model)
    rest, hidden = [], []
    for group in groups:
        keys = {k: v for k, v in group.items() if k != "params"}
        params = list(group["params"])
        rest.append({**keys, "params": [p for p in params if role[id(p)] != "hidden"], "lr": lr, "lr_mult": 1.0})
        matrices = [p for p in params if role[id(p)] == "hidden"]
        if matrices:
            decay = keys.get("weight_decay", 0.0) * m
            hidden.append({**keys, "params": matrices, "lr": lr / m, "lr_mult": 1 / m, "weight_decay": decay})
    return [g for g in rest if g["params"]] + hidden


def refuse(model: nn.Module, optimizer: str) -> None:
    """One-line ConfigError under mup for an optimizer whose updates muP's lr rule does not fit (SGD, Muon)."""
    if is_mup(model):
        raise ConfigError(
            f"optimizer={optimizer}: model.parametrization=mup scales the lr of Adam-like updates only; "
            f"allowed: optimizer={ADAM_LIKE}, or model.parametrization=sp"
        )
