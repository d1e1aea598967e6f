"""gptlab-decode: measured decode speed and KV-cache memory of a config (random init) or of a trained run.

  gptlab-decode attention=gqa model.n_layer=4      a random-init model composed from gptlab-train's groups
  gptlab-decode run=<run dir>                      that run's newest checkpoint, built from its own config
  gptlab-decode -m attention=mha,gqa,mqa           one decode.json per choice; gptlab-compare shows them side by side

Keys (conf/decode.yaml): batch_sizes contexts new_tokens cache kv_quant repeats warmup seed out run. Writes
decode.json (strict JSON; the point keys are in gptlab/infer/decode.py) and prints a table. The model runs in
hardware.dtype (weights cast, caches in the same dtype; no autocast). A sweep file with `command: decode` runs it
through gptlab-sweep. A user mistake is one line on stderr and exit 2.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import cast

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from gptlab.cli import fail, hydra_raises
from gptlab.cli.decode_table import progress, table
from gptlab.cli.help import group_page, help_topic, key_rows
from gptlab.cli.train import explicit_run_dir, one_line
from gptlab.config import resolvers  # noqa: F401  (hydra.run.dir / sweep.dir resolvers, before Hydra resolves them)
from gptlab.config.command_line import check_command_line
from gptlab.errors import ConfigError
from gptlab.sinks.progress import console_log
from gptlab.state.layout import check_output, check_run_path
from gptlab.state.refused import remove_refused
from gptlab.util.io import strict_json
from gptlab.util.paths import CONF_DIR

# Groups and keys that shape the model: with run=<dir> the run's own config decides them, so giving one is a mistake.
MODEL_KEYS = ("model", "attention", "mlp", "norm", "position", "experiment", "scale")
OUT_NAME = "decode.json"


def show(value) -> str:
    """A config value as an override spells it: [1, 8], null, 'static'."""
    plain = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    return json.dumps(plain).replace('"', "'")


def _ints(cfg: DictConfig, key: str, low: int) -> tuple[int, ...]:
    """A list of integers >= low (a single integer counts as a list of one)."""
    value = cfg.get(key)
    values = list(cast(list, OmegaConf.to_container(value))) if OmegaConf.is_list(value) else [value]
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < low for v in values):
        raise ConfigError(f"{key}={show(value)}: allowed: one or a list of integers >= {low}, e.g. {key}=[1,8]")
    return tuple(values)


def _int(cfg: DictConfig, key: str, low: int, high: int | None = None) -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value >= high):
        span = f"in [{low}, {high})" if high is not None else f">= {low}"
        raise ConfigError(f"{key}={show(value)}: allowed: an integer {span}")
    return value


def grid_from(cfg: DictConfig):
    """The decode keys as a Grid, each checked (one-line ConfigError naming the key and what is allowed)."""
    from gptlab.infer.cache import QUANTS
    from gptlab.infer.decode import CACHES, Grid

    cache = cfg.get("cache")
    caches = list(cast(list, OmegaConf.to_container(cache))) if OmegaConf.is_list(cache) else [cache]
    bad = [c for c in caches if c not in CACHES]
    if bad or not caches or len(set(caches)) < len(caches):
        what = f"'{bad[0]}' is not a cache kind" if bad else "give each kind once, at least one"
        raise ConfigError(f"cache={show(cache)}: {what}; allowed: {', '.join(CACHES)} (e.g. cache=[static,none])")
    quant = cfg.get("kv_quant")
    if quant not in QUANTS:
        raise ConfigError(f"kv_quant={show(quant)}: allowed: null, int8")
    if quant is not None and "static" not in caches:
        raise ConfigError(f"kv_quant={quant}: quantises the static cache; add static to cache (here {show(cache)})")
    return Grid(
        batch_sizes=_ints(cfg, "batch_sizes", 1),
        contexts=_ints(cfg, "contexts", 1),
        new_tokens=_int(cfg, "new_tokens", 2),
        caches=tuple(caches),
        kv_quant=quant,
        repeats=_int(cfg, "repeats", 1),
        warmup=_int(cfg, "warmup", 0),
        seed=_int(cfg, "seed", 0, 2**63),
    )


def _check_run_overrides(run: str, overrides: list[str]) -> None:
    """run=<dir> takes the model from the run: an override of a model group or key would be silently ignored."""
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        if key.split(".", 1)[0].split("/", 1)[0] in MODEL_KEYS:
            raise ConfigError(
                f"{override}: with run={run} the model comes from the run's own config; drop it, or "
                f"leave run unset to decode a random-init model composed from the groups"
            )


# what gptlab-decode reads besides the model's groups: its own keys (conf/decode.yaml), the hardware, the names a
# sweep records, the launcher; train.*, optimizer, schedule, data, sample, logger, ... would be dropped unread
READS = ("hardware", "seed", "sweep", "name", "arm", "launcher", "sweep_run")


def check_read(cfg: DictConfig, overrides: list[str]) -> None:
    """Refuse a key no config declares, and an override of a key gptlab-decode never reads, in one line."""
    from gptlab.config.noop import unread_overrides
    from gptlab.config.schema import check_root_keys, root_keys

    check_root_keys(cfg)
    own = tuple(str(k) for k in cfg if k not in root_keys("train"))  # run, batch_sizes, contexts, ...
    unread = unread_overrides(overrides, (*MODEL_KEYS, *READS, *own))
    if unread:
        raise ConfigError(
            f"{unread[0]}: gptlab-decode does not read it (no training, data, optimizer, schedule, sampling or "
            f"logger: it measures decoding of the model the groups or run= give); drop it"
        )


def load_model(cfg: DictConfig, overrides: list[str]):
    """(model in eval mode, source record): the run's newest checkpoint, or a random init of the config's groups."""
    import torch

    run = cfg.get("run")
    if run is None:
        from gptlab.config.build import build_model
        from gptlab.config.validate import validate

        validate(cfg)
        torch.manual_seed(int(cfg.seed))
        # vocab: model.vocab_size; null = 50257 (GPT-2's BPE, as gptlab-flops costs it): no data is read
        return build_model(cfg).eval(), {"kind": "config", "run": None, "step": None}
    from gptlab.config.trained import load_trained

    _check_run_overrides(str(run), overrides)
    model, _, step = load_trained(Path(str(run)))
    return model.eval(), {"kind": "run", "run": str(Path(str(run)).resolve()), "step": step}


def model_record(model) -> dict:
    """The model's shape as built (per-layer K/V heads and windows: what the KV cache holds)."""
    from gptlab.model.fingerprint import model_fingerprint

    c = model.cfg
    return {
        "params": model.num_params(),
        "n_layer": c.n_layer,
        "n_head": c.n_head,
        "d_model": c.d_model,
        "block_size": c.block_size,
        "vocab_size": c.vocab_size,
        "dtype": str(next(model.parameters()).dtype),
        "n_kv_head": [b.attn.n_kv_head for b in model.blocks],
        "window": [b.attn.window for b in model.blocks],
        "fingerprint": model_fingerprint(model),
    }


def execute(cfg: DictConfig, choices: dict, overrides: list[str]) -> dict:
    """Measure the grid the config asks for; returns decode.json's document."""
    from gptlab.config.build import build_hardware, plain_config
    from gptlab.infer.decode import measure, peak_method
    from gptlab.runtime.cpu_load import LoadSampler
    from gptlab.runtime.threads import threads_for_job
    from gptlab.sinks.provenance import collect

    grid = grid_from(cfg)
    hardware = build_hardware(cfg)
    hardware.threads = hardware.threads or threads_for_job()
    hardware.apply()
    model, source = load_model(cfg, overrides)
    model = model.to(device=hardware.device, dtype=hardware.torch_dtype)
    load, start = LoadSampler(), time.perf_counter()
    load.start()
    points = measure(model, grid, on_point=lambda p: say(progress(p)))
    return strict_json(
        {
            "version": 1,
            "command": "gptlab-decode",
            "source": source,
            "model": model_record(model),
            "choices": choices,
            "overrides": overrides,
            "config": plain_config(cfg),
            "settings": asdict(grid),
            "hardware": {"device": hardware.device, "dtype": hardware.dtype, "threads": hardware.threads},
            "peak_mem_method": peak_method(next(model.parameters()).device),
            "outside_load": load.mean(),
            "wall_s": time.perf_counter() - start,
            "provenance": collect(overrides, hardware),
            "points": points,
        }
    )


def say(text: str) -> None:
    """Print a line for the user and copy it to the run's decode.log."""
    print(text, flush=True)
    console_log.info(text)


def _out_path(cfg: DictConfig, run_dir: Path, multirun: bool) -> Path:
    """Where decode.json goes: out (a file, or a directory to hold decode.json), else the Hydra run dir."""
    out = cfg.get("out")
    if out is None:
        return run_dir / OUT_NAME
    raw = cast(dict, OmegaConf.to_container(cfg, resolve=False)).get("out")
    if multirun and "${" not in str(raw):
        raise ConfigError(
            f"out={out}: under multirun every job would write this one file; leave out=null "
            f"(each job's own dir) or interpolate it, e.g. out=${{hydra:runtime.output_dir}}/decode.json"
        )
    path = Path(str(out))
    path = path / OUT_NAME if path.is_dir() else path
    own = [run_dir, *([Path(str(cfg.run))] if cfg.get("run") else [])]  # this decode's own dir, the run it reads
    return check_output(path, "out", own=own)  # resolved; never inside another run, never over a run's own files


@hydra.main(config_path=str(CONF_DIR), config_name="decode", version_base=None)
def decode_app(cfg: DictConfig) -> None:
    """Measure, write decode.json, print the table."""
    from gptlab.config.build import group_choices
    from gptlab.runtime.placement import place_local_job
    from gptlab.util.io import atomic_write_text

    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    if multirun and os.environ.get("SUBMITIT_EXECUTOR") == "local":  # launcher=local: own cores and GPUs
        place_local_job(hc.job.num, hc.launcher.get("cpus_per_task"), hc.launcher.get("gpus_per_node"))
    try:
        check_read(cfg, list(hc.overrides.task))
        path = _out_path(cfg, Path(hc.runtime.output_dir), multirun)
        doc = execute(cfg, group_choices(cfg), list(hc.overrides.task))
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(doc, indent=1, allow_nan=False) + "\n")
    except (ConfigError, OSError, OmegaConfBaseException) as err:
        if multirun:
            raise  # the launcher reports it and goes on with the other jobs
        remove_refused(Path(hc.runtime.output_dir), made={".hydra", "decode.log"})  # a refusal leaves no folder
        fail(one_line(err), 1 if isinstance(err, OSError) else 2)
    say(table(doc))
    say(f"wrote {path}")


def help_page() -> str:
    """`gptlab-decode --help`: usage and every key of conf/decode.yaml with its comment."""
    return "\n".join(
        [
            "gptlab-decode: measured decode speed and KV-cache memory of a config or a trained run.",
            "",
            "usage:",
            "  gptlab-decode [gptlab-train overrides] [KEY=VALUE ...]",
            "  gptlab-decode run=RUN_DIR [KEY=VALUE ...]   a trained run's newest checkpoint",
            "  gptlab-decode --help GROUP                 a config group's options (as gptlab-train --help GROUP)",
            "",
            "keys (conf/decode.yaml; point keys of decode.json: gptlab/infer/decode.py):",
            *key_rows(CONF_DIR / "decode.yaml"),
        ]
    )


def main() -> None:
    """The gptlab-decode command: --help [GROUP] is ours; Hydra's own errors (unknown key or choice, bad override) are
    one line too."""
    topic = help_topic(sys.argv[1:])
    if topic is not None:
        try:
            print(group_page(topic, root="decode.yaml") if topic else help_page(), flush=True)
        except ConfigError as err:
            fail(str(err))
        except BrokenPipeError:
            sys.stderr.close()
        return
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        return decode_app()
    try:
        check_command_line(sys.argv[1:])  # e.g. hydra/launcher=submitit_slurm, Hydra's spelling of launcher=slurm
        explicit = explicit_run_dir(sys.argv[1:])
        check_run_path(explicit) if explicit else None  # before Hydra writes .hydra/: never inside another run
        with hydra_raises():
            return decode_app()
    except KeyboardInterrupt:
        fail("interrupted (Ctrl-C)", 130)
    except (HydraException, ConfigError, OSError, OmegaConfBaseException) as err:
        fail(one_line(err), 1 if isinstance(err, OSError) and not isinstance(err, HydraException) else 2)


if __name__ == "__main__":
    main()
