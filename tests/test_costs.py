"""The cost model: FlopCounterMode agreement for every config choice, closed forms, equivalences, the CLI."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from gptlab.config.build import build_model, build_optimizer, compose
from gptlab.costs.counting import count_flops
from gptlab.costs.memory import optimizer_state_bytes_per_param
from gptlab.costs.report import analyze, train_flops_per_token
from gptlab.costs.scores import SKIP_BLOCK, blocked_pairs, dense_pairs, useful_pairs
from gptlab.errors import ConfigError
from gptlab.model.attention.kernels import IMPLS, flash_available
from helpers.cli import cli_env, run_cli
from helpers.paths import CONF_DIR, REPO

B, T, WINDOW = 2, 32, 8
TINY = ["model.n_layer=2", "model.d_model=64", "model.n_head=8", f"model.block_size={T}", "model.vocab_size=96"]
GPT2 = ["model=gpt2", "attention=mha", "mlp=gelu", "norm=layernorm", "position=learned", "model.vocab_size=50257"]


def _choices(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _case(group: str, choice: str, impl: str | None = None) -> list[str]:
    """Overrides for one choice; windowed attention presets get a window shorter than T so it matters."""
    over = [f"{group}={choice}"]
    node = yaml.safe_load((CONF_DIR / group / f"{choice}.yaml").read_text()) or {}
    if group == "attention" and node.get("window") is not None:
        over.append(f"attention.window={WINDOW}")
    if impl is not None:
        over.append(f"attention.impl={impl}")
    return over


def _params():
    cases = [
        pytest.param(_case(g, c), id=f"{g}={c}") for g in ("attention", "mlp", "norm", "position") for c in _choices(g)
    ]
    cases += [
        pytest.param(_case("attention", a, impl) + ["attention.qk_norm=true"] * (a == "sliding"), id=f"{a}+{impl}")
        for impl in IMPLS
        for a in ("mha", "sliding")
    ]
    cases += [pytest.param(["position=alibi", "attention.impl=naive", "attention.qk_norm=true"], id="alibi+naive")]
    return cases


def _skip_reason(overrides: list[str]) -> str | None:
    impl = next((o.split("=")[1] for o in overrides if o.startswith("attention.impl=")), "sdpa")
    if impl == "flex":
        return "flex_attention has no CPU backward and cannot run under FlopCounterMode in eager mode"
    windowed = any(o.startswith("attention.window=") for o in overrides)
    if impl == "flash" and (windowed or "position=alibi" in overrides):
        return "the flash backend takes no mask (sliding window / ALiBi); the build refuses it"
    if impl == "flash" and not flash_available("cpu", torch.float32):
        return "the flash SDPA backend is not available on this CPU"
    return None


@pytest.mark.parametrize("overrides", _params())
def test_flop_counter_agrees_with_analytic_matmul_flops(overrides):
    """A real forward+backward counted by FlopCounterMode matches Σ kernel matmul FLOPs × (1 + backward) within 2%."""
    reason = _skip_reason(overrides)
    if reason:
        pytest.skip(reason)
    torch.manual_seed(0)
    model = build_model(compose(TINY + overrides))
    idx = torch.randint(0, 96, (B, T))

    def step():
        _, loss = model(idx, idx)
        loss.backward()

    measured, per_op = count_flops(step)
    report = analyze(model, B, T, mode="train")
    matmuls = [op for op in report.ops if op["kind"] == "matmul"]
    expected = sum(op["flops_step"] for op in matmuls)
    assert measured == pytest.approx(expected, rel=0.02), per_op
    # at T <= one skip block, a block-skipping kernel computes every pair: kernel == dense here
    assert all(op["flops"] == op["flops_dense"] for op in matmuls)


def test_gpt2_124m_params_and_training_flops_closed_form():
    """GPT-2 small: 85,056,000 non-embedding params; train FLOPs/token = 6·N_matmul + 6·d·V + 12·L·H·hd·(T+1)/2."""
    model = build_model(compose(GPT2), device="meta")
    report = analyze(model, 1, 1024)
    L, d, V, T_ = 12, 768, 50257, 1024
    assert report.params["non_embedding"] == 85_056_000
    assert report.params["total"] == 124_439_808
    assert report.params["per_component"]["lm_head"] == 0  # tied
    vectors = L * (3 * d + d + 4 * d + d) + (2 * L + 1) * 2 * d  # biases + LayerNorm gains/biases
    assert vectors == 121_344
    attention_term = 12 * L * 12 * 64 * (T_ + 1) / 2  # QKᵀ and A·V over the causal mean context
    expected = 6 * (85_056_000 - vectors) + 6 * d * V + attention_term
    assert train_flops_per_token(model, T_) == pytest.approx(expected, rel=1e-12)
    assert report.flops["train_per_token"] == pytest.approx(expected, rel=1e-12)
    assert report.flops["train_per_token"] == pytest.approx(3 * report.flops["forward_per_token"], rel=1e-12)
    # the commonly quoted 6·N_nonembed differs only by the bias/norm vectors
    assert (6 * 85_056_000 + 6 * d * V + attention_term) / expected == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize("dtype,nbytes", [("bf16", 2), ("fp32", 4)])
def test_kv_cache_bytes_per_token(dtype, nbytes):
    """KV bytes/token = 2 · n_layer · n_kv_head · head_dim · bytes; totals scale with B·T."""
    model = build_model(compose(TINY + ["attention=gqa", "attention.n_kv_head=2"]), device="meta")
    report = analyze(model, 3, T, mode="decode", dtype_bytes=dtype)
    assert report.kv_cache["bytes_per_token"] == 2 * 2 * 2 * 8 * nbytes
    assert report.kv_cache["total_bytes"] == 3 * T * 2 * 2 * 2 * 8 * nbytes
    assert report.weights["bytes"] == nbytes * report.params["total"]


def _report(overrides, mode="train", **kw) -> dict:
    return analyze(build_model(compose(TINY + overrides), device="meta"), B, T, mode=mode, **kw).to_dict()


@pytest.mark.parametrize("mode", ["train", "prefill", "decode"])
def test_gqa_with_all_kv_heads_equals_mha(mode):
    assert _report(["attention=gqa", "attention.n_kv_head=8"], mode) == _report(["attention=mha"], mode)
    fewer = _report(["attention=gqa", "attention.n_kv_head=2"], mode)
    assert fewer["kv_cache"]["bytes_per_token"] < _report(["attention=mha"], mode)["kv_cache"]["bytes_per_token"]


@pytest.mark.parametrize("window", [T, 4 * T])
@pytest.mark.parametrize("impl", ["naive", "sdpa", "flex"])
def test_window_at_least_t_equals_full_attention(window, impl):
    full = _report(["attention=mha", f"attention.impl={impl}"])
    assert _report(["attention=sliding", f"attention.window={window}", f"attention.impl={impl}"]) == full


def test_window_shorter_than_t_counts_only_visible_keys():
    """Useful attention FLOPs follow Σ_t min(t, w); a dense kernel still computes T×T."""
    r = _report(["attention=sliding", f"attention.window={WINDOW}", "attention.impl=naive"])
    pairs = WINDOW * (WINDOW + 1) // 2 + (T - WINDOW) * WINDOW
    per_layer_head = 2 * 2 * 8 * B  # (QKᵀ + A·V) · 2 FLOPs · head_dim · batch
    assert r["flops"]["attention_useful"] == 2 * 8 * per_layer_head * pairs
    assert r["flops"]["attention_kernel"] == 2 * 8 * per_layer_head * T * T


@pytest.mark.parametrize(
    "overrides",
    [
        ["attention=mha"],
        ["attention=gqa"],
        ["attention=sliding", f"attention.window={WINDOW}"],
        ["attention=sliding", f"attention.window={WINDOW}", "attention.impl=naive"],
        ["attention=hybrid", f"attention.window={WINDOW}", "attention.global_every=2"],
    ],
    ids=["mha", "gqa", "sliding", "sliding+naive", "hybrid"],
)
def test_decode_step_flops_and_kv_bytes_equal_a_real_cached_decode(overrides):
    """One decode step over a T-position context: FlopCounterMode's count of the real cached step equals the kernel
    FLOPs, and make_caches' bytes the inference KV; a windowed layer's ring attends over window + 1 keys, not T."""
    from gptlab.infer.cache import cache_nbytes, make_caches

    torch.manual_seed(0)
    model = build_model(compose(TINY + overrides)).eval()
    idx = torch.randint(0, 96, (B, T))
    caches = make_caches(model, B, T)
    with torch.no_grad():
        model(idx[:, : T - 1], caches=caches)  # prefill T - 1 positions: the next step sees T
        measured, per_op = count_flops(lambda: model(idx[:, T - 1 :], caches=caches))
    r = analyze(model, B, T, mode="decode", dtype_bytes=4).to_dict()
    assert r["flops"]["forward_total_kernel"] == measured, per_op
    assert r["memory"]["inference_estimate_bytes"] - r["weights"]["bytes"] == cache_nbytes(caches)
    keys = [T if blk.attn.window is None else WINDOW + 1 for blk in model.blocks]  # K/V positions per layer
    assert r["flops"]["attention_kernel"] == sum(2 * 2 * B * 8 * 8 * k for k in keys)  # (QKᵀ + A·V)·2·B·H·hd


@pytest.mark.parametrize(
    "overrides,act_inputs",
    [(["mlp=gelu", "mlp.ratio=1"], 64), (["mlp=swiglu", "mlp.ratio=1.5"], 2 * 64), (["mlp=gelu", "mlp.ratio=2"], 128)],
)
def test_mlp_activation_width_when_hidden_equals_d_model(overrides, act_inputs):
    """mlp.act runs on every input of the activation (up; gate and up), found structurally: hidden == d_model = 64
    counts as any other width (4 FLOPs and s·(inputs + hidden) bytes per element, per layer)."""
    model = build_model(compose(TINY + overrides), device="meta")
    hidden = model.blocks[0].mlp.hidden
    assert hidden == act_inputs // (2 if "mlp=swiglu" in overrides else 1)
    r = analyze(model, B, T, dtype_bytes=2).to_dict()
    act = next(op for op in r["ops"] if op["name"] == "mlp.act")
    assert act["flops"] == 2 * 4 * B * T * act_inputs
    assert act["bytes_naive"] == 2 * 2 * B * T * (act_inputs + hidden)


@pytest.mark.parametrize("mode,tq", [("train", T), ("decode", 1)])
@pytest.mark.parametrize("impl", ["naive", "sdpa"])
def test_naive_bytes_exceed_fused_by_the_score_matrix_traffic(mode, tq, impl):
    """Materialised attention writes S, reads it, writes P, reads it: 4 passes of (B, H, Tq, Tk) per layer."""
    r = _report(["attention=mha", f"attention.impl={impl}"], mode=mode, dtype_bytes="bf16")
    assert r["bytes"]["naive_total"] - r["bytes"]["fused_total"] == 2 * 4 * B * 8 * tq * T * 2
    assert r["attention_path"] == ("materialized" if impl == "naive" else "fused")


def test_score_pair_counts():
    n = 1024
    assert useful_pairs(n, n, None) == n * (n + 1) // 2
    assert dense_pairs(n, n) == n * n
    blocks = n // SKIP_BLOCK
    assert blocked_pairs(n, n, None) == SKIP_BLOCK * SKIP_BLOCK * blocks * (blocks + 1) // 2
    assert useful_pairs(1, n, None) == n and useful_pairs(1, n, 100) == 100  # decode: one query
    assert useful_pairs(n, n, 100) <= blocked_pairs(n, n, 100) <= dense_pairs(n, n)


def test_memory_and_roofline():
    naive = _report(["attention.impl=naive"], peak_flops=1e12, mem_bandwidth=1e10)
    fused = _report(["attention.impl=sdpa"], peak_flops=1e12, mem_bandwidth=1e10)
    ckpt = _report(["attention.impl=sdpa"], activation_checkpointing=True)
    assert (
        naive["memory"]["activations_bytes"]
        > fused["memory"]["activations_bytes"]
        > ckpt["memory"]["activations_bytes"]
    )
    assert ckpt["flops"]["step_total_kernel"] > fused["flops"]["step_total_kernel"]  # recomputed forwards
    assert naive["hardware"]["ridge_point"] == 100.0
    t = naive["time"]
    assert naive["bound"] == ("compute" if t["compute_s"] >= t["memory_s"] else "memory")
    assert t["lower_bound_s"] >= max(t["compute_s"], t["memory_s"]) - 1e-15
    assert _report([], mode="decode", peak_flops=1e12, mem_bandwidth=1e10)["bound"] == "memory"


@pytest.mark.parametrize("choice,expected", [("adamw", 8.0), ("sgd", 4.0), ("lion", 4.0)])
def test_optimizer_state_bytes_per_param(choice, expected):
    cfg = compose(TINY + [f"optimizer={choice}"])
    model = build_model(cfg, device="meta")
    assert optimizer_state_bytes_per_param(model, build_optimizer(cfg, model)) == expected


def test_bad_mode_is_a_config_error():
    with pytest.raises(ConfigError, match="mode: 'bogus'"):
        _report([], mode="bogus")


def test_peak_is_measured_once_and_cached(tmp_path, monkeypatch):
    from gptlab.runtime import peak

    assert peak.measure_matmul_peak(torch.float32, n=128, repeats=2) > 1e6
    assert peak.measure_bandwidth(nbytes=2**20, repeats=2) > 1e6
    calls = []
    monkeypatch.setattr(peak, "measure_matmul_peak", lambda dtype, device: calls.append(dtype) or 1.5e12)
    # a quiet machine (the test suite's own neighbours must not decide whether this caches; the busy case is below)
    monkeypatch.setattr(peak.LoadSampler, "mean", lambda self: 0.0)
    assert peak.cached_peak("cpu", torch.bfloat16, tmp_path) == 1.5e12
    assert peak.cached_peak("cpu", torch.bfloat16, tmp_path) == 1.5e12
    assert len(calls) == 1
    table = json.loads((tmp_path / peak.CACHE_FILE).read_text())
    assert list(table.values()) == [1.5e12] and "bfloat16" in next(iter(table))


@pytest.mark.parametrize(
    "stored, warned",
    [
        ("{not json", "is damaged (JSONDecodeError)"),
        ("[1, 2]", "is damaged (a JSON list, not a table)"),
        (None, "is -1.0, not FLOP/s > 0: measured again"),  # a table whose entry for this key is negative
        ("nan", "is nan, not FLOP/s > 0: measured again"),
        ("'fast'", "is 'fast', not FLOP/s > 0: measured again"),
    ],
)
def test_a_damaged_peak_store_is_said_and_measured_again_never_used(tmp_path, monkeypatch, caplog, stored, warned):
    """A damaged hardware_peaks file read as "nothing cached" without a word; a negative, NaN or text entry was used
    as the peak (MFU from it is nonsense) or was a traceback."""
    from gptlab.runtime import peak

    key = peak._cache_key("cpu", "matmul bfloat16")
    path = tmp_path / peak.CACHE_FILE
    if stored in ("nan", "'fast'") or stored is None:
        value = {"nan": float("nan"), "'fast'": "fast", None: -1.0}[stored]
        path.write_text(json.dumps({key: value, "other | matmul float32": 5e11}))
    else:
        path.write_text(stored)
    monkeypatch.setattr(peak, "measure_matmul_peak", lambda dtype, device: 1.5e12)
    monkeypatch.setattr(peak.LoadSampler, "mean", lambda self: 0.0)
    with caplog.at_level("WARNING"):
        assert peak.cached_peak("cpu", torch.bfloat16, tmp_path) == 1.5e12
    assert warned in caplog.text
    assert json.loads(path.read_text())[key] == 1.5e12  # stored again, now usable


def test_a_peak_measured_on_a_busy_machine_is_used_but_not_cached(tmp_path, monkeypatch, caplog):
    from gptlab.runtime import peak

    calls = []
    monkeypatch.setattr(peak, "measure_matmul_peak", lambda dtype, device: calls.append(dtype) or 1.5e12)
    monkeypatch.setattr(peak.LoadSampler, "mean", lambda self: peak.MAX_OUTSIDE_LOAD + 0.1)
    assert peak.cached_peak("cpu", torch.bfloat16, tmp_path) == 1.5e12
    assert peak.cached_peak("cpu", torch.bfloat16, tmp_path) == 1.5e12
    assert len(calls) == 2 and not (tmp_path / peak.CACHE_FILE).exists()
    assert "not cached" in caplog.text


def test_the_cpu_bandwidth_roof_is_measured_once_on_a_quiet_machine(tmp_path, monkeypatch):
    """hardware.mem_bandwidth=auto (gptlab-flops' roofline): measured on the first call, read from the cache after
    (it was re-measured on every gptlab-flops call: 7.0-11.7 GB/s over seven calls)."""
    from gptlab.runtime import peak

    calls = []
    monkeypatch.setattr(peak, "measure_bandwidth", lambda device: calls.append(device) or 9.5e9)
    monkeypatch.setattr(peak.LoadSampler, "mean", lambda self: 0.0)
    assert [peak.cached_bandwidth("cpu", tmp_path) for _ in range(3)] == [9.5e9] * 3
    assert calls == ["cpu"] and list(json.loads((tmp_path / peak.CACHE_FILE).read_text()).values()) == [9.5e9]


def test_a_run_beating_the_cached_peak_drops_it(tmp_path, monkeypatch, caplog):
    """A peak cached while the machine was busy is too low (MFU > 100 %): the run drops it for re-measurement."""
    import logging

    from gptlab.runtime import peak
    from helpers.train import run_inprocess

    monkeypatch.setenv("GPTLAB_CACHE", str(tmp_path / "cache"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the cache key includes the thread count the run will use
    busy = {peak._cache_key("cpu", "matmul float32"): 1e6, "other machine | matmul float32": 5e11}
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / peak.CACHE_FILE).write_text(json.dumps(busy))
    try:
        with caplog.at_level(logging.WARNING, logger="gptlab.train.run"):
            summary = run_inprocess(tmp_path / "run", "hardware.peak_flops=auto", "hardware.threads=1", steps=8)
    finally:
        torch.set_num_threads(threads)
    assert summary["peak_flops"] == 1e6 and summary["mfu_median"] > 1
    assert json.loads((tmp_path / "cache" / peak.CACHE_FILE).read_text()) == {"other machine | matmul float32": 5e11}
    assert any("MFU" in r.getMessage() and "measures it again" in r.getMessage() for r in caplog.records)


@pytest.mark.slow  # over 2.5 s: make test-fast stays under ~3 min
def test_cli_json_has_documented_keys_and_writes_nothing(tmp_path):
    out = run_cli(
        "gptlab.cli.flops",
        "format=json",
        "mode=decode",
        "batch_size=2",
        "hardware.peak_flops=1e12",
        "hardware.mem_bandwidth=2e10",
        cwd=tmp_path,
        env=cli_env(PYTHONPATH=str(REPO)),
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    for dotted in (
        "params.total",
        "params.non_embedding",
        "flops.forward_per_token",
        "flops.train_per_token",
        "flops.forward_total",
        "bytes.naive_total",
        "bytes.fused_total",
        "kv_cache.bytes_per_token",
        "weights.bytes",
        "memory.train_estimate_bytes",
        "hardware.ridge_point",
        "time.lower_bound_s",
    ):
        node = d
        for part in dotted.split("."):
            node = node[part]
        assert isinstance(node, (int, float)), dotted
    assert d["bound"] in ("memory", "compute") and d["mode"] == "decode" and d["seq_len"] == 128
    assert {"name", "flops", "bytes_naive", "bytes_fused", "intensity", "time_lower_bound_s"} <= set(d["ops"][0])
    assert list(tmp_path.iterdir()) == []  # no Hydra output dir, no logs
    bad = run_cli(
        "gptlab.cli.flops",
        "mode=bogus",
        "hardware.peak_flops=1e12",
        "hardware.mem_bandwidth=2e10",
        cwd=tmp_path,
        env=cli_env(PYTHONPATH=str(REPO)),
        timeout=120,
    )
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "mode=bogus" in bad.stderr


def test_a_peak_measured_under_outside_load_is_not_cached(tmp_path, monkeypatch):
    """A peak taken while other processes used the cores would inflate every later run's MFU: use it once, never cache it."""
    from gptlab.runtime import peak

    calls = []

    def measure():
        calls.append(1)
        return 1e11

    monkeypatch.setattr(peak.LoadSampler, "mean", lambda self: 0.6)
    assert peak._cached(tmp_path, "k", measure) == 1e11
    assert peak._cached(tmp_path, "k", measure) == 1e11 and len(calls) == 2  # measured again: nothing cached
    assert not (tmp_path / peak.CACHE_FILE).exists()
    monkeypatch.setattr(peak.LoadSampler, "mean", lambda self: 0.05)
    assert peak._cached(tmp_path, "k", measure) == 1e11
    assert peak._cached(tmp_path, "k", measure) == 1e11 and len(calls) == 3  # quiet: cached after one measurement


def test_flops_of_a_run_dir_costs_the_run_as_it_trained(tmp_path):
    """gptlab-flops with a run's overrides alone costs GPT-2's 50,257-token vocabulary where the run used its
    corpus's 65 characters (3.3M params against 100k); `gptlab-flops RUN_DIR` costs its saved config, vocabulary
    and sequence length: the run's own params and FLOPs per token, exactly."""
    from helpers.train import FAST

    run, env = tmp_path / "run", cli_env(OMP_NUM_THREADS="1")
    args = [*FAST, "train.max_steps=2", "train.eval_interval=2", f"hydra.run.dir={run}"]
    trained = run_cli("gptlab.cli.train", *args, cwd=tmp_path, env=env, timeout=300)  # Hydra saves its config
    assert trained.returncode == 0, trained.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    out = run_cli("gptlab.cli.flops", str(run), "format=json", cwd=tmp_path, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["params"]["total"] == summary["params"]
    assert report["flops"]["train_per_token"] == summary["flops_per_token"]
    assert report["seq_len"] == summary["seq_len"]
    table = run_cli("gptlab.cli.flops", str(run), "mode=decode", cwd=tmp_path, env=env, timeout=120)
    # its own line; a line of the copy-bandwidth measurement may come first (the roof is measured on first use)
    assert table.returncode == 0, table.stderr
    assert any(x.startswith(f"costing {run} as it trained: its .hydra/config.yaml") for x in table.stderr.splitlines())
    refused = run_cli("gptlab.cli.flops", str(run), "model.n_layer=4", cwd=tmp_path, env=env, timeout=120)
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1
    assert (
        "model.n_layer=4: gptlab-flops RUN_DIR costs the run as it trained; allowed: its own keys (mode,"
        in refused.stderr
    )
    plain = run_cli("gptlab.cli.flops", "model=tiny", "format=json", cwd=tmp_path, env=env, timeout=120)
    assert plain.returncode == 0 and "costed at GPT-2's 50,257-token vocabulary (model.vocab_size=null)" in plain.stderr
    assert json.loads(plain.stdout)["params"]["total"] != summary["params"]  # the assumption it now names
