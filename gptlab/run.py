"""One training run from a composed config: validate, build, train, summarise (called by gptlab-train)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from gptlab import build, dashboard, distributed, provenance, resume
from gptlab.costs.memory import check_fits
from gptlab.errors import ConfigError
from gptlab.hardware import threads_for_job
from gptlab.io import atomic_write_text
from gptlab.loop import Context, StopFlag, train
from gptlab.model.checks import check_model
from gptlab.model.fingerprint import model_fingerprint
from gptlab.noop import noop_choices
from gptlab.sinks import JsonlSink, SafeSink
from gptlab.sinks.progress import ProgressSink
from gptlab.validate import validate

log = logging.getLogger(__name__)


def _flops_per_token(model, seq_len: int) -> float:
    try:
        from gptlab.costs import train_flops_per_token
    except ImportError:  # cost model missing: the 6·N rule
        return 6.0 * model.num_params(non_embedding=True)
    return float(train_flops_per_token(model, seq_len))


def plain_config(cfg: DictConfig) -> dict:
    """The resolved config as plain Python, without Hydra's own node (what checkpoints and W&B record)."""
    return {k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
            for k, v in cfg.items() if k != "hydra"}


def _sinks(cfg, run_dir: Path, resumed: bool, name: str, choices: dict, extras: dict) -> list:
    """The run's sinks: metrics.jsonl, progress lines and each selected logger (one that fails to start is skipped)."""
    sinks = [JsonlSink(run_dir, resume=resumed),
             SafeSink(ProgressSink(cfg.train.max_steps, eval_interval=cfg.train.eval_interval), "progress")]
    wandb_cfg = cfg.logger.get("wandb") or {}
    runtime = dict(run_dir=run_dir, config=dashboard.flat_config(plain_config(cfg), choices, extras), name=name,
                   group=dashboard.run_group(wandb_cfg.get("group"), cfg.sweep, dashboard.launch_info()),
                   tags=dashboard.tags(wandb_cfg.get("tags"), choices), resumed=resumed)
    for key, factory in build.logger_factories(cfg):
        try:
            sinks.append(SafeSink(factory(**runtime), key))
        except ConfigError:
            raise
        except Exception as err:  # noqa: BLE001 - training never stops for a logger
            log.warning("logger %r disabled: it failed to start (%s); local metrics are still written", key,
                        " ".join(str(err).split())[:300])
    return sinks


def _wandb_info(sinks: list) -> dict | None:
    """summary.json's record of the run's W&B run (id, project, entity, group, mode, offline folders), if any."""
    return next((s.where() for s in sinks if isinstance(s, SafeSink) and s.name == "wandb"), None)


def _check_batch(settings, world: int) -> None:
    """Every rank takes an equal share of every micro-batch (an empty or uneven share skews the loss)."""
    if settings.batch_size % (settings.grad_accum * world):
        raise ConfigError(f"train.batch_size={settings.batch_size} must be divisible by train.grad_accum x world size "
                          f"= {settings.grad_accum} x {world}; allowed: a multiple of {settings.grad_accum * world}")


def _finished_summary(run_dir: Path, start: resume.Start, progress: resume.Progress, settings) -> dict | None:
    """The run dir's own summary when this resume has nothing left to train (re-reported, no file touched)."""
    if start.kind != "resume" or progress.step < settings.max_steps:
        return None
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None  # killed while writing it: the loop recomputes it from the checkpoint
    done = isinstance(summary, dict) and summary.get("status") == "finished" and summary.get("steps") == progress.step
    return summary if done else None


def _write_provenance(run_dir: Path, record: dict, start: resume.Start, progress: resume.Progress) -> None:
    """provenance.json: written when a run starts; a resume appends what resumed it instead of replacing it."""
    path = run_dir / "provenance.json"
    if start.kind == "resume":
        try:
            earlier = json.loads(path.read_text())
        except (OSError, ValueError):
            earlier = None
        if isinstance(earlier, dict):
            earlier.setdefault("resumes", []).append(
                {"step": progress.step, "git": record["git"], "command": record["command"], "overrides": record["overrides"]})
            record = earlier
    if start.kind == "init":
        record["init_from"] = _init_record(start)
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")
    diff = provenance.code_diff() if record["git"]["dirty"] else None
    if diff:  # the uncommitted changes the code had (also saved to W&B); a resume keeps the start's diff beside its own
        name = f"git.resume{progress.step}.diff" if start.kind == "resume" else "git.diff"
        atomic_write_text(run_dir / name, diff + "\n")


def _init_record(start: resume.Start) -> dict:
    assert start.state is not None  # an init start carries its checkpoint
    return {"checkpoint": start.source.strip("'"), "step": int(start.state["step"]), "differences": start.differences,
            "optimizer_state": start.optimizer_state}


def execute(cfg: DictConfig, run_dir: Path, choices: dict, overrides: list[str], stop: StopFlag | None = None) -> dict:
    """Run training in run_dir; returns the summary dict (also written to summary.json)."""
    validate(cfg)
    hardware = build.build_hardware(cfg)
    rank, world = 0, 1
    if hardware.distributed:
        rank, world, hardware.device = distributed.setup(hardware.device)
    settings = build.train_settings(cfg)
    _check_batch(settings, world)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    hardware.threads = hardware.threads or threads_for_job(local_world)
    hardware.apply()
    data = build.build_data(cfg, int(cfg.model.block_size))
    # gptlab-flops' training-memory estimate, from the config on the meta device, before anything is allocated
    micro = settings.batch_size // (settings.grad_accum * world)
    report = build.cost_report(cfg, micro, data.seq_len, vocab_size=data.vocab_size, dtype=hardware.dtype).to_dict()
    if hardware.strategy == "fsdp":  # one rank's share: sharded weights, grads and state, plus the gathered blocks
        from gptlab.costs.sharding import Sharding

        report = per_rank_report(report, build.rank_memory(
            cfg, Sharding("fsdp", world, hardware.reshard_after_forward, cpu_offload=hardware.cpu_offload),
            batch_size=settings.batch_size, grad_accum=settings.grad_accum, seq_len=data.seq_len,
            vocab_size=data.vocab_size, dtype=hardware.dtype))
    check_fits(report, hardware.device,
               label=f"model={choices['model']}" if "model" in choices else "this run",
               processes=local_world if hardware.device == "cpu" else 1)
    torch.manual_seed(settings.seed)
    model = build.build_model(cfg, vocab_size=data.vocab_size, device=hardware.device)
    check_model(model, vocab_size=data.vocab_size, seq_len=data.seq_len, device=hardware.device,
                dtype=hardware.torch_dtype, data_name=data.name)  # the same checks the contract tests run
    for line in noop_choices(cfg, choices):  # e.g. GQA with n_kv_head == n_head is MHA: say so before training it
        log.warning("no-op choice: %s", line)
    identity = {"config": plain_config(cfg), "choices": choices, "data": data.fingerprint,
                "model": model_fingerprint(model), "world": world, "dtype": hardware.dtype}
    model.activation_checkpointing = hardware.activation_checkpointing
    # DDP (compiled per hardware.compile) or FSDP2 in place; the optimizer after it: fully_shard swaps the parameters
    forward_model = distributed.wrap(model, hardware, world)
    optimizer = build.build_optimizer(cfg, model)
    schedule = build.build_schedule(cfg, settings.max_steps)
    scaler = torch.amp.GradScaler(hardware.device.split(":")[0], enabled=hardware.dtype == "fp16")
    ctx = Context(run_dir=run_dir, flops_per_token=_flops_per_token(model, data.seq_len),
                  peak_flops=hardware.resolved_peak_flops(build.cache_dir()), identity=identity,
                  rank=rank, world=world, sharded=hardware.strategy == "fsdp")

    def lr_factors(max_steps: int, steps: int) -> list[float]:
        other = build.build_schedule(cfg, max_steps)
        return [other(i) for i in range(steps)]

    # refuse a checkpoint of another run, and load it, before any run file is written
    start = resume.find(settings.resume, settings.init_from, run_dir, identity, lr_factors)
    progress = resume.restore(model, optimizer, scaler, start)
    name = dashboard.run_name(cfg.get("name"), cfg.get("arm"), settings.seed, overrides, dashboard.launch_info(),
                              set(choices))
    summary = _finished_summary(run_dir, start, progress, settings)
    if summary is not None:
        log.info("%s: finished at step %d already; its summary is re-reported unchanged", run_dir, progress.step)
        sample = _sample(model, data, settings, hardware)  # every rank: a sharded model gathers in each forward
        if world > 1:
            distributed.teardown()
        return summary | {"sample": sample, "wandb_sync": None}
    sinks = []
    if ctx.is_main:  # only rank 0 writes run files
        record = provenance.collect(overrides, hardware) | {"config": identity["config"]}  # the run's own config
        _write_provenance(run_dir, record, start, progress)
        extras = {"params": model.num_params(), "params_non_embedding": model.num_params(non_embedding=True),
                  "flops_per_token": ctx.flops_per_token, "git_commit": record["git"]["commit"],
                  "git_dirty": record["git"]["dirty"], "world_size": world, "dtype": hardware.dtype}
        sinks = _sinks(cfg, run_dir, start.kind == "resume", name, choices, extras)
    if settings.profile:
        _profile(model, optimizer, data, settings, hardware, ctx)
    status = "failed"
    try:
        summary = train(model, data, optimizer, schedule, hardware, settings, sinks, ctx, ddp_model=forward_model,
                        progress=progress, resumed=start.kind == "resume", scaler=scaler, stop=stop)
        summary |= {"params": model.num_params(), "params_non_embedding": model.num_params(non_embedding=True),
                    "flops_per_token": ctx.flops_per_token, "peak_flops": ctx.peak_flops, "choices": choices,
                    "name": name, "seq_len": data.seq_len, "batch_size": settings.batch_size,
                    "model_fingerprint": identity["model"], "data_fingerprint": data.fingerprint,
                    "init_from": _init_record(start) if start.kind == "init" else None}
        summary["wandb"] = _wandb_info(sinks)
        status = summary["status"]
        _check_peak(summary, hardware)
        for sink in sinks:
            sink.summary(summary)
        summary["sample"] = _sample(model, data, settings, hardware)  # before teardown: fsdp gathers in each forward
    except KeyboardInterrupt:  # a second Ctrl-C, mid-step: no checkpoint at this step
        status = "interrupted"
        raise
    finally:
        for sink in sinks:
            sink.close(status)
        if world > 1:
            distributed.teardown()
    summary["wandb_sync"] = next((getattr(s, "sync_command", None) for s in sinks if getattr(s, "sync_command", None)), None)
    return summary


def per_rank_report(report: dict, memory: dict) -> dict:
    """The memory check's report (CostReport.to_dict()) with one rank's figures from costs.sharding.per_rank."""
    mem = report["memory"] | {"weights_bytes": memory["params_bytes"], "grads_bytes": memory["grads_bytes"],
                              "optimizer_bytes": memory["optimizer_bytes"],
                              "activations_bytes": memory["activations_bytes"],
                              "train_estimate_bytes": memory["total_bytes"]}
    return report | {"memory": mem}


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
    from gptlab.profile import format_breakdown, predicted_layer_shares, predicted_shares, profile_steps

    micro = settings.batch_size // settings.grad_accum
    report = analyze(model, micro, data.seq_len, dtype_bytes=hardware.dtype, peak_flops=ctx.peak_flops,
                     mem_bandwidth=cached_bandwidth(hardware.device, build.cache_dir()))
    result = profile_steps(model, optimizer, lambda i: tuple(t.to(hardware.device) for t in data.train_samples(i * settings.batch_size, micro)),
                           autocast=hardware.autocast, device=hardware.device,
                           run_dir=ctx.run_dir if ctx.is_main else None, predicted=predicted_shares(report),
                           predicted_layers=predicted_layer_shares(report, model))
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
