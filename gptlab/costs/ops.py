"""The forward pass as a list of ops with FLOPs and bytes moved (materialised vs fused attention)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gptlab.costs.accounting import Accounting
from gptlab.costs.scores import score_pairs
from gptlab.costs.structure import AttnShape, BlockShape, LinearShape, MLPShape, ModelShape, NormShape

SOFTMAX_FLOPS = 5  # per score: mask, max, subtract, exp, sum, divide (~5 once amortised)
MASK_FLOPS = 1  # per score, moved out of SOFTMAX_FLOPS when the mask is its own pass (mask_pass)
MASK_BYTES = 1  # per (query, key) pair: the boolean (Tq, Tk) mask, shared by the batch and the heads
RESIDUAL_FLOPS = 1  # per element of a residual add x + f(x)
ACT_FLOPS = 4  # per activation input element (GELU-tanh ~8, SiLU·up ~5, ReLU² 2): an average
ROTARY_FLOPS = 3  # per rotated element: x1·cos - x2·sin (2 mul + 1 add per output)
LOSS_FLOPS = 4  # per logit: max, exp, sum, log-softmax gather
OPTIMIZER_FLOPS = 10  # per parameter per step (Adam-like update)


# Module kinds a step's time is broken down into (shared with gptlab.train.profile.steps's measured breakdown).
GROUPS = ("embedding", "attention projections", "attention kernel", "mlp", "norms", "lm_head", "optimizer", "other")


def _grouped(ops: list[Op], group: str) -> list[Op]:
    for op in ops:
        op.group = group
    return ops


@dataclass
class Op:
    """One op of the forward pass, summed over the layers it appears in (`layers`)."""

    name: str
    kind: str  # "matmul" | "elementwise" | "memory"
    flops: float  # forward FLOPs the kernel executes
    flops_dense: float  # ... if every masked score were computed too (FlopCounterMode's view)
    flops_useful: float  # ... that change the result (causal- and window-aware)
    bytes_naive: float  # bytes moved with the score matrix materialised (unfused attention)
    bytes_fused: float  # bytes moved by a fused attention kernel (no Tq×Tk traffic)
    backward_factor: float = 2.0  # backward FLOPs / forward FLOPs (fused attention recomputes Q·Kᵀ: 3)
    layers: int = 1
    in_backward: bool = True  # has a backward pass (moving ~2x its forward bytes); the optimizer has none
    in_block: bool = False  # inside a transformer block (recomputed under activation checkpointing)
    group: str = "other"  # module kind for time breakdowns (see GROUPS)
    elementwise_class: str | None = None  # fusable element-wise class (accounting.ELEMENTWISE), else None

    def merge(self, other: Op) -> None:
        """Add another layer's instance of the same op."""
        for key in AMOUNTS:
            setattr(self, key, getattr(self, key) + getattr(other, key))
        self.layers += other.layers

    def repeat(self, times: int) -> Op:
        """This op over `times` identical layers (amounts multiplied, exact for integer-valued amounts)."""
        for key in AMOUNTS:
            setattr(self, key, getattr(self, key) * times)
        self.layers *= times
        return self


AMOUNTS = ("flops", "flops_dense", "flops_useful", "bytes_naive", "bytes_fused")  # what adds up over layers


def _same(name, kind, flops, nbytes, backward=2.0, cls=None) -> Op:
    return Op(name, kind, flops, flops, flops, nbytes, nbytes, backward, elementwise_class=cls)


def linear_op(lin: LinearShape, tokens: int, s: int) -> Op:
    """2·in·out FLOPs per token; reads weight (+bias) and input, writes output."""
    flops = 2.0 * tokens * lin.d_in * lin.d_out
    nbytes = s * (lin.d_in * lin.d_out + lin.bias * lin.d_out + tokens * (lin.d_in + lin.d_out))
    return _same(lin.name, "matmul", flops, nbytes)


def norm_op(name: str, norm: NormShape, rows: int, s: int) -> Op:
    """Elementwise over rows × dim: read and write every element once."""
    elems = rows * norm.dim
    return _same(
        name, "elementwise", elems * norm.flops_per_element, s * (2 * elems + norm.n_affine * norm.dim), cls="norm"
    )


@dataclass
class Shape:
    """The batch being costed: B sequences, tq new tokens each, attending over tk positions."""

    batch: int
    tq: int
    tk: int
    s: int  # bytes per activation element

    @property
    def tokens(self) -> int:
        return self.batch * self.tq


def attention_ops(a: AttnShape, x: Shape, rotates: bool, mask_pass: bool = False) -> list[Op]:
    """Projections, optional QK-norm/rotary, scores, (mask,) softmax (+bias), A·V; GQA reads fewer K/V bytes.

    A windowed layer attends over at most window + Tq keys: with a KV cache (decode) its ring holds the last `window`
    positions and the new ones are appended (gptlab.infer.cache.RingCache); at Tq = Tk (train, prefill) it is Tk.
    """
    B, s, n = x.batch, x.s, x.tokens
    hd, H, K = a.head_dim, a.n_head, a.n_kv_head
    tk = x.tk if a.window is None else min(x.tk, a.window + x.tq)
    pairs = score_pairs(x.tq, tk, a.window, a.traits)
    q_bytes, kv_bytes = s * n * H * hd, s * B * tk * K * hd  # (B, H, Tq, hd) and (B, Hkv, Tk, hd)
    tt_bytes = s * B * H * pairs.dense  # one pass over the (B, H, Tq, Tk) score matrix
    ops = _grouped([linear_op(lin, n, s) for lin in a.linears], "attention projections")
    kernel_start = len(ops)
    if a.qk_norm is not None:
        ops.append(norm_op("attn.qk_norm", a.qk_norm, n * (H + K), s))
    if rotates:
        elems = n * (H + K) * hd
        ops.append(_same("attn.rotary", "elementwise", ROTARY_FLOPS * elems, 2 * s * elems, cls="rotary"))

    def per_pair(name, kind, per, naive, fused, backward=2.0) -> Op:
        f = B * H * per
        return Op(name, kind, f * pairs.kernel, f * pairs.dense, f * pairs.useful, naive, fused, backward)

    ops.append(
        per_pair(
            "attn.scores",
            "matmul",
            2 * hd,
            q_bytes + kv_bytes + tt_bytes,
            q_bytes + kv_bytes,
            3.0 if a.traits.recomputes_scores else 2.0,
        )
    )
    if a.uses_score_bias:
        bias_bytes = s * H * pairs.dense  # the (H, Tq, Tk) bias, shared by the batch
        ops.append(per_pair("attn.score_bias", "elementwise", 1, bias_bytes + 2 * tt_bytes, bias_bytes))
    softmax_flops = SOFTMAX_FLOPS
    if mask_pass and pairs.useful < pairs.dense:  # a mask that hides nothing is never applied
        # read scores + the (Tq, Tk) mask, write scores; a fused kernel masks in registers (no bytes)
        ops.append(per_pair("attn.mask", "elementwise", MASK_FLOPS, 2 * tt_bytes + MASK_BYTES * x.tq * tk, 0.0))
        softmax_flops -= MASK_FLOPS
    ops.append(per_pair("attn.softmax", "elementwise", softmax_flops, 2 * tt_bytes, 0.0))
    ops.append(per_pair("attn.av", "matmul", 2 * hd, tt_bytes + kv_bytes + q_bytes, kv_bytes + q_bytes))
    _grouped(ops[kernel_start:], "attention kernel")
    return ops


def mlp_ops(m: MLPShape, x: Shape) -> list[Op]:
    """Every linear of the MLP (found generically) plus the activation on its hidden width."""
    n, s = x.tokens, x.s
    ops = [linear_op(lin, n, x.s) for lin in m.linears]
    ops.append(
        _same("mlp.act", "elementwise", ACT_FLOPS * n * m.act_inputs, s * n * (m.act_inputs + m.hidden), cls="act")
    )
    return _grouped(ops, "mlp")


@dataclass
class OpList:
    """Ops merged by name, in first-seen order."""

    ops: dict = field(default_factory=dict)

    def add(self, op: Op) -> None:
        if op.name in self.ops:
            self.ops[op.name].merge(op)
        else:
            self.ops[op.name] = op

    def extend(self, ops) -> None:
        for op in ops:
            self.add(op)


def residual_ops(d_model: int, tokens: int, s: int, adds: int = 2) -> list[Op]:
    """The block's residual adds x + f(x) (two; one in an attention-only block): read both, write the sum."""
    elems = tokens * d_model
    return [_same("residual", "elementwise", adds * RESIDUAL_FLOPS * elems, adds * 3 * s * elems, cls="residual")]


def _outside_in(m: ModelShape, x: Shape) -> list[Op]:
    """Token embedding gather and the learned position add, before the first block."""
    n, s, d = x.tokens, x.s, m.d_model
    embed = [_same("embedding", "memory", 0.0, 2 * s * n * d, backward=0.0)]  # gather rows, write (B, T, d)
    if m.position_adds:
        embed.append(_same("position", "elementwise", n * d, s * (2 * n * d + x.tq * d), cls="position"))
    return _grouped(embed, "embedding")


def _fuse(ops: list[Op], acc: Accounting) -> list[Op]:
    """Element-wise ops of a class fused into a neighbouring kernel keep their FLOPs and move no bytes."""
    for op in ops:
        if not acc.own_pass(op.elementwise_class):
            op.bytes_naive = op.bytes_fused = 0.0
    return ops


def block_ops(block: BlockShape, m: ModelShape, x: Shape, acc: Accounting = Accounting()) -> list[Op]:
    """The ops of one transformer block (norms, attention, MLP, residual adds when unfused), fusion applied."""
    ops = _grouped([norm_op("norm", norm, x.tokens, x.s) for norm in block.norms], "norms")
    has_mlp = bool(block.mlp.linears)  # mlp=none: an attention-only block, no MLP ops and one residual add
    ops += attention_ops(block.attn, x, m.position_rotates, acc.mask_pass) + (mlp_ops(block.mlp, x) if has_mlp else [])
    if acc.own_pass("residual"):
        ops += residual_ops(m.d_model, x.tokens, x.s, adds=2 if has_mlp else 1)
    for op in ops:
        op.in_block = True
    return _fuse(ops, acc)


def forward_ops(m: ModelShape, x: Shape, acc: Accounting = Accounting()) -> list[Op]:
    """All ops of one forward pass over x (embedding to LM head, or the blocks only), merged across layers."""
    n, s = x.tokens, x.s
    out = OpList()
    if not acc.blocks_only:
        out.extend(_outside_in(m, x))
    for block, count in m.layers():  # each distinct block shape once, times its layers
        out.extend(op.repeat(count) for op in block_ops(block, m, x, acc))
    if not acc.blocks_only:
        out.extend(_grouped([norm_op("norm_f", m.norm_f, n, s)], "norms"))
        out.extend(_grouped([linear_op(m.lm_head, n, s)], "lm_head"))
    return _fuse(list(out.ops.values()), acc)


def loss_op(m: ModelShape, tokens: int, s: int) -> Op:
    """Cross-entropy over the logits (computed in fp32: read logits, write an fp32 copy)."""
    logits = tokens * m.vocab_size
    return _same("loss", "elementwise", LOSS_FLOPS * logits, logits * (s + 4), backward=1.0)


def optimizer_op(n_params: int, param_bytes: int, state_bytes_per_param: float) -> Op:
    """One optimizer step: read param and grad, write param, read+write the state (no backward)."""
    nbytes = n_params * (3 * param_bytes + 2 * state_bytes_per_param)
    op = _same("optimizer", "elementwise", OPTIMIZER_FLOPS * n_params, nbytes, backward=0.0)
    op.in_backward, op.group = False, "optimizer"
    return op
