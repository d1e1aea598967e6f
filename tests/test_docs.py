"""The docs' commands, run: every code block in README.md and docs/*.md marked runnable is executed, so the commands
the docs show cannot go stale.

The marker: an HTML comment alone on the line right before a ```bash fence (GitHub does not render it):

    <!-- run -->
    ```bash
    gptlab-train attention=gqa mlp.ratio=3 norm=rmsnorm
    ```

A marked block runs as one bash script (`set -euo pipefail`) in a fresh temp dir, under the hermetic environment of
tests/conftest.py (helpers.cli.cli_env: W&B offline, private caches, one thread), with PATH = a folder of wrappers,
then the venv's bin/ (sys.executable's directory). The wrappers (tests/helpers/doc_wrappers.py) keep the docs'
commands real but small: TINY settings appended to gptlab-train and gptlab-sweep, and each gptlab console script
run as its module forked from the worker's fork server where that stands for a fresh interpreter (the block's
environment names its socket), else as the installed script.

Each block must exit 0, and a block that runs gptlab-compare must print its comparison ("Compared at step"). A
detached sweep a block started is waited for (then killed, past a limit) before the temp dir goes. Mark only
commands that run offline on a CPU in seconds; SLURM, GPU and long commands stay unmarked examples.

The blocks run in the `slow` tests (about 1-2 minutes on 2 cores, -n 2); the fast ones check the parsing (every marker
is on a bash block, every page's blocks are found), the README's length (<= 220 lines), that no internal tracker
numbers ("issue 16") are left in the docs, that relative links and their #anchors resolve, that no prose line (outside
tables and code blocks) is over 300 characters and that no heading starts with a date.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import forkserver
from helpers.cli import cli_env
from helpers.doc_wrappers import SOCKET_ENV, TINY, make_wrappers, queue_pid, with_tiny

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKER = "<!-- run -->"
FENCE = re.compile(r"^(?P<ticks>`{3,}|~{3,})\s*(?P<info>[^`]*)$")

README_MAX_LINES = 220
ISSUE_REF = re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE)
PROSE_MAX_CHARS = 300  # a paragraph is wrapped, not one line per paragraph; tables and code blocks aside
# gptlab-compare's reports, copied verbatim into docs/ by the GPU study: their prose is wrapped by the writer in
# gptlab/compare/render/, not here
VERBATIM_REPORTS = {"gpu_d12_compare.md", "gpu_d12_seed_compare.md"}
DATED_HEADING = re.compile(r"^#{1,6}\s+\d{4}-\d{2}-\d{2}")  # a lab notebook's "## 2026-11-29: ..."


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


def _reap_detached(folder: Path, timeout: float = 300.0) -> list[str]:
    """Wait for every detached queue a block started under folder; kill (its whole session) what outlives timeout."""
    killed = []
    for launched in folder.glob("**/.plan/launched.json"):
        sweep_dir = launched.parent.parent
        deadline = time.monotonic() + timeout
        while queue_pid(sweep_dir) and time.monotonic() < deadline:
            time.sleep(0.5)
        pid = queue_pid(sweep_dir)
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


def _prose(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of every line of a page outside its fenced blocks and its tables."""
    fenced: set[int] = set()
    for block in blocks(path):
        if block.info != "stray marker":  # the fence, its text and the closing fence
            fenced.update(range(block.line, block.line + block.text.count("\n") + 3))
    lines = enumerate(path.read_text().splitlines(), 1)
    return [(n, line) for n, line in lines if n not in fenced and not line.lstrip().startswith("|")]


def test_no_prose_line_is_over_300_characters():
    long = [
        f"{path.relative_to(REPO)}:{n}: {len(line)} characters"
        for path in DOCS
        if path.name not in VERBATIM_REPORTS
        for n, line in _prose(path)
        if len(line) > PROSE_MAX_CHARS
    ]
    assert not long, f"wrap these lines at <= {PROSE_MAX_CHARS} characters: {long}"


def test_no_heading_starts_with_a_date():
    """A reference page says how things are now; its dated history belongs in the commit bodies."""
    dated = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path in DOCS
        for n, line in _prose(path)
        if DATED_HEADING.match(line)
    ]
    assert not dated, dated


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
    socket_path = forkserver.socket_for(env)
    if socket_path is not None:
        env[SOCKET_ENV] = str(socket_path)
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
