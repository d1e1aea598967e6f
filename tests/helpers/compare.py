"""Write synthetic run and sweep directories exactly like the run-directory contract, for gptlab-compare tests."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path

import yaml

from gptlab.compare.render import words
from gptlab.compare.statistics import verdict

DEFAULT_CHOICES = {
    "attention": "mha",
    "mlp": "gelu",
    "norm": "layernorm",
    "position": "learned",
    "model": "tiny",
    "optimizer": "adamw",
    "schedule": "cosine",
    "hardware": "cpu",
    "data": "shakespeare",
    "logger": "none",
}
# Choice-specific leaves, so that switching a choice changes leaves the way real configs do.
GROUP_LEAVES = {
    "attention": {"mha": {"n_kv_head": None}, "gqa": {"n_kv_head": 2}, "mqa": {"n_kv_head": 1}},
    "mlp": {"gelu": {"ratio": 4}, "swiglu": {"ratio": 4}, "relu2": {"ratio": 4}},
    "data": {"shakespeare": {"tokenizer": "char"}, "assoc_recall": {"tokenizer": "none", "n_pairs": 8}},
}


def make_config(
    choices: dict[str, str], seed: int, leaves: dict[str, object], max_steps: int, eval_interval: int
) -> dict:
    """A resolved config like .hydra/config.yaml: root keys, train.*, and one section per group."""
    cfg: dict = {
        "name": f"run-seed{seed}",
        "seed": seed,
        "data_seed": 1234,
        "train": {
            "max_steps": max_steps,
            "batch_size": 4,
            "grad_accum": 1,
            "eval_interval": eval_interval,
            "eval_sequences": 16,
            "log_interval": 5,
            "ckpt_interval": 50,
            "resume": "auto",
        },
        "paths": {"out_dir": f"/tmp/somewhere/seed{seed}"},
    }
    for group, choice in choices.items():
        section = {"_target_": f"gptlab.fake.{group}.{choice}", "name": choice}
        section.update(GROUP_LEAVES.get(group, {}).get(choice, {}))
        cfg[group] = section
    cfg["model"].update({"n_layer": 2, "n_head": 4, "d_model": 64, "block_size": 32, "vocab_size": 65})
    for dotted, value in leaves.items():
        node = cfg
        *parents, last = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return cfg


def default_loss(step: int) -> float:
    """A plausible falling val-loss curve."""
    return 1.5 + 2.5 * math.exp(-step / 40.0)


def write_run(
    path: Path,
    *,
    seed: int = 0,
    choices: dict[str, str] | None = None,
    leaves: dict[str, object] | None = None,
    max_steps: int = 100,
    eval_interval: int = 25,
    log_interval: int = 5,
    loss_at: Callable[[int], float] = default_loss,
    stop_at: int | None = None,
    status: str | None = None,
    tokens_per_s: float = 1000.0,
    step_ms: float = 50.0,
    mfu: float = 0.01,
    peak_mem_bytes: int = 64 * 2**20,
    params: int = 120_000,
    flops_per_token: float = 7.2e5,
    acc: bool = False,
    summary: bool = True,
    fingerprint: str | None = None,
    data_fingerprint: str | None = None,
    outside_load: float | None = None,
    train_clock: bool = True,
    started_at: float | None = None,
) -> Path:
    """Write one run dir; stop_at < max_steps makes it a crashed run (status "failed" unless given).

    fingerprint / data_fingerprint / outside_load / started_at go into summary.json only when given (older runs lack
    them; write_sweep gives every run a start time, its arms interleaved as gptlab-sweep launches them).
    train_clock: rows and summary carry `train_s` (= wall_s here: these runs spend no time outside their steps), as
    every run gptlab writes now; False writes a run from before it was kept.
    """
    chosen = {**DEFAULT_CHOICES, **(choices or {})}
    leaves = dict(leaves or {})
    last = max_steps if stop_at is None else stop_at
    status = status or ("finished" if last >= max_steps else "failed")
    path.mkdir(parents=True, exist_ok=True)
    records, speeds, tokens = [], [], 0
    for step in range(log_interval, last + 1, log_interval):
        # Speeds wiggle around the given medians: (0.9, 1.0, 1.1) x value, so the median is the value.
        wiggle = (0.9, 1.0, 1.1)[(step // log_interval) % 3]
        tokens += 4 * 32 * log_interval
        rec = {
            "step": step,
            "train/loss": loss_at(step) + 0.05,
            "lr": 1e-3,
            "grad_norm": 1.0,
            "tokens": tokens,
            "tokens_per_s": tokens_per_s * wiggle,
            "step_ms": step_ms * wiggle,
            "mfu": mfu * wiggle,
            "peak_mem_bytes": peak_mem_bytes,
            "wall_s": step * step_ms / 1000.0,
            **({"train_s": step * step_ms / 1000.0} if train_clock else {}),
        }
        records.append(rec)
        speeds.append(rec)
        if step % eval_interval == 0:
            ev = {"step": step, "val/loss": loss_at(step)}
            if acc:
                ev["val/acc"] = 0.5
            records.append(ev)
    with open(path / "metrics.jsonl", "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)
    evals = [r for r in records if "val/loss" in r]
    if summary:
        (path / "summary.json").write_text(
            json.dumps(
                {
                    "final_val_loss": evals[-1]["val/loss"] if evals else None,
                    "best_val_loss": min((r["val/loss"] for r in evals), default=None),
                    "steps": last,
                    "tokens": tokens,
                    "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in speeds),
                    "step_ms_median": statistics.median(r["step_ms"] for r in speeds),
                    "mfu_median": statistics.median(r["mfu"] for r in speeds),
                    "peak_mem_bytes": peak_mem_bytes,
                    "params": params,
                    "flops_per_token": flops_per_token,
                    "wall_s": last * step_ms / 1000.0,
                    **({"train_s": last * step_ms / 1000.0} if train_clock else {}),
                    "choices": chosen,
                    "status": status,
                    **{
                        k: v
                        for k, v in (
                            ("model_fingerprint", fingerprint),
                            ("data_fingerprint", data_fingerprint),
                            ("outside_load", outside_load),
                            ("started_at", started_at),
                        )
                        if v is not None
                    },
                },
                indent=2,
            )
        )
    hydra_dir = path / ".hydra"
    hydra_dir.mkdir(exist_ok=True)
    cfg = make_config(chosen, seed, leaves, max_steps, eval_interval)
    (hydra_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    overrides = [f"{g}={c}" for g, c in (choices or {}).items() if DEFAULT_CHOICES.get(g) != c]
    overrides += [f"{k}={v}" for k, v in leaves.items()] + [f"seed={seed}"]
    (hydra_dir / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    hydra_yaml = {
        "hydra": {"runtime": {"choices": {**chosen, "hydra/launcher": "basic"}}, "overrides": {"task": overrides}}
    }
    (hydra_dir / "hydra.yaml").write_text(yaml.safe_dump(hydra_yaml))
    return path


def write_sweep(root: Path, specs: list[dict]) -> Path:
    """A multirun dir `<root>/<date>_<time>/<job>/` per spec (kwargs of write_run); returns the sweep root. Each run
    records a start time (unless its spec gives one) with the arms interleaved, a minute apart, as gptlab-sweep
    launches them: the k-th run of each arm in round k."""
    sweep = root / "2026-01-01_12-00-00"
    sweep.mkdir(parents=True, exist_ok=True)
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"mode": "MULTIRUN"}}))
    arms = [repr((sorted((s.get("choices") or {}).items()), sorted((s.get("leaves") or {}).items()))) for s in specs]
    order = list(dict.fromkeys(arms))
    for job, spec in enumerate(specs):
        nth = arms[:job].count(arms[job])
        start = 1.8e9 + 60.0 * (nth * len(order) + order.index(arms[job]))
        write_run(sweep / str(job), **{"started_at": start, **spec})
    return sweep


def bad_no_common_step(tmp: Path) -> list[Path]:
    """Two runs whose eval steps never coincide (25, 50 vs 30, 60, 90)."""
    return [write_run(tmp / "a", eval_interval=25, max_steps=50), write_run(tmp / "b", eval_interval=30, max_steps=90)]


def bad_mixed_data(tmp: Path) -> list[Path]:
    """A language-model run next to an associative-recall run."""
    return [write_run(tmp / "lm"), write_run(tmp / "ar", choices={"data": "assoc_recall"}, acc=True)]


def bad_acc_vs_lm(tmp: Path) -> list[Path]:
    """Same data config, but only one run reports val/acc."""
    return [write_run(tmp / "lm"), write_run(tmp / "acc", acc=True)]


def speed_words(row: dict) -> str:
    """A comparison.json row's speed verdict as every report words it (e.g. `faster, under outside load`)."""
    return words.speed(verdict.from_json(row["speed"]))


def store_noise_floor(cache: Path, machine: str, outside_load: float = 0.04) -> None:
    """A measured noise floor for `machine` in the gptlab cache (what `gptlab-sweep aa` stores): its A/A ran under
    `outside_load`, so compare's load limit there is that plus 5 points."""
    floor = {
        "machine": machine, "measured_at": "2026-01-01T00:00:00Z", "sweep_dir": "/aa", "runs": 6, "arms": 2,
        "seeds": 3, "speed_sd": 0.02, "step_sd": 0.02, "max_speedup": 1.06, "loss_sd": 0.01,
        "same_seed_loss_gap": 0.0, "mem_spread": 0.01, "outside_load": outside_load, "quiet": True, "conditions": {},
    }  # fmt: skip
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "noise_floors_v1.json").write_text(json.dumps({machine: floor}))


TIMED_SETTINGS = {"batch_size": 4, "seq_len": 32, "grad_accum": 1, "device": "cpu", "dtype": "fp32", "compile": False}


def write_timing(
    folder: Path,
    arms: dict[str, tuple[Path, str]],
    rates: dict[str, list[float]],
    loads: dict[str, float] | None = None,
    flops_per_token: float = 7.2e5,
    peak: float = 1e11,
    machine: str = "Golden CPU",
) -> Path:
    """A finished timing session in folder/timing.json, as gptlab/train/timing.py writes it, over `arms` (name ->
    (the run dir it was timed from, its model fingerprint); the first is the baseline) with the given per-round rates
    in tokens/s (the baseline's A/A windows under '<baseline>#2'); every arm timed at write_run's speed settings."""
    names = list(arms)
    labels, rounds = [*names, f"{names[0]}#2"], len(rates[names[0]])
    windows = []
    for r in range(rounds):
        for position, label in enumerate(labels):
            arm, repeat = (label[:-2], 1) if label.endswith("#2") else (label, 0)
            ms = 128 / rates[label][r] * 1000
            windows.append({
                "round": r, "position": position, "arm": arm, "repeat": repeat, "built": False, "warmup_ms": [1.0],
                "step_ms": [ms], "step_ms_median": ms, "tokens_per_s": rates[label][r],
                "outside_load": (loads or {}).get(label, 0.0), "loadavg_before": None, "loadavg_after": None,
                "threads": 2, "started_at": 0.0, "ended_at": 1.0,
            })  # fmt: skip
    records = {
        name: {"run_dir": str(run_dir), "model_fingerprint": fp, "params": 120_000, "flops_per_token": flops_per_token,
               "run_peak_flops": peak, "tokens_per_step": 128, "prefetch": 0, "threads": 2, **TIMED_SETTINGS}
        for name, (run_dir, fp) in arms.items()
    }  # fmt: skip
    doc = {
        "version": 1,
        "plan": {"arms": [{"name": n, "run_dir": records[n]["run_dir"]} for n in names], "rounds": rounds,
                 "steps": 30, "warmup": 5, "seed": 0},
        "baseline": names[0], "orders": [],
        "machine": {"hostname": "golden-host", "cpu": machine, "gpu": None, "torch": "2.x", "machine_cores": 2,
                    "cores": 2, "platform": "linux"},
        "peak": {"flops": peak, "device": "cpu", "dtype": "fp32", "threads": 2, "outside_load": 0.0},
        "memory": None, "arms": records, "windows": windows, "status": "finished",
    }  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "timing.json").write_text(json.dumps(doc))
    return folder / "timing.json"
