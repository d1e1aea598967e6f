"""Study presets: the experiment group (d12 and its variants), scale=cpu twins, the expected-results sweeps and claims."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from gptlab.compare.reading.claims import load_claims
from gptlab.compare.reading.runs import load_run
from gptlab.compare.tables.analysis import compare
from gptlab.config.build import build_model, compose, group_choices
from gptlab.sweep.plan import planned_overrides
from gptlab.sweep.spec import load_sweep
from gptlab.util.paths import CONF_DIR, SWEEPS_DIR
from gptlab.util.tree import flatten
from helpers.cli import cli_env, run_cli
from helpers.compare import write_run

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
STUDY_SWEEPS = ("expected_results", "expected_results_cpu", "windows")
CLAIMS = SWEEPS_DIR / "claims" / "expected_results.yaml"
ARCH_GROUPS = ("attention", "mlp", "norm", "position")
GPT2 = {"attention": "mha", "mlp": "gelu", "norm": "layernorm", "position": "learned"}
# experiment -> (choices that differ from d12, attention/mlp keys that differ from d12)
VARIANTS = {
    "d12": ({}, {}),
    "d12_gqa": ({"attention": "gqa"}, {"attention.n_kv_head": 4}),
    "d12_mqa": ({"attention": "mqa"}, {"attention.n_kv_head": 1}),
    "d12_flash": ({}, {"attention.impl": "flash"}),
    "d12_mlp3": ({}, {"mlp.ratio": 3}),
    "d12_swiglu": ({"mlp": "swiglu"}, {"mlp.match_params": True}),
    "d12_fast": ({"attention": "gqa"}, {"attention.n_kv_head": 4, "attention.impl": "flash", "mlp.ratio": 3}),
    "d12_sliding": ({"attention": "sliding"}, {"attention.window": 128}),
}
D12_KEYS = {
    "attention.impl": "naive",
    "attention.n_kv_head": None,
    "attention.window": None,
    "mlp.ratio": 4,
    "norm.bias": True,
    "norm.placement": "pre",
    "model.bias": True,
    "model.tie_embeddings": True,
    "data.tokenizer": "gpt2",
}


def resolved(cfg) -> dict:
    """The run config (Hydra's own section left out) as plain, resolved containers."""
    return {
        k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
        for k, v in cfg.items()
        if k != "hydra"
    }


def arch(cfg) -> dict:
    """Architecture of a composed config: the four choices and every key of their nodes, bias and tie."""
    nodes = {g: OmegaConf.to_container(cfg[g], resolve=True) for g in ARCH_GROUPS}
    choices = {g: group_choices(cfg)[g] for g in ARCH_GROUPS}
    return {"choices": choices, "nodes": nodes, "bias": cfg.model.bias, "tie": cfg.model.tie_embeddings}


def test_the_experiment_group_is_exactly_the_study_arms():
    assert EXPERIMENTS == sorted(VARIANTS)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_experiment_composes_to_gpt2_small_plus_its_one_change(name):
    cfg = compose([f"experiment={name}"])
    changed_choices, changed_keys = VARIANTS[name]
    choices = group_choices(cfg)
    assert choices["experiment"] == name and choices["model"] == "gpt2"
    assert {g: choices[g] for g in ARCH_GROUPS} == {**GPT2, **changed_choices}
    flat = flatten(resolved(cfg), empty_as_leaf=True)
    for key, want in {**D12_KEYS, **changed_keys}.items():
        assert flat[key] == want, (name, key)
    sizes = {k: cfg.model[k] for k in ("n_layer", "n_head", "d_model", "block_size")}
    assert sizes == {"n_layer": 12, "n_head": 12, "d_model": 768, "block_size": 1024}
    assert (cfg.train.max_steps, cfg.train.batch_size, cfg.train.eval_interval) == (1000, 32, 100)
    assert cfg.optimizer.lr == 6e-4 and cfg.schedule.warmup_steps == 100


def test_d12_is_gpt2_small_with_124m_parameters():
    cfg = compose(["experiment=d12"])
    model = build_model(cfg, vocab_size=50257, device="meta")
    assert sum(p.numel() for p in model.parameters()) == 124_439_808  # tied head, 1,024 learned positions
    swiglu = build_model(compose(["experiment=d12_swiglu"]), vocab_size=50257, device="meta")
    assert abs(sum(p.numel() for p in swiglu.parameters()) / 124_439_808 - 1) < 0.001  # param-matched
    gqa = build_model(compose(["experiment=d12_gqa"]), vocab_size=50257, device="meta")
    # 8 of 12 K/V heads gone: 2 x 768 x 512 weights + 2 x 512 biases fewer per layer
    assert sum(p.numel() for p in gqa.parameters()) == 124_439_808 - 12 * (2 * 768 * 512 + 2 * 512)


def test_a_command_line_choice_still_beats_the_experiment():
    cfg = compose(["experiment=d12_gqa", "attention=mqa", "model.n_layer=2"])
    assert group_choices(cfg)["attention"] == "mqa" and cfg.model.n_layer == 2


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_cpu_twin_keeps_its_arms_architecture_and_shrinks_the_rest(name):
    gpu, cpu = compose([f"experiment={name}"]), compose([f"experiment={name}", "scale=cpu"])
    assert arch(cpu) == arch(gpu)
    choices = group_choices(cpu)
    assert (choices["experiment"], choices["scale"], choices["model"], choices["hardware"]) == (
        name,
        "cpu",
        "tiny",
        "cpu",
    )
    sizes = {k: cpu.model[k] for k in ("n_layer", "n_head", "d_model", "block_size")}
    assert sizes == {"n_layer": 4, "n_head": 12, "d_model": 192, "block_size": 256}
    assert cpu.data.tokenizer == "char" and cpu.hardware.dtype == "fp32"
    assert (cpu.train.max_steps, cpu.train.batch_size, cpu.train.eval_interval) == (100, 8, 25)
    if cpu.attention.window is not None:
        assert cpu.attention.window < cpu.model.block_size  # still a window, not full attention


@pytest.mark.parametrize("sweep", STUDY_SWEEPS)
def test_every_study_arm_composes_and_builds(sweep):
    name, spec, _ = load_sweep(sweep)
    assert spec["seeds"] == [0, 1, 2]
    for arm in spec["arms"]:
        cfg = compose(planned_overrides(name, spec, arm, []))
        vocab = 65 if cfg.data.tokenizer == "char" else 50257
        model = build_model(cfg, vocab_size=vocab, device="meta")
        assert sum(p.numel() for p in model.parameters()) > 0
        assert cfg.sweep == name and cfg.arm == arm
        if sweep != "windows":
            assert group_choices(cfg)["experiment"] == arm
            assert arch(cfg) == arch(compose([f"experiment={arm}"]))
        else:
            assert cfg.attention.impl == "flex" and cfg.model.block_size == 1024


def test_the_gpu_sweep_runs_the_study_budget_on_a_gpu_and_the_twin_on_cpu():
    gpu = compose(planned_overrides("expected_results", load_sweep("expected_results")[1], "d12", []))
    cpu = compose(planned_overrides("expected_results_cpu", load_sweep("expected_results_cpu")[1], "d12", []))
    assert gpu.hardware.device == "cuda" and gpu.model.block_size == 1024 and gpu.train.max_steps == 1000
    assert group_choices(gpu)["data"] == "hf" and gpu.data.tokenizer == "gpt2"
    assert cpu.hardware.device == "cpu" and group_choices(cpu)["data"] == "shakespeare"


def _fake_sweep(root: Path, sweep: str) -> list[Path]:
    """Synthetic run dirs (two seeds per arm) whose choices and keys are the real composed configs of `sweep`."""
    name, spec, _ = load_sweep(sweep)
    paths = []
    for i, arm in enumerate(spec["arms"]):
        cfg = compose(planned_overrides(name, spec, arm, []))
        choices = {k: v for k, v in group_choices(cfg).items() if k != "logger"}
        plain = resolved(cfg)
        leaves = {
            k: v
            for k, v in flatten({g: plain[g] for g in (*ARCH_GROUPS, "model")}, empty_as_leaf=True).items()
            if not k.rsplit(".", 1)[-1].startswith("_")
        }
        for seed in (0, 1):
            paths.append(
                write_run(
                    root / arm / f"seed{seed}",
                    seed=seed,
                    choices=choices,
                    leaves=leaves,
                    tokens_per_s=1000.0 + 100 * i,
                    loss_at=lambda s, i=i, seed=seed: 2 + 0.01 * (i + seed),
                )
            )
    return paths


@pytest.mark.parametrize("sweep", ["expected_results", "expected_results_cpu"])
def test_every_claim_lands_on_its_own_arm_in_gptlab_compare(tmp_path, sweep):
    claims = load_claims(str(CLAIMS))
    assert set(claims) == {f"experiment={a}" for a in VARIANTS if a not in ("d12", "d12_sliding")}
    runs = [load_run(p) for p in _fake_sweep(tmp_path, sweep)]
    cmp = compare(runs, baseline="experiment=d12", claims=claims)
    assert cmp.rows[0].claimed is None and all(r.claimed is None for r in cmp.rows if "d12_sliding" in r.label)
    claimed = {row.label: row.claimed for row in cmp.rows if row.claimed}
    assert len(claimed) == len(claims)
    for key, claim in claims.items():
        label = next(label for label, c in claimed.items() if c is claim)
        assert key in label.split(", "), (key, label)  # the label names the experiment it claims about


def test_claims_are_documented_as_claims_not_measurements():
    text = CLAIMS.read_text()
    assert "claims, to be checked against measurements, NOT measurements" in text
    assert yaml.safe_load(text)["experiment=d12_fast"] == {"speedup": 1.7}


def test_gptlab_train_cfg_job_shows_gpt2s_architecture(tmp_path):
    env = cli_env(OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="0")
    proc = run_cli("gptlab.cli.train", "experiment=d12", "--cfg", "job", cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    job = yaml.safe_load(proc.stdout)
    assert {k: job["model"][k] for k in ("n_layer", "n_head", "d_model", "block_size", "bias", "tie_embeddings")} == {
        "n_layer": 12,
        "n_head": 12,
        "d_model": 768,
        "block_size": 1024,
        "bias": True,
        "tie_embeddings": True,
    }
    assert job["attention"]["_target_"].endswith("GroupedQueryAttention") and job["attention"]["n_kv_head"] is None
    assert job["norm"]["_target_"].endswith("layernorm.layernorm") and job["norm"]["bias"] is True
    assert job["position"]["_target_"].endswith("learned.LearnedPosition")
    assert job["mlp"]["_target_"].endswith("gelu.GeluMLP") and job["mlp"]["ratio"] == 4
    assert job["data"]["tokenizer"] == "gpt2"


QUICK = [
    "train.max_steps=4",
    "train.eval_interval=2",
    "train.eval_sequences=4",
    "train.batch_size=2",
    "sample.tokens=0",
    "logger=none",
    "hardware.threads=1",
]


@pytest.mark.slow
def test_the_cpu_twin_sweep_runs_end_to_end_in_its_quick_form(tmp_path):
    out = tmp_path / "sweep"
    env = cli_env(OMP_NUM_THREADS="1")
    proc = run_cli(
        "gptlab.cli.sweep",
        "expected_results_cpu",
        *QUICK,
        "--seeds",
        "0",
        "--out",
        str(out),
        cwd=tmp_path,
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    arms = load_sweep("expected_results_cpu")[1]["arms"]
    for arm in arms:
        summary = json.loads((out / arm / "seed0" / "summary.json").read_text())
        assert summary["status"] == "finished" and summary["steps"] == 4, arm
        assert summary["choices"]["experiment"] == arm and summary["choices"]["scale"] == "cpu"
        assert summary["final_val_loss"] > 0
