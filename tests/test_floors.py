"""The floor versions CI tests (`make test-floor`, called by .ci/run) are pyproject's own floors, pin for pin, and the
floor run installs every extra whose floor it pins."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# a requirement with a floor: name, optional [extras], `>=` version
REQUIREMENT = re.compile(r'"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?>=([0-9][0-9a-z.]*)')


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503: lm_eval = lm-eval


def floors() -> dict[str, tuple[str, str | None]]:
    """{package: (its `>=` floor, the extra declaring it or None for the dependencies)} from pyproject."""
    text = (REPO / "pyproject.toml").read_text()
    block = text.split("\ndependencies = [", 1)[1].split("\n]", 1)[0]
    found = {_name(m[1]): (m[2], None) for m in REQUIREMENT.finditer(block)}
    extras, extra = text.split("\n[project.optional-dependencies]\n", 1)[1].split("\n[", 1)[0], None
    for line in extras.splitlines():
        start = re.match(r"([a-z0-9-]+) = \[", line)
        extra = start[1] if start else extra  # an extra's list may run over several lines
        found |= {_name(m[1]): (m[2], extra) for m in REQUIREMENT.finditer(line)}
    return found


def pins() -> dict[str, str]:
    out = {}
    for line in (REPO / ".ci" / "floors.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            out[_name(name.strip())] = version.strip()
    return out


def test_every_pin_is_pyprojects_floor():
    pinned, declared = pins(), floors()
    assert {"torch", "wandb", "hydra-core", "datasets", "statsmodels", "transformers", "lm-eval"} <= set(pinned)
    for name, version in pinned.items():
        assert name in declared, f"{name}: pinned in .ci/floors.txt, no `>=` floor in pyproject"
        want = declared[name][0]
        assert version == want or version == f"{want}.0", f"{name}: .ci/floors.txt {version}, pyproject >= {want}"


def test_the_floor_run_installs_the_extras_of_its_pins():
    """A pin from an extra (transformers: hf, lm-eval: eval) only counts when the floor run installs that extra."""
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"(?m)^test-floor: floor-setup\b", makefile), "make test-floor must install the floor venv first"
    rule = makefile.split("\n$(FLOOR_VENV)/.installed:", 1)[1].split("\n\n", 1)[0]
    installed = set(re.search(r"-e '\.\[([a-z0-9,-]+)\]'", rule)[1].split(","))
    declared = floors()
    needed = {declared[name][1] for name in pins()} - {None}
    assert {"hf", "eval"} <= needed and needed <= installed, f"make floor-setup installs {sorted(installed)}"


def test_ci_runs_the_floor_tests():
    assert "make test-floor" in (REPO / ".ci" / "run").read_text()
    assert re.search(r"(?m)^test-floor:", (REPO / "Makefile").read_text())


def test_ci_installs_the_floor_venv_beside_lint_and_waits_before_any_test():
    """The floor install runs in the background during setup and lint, and is waited for before the first timed test:
    a pip unpacking 6.7 GB beside `make test` would slow the tests that the 30 s budget check times."""
    ci = (REPO / ".ci" / "run").read_text()
    start, lint = ci.index("make floor-setup"), ci.index("make lint")
    wait, tests = ci.index('wait "$floor_pid"'), ci.index("make test ")
    assert start < lint < wait < tests < ci.index("make test-floor")
