"""The timing session: every arm timed alone on one machine, built as its training run built it, in interleaved rounds
with the baseline timed twice per round (the A/A control); windows written to timing.json as they finish.

Why: a training run's own tokens/s is whatever the machine gave it while it trained. A run sharing the machine (a
packed local queue, another user) reads slower, the last run of an odd count trains alone and reads faster, and two
identical arms read up to 1.35x apart. So speed is measured on its own, after (or beside) training:

- each arm is rebuilt from one of its training runs' saved config (.hydra/config.yaml) with gptlab/train/bundle.py
  build_bundle, exactly as the run built it: model, data path (prefetch), optimizer, dtype, compile mode, batch,
  sequence length, grad accumulation, and the torch threads its run recorded (provenance.json); the model's
  fingerprint must match the one the run recorded (summary.json), else the code changed since and the arm is refused;
- a window is WARMUP untimed steps (compilation, allocation, the optimizer's first state) then STEPS timed steps of
  the loop's own step (train_step, set_lr, apply_update from gptlab/train/loop.py), timed with the loop's StepClock;
  the figure is the median step time. Every window warms up the same way, whether its arm stayed built since its
  last window or was built again for it, so keeping arms in memory changes no rule. Evals, checkpoints and the
  observers (train.diagnostics, spike checks) do not run: a run's step time leaves them out too;
- R rounds; each round times every arm once and the baseline (the first arm) twice, in an order shuffled from
  (seed, round) alone, so a relaunch or a session grown by rounds repeats the same orders;
- arms stay built across windows when their estimated training memory (gptlab/costs, as the run's memory check)
  sums to at most KEEP_SHARE of the memory free at the start; otherwise each window builds its arm and frees it after;
- the machine's outside load (gptlab/runtime/cpu_load.py) is sampled over each window's timed steps, with the
  1-minute load average before and after; the machine (host, CPU, GPU, torch, threads) and one matmul peak FLOP/s
  measured at the session's start (gptlab/runtime/peak.py) are recorded, so MFU comes from the timing and one peak.

timing.json is rewritten atomically after every window: a killed session relaunched with the same plan times only the
windows it lacks; a relaunch may add rounds, anything else is refused in one line naming the file. The statistics
are gptlab/compare/statistics/rounds.py's. Training runs' tokens/s are never read here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import gc
import logging
import os
import platform
import socket
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from gptlab.config import build
from gptlab.config.validate import validate
from gptlab.costs.memory import available_memory
from gptlab.costs.sharding import micro_batch
from gptlab.errors import ConfigError
from gptlab.runtime import peak
from gptlab.runtime.cpu_load import LoadSampler
from gptlab.runtime.hardware import Hardware
from gptlab.runtime.metrics import StepClock
from gptlab.sinks.jsonl import SUMMARY_FILE, read_summary
from gptlab.state.rundir import run_config, saved_tokenizer
from gptlab.train import prefetch
from gptlab.train.bundle import Bundle, build_bundle
from gptlab.train.loop import apply_update, checks_each_step, set_lr, train_step
from gptlab.util.io import write_json_atomic
from gptlab.util.stored import Check, read_json, read_yaml

log = logging.getLogger(__name__)

TIMING_FILE = "timing.json"
LOCK_FILE = ".timing.lock"  # held (flock) by the one process running a session in a folder
VERSION = 1
KEEP_SHARE = 0.5  # arms stay built when their estimated training memory sums to at most this share of the free memory
FIX = "relaunch with the plan it records (more rounds are allowed), or move it aside to start a new session"


@dataclass(frozen=True)
class Arm:
    """One arm of a session: its name and the run dir of one training run of it (the first arm is the baseline)."""

    name: str
    run_dir: Path


@dataclass(frozen=True)
class Plan:
    """What a session times: the arms (baseline first), R rounds of one window per arm plus the baseline's A/A window,
    each window `warmup` untimed then `steps` timed steps, in orders shuffled from `seed`."""

    arms: tuple[Arm, ...]
    rounds: int = 5
    steps: int = 20
    warmup: int = 5
    seed: int = 0

    def __post_init__(self) -> None:
        names = [a.name for a in self.arms]
        if not names or len(set(names)) != len(names):
            raise ConfigError(
                f"timing: arms {names}: give at least one arm, each name once (the first is the baseline)"
            )
        for key, value, least in (("rounds", self.rounds, 1), ("steps", self.steps, 1), ("warmup", self.warmup, 1)):
            if not isinstance(value, int) or value < least:
                raise ConfigError(f"timing: {key}={value!r}; allowed: an integer >= {least}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"timing: seed={self.seed!r}; allowed: an integer >= 0")

    @property
    def baseline(self) -> str:
        return self.arms[0].name

    def order(self, round_: int) -> list[tuple[str, int]]:
        """Round `round_`'s windows in timing order, (arm, repeat): every arm with repeat 0 and the baseline again
        with repeat 1 (its A/A window), shuffled by (seed, round) alone."""
        windows = [(a.name, 0) for a in self.arms] + [(self.baseline, 1)]
        shuffled = np.random.default_rng([self.seed, round_]).permutation(len(windows))
        return [windows[int(i)] for i in shuffled]

    def windows(self) -> int:
        return self.rounds * (len(self.arms) + 1)

    def to_json(self) -> dict:
        arms = [{"name": a.name, "run_dir": str(Path(a.run_dir).resolve())} for a in self.arms]
        return {"arms": arms, "rounds": self.rounds, "steps": self.steps, "warmup": self.warmup, "seed": self.seed}


@dataclass
class Setup:
    """One arm read back from its run dir: the config to build (threads pinned as the run had them), the validated
    hardware, its group choices and the model fingerprint its run recorded (None: a run from before it was kept)."""

    arm: Arm
    cfg: DictConfig
    hardware: Hardware
    choices: dict
    fingerprint: str | None


def read_arm(arm: Arm) -> Setup:
    """The arm's training run read back as a Setup; a run dir without a saved config, or a multi-rank run (a session
    times one process), is a one-line ConfigError."""
    run_dir = Path(arm.run_dir)
    cfg = run_config(run_dir)
    summary = read_summary(run_dir / SUMMARY_FILE)
    provenance = read_json(run_dir / "provenance.json", "time another run of the arm", missing={})
    threads = ((provenance or {}).get("hardware") or {}).get("cpu_threads")
    if isinstance(threads, int) and threads >= 1 and not cfg.hardware.get("threads"):
        cfg.hardware.threads = threads  # as the run trained (a packed queue's slot, OMP_NUM_THREADS), not this shell's
    cfg.train.resume, cfg.train.init_from, cfg.profile = "never", None, False  # a build from scratch, nothing loaded
    if cfg.hardware.get("distributed"):
        raise ConfigError(
            f"timing: arm {arm.name} ({run_dir}) trained with hardware.distributed=true; a timing session times one "
            "process: give a single-process run of the arm"
        )
    choices = summary.get("choices")
    if not isinstance(choices, dict):  # a run that did not finish: Hydra's record of its choices
        choices = _hydra_choices(run_dir)
    fingerprint = summary.get("model_fingerprint")
    return Setup(arm, cfg, validate(cfg), dict(choices), fingerprint if isinstance(fingerprint, str) else None)


def _hydra_choices(run_dir: Path) -> dict:
    """The run's group choices from Hydra's runtime record (.hydra/hydra.yaml); {} without one."""
    saved = read_yaml(run_dir / ".hydra" / "hydra.yaml", "time another run of the arm", missing={})
    choices = OmegaConf.select(OmegaConf.create(saved), "hydra.runtime.choices") or {}
    return {str(k): str(v) for k, v in choices.items() if not str(k).startswith("hydra") and v is not None}


def need_bytes(setup: Setup) -> int | None:
    """The arm's estimated training memory (gptlab-flops' estimate, as the run's memory check); None when its
    vocabulary cannot be known without building its data."""
    cfg = setup.cfg
    vocab = OmegaConf.select(cfg, "model.vocab_size")
    if vocab is None:
        tokenizer = saved_tokenizer(Path(setup.arm.run_dir), None)
        vocab = tokenizer.vocab_size if tokenizer is not None else None
    if vocab is None:
        return None
    micro = micro_batch(int(cfg.train.batch_size), int(cfg.train.grad_accum), 1)
    report = build.cost_report(cfg, micro, int(cfg.model.block_size), vocab_size=int(vocab), dtype=setup.hardware.dtype)
    return int(report.to_dict()["memory"]["train_estimate_bytes"])


def keep_built(setups: list[Setup]) -> tuple[bool, dict]:
    """(whether every arm may stay built across windows, the record of why): their estimates sum to at most
    KEEP_SHARE of the free memory of the baseline's device; unknown estimates or memory: rebuilt per window."""
    needs = [need_bytes(s) for s in setups]
    free = available_memory(setups[0].hardware.device)
    keep = None not in needs and free is not None and sum(n or 0 for n in needs) <= KEEP_SHARE * free[0]
    record = {
        "kept": keep,
        "need_bytes": None if None in needs else sum(n or 0 for n in needs),
        "available_bytes": free[0] if free else None,
        "share": KEEP_SHARE,
    }
    return keep, record


def build_arm(setup: Setup, where: Path) -> Bundle:
    """The arm built as its run built it (build_bundle); refused when its model is not the one its run recorded."""
    bundle = build_bundle(setup.cfg, setup.hardware, where, setup.choices)
    built = bundle.identity["model"]
    if setup.fingerprint is not None and built != setup.fingerprint:
        raise ConfigError(
            f"timing: arm {setup.arm.name} builds model {built}, but its run {setup.arm.run_dir} trained "
            f"{setup.fingerprint}: the code changed since it trained; time a run of this code"
        )
    bundle.model.train()
    return bundle


def arm_record(setup: Setup, bundle: Bundle) -> dict:
    """What timing.json says of a built arm: its run, model, and the figures a speed and an MFU are computed from."""
    s, hw = bundle.settings, bundle.hardware
    return {
        "run_dir": str(Path(setup.arm.run_dir).resolve()),
        "model_fingerprint": bundle.identity["model"],
        "params": bundle.model.num_params(),
        "flops_per_token": bundle.ctx.flops_per_token,
        "run_peak_flops": bundle.ctx.peak_flops,
        "tokens_per_step": s.batch_size * bundle.data.seq_len,
        "batch_size": s.batch_size,
        "grad_accum": s.grad_accum,
        "seq_len": bundle.data.seq_len,
        "prefetch": s.prefetch,
        "device": hw.device,
        "dtype": hw.dtype,
        "compile": hw.compile,
        "threads": hw.threads,
    }


def timed_steps(bundle: Bundle, warmup: int, steps: int) -> tuple[list[float], list[float], float | None]:
    """(warm-up step seconds, timed step seconds, outside load over the timed steps) of one window: the loop's step
    on steps 0 .. warmup+steps-1 of the data order (every arm and window trains on the same batches)."""
    bundle.hardware.apply()  # this arm's threads, CUDA device and TF32 (the arms may differ)
    settings = dataclasses.replace(bundle.settings, max_steps=warmup + steps)
    device = bundle.hardware.device
    source = prefetch.batch_source(bundle.data, settings, 0, 1, device, 0)
    clock, load = StepClock(device), LoadSampler()
    marks: list[tuple[Any, Any]] = []  # (start, end) StepClock marks per step, read after the last settles
    read_each = checks_each_step(bundle.settings)  # nan_skip etc.: the loop reads each step's figures (a sync)
    try:
        for step in range(warmup + steps):
            if step == warmup:
                clock.settle(marks[-1][1])  # the warm-up's work done before the load window opens
                load.start()
            set_lr(bundle, step)
            start = clock.mark()
            loss, grad_norm, terms = train_step(bundle, source.take(step))
            if read_each:
                torch.stack([loss, grad_norm, *terms.values()]).tolist()
            apply_update(bundle)
            marks.append((start, clock.mark()))
        clock.settle(marks[-1][1])
    finally:
        source.close()
    seconds = [clock.seconds(a, b) for a, b in marks]
    return seconds[:warmup], seconds[warmup:], load.mean()


def machine_record() -> dict:
    """The machine a session times on (a relaunch elsewhere is refused)."""
    cuda = torch.cuda.is_available()
    return {
        "hostname": socket.gethostname(),
        "cpu": peak.machine_name("cpu"),
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "torch": torch.__version__,
        "machine_cores": os.cpu_count(),
        "cores": len(os.sched_getaffinity(0)),
        "platform": platform.platform(),
    }


def measure_peak(hardware: Hardware) -> dict:
    """One dense matmul peak FLOP/s on the baseline's device, dtype and threads (gptlab/runtime/peak.py), measured
    now, with the outside load while it ran: every arm's MFU uses it."""
    hardware.apply()
    load = LoadSampler()
    load.start()
    if hardware.device.startswith("cuda"):
        flops = peak.measure_gpu_matmul_peak(hardware.torch_dtype, hardware.device, hardware.tf32)
    else:
        flops = peak.measure_matmul_peak(hardware.torch_dtype, hardware.device)
    return {
        "flops": flops,
        "device": hardware.device,
        "dtype": hardware.dtype,
        "threads": torch.get_num_threads(),
        "outside_load": load.mean(),
        "measured_at": time.time(),
    }


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def window_record(round_: int, position: int, arm: str, repeat: int, built: bool, bundle: Bundle, plan: Plan) -> dict:
    """Time one window of `arm` and return its timing.json record."""
    before, started = _loadavg(), time.time()
    warm, timed, outside = timed_steps(bundle, plan.warmup, plan.steps)
    median_s = statistics.median(timed)
    tokens = bundle.settings.batch_size * bundle.data.seq_len
    return {
        "round": round_,
        "position": position,
        "arm": arm,
        "repeat": repeat,
        "built": built,  # the arm was built for this window (else it stayed built since its last one)
        "warmup_ms": [1000 * s for s in warm],
        "step_ms": [1000 * s for s in timed],
        "step_ms_median": 1000 * median_s,
        "tokens_per_s": tokens / median_s,
        "outside_load": outside,
        "loadavg_before": before,
        "loadavg_after": _loadavg(),
        "threads": torch.get_num_threads(),
        "started_at": started,
        "ended_at": time.time(),
    }


def read_session(path: Path) -> dict | None:
    """A session's timing.json (None when there is none); one that is not this version's document is refused."""
    check = Check(path, FIX)
    doc = read_json(path, FIX)
    if doc is None:
        return None
    check.mapping("timing.json", doc)
    if doc.get("version") != VERSION:
        raise check.fail(f"version={doc.get('version')!r}, this gptlab reads version {VERSION}")
    check.mapping("plan", doc.get("plan"))
    if not isinstance(doc.get("windows"), list):
        raise check.fail("windows: expected a list")
    for w in doc["windows"]:
        check.mapping("windows[]", w)
        check.number("windows[].round", w.get("round"), ">= 0", int)
        check.number("windows[].position", w.get("position"), ">= 0", int)
    return doc


def _refusal(stored: dict, plan: Plan, machine: dict) -> str | None:
    """Why a relaunch cannot continue the stored session (None: it can; more rounds are allowed)."""
    was, now = stored["plan"], plan.to_json()
    changed = [k for k in ("arms", "steps", "warmup", "seed") if was.get(k) != now[k]]
    if not isinstance(was.get("rounds"), int) or now["rounds"] < was["rounds"]:
        changed.append("rounds (only more rounds may be added)")
    if changed:
        return f"the session it records has other {', '.join(changed)}: {was}"
    place = {k: stored.get("machine", {}).get(k) for k in ("hostname", "cpu", "gpu", "torch")}
    if place != {k: machine[k] for k in place}:
        return f"the session it records ran on another machine ({place})"
    return None


def _begin(path: Path, plan: Plan, machine: dict, baseline: Setup) -> dict:
    """The stored session to continue (its plan's rounds grown to this plan's), or a new one with its peak measured."""
    stored = read_session(path)
    if stored is not None:
        why = _refusal(stored, plan, machine)
        if why:
            raise ConfigError(f"{path}: {why}; {FIX}")
        stored["plan"]["rounds"] = plan.rounds
        return stored
    return {
        "version": VERSION,
        "plan": plan.to_json(),
        "baseline": plan.baseline,
        "orders": [],
        "machine": machine,
        "peak": measure_peak(baseline.hardware),
        "memory": None,
        "arms": {},
        "windows": [],
        "status": "running",
        "started_at": time.time(),
    }


@contextlib.contextmanager
def session_lock(folder: Path) -> Iterator[None]:
    """One live session per folder (flock on LOCK_FILE, freed on any exit)."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(
            f"{folder}: another timing session is running there; wait for it or use another folder"
        ) from None
    try:
        yield
    finally:
        os.close(fd)


class _Arms:
    """The session's built arms: kept across windows, or built for one window and freed after (`keep`)."""

    def __init__(self, setups: dict[str, Setup], keep: bool, folder: Path, doc: dict):
        self.setups, self.keep, self.folder, self.doc = setups, keep, folder, doc
        self.built: dict[str, Bundle] = {}

    def get(self, name: str) -> tuple[Bundle, bool]:
        """(the arm's bundle, whether it was built now); its fingerprint must be the session's earlier one."""
        if name in self.built:
            return self.built[name], False
        bundle = build_arm(self.setups[name], self.folder)
        record = arm_record(self.setups[name], bundle)
        earlier = self.doc["arms"].get(name)
        if earlier is not None and earlier.get("model_fingerprint") != record["model_fingerprint"]:
            raise ConfigError(
                f"{self.folder / TIMING_FILE}: arm {name} now builds model {record['model_fingerprint']}, its earlier "
                f"windows timed {earlier.get('model_fingerprint')}; {FIX}"
            )
        self.doc["arms"][name] = record
        self.built[name] = bundle
        return bundle, True

    def done_with(self, name: str) -> None:
        """After a window: a rebuilt arm is freed (and its memory handed back) before the next one is built."""
        if not self.keep:
            self.release(name)

    def release(self, name: str) -> None:
        bundle = self.built.pop(name, None)
        if bundle is None:
            return
        device = bundle.hardware.device
        del bundle
        gc.collect()
        if device.startswith("cuda"):
            torch.cuda.empty_cache()


def run_session(plan: Plan, folder: Path, on_window: Callable[[dict], None] | None = None) -> dict:
    """Time `plan` into folder/timing.json (continuing a stored session of the same plan: only missing windows are
    timed); returns the document. `on_window(record)` is called after each window is written."""
    folder = Path(folder)
    path = folder / TIMING_FILE
    threads = torch.get_num_threads()
    with session_lock(folder):
        setups = {a.name: read_arm(a) for a in plan.arms}
        doc = _begin(path, plan, machine_record(), setups[plan.baseline])
        keep, doc["memory"] = keep_built(list(setups.values()))
        log.info("timing: %s", "arms stay built across windows" if keep else "each window builds its arm")
        doc["orders"] = [[list(w) for w in plan.order(r)] for r in range(plan.rounds)]
        arms = _Arms(setups, keep, folder, doc)
        try:
            _time_missing(plan, doc, arms, path, on_window)
        finally:
            for name in list(arms.built):
                arms.release(name)
            torch.set_num_threads(threads)
        doc["status"] = "finished"
        write_json_atomic(path, doc)
    return doc


def _time_missing(plan: Plan, doc: dict, arms: _Arms, path: Path, on_window: Callable[[dict], None] | None) -> None:
    """Every window of the plan not yet in doc, in round order; timing.json rewritten after each."""
    done = {(w["round"], w["position"]) for w in doc["windows"]}
    for r in range(plan.rounds):
        for position, (name, repeat) in enumerate(plan.order(r)):
            if (r, position) in done:
                continue
            bundle, built = arms.get(name)
            record = window_record(r, position, name, repeat, built, bundle, plan)
            del bundle
            arms.done_with(name)
            doc["windows"].append(record)
            doc["updated_at"] = time.time()
            write_json_atomic(path, doc)
            log.info("timing: round %d window %d (%s%s): %.2f ms/step", r, position, name, " A/A" * repeat,
                     record["step_ms_median"])  # fmt: skip
            if on_window is not None:
                on_window(record)
