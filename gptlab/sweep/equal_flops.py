"""Equal compute by construction: one grid of cumulative training FLOPs that every arm of a sweep evaluates at.

The default path: a sweep whose arms differ in cost (training FLOPs per optimizer step: FLOPs per token x tokens per
step) plans the grid without being asked; arms of equal cost plan nothing (equal steps are equal FLOPs). Each arm is
costed before anything runs, exactly as gptlab-train will (the arm's composed config, the vocabulary of its data,
training FLOPs per token of the model on the meta device, batch_size x sequence length tokens per step); the grid
splits the smallest total any arm trains (train.max_steps x FLOPs per step: the budget every arm reaches) into N equal
points, N = the evals the cheapest arm makes (max_steps // eval_interval), or `equal_flops: N` / `--equal-flops N`.
Every run gets `train.eval_flops=[...]` with those points, so each arm evaluates a step either side of each one and
gptlab-compare reads val loss at equal FLOPs where it was measured, never interpolated across a coarse eval interval
toward the cheaper arm (docs/COMPARE.md, "equal compute"). `equal_flops: false` (`--equal-flops off`) opts out.

The grid a sweep dir's first launch planned is recorded in its sweep.yaml (`flops_grid`) and reused by every later
launch into it: an added arm gets that grid (its finished runs stay valid), and one whose budget falls short of the
grid's last point is refused with the fix, since a new grid would change the finished runs' evals.

The points are whole FLOPs, rounded down, so the last one never lies past the cheapest arm's end. A ladder is refused:
its rungs differ in size by design and are compared rung by rung, so one grid across them would put most points
beyond the small rungs' reach.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import yaml

from gptlab.errors import ConfigError

KEY = "train.eval_flops"
RECORD_KEY = "flops_grid"  # sweep.yaml: the grid every run of the sweep dir evaluates at (absent: none)
MAX_POINTS = 100  # evals a step either side of each point: 2 x this many evals at most
OFF = ("off", "false")
OPT_OUT = "equal_flops: false or --equal-flops off opts out"


@dataclass(frozen=True)
class ArmCost:
    """One arm as gptlab-train will cost it: FLOPs per optimizer step, the steps it trains and its eval interval."""

    arm: str
    flops_per_step: float
    max_steps: int
    eval_interval: int = 0  # train.eval_interval: the evals it makes are the default grid's points

    @property
    def total(self) -> float:
        return self.flops_per_step * self.max_steps


@dataclass(frozen=True)
class Recorded:
    """What a sweep dir's sweep.yaml says of the grid: the grid its runs evaluate at (None: none) and its arms."""

    grid: list[int] | None
    arms: list[str]


def parse_points(value) -> int:
    """--equal-flops N / equal_flops: N as an int in [1, MAX_POINTS]; one line naming the allowed values else."""
    try:
        points = int(str(value))
    except ValueError:
        points = 0
    if str(value).strip() != str(points) or not 1 <= points <= MAX_POINTS:
        raise ConfigError(
            f"--equal-flops {value!r}: allowed: off, or a whole number of shared FLOPs points from 1 to {MAX_POINTS}"
        )
    return points


def parse_mode(value) -> int | bool | None:
    """The file's equal_flops / --equal-flops: None when unset (the default), False for off / false, else N."""
    if value is None:
        return None
    if value is False or str(value).strip().lower() in OFF:
        return False
    return parse_points(value)


def arm_cost(arm: str, overrides: list[str]) -> ArmCost:
    """What one arm's runs will cost per step, from the config they compose (seed 0's: the seed changes no size)."""
    from gptlab.config.build import build_cost_model, compose
    from gptlab.costs.report import train_flops_per_token

    try:
        cfg = compose(overrides)
        vocab, seq_len = _vocab_and_length(cfg)
        model = build_cost_model(cfg, vocab)
    except Exception as err:  # noqa: BLE001 - Hydra's, the build's and the data's errors alike: one line
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"arm '{arm}' cannot be costed: {first}") from None
    per_token = float(train_flops_per_token(model, seq_len))
    train = cfg.train
    return ArmCost(arm, int(train.batch_size) * seq_len * per_token, int(train.max_steps), int(train.eval_interval))


def _vocab_and_length(cfg) -> tuple[int, int]:
    """The vocabulary and sequence length training costs at: a corpus tokenized by a fixed-vocabulary tokenizer
    (gpt2, byte) trains windows of model.block_size tokens over that vocabulary, known without reading or
    tokenizing the corpus on the launching machine; any other data is built, as the run builds it."""
    from hydra.utils import get_class

    from gptlab.config.build import build_data
    from gptlab.data.corpus_data import CorpusData
    from gptlab.data.tokenizers import ByteTokenizer, GPT2Tokenizer

    fixed = {t.name: t.vocab_size for t in (GPT2Tokenizer, ByteTokenizer)}
    block = int(cfg.model.block_size)
    tokenizer = cfg.data.get("tokenizer")
    if tokenizer in fixed and issubclass(get_class(str(cfg.data._target_)), CorpusData):
        return fixed[tokenizer], block
    data = build_data(cfg, block)
    return int(data.vocab_size), int(data.seq_len)


def grid(costs: list[ArmCost], points: int) -> list[int]:
    """N equally spaced cumulative-FLOPs points up to the smallest arm's total, whole FLOPs rounded down."""
    top = min(c.total for c in costs)
    return [int(top * k // points) for k in range(1, points + 1)]


def default_points(costs: list[ArmCost]) -> int:
    """As many points as the cheapest arm makes evals (max_steps // eval_interval), within [1, MAX_POINTS]."""
    cheapest = min(costs, key=lambda c: c.total)
    evals = cheapest.max_steps // cheapest.eval_interval if cheapest.eval_interval > 0 else 1
    return max(1, min(MAX_POINTS, evals))


def differ(costs: list[ArmCost]) -> bool:
    """True when the arms differ in cost per optimizer step (FLOPs per token or tokens per step)."""
    return len({c.flops_per_step for c in costs}) > 1


def override(values: list[int]) -> str:
    """The override every run of the sweep gets for this grid."""
    return f"{KEY}=[{','.join(str(v) for v in values)}]"


def recorded(record: dict) -> Recorded:
    """The grid a sweep.yaml records: its flops_grid, else (a dir planned by --equal-flops before flops_grid was
    kept) the planned train.eval_flops override among its shared overrides."""
    values = record.get(RECORD_KEY)
    if values is None and type(record.get("equal_flops")) is int:
        given = next((o for o in record.get("overrides") or [] if _key(o) == KEY), None)
        values = yaml.safe_load(given.split("=", 1)[1]) if given else None
    return Recorded([int(v) for v in values] if values else None, [str(a) for a in record.get("arms") or {}])


def _key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def plan(
    arms: dict[str, list[str]], points: int, cost: Callable[[str, list[str]], ArmCost] = arm_cost
) -> tuple[str, str]:
    """(the override every run gets, the note that says what was planned) for these arms' full overrides."""
    values, note = settle(arms, points, cost=cost)
    assert values is not None and note is not None  # N points asked: a grid or a refusal
    return override(values), note


def settle(
    arms: dict[str, list[str]],
    mode: int | bool | None,
    before: Recorded | None = None,
    cost: Callable[[str, list[str]], ArmCost] = arm_cost,
) -> tuple[list[int] | None, str | None]:
    """(the grid every run of these arms evaluates at, None for none; the note that says so) for `mode` (N points,
    False: opted out, None: the default, a grid when the arms differ in cost) and what the sweep dir recorded at its
    first launch (`before`, None for a new dir); ConfigError, one line, for what cannot share the grid."""
    own = next((a for a, given in arms.items() if any(_key(o) == KEY for o in given)), None)
    if own is not None and (mode or (before is not None and before.grid)):
        why = "--equal-flops:" if mode else "equal FLOPs: this sweep dir's runs share a grid, and"
        raise ConfigError(f"{why} arm '{own}' sets {KEY} itself; drop one of the two")
    if before is not None:
        return _again(arms, mode, before, cost)
    if mode is False:
        return None, "note: equal FLOPs: not planned (opted out): the equal-FLOPs reading is interpolated between evals"
    if own is not None:
        return None, f"note: equal FLOPs: not planned: arm '{own}' sets {KEY} itself"
    if mode is None and len(arms) < 2:
        return None, None
    costs = _costs(arms, mode, cost)
    if isinstance(costs, str):
        return None, costs
    if mode is None and not differ(costs):
        return None, (
            f"note: equal FLOPs: the arms cost the same per step ({costs[0].flops_per_step:.4g} FLOPs), so equal "
            "steps are equal FLOPs: no grid planned"
        )
    values = grid(costs, mode or default_points(costs))
    if values[0] < 1:
        raise ConfigError("--equal-flops: the cheapest arm trains too few FLOPs for a grid (train.max_steps is 0?)")
    return values, _planned(costs, values, mode is None)


def _costs(
    arms: dict[str, list[str]], mode: int | bool | None, cost: Callable[[str, list[str]], ArmCost]
) -> list[ArmCost] | str:
    """Every arm's cost; under the default an arm that cannot be costed plans no grid, and the note says why (the arm
    check names an arm that does not build); asked for N points, it is refused."""
    try:
        return [cost(arm, given) for arm, given in arms.items()]
    except ConfigError as err:
        if mode is not None:
            raise ConfigError(f"--equal-flops: {err}") from None
        return f"note: equal FLOPs: not planned: {err}"


def _planned(costs: list[ArmCost], values: list[int], default: bool) -> str:
    cheapest = min(costs, key=lambda c: c.total)
    per_step = ", ".join(f"{c.arm} {c.flops_per_step:.3g}" for c in costs)
    why = f" (the default: the arms differ in cost; {OPT_OUT})" if default else ""
    return (
        f"note: equal FLOPs{why}: every arm evaluated at {len(values)} shared points of cumulative training FLOPs up "
        f"to {values[-1]:.4g}, the budget of the cheapest arm ({cheapest.arm}, {cheapest.max_steps} steps); FLOPs "
        f"per step: {per_step}"
    )


def _again(
    arms: dict[str, list[str]], mode: int | bool | None, before: Recorded, cost: Callable[[str, list[str]], ArmCost]
) -> tuple[list[int] | None, str | None]:
    """A relaunch into a sweep dir: the grid its first launch recorded, for every arm it ran and every arm added."""
    new = {arm: given for arm, given in arms.items() if arm not in before.arms}
    if before.grid is None:
        if mode:
            raise ConfigError(
                f"--equal-flops {mode}: this sweep dir was launched without a shared FLOPs grid, and one would change "
                "its finished runs: launch into a new dir (--out DIR)"
            )
        return (None, None) if mode is False or not new else (None, _ungridded(arms, new, cost))
    if mode is False:
        raise ConfigError(
            "equal FLOPs off: this sweep dir's runs evaluate at the shared FLOPs grid its first launch planned; drop "
            "the opt-out (the grid is reused), or launch into a new dir (--out DIR)"
        )
    if mode and mode != len(before.grid):
        raise ConfigError(
            f"--equal-flops {mode}: this sweep dir's runs evaluate at the {len(before.grid)} shared FLOPs points its "
            "first launch planned; drop it (the grid is reused), or launch into a new dir (--out DIR)"
        )
    top = before.grid[-1]
    for c in sorted((_one(cost, arm, given) for arm, given in new.items()), key=lambda c: c.total):
        if c.total < top:
            raise ConfigError(
                f"equal FLOPs: arm '{c.arm}' trains {c.total:.4g} FLOPs ({c.max_steps} steps), short of the shared "
                f"FLOPs grid this sweep dir planned at its first launch (up to {top:.4g}), which its finished runs "
                f"evaluate at: give it train.max_steps={math.ceil(top / c.flops_per_step)} so its budget covers the "
                "grid, or launch it into a new dir (--out DIR)"
            )
    added = f"; added arm(s) {', '.join(new)} reach every point" if new else ""
    return before.grid, (
        f"note: equal FLOPs: every arm evaluated at the {len(before.grid)} shared points of cumulative training FLOPs "
        f"(up to {top:.4g}) this sweep dir planned at its first launch{added}"
    )


def _one(cost: Callable[[str, list[str]], ArmCost], arm: str, given: list[str]) -> ArmCost:
    try:
        return cost(arm, given)
    except ConfigError as err:
        raise ConfigError(f"equal FLOPs: {err}; an arm added to a sweep dir with a grid must reach it") from None


def _ungridded(
    arms: dict[str, list[str]], new: dict[str, list[str]], cost: Callable[[str, list[str]], ArmCost]
) -> str | None:
    """Arms added to a dir launched without a grid: refused when they alone make the costs differ (a grid now would
    change the finished runs); a note when the dir's own arms already differ (launched before grids were planned)."""
    costs = _costs(arms, None, cost)
    if isinstance(costs, str) or not differ(costs):
        return costs if isinstance(costs, str) else None
    old = [c for c in costs if c.arm not in new]
    if old and not differ(old):
        odd = next(c for c in costs if c.flops_per_step != old[0].flops_per_step)
        raise ConfigError(
            f"equal FLOPs: arm '{odd.arm}' costs {odd.flops_per_step:.4g} FLOPs per step, this sweep dir's arms "
            f"{old[0].flops_per_step:.4g}; the dir was launched without a shared FLOPs grid (its arms cost the same), "
            "and one now would change its finished runs: launch the sweep into a new dir (--out DIR), where every "
            "arm gets the grid, or opt out (equal_flops: false) to grow it here"
        )
    return "note: equal FLOPs: not planned: this sweep dir was launched without a shared FLOPs grid"
