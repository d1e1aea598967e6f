"""W&B, Hydra and torchrun conventions a user brings from elsewhere are honoured and recorded, or refused in one line.

- WANDB_PROJECT / WANDB_RUN_GROUP / WANDB_TAGS were ignored (gptlab always passed its own), WANDB_ENTITY was used but
  not recorded; as in wandb.init, a key set in logger.wandb beats the environment, which beats gptlab's defaults;
- under a `wandb agent` W&B picks the run id and project itself: summary.json records what W&B used;
- `hydra/launcher=submitit_slurm` (Hydra's spelling) got the plugin's stock settings, without launcher=slurm's
  requeue: refused naming launcher=slurm, before any job;
- a multi-node torchrun run recorded no world size, its config said hardware.nodes: 1, and rank 1 wrote a second
  "run finished" block into the shared train.log.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gptlab.errors import ConfigError
from gptlab.sinks.progress import console_log
from helpers.cli import cli_env, run_cli
from helpers.train import FAST, TINY, run_inprocess, train_env, workers

WANDB = ["logger=wandb", "logger.wandb.mode=offline"]


def _recorded(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())["wandb"]


def test_wandb_environment_is_honoured_below_explicit_keys_and_recorded(tmp_path, monkeypatch):
    run_inprocess(tmp_path / "plain", *TINY, *WANDB, steps=1, eval_interval=1)
    where = _recorded(tmp_path / "plain")
    assert (where["project"], where["entity"], where["group"]) == ("gptlab", None, "default")
    monkeypatch.setenv("WANDB_PROJECT", "env-project")
    monkeypatch.setenv("WANDB_ENTITY", "env-entity")
    monkeypatch.setenv("WANDB_RUN_GROUP", "env-group")
    monkeypatch.setenv("WANDB_TAGS", "env-a, env-b")
    run_inprocess(tmp_path / "env", *TINY, *WANDB, steps=1, eval_interval=1)
    where = _recorded(tmp_path / "env")
    assert (where["project"], where["entity"], where["group"]) == ("env-project", "env-entity", "env-group")
    assert where["tags"][:2] == ["env-a", "env-b"]
    keys = ["logger.wandb.project=mine", "logger.wandb.entity=me", "logger.wandb.group=g", "logger.wandb.tags=[t]"]
    run_inprocess(tmp_path / "keys", *TINY, *WANDB, *keys, steps=1, eval_interval=1)
    where = _recorded(tmp_path / "keys")
    assert (where["project"], where["entity"], where["group"], where["tags"][:1]) == ("mine", "me", "g", ["t"])


def test_under_a_wandb_agent_the_run_id_and_project_wandb_used_are_recorded(tmp_path):
    """A `wandb agent` starts each run with WANDB_SWEEP_ID, WANDB_RUN_ID and WANDB_PROJECT set; W&B then uses its id
    and project whatever init was given (read once per process, so the run is a CLI of its own here)."""
    run = tmp_path / "run"
    agent = train_env(WANDB_SWEEP_ID="sweep123", WANDB_RUN_ID="agentrun1", WANDB_PROJECT="agent-project")
    args = [*FAST, *TINY, "train.max_steps=1", "train.eval_interval=1", *WANDB, "logger.wandb.project=mine"]
    done = run_cli("gptlab.cli.train", *args, f"hydra.run.dir={run}", cwd=tmp_path, env=agent)
    assert done.returncode == 0, done.stderr[-2000:]
    where = _recorded(run)
    assert (where["id"], where["project"], where.get("sweep_id")) == ("agentrun1", "agent-project", "sweep123")
    assert (run / "wandb_run_id").read_text().strip() == "agentrun1"  # a resume (gptlab-eval too) continues it
    assert where["folders"] and all(Path(f).name.endswith("-agentrun1") for f in where["folders"])


LAUNCH_ARGS = st.lists(st.sampled_from(["-m", "train.max_steps=1", "seed=1,2", "hardware=cpu", "sweep=x"]), max_size=4)


@settings(max_examples=60, deadline=None)
@given(before=LAUNCH_ARGS, after=LAUNCH_ARGS, stock=st.sampled_from(["submitit_slurm", "submitit_local"]),
       prefix=st.sampled_from(["", "+", "~"]), preset=st.sampled_from([None, "slurm", "local"]))  # fmt: skip
def test_hydras_spelling_of_a_launcher_preset_is_refused_naming_the_preset(before, after, stock, prefix, preset):
    from gptlab.config.command_line import check_command_line  # new with the refusal (the CLI test runs on old code)

    wanted = {"submitit_slurm": "slurm", "submitit_local": "local"}[stock]
    args = [*before, f"{prefix}hydra/launcher={stock}", *after, *([f"launcher={preset}"] if preset else [])]
    if preset == wanted:
        check_command_line(args)
        return
    with pytest.raises(ConfigError, match=rf"^hydra/launcher={stock}: .*; allowed: launcher={wanted} "):
        check_command_line(args)


def test_the_cli_refuses_hydras_launcher_spelling_before_any_job(tmp_path):
    done = run_cli("gptlab.cli.train", "-m", "hydra/launcher=submitit_slurm", "train.max_steps=1", cwd=tmp_path)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith("error: hydra/launcher=submitit_slurm: ") and "launcher=slurm" in lines[0]
    assert not any(tmp_path.iterdir())  # no sweep dir, no job submitted


def test_a_later_rank_copies_no_console_lines_into_the_shared_log(tmp_path, monkeypatch):
    handler = logging.FileHandler(tmp_path / "train.log")
    console_log.addHandler(handler)
    try:
        monkeypatch.setenv("RANK", "1")
        console_log.info("run finished: finished after 2 steps")
        console_log.warning("rank 1 saw something")
        monkeypatch.setenv("RANK", "0")
        console_log.info("run finished: finished after 2 steps (rank 0)")
    finally:
        console_log.removeHandler(handler)
        handler.close()
    lines = (tmp_path / "train.log").read_text().splitlines()
    assert lines == ["rank 1 saw something", "run finished: finished after 2 steps (rank 0)"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # two torchrun agents, as two nodes on this host (~30 s on a loaded 2-core machine)
def test_a_two_node_torchrun_run_records_its_shape_and_one_report(tmp_path):
    port, run = _free_port(), tmp_path / "two"
    common = [*FAST, *TINY, "train.max_steps=2", "train.eval_interval=2", "hardware=ddp_cpu", f"hydra.run.dir={run}"]
    agent = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
             f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=gptlab-shape"]  # fmt: skip
    env = cli_env(OMP_NUM_THREADS="1")
    agents = [
        subprocess.Popen(
            [*agent, f"--node_rank={node}", "-m", "gptlab.cli.train", *common],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for node in (0, 1)
    ]
    try:
        results = [a.communicate(timeout=600) for a in agents]
    finally:
        for pid in [w for a in agents for w in workers(a.pid)]:
            os.kill(pid, signal.SIGKILL)
        for a in agents:
            a.kill()
    assert [a.returncode for a in agents] == [0, 0], [err[-2000:] for _, err in results]
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["world_size"], summary["nodes"], summary["tasks_per_node"]) == (2, 2, 1)
    provenance = json.loads((run / "provenance.json").read_text())
    assert provenance["hardware"]["world_size"] == 2 and provenance["hardware"]["nodes"] == 2
    assert provenance["config"]["hardware"]["nodes"] == 2 and provenance["config"]["hardware"]["tasks_per_node"] == 1
    assert (run / "train.log").read_text().count("run finished:") == 1
