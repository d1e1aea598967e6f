"""One training run from a composed config: validate, build (gptlab.train.bundle), resume, train, summarise (gptlab-train).

And the run's steps beside training: profile=true before it, the MFU sanity check and the text sample after it.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from pathlib import Path

import torch
from omegaconf import DictConfig

from gptlab.config import build
from gptlab.config.schema import curve_free_keys
from gptlab.config.validate import validate
from gptlab.data import default_cache_dir
from gptlab.data.streams import stream_seed
from gptlab.errors import ConfigError
from gptlab.runtime import distributed
from gptlab.sinks import dashboard, provenance
from gptlab.sinks.jsonl import SUMMARY_FILE, JsonlSink, read_summary_or_warn
from gptlab.sinks.progress import ProgressSink
from gptlab.sinks.safe import SafeSink
from gptlab.state import resume
from gptlab.state.rundir import TOKENIZER_RECORD, save_run_tokenizer
from gptlab.train.bundle import Bundle, build_bundle
from gptlab.train.loop import Trial, train
from gptlab.train.signals import StopFlag
from gptlab.util.io import atomic_write_text

log = logging.getLogger(__name__)


def _sinks(cfg, run_dir: Path, resumed: bool, name: str, choices: dict, extras: dict) -> list:
    """The run's sinks: metrics.jsonl, progress lines and each selected logger (one that fails to start is skipped)."""
    sinks = [
        JsonlSink(run_dir, resume=resumed),
        SafeSink(ProgressSink(cfg.train.max_steps, eval_interval=cfg.train.eval_interval), "progress"),
    ]
    wandb_cfg = cfg.logger.get("wandb") or {}
    runtime = dict(
        run_dir=run_dir,
        config=dashboard.flat_config(build.plain_config(cfg), choices, extras),
        name=name,
        group=dashboard.run_group(wandb_cfg.get("group"), cfg.sweep, dashboard.launch_info()),
        tags=dashboard.tags(wandb_cfg.get("tags"), choices),
        resumed=resumed,
    )
    for key, factory in build.logger_factories(cfg):
        try:
            sinks.append(SafeSink(factory(**runtime), key))
        except ConfigError:
            raise
        except Exception as err:  # noqa: BLE001 - training never stops for a logger
            log.warning(
                "logger %r disabled: it failed to start (%s); local metrics are still written",
                key,
                " ".join(str(err).split())[:300],
            )
    return sinks


def _shape(run: Bundle) -> dict:
    """The job's ranks and nodes as launched (summary.json and provenance.json record them)."""
    nodes, per_node = distributed.topology(run.ctx.world)
    return {"world_size": run.ctx.world, "nodes": nodes, "tasks_per_node": per_node}


def _wandb_info(sinks: list) -> dict | None:
    """summary.json's record of the run's W&B run (id, project, entity, group, mode, offline folders), if any."""
    return next((s.where() for s in sinks if isinstance(s, SafeSink) and s.name == "wandb"), None)


def _finished_summary(run_dir: Path, start: resume.Start, progress: resume.Progress, settings) -> dict | None:
    """The run dir's own summary when this resume has nothing left to train (re-reported, no file touched)."""
    if start.kind != "resume" or progress.step < settings.max_steps:
        return None
    summary = read_summary_or_warn(run_dir / SUMMARY_FILE, log, "it is written again from the checkpoint")
    done = summary.get("status") == "finished" and summary.get("steps") == progress.step
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
                {
                    "step": progress.step,
                    "git": record["git"],
                    "command": record["command"],
                    "overrides": record["overrides"],
                }
            )
            if TOKENIZER_RECORD in record:  # a run from before the record gets it (the same tokenizer: same data)
                earlier.setdefault(TOKENIZER_RECORD, record[TOKENIZER_RECORD])
            record = earlier
    if start.kind == "init":
        record["init_from"] = resume.init_record(start)
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")
    diff = provenance.code_diff() if record["git"]["dirty"] else None
    if diff:  # the uncommitted changes the code had (also saved to W&B); a resume keeps the start's diff beside its own
        name = f"git.resume{progress.step}.diff" if start.kind == "resume" else "git.diff"
        atomic_write_text(run_dir / name, diff + "\n")


def execute(
    cfg: DictConfig,
    run_dir: Path,
    choices: dict,
    overrides: list[str],
    stop: StopFlag | None = None,
    trial: Trial | None = None,
) -> dict:
    """Run training in run_dir (the CLI composed cfg): validate, build, resume, train, summarise; returns the summary
    dict (also written to summary.json). `trial`: the tune trial each eval reports to (a pruning sweep's job)."""
    hardware = validate(cfg)  # the one Hardware of this run
    run = build_bundle(cfg, hardware, run_dir, choices)
    world = run.ctx.world
    try:
        return _resume_and_train(cfg, run, run_dir, choices, overrides, stop, trial)
    except BaseException as err:
        if world > 1:  # the failed frames' locals would keep the model, and so the process group, alive
            traceback.clear_frames(err.__traceback__)
        raise
    finally:
        del run  # the model and its DDP/FSDP wrapper go first: they hold the process group (distributed.teardown)
        if world > 1:
            distributed.teardown()


def _resume_and_train(
    cfg: DictConfig,
    run: Bundle,
    run_dir: Path,
    choices: dict,
    overrides: list[str],
    stop: StopFlag | None,
    trial: Trial | None = None,
) -> dict:
    """Resume (or re-report a finished run), open the run files, profile if asked, train and summarise."""
    settings = run.settings
    # refuse a checkpoint of another run, and load it, before any run file is written
    start = resume.find(
        settings.resume,
        settings.init_from,
        run_dir,
        run.identity,
        run.lr_factors,
        _hf_init(run),
        free=curve_free_keys(cfg),  # the keys whose rule says they cannot change the curve
    )
    init_step = int(start.state["step"]) if start.kind == "init" and start.state else None
    if init_step is not None and init_step >= settings.max_steps:
        raise ConfigError(
            f"train.max_steps={settings.max_steps}: train.init_from starts at step {init_step}, so this run would "
            f"train nothing; allowed: train.max_steps > {init_step}"
        )
    progress = resume.restore(run.model, run.optimizer, run.scaler, start, run.ctx.rank, run.ctx.world)
    if start.kind != "resume":
        own_streams(settings.seed, run.ctx.rank, run.ctx.world)
    name = dashboard.run_name(
        cfg.get("name"), cfg.get("arm"), settings.seed, overrides, dashboard.launch_info(), set(choices)
    )
    finished = _finished_summary(run_dir, start, progress, settings) or _pruned_summary(run_dir, run, cfg)
    if finished is not None:
        log.info("%s: %s already; its summary is re-reported unchanged", run_dir, _ended(finished, progress.step))
        sample = sample_text(run)  # every rank: a sharded model gathers in each forward
        return finished | {"sample": sample, "wandb_sync": None}
    sinks = _open_run_files(cfg, run, start, progress, overrides, choices, name) if run.ctx.is_main else []
    if settings.profile:
        profile_run(run)
    return _train_and_summarise(run, sinks, start, progress, choices, name, stop, trial)


def own_streams(seed: int, rank: int, world: int) -> None:
    """On several ranks, seed each rank's global RNG (dropout) from (seed, rank): the model is built from `seed` alike
    on every rank first, but one seed on every rank drew the same dropout masks on each rank's own samples. One
    process keeps drawing from `seed`, as before."""
    if world > 1:
        torch.manual_seed(stream_seed(seed, "rank", rank))


def _hf_init(run: Bundle):
    """train.init_from=hf:<source>: the run's model state from Hugging Face GPT-2 weights (transformers loads lazily)."""

    def load(source: str) -> tuple[dict, list[str]]:
        from gptlab.interop.hf import init_state

        return init_state(source, run.model, run.data.tokenizer)

    return load


def _pruned_summary(run_dir: Path, run: Bundle, cfg: DictConfig) -> dict | None:
    """A tune trial its pruner stopped is terminal: started again (same config) its summary is re-reported untouched,
    never trained on nor overwritten; under another config (a new trial in its dir) it is refused in one line."""
    summary = read_summary_or_warn(run_dir / SUMMARY_FILE, log, "it is written again")
    if summary.get("status") != "pruned":
        return None
    try:
        started = json.loads((run_dir / "provenance.json").read_text()).get("config")
    except (OSError, ValueError, AttributeError):
        started = None
    saved = {"config": started, "choices": summary.get("choices") or {}}
    current = {"config": run.identity["config"], "choices": run.identity["choices"]}
    diffs = resume.differences(saved, current, curve_free_keys(cfg)) if started is not None else ["no record"]
    if diffs:
        raise ConfigError(
            f"hydra.run.dir: {run_dir} holds a tune trial pruned at step {summary.get('pruned_at_step')} under another "
            f"config ({'; '.join(diffs[:3])}); its record stays as it is: use a new dir"
        )
    return summary


def _ended(summary: dict, step: int) -> str:
    """How a re-reported run ended, for the log line."""
    if summary.get("status") == "pruned":
        return f"pruned at step {summary.get('pruned_at_step')}"
    return f"finished at step {step}"


def _open_run_files(
    cfg: DictConfig,
    run: Bundle,
    start: resume.Start,
    progress: resume.Progress,
    overrides: list[str],
    choices: dict,
    name: str,
) -> list:
    """Rank 0: the tokenizer (tokenizer.json), provenance.json (and git.diff), then the sinks (metrics.jsonl, progress,
    loggers)."""
    tokenizer_sha = save_run_tokenizer(run.ctx.run_dir, run.data.tokenizer, run.data.fingerprint)
    record = provenance.collect(overrides, run.hardware) | {"config": run.identity["config"]}  # the run's own config
    if tokenizer_sha is not None:  # every reader of tokenizer.json checks it against this (gptlab/state/rundir.py)
        record[TOKENIZER_RECORD] = tokenizer_sha
    record["hardware"]["cpu_threads_source"] = run.threads_why
    record["hardware"] |= _shape(run)  # the job as launched (torchrun picks its own nodes), not as configured
    record["match"] = run.match  # model.match: the knob as re-solved, the residual vs the baseline
    _write_provenance(run.ctx.run_dir, record, start, progress)
    model = run.model
    extras = {
        "params": model.num_params(),
        "params_non_embedding": model.num_params(non_embedding=True),
        "flops_per_token": run.ctx.flops_per_token,
        "git_commit": record["git"]["commit"],
        "git_dirty": record["git"]["dirty"],
        "world_size": run.ctx.world,
        "dtype": run.hardware.dtype,
    }
    return _sinks(cfg, run.ctx.run_dir, start.kind == "resume", name, choices, extras)


def _train_and_summarise(
    run: Bundle,
    sinks: list,
    start: resume.Start,
    progress: resume.Progress,
    choices: dict,
    name: str,
    stop: StopFlag | None,
    trial: Trial | None = None,
) -> dict:
    """The loop, then the summary every sink receives; the sinks are closed whatever happens."""
    model, ctx, data = run.model, run.ctx, run.data
    status = "failed"
    if progress.started_at is None:  # the run's first start (epoch s), kept across resumes: compare checks run order
        progress.started_at = time.time()  # against arms, and a resumed run's speed medians cover its first start too
    try:
        summary = train(run, sinks, progress, resumed=start.kind == "resume", stop=stop, trial=trial)
        summary |= {
            "started_at": progress.started_at,
            "ended_at": time.time(),
            "params": model.num_params(),
            "params_non_embedding": model.num_params(non_embedding=True),
            "flops_per_token": ctx.flops_per_token,
            "peak_flops": ctx.peak_flops,
            "choices": choices,
            "name": name,
            "seq_len": data.seq_len,
            "batch_size": run.settings.batch_size,
            "model_fingerprint": run.identity["model"],
            "data_fingerprint": data.fingerprint,
            "init_from": progress.init_from,
            "match": run.match,
            **_shape(run),
        }
        if run.probes:  # which fixed set each probe/* value was measured on (compare pools only equal sets)
            summary["probe_sets"] = {probe.name: probe.fingerprint for probe in run.probes}
        if run.val_sets:  # data.val_sets: each set's last loss, what it is and its size (compare pools equal sets)
            eval_sequences, losses = run.settings.eval_sequences, progress.last_val_sets
            summary["val_sets"] = {s.name: s.record(eval_sequences, losses.get(s.metric)) for s in run.val_sets}
        summary["wandb"] = _wandb_info(sinks)
        status = summary["status"]
        check_peak(summary, run.hardware)
        for sink in sinks:
            sink.summary(summary)
        summary["sample"] = sample_text(run)  # before teardown: fsdp gathers in each forward
    except KeyboardInterrupt:  # a second Ctrl-C, mid-step: no checkpoint at this step
        status = "interrupted"
        raise
    finally:
        for sink in sinks:
            sink.close(status)
    summary["wandb_sync"] = next(
        (getattr(s, "sync_command", None) for s in sinks if getattr(s, "sync_command", None)), None
    )
    return summary


def check_peak(summary: dict, hardware) -> None:
    """MFU above 100 % means the measured-and-cached peak (CPU, or a GPU without a datasheet entry) is too low: drop
    it so the next run measures again."""
    from gptlab.runtime.peak import forget_peak

    mfu = summary.get("mfu_median") or 0.0
    if mfu > 1.0 and hardware.peak_flops == "auto":
        if forget_peak(hardware.device, hardware.torch_dtype, default_cache_dir(), hardware.tf32):
            log.warning(
                "MFU %.0f%% is impossible: the cached %s matmul peak was measured while the machine was busy; "
                "dropped from %s, the next run measures it again",
                100 * mfu,
                hardware.dtype,
                default_cache_dir(),
            )


def profile_run(run: Bundle) -> None:
    """profile=true: a few profiled steps (weights restored after), time per module kind vs the cost model."""
    from gptlab.costs.report import analyze
    from gptlab.runtime.peak import cached_bandwidth
    from gptlab.train.profile.steps import predicted_layer_shares, predicted_shares, profile_steps
    from gptlab.train.profile.table import format_breakdown

    settings, hardware, ctx, data = run.settings, run.hardware, run.ctx, run.data
    micro = settings.batch_size // settings.grad_accum
    report = analyze(
        run.model,
        micro,
        data.seq_len,
        dtype_bytes=hardware.dtype,
        peak_flops=ctx.peak_flops,
        mem_bandwidth=cached_bandwidth(hardware.device, default_cache_dir()),
    )

    def batch(i: int) -> tuple[torch.Tensor, ...]:
        xy = data.train_samples(i * settings.batch_size, micro)
        if getattr(data, "doc_mask", False):  # + the document ids: the mask is part of the step
            xy = (*xy, data.train_documents(i * settings.batch_size, micro))
        return tuple(t.to(hardware.device) for t in xy)

    result = profile_steps(
        run.model,
        run.optimizer,
        batch,
        autocast=hardware.autocast,
        device=hardware.device,
        run_dir=ctx.run_dir if ctx.is_main else None,
        predicted=predicted_shares(report),
        predicted_layers=predicted_layer_shares(report, run.model),
    )
    if ctx.is_main:
        print(format_breakdown(result), flush=True)


def sample_text(run: Bundle) -> str | None:
    """A short generation from the final model, for a text run (None for synthetic tasks)."""
    model, data, settings, hardware = run.model, run.data, run.settings, run.hardware
    prompt = getattr(data, "sample_prompt", None)
    if settings.sample_tokens <= 0 or prompt is None:
        return None
    ids = data.tokenizer.encode(prompt())[-model.cfg.block_size // 2 :] or [0]
    gen = torch.Generator(device=hardware.device).manual_seed(settings.seed)
    model.eval()
    with hardware.autocast():
        out = model.generate(
            torch.tensor([ids], device=hardware.device),
            settings.sample_tokens,
            temperature=settings.sample_temperature,
            top_k=settings.sample_top_k,
            generator=gen,
        )
    return data.tokenizer.decode(out[0].tolist())
