"""gptlab-flops: params, FLOPs, bytes, intensity, KV cache, memory and roofline for any training config.

Takes the same overrides as gptlab-train plus `mode=train|prefill|decode batch_size=B seq_len=N
format=table|json dtype=fp32|bf16|fp16|fp8`, the accounting switches `mask_pass elementwise blocks_only` and
per-rank memory over N ranks `strategy=ddp|fsdp world_size=N gpu=NAME` (conf/flops.yaml, docs/COSTS.md).
Touches no data and writes no files: the model is built on the meta device, one block per distinct layer kind,
and vocab_size comes from model.vocab_size, or 50257 (GPT-2's) when null, said in one note on stderr.
`gptlab-flops RUN_DIR` costs a run as it trained: its saved config, its tokenizer's vocabulary, its sequence length.
This module parses, prints and picks the exit code; the report is gptlab/config/costing.py's.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from gptlab.cli import fail, hydra_raises
from gptlab.cli.flops_table import render_table
from gptlab.cli.help import group_page, help_topic, key_rows
from gptlab.config.costing import DEFAULT_VOCAB, flops_report, run_dir_config
from gptlab.errors import ConfigError
from gptlab.util.paths import CONF_DIR

# what a cost reads of a training config: the model's groups and keys, the hardware, the optimizer's choice (its state
# bytes), the batch (its activations), and conf/flops.yaml's own keys; any other key changes no figure
READS = (
    "model", "attention", "mlp", "norm", "position", "experiment", "scale", "hardware", "train.batch_size",
    "data.doc_mask",
)  # fmt: skip
READS_CHOICE = ("optimizer",)


def unread_warning(cfg: DictConfig, overrides: list[str]) -> str | None:
    """One line naming the overrides no figure of the report depends on (None when every one counts)."""
    from gptlab.config.noop import unread_overrides  # here, not at the top: it imports torch, which --help needs not
    from gptlab.config.schema import root_keys

    own = tuple(str(k) for k in cfg if k not in root_keys("train"))  # mode, batch_size, seq_len, gpu, ...
    unread = unread_overrides(overrides, (*READS, "train.grad_accum", *own), READS_CHOICE)
    if not unread:
        return None
    return (
        f"warning: gptlab-flops reads no {', '.join(o.split('=', 1)[0].lstrip('+~') for o in unread)}: "
        "they change no cost figure (gptlab-flops costs the model, optimizer choice, batch and hardware)"
    )


def _emit(report, fmt: str) -> None:
    try:
        if fmt == "json":
            print(json.dumps(report.to_dict()), flush=True)
        else:
            render_table(report.to_dict())
    except BrokenPipeError:  # e.g. piped into `head`
        sys.stderr.close()


def run_dir_main(run_dir: Path, keys: list[str]) -> int:
    """Cost a run dir as it trained; a one-line error for a folder that is not a run or a key that is not ours."""
    try:
        cfg, vocab, seq = run_dir_config(run_dir, keys)  # the run's config was checked when it trained
        report = flops_report(cfg, vocab, seq)
    except ConfigError as err:
        fail(err)
    if str(cfg.format) != "json":
        print(
            f"costing {run_dir} as it trained: its .hydra/config.yaml, vocabulary {vocab:,} (its tokenizer), "
            f"sequence length {report.seq_len}",
            file=sys.stderr,
        )
    _emit(report, str(cfg.format))
    return 0


def vocab_note(cfg: DictConfig) -> str | None:
    """One line saying which vocabulary a config without model.vocab_size was costed at (it changes the params)."""
    if OmegaConf.select(cfg, "model.vocab_size") is not None:
        return None
    return (
        f"note: costed at GPT-2's {DEFAULT_VOCAB:,}-token vocabulary (model.vocab_size=null); give "
        "model.vocab_size=<N> for another, or gptlab-flops RUN_DIR to cost a run as it trained"
    )


@hydra.main(config_path=str(CONF_DIR), config_name="flops", version_base=None)
def flops_app(cfg: DictConfig) -> None:
    """Print the cost report for the composed config (table or one JSON object)."""
    from hydra.core.hydra_config import HydraConfig

    from gptlab.config.schema import check_schema  # imports torch: not at the top, so --help answers without it

    try:
        check_schema(cfg)  # a key no config declares (+foo=1), a value out of range: one line, as gptlab-train
        report = flops_report(cfg)
    except ConfigError as err:
        fail(err)
    unread = unread_warning(cfg, list(HydraConfig.get().overrides.task))
    for line in (unread, vocab_note(cfg)):
        if line:
            print(line, file=sys.stderr)
    _emit(report, str(cfg.format))


def help_page() -> str:
    """`gptlab-flops --help`: usage and every key of conf/flops.yaml with its comment."""
    rows = key_rows(CONF_DIR / "flops.yaml")
    return "\n".join(
        [
            "gptlab-flops: params, FLOPs, bytes, arithmetic intensity, KV cache, memory and roofline of a config.",
            "",
            "usage:",
            "  gptlab-flops [gptlab-train overrides] [KEY=VALUE ...]",
            "  gptlab-flops RUN_DIR [KEY=VALUE ...]   a run as it trained (its config and vocabulary); keys below only",
            "  gptlab-flops --help GROUP        a config group's options (as gptlab-train --help GROUP)",
            "  gptlab-flops --help train        the run keys (any section of conf/train.yaml)",
            "",
            "keys (conf/flops.yaml; formulas in docs/COSTS.md):",
            *rows,
            "",
            "textbook accounting (materialised scores, mask pass, unfused element-wise, blocks only):",
            "  gptlab-flops model=gpt2-xl attention.impl=naive mask_pass=true elementwise=unfused blocks_only=true",
        ]
    )


def main():
    """The gptlab-flops command: --help [GROUP] is ours, the rest is Hydra's (its errors one line too)."""
    topic = help_topic(sys.argv[1:])
    first = sys.argv[1] if len(sys.argv) > 1 else ""
    if topic is None and first and "=" not in first and not first.startswith("-"):
        if not Path(first).is_dir():
            fail(f"{first}: not a folder; allowed: a run dir (gptlab-flops RUN_DIR) or KEY=VALUE overrides")
        return run_dir_main(Path(first), sys.argv[2:])
    if topic is None and os.environ.get("HYDRA_FULL_ERROR") == "1":
        return flops_app()
    if topic is None:
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

        from gptlab.cli.train import one_line

        try:
            with hydra_raises():
                return flops_app()
        except (HydraException, OmegaConfBaseException, ConfigError) as err:
            fail(one_line(err))
    try:
        print(group_page(topic, root="flops.yaml") if topic else help_page(), flush=True)
    except ConfigError as err:
        fail(err)
    except BrokenPipeError:
        sys.stderr.close()


if __name__ == "__main__":
    sys.exit(main())
