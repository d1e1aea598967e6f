"""eval.json: gptlab-eval's lm-evaluation-harness results in a run dir, one entry per task (its metrics and what they
were measured under), and its one reader: gptlab-eval merges new tasks into what it reads, gptlab-compare tables it.
A damaged file is refused in one line naming it, never replaced or read as empty."""

from __future__ import annotations

from pathlib import Path

from gptlab.util.stored import Check, read_json

EVAL_FILE = "eval.json"
FORMAT = 1
_UNIT = ("acc", "acc_norm", "exact_match")  # fractions in [0, 1]; other metrics (perplexities, ...) only finite


def new_record() -> dict:
    """An eval.json with no task evaluated yet."""
    return {"format": FORMAT, "tasks": {}}


def _check_task(task: str, entry, check: Check) -> None:
    entry = check.mapping(f"task {task}", entry)
    metrics = entry.get("metrics", {})
    if not isinstance(metrics, dict):
        raise check.fail(f"task {task} metrics={metrics!r} is not a mapping of metric names to numbers")
    for key, value in metrics.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise check.fail(f"task {task} {key}={value!r} is not a number")
        if str(key).split("/")[0].endswith("_stderr"):
            check.number(f"task {task} {key}", value, ">= 0", null=True)
        elif str(key).split("/")[0] in _UNIT:
            check.number(f"task {task} {key}", value, "[0, 1]", null=True)
        else:
            check.number(f"task {task} {key}", value, null=True)
    check.number(f"task {task} step", entry.get("step"), ">= 0", int, null=True)
    check.number(f"task {task} samples", entry.get("samples"), ">= 1", int, null=True)
    check.number(f"task {task} num_fewshot", entry.get("num_fewshot"), ">= 0", int, null=True)
    check.number(f"task {task} limit", entry.get("limit"), "> 0", null=True)
    check.number(f"task {task} prefix_token_id", entry.get("prefix_token_id"), ">= 0", int, null=True)
    for key in ("config_sha256", "lm_eval"):
        check.text(f"task {task} {key}", entry.get(key), null=True)


def read_evals(path: Path) -> dict:
    """The eval.json at `path` ({"format": 1, "tasks": {}} when there is none), every task's figures checked; a
    damaged one is a one-line ConfigError naming it and what to do."""
    check = Check(Path(path), "move it aside and run gptlab-eval again (it writes the tasks it evaluates)")
    record = read_json(path, check.fix)
    if record is None:
        return new_record()
    if not isinstance(record, dict):
        raise check.fail(f"expected a JSON object, got {type(record).__name__}")
    if record.get("format") != FORMAT:
        raise check.fail(f"format={record.get('format')!r}; this gptlab reads format {FORMAT}")
    tasks = record.get("tasks")
    if not isinstance(tasks, dict):
        raise check.fail(f"tasks={tasks!r} is not a mapping of task names to results")
    for task, entry in tasks.items():
        _check_task(str(task), entry, check)
    return record
