"""Speculative decoding (Leviathan et al. 2023): a draft model proposes k tokens, the target verifies them at once.

A round: the draft decodes k tokens autoregressively through its own cache; the target runs ONE forward over the
last accepted token + the k proposals (k+1 positions) through its cache, accepts the longest prefix it agrees with
and adds one token of its own (the correction at the first rejection, or the bonus after k acceptances); both caches
then roll back to the accepted length. Greedy: output identical to `target.generate(temperature=0)`. Sampling:
rejection sampling (accept x with prob min(1, p(x)/q(x)), else draw from normalize(max(0, p - q))), which preserves
the target's distribution exactly. A batch keeps, per round, every row's output up to the batch's shortest accepted
prefix (a prefix of a target sample is a target sample, so this stays exact; it only lowers tokens per forward).

Caches: every layer gets a StaticCache here, sliding-window layers included (their window is applied by the
attention mask over absolute positions), because a RingCache cannot forget positions once it has wrapped; so memory
is max_len per layer, not the window. CLI (gptlab/cli/speculative.py):
gptlab-speculative --target RUN --draft RUN [--k 4]"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import cast

import torch
import torch.nn.functional as F

from gptlab.errors import ConfigError
from gptlab.infer.cache import StaticCache
from gptlab.runtime.metrics import sync


def expected_tokens_per_forward(alpha: float, k: int) -> float:
    """Leviathan et al. 2023: E[tokens per target forward] = (1 - α^(k+1)) / (1 - α); k + 1 at α = 1."""
    return float(k + 1) if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_speedup(alpha: float, round_ks: Sequence[int], cost_ratio: float) -> float:
    """Leviathan et al. 2023: (1 - α^(k+1)) / ((1 - α)(k·c + 1)), c = draft / target time per decode step, over the
    rounds as run: Σ E[tokens | k'] / Σ (k'·c + 1), since the last rounds propose fewer than k (k' = k every round
    gives the paper's formula)."""
    tokens = sum(expected_tokens_per_forward(alpha, k) for k in round_ks)
    return tokens / sum(k * cost_ratio + 1.0 for k in round_ks)


def rollback(caches: list, length: int) -> None:
    """Forget every position >= length: exact for a StaticCache (written in place, read as a prefix)."""
    for cache in caches:
        if not isinstance(cache, StaticCache):
            raise ConfigError(
                f"speculative decoding rolls back StaticCache only, not {type(cache).__name__} "
                "(a ring cannot forget positions once it wrapped)"
            )
        if not 0 <= length <= cache.length:
            raise ConfigError(f"cache rollback to {length}: must be in [0, {cache.length}] (its current length)")
        cache.length = length


def static_caches(model, batch: int, max_len: int) -> list[StaticCache]:
    """One StaticCache per block, sliding-window layers included (so rollback is always exact)."""
    param = next(model.parameters())
    return [
        StaticCache(batch, b.attn.n_kv_head, max_len, b.attn.head_dim, dtype=param.dtype, device=param.device)
        for b in model.blocks
    ]


def probs(logits: torch.Tensor, temperature: float, top_k: int | None) -> torch.Tensor:
    """(..., vocab) logits -> the distribution GPT.generate samples from (÷ temperature, top_k, softmax), fp32."""
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return F.softmax(logits, dim=-1)


@dataclass
class Sampler:
    """Drafting and verification for one temperature / top_k; temperature 0 = greedy (argmax, exact match)."""

    temperature: float
    top_k: int | None
    generator: torch.Generator | None

    def draw(self, logits: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Draft logits (B, vocab) -> (q (B, vocab), None when greedy; token (B, 1))."""
        if self.temperature == 0:
            return None, logits.argmax(dim=-1, keepdim=True)
        q = probs(logits, self.temperature, self.top_k)
        return q, torch.multinomial(q, 1, generator=self.generator)

    def verify(self, logits: torch.Tensor, proposal: torch.Tensor, q: torch.Tensor | None):
        """Target logits (B, k+1, vocab), proposal (B, k), draft q (B, k, vocab) -> (out (B, k+1), n (B,)): row b
        accepted its first n[b] drafts, out[b, :n[b]+1] = those + the target's own token (correction or bonus)."""
        B, k = proposal.shape
        if self.temperature == 0:  # accepted drafts equal the argmax, so out = the argmax up to n[b]
            best = logits.argmax(dim=-1)  # (B, k+1)
            return best, (best[:, :k] == proposal).int().cumprod(dim=1).sum(dim=1)
        p = probs(logits, self.temperature, self.top_k)  # (B, k+1, V)
        q = p[:, :0] if k == 0 else cast(torch.Tensor, q)  # (B, 0, V): nothing proposed; a sampled draft has q
        px = p[:, :k].gather(2, proposal[..., None])[..., 0]  # (B, k)
        qx = q.gather(2, proposal[..., None])[..., 0]  # (B, k), > 0: x was drawn from q
        u = torch.rand((B, k), generator=self.generator, device=p.device)
        n = (u * qx < px).int().cumprod(dim=1).sum(dim=1)  # accept x with prob min(1, p(x)/q(x))
        residual = (p[:, :k] - q).clamp(min=0)  # (B, k, V): where a rejected row draws from
        mass = residual.sum(dim=-1, keepdim=True)
        residual = torch.where(mass > 0, residual / mass.clamp(min=1e-30), p[:, :k])  # p == q: nothing to correct
        dist = torch.cat([residual, p[:, k:]], dim=1)[torch.arange(B, device=p.device), n]  # (B, V); n == k: bonus
        extra = torch.multinomial(dist, 1, generator=self.generator)  # (B, 1)
        return torch.cat([proposal, extra], dim=1).scatter(1, n[:, None], extra), n


@dataclass
class Stats:
    k: int
    rows: int = 1
    proposed: int = 0
    accepted: int = 0
    rejected: int = 0  # (row, round)s that ended in a rejection (the proposals after it are never tested)
    target_forwards: int = 0
    draft_forwards: int = 0
    new_tokens: int = 0  # per row
    wall_s: float = 0.0
    round_ks: list[int] = field(default_factory=list)  # each round's proposals: k, fewer near the end

    def summary(self) -> dict:
        """acceptance_rate = accepted / tested drafts (the formulas' α); accepted_fraction = accepted / proposed. With
        rows > 1 each row keeps the batch's shortest accepted prefix: fewer tokens per forward than the formula."""
        tested, nan = self.accepted + self.rejected, float("nan")
        alpha = self.accepted / tested if tested else nan
        return {
            **asdict(self),
            "acceptance_rate": alpha,
            "accepted_fraction": self.accepted / self.proposed if self.proposed else nan,
            "tokens_per_target_forward": self.new_tokens / self.target_forwards if self.target_forwards else nan,
            # the expectation over the rounds as run: the last rounds propose fewer than k (k' = 0: one token)
            "expected_tokens_per_target_forward": (
                sum(expected_tokens_per_forward(alpha, k) for k in self.round_ks) / len(self.round_ks)
                if tested and self.round_ks
                else nan
            ),
        }


def propose(draft, dcaches: list, seq: torch.Tensor, k: int, sampler: Sampler):
    """k draft tokens after seq (B, L) -> (proposal (B, k), q (B, k, V) or None); the draft cache ends at L + k - 1."""
    feed, qs, drafts = seq[:, dcaches[0].length :], [], []  # the draft first catches up on what it has not seen
    for _ in range(k):
        q, token = sampler.draw(draft(feed, caches=dcaches)[0][:, -1])  # (B, V) -> q, (B, 1)
        qs.append(q)
        drafts.append(token)
        feed = token
    proposal = torch.cat(drafts, dim=1) if drafts else seq.new_empty(seq.size(0), 0)
    return proposal, (torch.stack(cast(list[torch.Tensor], qs), dim=1) if k and qs[0] is not None else None)


def verify(target, tcaches: list, seq: torch.Tensor, proposal: torch.Tensor, q, sampler: Sampler):
    """ONE target forward over the tokens its cache lacks + the k proposals -> Sampler.verify's (out, n)."""
    k = proposal.size(1)
    logits = target(torch.cat([seq[:, tcaches[0].length :], proposal], dim=1), caches=tcaches)[0]
    return sampler.verify(logits[:, -(k + 1) :], proposal, q)  # predictions for positions L .. L+k


@torch.no_grad()
def speculative_round(
    target, draft, tcaches: list, dcaches: list, seq: torch.Tensor, k: int, sampler: Sampler, stats: Stats
) -> torch.Tensor:
    """seq (B, L), the caches holding at most seq[:, :L-1] -> seq (B, L + n + 1), caches rolled back to L + n."""
    L = seq.size(1)
    proposal, q = propose(draft, dcaches, seq, k, sampler)
    out, accepted = verify(target, tcaches, seq, proposal, q, sampler)
    # every row keeps the batch's shortest accepted prefix + 1: a prefix of a target sample is one (exact law)
    n = int(accepted.min())
    stats.draft_forwards, stats.target_forwards = stats.draft_forwards + k, stats.target_forwards + 1
    stats.round_ks.append(k)
    stats.proposed, stats.accepted = stats.proposed + k * seq.size(0), stats.accepted + int(accepted.sum())
    stats.rejected, stats.new_tokens = stats.rejected + int((accepted < k).sum()), stats.new_tokens + n + 1
    rollback(tcaches, L + n)  # held: seq[:L] + n accepted drafts; the round's last token is fed next round
    rollback(dcaches, min(L + n, dcaches[0].length))
    return torch.cat([seq, out[:, : n + 1]], dim=1)


def check_inputs(target, draft, idx: torch.Tensor, max_new_tokens: int, k: int, temperature: float, top_k) -> None:
    """One-line ConfigErrors for what speculative decoding here cannot do."""
    if idx.dim() != 2 or idx.size(1) < 1:
        raise ConfigError(f"speculative decoding takes prompts idx of shape (B, T >= 1), got {tuple(idx.shape)}")
    if k < 1 or max_new_tokens < 0:
        raise ConfigError(f"speculative decoding: k={k} must be >= 1 and max_new_tokens={max_new_tokens} >= 0")
    if temperature < 0 or (top_k is not None and top_k < 1):
        raise ConfigError(
            f"speculative decoding: temperature={temperature} must be >= 0 (0 = greedy), top_k={top_k} >= 1 or None"
        )
    if target.cfg.vocab_size != draft.cfg.vocab_size:
        raise ConfigError(
            f"target vocab_size={target.cfg.vocab_size} != draft vocab_size={draft.cfg.vocab_size}: "
            "the draft must share the target's tokenizer"
        )
    need = idx.size(1) + max_new_tokens - 1  # positions fed through the caches
    for name, model in (("target", target), ("draft", draft)):
        if need > model.cfg.block_size:
            raise ConfigError(
                f"speculative decoding: a {idx.size(1)}-token prompt + {max_new_tokens} new tokens needs "
                f"{need} positions > the {name}'s model.block_size={model.cfg.block_size}"
            )


@torch.no_grad()
def speculative_generate(
    target,
    draft,
    idx: torch.Tensor,
    max_new_tokens: int,
    k: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict]:
    """idx (B, T) -> (tokens (B, T + max_new_tokens), stats): target.generate's law (its very tokens when greedy)."""
    check_inputs(target, draft, idx, max_new_tokens, k, temperature, top_k)
    sync(idx.device)  # on CUDA the clock must not start (or stop) with work still queued
    start, end, B = time.perf_counter(), idx.size(1) + max_new_tokens, idx.size(0)
    tcaches, dcaches = static_caches(target, B, end - 1), static_caches(draft, B, end - 1)
    sampler, stats, seq = Sampler(temperature, top_k, generator), Stats(k=k, rows=B), idx
    while seq.size(1) < end:  # the last round proposes fewer so that nothing past max_new_tokens is computed
        seq = speculative_round(target, draft, tcaches, dcaches, seq, min(k, end - seq.size(1) - 1), sampler, stats)
    sync(idx.device)
    stats.wall_s = time.perf_counter() - start
    return seq, stats.summary()
