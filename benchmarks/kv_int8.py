"""The quality cost of the int8 KV cache against a bf16 cache (issue 18): bytes, val loss, argmax and greedy agreement.

    python -m benchmarks.kv_int8 [--steps 400] [--batch 16] [--sequences 64] [--prompts 16] [--out docs/]

1. Trains a small char-level model in-process (model=tiny: 4 layers, d_model 128, 4 heads, T 128, fp32, bundled
   Shakespeare) for --steps steps and loads its last checkpoint.
2. On the first --sequences validation sequences (data.val_samples), for each cache kind, runs the model token by
   token through the cache exactly as decoding does (prefill the first token, then one token per forward), so every
   key/value a prediction uses was read back from the cache:
     fp32       fp32 weights, fp32 cache (the reference)
     bf16       weights cast to bf16, bf16 cache (gptlab-decode's convention with hardware.dtype=bf16: weights cast,
                caches in the model's dtype, no autocast)
     int8       weights cast to bf16, int8 cache (per token and head absmax/127 scales in fp16, read back as bf16)
     int8_fp32  fp32 weights, int8 cache (the quantisation alone, without bf16 arithmetic)
   and reports per kind: the teacher-forced mean NLL over all predicted positions (mean, per-sequence std/min/max);
   next-token argmax agreement with bf16 and with fp32 (share of identical positions, per-sequence min/max);
   greedy continuation from --prompts prompts of 32 tokens by 64 tokens: the share of tokens identical before the
   first divergence and overall, vs bf16 and vs fp32 (mean, min/max over prompts).
3. Cache bytes (cache_nbytes) of make_caches at the same batch and max_len, int8 / bf16, against the exact ratio
   from the shapes: each (token, head) holds head_dim int8 + one fp16 scale vs head_dim bf16, (hd + 2) / (2 hd);
   also for an attention=sliding model of the same shape (RingCache of `window` positions; bytes only).
Also recorded: machine(), the other processes' share of the cores (CpuMeter) per phase, and the fp32 full-context
(no cache) loss on the same sequences as a check of the token-by-token path. Writes <out>/kv_int8.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.common import CpuMeter, machine
from gptlab.infer.cache import cache_nbytes, make_caches

KINDS = {
    "fp32": (torch.float32, None),
    "bf16": (torch.bfloat16, None),
    "int8": (torch.bfloat16, "int8"),
    "int8_fp32": (torch.float32, "int8"),
}  # name -> (model and cache dtype, cache quant)
TRAIN = [
    "model=tiny",
    "hardware.dtype=fp32",
    "logger=none",
    "sample.tokens=0",
    "hardware.peak_flops=1e12",
    "train.ckpt_interval=0",
    "train.eval_sequences=64",
    "schedule.warmup_steps=50",
]


def _spread(values: list[float]) -> dict:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else None,
        "min": min(values),
        "max": max(values),
    }


@torch.no_grad()
def teacher_forced(model, x: torch.Tensor, quant: str | None) -> torch.Tensor:
    """Logits (B, T, vocab) as fp32 for x (B, T): the first token as prefill, then one token per forward."""
    caches = make_caches(model, x.size(0), x.size(1), quant=quant)
    out = [model(x[:, t : t + 1], caches=caches)[0] for t in range(x.size(1))]
    return torch.cat(out, dim=1).float()


@torch.no_grad()
def greedy(model, prompt: torch.Tensor, new_tokens: int, quant: str | None) -> torch.Tensor:
    """Greedy continuation (B, new_tokens) of prompt (B, P): the prompt as one prefill, then one token per step."""
    caches = make_caches(model, prompt.size(0), prompt.size(1) + new_tokens, quant=quant)
    nxt = model(prompt, caches=caches)[0][:, -1].argmax(-1, keepdim=True)
    out = [nxt]
    for _ in range(new_tokens - 1):
        nxt = model(nxt, caches=caches)[0][:, -1].argmax(-1, keepdim=True)
        out.append(nxt)
    return torch.cat(out, dim=1)


def nll(logits: torch.Tensor, y: torch.Tensor) -> tuple[float, list[float]]:
    """(mean NLL over scored positions, per-sequence mean NLLs); y = -100 is unscored."""
    per = F.cross_entropy(logits.transpose(1, 2), y, ignore_index=-100, reduction="none")  # (B, T)
    mask = (y != -100).float()
    return float((per * mask).sum() / mask.sum()), (per * mask).sum(1).div(mask.sum(1).clamp(min=1)).tolist()


def agreement(a: torch.Tensor, b: torch.Tensor) -> dict:
    """Share of identical positions of two (B, T) token tensors: overall, and per-row min/max."""
    same = (a == b).float()
    rows = same.mean(1).tolist()
    return {"share": float(same.mean()), "min": min(rows), "max": max(rows)}


def greedy_agreement(a: torch.Tensor, b: torch.Tensor) -> dict:
    """Two greedy continuations (B, N): the share identical before the first divergence and overall."""
    same = a == b
    prefix = [(int(row.long().cumprod(0).sum()) / a.size(1)) for row in same]
    overall = same.float().mean(1).tolist()
    return {"before_divergence": _spread(prefix), "overall": _spread(overall)}


def expected_bytes(model, batch: int, max_len: int, quant: str | None, elem: int) -> int:
    """KV bytes from the shapes: per layer K and V, B x n_kv_head x positions (min(window, max_len)) x per-token
    bytes (head_dim x elem, or head_dim int8 + a 2-byte fp16 scale)."""
    total = 0
    for block in model.blocks:
        a = block.attn
        held = max_len if a.window is None else min(a.window, max_len)
        per = a.head_dim + 2 if quant == "int8" else a.head_dim * elem
        total += 2 * batch * a.n_kv_head * held * per
    return total


def cache_bytes(model, batch: int, max_len: int) -> dict:
    """Measured and expected bytes of bf16 and int8 caches for this model's shapes."""
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    measured = {q or "bf16": cache_nbytes(make_caches(bf16, batch, max_len, quant=q)) for q in (None, "int8")}
    expected = {q or "bf16": expected_bytes(bf16, batch, max_len, q, 2) for q in (None, "int8")}
    return {
        "batch": batch,
        "max_len": max_len,
        "cache_types": sorted({type(c).__name__ for c in make_caches(bf16, batch, max_len)}),
        "bf16_bytes": measured["bf16"],
        "int8_bytes": measured["int8"],
        "bf16_bytes_expected": expected["bf16"],
        "int8_bytes_expected": expected["int8"],
        "ratio": measured["int8"] / measured["bf16"],
        "ratio_expected": expected["int8"] / expected["bf16"],
    }


def measure(model, x: torch.Tensor, y: torch.Tensor, prompts: torch.Tensor, new_tokens: int = 64) -> dict:
    """The figures for one fp32 model: per cache kind NLL, argmax and greedy agreement; cache bytes."""
    model = model.eval()
    logits, tokens, kinds = {}, {}, {}
    for name, (dtype, quant) in KINDS.items():
        m = model if dtype == torch.float32 else copy.deepcopy(model).to(dtype)
        t0 = time.perf_counter()
        logits[name] = teacher_forced(m, x, quant)
        tokens[name] = greedy(m, prompts, new_tokens, quant)
        mean, per_seq = nll(logits[name], y)
        kinds[name] = {
            "dtype": str(dtype).removeprefix("torch."),
            "quant": quant,
            "nll": mean,
            "nll_per_sequence": _spread(per_seq),
            "wall_s": time.perf_counter() - t0,
        }
    argmax = {k: v.argmax(-1) for k, v in logits.items()}
    for name, fig in kinds.items():
        for ref in ("bf16", "fp32"):
            fig[f"argmax_vs_{ref}"] = agreement(argmax[name], argmax[ref])
            fig[f"greedy_vs_{ref}"] = greedy_agreement(tokens[name], tokens[ref])
        fig["nll_minus_bf16"] = fig["nll"] - kinds["bf16"]["nll"]
        fig["nll_minus_fp32"] = fig["nll"] - kinds["fp32"]["nll"]
        fig["max_abs_logit_diff_vs_fp32"] = float((logits[name] - logits["fp32"]).abs().max())
    with torch.no_grad():
        full = float(model(x, y)[1])
    return {
        "sequences": x.size(0),
        "seq_len": x.size(1),
        "prompts": prompts.size(0),
        "prompt_len": prompts.size(1),
        "new_tokens": new_tokens,
        "fp32_full_context_nll": full,
        "kinds": kinds,
        "greedy_example": {"prompt": prompts[0].tolist(), "fp32": tokens["fp32"][0].tolist()},
        "bytes": cache_bytes(model, x.size(0), x.size(1)),
    }


def sliding_bytes(batch: int, max_len: int, vocab: int) -> dict:
    """Cache bytes of an untrained attention=sliding model of the tiny shape (a RingCache per layer)."""
    from gptlab.config.build import build_model, compose

    cfg = compose(["model=tiny", "attention=sliding"])
    model = build_model(cfg, vocab_size=vocab, device="cpu")
    return {"window": model.blocks[0].attn.window, **cache_bytes(model, batch, max_len)}


def train(steps: int, batch: int, work: Path) -> tuple:
    """Train model=tiny in-process; (fp32 model from its last checkpoint, data, summary, overrides)."""
    from gptlab.config.build import build_data, build_model, compose, group_choices
    from gptlab.state.checkpoint import load
    from gptlab.train.run import execute

    args = [*TRAIN, f"train.max_steps={steps}", f"train.eval_interval={steps}", f"train.batch_size={batch}"]
    cfg = compose(args)
    summary = execute(cfg, work, group_choices(cfg), args)
    data = build_data(cfg, block_size=int(cfg.model.block_size))
    model = build_model(cfg, vocab_size=data.vocab_size, device="cpu")
    ckpt = max((work / "checkpoints").glob("step_*.pt"))
    model.load_state_dict(load(ckpt)["model"])
    return model.float().eval(), data, summary, args


def unigram_nll(data, count: int = 512) -> float:
    """Cross-entropy of the training set's unigram distribution on the validation targets (the 'no context' level)."""
    x, _ = data.train_samples(0, count)
    counts = torch.bincount(x.flatten(), minlength=data.vocab_size).double() + 1.0
    logp = (counts / counts.sum()).log()
    _, y = data.val_samples(64)
    y = y[y != -100]
    return float(-logp[y].mean())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=16, help="training batch size")
    ap.add_argument("--sequences", type=int, default=64, help="validation sequences for NLL and argmax agreement")
    ap.add_argument("--prompts", type=int, default=16, help="greedy prompts (32 tokens, 64 generated)")
    ap.add_argument("--out", type=Path, default=None, help="write kv_int8.json here")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gptlab-kvint8-") as tmp, CpuMeter() as train_load:
        model, data, summary, overrides = train(args.steps, args.batch, Path(tmp))
    x, y = data.val_samples(args.sequences + args.prompts)
    prompts = x[args.sequences :, :32]  # sequences not used for the NLL
    x, y = x[: args.sequences], y[: args.sequences]
    with CpuMeter() as meas_load:
        result = measure(model, x, y, prompts, new_tokens=64)
        result["sliding_bytes"] = sliding_bytes(args.sequences, x.size(1), data.vocab_size)
    doc = {
        "machine": machine(),
        "command": "python -m benchmarks.kv_int8 " + " ".join(argv or sys.argv[1:]),
        "train": {
            "overrides": overrides,
            "final_val_loss": summary["final_val_loss"],
            "steps": summary["steps"],
            "params": summary["params"],
            "vocab_size": data.vocab_size,
            "wall_s": summary["wall_s"],
            "unigram_val_nll": unigram_nll(data),
        },
        "outside_load": {"train": train_load.foreign, "measure": meas_load.foreign},
        "wall_s": time.perf_counter() - t0,
        **result,
    }
    ex = doc["greedy_example"]
    ex["text"] = [data.tokenizer.decode(ex["prompt"]), data.tokenizer.decode(ex["fp32"])]  # prompt, continuation
    print(report(doc))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "kv_int8.json").write_text(json.dumps(doc, indent=1) + "\n")
    return 0


def report(doc: dict) -> str:
    b = doc["bytes"]
    lines = [
        f"trained val loss {doc['train']['final_val_loss']:.4f} (unigram {doc['train']['unigram_val_nll']:.4f}); "
        f"fp32 full-context NLL {doc['fp32_full_context_nll']:.5f}",
        "kind | nll (±std) | argmax vs bf16 | vs fp32 | greedy vs bf16 before div / overall",
    ]
    for name, k in doc["kinds"].items():
        g = k["greedy_vs_bf16"]
        lines.append(
            f"{name} | {k['nll']:.5f} ±{k['nll_per_sequence']['std']:.4f} | {k['argmax_vs_bf16']['share']:.4f}"
            f" | {k['argmax_vs_fp32']['share']:.4f} | {g['before_divergence']['mean']:.3f} / "
            f"{g['overall']['mean']:.3f}"
        )
    lines.append(
        f"bytes bf16 {b['bf16_bytes']:,} int8 {b['int8_bytes']:,} ratio {b['ratio']:.5f} "
        f"(expected {b['ratio_expected']:.5f}); sliding ratio {doc['sliding_bytes']['ratio']:.5f}"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
