"""The docs' commands, run: every code block in README.md and docs/*.md marked runnable is executed, so the commands
the docs show cannot go stale.

The marker: an HTML comment alone on the line right before a ```bash fence (GitHub does not render it):

    <!-- run -->
    ```bash
    gptlab-train attention=gqa mlp.ratio=3 norm=rmsnorm
    ```

A marked block runs as one bash script (`set -euo pipefail`) in a fresh temp dir, under the hermetic environment of
tests/conftest.py (helpers.cli.cli_env: W&B offline, private caches, one thread), with PATH = a folder of wrappers,
then the venv's bin/ (sys.executable's directory). The wrappers keep the docs' commands real but small:

- gptlab-train, and `torchrun ... -m gptlab.cli.train`: every TINY setting whose key the command does not set
  itself is appended (`gptlab-train logger=csv` keeps its logger; `--help`, `--cfg` and the like get nothing);
- gptlab-sweep: the same overrides (sweep files take them as extra overrides), and `--seeds 0` without `--seeds`;
  `gptlab-sweep status` is left alone;
- gptlab-compare on a sweep dir whose `--detach`ed local queue is still running first waits for one finished run,
  so "compare what has finished" has something to compare;
- a console script of pyproject.toml missing from the venv (an install older than the script) runs its entry point
  through the venv's python.

Each block must exit 0, and a block that runs gptlab-compare must print its comparison ("Compared at step"). A
detached sweep a block started is waited for (then killed, past a limit) before the temp dir goes. Mark only
commands that run offline on a CPU in seconds; SLURM, GPU and long commands stay unmarked examples.

The blocks run in the `slow` tests (about 3-4 minutes on 2 cores); the fast ones check the parsing (every marker
is on a bash block, every page's blocks are found), the README's length (<= 220 lines), that no internal tracker
numbers ("issue 16") are left in the docs, and that relative links and their #anchors resolve.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.cli import cli_env

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKER = "<!-- run -->"
FENCE = re.compile(r"^(?P<ticks>`{3,}|~{3,})\s*(?P<info>[^`]*)$")

# Appended to gptlab-train / gptlab-sweep commands for each key they do not set (a run of ~5 s on 2 cores).
TINY = [
    "train.max_steps=2",
    "model.n_layer=1",
    "model.d_model=32",
    "model.n_head=8",
    "model.block_size=32",
    "train.batch_size=4",
    "train.eval_sequences=8",
    "sample.tokens=0",
    "logger=none",
    "hardware.peak_flops=1e12",  # skip the per-machine matmul probe (re-run on a busy machine: not cached)
]
NO_TINY = ("--help", "-h", "--cfg", "--hydra-help", "--info", "--shell-completion")
README_MAX_LINES = 220
ISSUE_REF = re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE)


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it is, its info string, whether it is marked runnable, its text."""

    path: Path
    line: int  # 1-based line of the opening fence
    info: str
    runnable: bool
    text: str

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def scan(path: Path) -> tuple[list[Block], list[int]]:
    """(every fenced block of a markdown file, the lines of markers outside fences). A fence nested in a longer fence
    is text; a marker that is not right before a bash fence is a Block with info "stray marker"."""
    found: list[Block] = []
    markers: list[int] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i].strip())
        if not match:
            if lines[i].strip() == MARKER:
                markers.append(i + 1)
                nxt = FENCE.match(lines[i + 1].strip()) if i + 1 < len(lines) else None
                if not nxt or nxt["info"].split()[:1] != ["bash"]:
                    found.append(Block(path, i + 1, "stray marker", True, ""))
            i += 1
            continue
        ticks, start = match["ticks"], i
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(ticks) and not lines[i].strip().strip(ticks[0])):
            i += 1
        marked = start > 0 and lines[start - 1].strip() == MARKER
        found.append(Block(path, start + 1, match["info"].strip(), marked, "\n".join(lines[start + 1 : i])))
        i += 1
    return found, markers


def blocks(path: Path) -> list[Block]:
    return scan(path)[0]


def runnable() -> list[Block]:
    return [b for path in DOCS for b in blocks(path) if b.runnable and b.info != "stray marker"]


def override_key(arg: str) -> str | None:
    """The config key an override sets (`+a.b=1` -> a.b, `'logger=[x,y]'` -> logger), None for a flag."""
    if arg.startswith("-") or "=" not in arg:
        return None
    return arg.split("=", 1)[0].lstrip("+~")


def tiny_extras(args: list[str]) -> list[str]:
    """The TINY settings whose keys args do not set."""
    given = {override_key(a) for a in args}
    return [t for t in TINY if override_key(t) not in given]


def with_tiny(kind: str, args: list[str]) -> list[str]:
    """What a wrapper of `kind` runs instead of args (see the module docstring)."""
    if any(a in NO_TINY or a.startswith("--shell-completion") for a in args):
        return args
    if kind == "train":
        return [*args, *tiny_extras(args)]
    if kind == "sweep":
        if args[:1] == ["status"]:
            return args
        return [*args, *tiny_extras(args), *([] if "--seeds" in args else ["--seeds", "0"])]
    if kind == "torchrun" and "gptlab.cli.train" in args:
        return [*args, *tiny_extras(args[args.index("gptlab.cli.train") + 1 :])]
    return args


def console_scripts() -> dict[str, str]:
    """pyproject.toml's [project.scripts]: name -> "module:function"."""
    text = (REPO / "pyproject.toml").read_text()
    section = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^([\w-]+)\s*=\s*"([\w.:]+)"', section, re.MULTILINE))


WRAPPER = """#!{python}
import json, os, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_docs import wait_for_a_finished_run, with_tiny
real = json.loads({real!r})
args = with_tiny({kind!r}, sys.argv[1:])
if {kind!r} == "compare":
    for arg in args:
        wait_for_a_finished_run(Path(arg))
os.execv(real[0], [*real, *args])
"""


def make_wrappers(folder: Path) -> Path:
    """A bin folder of wrappers for the console scripts and torchrun (the real ones are in the venv's bin/)."""
    venv_bin = Path(sys.executable).parent
    folder.mkdir(parents=True, exist_ok=True)
    kinds = {"gptlab-train": "train", "gptlab-sweep": "sweep", "gptlab-compare": "compare", "torchrun": "torchrun"}
    entries = {**console_scripts(), "torchrun": ""}
    for name, entry in entries.items():
        script = venv_bin / name
        if script.exists():
            real = [str(script)]
        elif entry:  # an install older than the script: run its entry point
            module, func = entry.split(":")
            code = f"import sys; sys.argv[0] = {name!r}; from {module} import {func}; sys.exit({func}())"
            real = [sys.executable, "-c", code]
        else:
            continue
        text = WRAPPER.format(
            python=sys.executable, tests=str(REPO / "tests"), real=json.dumps(real), kind=kinds.get(name, "plain")
        )
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


def _queue_pid(sweep_dir: Path) -> int | None:
    """The pid of a detached local queue working on sweep_dir, while it runs (a zombie has ended)."""
    try:
        pid = int(json.loads((sweep_dir / ".plan" / "launched.json").read_text()).get("pid"))
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError, TypeError):
        return None
    return None if state in ("Z", "X") else pid


def wait_for_a_finished_run(sweep_dir: Path, timeout: float = 300.0) -> None:
    """Return once sweep_dir (if it is a detached sweep still running) holds a finished run, or its queue ended."""
    deadline = time.monotonic() + timeout
    while _queue_pid(sweep_dir) and time.monotonic() < deadline:
        for summary in sweep_dir.glob("*/**/summary.json"):
            try:
                if json.loads(summary.read_text()).get("status") == "finished":
                    return
            except ValueError:
                pass  # being written
        time.sleep(0.5)


def _reap_detached(folder: Path, timeout: float = 300.0) -> list[str]:
    """Wait for every detached queue a block started under folder; kill (its whole session) what outlives timeout."""
    killed = []
    for launched in folder.glob("**/.plan/launched.json"):
        sweep_dir = launched.parent.parent
        deadline = time.monotonic() + timeout
        while _queue_pid(sweep_dir) and time.monotonic() < deadline:
            time.sleep(0.5)
        pid = _queue_pid(sweep_dir)
        if pid:
            os.killpg(pid, signal.SIGKILL)  # started with start_new_session: its group is its own session
            killed.append(str(sweep_dir))
    return killed


# ---------------------------------------------------------------------------------------------------------------
# fast checks


def test_every_marker_is_on_a_bash_block_and_every_page_is_read():
    stray = [b.name for path in DOCS for b in blocks(path) if b.info == "stray marker"]
    assert not stray, f"'{MARKER}' must be alone on the line right before a ```bash fence: {stray}"
    found = runnable()
    assert len(found) == sum(len(scan(p)[1]) for p in DOCS), "a marker outside a fence was not counted as a block"
    pages = {b.path.name for b in found}
    assert {"README.md", "TRAINING.md", "SWEEPS.md", "INFERENCE.md", "RELIABILITY.md"} <= pages, pages
    readme = [b.text for b in found if b.path.name == "README.md"]
    assert any("gptlab-train attention=gqa" in t for t in readme), "the README's one-run block is not runnable"
    assert any("--detach" in t and "gptlab-sweep status" in t and "gptlab-compare" in t for t in readme)
    for block in found:
        assert block.text.strip(), f"{block.name}: empty runnable block"


def test_readme_is_a_ten_minute_read():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"


def test_no_internal_tracker_numbers_in_the_docs():
    hits = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()[:80]}"
        for path in DOCS
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if ISSUE_REF.search(line)
    ]
    assert not hits, hits


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (hyphens kept), spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = path.read_text()
    for block in blocks(path):  # a '#' line inside a code block is no heading
        text = text.replace(block.text, "")
    return {_slug(m) for m in re.findall(r"^#{1,6}\s+(.*)$", text, re.MULTILINE)}


def test_relative_links_and_their_anchors_resolve():
    broken = []
    for path in DOCS:
        text = path.read_text()
        for block in blocks(path):
            text = text.replace(block.text, "")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue  # http(s), mailto
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                broken.append(f"{path.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{path.name}: {target} (no such heading in {dest.name})")
    assert not broken, broken


def test_tiny_settings_never_replace_what_a_command_sets():
    assert with_tiny("train", ["attention=gqa", "logger=csv", "model.n_layer=3"]) == [
        "attention=gqa", "logger=csv", "model.n_layer=3",
        *[t for t in TINY if not t.startswith(("logger=", "model.n_layer="))],
    ]  # fmt: skip
    assert with_tiny("train", ["--help", "attention"]) == ["--help", "attention"]
    assert with_tiny("sweep", ["status", "outputs/sweeps/x"]) == ["status", "outputs/sweeps/x"]
    assert with_tiny("sweep", ["fast", "--seeds", "0,1"])[-1] != "0"
    assert with_tiny("sweep", ["fast"])[-2:] == ["--seeds", "0"]
    run = ["--standalone", "--nproc_per_node=2", "-m", "gptlab.cli.train", "hardware=ddp_cpu"]
    assert with_tiny("torchrun", run) == [*run, *TINY]
    assert with_tiny("plain", ["run=x"]) == ["run=x"]


# ---------------------------------------------------------------------------------------------------------------
# the blocks, run


@pytest.mark.slow
@pytest.mark.parametrize("block", runnable(), ids=lambda b: b.name)
def test_runnable_block(block: Block, tmp_path):
    wrappers = make_wrappers(tmp_path / "bin")
    work = tmp_path / "work"
    work.mkdir()
    env = cli_env(PATH=f"{wrappers}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    env.pop("VIRTUAL_ENV", None)
    script = "set -euo pipefail\n" + block.text + "\n"
    try:
        done = subprocess.run(
            ["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=600
        )  # fmt: skip
    finally:
        killed = _reap_detached(work)
    report = f"{block.name}:\n{block.text}\n--- stdout (tail)\n{done.stdout[-3000:]}\n--- stderr (tail)\n"
    report += done.stderr[-3000:]
    assert done.returncode == 0, report
    assert not killed, f"detached sweeps still running after the block: {killed}"
    if "gptlab-compare" in block.text and "--ladder" in block.text and "--lr-grid" in block.text:
        assert "ladder x lr grid:" in done.stdout and "ladder_lr.json" in done.stdout, report  # best lr per rung
    elif "gptlab-compare" in block.text and "--lr-grid" in block.text:
        assert "lr_grid.json" in done.stdout and "best lr" in done.stdout, report  # the lr-grid table
    elif "gptlab-compare" in block.text:
        assert "Compared at step" in done.stdout, report
