"""`gptlab-speculative --target RUN --draft RUN`: speculative vs plain decoding of two trained runs,
timed back to back; acceptance, tokens per target forward, draft/target cost ratio and speed-up next to the analytic
expectations, written to speculative.json (the algorithm: gptlab/infer/speculative.py)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from gptlab.errors import ConfigError
from gptlab.infer import speculative
from gptlab.infer.speculative import expected_speedup, speculative_generate, static_caches
from gptlab.runtime.metrics import sync
from gptlab.util.io import atomic_write_text


@torch.no_grad()
def decode_ms_per_token(model, idx: torch.Tensor, n: int) -> float:
    """Plain greedy decoding of n tokens: milliseconds per single-token step (the n - 1 after the prefill)."""
    caches = static_caches(model, idx.size(0), idx.size(1) + n - 1)
    token = model(idx, caches=caches)[0][:, -1:].argmax(-1)  # prefill, (1, 1)
    sync(idx.device)
    start = time.perf_counter()
    for _ in range(n - 1):
        token = model(token, caches=caches)[0][:, -1:].argmax(-1)
    sync(idx.device)
    return (time.perf_counter() - start) * 1000 / max(n - 1, 1)


def same_tokenizer(ta, tb, target_dir, draft_dir) -> None:
    """Refuse two runs' tokenizers that differ (vocab size, or what any id decodes to)."""
    why = (
        f"vocab {ta.vocab_size} vs {tb.vocab_size}"
        if ta.vocab_size != tb.vocab_size
        else next(
            (
                f"id {i} decodes to {ta.decode([i])!r} vs {tb.decode([i])!r}"
                for i in range(ta.vocab_size)
                if ta.decode([i]) != tb.decode([i])
            ),
            None,
        )
    )
    if why:
        raise ConfigError(f"--target {target_dir} and --draft {draft_dir} do not share a tokenizer ({why})")


def timed(fn, device: torch.device):
    """(seconds, result) of one call of fn, the device's queued work waited for on both sides."""
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - start, out


def measure(target, draft, idx: torch.Tensor, args: argparse.Namespace) -> tuple[dict, torch.Tensor]:
    """Speculative vs plain decoding + draft/target cost, back to back per repeat (a busy machine loads all alike)."""
    n, k, temp, top_k, rows = args.tokens, args.k, args.temperature, args.top_k, []

    def spec():
        return speculative_generate(target, draft, idx, n, k, temp, top_k, torch.Generator().manual_seed(args.seed))

    def own():
        return target.generate(
            idx, n, temperature=temp, top_k=top_k, generator=torch.Generator().manual_seed(args.seed)
        )

    for i in range(args.repeats + 1):
        (s, (out, stats)), (p, plain) = timed(spec, idx.device), timed(own, idx.device)
        if i:  # the first repeat is a warm-up
            rows.append((s, p, decode_ms_per_token(target, idx, n), decode_ms_per_token(draft, idx, n)))
    spec_s, plain_s, t_ms, d_ms = (statistics.median(col) for col in zip(*rows))
    c = statistics.median(d / t for _, _, t, d in rows)
    return {
        **stats,
        "tokens": n,
        "prompt_tokens": idx.size(1),
        "temperature": temp,
        "top_k": top_k,
        "seed": args.seed,
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "speculative_s": spec_s,
        "target_s": plain_s,
        "speedup": statistics.median(p / s for s, p, _, _ in rows),
        "target_ms_per_token": t_ms,
        "draft_ms_per_token": d_ms,
        "cost_ratio": c,
        "expected_speedup": expected_speedup(stats["acceptance_rate"], stats["round_ks"], c),
        "matches_target_greedy": bool(torch.equal(out, plain)) if temp == 0 else None,
    }, out


def report(r: dict) -> str:
    return "\n".join(
        [
            f"# speculative decoding: k={r['k']}, {r['tokens']} tokens after a {r['prompt_tokens']}-token prompt, "
            f"temperature {r['temperature']}, {r['threads']} thread(s), median of {r['repeats']}",
            f"acceptance rate α          {r['acceptance_rate']:.3f}   ({r['accepted']} accepted / {r['accepted'] + r['rejected']} tested;"
            f" {r['proposed']} proposed)",
            f"tokens per target forward  {r['tokens_per_target_forward']:.2f}   expected from α: {r['expected_tokens_per_target_forward']:.2f}",
            f"cost ratio c (draft/target) {r['cost_ratio']:.3f}  ({r['draft_ms_per_token']:.2f} / {r['target_ms_per_token']:.2f} ms per token)",
            f"speed-up vs plain target   {r['speedup']:.2f}x   expected from α, k, c: {r['expected_speedup']:.2f}x"
            f"   ({r['speculative_s']:.3f} s vs {r['target_s']:.3f} s)"
            + (f"; same tokens as the target's greedy: {r['matches_target_greedy']}" if r["temperature"] == 0 else ""),
        ]
    )


def check_args(args: argparse.Namespace) -> None:
    """One-line ConfigError for a flag out of range, or an --out that is a folder, before any run is read."""
    from gptlab.config.schema import SCHEMA

    for flag, value, least in (("--tokens", args.tokens, 2), ("--repeats", args.repeats, 1), ("--k", args.k, 1)):
        if value < least:
            raise ConfigError(f"{flag}={value}: must be >= {least}")
    if args.threads is not None and args.threads < 1:
        raise ConfigError(f"--threads={args.threads}: must be >= 1 (or leave it out: torch's default)")
    for flag, key in (("--temperature", "sample.temperature"), ("--top-k", "sample.top_k"), ("--seed", "seed")):
        SCHEMA[key](flag, getattr(args, flag.lstrip("-").replace("-", "_")))  # the ranges gptlab-sample checks
    if args.out.is_dir():
        raise ConfigError(f"--out={args.out}: is a directory; allowed: a file path (default speculative.json)")


def main(argv: list[str] | None = None) -> int:
    from gptlab.cli import fail
    from gptlab.config.trained import load_trained
    from gptlab.state.layout import check_output

    parser = argparse.ArgumentParser(prog="gptlab-speculative", description=speculative.__doc__.splitlines()[0])
    parser.error = lambda message: fail(f"speculative: {message}")  # type: ignore[method-assign]  # one line, exit 2
    parser.add_argument("--target", type=Path, required=True, help="the target's run dir")
    parser.add_argument("--draft", type=Path, required=True, help="the draft's run dir (same tokenizer)")
    parser.add_argument("--k", type=int, default=4, help="tokens the draft proposes per round (>= 1)")
    parser.add_argument("--tokens", type=int, default=128, help="tokens to generate (>= 2)")
    parser.add_argument("--prompt", default=None, help="text to continue (default: the start of the val split)")
    parser.add_argument("--temperature", type=float, default=0.0, help=">= 0; 0 = greedy")
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats (medians)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--out", type=Path, default=Path("speculative.json"))
    args = parser.parse_args(argv)
    try:
        # never inside another run, never over the target's or draft's own files (summary.json, metrics.jsonl, ...)
        written = check_output(args.out, "--out", own=[args.target, args.draft])  # resolved: where the write goes
        check_args(args)
        torch.set_num_threads(args.threads or torch.get_num_threads())
        (target, data, t_step), (draft, d_data, d_step) = load_trained(args.target), load_trained(args.draft)
        same_tokenizer(data.tokenizer, d_data.tokenizer, args.target, args.draft)
        prompt = args.prompt if args.prompt is not None else getattr(data, "sample_prompt", lambda: "\n")()
        room = min(target.cfg.block_size, draft.cfg.block_size) + 1 - args.tokens  # prompt tokens that fit
        ids = data.tokenizer.encode(prompt)[-max(room, 1) :] or [0]
        idx = torch.tensor([ids], device=next(target.parameters()).device)
        result, out = measure(target, draft, idx, args)
    except ConfigError as err:
        fail(err)
    result = {
        "target": str(args.target),
        "draft": str(args.draft),
        "target_step": t_step,
        "draft_step": d_step,
        "target_n_layer": target.cfg.n_layer,
        "draft_n_layer": draft.cfg.n_layer,
        **result,
    }
    result = {key: None if isinstance(v, float) and v != v else v for key, v in result.items()}  # NaN -> null
    atomic_write_text(written, json.dumps(result, indent=2, allow_nan=False) + "\n")
    print(report(result))
    print(f"# wrote {args.out}; sample: {data.tokenizer.decode(out[0, idx.size(1) :].tolist())!r}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
