"""Regenerate docs/report.png from a real sweep: 2 arms x 3 seeds whose speed verdict is decided either way.

    python -m benchmarks.report_image                  (on a quiet machine; about 5 minutes on 2 cores)
    python -m benchmarks.report_image --dry-run        (print the sweep and the commands, run nothing)

The arms change the MLP width of the CPU default model widened to d_model 256 (4 layers, block 128, char-level
Shakespeare): mlp.ratio 4 (the baseline) and 1. A layer holds 4·d² attention projection weights and 2·ratio·d² MLP
weights, so the cost model predicts ratio 1 up to ~1.75x faster, while its val loss is a real question. At d_model
128 a step is dominated by fixed per-op costs and the speed-up drowned in noise (measured: docs/COMPARE.md).

It runs `gptlab-sweep` (the local queue: one run at a time on 2 cores), then `gptlab-compare --power`, records the
machine's outside load over the whole sweep (other processes' share of the cores), and writes the PNG with headless
Chromium (gptlab/compare/render/screenshot.py) only when the result is worth showing: outside load < 10 % over the sweep
and in every run, and every arm's speed verdict decided (faster or slower). Otherwise it says why and writes no
PNG (--force writes it anyway, for a look). Without Chromium it prints the screenshot command to run elsewhere.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from gptlab.runtime.cpu_load import job_sampler

QUIET = 0.10  # outside load (share of all cores) above which the image is not made
SPEC = {
    "description": "report image: the CPU default model at MLP ratio 4 (baseline) and 1, 3 seeds each",
    "seeds": [0, 1, 2],
    "overrides": [
        "model.d_model=256",
        "train.max_steps=300",
        "train.eval_interval=25",
        "train.batch_size=16",
        "train.eval_sequences=64",
        "logger=none",
    ],
    "arms": {"ratio4": ["mlp.ratio=4"], "ratio1": ["mlp.ratio=1"]},
}
BASELINE = "mlp.ratio=4"


def _run(cmd: list[str]) -> None:
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def _checks(doc: dict, load: float | None) -> list[str]:
    """Why this comparison is not worth the README's image (empty: it is)."""
    why = []
    if load is None or load >= QUIET:
        shown = "not measured" if load is None else f"{100 * load:.0f}%"
        why.append(f"outside load over the sweep {shown} (needs < {100 * QUIET:.0f}%)")
    for row in doc["rows"]:
        if row.get("under_load") or (row.get("outside_load") or 0.0) >= QUIET:
            why.append(f"'{row['label']}' has a run at {100 * (row.get('outside_load') or 0):.0f}% outside load")
        if row["speed"]["status"] not in ("baseline", "decided"):
            why.append(f"'{row['label']}' speed verdict is '{row['speed']['status']}', not decided")
    return why


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report_image", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/report_image"), help="sweep dir (a fresh one)")
    parser.add_argument("--png", type=Path, default=Path("docs/report.png"))
    parser.add_argument("--dry-run", action="store_true", help="print the sweep and the commands, run nothing")
    parser.add_argument("--force", action="store_true", help="write the PNG even when the checks fail")
    args = parser.parse_args(argv)
    spec_file = args.out.with_suffix(".yaml")
    sweep = [sys.executable, "-m", "gptlab.cli.sweep", str(spec_file), "--out", str(args.out)]
    html = args.out / "comparison" / "comparison.html"
    compare = [sys.executable, "-m", "gptlab.cli.compare", str(args.out), "--baseline", BASELINE]
    compare += ["--out", str(html.parent), "--power", "--no-wandb", "--time"]  # speed verdicts: timed alone
    if args.dry_run:
        print(yaml.safe_dump(SPEC, sort_keys=False) + "$ " + " ".join(sweep) + "\n$ " + " ".join(compare))
        return 0
    if args.out.exists():
        print(f"error: {args.out} exists; give a fresh --out (the image needs one sweep measured now)", file=sys.stderr)
        return 2
    spec_file.parent.mkdir(parents=True, exist_ok=True)
    spec_file.write_text(yaml.safe_dump(SPEC, sort_keys=False))
    sampler = job_sampler(1)  # the sweep's runs are this process's children: what it counts is everyone else
    sampler.start()
    start = time.monotonic()
    _run(sweep)
    load, minutes = sampler.mean(), (time.monotonic() - start) / 60.0
    _run(compare)
    doc = json.loads((html.parent / "comparison.json").read_text())
    shown = "not measured" if load is None else f"{100 * load:.1f}%"
    print(f"sweep: {minutes:.1f} min, outside load over it {shown}")
    why = _checks(doc, load)
    for line in why:
        print(f"not worth showing: {line}", file=sys.stderr)
    if why and not args.force:
        print(f"no PNG written; the report is {html}", file=sys.stderr)
        return 1
    from gptlab.compare.render.screenshot import find_chromium, screenshot
    from gptlab.errors import ConfigError

    try:
        find_chromium()
    except ConfigError as err:
        print(f"{err}\nrender it elsewhere: python -m gptlab.compare.render.screenshot {html} {args.png}")
        return 0
    screenshot(html, args.png)
    print(f"wrote {args.png}: look at it before committing it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
