"""GPU readiness: any GPU runs (a measured MFU peak where the datasheet table has none), GPU presets compile in place,
CUDA graphs are refused where they cannot work, and the dependency floors match the APIs the code calls.

This machine has no GPU: every test that needs CUDA says so and runs against the mocked torch.cuda of
helpers.gpu_mocks.fake_cuda; the GPU matmul measurement itself is mocked (its FLOP/s arithmetic is tested apart).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import logging
import re
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from packaging.version import Version

from gptlab.config.build import build_hardware, compose
from gptlab.data import default_cache_dir
from gptlab.errors import ConfigError
from gptlab.runtime import distributed, peak
from gptlab.runtime.hardware import Hardware
from helpers.gpu_mocks import fake_cuda  # noqa: F401  (a fixture)
from helpers.model import tiny_model, tokens
from helpers.train import rows, run_inprocess

UNKNOWN = "NVIDIA H800"  # a real part the datasheet table does not list
HW_LOG = "gptlab.runtime.hardware"


class _Measured:
    """Stands in for peak.measure_gpu_matmul_peak: a fixed FLOP/s per (dtype, tf32), and the calls made."""

    def __init__(self, values: dict):
        self.values, self.calls = values, []

    def __call__(self, dtype, device, tf32):
        self.calls.append((dtype, device, tf32))
        return self.values[(dtype, tf32)]


@pytest.fixture
def gpu_probe(fake_cuda, monkeypatch):
    """CUDA mocked with a GPU the table lacks; its matmul measurement, synchronize and NVML utilisation mocked."""
    fake_cuda.name = UNKNOWN
    measured = _Measured(
        {
            (torch.bfloat16, True): 612.5e12,
            (torch.bfloat16, False): 612.5e12,
            (torch.float16, True): 600e12,
            (torch.float32, True): 301e12,
            (torch.float32, False): 49e12,
        }
    )
    monkeypatch.setattr(peak, "measure_gpu_matmul_peak", measured)
    monkeypatch.setattr(peak, "NVML_PERIOD_S", 0.0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    # with a CUDA build of torch (the floor-version venv's), an optimizer step asks the real runtime about graph capture
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    fake_cuda.utilization = 0
    monkeypatch.setattr(torch.cuda, "utilization", lambda device=None: fake_cuda.utilization)
    return measured


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == HW_LOG and r.levelno == logging.WARNING]


# ---- 1. a GPU without a datasheet entry: measured once per device name and dtype, said in one line ----------------


def test_unknown_gpu_peak_is_measured_cached_and_warned(gpu_probe, tmp_path, caplog):
    """CUDA mocked: the peak is the measurement, cached under the device name and dtype; one warning line per
    resolution; a second resolution reads the cache (no new measurement)."""
    with caplog.at_level(logging.WARNING, logger=HW_LOG):
        first = Hardware(device="cuda", dtype="bf16").resolved_peak_flops(tmp_path)
    assert first == 612.5e12 and len(gpu_probe.calls) == 1
    (line,) = _warnings(caplog)
    assert line.startswith(f"no datasheet peak for '{UNKNOWN}': MFU uses its measured dense bf16 matmul peak, 612.5")
    assert "measured now, cached in" in line and "hardware.peak_flops=<FLOP/s>" in line and "\n" not in line
    table = json.loads((tmp_path / peak.CACHE_FILE).read_text())
    assert table == {f"{UNKNOWN} | torch {torch.__version__} | matmul bfloat16 | threads 0": 612.5e12}
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=HW_LOG):
        again = Hardware(device="cuda", dtype="bf16").resolved_peak_flops(tmp_path)
    assert again == 612.5e12 and len(gpu_probe.calls) == 1  # from the cache
    (line,) = _warnings(caplog)
    assert f"(cached in {tmp_path / peak.CACHE_FILE})" in line


def test_fp32_peaks_are_keyed_by_the_tf32_switch(gpu_probe, tmp_path):
    """CUDA mocked: fp32 with TF32 on and off are two measurements, two cache entries, never confused."""
    on = Hardware(device="cuda", dtype="fp32", tf32=True).resolved_peak_flops(tmp_path)
    off = Hardware(device="cuda", dtype="fp32", tf32=False).resolved_peak_flops(tmp_path)
    assert (on, off) == (301e12, 49e12)
    assert gpu_probe.calls == [(torch.float32, "cuda:0", True), (torch.float32, "cuda:0", False)]
    keys = sorted(json.loads((tmp_path / peak.CACHE_FILE).read_text()))
    assert [k.split(" | ")[2] for k in keys] == ["matmul float32 ieee", "matmul float32 tf32"]


def test_a_busy_gpu_peak_is_used_but_never_cached(gpu_probe, fake_cuda, tmp_path, caplog):
    """CUDA mocked, NVML reports 40 % utilisation before measuring: this run uses the figure, the cache stays
    empty, the next run measures again."""
    fake_cuda.utilization = 40
    with caplog.at_level(logging.WARNING, logger=HW_LOG):
        for _ in range(2):
            assert Hardware(device="cuda", dtype="bf16").resolved_peak_flops(tmp_path) == 612.5e12
    assert len(gpu_probe.calls) == 2 and not (tmp_path / peak.CACHE_FILE).exists()
    assert all("measured now while the GPU was 40% busy: not cached" in line for line in _warnings(caplog))


def test_without_nvml_the_peak_is_not_cached(gpu_probe, monkeypatch, tmp_path, caplog):
    """CUDA mocked, no nvidia-ml-py (torch.cuda.utilization raises): the load is unknown, so nothing is cached."""

    def no_nvml(device=None):
        raise ModuleNotFoundError("nvidia-ml-py does not seem to be installed or it can't be imported.")

    monkeypatch.setattr(torch.cuda, "utilization", no_nvml)
    with caplog.at_level(logging.WARNING, logger=HW_LOG):
        assert Hardware(device="cuda", dtype="fp16").resolved_peak_flops(tmp_path) == 600e12
    assert not (tmp_path / peak.CACHE_FILE).exists()
    (line,) = _warnings(caplog)
    assert "not cached: without NVML (pip install nvidia-ml-py) the GPU's load is unknown" in line


def test_datasheet_gpus_and_given_peaks_are_never_measured(gpu_probe, fake_cuda, tmp_path, caplog):
    """CUDA mocked: hardware.peak_flops wins; a GPU of the table gets its datasheet figure; neither measures."""
    assert Hardware(device="cuda", peak_flops=1.5e14).resolved_peak_flops(tmp_path) == 1.5e14
    fake_cuda.name = "NVIDIA H100 80GB HBM3"
    with caplog.at_level(logging.WARNING, logger=HW_LOG):
        assert Hardware(device="cuda", dtype="bf16").resolved_peak_flops(tmp_path) == 989.4e12
    assert gpu_probe.calls == [] and _warnings(caplog) == []


def test_unknown_pre_sm80_gpu_refuses_bf16_instead_of_measuring_it(gpu_probe, fake_cuda, tmp_path):
    """CUDA mocked (an unknown sm_75 part): bf16 is refused in one line, as on a known one; fp16 is measured."""
    fake_cuda.capability = (7, 5)
    with pytest.raises(ConfigError) as err:
        Hardware(device="cuda", dtype="bf16").resolved_peak_flops(tmp_path)
    assert str(err.value) == (
        f"hardware.dtype=bf16: {UNKNOWN} (sm_75) has no native bf16; use hardware.dtype=fp16 (or fp32)"
    )
    assert gpu_probe.calls == []
    assert Hardware(device="cuda", dtype="fp16").resolved_peak_flops(tmp_path) == 600e12


def test_an_impossible_mfu_drops_the_cached_gpu_peak(gpu_probe, fake_cuda, monkeypatch, tmp_path, caplog):
    """CUDA mocked: MFU over 100 % against a cached measured peak (taken while busy, undetected) drops that entry so
    the next run measures again; a datasheet GPU has no entry to drop."""
    from gptlab.train.run import check_peak

    monkeypatch.setenv("GPTLAB_CACHE", str(tmp_path))  # this test's own cache file
    cache = default_cache_dir() / peak.CACHE_FILE
    hw = Hardware(device="cuda", dtype="bf16")
    hw.resolved_peak_flops(default_cache_dir())
    assert UNKNOWN in cache.read_text()
    check_peak({"mfu_median": 0.9}, hw)
    assert UNKNOWN in cache.read_text()
    with caplog.at_level(logging.WARNING, logger="gptlab.train.run"):
        check_peak({"mfu_median": 1.3}, hw)
    assert json.loads(cache.read_text()) == {} and "MFU 130% is impossible" in caplog.text
    fake_cuda.name = "NVIDIA A100-SXM4-80GB"
    assert peak.forget_peak("cuda:0", torch.bfloat16, default_cache_dir()) is False


def test_gpu_matmul_peak_arithmetic_size_and_tf32_flag(fake_cuda, monkeypatch):
    """CUDA mocked: FLOP/s = per_call · 2n³ / fastest call; n halves until three operands fit in half the free
    memory; fp32 is timed under the requested TF32 setting and the process-wide flag is restored after."""
    seen = []

    def timed(dtype, device, n, per_call, repeats, budget_s):
        seen.append((n, torch.backends.cuda.matmul.fp32_precision))
        return 0.01

    monkeypatch.setattr(peak, "_time_gpu_matmuls", timed)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    free = {"bytes": 80 * 2**30}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free["bytes"], 80 * 2**30))
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    flops = peak.measure_gpu_matmul_peak(torch.bfloat16, "cuda:0", tf32=True)
    assert flops == 4 * 2 * 8192**3 / 0.01
    free["bytes"] = 2**28  # 256 MiB free: 3·n²·2 bytes <= 128 MiB -> n = 4096
    assert peak.measure_gpu_matmul_peak(torch.bfloat16, "cuda:0", tf32=True) == 4 * 2 * 4096**3 / 0.01
    free["bytes"] = 80 * 2**30
    peak.measure_gpu_matmul_peak(torch.float32, "cuda:0", tf32=True)
    assert [s[1] for s in seen] == ["tf32", "tf32", "tf32"] and [s[0] for s in seen] == [8192, 4096, 8192]
    assert torch.backends.cuda.matmul.fp32_precision == "ieee"  # restored


def test_run_on_an_unknown_gpu_starts_warns_once_and_mfu_uses_the_measured_peak(
    gpu_probe, monkeypatch, tmp_path, caplog
):
    """CUDA mocked, unknown GPU: gptlab-train (in process) gets past the peak, warns once, and every logged MFU is
    flops/token x tokens/s over the measured peak. No GPU here: the run trains on the CPU and only its MFU
    denominator is resolved through the CUDA path (a Hardware for the mocked GPU, fp32 with TF32 off)."""
    monkeypatch.setenv("GPTLAB_CACHE", str(tmp_path / "cache"))  # this test's own peak cache (and data cache)
    gpu = Hardware(device="cuda", dtype="fp32", tf32=False)
    resolve = Hardware.resolved_peak_flops
    monkeypatch.setattr(Hardware, "resolved_peak_flops", lambda self, cache_dir: resolve(gpu, cache_dir))
    with caplog.at_level(logging.WARNING, logger=HW_LOG):
        summary = run_inprocess(tmp_path / "run", "hardware.peak_flops=auto", steps=4, eval_interval=4)
    assert len(_warnings(caplog)) == 1 and UNKNOWN in _warnings(caplog)[0]
    assert summary["peak_flops"] == 49e12 and gpu_probe.calls == [(torch.float32, "cuda:0", False)]
    logged = [r for r in rows(tmp_path / "run") if "perf/mfu" in r]
    assert len(logged) == 4
    for r in logged:
        assert r["perf/mfu"] == pytest.approx(summary["flops_per_token"] * r["perf/tokens_per_s"] / 49e12, rel=1e-12)
    assert f"{UNKNOWN} | torch" in (default_cache_dir() / peak.CACHE_FILE).read_text()


# ---- 4. GPU presets compile, in place; CUDA graphs refused where they cannot work --------------------------------


@pytest.mark.parametrize(
    "preset,compiles",
    [("cuda", True), ("ddp", True), ("fsdp", True), ("cpu", False), ("ddp_cpu", False), ("fsdp_cpu", False)],
)
def test_gpu_presets_compile_by_default(preset, compiles):
    assert compose([f"hardware={preset}"]).hardware.compile is compiles
    assert compose([f"hardware={preset}", "hardware.compile=false"]).hardware.compile is False


def test_compile_false_opts_out(fake_cuda):
    """CUDA mocked: hardware=cuda hardware.compile=false leaves the model eager (nothing compiled)."""
    hw = build_hardware(compose(["hardware=cuda", "hardware.compile=false"]))
    model = tiny_model()
    assert hw.compiled(model) is model and model._compiled_call_impl is None


def test_compiled_in_place_keeps_state_dict_keys_and_loads_into_an_eager_model():
    """compile=true compiles the module itself: same object, same state-dict keys (no `_orig_mod.`), and its
    state dict loads strictly into an uncompiled model (no compilation runs here: it happens at the first call)."""
    model = tiny_model()
    keys = list(model.state_dict())
    out = Hardware(device="cpu", dtype="fp32", compile=True).compiled(model)
    assert out is model and model._compiled_call_impl is not None
    assert list(model.state_dict()) == keys and not any("_orig_mod" in k for k in keys)
    eager = tiny_model(seed=5)
    eager.load_state_dict(model.state_dict(), strict=True)
    assert all(torch.equal(a, b) for a, b in zip(eager.state_dict().values(), model.state_dict().values()))
    wrapped = distributed.wrap(tiny_model(), Hardware(device="cpu", dtype="fp32", compile=True), world=1)
    assert isinstance(wrapped, type(model)) and wrapped._compiled_call_impl is not None


def test_generation_runs_eager_on_a_compiled_model():
    """A model compiled in place (counting backend): its forward goes through the compiler, generate() never does
    (shapes change every token), and generates what the eager model generates."""
    compiled_graphs = []
    model = tiny_model()
    model.compile(backend=lambda gm, inputs: compiled_graphs.append(gm) or gm.forward)
    x = tokens(B=1, T=8)
    model(x)
    assert len(compiled_graphs) >= 1
    before = len(compiled_graphs)
    out = model.generate(x, 6, temperature=0.0)
    assert len(compiled_graphs) == before
    assert torch.equal(out, tiny_model().generate(x, 6, temperature=0.0))


CUDA_GRAPHS_DISTRIBUTED = (
    "hardware.compile={mode}: CUDA graphs do not work under hardware.distributed=true (the {strategy} gradient hooks "
    "run outside the captured graphs); allowed here: false, true, default"
)


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
@pytest.mark.parametrize("preset,strategy", [("ddp", "ddp"), ("fsdp", "fsdp")])
def test_cuda_graphs_refused_in_distributed_runs(fake_cuda, mode, preset, strategy):
    """CUDA mocked (2 GPUs): reduce-overhead and max-autotune capture CUDA graphs, refused under DDP and FSDP."""
    fake_cuda.count = 2
    with pytest.raises(ConfigError) as err:
        build_hardware(compose([f"hardware={preset}", f"hardware.compile={mode}"]))
    assert str(err.value) == CUDA_GRAPHS_DISTRIBUTED.format(mode=mode, strategy=strategy)
    assert build_hardware(compose([f"hardware={preset}", "hardware.compile=default"])).compile == "default"


def test_cuda_graph_modes_where_they_work(fake_cuda):
    """CUDA mocked: one GPU takes both CUDA-graph modes; on the CPU reduce-overhead (CUDA graphs only) is refused,
    max-autotune (its CPU autotuning) is not."""
    for mode in ("reduce-overhead", "max-autotune"):
        assert build_hardware(compose(["hardware=cuda", f"hardware.compile={mode}"])).compile == mode
    with pytest.raises(ConfigError) as err:
        Hardware(device="cpu", dtype="fp32", compile="reduce-overhead")
    assert str(err.value) == (
        "hardware.compile=reduce-overhead: CUDA graphs need a CUDA device (device=cpu); "
        "allowed here: false, true, default, max-autotune"
    )
    assert Hardware(device="cpu", dtype="fp32", compile="max-autotune").compile == "max-autotune"


def test_compile_on_cuda_needs_triton_and_sm70(fake_cuda, monkeypatch):
    """CUDA mocked: torch.compile on CUDA is refused in one line without Triton or on a GPU older than sm_70."""
    real = importlib.util.find_spec
    triton: dict = {"spec": None}
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: triton["spec"] if name == "triton" else real(name, *a)
    )
    hw = Hardware(device="cuda", dtype="bf16", compile=True)
    with pytest.raises(ConfigError) as err:
        hw.compiled(tiny_model())
    assert str(err.value) == (
        "hardware.compile=true: torch.compile on CUDA needs Triton, which is not installed; install it (pip install "
        "triton) or set hardware.compile=false"
    )
    triton["spec"] = importlib.machinery.ModuleSpec("triton", None)
    fake_cuda.name, fake_cuda.capability = "Tesla P100-PCIE-16GB", (6, 0)
    with pytest.raises(ConfigError) as err:
        Hardware(device="cuda", dtype="fp16", compile=True).compiled(tiny_model())
    assert str(err.value) == (
        "hardware.compile=true: Tesla P100-PCIE-16GB (sm_60) is older than Triton supports (sm_70); "
        "set hardware.compile=false"
    )
    fake_cuda.capability = (8, 0)
    model = tiny_model()
    assert hw.compiled(model) is model and model._compiled_call_impl is not None


@pytest.mark.slow  # torch.compile (Inductor, C++ on this CPU) of a 2-layer model: ~30-60 s on 2 cores
def test_checkpoint_of_a_compiled_run_loads_into_an_eager_model(tmp_path):
    """gptlab-train hardware.compile=true (bf16: the chunked loss compiled too) writes a checkpoint whose keys are the
    eager model's; a model built uncompiled from the run's config loads it strictly and reproduces its val loss."""
    from omegaconf import OmegaConf

    from gptlab.config.build import build_data, build_model
    from gptlab.state import checkpoint

    run = tmp_path / "compiled"
    summary = run_inprocess(run, "hardware.compile=true", "hardware.dtype=bf16", steps=2, eval_interval=2)
    assert summary["status"] == "finished"
    state = checkpoint.load_latest(run)
    assert int(state["step"]) == 2 and not any("_orig_mod" in k for k in state["model"])
    cfg = OmegaConf.create(state["identity"]["config"])
    data = build_data(cfg, int(cfg.model.block_size))
    model = build_model(cfg, vocab_size=data.vocab_size).eval()
    model.load_state_dict(state["model"], strict=True)
    assert model._compiled_call_impl is None
    x, y = data.val_samples(int(cfg.train.eval_sequences))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = model(x, y)
    (val,) = [r["val/loss"] for r in rows(run) if r["step"] == 2 and "val/loss" in r]
    assert float(loss) == pytest.approx(val, rel=1e-3)  # eager vs Inductor kernels, both bf16 (here: 6e-8)


# ---- 5. dependency floors: what the code calls ------------------------------------------------------------------


def test_dependency_floors_cover_the_apis_used():
    """torch>=2.9: torch.backends.*.fp32_precision (hardware.apply) and torch.optim.Muon; wandb>=0.19.10:
    wandb.init(reinit="create_new") (sinks/wandb.py)."""
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    floors = {}
    for line in re.findall(r'^\s*"((?:torch|wandb)>=[^"]+)"', text, flags=re.M):  # the dependencies list's entries
        req = Requirement(line)
        floors[req.name] = min(Version(s.version) for s in req.specifier if s.operator == ">=")
    assert floors["torch"] >= Version("2.9") and floors["wandb"] >= Version("0.19.10")
    assert hasattr(torch.backends.cuda.matmul, "fp32_precision") and hasattr(torch.optim, "Muon")
    sink = (Path(__file__).resolve().parents[1] / "gptlab" / "sinks" / "wandb.py").read_text()
    assert 'reinit="create_new"' in sink
