"""Model and optimizer state of hardware.strategy=fsdp in torch.distributed.checkpoint (DCP) form.

Tensors are keyed by parameter name (torch.distributed.checkpoint.state_dict), so a checkpoint written by N ranks
loads into M ranks (DCP reads each rank's slices) or into one plain process. Only tensors go into the DCP files:
the optimizer's hyper-parameters come from the config, never the file (as for single-file checkpoints).
"""

from __future__ import annotations

from pathlib import Path

import torch.distributed as dist


def _optimizers(optimizer) -> list:
    """The torch optimizers inside `optimizer` (an OptimizerSet, e.g. Muon + AdamW, is its members)."""
    return list(getattr(optimizer, "optimizers", [optimizer]))


def tensors(model, optimizer=None) -> dict:
    """{"model": name -> tensor, "optimizer": {"state": name -> {key: tensor}}}: what a DCP checkpoint holds.

    Under FSDP2 the tensors are this rank's DTensor shards; in one process, the plain tensors. An optimizer whose
    state is empty (one about to be loaded into) is first filled by torch with a zero-learning-rate step.
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    model_sd, optim_sd = get_state_dict(model, _optimizers(optimizer))
    return {"model": model_sd, "optimizer": {"state": optim_sd["state"]}}


def _has_state(optimizer) -> bool:
    return all(len(opt.state) for opt in _optimizers(optimizer))


def save(run_dir: Path, step: int, model, optimizer, state: dict, rank: int, world: int) -> Path:
    """Collective: checkpoint `step` as a DCP dir (see checkpoint.save_sharded); `state` is everything else.

    An optimizer without state yet (every step so far skipped as non-finite, or SGD without momentum) is left out:
    torch would invent its moments with a zero-learning-rate step, which changes AdamW's step count.
    """
    from gptlab.state import checkpoint

    rest = {k: v for k, v in state.items() if k not in ("model", "optimizer")}
    held = tensors(model, optimizer if _has_state(optimizer) else None)
    return checkpoint.save_sharded(run_dir, step, held, rest, rank, world)


def _holds_optimizer(path: str | Path) -> bool:
    """Whether DCP checkpoint `path` has optimizer tensors (see save)."""
    from torch.distributed.checkpoint import FileSystemReader

    return any(key.startswith("optimizer.") for key in FileSystemReader(str(path)).read_metadata().state_dict_metadata)


def load(path: str | Path, model, optimizer=None) -> None:
    """Collective: read DCP checkpoint `path` into `model` (and `optimizer`), whatever world size wrote it.

    A name or shape the checkpoint lacks or has otherwise is a RuntimeError (resume.restore names the key).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    from gptlab.state.checkpoint import first_line, single_process_quiet

    if optimizer is not None and not _holds_optimizer(path):
        optimizer = None  # saved before the optimizer had state: it starts empty here too
    want = tensors(model, optimizer)
    try:
        with single_process_quiet():
            dcp.load(want, checkpoint_id=str(path), no_dist=not dist.is_initialized())
    except (CheckpointException, KeyError, ValueError) as err:  # CheckpointException is a BaseException
        raise RuntimeError(first_line(err)) from None
    if optimizer is None:
        set_model_state_dict(model, want["model"])
        return
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    groups = get_optimizer_state_dict(model, _optimizers(optimizer))["param_groups"]  # this run's own groups
    set_state_dict(
        model,
        _optimizers(optimizer),
        model_state_dict=want["model"],
        optim_state_dict={"state": want["optimizer"]["state"], "param_groups": groups},
    )


def load_full(state: dict, model, optimizer=None) -> None:
    """A single-file checkpoint's full tensors into an FSDP2-sharded `model` (each rank keeps its slices).

    The file's optimizer state is keyed by position in its param groups, which the same config builds in the
    same order here; it is re-keyed by parameter name for torch's sharded loader.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_state_dict

    options = StateDictOptions(full_state_dict=True)
    if optimizer is None:
        set_model_state_dict(model, state["model"], options=options)
        return
    set_state_dict(
        model,
        _optimizers(optimizer),
        model_state_dict=state["model"],
        optim_state_dict=_by_name(model, optimizer, state["optimizer"]),
        options=options,
    )


def _by_name(model, optimizer, saved: dict) -> dict:
    """A torch optimizer state_dict (state keyed 0, 1, ... in param-group order) keyed by parameter name."""
    names = {id(p): n for n, p in model.named_parameters()}
    members = saved.get("members", [saved])  # an OptimizerSet saves its members' state dicts
    state, groups = {}, []  # type: dict, list
    for opt, sd in zip(_optimizers(optimizer), members):
        order = [names[id(p)] for g in opt.param_groups for p in g["params"]]
        state |= {order[int(i)]: s for i, s in sd["state"].items()}
        groups += [
            {**{k: v for k, v in g.items() if k != "params"}, "params": [names[id(p)] for p in g["params"]]}
            for g in opt.param_groups
        ]
    return {"state": state, "param_groups": groups}


def is_sharded(model) -> bool:
    """True for a module FSDP2 has sharded (its parameters are DTensors)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())
