"""Accounting switches of the cost model (mask pass, element-wise fusion, blocks only), intensity per op class, dtype=.

Every expected number is written out below from the formulas in docs/COSTS.md, for one small config:
B=2 sequences of T=8 tokens, H=2 heads of hd=8 (d=16), 1 layer, GELU 4x (hidden 64), LayerNorm with bias
(2 affine vectors), learned positions, vocab V=32, materialised (naive) attention, s=2 bytes (bf16).
"""

from __future__ import annotations

import pytest

from gptlab.config.build import build_cost_model, compose, cost_report
from gptlab.costs.accounting import ELEMENTWISE, Accounting, elementwise_classes, from_options
from gptlab.costs.report import analyze, train_flops_per_token
from gptlab.errors import ConfigError

B, T, H, HD, D, HID, V, S = 2, 8, 2, 8, 16, 64, 32, 2
N = B * T  # tokens
SMALL = [
    "model.n_layer=1",
    f"model.d_model={D}",
    f"model.n_head={H}",
    f"model.block_size={T}",
    f"model.vocab_size={V}",
    "attention=mha",
    "attention.impl=naive",
    "mlp=gelu",
    "norm=layernorm",
    "position=learned",
    "model.bias=false",
]
BOOK = Accounting(mask_pass=True, unfused=ELEMENTWISE, blocks_only=True)  # the textbook's conventions
GPT2XL = ["model=gpt2-xl", "attention=mha", "attention.impl=naive", "mlp=gelu", "norm=layernorm", "position=learned"]


def _small(overrides=(), mode="prefill", acc=None, batch=B) -> dict:
    model = build_cost_model(compose(SMALL + list(overrides)))
    return analyze(model, batch, T, mode=mode, dtype_bytes="bf16", accounting=acc).to_dict()


def _ops(report: dict) -> dict:
    return {op["name"]: op for op in report["ops"]}


def _totals(report: dict) -> tuple[float, float, float]:
    """(forward kernel FLOPs of every op, naive bytes, fused bytes)."""
    ops = report["ops"]
    return (sum(o["flops"] for o in ops), sum(o["bytes_naive"] for o in ops), sum(o["bytes_fused"] for o in ops))


# ---- defaults are pinned: numbers computed with the code before the switches existed ----------------------------

PINNED_DEFAULT_TRAIN = {  # gptlab-flops' default config, train, B=8, T=128, bf16, vocab 50257, roofs 1e12 / 1e10
    "flops": {
        "forward_per_token": 14570752.0,
        "forward_total": 14920450048.0,
        "train_per_token": 43712256.0,
        "train_total": 44761350144.0,
        "forward_total_kernel": 15053619200.0,
        "forward_total_dense": 15053619200.0,
        "attention_kernel": 268435456,
        "attention_useful": 135266304,
        "elementwise_total": 304796160.0,
        "step_total_kernel": 45859201536.0,
    },
    "bytes": {
        "naive_total": 684156416.0,
        "fused_total": 667379200.0,
        "score_matrix_traffic": 16777216.0,
        "step_total": 1597790720.0,
    },
    "bound": "memory",
}
PINNED_GPT2XL_NAIVE_PREFILL = {  # GPT2XL overrides, prefill, B=1, T=1024, bf16
    "flops": {
        "forward_per_token": 3267382400.0,
        "forward_total": 3345799577600.0,
        "train_per_token": 9802147200.0,
        "train_total": 10037398732800.0,
        "forward_total_kernel": 3506703564800.0,
        "forward_total_dense": 3506703564800.0,
        "attention_kernel": 322122547200,
        "attention_useful": 161218560000,
        "elementwise_total": 8663859200.0,
        "step_total_kernel": 3515367424000.0,
    },
    "bytes": {
        "naive_total": 18340580736,
        "fused_total": 8274251136.0,
        "score_matrix_traffic": 10066329600.0,
        "step_total": 18340580736,
    },
    "bound": "compute",
}


@pytest.mark.parametrize(
    "overrides,mode,batch,seq,pinned",
    [([], "train", 8, 128, PINNED_DEFAULT_TRAIN), (GPT2XL, "prefill", 1, 1024, PINNED_GPT2XL_NAIVE_PREFILL)],
)
def test_default_accounting_is_unchanged(overrides, mode, batch, seq, pinned):
    r = cost_report(
        compose(overrides), batch, seq, vocab_size=50257, mode=mode, dtype="bf16", peak_flops=1e12, mem_bandwidth=1e10
    ).to_dict()
    assert {k: r[k] for k in pinned} == pinned
    assert r["accounting"] == {
        "mask_pass": False,
        "unfused": ("norm", "act", "rotary", "position"),
        "blocks_only": False,
    }
    # training's MFU numerator is the default accounting's
    model = build_cost_model(compose(overrides), 50257)
    assert train_flops_per_token(model, seq) == pinned["flops"]["train_per_token"]


# ---- each switch against its hand-computed formula ---------------------------------------------------------------


def test_mask_pass_adds_one_pass_over_the_scores_and_moves_one_softmax_flop():
    """attn.mask: reads scores (s·B·H·T²) and the 1-byte T×T mask, writes scores; 1 FLOP/score out of softmax's 5."""
    folded, own = _small(), _small(acc=Accounting(mask_pass=True))
    mask = _ops(own)["attn.mask"]
    assert mask["flops"] == B * H * T * T == 256
    assert mask["bytes_naive"] == 2 * S * B * H * T * T + T * T == 1088
    assert mask["bytes_fused"] == 0  # a fused kernel masks in registers
    assert _ops(folded)["attn.softmax"]["flops"] == 5 * B * H * T * T
    assert _ops(own)["attn.softmax"]["flops"] == 4 * B * H * T * T
    f0, n0, u0 = _totals(folded)
    f1, n1, u1 = _totals(own)
    assert (f1, n1 - n0, u1) == (f0, 1088, u0)
    assert own["bytes"]["score_matrix_traffic"] - folded["bytes"]["score_matrix_traffic"] == 1088
    # one decode query sees every cached key: no mask is applied, nothing changes
    assert _small(mode="decode", acc=Accounting(mask_pass=True))["ops"] == _small(mode="decode")["ops"]


def test_unfused_elementwise_adds_the_two_residual_adds():
    """Each residual add reads x and f(x) and writes the sum: 2 adds x 3·s·N·d bytes and N·d FLOPs per layer."""
    base, unfused = _small(), _small(acc=Accounting(unfused=ELEMENTWISE))
    res = _ops(unfused)["residual"]
    assert (res["flops"], res["bytes_naive"], res["bytes_fused"]) == (2 * N * D, 6 * S * N * D, 6 * S * N * D)
    assert (res["flops"], res["bytes_naive"]) == (512, 3072)
    f0, n0, _ = _totals(base)
    f1, n1, _ = _totals(unfused)
    assert (f1 - f0, n1 - n0) == (512, 3072) and "residual" not in _ops(base)


def test_fused_elementwise_keeps_flops_and_drops_their_bytes():
    """Fused: norms (2 + final), GELU and the position add move 0 bytes; their FLOPs stay."""
    base, fused = _small(), _small(acc=Accounting(unfused=()))
    norm = S * (2 * N * D + 2 * D)  # read x, write y, read gain and bias: per norm
    act = S * N * (HID + HID)  # read the up-projection, write GELU's output
    position = S * (2 * N * D + T * D)  # read token rows and the (T, d) table rows, write the sum
    assert (norm, act, position) == (1088, 4096, 1280)
    f0, n0, u0 = _totals(base)
    f1, n1, u1 = _totals(fused)
    assert f1 == f0
    assert n0 - n1 == u0 - u1 == 3 * norm + act + position == 8640
    for name in ("norm", "norm_f", "mlp.act", "position"):
        assert _ops(fused)[name]["bytes_naive"] == 0 and _ops(fused)[name]["flops"] == _ops(base)[name]["flops"]


def test_elementwise_classes_one_at_a_time_rotary():
    """RoPE's rotation of q and k: 2·s·N·(H+H)·hd bytes, dropped when `rotary` is fused."""
    with_rotary = _small(["position=rope"])
    without = _small(["position=rope"], acc=Accounting(unfused=("norm", "act", "position")))
    assert _ops(with_rotary)["attn.rotary"]["bytes_naive"] == 2 * S * N * 2 * H * HD == 2048
    assert _totals(with_rotary)[1] - _totals(without)[1] == 2048


def test_blocks_only_drops_embedding_position_final_norm_and_head():
    """Blocks only: minus embedding (2·s·N·d bytes), position add, final norm and LM head (2·N·d·V FLOPs)."""
    full, blocks = _small(), _small(acc=Accounting(blocks_only=True))
    assert set(_ops(full)) - set(_ops(blocks)) == {"embedding", "position", "norm_f", "lm_head"}
    flops = N * D + N * D * (3 + 2 + 2) + 2 * N * D * V  # position add, LayerNorm (7/elem), head
    nbytes = 2 * S * N * D + S * (2 * N * D + T * D) + S * (2 * N * D + 2 * D) + S * (D * V + N * (D + V))
    assert (flops, nbytes) == (18432, 1024 + 1280 + 1088 + 2560)
    f0, n0, _ = _totals(full)
    f1, n1, _ = _totals(blocks)
    assert (f0 - f1, n0 - n1) == (flops, nbytes)
    assert full["flops"]["forward_per_token"] - blocks["flops"]["forward_per_token"] == 2 * D * V
    assert blocks["flops"]["train_per_token"] == pytest.approx(3 * blocks["flops"]["forward_per_token"])
    # train mode: the loss and the optimizer step are outside the blocks too
    assert {"loss", "optimizer"} <= set(_ops(_small(mode="train"))) and not {"loss", "optimizer"} & set(
        _ops(_small(mode="train", acc=Accounting(blocks_only=True)))
    )


def test_textbook_forward_intensity_by_hand():
    """Blocks only, mask pass, everything unfused: every op's FLOPs and bytes written out, then FLOP/byte."""
    tt, q, kv = S * B * H * T * T, S * N * H * HD, S * B * T * H * HD
    flops = {
        "norm": 2 * N * D * 7,
        "matmul": 2 * N * D * (3 * D) + 2 * N * D * D + 2 * (2 * N * D * HID),
        "attention": 2 * (B * H * 2 * HD * T * T),
        "softmax": B * H * T * T * (1 + 4),
        "elementwise": 4 * N * HID + 2 * N * D,
    }
    nbytes = {
        "norm": 2 * S * (2 * N * D + 2 * D),
        "matmul": S * (3 * D * D + N * 4 * D) + S * (D * D + 2 * N * D) + 2 * S * (D * HID + N * (D + HID)),
        "attention": (q + kv + tt) + (tt + kv + q),
        "softmax": (2 * tt + T * T) + 2 * tt,
        "elementwise": S * N * 2 * HID + 6 * S * N * D,
    }
    r = _small(acc=BOOK)
    got = r["intensity"]["classes"]
    assert set(got) == set(flops)
    for name in flops:
        assert (got[name]["flops"], got[name]["bytes"]) == (flops[name], nbytes[name]), name
        assert got[name]["intensity"] == pytest.approx(flops[name] / nbytes[name])
    assert r["intensity"]["forward"] == pytest.approx(sum(flops.values()) / sum(nbytes.values()))
    assert r["intensity"]["forward_bytes"] == sum(nbytes.values()) == 28864


def test_intensity_verdicts_follow_the_ridge():
    """Ridge 5 FLOP/byte: the linears (98,304 FLOPs / 14,336 bytes = 6.9) are compute-bound, LayerNorm (~1.6) is not."""
    r = analyze(build_cost_model(compose(SMALL)), B, T, mode="prefill", peak_flops=1e12, mem_bandwidth=2e11).to_dict()
    for c in r["intensity"]["classes"].values():
        assert c["bound"] == ("compute" if c["bytes"] == 0 or c["intensity"] >= 5.0 else "memory")
    classes = r["intensity"]["classes"]
    assert (classes["matmul"]["bound"], classes["norm"]["bound"]) == ("compute", "memory")
    assert classes["matmul"]["flops"] == 2 * N * D * (3 * D + D + 2 * HID) + 2 * N * D * V  # the LM head included


def test_gpt2_xl_one_verdict_flips_between_conventions():
    """GPT-2 XL prefill, 1 x 512 tokens, bf16, materialised scores, on A100-40GB roofs (312 TFLOP/s, 1.555 TB/s):
    gptlab's default accounting says compute-bound, the textbook's (mask pass, unfused, blocks only) memory-bound."""
    model = build_cost_model(compose(GPT2XL), 50257)
    roofs = dict(mode="prefill", dtype_bytes="bf16", peak_flops=312e12, mem_bandwidth=1.555e12)
    ours, book = (analyze(model, 1, 512, accounting=a, **roofs).to_dict() for a in (None, BOOK))
    ridge = 312e12 / 1.555e12
    assert ours["intensity"]["forward"] > ridge > book["intensity"]["forward"]
    assert (ours["bound"], book["bound"]) == ("compute", "memory")
    assert (ours["intensity"]["forward_bound"], book["intensity"]["forward_bound"]) == ("compute", "memory")
    # the mask pass alone adds 48 layers x (2·s·B·H·T² + T²) bytes
    mask = analyze(model, 1, 512, accounting=Accounting(mask_pass=True), **roofs).to_dict()
    assert mask["bytes"]["naive_total"] - ours["bytes"]["naive_total"] == 48 * (2 * 2 * 25 * 512**2 + 512**2)
    # FLOPs agree to ~5 % (the LM head), bytes differ by ~18 %
    assert book["intensity"]["forward_flops"] / ours["intensity"]["forward_flops"] == pytest.approx(0.951, abs=0.001)
    assert book["intensity"]["forward_bytes"] / ours["intensity"]["forward_bytes"] == pytest.approx(1.185, abs=0.001)


# ---- parsing: one-line errors ------------------------------------------------------------------------------------


def test_elementwise_shorthands_and_lists():
    assert elementwise_classes("fused") == () and elementwise_classes("unfused") == ELEMENTWISE
    assert elementwise_classes(["act", "norm"]) == ("norm", "act")
    assert from_options() == Accounting()


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (
            {"elementwise": "gelu"},
            "elementwise='gelu': not allowed; allowed: fused, unfused, or a list of norm, act, "
            "rotary, position, residual (e.g. [norm,act])",
        ),
        ({"elementwise": ["norm", "softmax"]}, "elementwise=['norm', 'softmax']: not allowed"),
        ({"mask_pass": "yes"}, "mask_pass='yes': not allowed; allowed: true, false"),
        ({"blocks_only": 1}, "blocks_only=1: not allowed; allowed: true, false"),
    ],
)
def test_bad_switch_values_are_one_line_errors(kwargs, message):
    with pytest.raises(ConfigError) as err:
        from_options(**kwargs)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


# ---- gptlab-flops: keys, dtype= shorthand, --help, exit 2 -------------------------------------------------------


def _flops(*args: str) -> dict:
    """gptlab-flops' report for these overrides, composed in-process (what the CLI calls: config/costing.py)."""
    from gptlab.config.costing import flops_report as run

    cfg = compose(
        ["hardware.peak_flops=1e12", "hardware.mem_bandwidth=2e10", *SMALL, "batch_size=2", *args], config_name="flops"
    )
    return run(cfg).to_dict()


def test_cli_switches_reach_the_cost_model():
    plain = _flops("mode=prefill", "dtype=bf16")
    book = _flops("mode=prefill", "dtype=bf16", "mask_pass=true", "elementwise=unfused", "blocks_only=true")
    assert book["accounting"] == {"mask_pass": True, "unfused": ELEMENTWISE, "blocks_only": True}
    assert book["intensity"] == _small(acc=BOOK)["intensity"] and plain["intensity"] == _small()["intensity"]
    listed = _flops("mode=prefill", "elementwise=[act,residual]")["accounting"]["unfused"]
    assert listed == ("act", "residual")


@pytest.mark.parametrize("dtype,nbytes", [("fp32", 4), ("bf16", 2), ("fp16", 2), ("fp8", 1)])
def test_dtype_shorthand_sets_bytes_per_element(dtype, nbytes):
    """dtype= overrides hardware.dtype: KV bytes/token = 2·n_layer·H·hd·bytes."""
    r = _flops("mode=decode", f"dtype={dtype}", "hardware.dtype=fp32")
    assert r["dtype_bytes"] == nbytes and r["kv_cache"]["bytes_per_token"] == 2 * 1 * H * HD * nbytes
    assert _flops("mode=decode", "hardware.dtype=bf16")["dtype_bytes"] == 2  # null: hardware.dtype


@pytest.mark.parametrize(
    "arg,message",
    [
        ("dtype=int4", "dtype=int4: not allowed; allowed: fp32, bf16, fp16, fp8 (null = hardware.dtype)"),
        ("elementwise=gelu", "elementwise='gelu': not allowed; allowed: fused, unfused, or a list of"),
        ("mask_pass=maybe", "mask_pass='maybe': not allowed; allowed: true, false"),
        ("blocks_only=2", "blocks_only=2: not allowed; allowed: true, false"),
    ],
)
def test_bad_cli_values_name_the_key(arg, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        _flops(arg)


def test_cli_help_lists_every_switch_and_bad_input_exits_2(tmp_path):
    from helpers.cli import cli_env, run_cli
    from helpers.paths import REPO

    page = run_cli("gptlab.cli.flops", "--help", cwd=tmp_path, env=cli_env(PYTHONPATH=str(REPO)), timeout=120)
    assert page.returncode == 0
    for key in (
        "dtype=null",
        "mask_pass=false",
        "elementwise=[norm, act, rotary, position]",
        "blocks_only=false",
        "+2·B·H·Tq·Tk·s + Tq·Tk bytes per layer",
        "6·B·T·d·s bytes",
        "no embedding, position add",
    ):
        assert key in page.stdout, key
    bad = run_cli(
        "gptlab.cli.flops",
        "elementwise=gelu",
        "hardware.peak_flops=1e12",
        "hardware.mem_bandwidth=2e10",
        cwd=tmp_path,
        env=cli_env(PYTHONPATH=str(REPO)),
        timeout=120,
    )
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0
    assert bad.stderr.startswith("error: elementwise='gelu': not allowed")
    assert list(tmp_path.iterdir()) == []
