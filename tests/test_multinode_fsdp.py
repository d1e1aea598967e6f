"""hardware=fsdp_cpu across two "nodes" on this host: two torchrun agents (`--nnodes 2 --nproc-per-node 1`, c10d
rendezvous on the loopback, one gloo rank each) train one FSDP2 run that follows one process's curve; its sharded
checkpoints resume on 1 process and on 2 agents; a node killed with SIGKILL takes the other down within seconds and
leaves nothing running, and 2 agents resume to the uninterrupted curve; nodes that share no file system stop at the
first checkpoint, and nodes whose clocks name different run dirs still write one whole checkpoint; the SLURM path of
a 2-node fsdp job gives each rank what that torchrun line gives it, and trains.

A node is one agent started in a session of its own, as `torchrun` is on each machine; torchrun starts its rank in
another session, so every process a test starts carries NODE_TAG in its environment, and the test's `finally` kills
the process group of each one still alive (an orphaned rank included).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from unittest import mock

import pytest
from test_multinode import sbatch_text

from gptlab.runtime.distributed import master_port
from gptlab.state import checkpoint
from helpers.cli import cli_env, python_bin
from helpers.fsdp import ARGS as FSDP_ARGS
from helpers.fsdp import FSDP, assert_close_curves, curve, free_port, interrupted_copy
from helpers.train import run_inprocess, workers

SIZE = ["model.n_layer=2", "model.d_model=32"]  # the tiniest model with blocks to shard (2 blocks + the root)
STEPS = ["train.max_steps=16", "train.eval_interval=4"]
ARGS = [*FSDP_ARGS, *SIZE, *STEPS, "train.ckpt_interval=8"]  # later overrides of a key win: checkpoints at 8 and 16
KILL = ["train.ckpt_interval=4"]  # a checkpoint at 4, then 12 steps (~0.5 s) for the kill to land in
NODE_TAG = "GPTLAB_TEST_NODE"
RANK_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
UNSHARE = ["unshare", "--mount", "--propagation", "private", "sh", "-c"]  # + a script: a mount only this node sees
DEADLINE_S = 240  # one launch of two agents: 12 s on 2 idle cores, about 20 s on 2 busy ones
# What `torchrun --nnodes 2 --nproc-per-node 1` gives the rank on each node (the first test reads it off real agents)
TORCHRUN_RANKS = {r: {"RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"} for r in (0, 1)}
# Losses follow one process within helpers.fsdp.TOLERANCE (1e-5). A grad norm is more sensitive to the order of the
# gradient's sums: at step 13 of this config one process gives 1.567924, two ranks 1.568010 (8.6e-5 apart) and one
# process with train.grad_accum=2 (the same samples summed as two half-batch means) 1.568052 -- the gap is summation
# order, not sharding. 5e-4 is 6x the measured gap and still far below a norm over one shard (~30% off).
GRAD_NORM_TOL = 5e-4


def wait_until(ready, procs, timeout: float = DEADLINE_S, what: str = "") -> None:
    """Poll ready() every 2 ms; fail if a process in procs exits first or the timeout passes."""
    end = time.monotonic() + timeout
    while not ready():
        assert all(p.poll() is None for p in procs), f"a node exited before {what}: {[p.poll() for p in procs]}"
        assert time.monotonic() < end, f"no {what} after {timeout} s"
        time.sleep(0.002)


def listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def environ(pid: int) -> dict[str, str]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    return dict(p.split("=", 1) for p in pairs if "=" in p)


class Nodes:
    """Two torchrun agents on this host as two nodes of one job; a context manager that leaves no process behind.

    Node 0's agent starts first and node 1's only once the rendezvous endpoint listens, so node 0 is the head node:
    its agent hosts the c10d store, as the agent on the machine named in --rdzv-endpoint does on a cluster.
    stderr goes to <run_dir>.node<N>.err.
    """

    def __init__(self, run_dir: Path, *args: str, private: Path | None = None, clocks: tuple[str, str] | None = None):
        """private: node 1 sees this dir at run_dir (a mount namespace of its own): nodes that share no file system.
        clocks: each node's TZ, with hydra.run.dir left to its default (under run_dir/outputs), which holds the time
        each rank started: nodes whose clocks read different times."""
        self.run_dir, self.tag, port = run_dir, uuid.uuid4().hex, free_port()
        cmd = [
            python_bin(),
            *("-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1"),
            *("--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"{run_dir.name}-{port}"),
            *("-m", "gptlab.cli.train", *ARGS, *args, *([] if clocks else [f"hydra.run.dir={run_dir}"])),
        ]
        run_dir.mkdir(parents=True, exist_ok=True)  # the cwd; a mount point for `private`
        self.agents: list[subprocess.Popen] = []
        for node in (0, 1):
            env = cli_env(OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="0", **{NODE_TAG: self.tag})
            if clocks:
                env["TZ"] = clocks[node]
            if node == 1 and private is not None:
                cmd = [*UNSHARE, f'mount --bind "{private}" "{run_dir}" && exec "$@"', "sh", *cmd]
            with open(f"{run_dir}.node{node}.err", "a") as err:
                self.agents.append(
                    subprocess.Popen(
                        cmd, cwd=run_dir, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
                    )
                )
            if node == 0:
                wait_until(lambda: listening(port), self.agents, 60, "rendezvous endpoint")

    def __enter__(self) -> Nodes:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def tagged(self) -> list[int]:
        """Live processes this test started: the agents, their ranks, a rank orphaned by its agent's death."""
        needle = f"{NODE_TAG}={self.tag}".encode()
        found = []
        for path in Path("/proc").glob("[0-9]*/environ"):
            with contextlib.suppress(OSError):
                if needle in path.read_bytes().split(b"\0"):
                    found.append(int(path.parent.name))
        return found

    def rank_env(self, node: int) -> dict[str, str]:
        """The distributed env of the rank this node's agent started (waits until the rendezvous started it)."""
        agent = self.agents[node]
        found: dict[str, str] = {}

        def started() -> bool:
            # between the agent's fork and the rank's exec the child still holds the agent's argv and environment
            # (no RANK; seen once in a whole run): wait for the exec'd rank's own environment
            for pid in workers(agent.pid):
                with contextlib.suppress(OSError):
                    env = {k: v for k, v in environ(pid).items() if k in RANK_KEYS}
                    if "RANK" in env:
                        found.update(env)
                        return True
            return False

        wait_until(started, [agent], what=f"rank on node {node}")
        return found

    def kill(self, node: int) -> None:
        """The node dies: SIGKILL its agent's process group and its rank's (torchrun gives the rank its own session)."""
        agent = self.agents[node]
        ranks = workers(agent.pid)
        for group in [agent.pid, *ranks]:
            os.killpg(group, signal.SIGKILL)
        agent.wait(timeout=30)

    def finish(self, timeout: float = DEADLINE_S) -> None:
        """Both agents exit 0 (else the tails of their stderr)."""
        codes = [a.wait(timeout=timeout) for a in self.agents]
        errors = "".join(Path(f"{self.run_dir}.node{n}.err").read_text()[-1500:] for n in (0, 1))
        assert codes == [0, 0], errors

    def stop(self) -> None:
        """SIGKILL the process group of every process this test started that is still alive, then reap the agents."""
        for pid in {a.pid for a in self.agents if a.poll() is None} | set(self.tagged()):
            with contextlib.suppress(ProcessLookupError):
                group = os.getpgid(pid)
                if group != os.getpgrp():  # never pytest's own group
                    os.killpg(group, signal.SIGKILL)
        for agent in self.agents:
            agent.wait(timeout=30)


def assert_follows(got: list[dict], want: list[dict]) -> float:
    """Same rows, steps, lr and tokens; losses within 1e-5, grad norms within GRAD_NORM_TOL; the largest loss gap."""
    losses = [[{k: v for k, v in r.items() if k != "train/grad_norm"} for r in c] for c in (got, want)]
    worst = assert_close_curves(*losses)
    for a, b in zip(got, want):
        if "train/grad_norm" in a:
            assert abs(a["train/grad_norm"] - b["train/grad_norm"]) <= GRAD_NORM_TOL, (a["step"], a, b)
    return worst


def train_on_two_nodes(run_dir: Path, *args: str) -> dict[int, dict[str, str]]:
    """One run on two agents, to the end; returns each node's rank env."""
    with Nodes(run_dir, *args) as nodes:
        envs = {node: nodes.rank_env(node) for node in (0, 1)}
        nodes.finish()
    return envs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"two": the run on two agents, "one": the same config in one process, "env": each node's rank env}."""
    base = tmp_path_factory.mktemp("fsdp2nodes")
    env = train_on_two_nodes(base / "two")
    run_inprocess(base / "one", *FSDP, *SIZE, "train.ckpt_interval=8", steps=16, eval_interval=4)
    return {"two": base / "two", "one": base / "one", "base": base, "env": env}


@pytest.mark.slow  # 20 s (2 busy cores): the module's two-agent run, in its setup
def test_two_torchrun_agents_train_fsdp_like_one_process_and_shard_their_checkpoints(runs):
    env = runs["env"]  # one rank per node, numbered by the rendezvous (c10d ignores --node-rank)
    assert sorted((e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) for e in env.values()) == [
        tuple(TORCHRUN_RANKS[r].values()) for r in (0, 1)
    ]
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in env.values()}) == 1  # one store, on the head node
    worst = assert_follows(curve(runs["two"]), curve(runs["one"]))  # rank 0 alone logs: no duplicate rows
    print(f"\nmax |2 nodes - 1 process| over 16 steps: {worst:.2e}")
    newest = checkpoint.latest_path(runs["two"])
    assert newest.name == "step_0000016.dcp" and newest.is_dir()
    shards = sorted(newest.glob("__*_0.distcp"))
    assert [p.name for p in shards] == ["__0_0.distcp", "__1_0.distcp"]  # a file from each node's rank...
    whole = (checkpoint.ckpt_dir(runs["one"]) / "step_0000016.dcp" / "__0_0.distcp").stat().st_size
    # ...each about half (measured 0.55 and 0.60 of one process's file, headers included): sharded, not replicated
    assert all(p.stat().st_size < 0.7 * whole for p in shards)
    state = checkpoint.load(newest)
    assert state["step"] == 16 and state["identity"]["world"] == 2 and "model" not in state


@pytest.mark.slow  # 1 s of its own, but it needs the module's two-agent run (20 s)
def test_a_checkpoint_of_two_nodes_resumes_on_one_process(runs):
    run = interrupted_copy(runs["two"], runs["base"] / "two-one", keep_step=8)
    run_inprocess(run, *FSDP, *SIZE, "train.ckpt_interval=8", steps=16, eval_interval=4)  # train.resume=auto
    assert curve(run)[:11] == curve(runs["two"])[:11]  # the rows up to the checkpoint (step 8 and its eval) are kept
    worst = max(assert_follows(curve(run), curve(runs["two"])), assert_follows(curve(run), curve(runs["one"])))
    print(f"\nmax |2 nodes -> 1 process - uninterrupted (2 nodes or 1 process)|: {worst:.2e}")
    assert checkpoint.load(checkpoint.latest_path(run))["identity"]["world"] == 1


@pytest.mark.slow  # 22 s (2 busy cores): another two-agent run
def test_a_checkpoint_of_two_nodes_resumes_on_two_nodes_bit_identically(runs):
    run = interrupted_copy(runs["two"], runs["base"] / "two-two", keep_step=8)
    train_on_two_nodes(run)
    assert curve(run) == curve(runs["two"])  # same world size: the identical curve
    assert checkpoint.load(checkpoint.latest_path(run))["identity"]["world"] == 2


@pytest.mark.slow  # 45 s each (2 busy cores): a run killed after its first checkpoint, then a resume
@pytest.mark.parametrize("victim", [0, 1], ids=["head-node", "other-node"])
def test_sigkill_of_one_node_takes_the_other_down_and_two_nodes_resume_the_curve(runs, tmp_path, victim):
    """Node 0 hosts the rendezvous store (its loss breaks the other agent's store connection); node 1 does not (the
    other rank's gloo collective fails on the closed connection). Either way the other node exits non-zero on its
    own within seconds (measured: 2-5 s on 2 busy cores) and leaves no process behind."""
    run = tmp_path / "killed"
    with Nodes(run, *KILL) as nodes:
        rank = nodes.rank_env(victim)["RANK"]
        first = checkpoint.ckpt_dir(run) / "step_0000004.dcp"
        wait_until(first.exists, nodes.agents, what="first checkpoint")
        nodes.kill(victim)
        killed_at = time.monotonic()
        code = nodes.agents[1 - victim].wait(timeout=120)
        took = time.monotonic() - killed_at
        left = nodes.tagged()
    print(f"\nnode {victim} (rank {rank}) killed: node {1 - victim} exited {code} after {took:.1f} s")
    assert code != 0 and took < 60 and left == []  # the other rank exited with its agent, no orphan
    state = checkpoint.load(checkpoint.latest_path(run))
    assert 4 <= state["step"] < 16, "the kill came after the run's end"
    assert not any(checkpoint.ckpt_dir(run).glob("step_0000016.*"))
    train_on_two_nodes(run, *KILL)  # train.resume=auto
    assert curve(run) == curve(runs["two"])  # checkpoint interval is not part of the curve
    assert checkpoint.load(checkpoint.latest_path(run))["step"] == 16


@pytest.mark.slow  # 19 s (2 busy cores): another two-agent run
def test_nodes_whose_clocks_name_other_run_dirs_write_one_sharded_checkpoint(runs, tmp_path):
    """hydra.run.dir left to its default, outputs/runs/<date>/<time>-<rendezvous id>: each rank names it from its
    own clock when it starts, so two nodes (here: one an hour ahead, by its TZ; on a cluster, ranks started a second
    apart) name two dirs. Rank 0's dir holds the run; rank 1 writes its shards there too, not into its own."""
    with Nodes(tmp_path, clocks=("UTC0", "UTC-1")) as nodes:
        nodes.finish()
    dirs = sorted((tmp_path / "outputs" / "runs").glob("*/*"))
    assert len(dirs) == 2 and dirs[0].name[:2] != dirs[1].name[:2]  # two run dirs, an hour apart
    (run,) = [d for d in dirs if (d / "metrics.jsonl").exists()]
    assert curve(run) == curve(runs["two"])
    newest = checkpoint.latest_path(run)
    assert newest.name == "step_0000016.dcp" and checkpoint.load(newest)["identity"]["world"] == 2  # both shards
    (other,) = [d for d in dirs if d != run]
    assert not list(other.rglob("*.distcp"))


def can_unshare() -> bool:
    probe = subprocess.run([*UNSHARE, "mount --bind / /mnt"], capture_output=True, timeout=30)
    return probe.returncode == 0


@pytest.mark.slow  # 22 s (2 busy cores): two agents up to their first checkpoint
def test_nodes_that_do_not_share_the_run_dir_fail_at_the_first_checkpoint(tmp_path):
    """Node 1 sees its own empty dir at the run dir's path (a bind mount in its own mount namespace), as a node
    whose run dir is on a local disk does. Each rank writes its shard into its own copy of the checkpoint; DCP's save
    succeeds regardless, so without a check the run finished with checkpoints all missing rank 1's shard, unreadable
    at the first resume. The save refuses: the run stops at step 4 with the reason, and leaves no checkpoint."""
    if not can_unshare():
        pytest.skip("needs a private mount namespace (unshare --mount: root or CAP_SYS_ADMIN)")
    run, private = tmp_path / "run", tmp_path / "node1-disk"
    private.mkdir()
    with Nodes(run, *KILL, private=private) as nodes:
        codes = [agent.wait(timeout=DEADLINE_S) for agent in nodes.agents]
    log = Path(f"{run}.node0.err").read_text()
    assert codes[0] != 0 and codes[1] != 0, log[-2000:]
    assert "shard __1_0.distcp: missing in .step_0000004.dcp.tmp on rank 0" in log
    assert "the ranks do not share the run dir's file system" in log
    assert list(checkpoint.ckpt_dir(run).iterdir()) == []  # the temp dir removed, nothing to resume from by mistake
    assert list((private / "checkpoints").glob(".step_0000004.dcp.tmp/__1_0.distcp"))  # rank 1's shard: on its disk
    assert max(r["step"] for r in curve(run)) == 4


def slurm_task_env(job: str, nodelist: str, procid: int) -> dict[str, str]:
    """The variables SLURM gives task `procid` of a `--nodes=2 --ntasks-per-node=1` job (one task per node)."""
    return {
        "SLURM_JOB_ID": job,
        "SLURM_NTASKS": "2",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_NODEID": str(procid),
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": "0",
    }


def exported(task: dict[str, str]) -> dict[str, str]:
    """The rank env gptlab.runtime.distributed.export_slurm_env makes of a task's SLURM variables; os.environ is
    restored whole afterwards (monkeypatch would leave the keys export_slurm_env added, WORLD_SIZE among them)."""
    from gptlab.runtime.distributed import export_slurm_env

    with mock.patch.dict(os.environ):
        for key in (*RANK_KEYS, "SUBMITIT_EXECUTOR"):
            os.environ.pop(key, None)
        os.environ.update(task)
        export_slurm_env()
        return {k: os.environ[k] for k in RANK_KEYS}


def test_the_slurm_path_of_a_two_node_fsdp_job_is_that_torchrun_line(tmp_path):
    """launcher=slurm runs no torchrun: sbatch asks for 2 nodes x 1 task, srun starts one rank per task, and each
    rank turns its SLURM variables into the env `torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d
    --rdzv-endpoint <head node>:<port>` gives its worker: the same ranks and sizes, the head node (the job's first)
    as the master, one port per job id (the rendezvous id)."""
    script = sbatch_text(tmp_path, "hardware=fsdp", "hardware.nodes=2", "hardware.tasks_per_node=1")
    for line in ("--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=1"):  # --nnodes 2 --nproc-per-node 1
        assert f"#SBATCH {line}\n" in script
    (launch_line,) = [ln for ln in script.splitlines() if ln.startswith("srun ")]
    assert launch_line.endswith(" python -m gptlab.cli.train") and "torchrun" not in script  # a rank per task
    slurm = {n: exported(slurm_task_env("4242", "gpu[07-08]", n)) for n in (0, 1)}
    for rank in (0, 1):
        assert {k: slurm[rank][k] for k in TORCHRUN_RANKS[rank]} == TORCHRUN_RANKS[rank]
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in slurm.values()} == {("gpu07", slurm[0]["MASTER_PORT"])}
    other_job = exported(slurm_task_env("4243", "gpu[07-08]", 0))
    assert other_job["MASTER_PORT"] != slurm[0]["MASTER_PORT"]  # another job, another rendezvous


def test_a_slurm_jobs_port_lies_below_the_ports_outgoing_connections_take():
    """submitit's own MASTER_PORT (20000-60000, seeded by the job id) fell inside Linux's default ephemeral range
    (32768-60999) two times in three; a CI run met one held by a connection: rank 0's store failed with EADDRINUSE
    and rank 1 waited for it until the job's time limit. Every job id now gets a port in 20000-32767, one per id
    for the last 12,768 ids, the same on every rank."""
    ids = range(1, 40_000, 3)
    ports = [int(exported(slurm_task_env(str(j), "gpu[07-08]", 0))["MASTER_PORT"]) for j in ids[:200]]
    ports += [master_port(j) for j in ids[200:]]
    assert min(ports) >= 20000 and max(ports) <= 32767
    assert len({master_port(j) for j in range(100_000, 100_000 + 12_768)}) == 12_768
    for j in ("113", "4242", "987654"):
        assert {exported(slurm_task_env(j, "gpu[07-08]", n))["MASTER_PORT"] for n in (0, 1)} == {
            str(master_port(int(j)))
        }


@pytest.mark.slow  # 11 s (2 busy cores): two ranks
def test_two_slurm_tasks_train_fsdp_like_one_process(runs, tmp_path):
    """The two tasks of that job, run here with nothing but their SLURM variables: the head node is `localhost`,
    the port comes from the job id (one whose port is free here), and the run follows one process's curve."""
    job = next(
        j
        for j in map(str, range(4242, 4342))
        if not listening(int(exported(slurm_task_env(j, "localhost,node2", 0))["MASTER_PORT"]))
    )
    run, ranks = tmp_path / "slurm", []
    try:
        for procid in (0, 1):
            env = cli_env(OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="0")
            for key in (*RANK_KEYS, "SUBMITIT_EXECUTOR"):
                env.pop(key, None)
            env |= slurm_task_env(job, "localhost,node2", procid)
            with open(f"{run}.err{procid}", "w") as err:
                ranks.append(
                    subprocess.Popen(
                        [python_bin(), "-m", "gptlab.cli.train", *ARGS, f"hydra.run.dir={run}"],
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=err,
                        start_new_session=True,
                    )
                )
        codes = [p.wait(timeout=DEADLINE_S) for p in ranks]
    finally:
        for p in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
    assert codes == [0, 0], "".join(Path(f"{run}.err{r}").read_text()[-1500:] for r in (0, 1))
    worst = assert_follows(curve(run), curve(runs["one"]))
    print(f"\nmax |2 SLURM tasks - 1 process|: {worst:.2e}")
    assert checkpoint.load(checkpoint.latest_path(run))["identity"]["world"] == 2
