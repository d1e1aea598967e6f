"""gptlab: compose GPT training runs from Hydra config groups and compare them fairly."""

__version__ = "0.1.0"

import os as _os

# True in a process forked from gptlab's fork server (a local sweep's run): the server marks its children's
# environment (gptlab/runtime/forkserver.py, FORKED_ENV) and the mark is taken out here, at the first gptlab import,
# so the processes this one starts are not taken for forked ones.
FORKED = _os.environ.pop("GPTLAB_FORKED", "") == "1"
