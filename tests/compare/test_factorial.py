"""Factorial effects: gptlab-sweep --factorial expands `factors:` into the 2^k arms in one launch;
gptlab/compare/studies/factorial.py finds planted main effects and interactions (statsmodels OLS/ANOVA) on loss and on log
tokens/s timed alone (the timing session's rounds as blocks; never the training runs' own tokens/s), says whether the
all-on arm is the sum / product of its parts, and flags speed timed under load."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from gptlab.cli.sweep import main as sweep_main
from gptlab.compare.reading.runs import Run
from gptlab.compare.render.factorial import additivity_line, lines
from gptlab.compare.render.words import note
from gptlab.compare.studies.factorial import TimedRate, analyse, arm_levels
from gptlab.errors import ConfigError
from gptlab.sweep.design import factorial_arms
from gptlab.sweep.spec import load_sweep
from helpers.cli import cli_env, run_cli
from helpers.compare import store_noise_floor, write_run, write_timing

FACTORS = ["gqa", "sdpa", "mlp3"]


def arm_name(levels: dict[str, int]) -> str:
    return "+".join(f for f in FACTORS if levels[f]) or "base"


def synthetic(loss_of, speed_of, seeds: int = 3, noise: float = 0.006, loaded_arm: str | None = None, rng_seed=1):
    """Runs of every arm x seed: planted loss / speed functions of the levels plus seeded Gaussian noise.

    Each run's config records its seed, as a real run's does (runs of one arm and seed are one run counted once).
    At alpha 0.05 a term planted at zero is "found" in 5% of noise draws by design; the draw is fixed (rng_seed),
    so each test is deterministic."""
    rng = np.random.default_rng(rng_seed)
    runs = []
    for combo in itertools.product((0, 1), repeat=len(FACTORS)):
        levels = dict(zip(FACTORS, combo))
        arm = arm_name(levels)
        for seed in range(seeds):
            summary = {
                "final_val_loss": loss_of(levels) + float(rng.normal(0, noise)),
                "tokens_per_s_median": speed_of(levels) * math.exp(float(rng.normal(0, noise))),
                "outside_load": 0.6 if arm == loaded_arm else 0.02,
                "status": "finished",
            }
            runs.append(Run(Path(f"/s/{arm}/seed{seed}"), [], summary, {"arm": arm, "seed": seed}, [], {}))
    return runs


def timed(speed_of, rounds: int = 5, noise: float = 0.006, loaded_arm: str | None = None, rng_seed: int = 2):
    """A timing session's rates of every arm per round: speed_of(levels) x a drift shared by the round's windows (the
    machine 10% slower each round: what blocks cancel) x seeded Gaussian noise per window."""
    rng = np.random.default_rng(rng_seed)
    out = []
    for r in range(rounds):
        for combo in itertools.product((0, 1), repeat=len(FACTORS)):
            levels = dict(zip(FACTORS, combo))
            rate = speed_of(levels) * 0.9**r * math.exp(float(rng.normal(0, noise)))
            out.append(TimedRate(arm_name(levels), r, rate, arm_name(levels) == loaded_arm))
    return out


def additive_loss(lv):
    return 3.0 - 0.05 * lv["gqa"] + 0.0 * lv["sdpa"] + 0.03 * lv["mlp3"]


def product_speed(lv):
    return 1000.0 * 1.2 ** lv["gqa"] * 1.5 ** lv["sdpa"] * 1.1 ** lv["mlp3"]


def effects(fit: dict) -> dict[str, dict]:
    return {e["term"]: e for e in fit["effects"]}


def test_a_planted_interaction_is_found_and_a_non_interaction_is_not():
    # gqa x mlp3 interact on loss (+0.04 when both on); speed is purely multiplicative
    runs = synthetic(lambda lv: additive_loss(lv) + 0.04 * lv["gqa"] * lv["mlp3"], product_speed)
    doc = analyse(runs, FACTORS, speed=timed(product_speed))
    loss = effects(doc["loss"])
    assert loss["gqa×mlp3"]["p"] < 0.05 and loss["gqa×mlp3"]["lo"] < 0.04 < loss["gqa×mlp3"]["hi"]
    for term in ("gqa×sdpa", "sdpa×mlp3", "gqa×sdpa×mlp3", "sdpa"):
        assert loss[term]["p"] > 0.05, term  # planted zero: not found
    # main effects are averaged over the other factors: gqa -0.05 + 0.04/2, mlp3 +0.03 + 0.04/2
    assert loss["gqa"]["lo"] < -0.03 < loss["gqa"]["hi"] and loss["mlp3"]["lo"] < 0.05 < loss["mlp3"]["hi"]
    assert [e["order"] for e in doc["loss"]["effects"]] == [1, 1, 1, 2, 2, 2, 3]
    assert not doc["loss"]["additivity"]["additive"]
    assert "NOT additive: the parts interact" in additivity_line(doc["loss"], False, FACTORS)
    speed = effects(doc["speed"])
    assert all(speed[t]["p"] > 0.05 for t in ("gqa×sdpa", "gqa×mlp3", "sdpa×mlp3", "gqa×sdpa×mlp3"))
    assert math.exp(speed["sdpa"]["lo"]) < 1.5 < math.exp(speed["sdpa"]["hi"])
    assert doc["speed"]["additivity"]["additive"]
    assert "multiplicative (the parts compose)" in additivity_line(doc["speed"], True, FACTORS)
    anova = {row["term"]: row for row in doc["loss"]["anova"]}
    assert anova["gqa×mlp3"]["p"] < 0.05 and anova["residual"]["df"] == 16  # 24 runs - 8 cells
    assert doc["speed_under_load"] == [] and doc["speed_rounds"] == 5
    # 40 windows - 8 cells - 4 round blocks: the 10%-a-round drift is the blocks', not noise or an effect
    assert doc["speed"]["df_resid"] == 28 and math.exp(speed["gqa"]["effect"]) == pytest.approx(1.2, rel=0.01)
    assert {row["term"] for row in doc["speed"]["anova"]} >= {"round (block)", "residual"}


def test_additive_parts_are_called_additive_and_a_speed_interaction_is_not_multiplicative():
    # sdpa is faster only with gqa (an interaction on log speed); loss is additive
    interacting = lambda lv: product_speed(lv) * (1.3 if lv["gqa"] and lv["sdpa"] else 1.0)  # noqa: E731
    doc = analyse(synthetic(additive_loss, interacting), FACTORS, speed=timed(interacting))
    assert doc["loss"]["additivity"]["additive"] and "additive (the parts compose)" in lines(doc)[9]
    assert all(e["p"] > 0.05 for e in doc["loss"]["effects"] if e["order"] > 1)
    speed = effects(doc["speed"])
    assert speed["gqa×sdpa"]["p"] < 0.05 and math.exp(speed["gqa×sdpa"]["effect"]) == pytest.approx(1.3, rel=0.02)
    assert not doc["speed"]["additivity"]["additive"]
    assert "NOT multiplicative" in additivity_line(doc["speed"], True, FACTORS)


def test_speed_under_load_is_flagged():
    doc = analyse(synthetic(additive_loss, product_speed), FACTORS, speed=timed(product_speed, loaded_arm="gqa+sdpa"))
    assert doc["speed_under_load"] == ["gqa+sdpa"]
    assert any("[under load: gqa+sdpa" in line and "not to be trusted" in line for line in lines(doc))


def test_design_refusals():
    runs = synthetic(additive_loss, product_speed)
    with pytest.raises(ConfigError, match="1 of the 8 arms of gqa x sdpa x mlp3 have no finished run"):
        analyse([r for r in runs if r.config["arm"] != "gqa+mlp3"], FACTORS)
    with pytest.raises(ConfigError, match="run 2\\+ seeds"):
        analyse(synthetic(additive_loss, product_speed, seeds=1), FACTORS)
    with pytest.raises(ConfigError, match="'swa' is not a factor|swa is not a factor"):
        arm_levels("gqa+swa", FACTORS)
    assert arm_levels("base", FACTORS) == {"gqa": 0, "sdpa": 0, "mlp3": 0}


def test_factors_expand_to_the_two_to_the_k_arms():
    arms = factorial_arms({"gqa": ["attention=gqa", "attention.n_kv_head=2"], "sdpa": ["attention.impl=sdpa"]})
    assert arms == {
        "base": [],
        "gqa": ["attention=gqa", "attention.n_kv_head=2"],
        "sdpa": ["attention.impl=sdpa"],
        "gqa+sdpa": ["attention=gqa", "attention.n_kv_head=2", "attention.impl=sdpa"],
    }
    _, spec, _ = load_sweep("fast_factorial")
    assert len(spec["arms"]) == 8 and spec["arms"]["gqa+sdpa+mlp3"][-1] == "mlp.ratio=3" and spec["seeds"] == [0, 1, 2]
    for bad, words in (
        ({"a": ["mlp.ratio=3"], "b": ["mlp.ratio=2"]}, "both set mlp.ratio"),
        ({"base": ["mlp.ratio=3"]}, "factor name 'base'"),
        ({"a+b": ["mlp.ratio=3"]}, "factor name 'a\\+b'"),
        ({"a": []}, "non-empty list"),
        ({f"f{i}": [f"x.k{i}=1"] for i in range(7)}, "at most 6"),
    ):
        with pytest.raises(ConfigError, match=words):
            factorial_arms(bad)


def test_factorial_dry_run_is_one_launch_of_every_arm(tmp_path, capsys):
    out = tmp_path / "out"
    assert sweep_main(["fast_factorial", "--factorial", "--out", str(out), "--dry-run", "--seeds", "0,1"]) == 0
    text = capsys.readouterr().out
    dirs = sorted(
        l.split("hydra.run.dir=")[1].removeprefix(f"{out}/") for l in text.splitlines() if ": gptlab-train " in l
    )
    names = ["base", "gqa", "sdpa", "mlp3", "gqa+sdpa", "gqa+mlp3", "sdpa+mlp3", "gqa+sdpa+mlp3"]
    assert dirs == sorted(f"{a}/seed{s}" for a in names for s in (0, 1))
    assert "local queue: 16 runs" in text and not out.exists()
    both = tmp_path / "both.yaml"
    both.write_text(yaml.safe_dump({"arms": {"a": []}, "factors": {"x": ["mlp.ratio=3"]}}))
    with pytest.raises(SystemExit):
        sweep_main([str(both), "--dry-run"])
    assert "give 'factors'" in capsys.readouterr().err


def test_compare_adds_the_factorial_section_to_a_factorial_sweep(tmp_path):
    """gptlab-compare on a 2x2 factorial sweep dir: the usual table, plus factorial.json and the report section."""
    sweep = tmp_path / "ff"
    sweep.mkdir()
    factors = {"gqa": ["attention=gqa"], "mlp3": ["mlp.ratio=3"]}
    (sweep / "sweep.yaml").write_text(yaml.safe_dump({"factors": factors, "arms": factorial_arms(factors)}))
    rng = np.random.default_rng(3)
    for gqa, mlp3 in itertools.product((0, 1), repeat=2):
        arm = "+".join(n for n, on in (("gqa", gqa), ("mlp3", mlp3)) if on) or "base"
        for seed in range(3):
            final = 2.0 - 0.05 * gqa + 0.02 * mlp3 + 0.06 * gqa * mlp3 + float(rng.normal(0, 0.004))
            write_run(
                sweep / arm / f"seed{seed}", seed=seed, choices={"attention": "gqa" if gqa else "mha"},
                leaves={"mlp.ratio": 3 if mlp3 else 4, "arm": arm}, loss_at=lambda step, f=final: f + 0.01 * (100 - step),
                tokens_per_s=1000.0 * (1.2 if gqa else 1.0) * (1.1 if mlp3 else 1.0) * (1 + 0.01 * seed),
            )  # fmt: skip
    done = run_cli("gptlab.cli.compare", str(sweep))
    assert done.returncode == 0, done.stderr
    assert "factorial effects of gqa x mlp3 (12 runs" in done.stdout and "NOT additive" in done.stdout
    doc = json.loads((sweep / "comparison" / "factorial.json").read_text())
    inter = next(e for e in doc["loss"]["effects"] if e["term"] == "gqa×mlp3")
    assert inter["p"] < 0.05 and inter["lo"] < 0.06 < inter["hi"]
    assert "## Factorial effects" in (sweep / "comparison" / "comparison.md").read_text()
    assert "<h2>Factorial effects</h2>" in (sweep / "comparison" / "comparison.html").read_text()
    bad = run_cli("gptlab.cli.compare", str(sweep / "base"), "--factorial")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "--factorial" in bad.stderr


def test_speed_effects_come_from_the_timing_session_flagged_by_the_comparisons_own_limit(tmp_path, monkeypatch):
    """The training runs' tokens/s say gqa is 2x faster (they shared the machine differently); the sweep's timing
    session times it 1.2x, with the gqa+mlp3 windows at 15 % outside load. With a measured noise floor (A/A under
    4 % load: limit 9 %) the factorial fits the session's rounds and flags gqa+mlp3 (a fixed 25 % would not)."""
    sweep = tmp_path / "ff"
    sweep.mkdir()
    factors = {"gqa": ["attention=gqa"], "mlp3": ["mlp.ratio=3"]}
    (sweep / "sweep.yaml").write_text(yaml.safe_dump({"factors": factors, "arms": factorial_arms(factors)}))
    arms, rates = {}, {}
    for gqa, mlp3 in itertools.product((0, 1), repeat=2):
        arm = "+".join(n for n, on in (("gqa", gqa), ("mlp3", mlp3)) if on) or "base"
        for seed in range(3):
            run = write_run(
                sweep / arm / f"seed{seed}", seed=seed, choices={"attention": "gqa" if gqa else "mha"},
                leaves={"mlp.ratio": 3 if mlp3 else 4, "arm": arm}, loss_at=lambda step: 2.0 + 0.01 * (100 - step),
                tokens_per_s=1000.0 * (2.0 if gqa else 1.0) * (1 + 0.01 * seed),
            )  # fmt: skip
            hardware = {"hardware": {"cpu": "Test CPU", "cpu_cores": [0, 1]}}
            (run / "provenance.json").write_text(json.dumps(hardware))
        arms[arm] = (sweep / arm / "seed0", f"fp-{arm}")
        rates[arm] = [1000.0 * (1.2 if gqa else 1.0) * 0.95**r * (1 + 0.002 * (-1) ** (r + gqa)) for r in range(5)]
    rates["base#2"] = [x * (1 + 0.001 * (-1) ** r) for r, x in enumerate(rates["base"])]
    write_timing(sweep, arms, rates, loads={"gqa+mlp3": 0.15})
    cache = tmp_path / "cache"
    store_noise_floor(cache, "Test CPU | 2 cores", outside_load=0.04)
    done = run_cli("gptlab.cli.compare", str(sweep), env=cli_env(GPTLAB_CACHE=str(cache)))
    assert done.returncode == 0, done.stderr
    table = json.loads((sweep / "comparison" / "comparison.json").read_text())
    limit = table["noise_floor"]["load_limit"]
    assert limit == pytest.approx(0.09)
    doc = json.loads((sweep / "comparison" / "factorial.json").read_text())
    assert doc["speed_under_load"] == ["gqa+mlp3"] and doc["load_limit"] == pytest.approx(limit)
    assert doc["speed_rounds"] == 5 and doc["speed_not_timed"] == ""
    gqa = effects(doc["speed"])["gqa"]
    assert math.exp(gqa["effect"]) == pytest.approx(1.2, rel=0.01)  # the session's, not the runs' 2x
    assert "[under load: gqa+mlp3 timed with > 9% of cores" in done.stdout


def test_an_untimed_factorial_says_so_with_the_command_that_times_it(tmp_path):
    sweep = tmp_path / "ff"
    sweep.mkdir()
    factors = {"gqa": ["attention=gqa"], "mlp3": ["mlp.ratio=3"]}
    (sweep / "sweep.yaml").write_text(yaml.safe_dump({"factors": factors, "arms": factorial_arms(factors)}))
    for gqa, mlp3 in itertools.product((0, 1), repeat=2):
        arm = "+".join(n for n, on in (("gqa", gqa), ("mlp3", mlp3)) if on) or "base"
        for seed in range(2):
            write_run(
                sweep / arm / f"seed{seed}", seed=seed, choices={"attention": "gqa" if gqa else "mha"},
                leaves={"mlp.ratio": 3 if mlp3 else 4, "arm": arm}, loss_at=lambda step: 2.0 + 0.01 * (100 - step),
                tokens_per_s=1000.0 * (2.0 if gqa else 1.0) * (1 + 0.01 * seed),
            )  # fmt: skip
    done = run_cli("gptlab.cli.compare", str(sweep), "--noise-floor", "none")
    assert done.returncode == 0, done.stderr
    doc = json.loads((sweep / "comparison" / "factorial.json").read_text())
    assert "speed" not in doc and doc["speed_not_timed"] == f"gptlab-sweep time {sweep}"
    assert (
        "speed: not timed: no timing session times the arms, and a training run's own tokens/s is not a measurement "
        f"of its arm (time them: gptlab-sweep time {sweep})"
    ) in done.stdout


def test_the_tests_are_calibrated_over_many_noise_draws():
    """Over 40 draws: the planted interaction is found (p < 0.05) nearly always, a planted-zero one about 5% of the
    time (what alpha promises), so the fixed draw above is not a lucky pick."""
    found, false = 0, 0
    for draw in range(40):
        runs = synthetic(
            lambda lv: additive_loss(lv) + 0.04 * lv["gqa"] * lv["mlp3"], product_speed, rng_seed=100 + draw
        )
        loss = effects(analyse(runs, FACTORS)["loss"])
        found += loss["gqa×mlp3"]["p"] < 0.05
        false += loss["gqa×sdpa"]["p"] < 0.05
    assert found >= 38 and false <= 6, (found, false)


def two_by_two(speed_of, loss_of=lambda arm: 2.0, wiggle=(0.99, 1.0, 1.01)):
    """Runs of a 2x2 (a x b), 3 seeds: speed_of(arm) tok/s times the seed's wiggle (None: no speed recorded), a loss
    of loss_of(arm) (None: no final val loss) plus the same seed offset in every arm."""
    runs = []
    for arm in ("base", "a", "b", "a+b"):
        for seed, w in enumerate(wiggle):
            loss = loss_of(arm)
            summary = {
                "final_val_loss": None if loss is None else loss + 0.004 * (seed - 1),
                "tokens_per_s_median": None if speed_of(arm) is None else speed_of(arm) * w,
                "status": "finished",
            }
            runs.append(Run(Path(f"/s/{arm}/seed{seed}"), [], summary, {"arm": arm, "seed": seed}, [], {}))
    return runs


SPEEDS = {"base": 1000.0, "a": 2000.0, "b": 500.0, "a+b": 1000.0}  # exactly multiplicative: a ×2, b ×0.5


def rates_2x2(speed_of, wiggle=(0.99, 1.0, 1.01)) -> list[TimedRate]:
    """A session's rates of a 2x2's arms over 3 rounds: speed_of(arm) tok/s (None: not timed) times the round's
    wiggle, the same in every arm."""
    return [
        TimedRate(arm, r, speed_of(arm) * w, False)
        for r, w in enumerate(wiggle)
        for arm in ("base", "a", "b", "a+b")
        if speed_of(arm) is not None
    ]


def test_an_arm_without_speed_figures_leaves_the_speed_effects_out():
    """With every arm timed, the rounds' wiggle is the same in every arm, so the cell means of log speed differ by
    exactly the planted logs: a ×2, b ×0.5, a×b ×1 (difference of differences), additive. Without arm b's timing its
    cell is empty and no contrast of the full model is estimable: no speed effects, said in one line (the old fit
    on the rank-deficient design gave a ×2.784, a×b ×1.938 and 'NOT multiplicative')."""
    full = analyse(two_by_two(SPEEDS.get), ["a", "b"], speed=rates_2x2(SPEEDS.get))
    speed = effects(full["speed"])
    assert math.exp(speed["a"]["effect"]) == pytest.approx(2.0, rel=1e-9)
    assert math.exp(speed["b"]["effect"]) == pytest.approx(0.5, rel=1e-9)
    assert math.exp(speed["a×b"]["effect"]) == pytest.approx(1.0, abs=1e-9)
    assert full["speed"]["additivity"]["difference"][0] == pytest.approx(0.0, abs=1e-9)
    assert full["speed"]["additivity"]["additive"] and full["speed_missing"] == []
    untimed_b = rates_2x2(lambda arm: None if arm == "b" else SPEEDS[arm])
    doc = analyse(two_by_two(SPEEDS.get), ["a", "b"], speed=untimed_b)
    assert "speed" not in doc and doc["speed_missing"] == ["b"]
    assert doc["loss"] == full["loss"]  # the loss side is untouched
    text = lines(doc)
    assert text[-1] == (
        "speed: not estimated: arm b not timed by the timing session, and the effects need every one of the 4 arms"
    )
    assert not any(line.startswith("speed (tokens/s") for line in text)


def test_an_arm_without_a_final_val_loss_is_a_missing_arm():
    runs = two_by_two(SPEEDS.get, loss_of=lambda arm: None if arm == "a+b" else 2.0)
    with pytest.raises(ConfigError, match="^factorial: 1 of the 4 arms of a x b have no finished run; effects need"):
        analyse(runs, ["a", "b"])


def test_an_unfinished_run_is_left_out_with_a_line_and_its_arm_keeps_its_finished_seeds():
    """Arm a's seed 2 was preempted at an early eval: its last val loss 2.5 is not a final one. Counted (the old
    factorial), it moves a's main effect from 0 to +0.083 and the a×b interaction to -0.165. Left out, a's cell
    lacks only that seed's +0.004 offset: a -0.001, a×b +0.002 exactly, and the run is named once."""
    runs = two_by_two(SPEEDS.get)
    cut = next(r for r in runs if r.config == {"arm": "a", "seed": 2})
    cut.summary.update(final_val_loss=2.5, status="preempted")
    doc = analyse(runs, ["a", "b"])
    loss = effects(doc["loss"])
    assert loss["a"]["effect"] == pytest.approx(-0.001, abs=1e-9)
    assert loss["a×b"]["effect"] == pytest.approx(0.002, abs=1e-9)
    assert doc["runs"] == 11
    assert [note(w) for w in doc["warnings"]] == [
        "warning: /s/a/seed2: status preempted: left out of the factorial effects (its last val loss is not a "
        "finished run's)"
    ]
    assert doc["warnings"][0].subject == "/s/a/seed2"
    every = [r for r in two_by_two(SPEEDS.get) if r.config["arm"] != "b"]
    for run in [r for r in runs if r.config["arm"] == "b"]:
        run.summary["status"] = "failed"
    with pytest.raises(ConfigError, match="^factorial: 1 of the 4 arms of a x b have no finished run"):
        analyse(every + [r for r in runs if r.config["arm"] == "b"], ["a", "b"])


def test_a_contrast_over_an_arm_the_model_lacks_is_an_error_not_a_weight_of_zero():
    from gptlab.compare.studies.factorial import _additivity, _speed_table

    df = _speed_table(rates_2x2(lambda arm: None if arm == "b" else SPEEDS[arm]), ["a", "b"])
    with pytest.raises(ValueError, match="arm b is not a cell of the log_speed model"):
        _additivity(df, "log_speed", ["a", "b"], 0.05, blocks=True)


def test_a_copied_run_and_a_replayed_seed_count_once_with_the_main_comparisons_lines(tmp_path):
    """A 2x2 sweep (gqa x mlp3, 3 seeds; seed offsets -0.004, 0, +0.004 in every arm, so the cell means are the
    planted gqa -0.05, mlp3 +0.02, no interaction) plus a copy of gqa/seed0 and a rerun of base with seed 0: the
    factorial counts 12 runs, as the main comparison does, and says why once. Counted twice (the old factorial: 14
    runs, residual df 10) the copy and the replay pull base and gqa toward their seed 0: mlp3 +0.0210."""
    import shutil

    sweep = tmp_path / "ff"
    sweep.mkdir()
    factors = {"gqa": ["attention=gqa"], "mlp3": ["mlp.ratio=3"]}
    (sweep / "sweep.yaml").write_text(yaml.safe_dump({"factors": factors, "arms": factorial_arms(factors)}))

    def run(arm: str, seed: int, where: str, tokens_per_s: float = 1000.0) -> None:
        gqa, mlp3 = "gqa" in arm, "mlp3" in arm
        final = 2.0 - 0.05 * gqa + 0.02 * mlp3 + 0.004 * (seed - 1)
        write_run(
            sweep / arm / where, seed=seed, choices={"attention": "gqa" if gqa else "mha"},
            leaves={"mlp.ratio": 3 if mlp3 else 4, "arm": arm}, loss_at=lambda step, f=final: f + 0.01 * (100 - step),
            tokens_per_s=tokens_per_s * (1 + 0.01 * seed),
        )  # fmt: skip

    for arm in ("base", "gqa", "mlp3", "gqa+mlp3"):
        for seed in range(3):
            run(arm, seed, f"seed{seed}")
    shutil.copytree(sweep / "gqa" / "seed0", sweep / "gqa" / "seed0_copy")
    run("base", 0, "seed0_again", tokens_per_s=1003.0)  # the same config and seeds, another measurement
    done = run_cli("gptlab.cli.compare", str(sweep), "--noise-floor", "none")
    assert done.returncode == 0, done.stderr
    said = [
        "warning: gqa/seed0_copy is a copy of gqa/seed0 (identical metrics.jsonl, summary.json and config): counted "
        "once, as gqa/seed0",
        "warning: base/seed0_again repeats base/seed0's config and seeds (data_seed 1234, seed 0): a replay is not a "
        "new sample; counted once, as base/seed0",
    ]
    assert [done.stderr.splitlines().count(line) for line in said] == [1, 1], done.stderr
    assert "factorial effects of gqa x mlp3 (12 runs" in done.stdout
    doc = json.loads((sweep / "comparison" / "factorial.json").read_text())
    assert doc["runs"] == 12 and doc["loss"]["df_resid"] == 8 and doc["warnings"] == said
    loss = effects(doc["loss"])
    assert loss["gqa"]["effect"] == pytest.approx(-0.05, abs=1e-9)
    assert loss["mlp3"]["effect"] == pytest.approx(0.02, abs=1e-9)
    assert loss["gqa×mlp3"]["effect"] == pytest.approx(0.0, abs=1e-9)
