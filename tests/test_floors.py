"""The floor versions CI tests (`make test-floor`, called by .ci/run) are pyproject's own floors, pin for pin."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def floors() -> dict[str, str]:
    """{package: its `>=` floor} from pyproject's dependencies."""
    block = (REPO / "pyproject.toml").read_text().split("\ndependencies = [", 1)[1].split("\n]", 1)[0]
    return {m[1].lower(): m[2] for m in re.finditer(r'"([A-Za-z0-9_.-]+)>=([0-9][0-9a-z.]*)"', block)}


def test_every_pin_is_pyprojects_floor():
    pins = {}
    for line in (REPO / ".ci" / "floors.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.strip().lower()] = version.strip()
    declared = floors()
    assert {"torch", "wandb", "hydra-core", "datasets"} <= set(pins)
    for name, version in pins.items():
        want = declared[name]
        assert version == want or version == f"{want}.0", f"{name}: .ci/floors.txt {version}, pyproject >= {want}"


def test_ci_runs_the_floor_tests():
    assert "make test-floor" in (REPO / ".ci" / "run").read_text()
    assert re.search(r"(?m)^test-floor:", (REPO / "Makefile").read_text())
