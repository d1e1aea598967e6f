"""gptlab-export RUN_DIR [--out DIR] [--checkpoint PATH]: one run's checkpoint as a single file.

For hardware=fsdp runs, whose checkpoints are sharded DCP dirs: the newest checkpoint (or PATH) is read into one
process (DCP gathers every rank's shards, whatever the world size) and written as a single-file checkpoint,
`DIR/checkpoints/step_N.pt` (model and optimizer tensors whole, the same step, progress, RNGs and identity), with
the run's `.hydra/config.yaml` and `tokenizer.json` beside it. DIR (default RUN_DIR/export) is then a run dir that
`gptlab-sample DIR` reads, and `train.init_from=DIR/checkpoints/step_N.pt` starts a single-device run from it. A single-file checkpoint
is exported the same way (a copy).

`--format hf` writes the newest checkpoint as a Hugging Face model folder instead (default DIR: RUN_DIR/hf): GPT-2,
or Llama for rope + rmsnorm + swiglu runs; safetensors weights, config.json, the run's tokenizer as tokenizer.json,
and gptlab_export.json; the folder is read back with AutoModelForCausalLM and its logits checked. An architecture
neither can express is refused in one line (gptlab/interop/hf.py and llama.py list what maps). Needs gptlab[hf].
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from gptlab.cli import fail
from gptlab.config import build
from gptlab.config.trained import trained_text
from gptlab.errors import ConfigError
from gptlab.state import checkpoint, resume
from gptlab.state.layout import TOKENIZER_FILE, check_output
from gptlab.state.rundir import run_config
from gptlab.util.extras import require


def export(run_dir: Path, out: Path, source: Path | None = None) -> Path:
    """Write `source` (default: the run's newest readable checkpoint) as out/checkpoints/step_N.pt; returns it."""
    if Path(out).resolve() == Path(run_dir).resolve():
        raise ConfigError(f"--out={out}: must not be the run dir itself (its checkpoints/ holds the sharded ones)")
    cfg = run_config(run_dir)
    out = _check_out(Path(out), Path(run_dir))  # resolved: the check and the writes see the same folder
    if source is not None and not (Path(source).is_file() or (Path(source) / ".metadata").is_file()):
        raise ConfigError(f"--checkpoint={source}: not a checkpoint file or .dcp dir; allowed: one of {run_dir}'s")
    state = (
        checkpoint.load(source, "--checkpoint") if source is not None else checkpoint.load_latest(run_dir, resume=False)
    )
    if state is None:
        raise ConfigError(f"{run_dir}: no readable checkpoint in {checkpoint.ckpt_dir(run_dir)}")
    text = trained_text(run_dir, cfg, state)  # the tokenizer the run saved (an older run: its data, unchanged)
    model = build.build_model(cfg, vocab_size=text.vocab_size, device="cpu")
    optimizer = build.build_optimizer(cfg, model)
    try:
        resume.load_weights(model, optimizer, state)
    except (KeyError, RuntimeError, ValueError) as err:
        raise ConfigError(f"{run_dir}: checkpoint does not fit the run's config ({resume.misfit(err)})") from None
    whole = {k: v for k, v in state.items() if k != "dcp"} | {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
    }
    (out / ".hydra").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(run_dir / ".hydra" / "config.yaml", out / ".hydra" / "config.yaml")
    if (run_dir / TOKENIZER_FILE).is_file():  # the export samples with the run's own tokenizer
        shutil.copyfile(run_dir / TOKENIZER_FILE, out / TOKENIZER_FILE)
    return checkpoint.save(out, int(state["step"]), whole)


def _check_out(out: Path, run_dir: Path) -> Path:
    """--out is new, empty, or an earlier export of this same run (same saved config): never inside another run's
    dir, a folder of the user's own files, or a run's own files; returns it resolved."""
    given, out = out, check_output(out, "--out", own=[run_dir], folder=True)
    if not out.is_dir() or not any(out.iterdir()):
        return out
    names = {p.name for p in out.iterdir()}
    saved = out / ".hydra" / "config.yaml"
    same = names <= {".hydra", "checkpoints", TOKENIZER_FILE} and saved.is_file()
    if not (same and saved.read_bytes() == (run_dir / ".hydra" / "config.yaml").read_bytes()):
        raise ConfigError(
            f"--out={given}: holds other files ({', '.join(sorted(names)[:3])}); allowed: a new or empty dir, or an "
            f"earlier export of {run_dir}"
        )
    return out


def _export_hf(args) -> int:
    """--format hf: the run's newest checkpoint as a folder AutoModelForCausalLM.from_pretrained loads (GPT-2 or Llama)."""
    if args.checkpoint is not None:
        raise ConfigError("--checkpoint: --format hf exports the run's newest checkpoint; drop --checkpoint")
    require("transformers", "hf", "gptlab-export --format hf")
    from gptlab.interop.export import export_hf

    out = args.out or args.run_dir / "hf"
    record = export_hf(args.run_dir, out)
    for note in record["notes"]:
        print(f"note: {note}")
    print(f"{out} (step {record['step']}, max |logit difference| read back {record['max_abs_logit_diff']:.2g})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gptlab-export", description=__doc__.splitlines()[0])
    parser.error = lambda message: fail(f"gptlab export: {message}")  # type: ignore[method-assign]  # one line, exit 2, no usage block
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="output run dir (default: RUN_DIR/export)")
    parser.add_argument("--checkpoint", type=Path, default=None, help="a checkpoint of RUN_DIR (default: the newest)")
    parser.add_argument(
        "--format",
        choices=("checkpoint", "hf"),
        default="checkpoint",
        help="checkpoint: a single-file gptlab checkpoint (default); hf: a Hugging Face GPT-2 folder (gptlab[hf])",
    )
    args = parser.parse_args(argv)
    try:
        if args.format == "hf":
            return _export_hf(args)
        path = export(args.run_dir, args.out or args.run_dir / "export", args.checkpoint)
    except ConfigError as err:
        fail(err)
    except OSError as err:
        fail(f"I/O error '{err.filename}': {err.strerror or err}", code=1)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
