"""gptlab-compare --target / --threshold: steps, tokens and time to a target (steps at the arm's timed step time, from
a timing session; never a training run's own clock), and the smallest arm reaching it."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from gptlab.cli.compare import main
from gptlab.compare.reading.timing import read_timing
from gptlab.compare.tables.target import parse_target
from gptlab.errors import ConfigError
from helpers.cli import cli_env, run_cli
from helpers.compare import write_sweep, write_timing
from helpers.train import FAST

REPO = Path(__file__).resolve().parents[2]


def curve(
    path: Path,
    val: dict[int, float],
    *,
    last: int = 100,
    log: int = 10,
    tok: int = 128,
    wall: float = 0.05,
    acc: dict[int, float] | None = None,
    eval_x: bool = False,
) -> None:
    """Rewrite a run's metrics.jsonl: train rows every `log` steps (tokens = tok·step, wall = wall·step) and eval
    rows at the keys of `val` — without tokens/wall_s like older runs, or with them when eval_x."""
    rows = []
    for s in range(max(last, *val) + 1):
        if s and s % log == 0:
            rows.append({"step": s, "train/loss": 9.0, "tokens": tok * s, "wall_s": wall * s})
        if s in val:
            ev = {"step": s, "val/loss": val[s], **({"val/acc": acc[s]} if acc else {})}
            rows.append({**ev, "tokens": tok * s, "wall_s": wall * s + 0.5} if eval_x else ev)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def sweep(tmp: Path, arms: list[dict], seeds: int = 3, acc: bool = False) -> Path:
    """A multirun of len(arms) x seeds synthetic runs; job k = arm k // seeds, seed k % seeds."""
    specs = [{"seed": s, "leaves": arm, "acc": acc} for arm in arms for s in range(seeds)]
    return write_sweep(tmp, specs)


def run_compare(tmp: Path, capsys, *args: str) -> dict:
    """main() into tmp/out; returns comparison.json (stdout kept in capsys for the caller)."""
    assert main([*args, "--out", str(tmp / "out"), "--no-wandb"]) == 0
    return json.loads((tmp / "out" / "comparison.json").read_text())


JITTER = (0.0, 0.004, -0.003, 0.002, -0.001)  # five rounds, each window within 0.4% of its arm's rate


def timing(tmp: Path, root: Path, step_ms: dict[int, float]) -> str:
    """A finished timing session (5 rounds, 128 tokens a step) that times job j's arm at step_ms[j] ms a step, the
    first job given the baseline (its A/A window jittered the other way); the path to give --timing."""
    arms = {f"job{j}": (root / str(j), f"fp-{j}") for j in step_ms}
    rates = {f"job{j}": [128_000.0 / ms * (1 + d) for d in JITTER] for j, ms in step_ms.items()}
    first = next(iter(arms))
    rates[f"{first}#2"] = [x * (1 - 2 * d) for x, d in zip(rates[first], JITTER)]
    return str(write_timing(tmp / "timing", arms, rates))


def timed_step_s(path: str) -> dict[str, float]:
    """Each timed arm's step time in seconds, as the session reads back (the median of its windows)."""
    session = read_timing(Path(path))
    assert session is not None
    return {name: arm.step_ms / 1000.0 for name, arm in session.arms.items() if arm.step_ms is not None}


def falls(cross: int, last: int = 100, every: int = 25) -> dict[int, float]:
    """Val loss 4.0 before step `cross`, 1.5 from it on (eval every `every` steps from 0)."""
    return {s: (1.5 if s >= cross else 4.0) for s in range(0, last + 1, every)}


def test_crossing_steps_tokens_and_not_reached_with_no_time_when_not_timed(tmp_path, capsys):
    root = sweep(tmp_path, [{}, {"mlp.ratio": 3}])
    curve(root / "0", {0: 4.0, 25: 3.0, 50: 2.0, 75: 1.9, 100: 1.8})  # at 50 exactly: a logged train step
    curve(root / "1", {0: 4.0, 25: 1.95, 50: 1.9, 75: 1.8, 100: 1.7})  # at 25: interpolated between 20 and 30
    curve(root / "2", {0: 4.0, 25: 3.0, 50: 2.5, 75: 2.2, 100: 2.01})  # never
    for job in (3, 4, 5):
        curve(root / str(job), falls(25))
    doc = run_compare(tmp_path, capsys, str(root), "--target", "val/loss=2.0")
    (block,) = doc["targets"]
    assert (block["metric"], block["op"], block["value"], block["resolution_steps"]) == ("val/loss", "<=", 2.0, [25])
    assert block["time_axis"] is None  # no timing session: no time to target (the runs' wall clocks are not read)
    base, arm = block["rows"]
    hits = [(h["step"], h["tokens"], h["time_s"], h["reached"]) for h in base["seeds"]]
    assert hits[0] == (50, 6400.0, None, True)
    assert hits[1] == (25, 3200.0, None, True)
    assert hits[2] == (None, None, None, False) and base["not_reached_by"] == [100]
    assert (base["n_reached"], base["n_seeds"], base["steps_mean"]) == (2, 3, 37.5)
    assert base["steps_std"] == pytest.approx(statistics.stdev([50, 25]))
    assert base["tokens_mean"] == 4800.0 and base["time_s_mean"] is None
    assert base["speedup_steps"]["effect"] is None and arm["speedup_steps"]["effect"] is None  # baseline missed it once
    assert base["speedup_steps"]["status"] == arm["speedup_steps"]["status"] == "not_measured"
    assert arm["speedup_time"]["status"] == "not_measured" and arm["speedup_time"]["metric"] == "time_to_target@timed_s"
    assert (arm["n_reached"], arm["steps_mean"], arm["steps_std"]) == (3, 25.0, 0.0)
    out = capsys.readouterr().out
    assert "2/3 reached: 37.5 ± 17.7 steps; 1 not reached by step 100" in out
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "## Steps to val/loss <= 2" in md
    assert "| mlp.ratio=3 | 3/3 | 25 ± 0 steps | 3.2k ± 0 | not timed | – | not timed |" in md
    assert "4.8k ± 2.26k (2/3 reached)" in md
    assert "recorded every 25 steps" in md and "never averaged away" in md and "never a training run's own clock" in md
    page = (tmp_path / "out" / "comparison.html").read_text()
    assert "<h2>Steps to val/loss &lt;= 2</h2>" in page and "<td>2/3 reached: 37.5 ± 17.7 steps; 1 not" in page


def test_time_to_target_is_steps_at_the_timed_step_never_the_runs_clock(tmp_path, capsys):
    """The arm reaches the target in half the steps; its runs' clocks say it is 5x faster a step (they shared the
    machine differently), the timing session that it is 1.4x slower a step: time to target is the session's."""
    root = sweep(tmp_path, [{}, {"mlp.ratio": 3}, {"mlp.ratio": 2}], seeds=2)
    for job in (0, 1):
        curve(root / str(job), falls(50), eval_x=True, wall=0.05)
    for job in (2, 3):
        curve(root / str(job), falls(25), eval_x=True, wall=0.01)
    curve(root / "4", {**falls(200, last=100), 105: 1.0}, last=100)  # crosses at 105, after the last train row
    curve(root / "5", {**falls(200, last=100), 105: 1.0}, last=100)
    path = timing(tmp_path, root, {0: 50.0, 2: 70.0})  # ratio=2 is not timed
    doc = run_compare(tmp_path, capsys, str(root), "--target", "val/loss<=2", "--step", "100", "--timing", path)
    step_s = timed_step_s(path)
    base, fast, late = doc["targets"][0]["rows"]
    assert doc["targets"][0]["time_axis"] == "timed_s"
    assert [h["time_s"] for h in base["seeds"]] == [pytest.approx(50 * step_s["job0"])] * 2
    assert [h["time_s"] for h in fast["seeds"]] == [pytest.approx(25 * step_s["job2"])] * 2
    assert base["speedup_steps"]["effect"] == 1.0 and base["speedup_steps"]["status"] == "baseline"
    assert base["speedup_time"]["status"] == "baseline"
    assert fast["speedup_steps"]["effect"] == 2.0
    assert fast["speedup_time"]["effect"] == pytest.approx(2.0 * step_s["job0"] / step_s["job2"])  # ~1.43, not 10
    assert [h["step"] for h in late["seeds"]] == [105, 105] and late["tokens_mean"] is None
    assert late["seeds"][0]["tokens"] is None and late["seeds"][0]["time_s"] is None  # never extrapolated; not timed
    assert late["speedup_time"]["status"] == "not_measured"
    out = capsys.readouterr().out
    assert "1.00× (baseline)" in out and "2.00×" in out and "1.43×" in out


def test_step_zero_is_zero_tokens_and_seconds(tmp_path, capsys):
    root = sweep(tmp_path, [{}], seeds=1)
    curve(root / "0", {0: 1.0, 50: 1.0}, eval_x=True)
    doc = run_compare(
        tmp_path, capsys, str(root), "--target", "val/loss=2", "--timing", timing(tmp_path, root, {0: 50})
    )
    (hit,) = doc["targets"][0]["rows"][0]["seeds"]
    assert (hit["step"], hit["tokens"], hit["time_s"]) == (0, 0.0, 0.0)
    assert doc["targets"][0]["rows"][0]["steps_std"] is None


def test_mixed_directions_two_targets(tmp_path, capsys):
    root = sweep(tmp_path, [{}], seeds=2, acc=True)
    for job in (0, 1):
        curve(
            root / str(job),
            {0: 4.0, 25: 2.5, 50: 1.5, 75: 1.2, 100: 1.0},
            acc={0: 0.0, 25: 0.95 if job else 0.5, 50: 0.85, 75: 0.92, 100: 0.99},
        )
    doc = run_compare(tmp_path, capsys, str(root), "--target", "val/loss=2", "--target", "val/acc=0.9")
    loss, acc = doc["targets"]
    assert (loss["op"], acc["op"]) == ("<=", ">=")
    assert [h["step"] for h in loss["rows"][0]["seeds"]] == [50, 50]
    assert [h["step"] for h in acc["rows"][0]["seeds"]] == [75, 25]  # accuracy: at or above, first time only
    assert [h["value"] for h in acc["rows"][0]["seeds"]] == [0.92, 0.95]
    doc = run_compare(tmp_path, capsys, str(root), "--target", "val/acc<=0.5")  # explicit operator wins
    assert [h["step"] for h in doc["targets"][0]["rows"][0]["seeds"]] == [0, 0]


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            "val/loss",
            "--target 'val/loss': expected METRIC=X (lower is better for *loss*, higher for *acc*), "
            "METRIC<=X or METRIC>=X",
        ),
        ("val/loss<3", "--target 'val/loss<3': expected METRIC=X"),
        ("val/loss=abc", "--target 'val/loss=abc': 'abc' is not a finite number"),
        ("val/loss=nan", "--target 'val/loss=nan': 'nan' is not a finite number"),
        (
            "grad_norm=1",
            "--target 'grad_norm=1': cannot tell whether lower or higher grad_norm is better; "
            "write grad_norm<=1 or grad_norm>=1",
        ),
    ],
)
def test_bad_target_specs(spec, message, tmp_path, capsys):
    root = sweep(tmp_path, [{}], seeds=1)
    assert main([str(root), "--target", spec, "--out", str(tmp_path / "out"), "--no-wandb"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gptlab-compare: error: {message}") and err.count("\n") == 1
    with pytest.raises(ConfigError):
        parse_target(spec)


def test_direction_from_name():
    assert parse_target("val/loss=3.2").text == "val/loss <= 3.2"
    assert parse_target("val/acc=0.9").text == "val/acc >= 0.9"
    assert parse_target("train/loss >= 5").op == ">="
    assert parse_target("val/ppl=30", "--threshold").op == "<="


def test_unknown_metric_names_logged_ones(tmp_path, capsys):
    root = sweep(tmp_path, [{}], seeds=1)
    assert main([str(root), "--target", "val/acc=0.9", "--out", str(tmp_path / "out"), "--no-wandb"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "gptlab-compare: error: --target val/acc >= 0.9: unknown metric 'val/acc' (no run logged it); "
        "metrics logged: train/loss, train/lr, train/grad_norm, tokens, perf/tokens_per_s, perf/step_ms, perf/mfu, "
        "mem/peak_bytes, wall_s, train_s, val/loss\n"  # the fixture's bare names, read under today's
    )
    assert not (tmp_path / "out").exists()


def layers_sweep(tmp: Path, reached: dict[int, list[bool]], extra: dict | None = None) -> Path:
    """Arms model.n_layer=L (in the dict's order), one run per listed seed; True = reaches val/acc 0.95 at step 50."""
    specs = [
        {"seed": s, "leaves": {"model.n_layer": L, **(extra or {}).get(L, {})}, "acc": True}
        for L, seeds in reached.items()
        for s in range(len(seeds))
    ]
    root = write_sweep(tmp, specs)
    flags = [ok for seeds in reached.values() for ok in seeds]
    for job, ok in enumerate(flags):
        curve(root / str(job), falls(50), acc={s: (0.95 if ok and s >= 50 else 0.3) for s in range(0, 101, 25)})
    return root


def test_threshold_smallest_value_numeric_order(tmp_path, capsys):
    root = layers_sweep(tmp_path, {10: [True] * 3, 2: [False] * 3, 3: [True] * 3, 4: [True, False, True]})
    doc = run_compare(tmp_path, capsys, str(root), "--threshold", "val/acc=0.9", "--baseline", "model.n_layer=2")
    (th,) = doc["thresholds"]
    sentence = (
        "smallest model.n_layer reaching val/acc >= 0.9 in every seed (3/3): 3 (seeds that reached it: "
        "model.n_layer=2: 0/3, model.n_layer=3: 3/3, model.n_layer=4: 2/3, model.n_layer=10: 3/3; "
        "larger but not in every seed: model.n_layer=4 (2/3)); caution: not monotone in model.n_layer, so the "
        "answer may be the seeds' luck rather than a threshold (add seeds to the arms that missed it, e.g. "
        "gptlab-sweep NAME --until-decided)"
    )
    assert th["answer"] == "3" and th["key"] == "model.n_layer" and th["sentence"] == sentence
    assert th["monotone"] is False
    assert [a["value"] for a in th["arms"]] == ["2", "3", "4", "10"]  # numeric, not text, order
    assert doc["targets"][0]["text"] == "val/acc >= 0.9"
    assert f"\n{sentence}\n" in capsys.readouterr().out
    assert f"- {sentence}" in (tmp_path / "out" / "comparison.md").read_text()


def test_threshold_none_reaches(tmp_path, capsys):
    root = layers_sweep(tmp_path, {1: [False, False], 2: [True, False]})
    doc = run_compare(tmp_path, capsys, str(root), "--threshold", "val/acc>=0.9")
    assert doc["thresholds"][0]["answer"] is None
    assert doc["thresholds"][0]["sentence"] == (
        "none of the arms reaches val/acc >= 0.9 in every seed (seeds that "
        "reached it: model.n_layer=1: 0/2, model.n_layer=2: 1/2)"
    )


def test_threshold_key_choice_and_refusals(tmp_path, capsys):
    root = layers_sweep(
        tmp_path, {1: [False], 2: [True], 3: [True]}, extra={2: {"optimizer.lr": 0.01}, 3: {"optimizer.lr": 0.01}}
    )
    args = [str(root), "--out", str(tmp_path / "out"), "--no-wandb", "--threshold", "val/acc=0.9"]
    assert main(args) == 2
    assert capsys.readouterr().err == (
        "gptlab-compare: error: --threshold: the arms differ in 2 keys (model.n_layer, "
        "optimizer.lr); name the one to minimise with --threshold-key KEY\n"
    )
    assert main([*args, "--threshold-key", "optimizer.lr"]) == 2
    assert "--threshold-key optimizer.lr: arms " in capsys.readouterr().err
    assert main([*args, "--threshold-key", "model.nope"]) == 2
    assert (
        "--threshold-key 'model.nope': no arm has that key; keys that vary: model.n_layer, optimizer.lr"
        in capsys.readouterr().err
    )
    assert main([*args, "--threshold-key", "model.n_layer"]) == 0
    assert "smallest model.n_layer reaching val/acc >= 0.9 in every seed (1/1): 2" in capsys.readouterr().out
    assert main([str(root), "--threshold-key", "model.n_layer", "--no-wandb"]) == 2
    assert capsys.readouterr().err == (
        "gptlab-compare: error: --threshold-key needs --threshold METRIC=X (the target the key's arms must reach)\n"
    )


def test_threshold_needs_arms(tmp_path, capsys):
    root = sweep(tmp_path, [{}], seeds=2)
    assert main([str(root), "--threshold", "val/loss=2", "--out", str(tmp_path / "out"), "--no-wandb"]) == 2
    assert "--threshold needs arms that differ in one config key" in capsys.readouterr().err


def test_no_target_keeps_json_as_before(tmp_path, capsys):
    root = sweep(tmp_path, [{}], seeds=1)
    doc = run_compare(tmp_path, capsys, str(root))
    assert "targets" not in doc and "thresholds" not in doc
    assert "Steps to target" not in (tmp_path / "out" / "comparison.md").read_text()


@pytest.mark.slow
def test_real_multirun_steps_to_target_and_threshold(tmp_path, capsys):
    """Train n_layer=1,2 x seed=0,1 for 12 steps; the reported steps are each run's first eval at/below the target."""
    fast = [o for o in FAST if not o.startswith(("model.n_layer", "train.", "model.block_size"))]
    env = cli_env(OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="0")
    proc = run_cli(
        "gptlab.cli.train",
        "-m",
        *fast,
        "model.n_layer=1,2",
        "seed=0,1",
        "model.block_size=32",
        "train.batch_size=4",
        "train.eval_sequences=8",
        "train.max_steps=12",
        "train.eval_interval=3",
        "train.log_interval=2",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = sorted((tmp_path / "sweep").glob("[0-9]"))
    records = {r: [json.loads(line) for line in (r / "metrics.jsonl").read_text().splitlines()] for r in runs}
    evals = {r: [(x["step"], x["val/loss"]) for x in recs if "val/loss" in x] for r, recs in records.items()}
    first = statistics.mean(v[0][1] for v in evals.values())
    last = statistics.mean(v[-1][1] for v in evals.values())
    target = round(first - 0.7 * (first - last), 3)  # between the start and end losses
    doc = run_compare(
        tmp_path, capsys, str(tmp_path / "sweep"), "--target", f"val/loss={target}", "--threshold", f"val/loss={target}"
    )
    (block,) = doc["targets"]  # the threshold's target is the same one: one table
    assert block["resolution_steps"] == [3] and sum(r["n_seeds"] for r in block["rows"]) == 4
    assert doc["clock"] == "train_s" and block["time_axis"] is None  # not timed: no time to target
    for row in block["rows"]:
        for hit in row["seeds"]:
            path = Path(hit["run"])
            want = next((s for s, v in evals[path] if v <= target), None)
            assert hit["step"] == want and hit["reached"] == (want is not None)
            if want is not None:
                eval_row = next(x for x in records[path] if x["step"] == want and "val/loss" in x)
                assert hit["tokens"] == eval_row["tokens"] == want * 4 * 32  # batch 4 x block 32 per step
                assert hit["time_s"] is None  # the run's own train_s is a record of its machine, not read here
            else:
                assert hit["last_step"] == 12 and 12 in row["not_reached_by"]
        ok = [h["step"] for h in row["seeds"] if h["reached"]]
        assert row["n_reached"] == len(ok) and row["steps_mean"] == (statistics.mean(ok) if ok else None)
    assert any(r["n_reached"] for r in block["rows"]) and first - last > 0.3
    (th,) = doc["thresholds"]
    reached = {r["label"]: (r["n_reached"], r["n_seeds"]) for r in block["rows"]}
    assert th["key"] == "model.n_layer" and [a["value"] for a in th["arms"]] == ["1", "2"]
    assert [(a["n_reached"], a["n_seeds"]) for a in th["arms"]] == [reached[a["label"]] for a in th["arms"]]
    smallest = next((a["value"] for a in th["arms"] if a["n_reached"] == a["n_seeds"]), None)
    assert th["answer"] == smallest
    assert th["sentence"] in capsys.readouterr().out


def test_threshold_over_a_group_choice_keeps_table_order(tmp_path, capsys):
    specs = [{"seed": s, "choices": {"attention": att}} for att in ("mqa", "mha", "gqa") for s in range(2)]
    root = write_sweep(tmp_path, specs)
    for job in range(6):
        curve(root / str(job), falls(25) if job >= 2 else falls(200))  # mqa never gets there
    doc = run_compare(tmp_path, capsys, str(root), "--threshold", "val/loss=2", "--baseline", "attention=mqa")
    assert doc["thresholds"][0]["sentence"] == (
        "first attention in the table's order (mqa, mha, gqa) reaching val/loss <= 2 in every seed (2/2): mha "
        "(seeds that reached it: attention=mqa: 0/2, attention=mha: 2/2, attention=gqa: 2/2)"
    )
    assert doc["thresholds"][0]["numeric"] is False


def _log_ratio_test(arm_steps: list[float], base_steps: list[float]) -> tuple[float, float]:
    """Independent reference: geometric-mean speed-up base/arm and Welch's p on the logs (scipy)."""
    from scipy import stats as sps

    la, lb = [-math.log(x) for x in arm_steps], [-math.log(x) for x in base_steps]
    return math.exp(statistics.mean(la) - statistics.mean(lb)), float(sps.ttest_ind(la, lb, equal_var=False).pvalue)


def test_a_seed_at_the_target_at_initialisation_leaves_the_speedups_undefined(tmp_path, capsys):
    root = sweep(tmp_path, [{}, {"mlp.ratio": 3}])
    for job in (0, 1, 2):
        curve(root / str(job), falls(50))
    curve(root / "3", falls(0))  # seed 0 of the arm: at the target at step 0
    curve(root / "4", falls(25))
    curve(root / "5", falls(25))
    doc = run_compare(
        tmp_path, capsys, str(root), "--target", "val/loss=2", "--timing", timing(tmp_path, root, {0: 50, 3: 40})
    )
    base, arm = doc["targets"][0]["rows"]
    assert [h["step"] for h in arm["seeds"]] == [0, 25, 25] and arm["n_reached"] == 3
    for key in ("speedup_steps", "speedup_time"):  # was: steps 2.0 decided on 2 of the 3 seeds, wall dropped silently
        assert arm[key]["status"] == "not_measured" and arm[key]["effect"] is None and arm[key]["seeds"] == [0, 0]
        assert base[key]["status"] == "baseline"
    warning = (
        "warning: val/loss <= 2: 'mlp.ratio=3' met it at initialisation (before any training) in seed 0, so its "
        "speed-ups to it are not measured"
    )
    assert warning in capsys.readouterr().out
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert f"- {warning}" in md and "| mlp.ratio=3 | 3/3 | 16.7 ± 14.4 steps |" in md


def test_a_baseline_seed_at_the_target_at_initialisation_leaves_every_speedup_undefined(tmp_path, capsys):
    root = sweep(tmp_path, [{}, {"mlp.ratio": 3}])
    for job, cross in enumerate((0, 50, 50, 25, 25, 25)):
        curve(root / str(job), falls(cross))
    doc = run_compare(
        tmp_path, capsys, str(root), "--target", "val/loss=2", "--timing", timing(tmp_path, root, {0: 50, 3: 40})
    )
    base, arm = doc["targets"][0]["rows"]
    for row in (base, arm):
        assert row["speedup_steps"]["status"] == row["speedup_time"]["status"] == "not_measured"
    warning = (
        "warning: val/loss <= 2: 'mlp.ratio=4' met it at initialisation (before any training) in seed 0, so every "
    )
    assert f"{warning}arm's speed-up to it is not measured" in capsys.readouterr().out


def test_speedup_on_one_eval_is_held_against_the_evals_around_it(tmp_path, capsys):
    """Every seed crosses between the same two evals: the zero spread is the eval grid's, not the seeds'. The arm's
    crossing lies in (50, 75], the baseline's in (75, 100]: a speed-up anywhere in (1, 2), so undecided."""
    root = sweep(tmp_path, [{}, {"mlp.ratio": 3}])
    for job in (0, 1, 2):
        curve(root / str(job), falls(100))
    for job in (3, 4, 5):
        curve(root / str(job), falls(75))
    path = timing(tmp_path, root, {0: 50, 3: 50})  # two models timed alike: the time ratio is the steps' ratio
    doc = run_compare(tmp_path, capsys, str(root), "--target", "val/loss=2", "--timing", path)
    step_s = timed_step_s(path)
    arm = doc["targets"][0]["rows"][1]
    assert [(h["prev_step"], h["step"]) for h in arm["seeds"]] == [(50, 75)] * 3
    assert [h["prev_time_s"] for h in arm["seeds"]] == [pytest.approx(50 * step_s["job3"])] * 3
    v = arm["speedup_steps"]  # was: 1.3333 [1.3333, 1.3333] p 0 decided
    assert v["effect"] == pytest.approx(100 / 75) and v["p"] == 0.0 and v["status"] == "unresolved"
    w = arm["speedup_time"]  # the same bracket, in time: p dropped with the interval widened by the timing's
    assert w["effect"] == pytest.approx(100 / 75 * step_s["job0"] / step_s["job3"]) and w["status"] == "unresolved"
    assert v["direction"] == w["direction"] == 0
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "| 1.33× [1.33, 1.33] undecided (the evals around the reading could flip it) |" in md
    assert "least favourable to it" in md


def test_speedup_from_eval_placement_alone_is_unresolved(tmp_path, capsys):
    """Identical curves crossing between steps 25 and 31; the arm recorded evals at 31 and 32 (train.eval_flops
    plans evals per arm), the baseline at 36 and 37: 36 / 31 is where the evals fell, not a speed-up."""
    root = sweep(tmp_path, [{}, {"mlp.ratio": 3}])
    grid = {s: 4.0 if s < 30 else 1.5 for s in (0, 25, 50, 75, 100)}
    for job in (0, 1, 2):
        curve(root / str(job), {**grid, 36: 1.5, 37: 1.5})
    for job in (3, 4, 5):
        curve(root / str(job), {**grid, 31: 1.5, 32: 1.5})
    doc = run_compare(tmp_path, capsys, str(root), "--target", "val/loss=2")
    base, arm = doc["targets"][0]["rows"]
    assert [h["step"] for h in base["seeds"]] == [36] * 3 and [h["step"] for h in arm["seeds"]] == [31] * 3
    v = arm["speedup_steps"]  # was: 1.1613 decided, p 0
    assert v["effect"] == pytest.approx(36 / 31) and v["status"] == "unresolved"


def test_speedups_that_survive_their_brackets_stay_decided(tmp_path, capsys):
    """Evals every 10 steps; seeds spread: the arm's worst ends (its hit evals) still beat the baseline's best
    (the evals before its hits), so the verdicts and their numbers are those of the plain Welch test; in time, that
    test's interval widened by the timed step-time ratio's own (the half-widths added on the logs)."""
    root = sweep(tmp_path, [{}, {"mlp.ratio": 3}])
    base_hits, arm_hits = (80, 90, 80), (40, 40, 50)
    for job, cross in enumerate(base_hits + arm_hits):
        curve(root / str(job), falls(cross, every=10), wall=0.05)
    path = timing(tmp_path, root, {0: 50, 3: 20})
    doc = run_compare(tmp_path, capsys, str(root), "--target", "val/loss=2", "--timing", path)
    step_s = timed_step_s(path)
    arm, row = doc["targets"][0]["rows"][1], doc["rows"][1]
    effect, p = _log_ratio_test(list(arm_hits), list(base_hits))
    worst_effect, worst_p = _log_ratio_test([40, 40, 50], [70, 80, 70])  # arm at its slowest, baseline its quickest
    assert worst_effect > 1 and worst_p < 0.05  # the reference: robust to the brackets
    v = arm["speedup_steps"]
    assert (v["status"], v["direction"]) == ("decided", 1)
    assert v["effect"] == pytest.approx(effect) and v["p"] == pytest.approx(p)
    scale = step_s["job0"] / step_s["job3"]  # ~2.5: the arm's timed step is faster
    speed = row["speed"]  # the timed tokens/s ratio of the rounds, with its interval
    low, high = (x / speed["effect"] for x in speed["interval"])
    lo, hi = v["interval"]
    w = arm["speedup_time"]
    assert (w["status"], w["direction"], w["p"]) == ("decided", 1, None)
    assert w["effect"] == pytest.approx(effect * scale)
    assert w["interval"] == [pytest.approx(lo * scale * low), pytest.approx(hi * scale * high)]
    assert low < 1 < high


def test_time_speedup_within_its_eval_bracket_is_unresolved(tmp_path, capsys):
    """Both arms cross between steps 25 and 50 and the arm's timed step is 25% faster: its time to target lies in
    (1.0, 2.0] s against the baseline's (1.25, 2.5] s, so the 1.25× could be either way."""
    root = sweep(tmp_path, [{}, {"mlp.ratio": 3}])
    for job in range(6):
        curve(root / str(job), falls(50))
    path = timing(tmp_path, root, {0: 50, 3: 40})
    doc = run_compare(tmp_path, capsys, str(root), "--target", "val/loss=2", "--timing", path)
    step_s = timed_step_s(path)
    arm = doc["targets"][0]["rows"][1]
    assert arm["speedup_steps"]["status"] == "within_noise"  # both at step 50: 1.00×, unchanged
    w = arm["speedup_time"]  # was, from the runs' clocks: decided faster
    assert w["effect"] == pytest.approx(step_s["job0"] / step_s["job3"]) and w["effect"] == pytest.approx(1.25, 0.01)
    assert w["status"] == "unresolved"


def test_time_speedup_under_load_carries_the_caveat_wherever_it_is_shown(tmp_path, capsys):
    """A timed arm whose windows ran under outside load: its time-to-target speed-up says so in the table."""
    root = sweep(tmp_path, [{}, {"mlp.ratio": 3}])
    for job, cross in enumerate((80, 90, 80, 40, 40, 50)):
        curve(root / str(job), falls(cross, every=10))
    arms = {f"job{j}": (root / str(j), f"fp-{j}") for j in (0, 3)}
    rates = {"job0": [2560.0 * (1 + d) for d in JITTER], "job3": [6400.0 * (1 + d) for d in JITTER]}
    rates["job0#2"] = [x * (1 - 2 * d) for x, d in zip(rates["job0"], JITTER)]
    path = write_timing(tmp_path / "timing", arms, rates, loads={"job3": 0.9})
    doc = run_compare(tmp_path, capsys, str(root), "--target", "val/loss=2", "--timing", str(path))
    w = doc["targets"][0]["rows"][1]["speedup_time"]
    assert w["caveats"] == ["under_load"]
    md = (tmp_path / "out" / "comparison.md").read_text()
    line = next(x for x in md.splitlines() if x.startswith("| mlp.ratio=3 | 3/3 |"))
    assert line.rstrip(" |").endswith("under outside load")
