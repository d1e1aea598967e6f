"""A new optimizer is exactly one .py + one .yaml, and exact resume and kill -9 check it with no new test code.

The test copies the project (gptlab/, conf/, tests/) into a scratch folder, adds NAdam (Adam with Nesterov momentum;
its state holds a running momentum product, `mu_product`, that a resume must bring back) as gptlab/optim/nadam.py and
conf/optimizer/nadam.yaml and nothing else, then asks the shipped tests/test_resume.py there: its glob over
conf/optimizer/ collects a stop-and-resume and a kill -9-and-resume case for nadam, and (slow) both pass.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

NADAM_PY = '''"""NAdam (Dozat 2016): Adam with Nesterov momentum; decoupled weight decay on matrices only."""

from typing import Annotated

import torch

from gptlab.optim import param_groups
from gptlab.util.checks import Number, Seq, rule


def nadam(
    model,
    lr: Annotated[float, rule("> 0")] = 2e-3,
    betas: Annotated[tuple, rule(check=Seq(Number("[0, 1)"), length=2))] = (0.9, 0.999),
    weight_decay: Annotated[float, rule(">= 0")] = 0.1,
    momentum_decay: Annotated[float, rule(">= 0")] = 4e-3,
) -> torch.optim.NAdam:
    """torch.optim.NAdam over decay/no-decay groups; momentum_decay sets how fast the Nesterov schedule warms up."""
    groups = param_groups(model, weight_decay)
    return torch.optim.NAdam(
        groups, lr=lr, betas=tuple(betas), momentum_decay=momentum_decay, decoupled_weight_decay=True
    )
'''

NADAM_YAML = """# NAdam: Adam with Nesterov momentum; weight decay on >= 2-D weights only.
_target_: gptlab.optim.nadam.nadam
_partial_: true
lr: 3.0e-3             # > 0
betas: [0.9, 0.999]    # each in [0, 1)
weight_decay: 0.1      # >= 0, and lr * weight_decay < 1
momentum_decay: 4.0e-3 # >= 0
"""


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("project")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("gptlab", "conf", "tests", "sweeps", "pyproject.toml"):
        src = REPO / name
        (shutil.copytree(src, root / name, ignore=ignore) if src.is_dir() else shutil.copy(src, root / name))
    (root / "gptlab/optim/nadam.py").write_text(NADAM_PY)
    (root / "conf/optimizer/nadam.yaml").write_text(NADAM_YAML)
    return root


def _run(root: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, *args], cwd=root, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_resume_tests_collect_the_new_optimizer(scratch):
    done = _run(
        scratch, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", "-k", "nadam", "tests/test_resume.py"
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    collected = {line.split("::")[1] for line in done.stdout.splitlines() if "[nadam-" in line}
    assert collected == {
        "test_stop_then_resume_is_exact_for_every_optimizer_and_schedule[nadam-wsd]",
        "test_sigkill_then_resume_is_exact_for_every_optimizer_and_schedule[nadam-wsd]",
    }


def test_the_new_optimizer_is_built_from_its_yaml(scratch):
    code = (
        "from gptlab.config.build import build_model, build_optimizer, compose\n"
        "from gptlab.config.validate import validate\n"
        "cfg = compose(['optimizer=nadam', 'model.n_layer=1', 'model.d_model=32', 'model.n_head=2'])\n"
        "validate(cfg)\n"
        "print(type(build_optimizer(cfg, build_model(cfg, vocab_size=64))).__name__)\n"
    )
    done = _run(scratch, "-c", code, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "NAdam"


@pytest.mark.slow
def test_the_new_optimizer_resumes_exactly_after_a_stop_and_a_kill(scratch):
    done = _run(scratch, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "nadam", "tests/test_resume.py")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1].startswith("2 passed"), done.stdout[-1000:]
