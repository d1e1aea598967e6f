"""The fresh-process measurements of the data-at-scale benchmark (benchmarks/data_scale.py): one tokenization per
process with an empty cache (`python -m benchmarks.data_scale --child`: the content hash, then TextData; its time,
cores used, peak RSS, cache size and progress lines), and on the cached corpus a cache hit on its own, gptlab-train's
command -> first step (split at the loop's start) and the batch wait per step with train.prefetch 2 and 0."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import REPO, Bench, BenchError, CpuMeter, median, read_json, read_rows, wait_quiet
from benchmarks.startup import first_step


def _status_kib(field: str) -> int:
    """A /proc/self/status field in KiB (VmHWM: this process image's peak RSS; ru_maxrss carries the parent's)."""
    return int(next(line for line in open("/proc/self/status") if line.startswith(field + ":")).split()[1])


def child(spec: dict) -> dict:
    """In a fresh process: hash the file (a first run's cost), then TextData (tokenize into shards); num_proc None:
    pinned to one core first (data.num_proc null = the cores the process may use = 1)."""
    if spec["num_proc"] is None:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    from gptlab.data.files import content_hashes, resolve_paths
    from gptlab.data.text import TextData

    rss0, cache = _status_kib("VmRSS"), Path(spec["cache"])
    t0 = time.perf_counter()
    content_hashes(resolve_paths([spec["path"]]), cache)
    t1, cpu1 = time.perf_counter(), os.times()
    data = TextData(
        seed=0, block_size=128, cache_dir=cache, paths=[spec["path"]], tokenizer="gpt2", num_proc=spec["num_proc"]
    )
    t2, cpu2 = time.perf_counter(), os.times()
    return {
        "hash_s": t1 - t0,
        "tokenize_s": t2 - t1,
        "from_cache": data.from_cache,
        "tokenize_cpu_s": (cpu2.user + cpu2.system) - (cpu1.user + cpu1.system),
        "tokens": len(data.train_tokens) + len(data.val_tokens),
        "rss_after_imports_mib": rss0 / 1024,
        "peak_rss_mib": _status_kib("VmHWM") / 1024,
        "cache_path": str(data.cache_path),
        "cpus": len(os.sched_getaffinity(0)),
    }


def run_child(bench: Bench, path: str, cache: Path, num_proc: int | None, log: Path) -> dict:
    """child() in a fresh process (stderr to `log`), with the share of the cores other processes used meanwhile."""
    args = [
        sys.executable,
        "-m",
        "benchmarks.data_scale",
        "--child",
        json.dumps({"path": path, "cache": str(cache), "num_proc": num_proc}),
    ]
    with open(log, "w") as err, CpuMeter() as meter:
        proc = subprocess.run(
            args, cwd=REPO, env=bench.env, stdout=subprocess.PIPE, stderr=err, text=True, timeout=3600
        )
    if proc.returncode != 0:
        raise BenchError(f"tokenizing {path} exited {proc.returncode}: {log.read_text()[-400:]}")
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "foreign": meter.foreign}


def tokenize(bench: Bench, path: str, fmt: str, label: str, nbytes: int, num_proc: int | None, wait_s: float) -> dict:
    """One tokenization in a fresh process with an empty cache (num_proc None: pinned to one core); its figures."""
    name = f"{label}-{fmt}-np{num_proc or '1core'}"
    cache, log = bench.work / "cache" / name, bench.dir("logs") / f"{name}.log"
    shutil.rmtree(cache, ignore_errors=True)
    wait_quiet(bench, wait_s)
    bench.log(f"tokenizing {Path(path).name} with num_proc={num_proc}")
    res = run_child(bench, path, cache, num_proc, log)
    files = [f for f in cache.rglob("*") if f.is_file()]
    disk = sum(f.stat().st_blocks * 512 for f in files)  # bytes allocated on disk
    lines = [ln for ln in log.read_text().splitlines() if "tokenizing (gpt2):" in ln]
    leftovers = [p.name for p in (cache / "tokens").iterdir() if p.name.endswith((".partial", ".lock", ".tmp"))]
    return {
        "corpus": f"{label} .{fmt}",
        "label": label,
        "format": fmt,
        "num_proc": num_proc,
        "text_bytes": nbytes,
        **res,
        "mb_per_s": nbytes / 1e6 / res["tokenize_s"],
        "bytes_per_token": nbytes / res["tokens"],
        "cores_used": res["tokenize_cpu_s"] / res["tokenize_s"],
        "cache_bytes": disk,
        "cache_files": len(files),
        "cache_over_text": disk / nbytes,
        "leftovers": leftovers,
        "progress_lines": len(lines),
        "last_progress_line": lines[-1].split(": ", 1)[-1] if lines else None,
    }


def _start(bench: Bench, out: Path, extra: list[str], env: dict) -> dict:
    """first_step, plus its split: launch -> training loop (setup) and the loop's eval at step 0 + first step."""
    res = first_step(bench, out, extra, **env)
    run = max((p for p in out.glob("run*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
    row = next(r for r in read_rows(run / "metrics.jsonl") if "train/loss" in r)
    return {
        **res,
        "setup_s": res["first_step_s"] - row["wall_s"],
        "loop_s": row["wall_s"],
        "step_ms": row["perf/step_ms"],
        "summary": read_json(run / "summary.json"),
    }


def train_runs(bench: Bench, corpus: str, cache: Path, repeats: int, steps: int, wait_s: float) -> dict:
    """A cache hit on its own, command -> first step of gptlab-train (max_steps=1), the batch wait of `steps` steps."""
    out, env = bench.dir("train"), {"GPTLAB_CACHE": str(cache)}
    base = [
        "data=text",
        f"data.paths=['{corpus}']",
        "data.tokenizer=gpt2",
        "logger=none",
        "train.batch_size=4",
        "train.eval_sequences=4",
        "hardware.peak_flops=1e12",
    ]  # a given peak: no one-time matmul probe
    entries = sorted(p.name for p in (cache / "tokens").iterdir())
    wait_quiet(bench, wait_s)
    hit = run_child(bench, corpus, cache, 2, bench.dir("logs") / "cache-hit.log")  # TextData alone, after imports
    starts = []
    for _ in range(repeats):
        wait_quiet(bench, wait_s)
        starts.append(_start(bench, out, [*base, "train.max_steps=1"], env))
    share = []
    for prefetch in (2, 0):
        wait_quiet(bench, wait_s)
        run = _start(bench, out, [*base, f"train.max_steps={steps}", f"train.prefetch={prefetch}"], env)
        data_ms, step_ms = run["summary"].get("data_ms_median"), run["summary"].get("step_ms_median")
        share.append(
            {
                "prefetch": prefetch,
                "steps": steps,
                "data_ms_median": data_ms,
                "step_ms_median": step_ms,
                "data_share": data_ms / step_ms if data_ms is not None and step_ms else None,
                "in_summary": "data_ms_median" in run["summary"],
                "foreign": run["foreign"],
                "run_outside_load": run["summary"].get("outside_load"),
            }
        )
    pick = {k: median(r[k] for r in starts) for k in ("first_step_s", "total_s", "setup_s", "loop_s", "foreign")}
    return {
        "corpus": corpus,
        "overrides": base,
        "data_ready_s": hit["hash_s"] + hit["tokenize_s"],
        "data_ready": hit,
        **pick,
        "first_step": [{k: v for k, v in r.items() if k != "summary"} for r in starts],
        "data_share": share,
        "cache_hit": hit["from_cache"] and sorted(p.name for p in (cache / "tokens").iterdir()) == entries,
    }
