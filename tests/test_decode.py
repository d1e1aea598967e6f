"""gptlab-decode: decode.json's keys and values, measured KV bytes == gptlab-flops' prediction, cache on vs off
(same greedy tokens, forward-token counts), skipped points with reasons, run dirs, multirun + gptlab-compare,
gptlab-sweep `command: decode`, one-line errors."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from gptlab.cli import decode as decode_cli
from gptlab.config.build import compose
from gptlab.errors import ConfigError
from gptlab.infer import decode
from gptlab.infer.decode import Grid, generate, measure
from helpers.cli import run_cli
from helpers.model import tiny_model, tokens
from helpers.train import FAST, train_env

# a 2-layer d_model-32 model, 8 new tokens per point, one repeat: seconds per test on one thread
SMALL = [
    "model.n_layer=2",
    "model.n_head=4",
    "model.d_model=32",
    "model.block_size=64",
    "model.vocab_size=61",
    "hardware.threads=1",
    "new_tokens=8",
    "repeats=2",
    "warmup=0",
]
FIGURES = (
    "prefill_ms",
    "decode_tokens_per_s",
    "latency_ms_p50",
    "latency_ms_p90",
    "latency_ms_p99",
    "peak_mem_bytes",
    "peak_mem_delta_bytes",
)


def run_decode(*overrides: str) -> dict:
    """decode.json's document for the overrides, in this process (as gptlab-decode would compose it)."""
    cfg = compose([*SMALL, *overrides], "decode")
    return decode_cli.execute(cfg, {}, list(overrides))


@pytest.mark.slow  # over 2.5 s: make test-fast stays under ~3 min
def test_decode_json_keys_and_values(one_thread):
    doc = run_decode("batch_sizes=[1,2]", "contexts=[5,20]")
    json.dumps(doc, allow_nan=False)  # strict JSON
    top = {"version", "source", "model", "settings", "hardware", "peak_mem_method", "outside_load", "points"}
    assert top <= set(doc)
    assert doc["source"] == {"kind": "config", "run": None, "step": None} and doc["model"]["n_kv_head"] == [4, 4]
    points = doc["points"]
    assert [(p["batch"], p["context"], p["cache"]) for p in points] == [
        (b, c, k) for b in (1, 2) for c in (5, 20) for k in ("static", "none")
    ]
    for p in points:
        assert p["status"] == "measured" and p["reason"] is None
        for key in FIGURES:
            assert len(p[key]["values"]) == 2 and p[key]["std"] is not None, key
            # on CPU the delta is resident growth: a generation this small can fit in heap this long-lived worker
            # already holds and read 0 (test_cpu_peak_delta_sees_a_cache_larger_than_the_free_heap checks it sees)
            assert p[key]["mean"] > 0 or (key == "peak_mem_delta_bytes" and p[key]["mean"] == 0), key
        assert p["latency_ms_p50"]["mean"] <= p["latency_ms_p90"]["mean"] <= p["latency_ms_p99"]["mean"]
        # tokens/s = batch x 7 decode steps / their total time: the mean step lies between the fastest and slowest
        for rate, p99 in zip(p["decode_tokens_per_s"]["values"], p["latency_ms_p99"]["values"]):
            assert 1e3 * p["batch"] / rate <= p99 * 1.0001
        assert p["forward_tokens"] == p["batch"] * (
            p["context"] + 7 if p["cache"] == "static" else p["context"] + sum(p["context"] + i for i in range(1, 8))
        )
        if p["cache"] == "static":
            # (layers, K+V, B, Hkv, context + new_tokens, head_dim, element size: hardware.dtype=auto is bf16 on a
            # CPU with native bf16, fp32 elsewhere)
            size = {"fp32": 4, "bf16": 2}[doc["hardware"]["dtype"]]
            assert p["kv_bytes_measured"] == 2 * 2 * p["batch"] * 4 * (p["context"] + 8) * 8 * size
            assert p["kv_bytes_ratio"] == 1.0 and p["same_tokens_as_none"] is True
        else:
            assert p["kv_bytes_measured"] is p["kv_bytes_predicted"] is p["kv_bytes_ratio"] is None


def test_cpu_peak_delta_sees_a_cache_larger_than_the_free_heap(one_thread):
    """A 4 MiB static cache in fp32 (1 MiB per K or V tensor) outgrows the free heap left after PeakMemory's
    malloc_trim, so the CPU delta (resident growth) holds at least the cache in every repeat, in this long-lived
    worker too."""
    cfg = compose(
        [
            *(o for o in SMALL if not o.startswith("model.block_size")),
            "model.block_size=256",
            "batch_sizes=[32]",
            "contexts=[248]",
            "cache=[static]",
        ],
        "decode",
    )
    doc = decode_cli.execute(cfg, {}, [])
    (point,) = doc["points"]
    size = {"fp32": 4, "bf16": 2}[doc["hardware"]["dtype"]]
    assert point["kv_bytes_measured"] == 2 * 2 * 32 * 4 * 256 * 8 * size  # layers, K+V, B, Hkv, positions, hd
    assert min(point["peak_mem_delta_bytes"]["values"]) >= point["kv_bytes_measured"]
    assert min(point["peak_mem_bytes"]["values"]) > min(point["peak_mem_delta_bytes"]["values"])


@pytest.mark.parametrize("attention", ["mha", "gqa", "mqa", "sliding"])
def test_measured_kv_bytes_equal_gptlab_flops_prediction(attention, one_thread):
    """Static caches hold exactly what gptlab-flops mode=decode predicts at seq_len = context + new_tokens.

    The sliding rule: a layer with window w < context + new_tokens keeps a ring of w positions, so measured ==
    kv_cache.total_bytes_windowed (each layer capped at min(window, seq)), less than the unwindowed total_bytes."""
    from gptlab.config.costing import flops_report as flops_run

    extra = {"gqa": ["attention.n_kv_head=2"], "sliding": ["attention.window=6"]}.get(attention, [])
    overrides = [
        f"attention={attention}",
        *extra,
        "model.n_layer=2",
        "model.n_head=4",
        "model.d_model=32",
        "model.block_size=64",
    ]
    model = tiny_model(*[o for o in overrides if not o.startswith("model.")])
    batch, context, new = 3, 10, 5
    measured = generate(model, tokens(B=batch, T=context), new, "static").kv_bytes
    report = flops_run(
        compose(
            [
                *overrides,
                "mode=decode",
                f"batch_size={batch}",
                f"seq_len={context + new}",
                "dtype=fp32",
                "format=json",
                "hardware.peak_flops=1e12",
                "hardware.mem_bandwidth=1e11",
            ],
            "flops",
        )
    ).to_dict()["kv_cache"]
    assert measured == report["total_bytes_windowed"] == decode.predicted_kv_bytes(model, batch, context + new)
    kv_heads = {"mha": 4, "gqa": 2, "mqa": 1, "sliding": 4}[attention]
    positions = 6 if attention == "sliding" else context + new
    assert measured == 2 * 2 * batch * kv_heads * positions * 8 * 4  # layers, K+V, B, Hkv, positions, hd, fp32
    assert (measured < report["total_bytes"]) == (attention == "sliding")


def test_int8_cache_bytes_equal_the_prediction_and_are_about_half_of_bf16(one_thread):
    model = tiny_model("attention=sliding", "attention.n_kv_head=2", "attention.window=6")  # a ring of 6, 2 K/V heads
    grid = Grid(
        batch_sizes=(2,), contexts=(12,), new_tokens=4, caches=("static",), kv_quant="int8", repeats=1, warmup=0
    )
    point = measure(model, grid)[0]
    # (layers, K+V, B, Hkv, window positions, head_dim int8 bytes + a 2-byte fp16 scale)
    assert point["kv_bytes_measured"] == point["kv_bytes_predicted"] == 2 * 2 * 2 * 2 * 6 * (8 + 2)
    assert point["kv_bytes_ratio"] == 1.0
    bf16 = decode.predicted_kv_bytes(model.to(torch.bfloat16), 2, 16)
    assert point["kv_bytes_measured"] / bf16 == (8 + 2) / (2 * 8)


@pytest.mark.parametrize("attention", ["mha", "sliding"])
def test_cache_on_and_off_give_the_same_greedy_tokens_and_count_forward_tokens(attention, one_thread):
    extra = ["attention.window=7"] if attention == "sliding" else []  # shorter than the prompt: the ring wraps
    model = tiny_model(f"attention={attention}", *extra)
    B, T, new = 2, 20, 10
    prompt = tokens(B=B, T=T)
    seen = []  # token ids entering the model, counted by a hook on its embedding (apart from generate's own count)
    model.wte.register_forward_hook(lambda module, args, out: seen.append(args[0].numel()))
    static = generate(model, prompt, new, "static")
    static_seen, seen[:] = sum(seen), []
    none = generate(model, prompt, new, "none")
    assert (static_seen, sum(seen)) == (static.forward_tokens, none.forward_tokens)
    assert static.tokens.shape == (B, new) and torch.equal(static.tokens, none.tokens)
    assert torch.equal(static.tokens, model.generate(prompt, new, temperature=0, use_cache=False)[:, T:])
    # static: the prompt once, then one token per step; none: the whole context again at every step
    assert static.forward_tokens == B * T + B * (new - 1)
    assert none.forward_tokens == B * T + sum(B * (T + i) for i in range(1, new))
    assert none.forward_tokens > 5 * static.forward_tokens and len(static.step_s) == len(none.step_s) == new - 1


def test_points_that_do_not_fit_are_skipped_with_their_reason(monkeypatch, one_thread):
    learned = tiny_model("position=learned")  # block_size 32, no embedding past it
    grid = Grid(batch_sizes=(1,), contexts=(4, 30), new_tokens=4, caches=("static", "none"), repeats=1, warmup=0)
    points = measure(learned, grid)
    assert [p["status"] for p in points] == ["measured", "measured", "skipped", "skipped"]
    assert points[2]["reason"].startswith("context + new_tokens = 34 > model.block_size = 32")
    monkeypatch.setattr(decode, "free_memory", lambda device: 1000)  # 1000 bytes free: nothing fits
    rope = measure(tiny_model(), Grid(batch_sizes=(2,), contexts=(40,), new_tokens=4, repeats=1, warmup=0))
    assert [p["status"] for p in rope] == ["skipped", "skipped"]
    assert all(" GiB free" in p["reason"] and p["reason"].startswith("estimated ") for p in rope)
    assert {"reason", "batch", "context", "cache"} <= set(rope[0]) and "decode_tokens_per_s" not in rope[0]


@pytest.mark.parametrize(
    "override, message",
    [
        ("batch_sizes=[0]", "batch_sizes=[0]: allowed: one or a list of integers >= 1"),
        ("contexts=[]", "contexts=[]: allowed: one or a list of integers >= 1"),
        ("cache=[static,lru]", "cache=['static', 'lru']: 'lru' is not a cache kind; allowed: static, none"),
        ("cache=[none,none]", "cache=['none', 'none']: give each kind once"),
        ("new_tokens=1", "new_tokens=1: allowed: an integer >= 2"),
        ("repeats=0", "repeats=0: allowed: an integer >= 1"),
        ("kv_quant=int4", "kv_quant='int4': allowed: null, int8"),
        ("kv_quant=int8", "kv_quant=int8: quantises the static cache; add static to cache"),
    ],
)
def test_bad_keys_are_one_line_errors(override, message):
    extra = ["cache=[none]"] if override == "kv_quant=int8" else []
    with pytest.raises(ConfigError) as err:
        decode_cli.grid_from(compose([*SMALL, *extra, override], "decode"))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


@pytest.mark.slow  # over 2.5 s: make test-fast stays under ~3 min
def test_cli_bad_key_exits_2_with_one_line(tmp_path):
    for args, start in (
        (["batch_sizes=[0]"], "error: batch_sizes=[0]: allowed"),
        (["cache=[static,lru]"], "error: cache=['static', 'lru']: 'lru' is not a cache kind"),
        (["contexs=[8]"], "error: contexs: no such key or group (did you mean contexts?); allowed here: model, "),
    ):
        proc = run_cli("gptlab.cli.decode", *SMALL, *args, cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.strip().startswith(start), proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and not list(tmp_path.glob("outputs/**/decode.json"))


@pytest.mark.slow  # over 2.5 s: make test-fast stays under ~3 min
def test_decode_a_trained_run_dir(tmp_path):
    run = tmp_path / "run"
    trained = run_cli(
        "gptlab.cli.train",
        *FAST,
        "train.max_steps=3",
        "train.eval_interval=3",
        f"hydra.run.dir={run}",
        cwd=tmp_path,
        env=train_env(),
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    out = tmp_path / "measured.json"
    proc = run_cli(
        "gptlab.cli.decode",
        f"run={run}",
        f"out={out}",
        "batch_sizes=2",
        "contexts=[8,70]",
        "new_tokens=4",
        "repeats=1",
        "warmup=0",
        "hardware.threads=1",
        "hardware.dtype=fp32",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["source"] == {"kind": "run", "run": str(run.resolve()), "step": 3}
    assert doc["model"]["d_model"] == 64 and doc["model"]["n_layer"] == 2 and doc["model"]["block_size"] == 64
    assert doc["model"]["fingerprint"] == json.loads((run / "summary.json").read_text())["model_fingerprint"]
    assert [p["status"] for p in doc["points"]] == ["measured", "measured", "measured", "measured"]  # rope: 70 > 64 ok
    assert "decode tokens/s" in proc.stdout and f"wrote {out}" in proc.stdout
    clash = run_cli("gptlab.cli.decode", f"run={run}", "attention=mqa", cwd=tmp_path)
    assert clash.returncode == 2 and clash.stderr.startswith(f"error: attention=mqa: with run={run} the model comes")


@pytest.mark.slow  # over 2.5 s: make test-fast stays under ~3 min
def test_multirun_writes_one_decode_json_per_choice_and_compare_shows_them(tmp_path, capsys):
    from gptlab.cli.compare import main as compare_main

    sweep = tmp_path / "sweep"
    proc = run_cli(
        "gptlab.cli.decode",
        "-m",
        "attention=mha,mqa",
        *SMALL,
        "batch_sizes=2",
        "contexts=[6,30]",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    docs = [json.loads((sweep / str(i) / "decode.json").read_text()) for i in (0, 1)]
    assert [d["choices"]["attention"] for d in docs] == ["mha", "mqa"]
    assert [d["model"]["n_kv_head"] for d in docs] == [[4, 4], [1, 1]]
    assert compare_main([str(sweep), "--baseline", "attention=mha"]) == 0
    out = capsys.readouterr().out
    assert "decode tokens/s" in out and "attention=mqa" in out and "1.00× baseline" in out
    rows = json.loads((sweep / "comparison" / "comparison.json").read_text())["decode"]
    assert [(r["label"], r["context"], r["cache"]) for r in rows] == [
        (label, c, k)
        for label in ("attention=mha", "attention=mqa, attention.n_kv_head=1")
        for c in (6, 30)
        for k in ("static", "none")
    ]
    mqa_static = rows[4]
    assert mqa_static["kv_bytes_ratio"] == 1.0 and mqa_static["kv_bytes_measured"] * 4 == rows[0]["kv_bytes_measured"]
    assert mqa_static["speedup"]["status"] in ("decided", "within_noise") and mqa_static["speedup"]["ratio"]
    assert len(mqa_static["tokens_per_s"]) == 2 and mqa_static["tokens_per_s_std"] is not None
    assert "## Decode" in (sweep / "comparison" / "comparison.md").read_text()
    page = (sweep / "comparison" / "comparison.html").read_text()  # the same table in the HTML report
    assert (
        "<h2>Decode</h2>" in page
        and page.count("<td>attention=mqa, attention.n_kv_head=1</td>") == 4
        and "<th>decode tokens/s</th>" in page
    )


@pytest.mark.slow  # over 2.5 s: make test-fast stays under ~3 min
def test_sweep_file_with_command_decode_runs_gptlab_decode_and_skips_finished(tmp_path):
    sweep_file = tmp_path / "mini.yaml"
    sweep_file.write_text(
        yaml.safe_dump(
            {
                "description": "test",
                "command": "decode",
                "seeds": [0],
                "overrides": [*SMALL, "batch_sizes=1", "contexts=4", "repeats=1"],
                "arms": {"mqa": ["attention=mqa"]},
            }
        )
    )
    out = tmp_path / "sweep"
    first = run_cli("gptlab.cli.sweep", str(sweep_file), "--out", str(out), cwd=tmp_path)
    assert first.returncode == 0 and "mqa__seed0: gptlab-decode " in first.stdout, first.stderr[-2000:]
    assert json.loads((out / "mqa" / "seed0" / "decode.json").read_text())["config"]["sweep"] == "mini"
    again = run_cli("gptlab.cli.sweep", str(sweep_file), "--out", str(out), cwd=tmp_path)
    assert again.returncode == 0 and "all 1 runs finished, nothing to launch" in again.stdout
    sweep_file.write_text(sweep_file.read_text().replace("command: decode", "command: serve"))
    bad = run_cli("gptlab.cli.sweep", str(sweep_file), "--out", str(out), cwd=tmp_path)
    assert bad.returncode == 2 and "command: 'serve' is not allowed; allowed: train, decode" in bad.stderr


@pytest.mark.slow  # over 2.5 s: make test-fast stays under ~3 min
def test_decode_attention_sweep_arms_run_in_a_cpu_form(one_thread):
    """The shipped study's five arms at a tiny CPU size: KV bytes scale with the K/V heads; sliding keeps a ring."""
    from gptlab.sweep.plan import planned_overrides
    from gptlab.sweep.spec import load_sweep

    name, spec, _ = load_sweep("decode_attention")
    assert spec["command"] == "decode" and list(spec["arms"]) == ["mha", "gqa4", "gqa2", "mqa", "sliding"]
    cpu = [
        "hardware=cpu",
        "model=tiny",
        "model.n_layer=2",
        "model.n_head=12",
        "model.d_model=96",
        "model.block_size=1024",
        "model.vocab_size=64",
        "batch_sizes=1",
        "contexts=[8,300]",
        "new_tokens=2",
        "repeats=1",
        "warmup=0",
        "hardware.threads=1",
    ]
    kv = {}
    for arm in spec["arms"]:
        doc = decode_cli.execute(compose(planned_overrides(name, spec, arm, cpu), "decode"), {}, [])
        static = [p for p in doc["points"] if p["cache"] == "static"]
        assert [p["kv_bytes_ratio"] for p in static] == [1.0, 1.0], arm
        kv[arm] = static[-1]["kv_bytes_measured"]
    assert kv["mha"] == 3 * kv["gqa4"] == 6 * kv["gqa2"] == 12 * kv["mqa"]
    assert kv["sliding"] * 302 == kv["mha"] * 256  # window 256 < 300 + 2 positions: a ring of 256 per layer
