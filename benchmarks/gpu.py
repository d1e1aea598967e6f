"""`make gpu-check` / `python -m benchmarks --gpu [--quick] [--out docs/]`: the CUDA path checked on this GPU.

Without CUDA it prints one line and exits 0: nothing is measured and docs/GPU.md is left as it is. With CUDA
every check runs (a failing check is recorded and the others go on), then GPU.md and gpu.json are written with
the device name and the date; the exit status is 1 when any check failed.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from benchmarks.common import Bench, hermetic_env

NO_CUDA = "gpu-check: no CUDA device here (torch {torch}); nothing measured, docs/GPU.md left as it is"

# (name, module) in the order they run: benchmarks.<module>.check_<name>. gpu_kernels checks run in this
# process and take (device, sizes); gpu_runs checks start gptlab-train and take (bench, sizes).
CHECKS = [
    ("device", "gpu_kernels"),
    ("train_cli", "gpu_runs"),
    ("tf32_mfu", "gpu_runs"),
    ("attention_matrix", "gpu_kernels"),
    ("masked_gqa_kernels", "gpu_kernels"),
    ("flex_compile", "gpu_kernels"),
    ("attention_memory", "gpu_kernels"),
    ("fp16_vs_bf16", "gpu_runs"),
    ("ddp", "gpu_runs"),
    ("fsdp", "gpu_fsdp"),
    ("profile_unchanged", "gpu_runs"),
    ("compile_modes", "gpu_resume"),
    ("kill_resume", "gpu_resume"),
]
NOT_COVERED = [
    "SIGUSR2 then SIGTERM to one DDP rank",
    "the d12 study at its full budget (1,000 steps, 3 seeds; `make gpu-study` runs it window-sized)",
]


def sizes(quick: bool) -> dict:
    """Sequence lengths, step counts and the profiled model; --quick shrinks them to check the check."""
    if quick:
        return {"T": 256, "T_mem": 512, "steps": 10, "long_steps": 30, "profile_model": "tiny"}
    return {"T": 1024, "T_mem": 2048, "steps": 20, "long_steps": 200, "profile_model": "gpt2-medium"}


def run_check(name: str, module: str, bench: Bench, size: dict) -> dict:
    """One check; an exception becomes a failed row with its message, so the other checks still run."""
    bench.log(f"== {name} ==")
    t0 = time.perf_counter()
    try:
        fn = getattr(importlib.import_module(f"benchmarks.{module}"), f"check_{name}")
        result = fn("cuda:0", size) if module == "gpu_kernels" else fn(bench, size)
    except Exception as err:  # noqa: BLE001 - a broken check is a result to report, not a reason to stop
        result = failed_row(bench, err)
    result["seconds"] = time.perf_counter() - t0
    bench.log(f"{name}: {'ok' if result['ok'] else 'FAILED'} - {result['detail']}")
    return result


def failed_row(bench: Bench, err: Exception) -> dict:
    """The row of a check that raised: its traceback in the log, its message on one line."""
    bench.log(traceback.format_exc())
    return {"ok": False, "detail": f"{type(err).__name__}: {' '.join(str(err).split())[:400]}"}


def stamp(meta: dict) -> dict:
    """Where and when a row was measured (kept on the row, so rows of earlier runs stay attributed)."""
    return {"device": meta["device"], "date": meta["date"], "torch": meta["torch"]}


def read_previous(path: Path) -> dict:
    """The rows of an earlier gpu.json, each with its stamp ({} when there is none); a damaged file is an error."""
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text())
        old = stamp(doc["meta"])
        return {name: {"measured": old} | row for name, row in doc["checks"].items()}
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(
            f"{path}: not a gpu.json this tool wrote ({type(err).__name__}); move it away to start a new page"
        ) from None


def _measured(row: dict, meta: dict) -> str:
    m = row.get("measured")
    if not m or m == stamp(meta):
        return "this run"
    return f"{m['device'].removeprefix('NVIDIA ')}, {m['date'][:10]}, torch {m['torch']}"


def markdown(doc: dict, sections: list[str] = (), described: list[tuple[str, str]] = ()) -> str:
    """GPU.md: the device, the date, one row per check (with where and when it was measured), what the checks do not
    cover, then `sections` (the GPU study's tables) and what each check runs (plus the `described` study steps)."""
    meta = doc["meta"]
    lines = [
        "# GPU check",
        "",
        # two lines: a study's command alone can fill one (tests/test_docs.py: no prose line over 300 characters)
        f"Measured by `{meta['command']}` on **{meta['device']}** ({meta['count']} visible),",
        f"{meta['date']}; torch {meta['torch']}, CUDA {meta['cuda']}. Raw figures: gpu.json.",
        "",
        "| check | result | figures | measured |",
        "|---|---|---|---|",
    ]
    for name, r in doc["checks"].items():
        verdict = "skipped" if r.get("skipped") else ("ok" if r["ok"] else "**FAILED**")
        lines.append(f"| {name} | {verdict} | {r['detail'].replace('|', '/')} | {_measured(r, meta)} |")
    lines += ["", "Not covered by `make gpu-check` yet: " + "; ".join(NOT_COVERED) + ".", ""]
    lines += list(sections)
    lines += ["## What each check runs", "", "| check | what it runs and when it passes |", "|---|---|"]
    lines += [f"| {name} | {what_it_checks(name, module)} |" for name, module in CHECKS]
    lines += [f"| {name} | {' '.join(text.split()).replace('|', '/')} |" for name, text in described]
    return "\n".join(lines) + "\n"


def what_it_checks(name: str, module: str) -> str:
    """The check's own docstring, on one line: the page describes what ran from the code that ran it."""
    doc = getattr(importlib.import_module(f"benchmarks.{module}"), f"check_{name}").__doc__ or ""
    return " ".join(doc.split()).replace("|", "/")


def write(out: Path, meta: dict, checks: dict, page=markdown) -> None:
    """gpu.json and GPU.md as they stand: rewritten after every check, so a check-run cut short (a time limit, a
    hung kernel) still leaves the rows it finished. `page`: doc -> GPU.md's text (the GPU study adds its tables)."""
    from gptlab.util.io import strict_json

    doc = strict_json({"meta": meta, "checks": checks})
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "GPU.md").write_text(page(doc) + kept_notes(out / "GPU.md"))


NOTES = "<!-- notes: written by hand, kept as they are when the page above is rewritten -->"


def kept_notes(path: Path) -> str:
    """The hand-written part of an existing GPU.md (from the NOTES marker on): what a run found and why."""
    text = path.read_text() if path.is_file() else ""
    return "\n" + text[text.index(NOTES) :] if NOTES in text else ""


def session(args, quick: bool, prefix: str, cuda: bool) -> tuple[Bench, dict]:
    """The work dir (--work, else a temp dir), the hermetic Bench every command runs in (its environment also this
    process's), and the page's meta: command, date, device, torch (`cuda`: the GPU's name; else a CPU dry run)."""
    import torch

    work = (args.work or Path(tempfile.mkdtemp(prefix=prefix))).resolve()
    bench = Bench(quick=quick, work=work, env=hermetic_env(work))
    os.environ.update(bench.env)
    meta = {
        "command": "python -m benchmarks " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "device": torch.cuda.get_device_name(0) if cuda else "CPU (dry run)",
        "count": torch.cuda.device_count() if cuda else 0,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "quick": quick,
    }
    return bench, meta


def main(args) -> int:
    import torch

    if not torch.cuda.is_available():
        print(NO_CUDA.format(torch=torch.__version__))
        return 0
    only = [s.strip() for s in (args.only or "").split(",") if s.strip()]
    unknown = [s for s in only if s not in {c[0] for c in CHECKS}]
    if unknown:
        print(
            f"error: --only: unknown GPU check '{unknown[0]}'; allowed: {', '.join(c[0] for c in CHECKS)}",
            file=sys.stderr,
        )
        return 2
    bench, meta = session(args, args.quick, "gptlab-gpu-check-", cuda=True)
    work = bench.work
    size, checks = sizes(args.quick), {}
    for name, module in CHECKS:
        if not only or name in only:
            checks[name] = run_check(name, module, bench, size)
            write(args.out, meta, checks)
    failed = [n for n, r in checks.items() if not r["ok"]]
    print(
        f"wrote {args.out / 'GPU.md'}: {len(checks) - len(failed)} of {len(checks)} checks ok"
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0
