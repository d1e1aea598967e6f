"""gptlab-compare's honesty: identical models are noise; the training runs' tokens/s are records (with their seed
spread and outside load), never a speed verdict, which only a timing session makes (--timing)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from gptlab.cli.compare import main
from gptlab.compare.render import words
from gptlab.compare.statistics import stats
from gptlab.compare.statistics.verdict import ratio
from helpers.compare import default_loss, speed_words, write_sweep, write_timing

FP_MHA, FP_OTHER = "0123456789abcdef", "fedcba9876543210"


def _shifted(delta: float):
    return lambda step: default_loss(step) + delta


def _arm(seeds_tps: list[float], shifts: list[float], **kw) -> list[dict]:
    """One spec per seed: its own tokens/s and val-loss shift."""
    return [
        dict(seed=i, tokens_per_s=t, step_ms=128_000 / t, loss_at=_shifted(d), **kw)
        for i, (t, d) in enumerate(zip(seeds_tps, shifts))
    ]


def _compare(
    tmp_path: Path, capsys, specs: list[dict], *args, rates: dict[str, list[float]] | None = None
) -> tuple[dict, str, str]:
    """Write a sweep of specs, compare it; (comparison.json, comparison.md, stderr). `rates`: a timing session of the
    first run (arm "base") and the last one (arm "arm") with these per-round rates, given with --timing."""
    sweep = write_sweep(tmp_path / "sw", specs)
    if rates is not None:
        fps = [spec.get("fingerprint") or f"fp-{i}" for i, spec in enumerate((specs[0], specs[-1]))]
        arms = {"base": (sweep / "0", fps[0]), "arm": (sweep / str(len(specs) - 1), fps[1])}
        args = (*args, "--timing", str(write_timing(tmp_path / "timed", arms, rates)))
    out = tmp_path / "out"
    rc = main([str(sweep), "--out", str(out), "--no-wandb", *args])
    err = capsys.readouterr().err
    assert rc == 0, err
    return json.loads((out / "comparison.json").read_text()), (out / "comparison.md").read_text(), err


def _table(md: str) -> str:
    """The Markdown table's body rows (the notes below it explain every verdict word)."""
    return "\n".join(line for line in md.splitlines() if line.startswith("| attention"))


GQA4 = dict(choices={"attention": "gqa"}, leaves={"attention.n_kv_head": 4})
GQA4_LABEL = "attention=gqa, attention.n_kv_head=4"


TWIN_RATES = {"base": [1000.0, 990.0, 1010.0], "base#2": [1004.0, 985.0, 1012.0], "arm": [998.0, 993.0, 1006.0]}


def test_identical_models_are_flagged_and_every_difference_is_noise(tmp_path, capsys):
    """The issue's case: attention=gqa with n_kv_head == n_head is MHA; a 0.73x 'speed-up' of its training runs is
    load noise: a record, never a verdict; timed alone, the twin is the identical model."""
    specs = _arm([1000, 1002, 998], [0.0, 0.001, 0.002], fingerprint=FP_MHA, data_fingerprint="shakespeare:x")
    specs += _arm([730, 731, 729], [0.05, 0.051, 0.052], fingerprint=FP_MHA, data_fingerprint="shakespeare:x", **GQA4)
    doc, md, err = _compare(tmp_path, capsys, specs, "--baseline", "attention=mha")
    base, twin = doc["rows"]
    assert twin["label"] == GQA4_LABEL and twin["identical_to"] == ["attention=mha"]
    assert base["identical_to"] == [GQA4_LABEL] and twin["model_fingerprint"] == FP_MHA
    # Welch's test alone would call the loss gap real (p << 0.05); identical models make it noise.
    assert twin["p_value"] < 0.05 and twin["significant"] is False
    assert f"| {twin['delta_val_loss']:+.4f} within noise (identical model) |" in md and "| = attention=mha |" in md
    # the training runs' 0.73x is shown as what it is, a record, and makes no speed verdict
    assert twin["tokens_per_s_gmean"] == pytest.approx(730, rel=1e-3) and "730 ×/÷ 1.001" in _table(md)
    assert twin["speedup"] is None and speed_words(twin) == "not timed" and "| not timed |" in _table(md)
    assert "faster" not in _table(md) and "slower" not in _table(md) and " significant (p=" not in md
    timed, md, _ = _compare(tmp_path / "timed", capsys, specs, "--baseline", "attention=mha", rates=TWIN_RATES)
    assert speed_words(timed["rows"][1]) == "within noise (identical model)"
    assert "| 1.00× within noise (identical model) |" in md  # no CI quoted for a gap that is not there
    assert (
        f"warning: 'attention=mha' and '{GQA4_LABEL}' build the identical model (fingerprint 0123456789abcdef) "
        "and differ only in model config: every difference between them is noise"
    ) in err


def test_same_model_under_another_optimizer_setting_is_a_real_experiment(tmp_path, capsys):
    """lr arms build the same model but train it differently: not flagged, verdicts as usual."""
    specs = _arm([1000, 1001], [0.0, 0.001], fingerprint=FP_MHA)
    specs += _arm([1000, 1001], [0.2, 0.201], fingerprint=FP_MHA, leaves={"optimizer.lr": 0.01})
    doc, md, err = _compare(tmp_path, capsys, specs)
    assert [r["identical_to"] for r in doc["rows"]] == [[], []]
    assert doc["rows"][1]["significant"] is True and "identical" not in md + err


def test_different_fingerprints_data_or_older_runs_are_not_flagged(tmp_path, capsys):
    specs = _arm([1000, 1001], [0.0, 0.001], fingerprint=FP_MHA)
    specs += _arm([1200, 1201], [0.1, 0.101], fingerprint=FP_OTHER, **GQA4)
    specs += _arm([1200, 1201], [0.1, 0.101], choices={"attention": "mqa"})  # older runs: no fingerprint
    doc, md, _ = _compare(tmp_path, capsys, specs, "--baseline", "attention=mha")
    assert [r["identical_to"] for r in doc["rows"]] == [[], [], []]
    assert [r["model_fingerprint"] for r in doc["rows"]] == [FP_MHA, FP_OTHER, None]
    assert "identical model" not in md
    again = _arm([1000, 1001], [0.0, 0.001], fingerprint=FP_MHA, data_fingerprint="text:aaa")
    again += _arm([1000, 1001], [0.0, 0.001], fingerprint=FP_MHA, data_fingerprint="text:bbb", **GQA4)
    # same model, other tokens: not one experiment, and since the val losses are on different validation sets
    # not one table either (gptlab-compare refuses; --split-by gives one table per data fingerprint)
    sweep = write_sweep(tmp_path / "data" / "sw", again)
    assert main([str(sweep), "--out", str(tmp_path / "data" / "out"), "--no-wandb"]) == 2
    assert "runs differ in data_fingerprint (text:aaa in 0, text:bbb in 2)" in capsys.readouterr().err
    out = tmp_path / "data" / "split"
    assert main([str(sweep), "--out", str(out), "--no-wandb", "--split-by", "data_fingerprint"]) == 0
    for part in ("data_fingerprint=text_aaa", "data_fingerprint=text_bbb"):
        doc = json.loads((out / part / "comparison.json").read_text())
        assert [r["identical_to"] for r in doc["rows"]] == [[]] and doc["rows"][0]["n_seeds"] == 2


def test_training_speed_is_a_record_over_seeds_and_the_speed_up_comes_from_the_timing(tmp_path, capsys):
    arm, base = [1200.0, 1250.0, 1300.0], [1000.0, 1010.0, 990.0]
    specs = _arm(base, [0.0, 0.01, 0.02]) + _arm(arm, [0.0, 0.01, 0.02], **GQA4)
    rates = {"base": [1000.0, 990.0, 1010.0], "base#2": [1004.0, 985.0, 1012.0], "arm": [1100.0, 1080.0, 1115.0]}
    doc, md, _ = _compare(tmp_path, capsys, specs, "--baseline", "attention=mha", rates=rates)
    b, a = doc["rows"]
    assert a["tokens_per_s"] == pytest.approx(statistics.mean(arm))
    assert a["tokens_per_s_std"] == pytest.approx(statistics.stdev(arm))
    assert a["step_ms"] == pytest.approx(statistics.mean(128_000 / t for t in arm))
    assert a["step_ms_std"] == pytest.approx(statistics.stdev(128_000 / t for t in arm))
    assert a["tokens_per_s_seeds"] == arm and speed_words(b) == "baseline" and b["speedup"] == 1.0
    # the table shows the training record as the geometric mean ×/÷ geometric sd, "during training"
    gmean, gsd = statistics.geometric_mean(arm), math.exp(statistics.stdev(math.log(t) for t in arm))
    assert a["tokens_per_s_gmean"] == pytest.approx(gmean) and a["tokens_per_s_gsd"] == pytest.approx(gsd)
    assert f"{gmean:,.0f} ×/÷ {gsd:.3f}" == "1,249 ×/÷ 1.041" and "1,249 ×/÷ 1.041" in md and "1,250 ± 50" not in md
    # the speed-up is the timing session's, paired per round: not the training runs' 1.25x
    paired = math.exp(
        statistics.mean(
            math.log(x / math.sqrt(b1 * b2)) for b1, b2, x in zip(rates["base"], rates["base#2"], rates["arm"])
        )
    )
    assert a["speedup"] == pytest.approx(paired) and speed_words(a) == "faster"
    assert a["timed_tokens_per_s"] == pytest.approx(1100.0) and f"{paired:.2f}× [" in _table(md)


@pytest.mark.parametrize(
    "arm, base, verdict",
    [
        ([900.0, 1300.0, 1100.0], [1000.0, 1200.0, 800.0], "within noise"),  # swings between seeds, as under load
        ([800.0, 801.0, 799.0], [1000.0, 1001.0, 999.0], "slower"),
        ([1001.0, 1000.0], [1000.0, 1001.0], "within noise"),
    ],
)
def test_speed_verdict_follows_the_seed_noise(arm, base, verdict):
    up = ratio("tokens_per_s", arm, base, 0.05)
    assert words.speed(up) == verdict and up.decided is (verdict != "within noise")
    assert up.interval[0] <= up.effect <= up.interval[1]
    assert (up.interval[0] > 1 or up.interval[1] < 1) is up.decided  # CI excludes 1 exactly when p < alpha
    if arm[0] == 900.0:
        assert up.effect == pytest.approx(1.1026451493121938) and up.p == pytest.approx(0.5706763711753546, rel=1e-6)
        assert up.interval == pytest.approx((0.7093917379638645, 1.7138997541632535), rel=1e-7)


def test_one_round_gives_a_speed_up_but_no_verdict(tmp_path, capsys):
    specs = _arm([1000.0], [0.0]) + _arm([1500.0], [0.0], **GQA4)
    doc, md, _ = _compare(tmp_path, capsys, specs, "--baseline", "attention=mha")
    row = doc["rows"][1]
    assert row["speedup"] is None and speed_words(row) == "not timed" and row["tokens_per_s_std"] is None
    rates = {"base": [1000.0], "base#2": [1010.0], "arm": [1500.0]}
    doc, md, _ = _compare(tmp_path / "timed", capsys, specs, "--baseline", "attention=mha", rates=rates)
    row = doc["rows"][1]
    assert row["speedup"] == pytest.approx(1500 / math.sqrt(1000 * 1010)) and row["speedup_ci"] is None
    assert row["speedup_p"] is None and speed_words(row) == "n/a: 1 round"
    assert "1.49× n/a: 1 round" in _table(md) and "faster" not in _table(md)


def test_training_speed_taken_under_outside_load_is_flagged_and_decides_nothing(tmp_path, capsys):
    specs = _arm([1000, 1001], [0.0, 0.001], outside_load=0.05)
    specs += [
        dict(seed=0, tokens_per_s=1500, outside_load=0.10, **GQA4),
        dict(seed=1, tokens_per_s=1510, outside_load=0.62, **GQA4),
    ]
    specs += _arm([1000, 1001], [0.0, 0.001], choices={"attention": "mqa"})  # older runs: no load recorded
    doc, md, err = _compare(tmp_path, capsys, specs, "--baseline", "attention=mha")
    base, loaded, old = doc["rows"]
    assert (base["outside_load"], base["under_load"]) == (0.05, False)
    assert (loaded["outside_load"], loaded["under_load"]) == (0.62, True)
    assert (old["outside_load"], old["under_load"]) == (None, False)
    assert md.count("(under load)") == 2  # tokens/s and step ms during training of the loaded group only
    assert (
        f"warning: '{GQA4_LABEL}': tokens/s during training taken under outside load (other processes used up to 62% "
        "of the cores in one of its runs; limit 25%): a record not to be trusted, which no verdict uses"
    ) in err
    # the caveat sits on the record: no row has a speed verdict, loaded or not
    assert [speed_words(r) for r in doc["rows"]] == ["not timed"] * 3 and "| under load |" in md


def test_seeds_with_different_fingerprints_warn_and_are_never_identical(tmp_path, capsys):
    specs = [dict(seed=0, fingerprint=FP_MHA), dict(seed=1, fingerprint=FP_OTHER)]
    specs += _arm([1000, 1001], [0.0, 0.001], fingerprint=FP_MHA, **GQA4)
    doc, _, err = _compare(tmp_path, capsys, specs, "--baseline", "attention=mha")
    assert doc["rows"][0]["model_fingerprint"] is None and doc["rows"][1]["identical_to"] == []
    assert "warning: 'attention=mha': its runs recorded different model fingerprints" in err


def test_t_critical_matches_reference_quantiles():
    # scipy.stats.t.ppf(0.975, df) and the normal limit.
    for df, ref in (
        (1, 12.706204736174694),
        (2, 4.302652729749462),
        (3.4, 2.9807735025586206),
        (30, 2.0422724563012378),
        (math.inf, 1.959963984540054),
    ):
        assert stats.t_critical(0.05, df) == pytest.approx(ref, rel=1e-9)
