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
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, Bench, BenchError, hermetic_env, machine, median
from benchmarks.corpus_gen import generate
from benchmarks.data_scale_report import ISSUE_BEFORE, extrapolate, markdown
from benchmarks.data_scale_runs import child, tokenize, train_runs
from gptlab.util.io import strict_json

UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(KB|MB|GB)", text.strip(), re.IGNORECASE)
    if not m:
        raise BenchError(f"--sizes: cannot read {text!r}; give sizes like 100MB,1GB")
    return int(float(m[1]) * UNITS[m[2].upper()])


def measure(
    bench: Bench,
    sizes: list[tuple[str, int]],
    nprocs: list[int],
    repeats: int,
    steps: int,
    wait_s: float,
    train: bool = True,
    pinned: bool = False,
    formats: tuple[str, ...] = ("txt", "jsonl"),
) -> dict:
    corpora, rows = [], []
    for label, nbytes in sizes:
        bench.log(f"generating {label} corpora")
        info = generate(bench.dir("corpora"), label, nbytes, jsonl_too="jsonl" in formats)
        corpora.append({"label": label, **info})
        for fmt in formats:
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
    p.add_argument("--formats", default="txt,jsonl", help="corpus formats to tokenize: txt, jsonl or both (default)")
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
        formats = tuple(dict.fromkeys(f.strip() for f in args.formats.split(",") if f.strip()))
        if not formats or not set(formats) <= {"txt", "jsonl"} or (not args.no_train and "txt" not in formats):
            raise BenchError(
                f"--formats {args.formats!r}: allowed: txt, jsonl or txt,jsonl (the training runs read the .txt)"
            )
    except (BenchError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    work = (args.work or Path(tempfile.mkdtemp(prefix="gptlab-data-scale-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    bench = Bench(quick=False, work=work, env=hermetic_env(work))
    started = time.perf_counter()
    try:
        res = measure(
            bench, sizes, nprocs, args.repeats, args.steps, args.wait, not args.no_train, args.pinned, formats
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
