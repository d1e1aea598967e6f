"""OmegaConf resolvers conf/train.yaml uses in hydra.run.dir / hydra.sweep.dir (registered on import).

Kept apart from build.py so gptlab-train can register them before Hydra resolves its output dirs without
importing torch (--help and shell completion stay fast).
"""

from __future__ import annotations

import os
import uuid

from omegaconf import OmegaConf


def _uid() -> str:
    """Suffix that keeps run dirs of runs started in the same second apart; shared by a job's ranks."""
    for var in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        if os.environ.get(var) and os.environ.get(var) != "none":
            return os.environ[var][-8:]
    return uuid.uuid4().hex[:6]


def _or(value, default):
    """${gptlab_or:${sweep},multirun}: `default` for a null or empty value (oc.select keeps a null as None)."""
    return default if value in (None, "") else value


if not OmegaConf.has_resolver("gptlab_uid"):
    OmegaConf.register_new_resolver("gptlab_uid", _uid, use_cache=True)
if not OmegaConf.has_resolver("gptlab_or"):
    OmegaConf.register_new_resolver("gptlab_or", _or)
