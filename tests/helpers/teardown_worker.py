"""One rank of tests/test_teardown.py (run by torchrun): train a tiny run through gptlab.train.run.execute and record, when
the process group is left, how many DDP wrappers are still alive (a live one holds the group; see
gptlab.runtime.distributed.teardown). With `fail`, the loop raises after the wrapper is built.

torchrun runs it as a module, `-m helpers.teardown_worker`, with tests/ on PYTHONPATH (helpers.paths.pythonpath_with_tests).
"""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path

from torch.nn.parallel import DistributedDataParallel

from gptlab.config.build import compose, group_choices
from gptlab.runtime import distributed
from gptlab.train import run

OVERRIDES = [
    "model.n_layer=2",
    "model.d_model=64",
    "model.n_head=4",
    "model.block_size=64",
    "train.batch_size=8",
    "train.eval_sequences=16",
    "train.max_steps=2",
    "train.eval_interval=2",
    "sample.tokens=0",
    "hardware=ddp_cpu",
    "hardware.dtype=fp32",
    "hardware.peak_flops=1e12",
    "logger=none",
]


def main(out: Path, mode: str) -> None:
    alive: list[int] = []
    leave = distributed.teardown

    def recording_teardown() -> None:
        gc.collect()
        alive.append(sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects()))
        leave()

    distributed.teardown = recording_teardown  # run.execute calls it through the module
    if mode == "fail":

        def failing_train(*args, **kwargs):
            raise RuntimeError("injected failure in the loop")

        run.train = failing_train  # run.py's own name for gptlab.train.loop.train
    cfg = compose(OVERRIDES)
    (out / "run").mkdir(exist_ok=True)  # Hydra makes the run dir under gptlab-train
    outcome = "finished"
    try:
        outcome = run.execute(cfg, out / "run", group_choices(cfg), OVERRIDES)["status"]
    except RuntimeError as err:
        outcome = str(err)
    record = {"alive_at_teardown": alive, "outcome": outcome}
    (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
    sys.stdout.flush()
    os._exit(0)  # as gptlab-train's ranks do (gptlab.cli.train._exit_rank)
