"""Strict resume: a checkpoint continues only the run it came from.

A checkpoint carries the run's identity (resolved config, group choices, data and model fingerprints,
world size) and its progress (step, tokens, losses, speed samples, wall time, peak memory, every RNG,
the fp16 scaler). `check` refuses any difference that can change the curve, bar the keys the run calls free
(`free`: the keys whose schema rule says curve=False, gptlab/config/schema.py curve_free_keys; a trailing "." frees a
whole subtree); `train.max_steps` may grow only while the LR of every finished step stays the same. To continue under
another config, start a NEW run from the checkpoint with `train.init_from=<path>` (recorded as such).
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import cast

import torch

from gptlab.errors import ConfigError
from gptlab.state import checkpoint
from gptlab.state.layout import ADDED_KEYS
from gptlab.util.tree import flatten

log = logging.getLogger(__name__)

HF_PREFIX = "hf:"  # train.init_from=hf:<hub name or local folder>: Hugging Face GPT-2 weights (gptlab/interop/hf.py)
EXTENDABLE = "schedule=constant, or schedule=wsd while the finished steps are before its decay"


@dataclass
class Progress:
    """Where a run stands: what the summary reports is computed from this alone, so a resume keeps every figure."""

    step: int = 0
    tokens: int = 0
    best_val_loss: float = math.inf
    last_val_loss: float | None = None
    last_val_step: int | None = None  # the step last_val_loss was measured at
    nan_seen: int = 0
    wall_s: float = 0.0
    # seconds in training steps alone (the step time of every step, warm-up included; evals, probes, checkpoints and
    # the diagnostics' own time left out); None for a run begun before it was kept, which cannot know its own
    train_s: float | None = 0.0
    peak_mem_bytes: int = 0
    tokens_per_s: list = field(default_factory=list)  # per timed step, after speed_warmup
    step_ms: list = field(default_factory=list)
    data_ms: list = field(default_factory=list)  # of step_ms, the wait for the step's batches
    mfu: list = field(default_factory=list)
    warmup_ms: list = field(default_factory=list)  # step times of the first train.speed_warmup steps (not timed ones)
    outside_ticks: int = 0  # CPU ticks other processes used while this run trained (after speed_warmup)...
    total_ticks: int = 0  # ...out of all cores' ticks: outside_load = outside_ticks / total_ticks
    sibling_ticks: int = 0  # CPU ticks the same sweep's other runs used (gptlab-sweep's local queue), apart
    init_from: dict | None = None  # train.init_from's record (checkpoint, step, differences): kept across resumes
    last_probes: dict = field(default_factory=dict)  # the last eval's probe/* values (summary.json carries them)
    probe_s: float = 0.0  # seconds spent measuring probes (outside step time, like eval)
    last_val_sets: dict = field(default_factory=dict)  # the last eval's val/<name>/loss per data.val_sets set
    started_at: float | None = None  # when the run first started training (epoch s); a resume keeps it


@dataclass
class Start:
    """How a run begins: fresh, resuming its own checkpoint, or initialised from another run's (init_from)."""

    kind: str = "fresh"  # fresh | resume | init
    state: dict | None = None
    source: str = ""
    differences: list = field(default_factory=list)  # init_from: the config keys that differ from the checkpoint's
    optimizer_state: bool = True  # init_from: load the moments only when the optimizer choice is the same


def _free(key: str, free: Collection[str]) -> bool:
    """Whether `key` is one of `free` or under one of its subtrees ("logger.")."""
    return any(key.startswith(f) if f.endswith(".") else key == f for f in free)


def differences(saved: dict, current: dict, free: Collection[str]) -> list[str]:
    """'key=value there, value here' for each curve-changing difference (any key but the `free` ones); a changed group
    choice stands for its keys."""
    have_c, want_c = saved.get("choices", {}), current.get("choices", {})
    groups = sorted(g for g in set(have_c) | set(want_c) if have_c.get(g) != want_c.get(g) and not _free(g + ".", free))
    out = [f"{g}={have_c.get(g)} there, {want_c.get(g)} here" for g in groups]
    have, want = flatten(saved.get("config")), flatten(current.get("config"))
    have = {**{k: v for k, v in ADDED_KEYS.items() if k in want}, **have}  # a checkpoint from before a key existed
    for key in sorted(set(have) | set(want)):
        same = have.get(key) == want.get(key)
        if same or key == "train.max_steps" or _free(key, free) or key.split(".")[0] in groups:
            continue
        out.append(f"{key}={have.get(key, '<absent>')} there, {want.get(key, '<absent>')} here")
    what = {
        "world": "world size",
        "dtype": "resolved hardware.dtype",
        "data": "data fingerprint (corpus content, tokenizer, split)",
        "val_sets": "data.val_sets fingerprints (each set's content, tokenizer, cap)",
        "model": "model fingerprint (module classes, hyper-parameters, shapes)",
    }
    for key in what:  # the fingerprints are the backstop for what no config key explains (an edited corpus file)
        if key == "world" and _reshards(saved) and _reshards(current):
            continue  # DCP checkpoints load into any world size (the curve then matches to float rounding)
        if saved.get(key) != current.get(key) and (key in ("world", "dtype") or not out):
            out.append(f"{what[key]}={saved.get(key)} there, {current.get(key)} here")
    return out


def _reshards(identity: dict) -> bool:
    """True for a run whose checkpoints are sharded (hardware.strategy=fsdp): they resume on any world size."""
    return flatten(identity.get("config")).get("hardware.strategy") == "fsdp"


def _check_max_steps(saved_max: int, max_steps: int, done: int, lr_factors: Callable, source: str) -> None:
    """A changed train.max_steps is refused unless every finished step's LR is unchanged by it."""
    if max_steps < done:
        raise ConfigError(
            f"train.max_steps={max_steps}: checkpoint {source} is already at step {done}; allowed: >= {done}"
        )
    before, after = lr_factors(saved_max, done), lr_factors(max_steps, done)
    changed = next((s for s in range(done) if before[s] != after[s]), None)
    if changed is not None:
        raise ConfigError(
            f"train.max_steps={saved_max} there, {max_steps} here: the schedule gives step {changed} "
            f"another LR ({before[changed]:.6g} vs {after[changed]:.6g} x lr); only {EXTENDABLE} can be "
            f"extended; continue as a new run instead: train.init_from=<checkpoint> hydra.run.dir=<new dir>"
        )


def check(state: dict, current: dict, source: str, lr_factors: Callable, free: Collection[str]) -> None:
    """Refuse a checkpoint whose run differs from this one in anything that can change the curve (one line)."""
    saved = state.get("identity")
    if not isinstance(saved, dict) or "config" not in saved:
        raise ConfigError(
            f"train.resume: checkpoint {source} records no config (written by an older gptlab), so "
            f"it cannot be checked; start a new run from it with train.init_from=<checkpoint>"
        )
    diffs = differences(saved, current, free)
    if diffs:
        raise ConfigError(
            f"train.resume: checkpoint {source} belongs to a run with another config: "
            f"{'; '.join(diffs)}; use a new hydra.run.dir (train.init_from=<checkpoint> starts a new "
            f"run from it) or train.resume=never in an empty dir"
        )
    saved_max = flatten(saved["config"]).get("train.max_steps")
    max_steps = flatten(current["config"])["train.max_steps"]
    if saved_max != max_steps:
        _check_max_steps(int(cast(int, saved_max)), int(max_steps), int(state["step"]), lr_factors, source)


def find(
    resume: str,
    init_from: str | None,
    run_dir: Path,
    current: dict,
    lr_factors: Callable,
    hf_init: Callable[[str], tuple[dict, list[str]]] | None = None,
    *,
    free: Collection[str],
) -> Start:
    """What this run starts from, checked before any run file is written (a refusal leaves the dir untouched).

    `hf_init(source)` -> (model state dict, notes) loads train.init_from=hf:<source> (gptlab/interop/hf.py); `free`:
    the config keys a resume may change (see `differences`)."""
    if resume == "never":
        newest = checkpoint.latest_path(run_dir)
        if newest is not None:
            raise ConfigError(
                f"train.resume=never: {checkpoint.ckpt_dir(run_dir)} holds checkpoints of an earlier "
                f"run (newest {newest.name}); use a new hydra.run.dir, or move that folder away first"
            )
        state, source = None, ""
    elif resume == "auto":
        state, source = checkpoint.load_latest(run_dir), "in the run dir"
    else:
        state, source = checkpoint.load(Path(resume)), f"'{resume}'"  # an unreadable file: its own message first
        _check_not_another_run(Path(resume), run_dir, current)
    if state is not None:
        check(state, current, source, lr_factors, free)
        return Start("resume", state, source)
    if init_from and init_from.startswith(HF_PREFIX) and hf_init is not None:
        weights, notes = hf_init(init_from[len(HF_PREFIX) :])  # Hugging Face weights: a new run at step 0
        return Start("init", {"model": weights, "step": 0}, f"'{init_from}'", notes, optimizer_state=False)
    if init_from:
        state = checkpoint.load(Path(init_from))
        saved = state.get("identity") or {}
        same_optimizer = saved.get("choices", {}).get("optimizer") == current["choices"].get("optimizer")
        diffs = differences(saved, current, free) if "config" in saved else ["the checkpoint records no config"]
        return Start("init", state, f"'{init_from}'", diffs, optimizer_state=same_optimizer)
    return Start()


def _check_not_another_run(path: Path, run_dir: Path, current: dict) -> None:
    """train.resume=<checkpoint of run Y> continues Y in a new or empty dir (or in Y's own, or where this same
    command already started it): never in a dir that holds another run, whose metrics, checkpoints and summary it
    would mix with or replace."""
    if path.resolve().is_relative_to(run_dir.resolve()):
        return
    try:
        started = json.loads((run_dir / "provenance.json").read_text()).get("config")
    except (OSError, ValueError, AttributeError):
        started = None
    if started is not None and started == current.get("config"):
        return  # this run's own dir: the same command re-run after a kill
    held = [name for name in ("metrics.jsonl", "summary.json") if (run_dir / name).exists()]
    if checkpoint.latest_path(run_dir) is not None:
        held.append("checkpoints/")
    if held:
        raise ConfigError(
            f"train.resume='{path}': hydra.run.dir '{run_dir}' holds another run ({', '.join(held)}); resume into a "
            f"new dir, or use train.resume=auto to continue the run that dir holds"
        )


def rng_state() -> dict:
    """Every RNG a run draws from: torch CPU, each CUDA device (when initialised), Python's."""
    out = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def gather_rng(world: int) -> list[dict] | None:
    """Collective on `world` > 1 ranks: every rank's rng_state(), in rank order (each draws its own dropout masks);
    None for one process."""
    if world <= 1:
        return None
    states: list = [None] * world
    torch.distributed.all_gather_object(states, rng_state())
    return states


def set_rng_state(saved: dict) -> None:
    """Restore rng_state(); CUDA states go back only where the device count matches (else a warning)."""
    torch.set_rng_state(saved["torch"])
    random.setstate(_as_tuple(saved["python"]))
    cuda = saved.get("cuda")
    if cuda and torch.cuda.is_available():
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            log.warning(
                "checkpoint has %d CUDA RNG states, this machine %d devices: dropout draws will differ",
                len(cuda),
                torch.cuda.device_count(),
            )


def _as_tuple(value):
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


def state_dict(model, optimizer, scaler, progress: Progress, identity: dict, rng_ranks: list | None = None) -> dict:
    """Everything a checkpoint holds; with several ranks, each rank's RNG state too (gather_rng)."""
    return {
        **({"rng_ranks": rng_ranks} if rng_ranks else {}),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "step": progress.step,
        "progress": asdict(progress),
        "rng": rng_state(),
        "identity": identity,
    }


def load_weights(model, optimizer, state: dict) -> None:
    """Model (and optimizer, unless None) tensors from a DCP dir or a single file, into a plain or sharded model."""
    from gptlab.state import sharded

    if "dcp" in state:
        sharded.load(state["dcp"], model, optimizer)
    elif sharded.is_sharded(model):  # a single file's full tensors into this rank's FSDP2 shards
        sharded.load_full(state, model, optimizer)
    else:
        model.load_state_dict(state["model"])
        if optimizer is not None:
            optimizer.load_state_dict(state["optimizer"])


def misfit(err: BaseException) -> str:
    """Why a checkpoint does not load into a model, in one line: torch's state_dict listing runs to many, one per key."""
    return f"{type(err).__name__}: {' '.join(str(err).split())[:160]}"


def init_record(start: Start) -> dict:
    """summary.json's and provenance.json's record of train.init_from."""
    assert start.state is not None  # an init start carries its checkpoint
    return {
        "checkpoint": start.source.strip("'"),
        "step": int(start.state["step"]),
        "differences": start.differences,
        "optimizer_state": start.optimizer_state,
    }


def _evaluated_at(state: dict) -> int | None:
    """For a checkpoint written before Progress kept last_val_step: its step if the run evaluated there (a multiple
    of train.eval_interval, or its last step), else None."""
    saved = flatten((state.get("identity") or {}).get("config"))
    step, every = int(state["step"]), saved.get("train.eval_interval")
    if isinstance(every, int) and every > 0 and (step % every == 0 or step == saved.get("train.max_steps")):
        return step
    return None


def restore(model, optimizer, scaler, start: Start, rank: int = 0, world: int = 1) -> Progress:
    """Load `start` into model/optimizer/scaler/RNGs (on a resume, this rank's own RNG state where the checkpoint
    holds one per rank of this world size); returns the progress to continue (a fresh one for init)."""
    if start.kind == "fresh":
        return Progress()
    state = start.state
    assert state is not None  # only a fresh start (returned above) has no state
    hyper = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    try:
        load_weights(model, optimizer if start.optimizer_state else None, state)
        if state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        if "rng" in state and start.kind == "resume":  # a new run draws from its own seed (dropout, sampling)
            ranks = state.get("rng_ranks") or []
            set_rng_state(ranks[rank] if len(ranks) == world else state["rng"])
        if start.kind == "resume":
            # a checkpoint from before train_s was kept: its steps' time is unknown, never restarted at 0
            older = {"last_val_step": _evaluated_at(state), "train_s": None}
            progress = Progress(**(older | state["progress"]))
        else:  # a new run: its own figures, counting on from the checkpoint's step and tokens
            tokens = int(state.get("progress", state).get("tokens", 0))
            progress = Progress(step=int(state["step"]), tokens=tokens, init_from=init_record(start))
    except (KeyError, RuntimeError, ValueError, TypeError) as err:
        raise ConfigError(
            f"train.{'resume' if start.kind == 'resume' else 'init_from'}: checkpoint {start.source} "
            f"does not fit this model ({misfit(err)})"
        ) from None
    for group, own in zip(optimizer.param_groups, hyper):  # hyper-parameters come from the config, never the file
        for key in [k for k in group if k != "params" and k not in own]:
            del group[key]  # e.g. the source run's initial_lr, which the schedule would scale instead of this lr
        group.update(own)
    log.info(
        "%s from step %d (%s)", "resumed" if start.kind == "resume" else "initialised", progress.step, start.source
    )
    return progress
