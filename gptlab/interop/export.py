"""A trained run as a Hugging Face model folder (GPT-2, or Llama for rope + rmsnorm + swiglu: interop/hf.py): `AutoModelForCausalLM.from_pretrained(DIR)` loads it (config.json,
model.safetensors, generation_config.json), its tokenizer beside it (tokenizer.json, tokenizer_config.json), and
gptlab_export.json records where it came from. The folder is read back and its logits checked against the run's model
before the export counts as done."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from gptlab.config.trained import load_trained
from gptlab.errors import ConfigError
from gptlab.interop import hf
from gptlab.interop.quiet import no_progress_bars
from gptlab.interop.tokenizer import to_hf_tokenizer
from gptlab.state.layout import check_output
from gptlab.util.io import temp_beside, write_json_atomic

RECORD = "gptlab_export.json"
TOLERANCE = 1e-4  # fp32 logits, the run's model vs the folder read back


def _check_out(out: Path, run_dir: Path) -> Path:
    """--out is new, empty, or an earlier HF export of this same run: never inside another run, a run dir or the
    user's own files; returns it resolved (symlinks, '..')."""
    if out.resolve() == run_dir.resolve():
        raise ConfigError(f"--out={out}: must not be the run dir itself; give a folder of its own")
    given, out = out, check_output(out, "--out", own=[run_dir], folder=True)
    if not out.is_dir() or not any(out.iterdir()):
        return out
    try:
        earlier = json.loads((out / RECORD).read_text()).get("run_dir")
    except (OSError, ValueError, AttributeError):
        earlier = None
    if earlier != str(run_dir.resolve()):
        names = sorted(p.name for p in out.iterdir())[:3]
        raise ConfigError(
            f"--out={given}: holds other files ({', '.join(names)}); allowed: a new or empty dir, or an earlier "
            f"--format hf export of {run_dir}"
        )
    return out


def _check_logits(model, folder: Path, vocab: int) -> float:
    """Max |logit difference| between `model` and the folder loaded by AutoModelForCausalLM; refused past TOLERANCE."""
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    T = min(32, model.cfg.block_size)
    idx = torch.randint(0, vocab, (2, T), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model.float()(idx)[0]
        theirs = loaded(idx).logits
    diff = float((ours - theirs).abs().max())
    if not diff <= TOLERANCE:
        raise ConfigError(f"{folder}: the exported model's logits differ from the run's by {diff:.3g} (> {TOLERANCE})")
    return diff


def export_hf(run_dir: Path, out: Path) -> dict:
    """Write run_dir's newest checkpoint to `out` as an HF GPT-2 folder; returns the record (also gptlab_export.json).

    Refused in one line, before anything is written, when the run's architecture is not one GPT-2 can express."""
    out = _check_out(Path(out), Path(run_dir))  # resolved: the check and the writes see the same folder
    model, text, step = load_trained(run_dir)
    tokenizer = text.tokenizer
    architecture = hf.hf_architecture(model)  # the refusal, before any file
    hf_tokenizer = to_hf_tokenizer(tokenizer)
    hf_model = hf.to_hf_model(model.float(), tokenizer.eot_id)
    tmp = temp_beside(out)
    shutil.rmtree(tmp, ignore_errors=True)
    with no_progress_bars():  # transformers' "Writing model shards" / "Loading weights"
        hf_model.save_pretrained(tmp)  # safetensors
        hf_tokenizer.save_pretrained(tmp)
        diff = _check_logits(model, tmp, model.cfg.vocab_size)
    record = {
        "run_dir": str(run_dir.resolve()),
        "step": step,
        "architecture": architecture,
        "tokenizer": tokenizer.identity(),
        "max_abs_logit_diff": diff,
        "notes": hf.export_notes(model),
    }
    write_json_atomic(tmp / RECORD, record, indent=2)
    if out.exists():
        shutil.rmtree(out)  # empty, or this run's earlier export (_check_out)
    os.replace(tmp, out)
    return record
