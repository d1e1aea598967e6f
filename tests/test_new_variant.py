"""A variant with a key of its own is exactly one .py + one .yaml.

The test copies the project (gptlab/, conf/, tests/) into a scratch folder, adds a DyT norm (Dynamic Tanh:
weight * tanh(alpha * x) + bias, no eps, its own `alpha_init` key) as gptlab/model/norm/dyt.py and
conf/norm/dyt.yaml and nothing else, then runs the shipped glob-driven tests there: the model zoo (it trains,
is causal, ...), the contracts and the schema's "every shipped key has a check". A bad `alpha_init` is refused in
one line by the check the factory's signature declares.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

DYT_PY = '''"""DyT (Dynamic Tanh): weight * tanh(alpha * x) + bias over the last dimension; no statistics, no eps."""

from typing import Annotated

import torch
import torch.nn as nn

from gptlab.model.base import Norm
from gptlab.util.checks import rule


class DyT(Norm):
    """A learned scalar alpha squashes x; a gain and a bias follow."""

    def __init__(self, dim: int, alpha_init: float):
        super().__init__(dim)
        self.alpha_init = alpha_init
        self.alpha = nn.Parameter(torch.full((1,), alpha_init))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def reset_parameters(self) -> None:
        nn.init.constant_(self.alpha, self.alpha_init)
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)

    def forward(self, x):
        return self.weight * torch.tanh(self.alpha * x) + self.bias


def dyt(dim: int, alpha_init: Annotated[float, rule("> 0")] = 8.0) -> DyT:
    """The norm factory conf/norm/dyt.yaml names."""
    return DyT(dim, alpha_init)
'''

DYT_YAML = """# DyT: weight * tanh(alpha * x) + bias (no eps).
_target_: gptlab.model.norm.dyt.dyt
_partial_: true
alpha_init: 8.0     # > 0 (large: the tiny test models' embeddings are ~0.02 in scale)
placement: pre      # pre: x + f(norm(x)); post: norm(x + f(x))
"""


# an MLP written like swiglu.py was, with plain annotations and no rule, and a number key of its own (gate_scale)
GEGLU_PY = '''"""GeGLU MLP: down(gelu(gate(x)) * gate_scale * up(x)), three matrices."""

import torch.nn as nn
import torch.nn.functional as F

from gptlab.model.base import MLP
from gptlab.model.mlp import init_mlp


class GeGLU(MLP):
    """Gated MLP with a GELU gate; hidden = ratio·d_model rounded up to multiple_of."""

    def __init__(
        self,
        d_model: int,
        bias: bool = False,
        ratio: float = 4,
        multiple_of: int = 16,
        gate_scale: float = 1.0,
        dropout: float = 0.0,
    ):
        super().__init__(d_model, multiple_of * -(-round(ratio * d_model) // multiple_of), dropout)
        self.gate_scale = gate_scale
        self.gate = nn.Linear(d_model, self.hidden, bias=bias)
        self.up = nn.Linear(d_model, self.hidden, bias=bias)
        self.down = nn.Linear(self.hidden, d_model, bias=bias)
        self.drop = nn.Dropout(dropout)

    def init_weights(self, n_layer: int, std: float) -> None:
        init_mlp([self.gate, self.up], self.down, n_layer, std)

    def forward(self, x):
        return self.drop(self.down(F.gelu(self.gate(x)) * self.gate_scale * self.up(x)))
'''

GEGLU_YAML = """_target_: gptlab.model.mlp.geglu.GeGLU
_partial_: true
ratio: 4
multiple_of: 16
gate_scale: 1.0
dropout: 0.0
"""


def _project(root: Path, files: dict[str, str]) -> Path:
    """A copy of the project in `root` with `files` ({path: text}) added."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("gptlab", "conf", "tests", "sweeps", "pyproject.toml"):
        src = REPO / name
        (shutil.copytree(src, root / name, ignore=ignore) if src.is_dir() else shutil.copy(src, root / name))
    for path, text in files.items():
        (root / path).write_text(text)
    return root


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    files = {"gptlab/model/norm/dyt.py": DYT_PY, "conf/norm/dyt.yaml": DYT_YAML}
    return _project(tmp_path_factory.mktemp("project"), files)


def _run(root: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, *args], cwd=root, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_shipped_glob_driven_tests_pick_up_a_new_norm(scratch):
    tests = ["tests/test_model_zoo.py", "tests/test_contracts.py", "tests/test_schema.py"]
    done = _run(scratch, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "dyt or every_shipped_key", *tests)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "norm=dyt" in _run(scratch, "-m", "pytest", "-q", "--collect-only", "-k", "dyt", tests[0]).stdout
    passed = int(done.stdout.strip().splitlines()[-1].split(" passed")[0].split()[-1])
    assert passed >= 5  # trains, causality per impl, ...: the zoo ran on dyt, not zero tests


def test_the_new_key_is_checked_from_the_signature_and_trains(scratch):
    code = (
        "from gptlab.config.build import compose, build_model\n"
        "from gptlab.config.validate import validate\n"
        "from gptlab.errors import ConfigError\n"
        "cfg = compose(['norm=dyt', 'model.n_layer=1', 'model.d_model=32', 'model.n_head=2'])\n"
        "validate(cfg)\n"
        "m = build_model(cfg, vocab_size=64)\n"
        "print('block norm:', type(m.blocks[0].norm1).__name__)\n"
        "try:\n"
        "    validate(compose(['norm=dyt', 'norm.alpha_init=-1']))\n"
        "except ConfigError as err:\n"
        "    print('refused:', err)\n"
    )
    done = _run(scratch, "-c", code, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "block norm: DyT" in done.stdout
    assert "refused: norm.alpha_init=-1: must be > 0" in done.stdout


@pytest.mark.slow  # a pytest in a subprocess and two composes: 20 s on 2026-11-28's machine, 30 s on 2026-11-29's
def test_a_variant_without_rules_passes_the_schema_tests(tmp_path):
    """GeGLU written like swiglu.py (plain annotations, a number key of its own) needs no third file: each key without
    a rule is checked by its type, so the shipped schema tests pass and a value of the wrong type is refused."""
    root = _project(tmp_path, {"gptlab/model/mlp/geglu.py": GEGLU_PY, "conf/mlp/geglu.yaml": GEGLU_YAML})
    done = _run(root, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_schema.py", "-k", "every_shipped")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1].startswith("2 passed")  # every key checked, every choice passes
    code = (
        "from gptlab.config.build import compose\n"
        "from gptlab.config.validate import validate\n"
        "from gptlab.errors import ConfigError\n"
        "validate(compose(['mlp=geglu', 'mlp.gate_scale=0.5']))\n"
        "for bad in ('mlp.gate_scale=abc', 'mlp.multiple_of=1.5'):\n"
        "    try:\n"
        "        validate(compose(['mlp=geglu', bad]))\n"
        "    except ConfigError as err:\n"
        "        print('refused:', err)\n"
    )
    done = _run(root, "-c", code, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        "refused: mlp.gate_scale='abc': expected a number",
        "refused: mlp.multiple_of=1.5: expected an integer",
    ]
