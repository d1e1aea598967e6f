"""Accounting conventions of the cost model (mask pass, element-wise fusion, blocks only) and intensity per op class.

The defaults are gptlab's own convention, the one training's MFU and the profiler's predicted shares use:
the mask folded into the scores pass, norms/activation/rotary/position add each one read+write pass, residual
adds fused away, embeddings and the LM head counted. docs/COSTS.md gives the formula each switch changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from gptlab.errors import ConfigError

# Element-wise op classes outside the attention kernel (softmax, mask and score bias follow the attention path).
ELEMENTWISE = ("norm", "act", "rotary", "position", "residual")
DEFAULT_UNFUSED = ("norm", "act", "rotary", "position")
SHORTHANDS = {"fused": (), "unfused": ELEMENTWISE}
# Op classes of the forward pass the intensity figures are grouped by, in display order.
OP_CLASSES = ("matmul", "attention", "softmax", "norm", "elementwise", "embedding")


@dataclass(frozen=True)
class Accounting:
    """Which conventions the cost model counts with; `Accounting()` is the default (MFU's)."""

    mask_pass: bool = False  # the mask is its own pass over materialised scores
    unfused: tuple[str, ...] = DEFAULT_UNFUSED  # element-wise classes that pay their own read+write pass
    blocks_only: bool = False  # count the transformer blocks only

    def __post_init__(self):
        bad = [c for c in self.unfused if c not in ELEMENTWISE]
        if bad:
            raise ConfigError(
                f"elementwise: unknown class {bad[0]!r}; allowed: fused, unfused, or a list of {', '.join(ELEMENTWISE)}"
            )

    def own_pass(self, elementwise_class: str | None) -> bool:
        """True when an op of this class moves its own bytes (None: not a fusable element-wise op)."""
        return elementwise_class is None or elementwise_class in self.unfused


def elementwise_classes(value) -> tuple[str, ...]:
    """`fused` | `unfused` | a list of classes -> the classes that are their own pass (one-line error otherwise)."""
    if isinstance(value, str) and value in SHORTHANDS:
        return SHORTHANDS[value]
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(c, str) and c in ELEMENTWISE for c in items):
        raise ConfigError(
            f"elementwise={value!r}: not allowed; allowed: fused, unfused, "
            f"or a list of {', '.join(ELEMENTWISE)} (e.g. [norm,act])"
        )
    return tuple(c for c in ELEMENTWISE if c in items)


def _flag(key: str, value) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key}={value!r}: not allowed; allowed: true, false")
    return value


def from_options(mask_pass=False, elementwise=DEFAULT_UNFUSED, blocks_only=False) -> Accounting:
    """The Accounting of gptlab-flops' keys (plain values), checked with one-line errors."""
    return Accounting(
        mask_pass=_flag("mask_pass", mask_pass),
        unfused=elementwise_classes(elementwise),
        blocks_only=_flag("blocks_only", blocks_only),
    )


def op_class(op) -> str:
    """The class an op's intensity is reported under (see OP_CLASSES)."""
    if op.name in ("attn.scores", "attn.av"):
        return "attention"
    if op.name in ("attn.softmax", "attn.mask", "attn.score_bias"):
        return "softmax"
    if op.elementwise_class == "norm":
        return "norm"
    return {"matmul": "matmul", "memory": "embedding"}.get(op.kind, "elementwise")


def _bound(flops: float, nbytes: float, ridge: float) -> str:
    return "compute" if nbytes == 0 or flops / nbytes >= ridge else "memory"


def intensity(ops, fused: bool, ridge: float) -> dict:
    """Kernel FLOPs / bytes of the forward (loss and optimizer aside), whole and per op class, with verdicts."""

    def nbytes(op):
        return op.bytes_fused if fused else op.bytes_naive

    forward = [op for op in ops if op.name not in ("loss", "optimizer")]
    flops, total = sum(op.flops for op in forward), sum(nbytes(op) for op in forward)
    classes = {}
    for name in OP_CLASSES:
        members = [op for op in forward if op_class(op) == name]
        if members:
            f, b = sum(op.flops for op in members), sum(nbytes(op) for op in members)
            classes[name] = {"flops": f, "bytes": b, "intensity": f / b if b else None, "bound": _bound(f, b, ridge)}
    return {
        "forward": flops / total if total else None,
        "forward_flops": flops,
        "forward_bytes": total,
        "forward_bound": _bound(flops, total, ridge),
        "classes": classes,
    }
