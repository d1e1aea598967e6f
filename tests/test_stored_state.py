"""Stored state is checked before it is trusted: every file gptlab wrote and reads back (the noise-floor store,
summary.json, eval.json, the sweep's plan.json and queue.json) goes through one reader that refuses a damaged file
(truncated JSON, wrong types, NaN, negative or out-of-range figures) in one line naming the file and what to do, and
leaves it as it was. A floor measured under other conditions is used with a warning naming each difference."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch

from gptlab.compare.reading.runs import load_run
from gptlab.compare.statistics.noise_floor import FLOOR_FILE, RECORD_FILE, lookup, measure_sweep
from gptlab.errors import ConfigError
from gptlab.sweep.layout import PLAN_DIR, PLAN_FILE, QUEUE_FILE, read_plan
from gptlab.sweep.status import sweep_status
from helpers.cli import cli_env, run_cli
from helpers.compare import write_run

CPU = "Stored CPU"
MACHINE = f"{CPU} | 2 cores"


def _provenance(run: Path) -> Path:
    hardware = {"device": "cpu", "dtype": "fp32", "cpu": CPU, "cpu_threads": 2, "cpu_cores": [0, 1]}
    (run / "provenance.json").write_text(json.dumps({"hardware": hardware, "packages": {"torch": "2.13.0"}}))
    return run


def _floor(**changes) -> dict:
    floor = {
        "machine": MACHINE, "measured_at": "2026-01-01T00:00:00Z", "sweep_dir": "/aa", "runs": 6, "arms": 2,
        "seeds": 3, "speed_sd": 0.02, "step_sd": 0.02, "max_speedup": 1.06, "loss_sd": 0.01,
        "same_seed_loss_gap": 0.0, "mem_spread": 0.01, "outside_load": 0.04, "quiet": True,
        "conditions": {"device": "cpu", "dtype": "fp32", "threads": 2, "torch": "2.13.0", "params": 120_000},
    }  # fmt: skip
    return floor | changes


def _runs(tmp_path: Path, params: int = 120_000) -> list:
    return [
        load_run(_provenance(write_run(tmp_path / "runs" / f"seed{s}", seed=s, params=params, outside_load=0.01)))
        for s in (0, 1)
    ]


def _store(cache: Path, text: str) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    (cache / FLOOR_FILE).write_text(text)
    return cache / FLOOR_FILE


# --- the noise-floor store ---------------------------------------------------------------------------------------

DAMAGED_FLOORS = [
    ("truncated", json.dumps({MACHINE: _floor()})[:-40], "not valid JSON"),
    ("not a mapping", json.dumps([_floor()]), "expected a mapping of machine ids"),
    ("NaN spread", json.dumps({MACHINE: _floor(speed_sd=math.nan)}), "not valid JSON: NaN"),
    ("negative spread", json.dumps({MACHINE: _floor(speed_sd=-0.02)}), "speed_sd=-0.02: must be >= 0"),
    ("negative loss sd", json.dumps({MACHINE: _floor(loss_sd=-1.0)}), "loss_sd=-1.0: must be >= 0"),
    ("zero max speed-up", json.dumps({MACHINE: _floor(max_speedup=0)}), "max_speedup=0: must be >= 1"),
    ("string max speed-up", json.dumps({MACHINE: _floor(max_speedup="1.05")}), "max_speedup='1.05': expected a"),
    ("quiet under load", json.dumps({MACHINE: _floor(outside_load=0.8)}), "quiet=true at outside load 0.8"),
    ("load above 100%", json.dumps({MACHINE: _floor(outside_load=3.0)}), "outside_load=3.0: must be in [0, 1]"),
    ("missing figure", json.dumps({MACHINE: {k: v for k, v in _floor().items() if k != "speed_sd"}}), "no speed_sd"),
    ("other machine's entry", json.dumps({MACHINE: _floor(machine="Other")}), "its entry names machine 'Other'"),
    ("seeds a float", json.dumps({MACHINE: _floor(seeds=2.5)}), "seeds=2.5: expected an integer"),
]


@pytest.mark.parametrize("text, named", [c[1:] for c in DAMAGED_FLOORS], ids=[c[0] for c in DAMAGED_FLOORS])
def test_a_damaged_floor_store_is_refused_in_one_line_never_read_as_no_floor(tmp_path, text, named):
    path = _store(tmp_path / "cache", text)
    with pytest.raises(ConfigError) as err:
        lookup(_runs(tmp_path), tmp_path / "cache")
    message = str(err.value)
    assert message.startswith(f"{path}: ") and named in message and "\n" not in message
    assert "gptlab-sweep NAME --aa" in message and "--noise-floor none" in message  # what to do
    assert path.read_text() == text  # left as it was


def test_a_sound_store_is_used(tmp_path):
    _store(tmp_path / "cache", json.dumps({MACHINE: _floor()}))
    floor, line = lookup(_runs(tmp_path), tmp_path / "cache")
    assert floor is not None and floor.max_speedup == 1.06 and "Warning" not in line
    assert lookup(_runs(tmp_path), tmp_path / "nothing")[0] is None  # no store at all: no floor, no error


def test_a_floor_from_another_model_size_is_used_with_a_warning_naming_the_difference(tmp_path):
    _store(tmp_path / "cache", json.dumps({MACHINE: _floor()}))
    floor, line = lookup(_runs(tmp_path, params=4_000_000), tmp_path / "cache")
    assert floor is not None  # it only adds caution: still used
    assert "Warning: the floor was measured under other conditions" in line
    assert "params 120000 there, 4000000 here" in line and "gptlab-sweep NAME --aa" in line
    other = _floor(conditions=_floor()["conditions"] | {"dtype": "bf16"})
    _store(tmp_path / "cache", json.dumps({MACHINE: other}))
    assert "dtype bf16 there, fp32 here" in lookup(_runs(tmp_path), tmp_path / "cache")[1]


def test_measuring_into_a_damaged_store_refuses_it_and_keeps_the_measurement(tmp_path):
    aa = tmp_path / "aa"
    for arm, values in {"aa0": [1000.0, 1010.0], "aa1": [1030.0, 1020.0]}.items():
        for seed, tps in enumerate(values):
            _provenance(
                write_run(aa / arm / f"seed{seed}", seed=seed, leaves={"arm": arm}, tokens_per_s=tps, outside_load=0.02)
            )
    path = _store(tmp_path / "cache", '{"Other CPU | 8 cores": {"machine": ')
    with pytest.raises(ConfigError, match=r"noise_floors_v1.json: not valid JSON"):
        measure_sweep(aa, tmp_path / "cache")
    assert path.read_text() == '{"Other CPU | 8 cores": {"machine": '  # the other machines' floors not overwritten
    record = json.loads((aa / RECORD_FILE).read_text())
    assert record["stored"] is False and record["machine"] == MACHINE  # the measurement itself is kept


def test_compare_with_a_damaged_floor_store_exits_2_with_one_line(tmp_path):
    for s in (0, 1):
        _provenance(write_run(tmp_path / "sw" / "mha" / f"seed{s}", seed=s))
        _provenance(write_run(tmp_path / "sw" / "gqa" / f"seed{s}", seed=s, choices={"attention": "gqa"}))
    cache = tmp_path / "cache"
    path = _store(cache, json.dumps({MACHINE: _floor(speed_sd=-1)}))
    out = run_cli(
        "gptlab.cli.compare", str(tmp_path / "sw"), "--out", str(tmp_path / "cmp"), "--no-wandb",
        env=cli_env(GPTLAB_CACHE=str(cache)), timeout=120,
    )  # fmt: skip
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert f"{path}: {MACHINE}: speed_sd=-1: must be >= 0 (a damaged or hand-edited file)" in lines[0]
    assert not (tmp_path / "cmp").exists()


# --- summary.json and eval.json ------------------------------------------------------------------------------------

DAMAGED_SUMMARIES = [
    ("truncated", '{"status": "finished", "steps": 1', "not valid JSON"),
    ("NaN loss", '{"status": "finished", "final_val_loss": NaN}', "not valid JSON: NaN"),
    ("negative steps", '{"status": "finished", "steps": -5}', "steps=-5: must be >= 0"),
    ("negative loss", '{"status": "finished", "final_val_loss": -0.5}', "final_val_loss=-0.5: must be >= 0"),
    ("text figure", '{"status": "finished", "tokens_per_s_median": "fast"}', "tokens_per_s_median='fast' is not a"),
    ("unknown status", '{"status": 7}', "status: 7 is not allowed"),
    ("a list", "[1, 2]", "expected a JSON object, got list"),
]


@pytest.mark.parametrize("text, named", [c[1:] for c in DAMAGED_SUMMARIES], ids=[c[0] for c in DAMAGED_SUMMARIES])
def test_a_damaged_summary_is_refused_by_compare_and_status(tmp_path, text, named):
    run = write_run(tmp_path / "sw" / "a" / "seed0")
    (run / "summary.json").write_text(text)
    with pytest.raises(ConfigError) as err:
        load_run(run)
    message = str(err.value)
    assert message.startswith(f"{run / 'summary.json'}: ") and named in message and "train.resume=auto" in message
    (tmp_path / "sw" / PLAN_DIR).mkdir()
    (tmp_path / "sw" / PLAN_FILE).write_text(json.dumps([{"name": "a__seed0", "arm": "a", "seed": 0}]))
    with pytest.raises(ConfigError, match="summary.json: "):
        sweep_status(tmp_path / "sw")  # never shown as "pending"
    assert (run / "summary.json").read_text() == text


def test_a_resumed_sink_warns_of_a_damaged_summary_before_writing_it_again(tmp_path, caplog):
    from gptlab.sinks.jsonl import JsonlSink

    (tmp_path / "summary.json").write_text('{"status": "finished", "steps": -3}')
    with caplog.at_level(logging.WARNING, logger="gptlab.sinks.jsonl"):
        sink = JsonlSink(tmp_path, resume=True)
    sink.close("finished")
    assert any("summary.json: steps=-3: must be >= 0" in r.getMessage() for r in caplog.records)
    assert json.loads((tmp_path / "summary.json").read_text()) == {"status": "finished"}


def _eval(**metrics) -> str:
    task = {"metrics": {"acc": 0.5, "acc_stderr": 0.1, **metrics}, "step": 100, "samples": 16, "num_fewshot": 0}
    task |= {"limit": None, "version": 1, "config_sha256": "abc", "lm_eval": "0.4.13", "prefix_token_id": 10}
    return json.dumps({"format": 1, "tasks": {"tiny_mc": task}})


DAMAGED_EVALS = [
    ("truncated", _eval()[:-10], "not valid JSON"),
    ("NaN", _eval(acc=math.nan), "not valid JSON: NaN"),
    ("negative stderr", _eval(acc_stderr=-0.1), "task tiny_mc acc_stderr=-0.1: must be >= 0"),
    ("accuracy above 1", _eval(acc=1.5), "task tiny_mc acc=1.5: must be in [0, 1]"),
    ("text", _eval(acc="high"), "task tiny_mc acc='high' is not a number"),
    ("no tasks", json.dumps({"format": 1, "tasks": [1]}), "tasks=[1] is not a mapping"),
    ("other format", json.dumps({"format": 9, "tasks": {}}), "format=9; this gptlab reads format 1"),
]


@pytest.mark.parametrize("text, named", [c[1:] for c in DAMAGED_EVALS], ids=[c[0] for c in DAMAGED_EVALS])
def test_a_damaged_eval_json_is_refused_in_one_line(tmp_path, text, named):
    run = write_run(tmp_path / "run")
    (run / "eval.json").write_text(text)
    with pytest.raises(ConfigError) as err:
        load_run(run)
    message = str(err.value)
    assert message.startswith(f"{run / 'eval.json'}: ") and named in message and "run gptlab-eval again" in message


def test_gptlab_eval_refuses_a_damaged_eval_json_instead_of_replacing_it(tmp_path):
    pytest.importorskip("lm_eval")
    from gptlab.interop import harness

    run = write_run(tmp_path / "run")
    (run / "eval.json").write_text(_eval()[:-10])  # earlier tasks' results, cut short
    with pytest.raises(ConfigError, match=r"eval.json: not valid JSON: .*move it aside and run gptlab-eval again"):
        harness.evaluate(run, ["tiny_mc"])  # refused before any model is loaded or task run
    assert (run / "eval.json").read_text() == _eval()[:-10]


# --- the sweep's plan.json and queue.json --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, named",
    [
        ('[{"name": "a__seed0", "arm": "a", "se', "not valid JSON"),
        ('{"name": "a__seed0"}', "expected a list of planned runs, got dict"),
        ('[{"name": "a__seed0", "arm": "a"}]', "entry 0 seed=null: expected an integer"),
        ('[{"name": "a__seed0", "arm": "a", "seed": "0"}]', "entry 0 seed='0': expected an integer"),
        ('[{"name": "a__seed0", "arm": 3, "seed": 0}]', "entry 0 arm=3: expected a string"),
    ],
)
def test_a_damaged_plan_is_refused_in_one_line(tmp_path, text, named):
    (tmp_path / PLAN_DIR).mkdir()
    (tmp_path / PLAN_FILE).write_text(text)
    with pytest.raises(ConfigError) as err:
        read_plan(tmp_path)
    assert str(err.value).startswith(f"{tmp_path / PLAN_FILE}: ") and named in str(err.value)
    assert "launch the sweep again" in str(err.value)


@pytest.mark.parametrize(
    "queue, named",
    [
        ('{"a__seed0": {"state": "runn', "not valid JSON"),
        ('{"a__seed0": {"state": "exploded"}}', "a__seed0: state: 'exploded' is not allowed"),
        ('{"a__seed0": {"state": "running", "pid": -4}}', "a__seed0: pid=-4: must be > 0"),
        ('{"a__seed0": {"state": "failed", "returncode": "1"}}', "a__seed0: returncode='1': expected an integer"),
        ('{"a__seed0": {"state": "finished", "ended": NaN}}', "not valid JSON: NaN"),
    ],
)
def test_a_damaged_queue_is_refused_in_one_line_never_read_as_empty(tmp_path, queue, named):
    (tmp_path / PLAN_DIR).mkdir()
    (tmp_path / PLAN_FILE).write_text(json.dumps([{"name": "a__seed0", "arm": "a", "seed": 0}]))
    (tmp_path / PLAN_DIR / QUEUE_FILE).write_text(queue)
    with pytest.raises(ConfigError) as err:
        sweep_status(tmp_path)
    message = str(err.value)
    assert message.startswith(f"{tmp_path / PLAN_DIR / QUEUE_FILE}: ") and named in message and "\n" not in message


def test_sound_plan_and_queue_are_read(tmp_path):
    (tmp_path / PLAN_DIR).mkdir()
    (tmp_path / PLAN_FILE).write_text(json.dumps([{"name": "a__seed0", "arm": "a", "seed": 0, "subdir": "a/seed0"}]))
    (tmp_path / PLAN_DIR / QUEUE_FILE).write_text(json.dumps({"a__seed0": {"state": "failed", "returncode": 1}}))
    (row,) = sweep_status(tmp_path)
    assert (row.name, row.state) == ("a__seed0", "failed")
    assert read_plan(tmp_path / "nothing") == []


# --- tracebacks on easy inputs -------------------------------------------------------------------------------------


def test_a_truncated_safetensors_in_init_from_hf_is_one_line(tmp_path):
    pytest.importorskip("transformers")
    from transformers import GPT2Config, GPT2LMHeadModel

    from gptlab.interop.hf import load_pretrained

    folder = tmp_path / "hf"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16)).save_pretrained(folder)
    weights = folder / "model.safetensors"
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    with pytest.raises(ConfigError) as err:
        load_pretrained(str(folder), "train.init_from=hf:x")
    message = str(err.value)
    assert (
        message.startswith("train.init_from=hf:x: the weights in")
        and "truncated or damaged model.safetensors" in message
    )
    assert "\n" not in message and "Hub" not in message


def test_the_cpu_fp16_peak_is_measured_quickly(monkeypatch):
    """Emulated fp16 matmuls on a CPU are ~50x slower than fp32: a 2048 one took ~130 s under load on every run whose
    peak could not be cached. The matmul is sized to the budget instead."""
    from gptlab.runtime import peak

    probe = {"s": 0.01}  # the timed PROBE_N matmul, as the machine would report it
    monkeypatch.setattr(peak, "_best_time", lambda fn, device, repeats, budget_s: probe["s"])
    # fast enough: a 2048 one at 0.01 s per 512 takes 0.64 s, within SLOW_CALL budgets: kept
    assert peak.fitting_size(torch.float16, "cpu", 2048, 1.5) == 2048
    # emulated fp16 under load: 0.2 s per 512 would make a 2048 one 12.8 s; cut to about a third of the budget
    probe["s"] = 0.2
    n = peak.fitting_size(torch.float16, "cpu", 2048, 1.5)
    assert n == 640  # 512 x (0.5 / 0.2) ** (1/3) = 695, down to a multiple of 64
    assert 0.2 * (n / peak.PROBE_N) ** 3 <= 1.5  # the measured matmul fits one budget by the probe's rate
    probe["s"] = 30.0  # slower still: never below the probe's own size
    assert peak.fitting_size(torch.float16, "cpu", 2048, 1.5) == peak.PROBE_N
    monkeypatch.undo()
    monkeypatch.setattr(peak, "fitting_size", lambda dtype, device, n, call_s: 64)
    flops = peak.measure_matmul_peak(torch.float16, "cpu")
    assert math.isfinite(flops) and flops > 0  # the measurement runs at the size it was given


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpu_peak_is_timed_through_the_op_a_linear_layer_runs(monkeypatch, dtype):
    """A model's matmuls are nn.Linear (F.linear). On a CPU without native bf16, torch.mm in bf16 ran ~10x slower
    (1.2 against 16 GFLOP/s on this 2-core AVX2 EPYC), so a peak timed with it was beaten by training itself: the
    quick benchmark's bf16 arms read MFU 300-430 %. The fit and the measurement both time F.linear."""
    from gptlab.runtime import peak

    calls = {"linear": 0, "mm": 0}
    linear, mm = torch.nn.functional.linear, torch.mm

    def counted(name, fn):
        def call(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return call

    monkeypatch.setattr(torch.nn.functional, "linear", counted("linear", linear))
    monkeypatch.setattr(torch, "mm", counted("mm", mm))
    assert peak.fitting_size(dtype, "cpu", 100_000, 0.05) >= peak.PROBE_N  # times a PROBE_N product
    fitted = calls["linear"]
    assert fitted >= 2 and peak.measure_matmul_peak(dtype, "cpu", n=64, repeats=2, budget_s=0.05) > 0
    assert calls["linear"] >= fitted + 2 and calls["mm"] == 0
    assert peak.CACHE_FILE == "hardware_peaks_v3.json"  # the v2 files' torch.mm peaks are not read again


def test_a_reader_of_a_run_with_no_readable_checkpoint_is_not_told_to_resume(tmp_path):
    """gptlab-eval / decode / export on a run whose checkpoints are all damaged were told to "pass
    train.resume=never", a training flag; a reader is told the run has no weights to load. Training keeps its advice."""
    from gptlab.state import checkpoint

    folder = checkpoint.ckpt_dir(tmp_path)
    folder.mkdir(parents=True)
    (folder / "step_0000006.pt").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ConfigError) as read:
        checkpoint.load_latest(tmp_path, resume=False)
    assert str(read.value) == (
        f"{tmp_path}: none of the 1 checkpoints in {folder} is readable, so this run has no weights to load; "
        "train it again or give another run"
    )
    with pytest.raises(ConfigError, match=r"pass train.resume=never$"):
        checkpoint.load_latest(tmp_path)
