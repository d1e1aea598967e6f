"""One training run from a composed config: validate, build, train, summarise (called by gptlab-train)."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from gptlab import build, distributed, provenance
from gptlab.errors import ConfigError
from gptlab.hardware import threads_for_job
from gptlab.loop import Context, load_resume, train
from gptlab.model.attention.kernels import check_impl
from gptlab.sinks import JsonlSink, SafeSink
from gptlab.sinks.progress import ProgressSink
from gptlab.validate import validate

log = logging.getLogger(__name__)


def run_name(cfg: DictConfig, overrides: list[str]) -> str:
    """cfg.name, else the overrides that define the run (seed included), else "default"."""
    if cfg.get("name"):
        return str(cfg.name)
    keep = [o for o in overrides if not o.split("=")[0].lstrip("+~").startswith(("hydra", "train.resume", "sweep"))]
    return ",".join(keep) or "default"


def _check_model(model, data, cfg, hardware) -> None:
    if cfg.model.vocab_size is not None and cfg.model.vocab_size < data.vocab_size:
        raise ConfigError(f"model.vocab_size={cfg.model.vocab_size} is smaller than the {data.name} tokenizer's vocabulary ({data.vocab_size}); set model.vocab_size=null")
    if data.seq_len > cfg.model.block_size:
        raise ConfigError(f"data sequences of {data.seq_len} tokens exceed model.block_size={cfg.model.block_size}")
    for block in model.blocks:
        a = block.attn
        check_impl(a.impl, device=hardware.device, dtype=hardware.torch_dtype, window=a.window,
                   uses_bias=a.uses_score_bias, dropout=a.dropout)


def _flops_per_token(model, seq_len: int) -> float:
    try:
        from gptlab.costs import train_flops_per_token
    except ImportError:  # cost model missing: the 6·N rule
        return 6.0 * model.num_params(non_embedding=True)
    return float(train_flops_per_token(model, seq_len))


def _sinks(cfg, run_dir, resume, name, choices):
    sinks = [JsonlSink(run_dir, resume=resume), SafeSink(ProgressSink(cfg.train.max_steps), "progress")]
    factory = build._factory(cfg, "logger")
    if factory is not None:
        config = {k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
                  for k, v in cfg.items() if k != "hydra"}
        tags = list(cfg.logger.get("tags") or []) + [f"{k}={v}" for k, v in sorted(choices.items())]
        group = cfg.logger.get("group") or cfg.sweep or "default"
        logger = factory(run_dir=run_dir, config=config, name=name, group=group, tags=tags)
        sinks.append(SafeSink(logger, "wandb"))
    return sinks


def execute(cfg: DictConfig, run_dir: Path, choices: dict, overrides: list[str]) -> dict:
    """Run training in run_dir; returns the summary dict (also written to summary.json)."""
    validate(cfg)
    hardware = build.build_hardware(cfg)
    rank, world = 0, 1
    if hardware.distributed:
        rank, world, hardware.device = distributed.setup(hardware.device)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    hardware.threads = hardware.threads or max(1, threads_for_job() // local_world)
    hardware.apply()
    settings = build.train_settings(cfg)
    data = build.build_data(cfg, int(cfg.model.block_size))
    torch.manual_seed(settings.seed)
    model = build.build_model(cfg, vocab_size=data.vocab_size, device=hardware.device)
    _check_model(model, data, cfg, hardware)
    model.activation_checkpointing = hardware.activation_checkpointing
    optimizer = build.build_optimizer(cfg, model)
    schedule = build.build_schedule(cfg, settings.max_steps)
    forward_model = distributed.wrap(torch.compile(model) if hardware.compile else model, hardware.device, world)
    signature = {"model": OmegaConf.to_container(cfg.model, resolve=True) | {"vocab_size": model.cfg.vocab_size},
                 "tokenizer": getattr(data.tokenizer, "name", None), "params": model.num_params()}
    ctx = Context(run_dir=run_dir, flops_per_token=_flops_per_token(model, data.seq_len),
                  peak_flops=hardware.resolved_peak_flops(build.cache_dir()), signature=signature,
                  rank=rank, world=world)
    resumed = load_resume(settings, ctx)  # refuse an incompatible checkpoint before any run file is written
    name = run_name(cfg, overrides)
    sinks = []
    if ctx.is_main:  # only rank 0 writes run files
        (run_dir / "provenance.json").write_text(json.dumps(provenance.collect(overrides, hardware), indent=2))
        sinks = _sinks(cfg, run_dir, settings.resume != "never", name, choices)
    if settings.profile:
        _profile(model, optimizer, data, settings, hardware, ctx)
    status = "failed"
    try:
        summary = train(model, data, optimizer, schedule, hardware, settings, sinks, ctx, ddp_model=forward_model,
                        resumed=resumed)
        summary |= {"params": model.num_params(), "params_non_embedding": model.num_params(non_embedding=True),
                    "flops_per_token": ctx.flops_per_token, "peak_flops": ctx.peak_flops, "choices": choices,
                    "name": name, "seq_len": data.seq_len, "batch_size": settings.batch_size}
        status = summary["status"]
        _check_peak(summary, hardware)
        for sink in sinks:
            sink.summary(summary)
    finally:
        for sink in sinks:
            sink.close(status)
        if world > 1:
            distributed.teardown()
    summary["sample"] = _sample(model, data, settings, hardware)
    summary["wandb_sync"] = next((getattr(s, "sync_command", None) for s in sinks if getattr(s, "sync_command", None)), None)
    return summary


def _check_peak(summary: dict, hardware) -> None:
    """MFU above 100 % means the measured-and-cached CPU peak is too low: drop it so the next run measures again."""
    from gptlab.costs.peak import forget_peak

    mfu = summary.get("mfu_median") or 0.0
    if mfu > 1.0 and hardware.peak_flops == "auto" and not hardware.device.startswith("cuda"):
        if forget_peak(hardware.device, hardware.torch_dtype, build.cache_dir()):
            log.warning("MFU %.0f%% is impossible: the cached %s matmul peak was measured while the machine was busy; "
                        "dropped from %s, the next run measures it again", 100 * mfu, hardware.dtype, build.cache_dir())


def _profile(model, optimizer, data, settings, hardware, ctx) -> None:
    """profile=true: a few profiled steps (weights restored after), time per module kind vs the cost model."""
    from gptlab.costs import analyze
    from gptlab.costs.peak import cached_bandwidth
    from gptlab.profile import format_breakdown, predicted_shares, profile_steps

    micro = settings.batch_size // settings.grad_accum
    report = analyze(model, micro, data.seq_len, dtype_bytes=hardware.dtype, peak_flops=ctx.peak_flops,
                     mem_bandwidth=cached_bandwidth(hardware.device, build.cache_dir()))
    result = profile_steps(model, optimizer, lambda i: tuple(t.to(hardware.device) for t in data.train_batch(i, 0, micro)),
                           autocast=hardware.autocast, device=hardware.device,
                           run_dir=ctx.run_dir if ctx.is_main else None, predicted=predicted_shares(report))
    if ctx.is_main:
        print(format_breakdown(result), flush=True)


def _sample(model, data, settings, hardware) -> str | None:
    """A short generation from the final model, for a text run (None for synthetic tasks)."""
    prompt = getattr(data, "sample_prompt", None)
    if settings.sample_tokens <= 0 or prompt is None:
        return None
    ids = data.tokenizer.encode(prompt())[-model.cfg.block_size // 2:] or [0]
    gen = torch.Generator(device=hardware.device).manual_seed(settings.seed)
    model.eval()
    with hardware.autocast():
        out = model.generate(torch.tensor([ids], device=hardware.device), settings.sample_tokens,
                             temperature=settings.sample_temperature, top_k=settings.sample_top_k, generator=gen)
    return data.tokenizer.decode(out[0].tolist())
