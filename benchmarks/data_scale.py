"""Data at scale (issue 16): gpt2 tokenize throughput, peak RSS and cache size on generated corpora; on the cached
corpus, `gptlab-train` command -> first step and the data-loading share of the step time.

    python -m benchmarks.data_scale [--sizes 100MB,1GB] [--num-proc 1,2] [--work DIR] [--out docs/]

Corpora (MB/GB decimal): words from a fixed English list (Zipf weights, seeded numpy RNG), 12 a line, as a .txt (one
document) and a .jsonl of ~4 KB documents holding the same text. Each (size, format, num_proc; --pinned adds the .txt
pinned to one core) runs in a fresh process with an empty cache: the full content hash (a file's first run only),
then TextData (tokenize + write shards); peak RSS is that process's own VmHWM. On the largest .txt's cache: TextData
alone (a hit), then `gptlab-train model=tiny data=text ... train.max_steps=1` (batch 4, hardware.peak_flops given: no
one-time matmul probe) from launch to its first step row (benchmarks.startup.first_step), split at the loop's start;
--steps runs give the batch wait per step (summary data_ms_median), train.prefetch 2 and 0 (--no-train: skip this).
Outside load (CpuMeter: share of the cores other processes used) is recorded next to every figure.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# isort: off
from benchmarks.common import (
    REPO,
    Bench,
    BenchError,
    CpuMeter,
    hermetic_env,
    machine,
    median,
    read_json,
    read_rows,
    wait_quiet,
)

# isort: on
from benchmarks.corpus_gen import generate
from benchmarks.data_scale_report import ISSUE_BEFORE, extrapolate, markdown
from benchmarks.startup import first_step
from gptlab.io import strict_json

UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(KB|MB|GB)", text.strip(), re.IGNORECASE)
    if not m:
        raise BenchError(f"--sizes: cannot read {text!r}; give sizes like 100MB,1GB")
    return int(float(m[1]) * UNITS[m[2].upper()])


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
        "step_ms": row["step_ms"],
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


def measure(
    bench: Bench,
    sizes: list[tuple[str, int]],
    nprocs: list[int],
    repeats: int,
    steps: int,
    wait_s: float,
    train: bool = True,
    pinned: bool = False,
) -> dict:
    corpora, rows = [], []
    for label, nbytes in sizes:
        bench.log(f"generating {label} corpora")
        info = generate(bench.dir("corpora"), label, nbytes)
        corpora.append({"label": label, **info})
        for fmt in ("txt", "jsonl"):
            pin = [None] if pinned and fmt == "txt" else []
            rows += [tokenize(bench, info[fmt], fmt, label, info[f"{fmt}_bytes"], n, wait_s) for n in nprocs + pin]
    cache = bench.work / "cache" / f"{sizes[-1][0]}-txt-np{max(nprocs)}"
    runs = [train_runs(bench, corpora[-1]["txt"], cache, repeats, steps, wait_s)] if train else []
    foreign = [r["foreign"] for r in rows] + [x["foreign"] for t in runs for x in t["first_step"] + t["data_share"]]
    return {
        "corpora": corpora,
        "tokenize": rows,
        "train": runs,
        "extrapolation_10GB": extrapolate(rows),
        "issue_before": ISSUE_BEFORE,
        "foreign_cpu": median(foreign),
        "foreign_cpu_max": max(foreign),
    }


def parse(argv):
    about = " ".join(__doc__.split("\n\n")[0].split())  # the first paragraph
    p = argparse.ArgumentParser(prog="python -m benchmarks.data_scale", description=about)
    p.add_argument("--sizes", default="100MB,1GB", help="corpus sizes, e.g. 100MB,1GB (decimal units)")
    p.add_argument("--num-proc", default="1,2", help="data.num_proc values to tokenize with (default 1,2)")
    p.add_argument("--work", type=Path, help="corpora, caches and runs go here (default: a temp dir, removed after)")
    p.add_argument("--out", type=Path, default=REPO / "docs", help="where data_scale.json goes (default docs/)")
    p.add_argument("--repeats", type=int, default=3, help="gptlab-train first-step runs per corpus (median)")
    p.add_argument("--steps", type=int, default=30, help="steps of the data-share runs (medians skip 5)")
    p.add_argument("--wait", type=float, default=20, help="wait up to this many s for a quiet machine per figure")
    p.add_argument("--pinned", action="store_true", help="also tokenize each .txt pinned to one core (num_proc null)")
    p.add_argument("--no-train", action="store_true", help="tokenize only (skip the gptlab-train runs)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    try:
        sizes = sorted(((s.strip(), parse_size(s)) for s in args.sizes.split(",") if s.strip()), key=lambda s: s[1])
        nprocs = sorted({int(n) for n in args.num_proc.split(",")})
        if not sizes or min(nprocs) < 1:
            raise BenchError("--sizes and --num-proc need at least one value each (num_proc >= 1)")
    except (BenchError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    work = (args.work or Path(tempfile.mkdtemp(prefix="gptlab-data-scale-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    bench = Bench(quick=False, work=work, env=hermetic_env(work))
    started = time.perf_counter()
    try:
        res = measure(
            bench, sizes, nprocs, args.repeats, args.steps, args.wait, train=not args.no_train, pinned=args.pinned
        )
    except BenchError as err:
        print(f"error: {err} (work files kept in {work})", file=sys.stderr)
        return 1
    command = "python -m benchmarks.data_scale " + " ".join(argv if argv is not None else sys.argv[1:])
    res["meta"] = {
        "command": command.strip(),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "wall_s": time.perf_counter() - started,
        "machine": machine(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "data_scale.json").write_text(json.dumps(strict_json(res), indent=1) + "\n")
    print(markdown(res))
    print(
        f"\nwrote {args.out / 'data_scale.json'} in {res['meta']['wall_s'] / 60:.1f} min; outside load median "
        f"{100 * res['foreign_cpu']:.0f} %, max {100 * res['foreign_cpu_max']:.0f} %"
    )
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
