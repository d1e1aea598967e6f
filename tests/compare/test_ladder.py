"""A scale ladder: gptlab-sweep --ladder runs every arm at every size in one launch into <arm>/<rung>/seed<k>;
gptlab/compare/studies/ladder.py fits each arm's power law, calls the gap to the baseline (grows / shrinks / crosses over /
steady) and checks the ranking at every rung, on synthetic run dirs with planted answers and one real tiny sweep."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from gptlab.cli.compare import main as compare_main
from gptlab.cli.sweep import main as sweep_main
from gptlab.compare.render.ladder import format_report, plot
from gptlab.compare.statistics.verdict import Trend
from gptlab.compare.studies.ladder import fit_offset, fit_power_law, read_ladder, report
from gptlab.errors import ConfigError
from gptlab.sweep.design import parse_ladder, rungs
from helpers.cli import cli_env, run_cli

SIZES = {"d_model32": 1e5, "d_model64": 4e5, "d_model128": 1.6e6, "d_model256": 6.4e6}
NOISE = (-0.008, 0.002, 0.006)  # per seed: a scatter the fits and intervals must see through


def fake_ladder(root: Path, laws: dict, sizes: dict = SIZES, noise=NOISE, fingerprint=lambda rung: "data") -> Path:
    """laws: {arm: L(N)}; one finished run per arm x rung x seed with the planted loss plus the seed's noise."""
    root.mkdir(parents=True, exist_ok=True)
    spec = {"arms": {a: [] for a in laws}, "ladder": {"model.d_model": [r.removeprefix("d_model") for r in sizes]}}
    (root / "sweep.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    for arm, law in laws.items():
        for rung, n in sizes.items():
            for seed, eps in enumerate(noise):
                run = root / arm / rung / f"seed{seed}"
                run.mkdir(parents=True)
                summary = {
                    "status": "finished", "final_val_loss": law(n) + eps, "params_non_embedding": n,
                    "flops_per_token": 6 * n, "data_fingerprint": fingerprint(rung), "seq_len": 64,
                }  # fmt: skip
                (run / "summary.json").write_text(json.dumps(summary))
    return root


def base_law(n: float) -> float:
    return 12.0 * n**-0.1


def test_power_law_recovered_gap_grows_and_c_is_said_unidentifiable(tmp_path):
    # the arm's gap opens by +0.03 per doubling of size: planted "grows"
    laws = {"base": base_law, "worse": lambda n: base_law(n) + 0.02 + 0.03 * math.log2(n / 1e5)}
    doc = report(read_ladder(fake_ladder(tmp_path, laws)))
    base, worse = doc["arms"]
    fit = base["power_law"]
    assert fit["b_lo"] < 0.1 < fit["b_hi"] and abs(fit["b"] - 0.1) < 0.005 and fit["df_resid"] == 10
    assert base["range"] == [1e5, 6.4e6]
    gap = worse["gap"]
    assert gap["trend"] is Trend.GROWS
    slope, lo, hi = gap["slope_per_doubling"]
    assert lo < 0.03 < hi and lo > 0  # the interval holds the planted slope and excludes zero
    assert not base["offset"]["identifiable"]  # a pure power law: no floor c to find
    assert doc["ranking"]["same_at_every_rung"] and doc["ranking"]["per_rung"]["d_model32"] == ["base", "worse"]
    text = format_report(doc)
    assert "gap vs base: grows" in text and "nothing is extrapolated" in text and "ranking: the same" in text


def test_a_crossing_gap_and_a_ranking_change_are_found(tmp_path):
    # "late" is 0.15 worse at the smallest rung, 0.05 better per doubling... until it wins: planted crossing
    laws = {
        "base": base_law,
        "late": lambda n: base_law(n) + 0.15 - 0.05 * math.log2(n / 1e5),
        "same": lambda n: base_law(n) + 0.001,  # within noise everywhere: no trend
    }
    doc = report(read_ladder(fake_ladder(tmp_path, laws)))
    by = {a["arm"]: a for a in doc["arms"]}
    assert by["late"]["gap"]["trend"] is Trend.CROSSES_OVER
    assert by["same"]["gap"]["trend"] is Trend.STEADY
    rank = doc["ranking"]
    assert not rank["same_at_every_rung"]
    swap = next(s for s in rank["swaps"] if s["pair"] == ["base", "late"])
    assert swap["decided"] and swap["rungs"][0] == "d_model32"
    assert rank["per_rung"]["d_model256"][0] == "late"
    assert "ranking CHANGES with size" in format_report(doc)
    assert plot(read_ladder(tmp_path), doc, tmp_path / "ladder.png").stat().st_size > 5000


def test_an_arm_missing_at_one_rung_is_not_a_ranking_change(tmp_path):
    """The order of every pair is the same wherever both ran; one arm's absence at a rung was reported as
    "ranking CHANGES with size" with no swap to name."""
    import shutil

    laws = {"base": base_law, "worse": lambda n: base_law(n) + 0.05}
    root = fake_ladder(tmp_path, laws)
    shutil.rmtree(root / "worse" / "d_model64")
    doc = report(read_ladder(root))
    rank = doc["ranking"]
    assert rank["same_at_every_rung"] and rank["swaps"] == [] and rank["missing"] == {"d_model64": ["worse"]}
    line = next(x for x in format_report(doc).splitlines() if x.startswith("ranking"))
    assert (
        line == "ranking: the same at every rung (base < worse), where both arms of a pair ran (worse not at d_model64)"
    )


def test_a_shrinking_gap(tmp_path):
    laws = {"base": base_law, "close": lambda n: base_law(n) + 0.2 - 0.02 * math.log2(n / 1e5)}
    doc = report(read_ladder(fake_ladder(tmp_path, laws)))
    assert doc["arms"][1]["gap"]["trend"] is Trend.SHRINKS  # 0.2 -> 0.08 over the range: narrows, never crosses


def test_a_gap_narrowing_past_zero_shrinks_and_may_cross(tmp_path):
    """-0.100 -> +0.005 over the range: the slope is positive and so is the last gap, which read "grows" when the
    trend compared their signs; |gap| narrows, and the fitted gap changes sign (the last one undecided)."""
    laws = {"base": base_law, "closing": lambda n: base_law(n) - 0.1 + 0.0175 * math.log2(n / 1e5)}
    gap = report(read_ladder(fake_ladder(tmp_path, laws)))["arms"][1]["gap"]
    first, last = gap["gap_at_smallest"], gap["gap_at_largest"]
    assert first[2] < 0 and last[1] < 0 < last[2] and gap["slope_per_doubling"][1] > 0
    assert gap["trend"] is Trend.SHRINKS_MAY_CROSS


def test_offset_fitted_only_when_identifiable():
    sizes = [1e5, 3e5, 1e6, 3e6, 1e7, 3e7]
    losses = [5.0 * (n / 1e5) ** -0.4 + 1.5 + e for n, e in zip(sizes, (0.002, -0.001, 0.001, -0.002, 0.0, 0.001))]
    fit = fit_offset(sizes, losses)
    assert fit["identifiable"] and abs(fit["c"] - 1.5) < 0.05 and abs(fit["b"] - 0.4) < 0.05
    three = fit_offset(sizes[:3], losses[:3])
    assert not three["identifiable"] and "needs 4+" in three["why"]
    assert fit_power_law([1e5, 1e5], [3.0, 3.1]) == {"fitted": False, "why": "fewer than 2 sizes"}


def test_flops_as_size_and_refusals(tmp_path):
    laws = {"base": base_law, "other": lambda n: base_law(n) + 0.05}
    ladder = read_ladder(fake_ladder(tmp_path / "a", laws), x="flops")
    assert report(ladder)["arms"][0]["range"] == [6e5, 3.84e7]
    # a rung whose arms were scored on different validation sets is refused, naming the rung
    mixed = fake_ladder(tmp_path / "b", laws)
    bad = mixed / "other" / "d_model64" / "seed0" / "summary.json"
    bad.write_text(json.dumps({**json.loads(bad.read_text()), "data_fingerprint": "other-data"}))
    with pytest.raises(ConfigError, match="^rung d_model64: runs differ in data_fingerprint"):
        read_ladder(mixed)
    with pytest.raises(ConfigError, match="no finished ladder runs"):
        read_ladder(tmp_path)
    with pytest.raises(ConfigError, match="allowed: params, flops"):
        read_ladder(tmp_path / "a", x="tokens")


def test_ladder_syntax_and_rung_names():
    assert parse_ladder(["model.d_model=64,128"]) == {"model.d_model": ["64", "128"]}
    both = parse_ladder({"model.d_model": [64, 128], "model.n_layer": [2, 4]})
    assert [(r.name, r.overrides) for r in rungs(both)] == [
        ("d_model64-n_layer2", ("model.d_model=64", "model.n_layer=2")),
        ("d_model128-n_layer4", ("model.d_model=128", "model.n_layer=4")),
    ]
    assert [r.name for r in rungs(parse_ladder("model=tiny,gpt2"))] == ["tiny", "gpt2"]
    for bad, words in (
        ("model.block_size=64,128", "not a size key"),
        ("model.d_model=64", "at least 2"),
        ("model.d_model=64,64", "twice"),
        ("model.d_model=64,x", "positive integers"),
        ("d_model", "allowed: KEY=V1,V2"),
    ):
        with pytest.raises(ConfigError, match=words):
            parse_ladder([bad])
    with pytest.raises(ConfigError, match="same number of values"):
        parse_ladder(["model.d_model=64,128", "model.n_layer=2,4,6"])


def _sweep_file(tmp_path: Path, arms: dict, overrides: list[str] | None = None, **extra) -> Path:
    path = tmp_path / "mini.yaml"
    spec = {"seeds": [0, 1], "overrides": overrides or ["model.n_layer=1", "model.n_head=2"], "arms": arms, **extra}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_dry_run_plans_every_arm_at_every_rung_in_one_launch(tmp_path, capsys):
    path = _sweep_file(
        tmp_path, {"mha": ["attention=mha"], "mqa": ["attention=mqa"]}, ladder={"model.d_model": [32, 64]}
    )
    out = tmp_path / "out"
    assert sweep_main([str(path), "--out", str(out), "--dry-run"]) == 0
    text = capsys.readouterr().out
    lines = [line for line in text.splitlines() if ": gptlab-train " in line]
    dirs = sorted(line.split("hydra.run.dir=")[1].removeprefix(f"{out}/") for line in lines)
    assert dirs == sorted(f"{a}/d_model{d}/seed{s}" for a in ("mha", "mqa") for d in (32, 64) for s in (0, 1))
    assert all(line.count("model.d_model=") == 1 for line in lines)
    assert "local queue: 8 runs" in text and not out.exists()  # one launch; a dry run writes nothing
    # --ladder on the command line replaces the file's; the sweep's own size is replaced (and said so)
    path = _sweep_file(tmp_path, {"mha": []}, ["model.n_layer=1", "model.n_head=2", "model.d_model=48"])
    assert sweep_main([str(path), "--out", str(out), "--dry-run", "--ladder", "model.d_model=16,32,64"]) == 0
    text = capsys.readouterr().out
    assert "the ladder's model.d_model replaces model.d_model=48" in text and "local queue: 6 runs" in text


@pytest.mark.parametrize(
    "args, arms, extra, words",
    [
        (["--ladder", "model.d_model=32,64"], {"a": ["model.d_model=128"]}, {}, "arm 'a' sets model.d_model=128"),
        (["--ladder", "model.seq=1,2"], {"a": []}, {}, "not a size key"),
        (["--factorial"], {"a": []}, {}, "has no 'factors:'"),
        (
            ["--ladder", "model=tiny,gpt2"],
            {"a": []},
            {"overrides": [
                "model.n_layer=1", "model.n_head=2", "model.d_model=32", "model.block_size=32", "model.bias=false"
            ]},
            "rungs tiny and gpt2 build the same model",
        ),
    ],
)  # fmt: skip
def test_bad_ladder_or_factorial_is_one_line_and_writes_nothing(tmp_path, capsys, args, arms, extra, words):
    overrides = extra.get("overrides")
    path = _sweep_file(tmp_path, arms, overrides)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        sweep_main([str(path), "--out", str(out), *args])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and err.count("\n") == 0 and err.startswith("error: ") and words in err, err
    assert not out.exists()


def test_compare_auto_detects_a_ladder_sweep_and_writes_its_files(tmp_path, capsys):
    sweep = fake_ladder(tmp_path / "s", {"base": base_law, "b": lambda n: base_law(n) + 0.05})
    done = run_cli("gptlab.cli.compare", str(sweep))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("scale ladder: 2 arms x 4 rungs") and "gap vs base: steady" in done.stdout
    doc = json.loads((sweep / "comparison" / "ladder.json").read_text())
    assert doc["rungs"] == list(SIZES) and (sweep / "comparison" / "ladder.png").stat().st_size > 5000
    capsys.readouterr()
    assert compare_main([str(sweep), "--baseline", "b", "--out", str(tmp_path / "o")]) == 0  # in-process from here
    assert json.loads((tmp_path / "o" / "ladder.json").read_text())["baseline"] == "b"
    for args, words in (
        ([str(tmp_path / "s" / "base"), "--ladder"], "no finished ladder runs"),
        ([str(sweep), "--step", "5"], "--step does not apply"),
        ([str(sweep), "--baseline", "x"], "arms: base, b"),
    ):
        capsys.readouterr()
        assert compare_main(args) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and words in err, err


@pytest.mark.slow  # 8 tiny real runs through the local queue, then compare (~1-2 min on 2 loaded cores)
def test_a_two_rung_two_arm_two_seed_ladder_end_to_end(tmp_path):
    spec = {
        "seeds": [0, 1],
        "overrides": [
            "model.n_layer=1", "model.n_head=2", "model.block_size=32", "train.batch_size=8", "train.eval_sequences=16",
            "sample.tokens=0", "logger=none", "hardware.dtype=fp32", "train.max_steps=20", "train.eval_interval=10",
        ],
        "ladder": {"model.d_model": [16, 48]},
        "arms": {"mha": ["attention=mha"], "mqa": ["attention=mqa"]},
    }  # fmt: skip
    path = tmp_path / "ladder.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp_path / "out"
    done = run_cli("gptlab.cli.sweep", str(path), "--out", str(out), env=cli_env(OMP_NUM_THREADS="1"), timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "local queue: 8 runs" in done.stdout  # one launch for arm x rung x seed
    assert sorted(p.relative_to(out).as_posix() for p in out.glob("*/*/seed*")) == [
        f"{a}/d_model{d}/seed{s}" for a in ("mha", "mqa") for d in (16, 48) for s in (0, 1)
    ]
    status = run_cli("gptlab.cli.sweep", "status", str(out))
    assert status.stdout.strip().splitlines()[-1] == "8 finished"
    shown = run_cli("gptlab.cli.compare", str(out))
    assert shown.returncode == 0, shown.stderr
    doc = json.loads((out / "comparison" / "ladder.json").read_text())
    assert doc["rungs"] == ["d_model16", "d_model48"] and [a["arm"] for a in doc["arms"]] == ["mha", "mqa"]
    sizes = [r["size"] for r in doc["arms"][0]["rungs"]]
    assert sizes[0] < sizes[1]  # the rungs' real non-embedding parameter counts, read from summary.json
    mqa = doc["arms"][1]
    assert mqa["rungs"][0]["size"] < sizes[0]  # MQA's K/V projections are smaller than MHA's at equal width
    assert mqa["gap"]["trend"] != Trend.NOT_MEASURED.value and "offset" in mqa and not mqa["offset"]["identifiable"]


def test_status_lists_every_rung_of_a_ladder_never_run(tmp_path):
    from gptlab.sweep.status import format_status, sweep_status

    rows = sweep_status(tmp_path, {"mha": [0, 1]}, None, ["d_model32", "d_model64"])
    assert sorted(r.name for r in rows) == [f"mha__d_model{d}__seed{s}" for d in (32, 64) for s in (0, 1)]
    assert format_status(rows).splitlines()[-1] == "4 never ran"
