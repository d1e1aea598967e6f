"""Frozen comparison scenarios: each writes a fixed set of synthetic run or sweep dirs and returns the
gptlab-compare arguments that report on them. The golden test (tests/compare/test_compare_golden.py) keeps every report
(terminal, Markdown, JSON, HTML text) identical across refactors of gptlab/compare/; no randomness anywhere."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import yaml

from helpers.compare import store_noise_floor, write_run, write_timing

SEED_NOISE = (0.0, 0.012, -0.009)  # the seeds' val-loss offsets, the same in every arm
SPEED_NOISE = (1.0, 1.03, 0.98)


def _curve(level: float, seed: int) -> Callable[[int], float]:
    return lambda step: level + 2.5 * math.exp(-step / 40.0) + SEED_NOISE[seed]


def _arm_runs(root: Path, arm: str, level: float, tps: float, fingerprint: str, **kw) -> None:
    for seed in range(3):
        write_run(
            root / arm / f"seed{seed}",
            seed=seed,
            loss_at=_curve(level, seed),
            tokens_per_s=tps * SPEED_NOISE[seed],
            step_ms=50.0 / SPEED_NOISE[seed] * 1000.0 / tps,
            fingerprint=fingerprint,
            data_fingerprint="data-1",
            **kw,
        )


def main_table(tmp: Path) -> list[str]:
    """mha / gqa / mqa / mha with another impl (the identical model), 3 seeds; one mqa seed under load; claims."""
    root = tmp / "attention"
    root.mkdir(parents=True)
    (root / "sweep.yaml").write_text(yaml.safe_dump({"arms": {"mha": [], "gqa": [], "mqa": [], "naive": []}}))
    _arm_runs(root, "mha", 1.50, 1000.0, "fp-mha", outside_load=0.02, flops_per_token=7.2e5)
    _arm_runs(
        root, "gqa", 1.51, 1150.0, "fp-gqa", choices={"attention": "gqa"}, outside_load=0.02, flops_per_token=6.9e5
    )
    for seed in range(3):
        write_run(
            root / "mqa" / f"seed{seed}", seed=seed, choices={"attention": "mqa"}, loss_at=_curve(1.56, seed),
            tokens_per_s=1400.0 * SPEED_NOISE[seed], step_ms=50.0 / SPEED_NOISE[seed] * 1000.0 / 1400.0,
            fingerprint="fp-mqa", data_fingerprint="data-1", outside_load=0.4 if seed == 0 else 0.02,
            flops_per_token=6.7e5,
        )  # fmt: skip
    _arm_runs(root, "naive", 1.50, 990.0, "fp-mha", leaves={"attention.impl": "naive"}, outside_load=0.02)
    claims = tmp / "claims.yaml"
    claims.write_text(yaml.safe_dump({"attention=gqa": {"speedup": 1.25, "delta_val_loss": 0.0}}))
    return [str(root), "--power", "--target", "val/loss=2.0", "--claims", str(claims), "--noise-floor", "none"]


# per arm: the rates (tokens/s) of its windows over 5 rounds of the golden timing session; mha#2 its A/A windows
TIMED_RATES = {
    "mha": [1000.0, 980.0, 1020.0, 990.0, 1010.0],
    "mha#2": [1005.0, 975.0, 1030.0, 985.0, 1000.0],
    "gqa": [1004.0, 978.0, 1027.0, 992.0, 1003.0],
    "mqa": [1400.0, 1370.0, 1430.0, 1385.0, 1415.0],
}


def timed(tmp: Path) -> list[str]:
    """A sweep with its timing session: mha (baseline), gqa (timed as fast as mha: within noise, though its training
    runs recorded 1.4x the tokens/s), mqa (timed 1.4x faster) and naive (mha's model: timed by mha's arm, the
    identical model), whose training runs ran under outside load."""
    root = tmp / "timed"
    root.mkdir(parents=True)
    (root / "sweep.yaml").write_text(yaml.safe_dump({"arms": {"mha": [], "gqa": [], "mqa": [], "naive": []}}))
    _arm_runs(root, "mha", 1.50, 1000.0, "fp-mha", outside_load=0.02)
    _arm_runs(root, "gqa", 1.50, 1400.0, "fp-gqa", choices={"attention": "gqa"}, outside_load=0.02)
    _arm_runs(root, "mqa", 1.56, 1400.0, "fp-mqa", choices={"attention": "mqa"}, outside_load=0.02)
    _arm_runs(root, "naive", 1.50, 700.0, "fp-mha", leaves={"attention.impl": "naive"}, outside_load=0.6)
    arms = {arm: (root / arm / "seed0", f"fp-{arm}") for arm in ("mha", "gqa", "mqa")}
    write_timing(root, arms, TIMED_RATES)
    return [str(root), "--baseline", str(root / "mha" / "seed0"), "--power", "--noise-floor", "none"]


def with_floor(tmp: Path, cache: Path) -> list[str]:
    """Two arms on one recorded machine whose noise floor is stored in the cache: verdicts against the floor."""
    root = tmp / "floor"
    _arm_runs(root, "mha", 1.50, 1000.0, "fp-mha", outside_load=0.03)
    _arm_runs(root, "gqa", 1.50, 1040.0, "fp-gqa", choices={"attention": "gqa"}, outside_load=0.03)
    _arm_runs(root, "mqa", 1.60, 1500.0, "fp-mqa", choices={"attention": "mqa"}, outside_load=0.03)
    for run in root.glob("*/seed*"):
        (run / "provenance.json").write_text(json.dumps({"hardware": {"cpu": "Golden CPU", "cpu_cores": [0, 1]}}))
    store_noise_floor(cache, "Golden CPU | 2 cores")
    return [str(root)]


def probes(tmp: Path) -> list[str]:
    """probe/* metrics in the eval rows: recall accuracy (higher is better) and a length loss (lower is better)."""
    root = tmp / "probes"
    _arm_runs(root, "mha", 1.50, 1000.0, "fp-mha")
    _arm_runs(root, "gqa", 1.50, 1000.0, "fp-gqa", choices={"attention": "gqa"})
    for run in sorted(root.glob("*/seed*")):
        seed, arm = int(run.name[-1]), run.parent.name
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        for row in rows:
            if "val/loss" in row:
                row["probe/recall/acc"] = (0.6 if arm == "mha" else 0.8) + 0.01 * seed
                row["probe/length/2x/loss"] = (2.0 if arm == "mha" else 2.01) + 0.02 * seed
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [str(root), "--noise-floor", "none"]


def evals(tmp: Path) -> list[str]:
    """gptlab-eval's eval.json beside each run: one task's accuracy per seed."""
    root = tmp / "evals"
    _arm_runs(root, "mha", 1.50, 1000.0, "fp-mha")
    _arm_runs(root, "gqa", 1.50, 1000.0, "fp-gqa", choices={"attention": "gqa"})
    for run in sorted(root.glob("*/seed*")):
        acc = (0.40 if run.parent.name == "mha" else 0.47) + 0.01 * int(run.name[-1])
        task = {"metrics": {"acc": acc, "acc_stderr": 0.05}, "step": 100, "samples": 16, "num_fewshot": 0}
        task |= {"limit": None, "version": 1, "config_sha256": "abc", "lm_eval": "0.4.13", "prefix_token_id": 10}
        (run / "eval.json").write_text(json.dumps({"format": 1, "tasks": {"tiny_mc": task}}))
    return [str(root), "--noise-floor", "none"]


def _decode_point(tps: float, seed: int) -> dict:
    values = [tps * (1 + 0.01 * (i + seed)) for i in range(3)]
    return {
        "batch": 1, "context": 64, "cache": "on", "status": "measured",
        "decode_tokens_per_s": {"values": values}, "latency_ms_p50": {"values": [1000.0 / v for v in values]},
        "latency_ms_p99": {"values": [1100.0 / v for v in values]}, "prefill_ms": {"values": [3.0, 3.1, 3.2]},
        "kv_bytes_measured": 4096, "kv_bytes_predicted": 4096, "kv_bytes_ratio": 1.0,
        "peak_mem_delta_bytes": {"mean": 8192.0},
    }  # fmt: skip


def decode(tmp: Path) -> list[str]:
    """Training runs that also carry gptlab-decode's decode.json: the decode table beside the main one."""
    root = tmp / "decode"
    _arm_runs(root, "mha", 1.50, 1000.0, "fp-mha")
    _arm_runs(root, "mqa", 1.52, 1000.0, "fp-mqa", choices={"attention": "mqa"})
    for run in sorted(root.glob("*/seed*")):
        tps = 500.0 if run.parent.name == "mha" else 650.0
        doc = {"model": {"fingerprint": f"fp-{run.parent.name}"}, "points": [_decode_point(tps, int(run.name[-1]))]}
        (run / "decode.json").write_text(json.dumps(doc))
    return [str(root), "--noise-floor", "none"]


def threshold(tmp: Path) -> list[str]:
    """Arms model.n_layer = 1, 2, 3, 4 with val/acc; 2 layers reach 0.9 in every seed, 3 in none (non-monotone)."""
    root = tmp / "layers"
    reached = {1: (False, False, False), 2: (True, True, True), 3: (False, True, False), 4: (True, True, True)}
    for layers, seeds in reached.items():
        for seed, ok in enumerate(seeds):
            run = write_run(
                root / f"L{layers}" / f"seed{seed}", seed=seed, leaves={"model.n_layer": layers}, acc=True,
                loss_at=_curve(1.6 - 0.02 * layers, seed), data_fingerprint="data-1",
            )  # fmt: skip
            rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            for row in rows:
                if "val/acc" in row:
                    row["val/acc"] = 0.95 if ok and row["step"] >= 50 else 0.3
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [str(root), "--threshold", "val/acc=0.9", "--noise-floor", "none"]


def _grid_run(run_dir: Path, start: float, final: float | None) -> None:
    run_dir.mkdir(parents=True)
    rows = [{"step": 0, "val/loss": start}, {"step": 5, "train/loss": start if final is not None else float("nan")}]
    if final is not None:
        rows.append({"step": 10, "val/loss": final})
        (run_dir / "summary.json").write_text(json.dumps({"status": "finished", "final_val_loss": final}))
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def lr_grid(tmp: Path) -> list[str]:
    """Two arms x three lrs x three seeds; the baseline's best lr at the grid's edge, one diverged run."""
    root = tmp / "grid"
    table = {
        "mha": {1e-3: [3.0, 3.02, 2.99], 3e-3: [2.8, 2.82, 2.81], 1e-2: [2.7, 2.71, 2.69]},
        "mqa": {1e-3: [3.1, 3.12, 3.09], 3e-3: [2.75, 2.77, 2.74], 1e-2: [2.9, None, 2.95]},
    }
    root.mkdir(parents=True)
    (root / "sweep.yaml").write_text(yaml.safe_dump({"arms": {a: [] for a in table}}, sort_keys=False))
    for arm, by_lr in table.items():
        for lr, finals in by_lr.items():
            for seed, final in enumerate(finals):
                _grid_run(root / arm / f"lr{lr:g}" / f"seed{seed}", 4.0, final)
    return [str(root), "--lr-grid"]


def lr_grid_report(tmp: Path) -> list[str]:
    """An lr grid of real-looking runs (configs, speeds, FLOPs): mha x mqa at three lrs, three seeds. mqa is worse
    at the baseline's best lr and within noise at its own, cheaper per token and faster: the verdict matrix's
    'it may be the learning rate' case, with the grid's table and curves closing the report."""
    root = tmp / "grid_report"
    levels = {"mha": {1e-3: 1.60, 3e-3: 1.50, 1e-2: 1.55}, "mqa": {1e-3: 1.70, 3e-3: 1.62, 1e-2: 1.505}}
    arms = {"mha": ({}, 1000.0, 7.2e5), "mqa": ({"attention": "mqa"}, 1150.0, 6.4e5)}
    root.mkdir(parents=True)
    sweep = {"arms": {a: [f"attention={c.get('attention', 'mha')}"] for a, (c, _, _) in arms.items()}}
    sweep.update(seeds=[0, 1, 2], lr_grid=[1e-3, 3e-3, 1e-2])
    (root / "sweep.yaml").write_text(yaml.safe_dump(sweep, sort_keys=False))
    for arm, (choices, tps, cost) in arms.items():
        for lr, level in levels[arm].items():
            for seed in range(3):
                write_run(
                    root / arm / f"lr{lr:g}" / f"seed{seed}",
                    seed=seed,
                    choices=choices,
                    leaves={"optimizer.lr": lr, "arm": arm},
                    loss_at=_curve(level, seed),
                    tokens_per_s=tps * SPEED_NOISE[seed],
                    step_ms=50.0 / SPEED_NOISE[seed] * 1000.0 / tps,
                    flops_per_token=cost,
                    data_fingerprint="data-1",
                )
    return [str(root), "--lr-grid", "--out", str(tmp / "out")]


LADDER_SIZES = {"d_model32": 1e5, "d_model64": 4e5, "d_model128": 1.6e6, "d_model256": 6.4e6}


def ladder(tmp: Path) -> list[str]:
    """Two arms x four rungs x three seeds; the arm's gap to the baseline grows with size."""
    root = tmp / "ladder"
    root.mkdir(parents=True)
    spec = {"arms": {"base": [], "wide": []}, "ladder": {"model.d_model": ["32", "64", "128", "256"]}}
    (root / "sweep.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    laws = {"base": lambda n: 12.0 * n**-0.1, "wide": lambda n: 12.0 * n**-0.1 + 0.02 + 0.03 * math.log2(n / 1e5)}
    for arm, law in laws.items():
        for rung, n in LADDER_SIZES.items():
            for seed, eps in enumerate(SEED_NOISE):
                run = root / arm / rung / f"seed{seed}"
                run.mkdir(parents=True)
                summary = {
                    "status": "finished", "final_val_loss": law(n) + eps, "params_non_embedding": n,
                    "flops_per_token": 6 * n, "data_fingerprint": "data", "seq_len": 64,
                }  # fmt: skip
                (run / "summary.json").write_text(json.dumps(summary))
    return [str(root)]


def factorial(tmp: Path) -> list[str]:
    """A 2x2 factorial (gqa x mlp3), 3 seeds, with a planted loss interaction and multiplicative speed."""
    root = tmp / "ff"
    root.mkdir(parents=True)
    factors = {"gqa": ["attention=gqa"], "mlp3": ["mlp.ratio=3"]}
    arms = {"base": [], "gqa": ["attention=gqa"], "mlp3": ["mlp.ratio=3"], "gqa+mlp3": ["attention=gqa", "mlp.ratio=3"]}
    (root / "sweep.yaml").write_text(yaml.safe_dump({"factors": factors, "arms": arms}))
    for gqa in (0, 1):
        for mlp3 in (0, 1):
            arm = "+".join(n for n, on in (("gqa", gqa), ("mlp3", mlp3)) if on) or "base"
            for seed in range(3):
                final = 2.0 - 0.05 * gqa + 0.02 * mlp3 + 0.06 * gqa * mlp3 + 0.004 * SEED_NOISE[seed] / 0.012
                write_run(
                    root / arm / f"seed{seed}", seed=seed, choices={"attention": "gqa" if gqa else "mha"},
                    leaves={"mlp.ratio": 3 if mlp3 else 4, "arm": arm},
                    loss_at=lambda step, f=final: f + 0.01 * (100 - step),
                    tokens_per_s=1000.0 * (1.2 if gqa else 1.0) * (1.1 if mlp3 else 1.0) * SPEED_NOISE[seed],
                )  # fmt: skip
    return [str(root), "--noise-floor", "none"]


def mixed(tmp: Path) -> list[str]:
    """Runs scored on different validation sets: refused in one line."""
    a = write_run(tmp / "mixed" / "a", data_fingerprint="data-1")
    b = write_run(tmp / "mixed" / "b", data_fingerprint="data-2", choices={"attention": "gqa"})
    return [str(a), str(b)]


SCENARIOS: dict[str, Callable[..., list[str]]] = {
    "main_table": main_table,
    "timed": timed,
    "with_floor": with_floor,
    "probes": probes,
    "evals": evals,
    "decode": decode,
    "threshold": threshold,
    "lr_grid": lr_grid,
    "lr_grid_report": lr_grid_report,
    "ladder": ladder,
    "factorial": factorial,
    "mixed": mixed,
}
