"""Third-party progress bars kept off gptlab's output: transformers', huggingface_hub's and datasets' switched off
through their own functions for the length of a call, and plain tqdm bars (lm-eval's request building has no option
for its bar) off for a CLI's whole process through tqdm's TQDM_DISABLE."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def no_progress_bars(datasets: bool = False) -> Iterator[None]:
    """transformers' and huggingface_hub's progress bars off inside (datasets' too, with `datasets`), as they were
    after."""
    from huggingface_hub import utils as hub
    from transformers.utils import logging as transformers_logging

    transformers_on, hub_off = transformers_logging.is_progress_bar_enabled(), hub.are_progress_bars_disabled()
    transformers_logging.disable_progress_bar()  # huggingface_hub's (its downloads) too
    if datasets:
        import datasets as hf_datasets

        datasets_on = hf_datasets.is_progress_bar_enabled()
        hf_datasets.disable_progress_bars()
    try:
        yield
    finally:
        if transformers_on:
            transformers_logging.enable_progress_bar()  # turns huggingface_hub's back on as well
        (hub.disable_progress_bars if hub_off else hub.enable_progress_bars)()
        if datasets and datasets_on:
            hf_datasets.enable_progress_bars()


def tqdm_off_for_this_process() -> None:
    """Plain tqdm bars off for the rest of this (CLI) process. tqdm reads TQDM_DISABLE once, when it is first
    imported, so this takes effect only before anything imports it; the variable is put back afterwards, so child
    processes do not inherit it."""
    if "tqdm" in sys.modules:
        return
    previous = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"
    try:
        import tqdm  # noqa: F401  (tqdm.tqdm's keyword defaults are read from TQDM_* here)
    finally:
        if previous is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = previous
