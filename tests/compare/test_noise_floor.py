"""The machine's noise floor: an A/A sweep measures it, the user cache keeps it per machine (only when quiet), and
gptlab-compare uses it instead of the fixed outside-load heuristic for the training runs' records (their load flag,
peak memory), for this machine only, and says which it used. Speed verdicts are a timing session's, held against the
session's own A/A: a machine floor never judges one."""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

import pytest
import yaml

from gptlab.cli.compare import main as compare_main
from gptlab.compare.reading.runs import discover, load_run
from gptlab.compare.statistics import noise_floor
from gptlab.compare.statistics.noise_floor import FLOOR_FILE, RECORD_FILE, measure, measure_sweep
from gptlab.errors import ConfigError
from helpers.cli import cli_env, run_cli
from helpers.compare import speed_words, write_run, write_timing

CPU = "Test CPU 9000"
MACHINE = f"{CPU} | 2 cores"
GQA = dict(choices={"attention": "gqa"}, leaves={"attention.n_kv_head": 2})


def _provenance(path: Path, cpu: str = CPU, cores: int = 2) -> None:
    hardware = {"device": "cpu", "dtype": "fp32", "cpu": cpu, "cpu_threads": cores, "cpu_cores": list(range(cores))}
    (path / "provenance.json").write_text(json.dumps({"hardware": hardware, "packages": {"torch": "2.13.0"}}))


def _aa_sweep(root: Path, tps: dict[str, list[float]], load: float | None = 0.02, mems=None) -> Path:
    """An A/A sweep dir <root>/<arm>/seed<k> with the given tokens/s per arm and seed (same seed: same loss)."""
    for arm, values in tps.items():
        for seed, t in enumerate(values):
            mem = (mems or {}).get((arm, seed), 100 * 2**20)
            path = write_run(
                root / arm / f"seed{seed}",
                seed=seed,
                leaves={"arm": arm},
                tokens_per_s=t,
                step_ms=128_000 / t,
                outside_load=load,
                peak_mem_bytes=mem,
                loss_at=lambda step, s=seed: 1.5 + 2.5 * math.exp(-step / 40.0) + 0.01 * s,
            )
            _provenance(path)
    (root / "sweep.yaml").write_text(yaml.safe_dump({"arms": {a: [] for a in tps}, "aa": len(tps)}))
    return root


AA = {"aa0": [1000.0, 1010.0, 990.0], "aa1": [1030.0, 1020.0, 1040.0], "aa2": [1005.0, 995.0, 1000.0]}


def test_an_aa_sweep_measures_the_floor_with_known_answers(tmp_path):
    sweep = _aa_sweep(tmp_path / "aa", AA, mems={("aa1", 2): 104 * 2**20})
    floor = measure([load_run(p) for p in discover([str(sweep)])], sweep)
    every = [v for values in AA.values() for v in values]
    assert floor.machine == MACHINE and (floor.runs, floor.arms, floor.seeds) == (9, 3, 3)
    assert floor.speed_sd == pytest.approx(statistics.stdev(math.log(v) for v in every), rel=1e-12)
    assert floor.step_sd == pytest.approx(floor.speed_sd, rel=1e-9)  # step ms = 128000 / tokens/s
    gmeans = [statistics.geometric_mean(v) for v in AA.values()]
    assert floor.max_speedup == pytest.approx(max(gmeans) / min(gmeans), rel=1e-12)
    assert floor.same_seed_loss_gap == 0.0  # identical arms, one seed: one loss
    assert floor.loss_sd == pytest.approx(statistics.stdev([0.0, 0.01, 0.02] * 3), rel=1e-6)
    assert floor.mem_spread == pytest.approx(0.04) and floor.outside_load == 0.02 and floor.quiet


def test_a_quiet_floor_is_stored_for_its_machine_and_a_loaded_one_only_recorded(tmp_path):
    cache = tmp_path / "cache"
    lines = measure_sweep(_aa_sweep(tmp_path / "loaded", AA, load=0.3), cache)
    record = json.loads((tmp_path / "loaded" / RECORD_FILE).read_text())
    assert record["stored"] is False and record["quiet"] is False and record["outside_load"] == 0.3
    assert not (cache / FLOOR_FILE).exists() and "NOT stored" in lines[1] and "up to 30%" in lines[1]
    lines = measure_sweep(_aa_sweep(tmp_path / "unrecorded", AA, load=None), cache)
    assert not (cache / FLOOR_FILE).exists() and "not recorded" in lines[1]
    lines = measure_sweep(_aa_sweep(tmp_path / "quiet", AA, load=0.02), cache)
    table = json.loads((cache / FLOOR_FILE).read_text())
    assert list(table) == [MACHINE] and table[MACHINE]["runs"] == 9 and table[MACHINE]["quiet"] is True
    assert f"stored for {MACHINE}" in lines[1]
    assert json.loads((tmp_path / "quiet" / RECORD_FILE).read_text())["stored"] is True


@pytest.mark.parametrize(
    "tps, message",
    [
        ({"aa0": [1000.0, 1001.0]}, "needs >= 2 identical arms x 2 finished seeds (found 1 arms"),
        ({"aa0": [1000.0], "aa1": [1001.0]}, "(found 2 arms, 1 seeds in the smallest)"),
    ],
)
def test_too_small_an_aa_gives_no_floor(tmp_path, tps, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        measure_sweep(_aa_sweep(tmp_path / "aa", tps), tmp_path / "cache")
    assert not (tmp_path / "cache" / FLOOR_FILE).exists()


def _sweep(root: Path, base: list[float], arm: list[float], cpu: str = CPU, loads=(0.01, 0.01)) -> Path:
    """A 2-arm comparison (mha vs gqa) with these tokens/s per seed on `cpu`."""
    for i, t in enumerate(base):
        _provenance(write_run(root / "mha" / f"seed{i}", seed=i, tokens_per_s=t, outside_load=loads[0]), cpu)
    for i, t in enumerate(arm):
        _provenance(write_run(root / "gqa" / f"seed{i}", seed=i, tokens_per_s=t, outside_load=loads[1], **GQA), cpu)
    return root


def _compare(tmp_path: Path, sweep: Path, capsys, *args: str) -> tuple[dict, str]:
    out = tmp_path / f"out{len(list(tmp_path.glob('out*')))}"
    rc = compare_main([str(sweep), "--out", str(out), "--no-wandb", "--baseline", "attention=mha", *args])
    assert rc == 0, capsys.readouterr().err
    capsys.readouterr()
    return json.loads((out / "comparison.json").read_text()), (out / "comparison.md").read_text()


def _store_floor(tmp_path: Path, monkeypatch) -> noise_floor.Floor:
    cache = tmp_path / "cache"
    monkeypatch.setenv("GPTLAB_CACHE", str(cache))
    sweep = _aa_sweep(tmp_path / "aa", AA)
    measure_sweep(sweep, cache)
    return measure([load_run(p) for p in discover([str(sweep)])], sweep)


def test_compare_uses_the_floor_of_the_runs_machine_and_says_so(tmp_path, monkeypatch, capsys):
    floor = _store_floor(tmp_path, monkeypatch)
    # Seeds this tight would call a 3% gap of the training records real: neither they nor the floor judge speed now
    base, arm = [1000.0, 1001.0, 999.0], [1030.0, 1031.0, 1029.0]
    sweep = _sweep(tmp_path / "sw", base, arm)
    plain, md_plain = _compare(tmp_path, sweep, capsys, "--noise-floor", "none")
    assert speed_words(plain["rows"][1]) == "not timed" and plain["noise_floor"]["measured"] is None
    assert "Noise floor: default heuristic (--noise-floor none)" in md_plain
    doc, md = _compare(tmp_path, sweep, capsys)
    row = doc["rows"][1]
    assert speed_words(row) == "not timed" and row["speedup"] is None and row["speedup_p"] is None
    assert row["power"]["mde_speedup"] is None and row["power"]["speed_decision"] == "unknown: not timed"
    assert doc["noise_floor"]["measured"]["machine"] == MACHINE and doc["noise_floor"]["load_limit"] == 0.07
    assert f"Noise floor: measured on {floor.measured_at[:10]} with 9 runs (3 identical arms × 3 seeds" in md
    assert "Speed verdicts come from a timing session's own A/A, not from this floor." in md


def _rounds(base: list[float], aa: list[float], ratio: float) -> dict[str, list[float]]:
    """A session's rates: the baseline's two windows per round and an arm `ratio` times their geometric mean."""
    return {"mha": base, "mha#2": aa, "gqa": [ratio * math.sqrt(b * c) for b, c in zip(base, aa)]}


def test_a_speed_up_within_the_sessions_aa_is_within_its_floor(tmp_path, monkeypatch, capsys):
    """The timing session's own A/A is the floor of its speed-ups: a steady 0.5% in every round (p ~ 0) is no larger
    than the baseline's two windows differ, so it is never decided; a real 1.5x is."""
    _store_floor(tmp_path, monkeypatch)  # a stored machine floor changes nothing here
    base, aa = [1000.0, 1000.0, 1000.0, 1000.0, 1000.0], [1010.0, 990.0, 1012.0, 992.0, 1000.0]
    sweep = _sweep(tmp_path / "sw", [1000.0, 1001.0, 999.0], [1100.0, 1101.0, 1099.0])
    arms = {arm: (sweep / arm / "seed0", f"fp-{arm}") for arm in ("mha", "gqa")}
    timing = write_timing(tmp_path / "t1", arms, _rounds(base, aa, 1.005), machine=CPU)
    doc, md = _compare(tmp_path, sweep, capsys, "--timing", str(timing))
    row = doc["rows"][1]
    assert row["speedup"] == pytest.approx(1.005) and row["speedup_p"] < 0.05 and row["speed"]["floor"] > 1.005
    assert speed_words(row) == "within noise floor" and "within the timing session's A/A" in md
    assert row["power"]["speed_decision"] == "never: within the timing session's A/A"
    timing = write_timing(tmp_path / "t2", arms, _rounds(base, aa, 1.5), machine=CPU)
    doc, _ = _compare(tmp_path, sweep, capsys, "--timing", str(timing))
    assert speed_words(doc["rows"][1]) == "faster"  # a real 1.5x is still found


def test_a_floor_from_another_machine_is_never_used(tmp_path, monkeypatch, capsys):
    _store_floor(tmp_path, monkeypatch)
    base, arm = [1000.0, 1001.0, 999.0], [1030.0, 1031.0, 1029.0]
    doc, md = _compare(tmp_path, _sweep(tmp_path / "other", base, arm, cpu="Other CPU"), capsys)
    assert doc["noise_floor"]["measured"] is None and speed_words(doc["rows"][1]) == "not timed"
    assert "default heuristic (no floor measured for Other CPU | 2 cores)" in md
    mixed = _sweep(tmp_path / "mixed", base, arm)
    _provenance(mixed / "gqa" / "seed0", "Other CPU")
    doc, md = _compare(tmp_path, mixed, capsys)
    assert doc["noise_floor"]["measured"] is None and "default heuristic (the runs trained on different machines)" in md


def test_with_a_floor_the_load_limit_is_the_aa_conditions_not_25_percent(tmp_path, monkeypatch, capsys):
    _store_floor(tmp_path, monkeypatch)  # A/A at 2% load: limit 7%
    sweep = _sweep(tmp_path / "sw", [1000.0, 1010.0], [1500.0, 1490.0], loads=(0.01, 0.12))
    plain, _ = _compare(tmp_path, sweep, capsys, "--noise-floor", "none")
    assert plain["rows"][1]["under_load"] is False
    doc, md = _compare(tmp_path, sweep, capsys)
    assert doc["rows"][1]["under_load"] is True and "more than 7% of the machine's cores" in md
    # the flag is the training record's: no speed verdict is made of those runs, loaded or not
    assert [speed_words(d["rows"][1]) for d in (plain, doc)] == ["not timed", "not timed"]


def test_cpu_runs_forked_and_fresh_are_flagged_as_not_comparable_in_peak_memory(tmp_path, capsys):
    """A forked run's resident set leaves out the pages its fork server loaded (gptlab/runtime/forkserver.py): CPU
    runs started both ways are named once; runs on one start, GPU runs and runs that do not say pass silently."""

    def sweep(name: str, starts: dict[str, list], device: str = "cpu") -> Path:
        root = tmp_path / name
        for arm, arm_starts in starts.items():
            for i, start in enumerate(arm_starts):
                run = write_run(root / arm / f"seed{i}", seed=i, **(GQA if arm == "gqa" else {}))
                hardware = {"device": device} | ({} if start is None else {"process_start": start})
                (run / "provenance.json").write_text(json.dumps({"hardware": hardware}))
        return root

    _, mixed = _compare(tmp_path, sweep("mixed", {"mha": ["forked", "forked"], "gqa": ["forked", "fresh"]}), capsys)
    assert (
        "warning: peak memory: on the CPU 3 run(s) were forked from a warm interpreter (a local sweep's queue) and 1 "
        "started fresh; a forked run's resident set leaves out the library pages its server loaded (~50 MB), so "
        "their peak memory differs by how they started"
    ) in mixed
    for name, starts, device in (
        ("forked", {"mha": ["forked", "forked"], "gqa": ["forked", "forked"]}, "cpu"),
        ("older", {"mha": ["fresh", None], "gqa": [None, None]}, "cpu"),  # runs from before the record: unknown
        ("gpu", {"mha": ["forked", "fresh"], "gqa": ["fresh", "fresh"]}, "cuda"),  # torch's allocator: no pages
    ):
        assert "started fresh" not in _compare(tmp_path, sweep(name, starts, device), capsys)[1], name


def test_peak_memory_varying_between_seeds_is_flagged(tmp_path, capsys):
    root = tmp_path / "sw"
    for i, mem in enumerate((433, 498)):  # the two seeds of one config
        write_run(root / "mha" / f"seed{i}", seed=i, peak_mem_bytes=mem * 2**20)
    for i, mem in enumerate((400, 404)):  # within the default 5%
        write_run(root / "gqa" / f"seed{i}", seed=i, peak_mem_bytes=mem * 2**20, **GQA)
    doc, md = _compare(tmp_path, root, capsys)
    base, arm = doc["rows"]
    assert base["mem_varies"] is True and base["peak_mem_spread"] == pytest.approx(65 / 433)
    assert arm["mem_varies"] is False and arm["peak_mem_spread"] == pytest.approx(0.01)
    assert "warning: 'attention=mha': peak memory varies by 15.0% between its seeds" in md
    assert "peak mem varies" in md.split("\n| attention=mha")[1].splitlines()[0]


def test_the_floor_cache_is_the_data_cache(monkeypatch, tmp_path):
    from gptlab.data import default_cache_dir

    monkeypatch.setenv("GPTLAB_CACHE", str(tmp_path))
    assert noise_floor.cache_dir() == default_cache_dir() == tmp_path
    monkeypatch.delenv("GPTLAB_CACHE")
    assert noise_floor.cache_dir() == default_cache_dir()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--aa-arms", "1"], "error: aa: '1'; allowed: true, or a number of identical arms from 2 to 20"),
        (["--aa", "--seeds", "0"], "error: aa: seeds [0]: an A/A needs >= 2 seeds per arm"),
        (["--aa", "--lr-grid", "1e-3,3e-3"], "error: aa: an A/A sweep repeats one config; drop the ladder / lr grid"),
    ],
)
def test_bad_aa_is_refused_in_one_line(tmp_path, args, message):
    out = tmp_path / "sw"
    proc = run_cli("gptlab.cli.sweep", "attention", *args, "--out", str(out), "--dry-run", env=cli_env())
    assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_aa_repeats_the_baseline_arm(tmp_path):
    out = tmp_path / "sw"
    proc = run_cli(
        "gptlab.cli.sweep", "attention", "--aa", "--seeds", "0,1", "--out", str(out), "--dry-run", env=cli_env()
    )
    assert proc.returncode == 0, proc.stderr
    planned = [line for line in proc.stdout.splitlines() if "__seed" in line]
    names = [line.split(":")[0] for line in planned]
    assert sorted(names) == [f"[attention] aa{a}__seed{s}" for a in range(3) for s in (0, 1)]
    assert [n.endswith("seed0") for n in names] == [True] * 3 + [False] * 3  # interleaved: seed-major
    assert all("attention=mha" in line and "identical model" not in line for line in planned)  # mha is the first arm
    assert "identical model" not in proc.stdout  # identical arms are the point of an A/A


@pytest.mark.slow
def test_a_real_aa_sweep_end_to_end(tmp_path):
    """gptlab-sweep aa on a tiny model: 2 identical arms x 2 seeds, then the floor (stored only if the machine was
    quiet) and gptlab-compare reading it back for this machine."""
    out, cache = tmp_path / "aa", tmp_path / "cache"
    env = cli_env(GPTLAB_CACHE=str(cache))
    tiny = ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.block_size=32", "train.batch_size=2"]
    steps = ["train.max_steps=8", "train.eval_interval=4", "train.log_interval=1", "train.eval_sequences=4"]
    steps.append("train.speed_warmup=2")  # the load is measured over the timed steps: some must follow the warm-up
    proc = run_cli(
        "gptlab.cli.sweep",
        "aa",
        "--aa-arms",
        "2",
        "--seeds",
        "0,1",
        "--out",
        str(out),
        *tiny,
        *steps,
        "schedule.warmup_steps=1",
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads((out / RECORD_FILE).read_text())
    assert (record["runs"], record["arms"], record["seeds"]) == (4, 2, 2)
    assert record["same_seed_loss_gap"] == 0.0  # one config, one seed: the same loss on this CPU
    assert record["speed_sd"] > 0 and record["max_speedup"] >= 1.0 and record["outside_load"] is not None
    quiet = record["outside_load"] <= noise_floor.QUIET_LOAD
    assert record["stored"] is quiet and (cache / FLOOR_FILE).exists() is quiet
    assert ("noise floor stored for" in proc.stdout) is quiet and ("NOT stored" in proc.stdout) is not quiet
    proc = run_cli("gptlab.cli.compare", str(out), "--no-wandb", env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((out / "comparison" / "comparison.json").read_text())
    assert doc["noise_floor"]["measured"]["runs"] == 4  # an A/A dir's own report shows its floor, quiet or not


def test_html_lists_the_compared_runs_and_the_settings_they_share(tmp_path, capsys):
    sweep = _sweep(tmp_path / "sw", [1000.0, 1001.0], [1200.0, 1201.0])
    (sweep / "gqa" / "seed1" / "wandb_run_id").write_text("abc123\n")
    out = tmp_path / "out"
    assert compare_main([str(sweep), "--out", str(out), "--no-wandb", "--baseline", "attention=mha"]) == 0
    page = (out / "comparison.html").read_text()
    runs = page[page.index("<h2>Compared runs</h2>") :]
    assert f"Run dirs under {sweep}" in runs
    rows = re.findall(r"<tr><td>([^<]*)</td><td>(\d+)</td><td>([^<]*)</td><td>([^<]*)</td><td>([^<]*)</td></tr>", runs)
    assert rows == [
        ("attention=mha", "0", "mha/seed0", "–", "1%"),
        ("attention=mha", "1", "mha/seed1", "–", "1%"),
        ("attention=gqa, attention.n_kv_head=2", "0", "gqa/seed0", "–", "1%"),
        ("attention=gqa, attention.n_kv_head=2", "1", "gqa/seed1", "run id abc123", "1%"),
    ]
    shared = re.findall(r"<li>([^<]*)</li>", runs[runs.index('<ul class="shared">') :])
    # the model's size, the optimizer and its lr first (a reader asks "how big, at what lr?"), then the budget
    assert shared[:6] == [
        "model: tiny",
        "model.n_layer: 2",
        "model.d_model: 64",
        "model.n_head: 4",
        "optimizer: adamw",
        "optimizer.lr: not recorded",  # these synthetic runs record no optimizer.lr: said so, not guessed
    ]
    assert "train.max_steps: 100" in shared and "train.batch_size: 4" in shared and "tokens_per_step: 128" in shared
    assert "data: shakespeare" in shared and "data_seed: 1234" in shared and "train.eval_sequences: 16" in shared


def test_the_floor_s_memory_spread_is_the_limit(tmp_path, monkeypatch, capsys):
    floor = _store_floor(tmp_path, monkeypatch)  # identical runs within 0% (all 100 MiB)
    assert floor.mem_spread == 0.0
    root = tmp_path / "sw"
    for i, mem in enumerate((400, 404)):  # 1%: within the default 5%, beyond this machine's 0%
        _provenance(write_run(root / "mha" / f"seed{i}", seed=i, peak_mem_bytes=mem * 2**20))
        _provenance(write_run(root / "gqa" / f"seed{i}", seed=i, peak_mem_bytes=400 * 2**20, **GQA))
    plain, _ = _compare(tmp_path, root, capsys, "--noise-floor", "none")
    doc, _ = _compare(tmp_path, root, capsys)
    assert plain["rows"][0]["mem_varies"] is False and doc["rows"][0]["mem_varies"] is True
    assert doc["rows"][1]["mem_varies"] is False  # equal peaks are never flagged


def test_runs_that_are_not_one_config_give_no_floor(tmp_path):
    sweep = _aa_sweep(tmp_path / "aa", AA)
    _provenance(write_run(sweep / "aa2" / "seed2", seed=2, leaves={"arm": "aa2", "mlp.ratio": 2}))
    with pytest.raises(ConfigError, match=r"differs from .* in mlp.ratio: an A/A's runs must be one config"):
        measure_sweep(sweep, tmp_path / "cache")
    assert not (tmp_path / "cache" / FLOOR_FILE).exists()


def test_a_floor_given_by_path_is_used_with_the_load_it_was_measured_under(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GPTLAB_CACHE", str(tmp_path / "cache"))  # an empty store: auto finds no floor
    loaded = _aa_sweep(tmp_path / "loaded", AA, load=0.3)
    measure_sweep(loaded, tmp_path / "cache")  # not quiet: recorded in its own dir only
    sweep = _sweep(tmp_path / "sw", [1000.0, 1010.0], [1500.0, 1490.0], loads=(0.01, 0.32))
    auto, md_auto = _compare(tmp_path, sweep, capsys)
    assert auto["noise_floor"]["measured"] is None and "measures this machine's" in md_auto
    assert auto["rows"][1]["under_load"] is True  # above the default 25%
    for given in (loaded, loaded / RECORD_FILE):
        doc, md = _compare(tmp_path, sweep, capsys, "--noise-floor", str(given))
        assert doc["noise_floor"]["measured"]["outside_load"] == 0.3
        assert doc["noise_floor"]["load_limit"] == pytest.approx(0.35) and doc["rows"][1]["under_load"] is False
        assert "at outside load ≤ 30%" in md and "not on a quiet machine" in md
        assert "measures this machine's" not in md and "measure it again" not in md
    quiet = _aa_sweep(tmp_path / "quiet", AA, load=0.02)
    measure_sweep(quiet, tmp_path / "store")
    doc, _ = _compare(tmp_path, sweep, capsys, "--noise-floor", str(tmp_path / "store" / FLOOR_FILE))
    assert doc["noise_floor"]["measured"]["machine"] == MACHINE and doc["noise_floor"]["load_limit"] == 0.07
    bad = [str(sweep), "--out", str(tmp_path / "x"), "--no-wandb", "--noise-floor", str(tmp_path / "no")]
    assert compare_main(bad) == 2
    assert "--noise-floor" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_an_aa_dirs_own_report_shows_its_floor(tmp_path, monkeypatch):
    monkeypatch.setenv("GPTLAB_CACHE", str(tmp_path / "cache"))
    loaded = _aa_sweep(tmp_path / "loaded", AA, load=0.3)
    measure_sweep(loaded, tmp_path / "cache")
    assert compare_main([str(loaded), "--out", str(tmp_path / "out"), "--no-wandb"]) == 0
    doc = json.loads((tmp_path / "out" / "comparison.json").read_text())
    floor = doc["noise_floor"]
    assert floor["measured"]["sweep_dir"] == str(loaded) and "at outside load ≤ 30%" in floor["note"]
