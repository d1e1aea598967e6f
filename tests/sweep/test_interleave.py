"""Runs are launched interleaved across arms: seed-major, the arms shuffled per seed from the sweep's name, so neither
time nor a load that changes during the sweep can stand in for an arm (the local queue and the SLURM array both take
the plan's order)."""

from __future__ import annotations

from collections import Counter

from gptlab.sweep.plan import PlannedRun, interleave, pending

ARMS = {"mha": ["attention=mha"], "gqa": ["attention=gqa"], "mqa": ["attention=mqa"], "mlp3": ["mlp.ratio=3"]}


def _plan(tmp_path, name="attention", seeds=(0, 1, 2, 3)) -> list[PlannedRun]:
    spec = {"arms": ARMS, "overrides": []}
    return pending(name, spec, list(seeds), tmp_path / "sweep", []).runs


def test_the_plan_is_seed_major_with_every_arm_once_per_block(tmp_path):
    runs = _plan(tmp_path)
    assert [r.seed for r in runs] == [s for s in (0, 1, 2, 3) for _ in ARMS]  # seed-major
    for k in range(4):
        assert sorted(r.arm for r in runs[4 * k : 4 * k + 4]) == sorted(ARMS)  # every arm once in each seed's block
    orders = {tuple(r.arm for r in runs[4 * k : 4 * k + 4]) for k in range(4)}
    assert len(orders) > 1  # shuffled per seed, not one fixed arm order
    first = Counter(runs[4 * k].arm for k in range(4))
    assert first.most_common(1)[0][1] < 4  # no arm always runs first


def test_the_order_is_deterministic_and_salted_by_the_sweep(tmp_path):
    a, b = _plan(tmp_path), _plan(tmp_path)
    assert [r.name for r in a] == [r.name for r in b]
    others = [[r.name for r in _plan(tmp_path, name=f"s{i}")] for i in range(5)]
    assert any(o != [r.name for r in a] for o in others)  # another sweep name shuffles differently


def test_lr_grid_and_rungs_stay_inside_each_seed_block():
    runs = [
        PlannedRun(arm, seed, (), lr, rung)
        for arm in ("a", "b")
        for rung in ("r1", "r2")
        for lr in (1e-3, 1e-2)
        for seed in (0, 1)
    ]  # arm-major, as a naive loop writes it
    ordered = interleave(runs, "grid")
    assert [r.seed for r in ordered] == [0] * 8 + [1] * 8
    assert [(r.rung, r.lr) for r in ordered[:8]] == [(g, lr) for g in ("r1", "r2") for lr in (1e-3, 1e-2) for _ in "ab"]
    assert sorted(ordered, key=lambda r: r.name) == sorted(runs, key=lambda r: r.name)  # the same runs, reordered
