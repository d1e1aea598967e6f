"""gptlab-eval RUN_DIR --tasks T1,T2 [--include-path DIR] [--limit N] [--num-fewshot K]: lm-evaluation-harness on a run.

The run's newest checkpoint is evaluated as the Hugging Face model `gptlab-export --format hf` writes (GPT-2, or Llama;
an architecture neither can express is refused in one line), through lm-eval's HF backend. Each task's metrics go to
RUN_DIR/eval.json (merged with tasks evaluated before) and, when the run logged to W&B (RUN_DIR/wandb_run_id), into
that same W&B run's summary as eval/<task>/<metric> (resumed in the mode it ran in: offline stays offline). A run
without a W&B run gets none. gptlab-compare shows the eval columns with seed statistics.

Tasks named from lm-eval's registry download their datasets from the Hugging Face Hub (a network is needed); a task
YAML under --include-path may read local files (`dataset_path: json`, `dataset_kwargs: {data_files: ...}`).
Needs gptlab[eval].
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gptlab.cli import fail
from gptlab.errors import ConfigError
from gptlab.interop.quiet import tqdm_off_for_this_process
from gptlab.util.extras import require


def _wandb(run_dir: Path, metrics: dict[str, float]) -> str:
    """Put `metrics` into the run's own W&B run summary (resumed by its id); says where, or why not."""
    from gptlab.sinks.wandb import RUN_ID_FILE, WandbSink

    if not (run_dir / RUN_ID_FILE).is_file():
        return "W&B: the run has no W&B run (logger=none); eval.json only"
    try:
        where = json.loads((run_dir / "summary.json").read_text()).get("wandb") or {}
    except (OSError, ValueError, AttributeError):
        where = {}
    sink = WandbSink(
        run_dir,
        project=where.get("project") or "gptlab",
        entity=where.get("entity"),
        group=where.get("group"),
        mode=where.get("mode") or "auto",
        job_type="train",  # the same run, resumed
        resumed=True,
    )
    sink.summary(metrics)
    sink.close("finished")
    return f"W&B: run {sink.run_id} ({sink.mode}){' — ' + sink.sync_command if sink.sync_command else ''}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gptlab-eval", description=__doc__.splitlines()[0])
    parser.error = lambda message: fail(f"gptlab eval: {message}")  # type: ignore[method-assign]  # one line, exit 2
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--tasks", required=True, help="comma-separated lm-eval task names")
    parser.add_argument("--include-path", type=Path, default=None, help="a folder of extra task YAMLs")
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N documents of each task")
    parser.add_argument("--num-fewshot", type=int, default=None, help="few-shot examples (default: the task's)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--no-wandb", action="store_true", help="write eval.json only")
    args = parser.parse_args(argv)
    tqdm_off_for_this_process()  # lm-eval's own tqdm bars (before lm-eval imports tqdm)
    tasks = [t for t in args.tasks.split(",") if t]
    try:
        if not tasks:
            raise ConfigError("--tasks: name at least one task")
        for key, value in (("--limit", args.limit), ("--batch-size", args.batch_size)):
            if value is not None and value < 1:
                raise ConfigError(f"{key}={value}: must be >= 1")
        if args.num_fewshot is not None and args.num_fewshot < 0:
            raise ConfigError(f"--num-fewshot={args.num_fewshot}: must be >= 0")
        require("lm_eval", "eval", "gptlab-eval")
        from gptlab.interop.harness import evaluate, flat_metrics
        from gptlab.sinks.evals import EVAL_FILE

        record, done = evaluate(args.run_dir, tasks, args.include_path, args.limit, args.num_fewshot, args.batch_size)
    except ConfigError as err:
        fail(err)
    except OSError as err:
        fail(f"I/O error '{err.filename}': {err.strerror or err}", code=1)
    metrics = flat_metrics({"tasks": {t: record["tasks"][t] for t in done}})
    for key, value in sorted(metrics.items()):
        print(f"{key} = {value:.4f}")
    print(args.run_dir / EVAL_FILE)
    if not args.no_wandb:
        try:
            print(_wandb(args.run_dir, metrics))
        except ConfigError as err:  # e.g. an online run resumed where no W&B key is configured
            print(f"W&B: not logged ({err}); eval.json has the results")
    return 0


if __name__ == "__main__":
    sys.exit(main())
