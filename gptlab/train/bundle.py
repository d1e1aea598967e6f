"""The build step of a run: a validated config in, one bundle of built things out (gptlab.train.run's second step).

Everything the loop needs is constructed here, once, with its final settings: the hardware profile (this rank's
device and thread count included), the data, the model (checked, with its activation-checkpointing switch), its
DDP / FSDP2 wrapper, optimizer, schedule, GradScaler and the loop's Context. The memory check runs before any
tensor of the model is allocated.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from gptlab.config import build
from gptlab.config.match import describe as describe_match
from gptlab.config.noop import noop_choices
from gptlab.config.settings import TrainSettings, train_settings
from gptlab.costs.memory import check_fits
from gptlab.costs.report import train_flops_per_token
from gptlab.costs.sharding import micro_batch
from gptlab.data import default_cache_dir
from gptlab.errors import ConfigError
from gptlab.model.checks import check_model
from gptlab.model.fingerprint import model_fingerprint
from gptlab.runtime import distributed
from gptlab.runtime.cpu_load import load_at_start
from gptlab.runtime.hardware import Hardware, dtype_reason
from gptlab.runtime.threads import thread_choice

log = logging.getLogger(
    "gptlab.train.run"
)  # the run's own messages keep one logger name ([gptlab.train.run] in run.log)


@dataclass
class Context:
    """Where and as whom the loop runs: run dir, rank/world, MFU inputs, the run identity checkpoints carry, and
    whether checkpoints are sharded (DCP dirs every rank writes: hardware.strategy=fsdp) or one file rank 0 writes."""

    run_dir: Path
    flops_per_token: float
    peak_flops: float | None
    identity: dict = field(default_factory=dict)
    rank: int = 0
    world: int = 1
    sharded: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0


@dataclass
class Bundle:
    """The built run. `identity` is what checkpoints carry and resumes compare; `lr_factors(max_steps, steps)` gives
    another schedule's first factors (resume.find compares them when train.max_steps changed)."""

    hardware: Hardware
    settings: TrainSettings
    data: Any
    model: Any  # gptlab.model.GPT
    forward_model: Any  # the model under DDP / FSDP2 / torch.compile, what the loop calls forward on
    optimizer: torch.optim.Optimizer
    schedule: Callable[[int], float]
    scaler: torch.amp.GradScaler
    ctx: Context
    identity: dict
    lr_factors: Callable[[int, int], list[float]]
    threads_why: str = ""  # where hardware.threads came from (provenance.json: hardware.cpu_threads_source)
    match: dict | None = None  # model.match: the re-solved size knob and its residual (gptlab/config/match.py)
    probes: list = field(default_factory=list)  # capability probes measured at each eval (gptlab.train.probes)
    val_sets: tuple = ()  # extra named validation sets scored at each eval (data.val_sets, gptlab/data/val_sets.py)


def build_bundle(cfg: DictConfig, hardware: Hardware, run_dir: Path, choices: dict) -> Bundle:
    """Build every part of the run `cfg` describes (validated: `hardware` is validate's), in the order their inputs
    need."""
    hardware, rank, world, threads_why = _placed(hardware, str(cfg.hardware.dtype))
    hardware = _as_launched(cfg, hardware, world)
    settings = train_settings(cfg)
    _check_batch(settings, world)
    _warn_short_run(cfg, settings)
    data = build.build_data(cfg, int(cfg.model.block_size))
    _check_memory(cfg, hardware, settings, data, world, choices)
    matched = build.matched(cfg, data.vocab_size)[1]
    if matched:  # model.match: say what was re-solved before training it
        log.info("model.match: %s", describe_match(matched))
    model = _model(cfg, hardware, data, settings.seed, choices)
    identity = {
        "config": build.plain_config(cfg),
        "choices": choices,
        "data": data.fingerprint,
        # an edited val set file changes no config key: its fingerprint refuses the resume (absent without sets)
        **({"val_sets": {s.name: s.fingerprint for s in data.val_sets}} if data.val_sets else {}),
        "model": model_fingerprint(model),
        "world": world,
        "dtype": hardware.dtype,
    }
    # DDP (compiled per hardware.compile) or FSDP2 in place; the optimizer after it: fully_shard swaps the parameters
    forward_model = distributed.wrap(model, hardware, world)
    ctx = Context(
        run_dir=run_dir,
        flops_per_token=float(train_flops_per_token(model, data.seq_len)),
        peak_flops=hardware.resolved_peak_flops(default_cache_dir()),
        identity=identity,
        rank=rank,
        world=world,
        sharded=hardware.strategy == "fsdp",
    )

    def lr_factors(max_steps: int, steps: int) -> list[float]:
        other = build.build_schedule(cfg, max_steps)
        return [other(i) for i in range(steps)]

    return Bundle(
        hardware=hardware,
        settings=settings,
        data=data,
        model=model,
        forward_model=forward_model,
        optimizer=build.build_optimizer(cfg, model),
        schedule=build.build_schedule(cfg, settings.max_steps),
        scaler=torch.amp.GradScaler(hardware.device.split(":")[0], enabled=hardware.dtype == "fp16"),
        ctx=ctx,
        identity=identity,
        lr_factors=lr_factors,
        threads_why=threads_why,
        match=matched,
        probes=build.build_probes(cfg, data, model),  # their fixed sets from data_seed, after the model (learned?)
        val_sets=tuple(data.val_sets),  # the text choices' data.val_sets (assoc_recall has none)
    )


def _model(cfg: DictConfig, hardware: Hardware, data, seed: int, choices: dict):
    """The model on its device from `seed`, checked as the contract tests check it; no-op choices said out loud."""
    torch.manual_seed(seed)
    model = build.build_model(
        cfg,
        vocab_size=data.vocab_size,
        device=hardware.device,
        activation_checkpointing=hardware.activation_checkpointing,
    )
    check_model(
        model,
        vocab_size=data.vocab_size,
        seq_len=data.seq_len,
        device=hardware.device,
        dtype=hardware.torch_dtype,
        data_name=data.name,
        doc_mask=getattr(data, "doc_mask", False),
    )  # the same checks the contract tests run
    for line in noop_choices(cfg, choices):  # e.g. GQA with n_kv_head == n_head is MHA: say so before training it
        log.warning("no-op choice: %s", line)
    return model


def _placed(hardware: Hardware, configured_dtype: str) -> tuple[Hardware, int, int, str]:
    """(the profile with this rank's device and thread count, rank, world size, where the thread count came from);
    joins the process group if any."""
    rank, world, device = 0, 1, hardware.device
    if hardware.distributed:
        rank, world, device = distributed.setup(hardware.device)
    threads, why = thread_choice(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    threads, why = (hardware.threads, "hardware.threads") if hardware.threads else (threads, why)
    log.info(
        "device %s, dtype %s (%s), %d torch threads (%s), %s",
        device,
        hardware.dtype,
        dtype_reason(device, hardware.dtype, configured_dtype),
        threads,
        why,
        load_at_start(),
    )
    hardware = dataclasses.replace(hardware, device=device, threads=threads)
    hardware.apply()
    return hardware, rank, world, why


def _as_launched(cfg: DictConfig, hardware: Hardware, world: int) -> Hardware:
    """The job's real shape in the config the run records (provenance, checkpoints, W&B): torchrun picks its nodes
    and ranks per node itself, so hardware.nodes / tasks_per_node would say 1 and the profile's count. Both keys are
    curve-free (a resume checks the world size on its own); Hydra's .hydra/config.yaml keeps what was composed."""
    nodes, per_node = distributed.topology(world)
    if world <= 1 or (hardware.nodes, hardware.tasks_per_node) == (nodes, per_node):
        return hardware
    OmegaConf.update(cfg, "hardware.nodes", nodes, force_add=True)
    OmegaConf.update(cfg, "hardware.tasks_per_node", per_node, force_add=True)
    return dataclasses.replace(hardware, nodes=nodes, tasks_per_node=per_node)


def _warn_short_run(cfg: DictConfig, settings: TrainSettings) -> None:
    """A run mostly spent in lr warm-up compares arms at a learning rate none of them trains at for long: say so."""
    warmup = cfg.get("schedule", {}).get("warmup_steps")
    if isinstance(warmup, int) and 4 * warmup > settings.max_steps:
        log.warning(
            "schedule.warmup_steps=%d is %.0f%% of train.max_steps=%d: most of this run is lr warm-up "
            "(lower schedule.warmup_steps or train more steps for a verdict about the trained model)",
            warmup,
            100 * min(1.0, warmup / settings.max_steps),
            settings.max_steps,
        )


def _check_batch(settings: TrainSettings, world: int) -> None:
    """Every rank takes an equal share of every micro-batch (an empty or uneven share skews the loss)."""
    if settings.batch_size % (settings.grad_accum * world):
        raise ConfigError(
            f"train.batch_size={settings.batch_size} must be divisible by train.grad_accum x world size "
            f"= {settings.grad_accum} x {world}; allowed: a multiple of {settings.grad_accum * world}"
        )


def _check_memory(
    cfg: DictConfig, hardware: Hardware, settings: TrainSettings, data, world: int, choices: dict
) -> None:
    """gptlab-flops' training-memory estimate, from the config on the meta device, against the free memory."""
    micro = micro_batch(settings.batch_size, settings.grad_accum, world)  # gptlab-flops' memory splits it so too
    report = build.cost_report(cfg, micro, data.seq_len, vocab_size=data.vocab_size, dtype=hardware.dtype).to_dict()
    # the fixed validation sets live in memory for the whole run: x and y, int64, (sequences, T) each
    sequences = settings.eval_sequences + sum(s.count(settings.eval_sequences) for s in data.val_sets)
    report["memory"]["eval_bytes"] = sequences * data.seq_len * 2 * 8
    if hardware.strategy == "fsdp":  # one rank's share: sharded weights, grads and state, plus the gathered blocks
        from gptlab.costs.sharding import Sharding

        report = per_rank_report(
            report,
            build.rank_memory(
                cfg,
                Sharding("fsdp", world, hardware.reshard_after_forward, cpu_offload=hardware.cpu_offload),
                batch_size=settings.batch_size,
                grad_accum=settings.grad_accum,
                seq_len=data.seq_len,
                vocab_size=data.vocab_size,
                dtype=hardware.dtype,
            ),
        )
    check_fits(
        report,
        hardware.device,
        label=f"model={choices['model']}" if "model" in choices else "this run",
        processes=int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if hardware.device == "cpu" else 1,
    )


def per_rank_report(report: dict, memory: dict) -> dict:
    """The memory check's report (CostReport.to_dict()) with one rank's figures from costs.sharding.per_rank."""
    mem = report["memory"] | {
        "weights_bytes": memory["params_bytes"],
        "grads_bytes": memory["grads_bytes"],
        "optimizer_bytes": memory["optimizer_bytes"],
        "autocast_copy_bytes": memory["autocast_copy_bytes"],
        "unsharded_bytes": memory["unsharded_bytes"],  # fsdp: the blocks gathered for compute, their full grads
        "activations_bytes": memory["activations_bytes"],
        "train_estimate_bytes": memory["total_bytes"],
    }
    return report | {"memory": mem}
