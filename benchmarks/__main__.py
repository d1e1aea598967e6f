"""`python -m benchmarks [--quick] [--out docs/]`: measure this machine, write BENCHMARKS.md and benchmarks.json.

Sections: overhead (gptlab-train vs a bare loop), throughput (fp32/bf16, eager/compile, MFU vs the in-run
matmul peak), ablation (the seeds' arms via gptlab-sweep + gptlab-compare), quality (fast and attention
sweeps at a fixed step budget), startup (command -> first step, imports, sweep overhead), scaling (T and
batch, naive vs sdpa), minimal_gpt (gptlab-train vs an independent minimal GPT, same model and batches). The full run takes about 30 minutes on 2 cores; --quick (tiny sizes) about 3.
`--gpu` instead checks the CUDA path on this machine's GPU and writes GPU.md (benchmarks/gpu.py); `--gpu --study`
runs the GPU study for a short lent window (benchmarks/gpu_study.py; `--dry-run` runs it on this CPU at tiny sizes).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, Bench, BenchError, hermetic_env
from gptlab.util.io import strict_json

SECTIONS = ("overhead", "throughput", "ablation", "quality", "startup", "scaling", "minimal_gpt")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes (~3 min): checks the benchmark code, not figures")
    p.add_argument(
        "--out", type=Path, default=REPO / "docs", help="where BENCHMARKS.md and benchmarks.json go (default: docs/)"
    )
    p.add_argument("--only", help=f"comma-separated sections to run (default: all of {', '.join(SECTIONS)})")
    p.add_argument("--work", type=Path, help="keep run/sweep dirs here (default: a temp dir, removed at the end)")
    p.add_argument(
        "--gpu",
        action="store_true",
        help="check the CUDA path on this machine's GPU and write GPU.md (make gpu-check); --only picks checks",
    )
    p.add_argument(
        "--study",
        action="store_true",
        help="with --gpu: the GPU study for one short window (make gpu-study); --only picks steps",
    )
    p.add_argument(
        "--budget", type=float, help="with --study: seconds; a step whose estimate no longer fits is skipped, said"
    )
    p.add_argument(
        "--dry-run", action="store_true", help="with --study: the same steps on this CPU at tiny sizes (needs --out)"
    )
    return p.parse_args(argv)


def check(args: argparse.Namespace) -> list[str]:
    """The sections to run; a one-line error for a bad --only or --out."""
    sections = [s.strip() for s in (args.only or ",".join(SECTIONS)).split(",") if s.strip()]
    bad = [s for s in sections if s not in SECTIONS]
    if bad or not sections:
        raise BenchError(f"--only: unknown section '{bad[0] if bad else ''}'; allowed: {', '.join(SECTIONS)}")
    for path, what in ((args.out, "--out"), (args.work, "--work")):
        if path is not None and path.exists() and not path.is_dir():
            raise BenchError(f"{what} '{path}' exists and is not a directory; give a directory")
    return sections


def run_sections(bench: Bench, sections: list[str]) -> tuple[dict, dict]:
    """Run each section; returns (results, seconds per section). A failing section stops the run."""
    import importlib

    results, seconds = {}, {}
    for name in sections:
        t0 = time.perf_counter()
        bench.log(f"== {name} ==")
        results[name] = importlib.import_module(f"benchmarks.{name}").measure(bench)
        seconds[name] = time.perf_counter() - t0
        bench.log(f"{name} took {seconds[name]:.0f}s")
    return results, seconds


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.study or args.dry_run or args.budget is not None:
        if not (args.gpu and args.study):
            print("error: --study, --budget and --dry-run go with --gpu --study", file=sys.stderr)
            return 2
        from benchmarks.gpu_study import main as gpu_study

        return gpu_study(args)
    if args.gpu:
        from benchmarks.gpu import main as gpu_check

        return gpu_check(args)
    try:
        sections = check(args)
    except BenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    work = (args.work or Path(tempfile.mkdtemp(prefix="gptlab-bench-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    bench = Bench(quick=args.quick, work=work, env=hermetic_env(work))
    os.environ.update(bench.env)  # the in-process sections use the same caches (and a cold inductor cache)
    import torch

    from benchmarks import report
    from benchmarks.common import machine
    from gptlab.runtime.threads import threads_for_job

    torch.set_num_threads(threads_for_job())
    started = time.perf_counter()
    try:
        results, seconds = run_sections(bench, sections)
    except BenchError as err:
        print(f"error: {err} (work files kept in {work})", file=sys.stderr)
        return 1
    command = "python -m benchmarks " + " ".join(argv if argv is not None else sys.argv[1:])
    meta = {
        "command": command.strip(),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "quick": args.quick,
        "wall_s": time.perf_counter() - started,
        "section_s": seconds,
        "machine": machine(),
    }
    peaks = results.get("throughput", {}).get("peaks", {})
    meta |= {"bf16_probe_min": peaks.get("bf16_peak_flops_min"), "bf16_probe_max": peaks.get("bf16_peak_flops_max")}
    args.out.mkdir(parents=True, exist_ok=True)
    doc = report.merged(args.out / "benchmarks.json", strict_json(meta), strict_json(results), bool(args.only))
    (args.out / "benchmarks.json").write_text(json.dumps(doc, indent=1) + "\n")
    page = args.out / "BENCHMARKS.md"
    old = page.read_text() if page.is_file() else ""
    head = old.split("\n## ")[0] if args.only and old else None  # a partial run keeps the full run's header
    page.write_text(report.markdown(doc, set(results), head) + report.kept_sections(old, set(results)))
    print(f"wrote {args.out / 'BENCHMARKS.md'} and {args.out / 'benchmarks.json'} in {meta['wall_s'] / 60:.1f} min")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
