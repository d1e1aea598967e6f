"""lm-evaluation-harness on a trained run: the run's newest checkpoint as the Hugging Face model it exports to (and its
tokenizer, gptlab/interop/tokenizer.py), evaluated by lm-eval's HF backend (`lm_eval.simple_evaluate` with an HFLM
over the model object), results kept per task in the run's eval.json.

Tasks come from lm-eval's registry (their datasets download from the Hugging Face Hub: a network is needed, or an
HF datasets cache that holds them) or from task YAMLs under `include_path` (a local dataset: `dataset_path: json`,
`dataset_kwargs: {data_files: ...}` works offline). eval.json keeps each task's metrics with what they were measured
under (step, lm-eval version, few-shot count, limit, the task config's hash): gptlab-compare pools a task's metric
over seeds only when all of that is the same.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
from collections.abc import Iterator
from pathlib import Path

from gptlab.config.trained import load_trained
from gptlab.errors import ConfigError
from gptlab.interop.hf import to_hf_model
from gptlab.interop.quiet import no_progress_bars
from gptlab.interop.tokenizer import to_hf_tokenizer
from gptlab.sinks.evals import EVAL_FILE, read_evals
from gptlab.state.layout import LOCK_FILE, check_output, lock_held
from gptlab.util.extras import require
from gptlab.util.io import write_json_atomic


def _task_manager(include_path: Path | None, tasks: list[str]):
    """lm-eval's TaskManager; every asked task must be known to it.

    Tasks that are all plain tasks of include_path are read from that folder alone: indexing lm-eval's own registry
    (~15,000 YAMLs) costs ~6 s, and include_path takes precedence over it anyway. A group, a tag or any task
    not in the folder takes the whole registry plus include_path, so a group's members resolve as they would there.
    """
    from lm_eval.tasks import TaskManager

    if include_path is not None and not Path(include_path).is_dir():
        raise ConfigError(f"--include-path={include_path}: not a folder of task YAMLs")
    if include_path is not None:
        local = TaskManager(include_path=str(include_path), include_defaults=False)
        if all(t in local.all_subtasks for t in tasks):
            return local
    manager = TaskManager(include_path=str(include_path) if include_path else None)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise ConfigError(
            f"--tasks: unknown task '{unknown[0]}'; allowed: lm-eval's tasks (lm-eval ls tasks) or a task YAML "
            f"under --include-path"
        )
    return manager


def _quiet_hflm():
    """lm-eval's HFLM with its progress bars off: its own disable_tqdm, which lm-eval's evaluator never passes."""
    from lm_eval.models.huggingface import HFLM

    class QuietHFLM(HFLM):
        def loglikelihood(self, requests, disable_tqdm: bool = False):
            return super().loglikelihood(requests, disable_tqdm=True)

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
            return super().loglikelihood_rolling(requests, disable_tqdm=True)

        def generate_until(self, requests, disable_tqdm: bool = False):
            return super().generate_until(requests, disable_tqdm=True)

    return QuietHFLM


def _lm(model, tokenizer, batch_size: int):
    """lm-eval's HFLM over the run's model as HF GPT-2, with the run's tokenizer in HF form."""
    logging.getLogger("lm_eval.models.huggingface").setLevel(logging.ERROR)  # "an already-initialized model": meant

    hf_model = to_hf_model(model.float(), tokenizer.eot_id)  # GPT-2 or Llama, else refused in one line
    hf_tokenizer = to_hf_tokenizer(tokenizer)
    if hf_tokenizer.pad_token is None:  # batches pad on the right; padded positions are never scored
        hf_tokenizer.pad_token = hf_tokenizer.eos_token or hf_tokenizer.convert_ids_to_tokens(0)
    return _quiet_hflm()(
        pretrained=hf_model,
        tokenizer=hf_tokenizer,
        batch_size=batch_size,
        max_length=model.cfg.block_size,
        prefix_token_id=prefix_token_id(tokenizer),
    )


def prefix_token_id(tokenizer) -> int:
    """The token lm-eval puts before an empty context: the end-of-text token, or for a vocabulary without one (char,
    byte) the newline's id (plain-text corpora separate documents with newlines), else id 0."""
    if tokenizer.eot_id is not None:
        return int(tokenizer.eot_id)
    ids = tokenizer.encode("\n")
    return ids[0] if len(ids) == 1 else 0


@contextlib.contextmanager
def _no_git_describe() -> Iterator[None]:
    """lm-eval's simple_evaluate runs `git describe` in the working directory with git's stderr on ours ("fatal: not a
    git repository" outside one), and has no option to skip it: its results' git_hash is None inside, never asked
    (gptlab keeps none of lm-eval's run metadata; a run's own provenance.json records the code's commit)."""
    import lm_eval.evaluator

    asked = getattr(lm_eval.evaluator, "get_git_commit_hash", None)  # None: an lm-eval that no longer asks git there
    if asked is not None:
        lm_eval.evaluator.get_git_commit_hash = lambda: None
    try:
        yield
    finally:
        if asked is not None:
            lm_eval.evaluator.get_git_commit_hash = asked


def _metrics(values: dict) -> dict:
    """lm-eval's `acc,none`/`acc_stderr,none` keys as `acc`/`acc_stderr` (filter `none` dropped, else `metric/filter`)."""
    out = {}
    for key, value in values.items():
        if "," not in key or not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        metric, filt = key.split(",", 1)
        number = float(value)
        out[metric if filt == "none" else f"{metric}/{filt}"] = number if math.isfinite(number) else None
    return out


def _config_sha(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def evaluate(
    run_dir: Path,
    tasks: list[str],
    include_path: Path | None = None,
    limit: int | None = None,
    num_fewshot: int | None = None,
    batch_size: int = 8,
    seed: int = 1234,
) -> tuple[dict, list[str]]:
    """Run lm-eval `tasks` on run_dir's newest checkpoint, merged into run_dir/eval.json: (that record, the tasks
    evaluated now)."""
    require("lm_eval", "eval", "gptlab-eval")
    require("transformers", "hf", "gptlab-eval")
    import lm_eval

    path = check_output(run_dir / EVAL_FILE, "eval.json", own=[run_dir])  # resolved; never another run's dir
    if lock_held(run_dir / LOCK_FILE):  # its checkpoint and W&B run are still being written
        raise ConfigError(f"{run_dir}: a gptlab-train is running in it; evaluate it once it has finished")
    read_evals(path)  # a damaged eval.json is refused before the evaluation, never replaced
    manager = _task_manager(include_path, tasks)
    model, text, step = load_trained(run_dir)
    lm = _lm(model, text.tokenizer, batch_size)
    try:
        with no_progress_bars(datasets=True), _no_git_describe():
            out = lm_eval.simple_evaluate(
                model=lm, tasks=tasks, task_manager=manager, limit=limit, num_fewshot=num_fewshot, log_samples=False,
                random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed, fewshot_random_seed=seed,
            )  # fmt: skip
    except (ConnectionError, OSError) as err:
        first = " ".join(str(err).split())[:160]
        raise ConfigError(
            f"--tasks {','.join(tasks)}: a dataset could not be loaded ({type(err).__name__}: {first}); tasks from the "
            f"Hugging Face Hub need a network (or a datasets cache holding them)"
        ) from None
    record = read_evals(path)  # again: another gptlab-eval may have added its tasks meanwhile
    for task, values in out["results"].items():
        record["tasks"][task] = {
            "metrics": _metrics(values),
            "step": step,
            "samples": int((out.get("n-samples") or {}).get(task, {}).get("effective", 0)) or None,
            "num_fewshot": (out.get("n-shot") or {}).get(task),
            "limit": limit,
            "version": (out.get("versions") or {}).get(task),
            "config_sha256": _config_sha((out.get("configs") or {}).get(task, {})),
            "lm_eval": lm_eval.__version__,
            "prefix_token_id": prefix_token_id(text.tokenizer),
        }
    write_json_atomic(path, record, indent=2)
    return record, list(out["results"])


def flat_metrics(record: dict, step: int | None = None) -> dict[str, float]:
    """{`eval/<task>/<metric>`: value} of an eval.json record (only tasks measured at `step`, when given)."""
    return {
        f"eval/{task}/{name}": value
        for task, entry in record.get("tasks", {}).items()
        if step is None or entry.get("step") == step
        for name, value in entry.get("metrics", {}).items()
        if value is not None
    }
