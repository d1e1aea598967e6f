"""A run's steps beside training: profile=true before it, the MFU sanity check and the text sample after it."""

from __future__ import annotations

import logging

import torch

from gptlab.bundle import Bundle
from gptlab.data import default_cache_dir

log = logging.getLogger("gptlab.run")  # the run's own messages keep one logger name ([gptlab.run] in run.log)


def check_peak(summary: dict, hardware) -> None:
    """MFU above 100 % means the measured-and-cached CPU peak is too low: drop it so the next run measures again."""
    from gptlab.costs.peak import forget_peak

    mfu = summary.get("mfu_median") or 0.0
    if mfu > 1.0 and hardware.peak_flops == "auto" and not hardware.device.startswith("cuda"):
        if forget_peak(hardware.device, hardware.torch_dtype, default_cache_dir()):
            log.warning(
                "MFU %.0f%% is impossible: the cached %s matmul peak was measured while the machine was busy; "
                "dropped from %s, the next run measures it again",
                100 * mfu,
                hardware.dtype,
                default_cache_dir(),
            )


def profile_run(run: Bundle) -> None:
    """profile=true: a few profiled steps (weights restored after), time per module kind vs the cost model."""
    from gptlab.costs import analyze
    from gptlab.costs.peak import cached_bandwidth
    from gptlab.profile import format_breakdown, predicted_layer_shares, predicted_shares, profile_steps

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

    def batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = data.train_samples(i * settings.batch_size, micro)
        return x.to(hardware.device), y.to(hardware.device)

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
