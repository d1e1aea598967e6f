"""An A/A sweep: the baseline arm repeated as K identical arms x seeds, to measure the machine's noise floor.

`gptlab-sweep NAME --aa [K]` (or `aa: K` / `aa: true` in a sweep file) keeps the sweep's shared overrides and its
first arm (the baseline) and replaces the arms with aa0 ... aa<K-1>, each exactly the baseline's overrides. The runs
go in the usual order (arm by arm), as a real sweep's do, so the drift between arms run one after another is part of
what they measure. Once every run finished, gptlab/compare/statistics/noise_floor.py measures the floor from them.
"""

from __future__ import annotations

from gptlab.errors import ConfigError

AA_DEFAULT = 3  # identical arms when `--aa` or `aa: true` gives no number
MIN_ARMS, MAX_ARMS = 2, 20


def parse_aa(value) -> int | None:
    """`aa:` of a sweep file or --aa's value as a number of arms: None/false -> None, true -> AA_DEFAULT, 2..20."""
    if value is None or value is False:
        return None
    if value is True:
        return AA_DEFAULT
    try:
        k = int(str(value))
    except ValueError:
        k = 0
    if not MIN_ARMS <= k <= MAX_ARMS:
        raise ConfigError(f"aa: {value!r}; allowed: true, or a number of identical arms from {MIN_ARMS} to {MAX_ARMS}")
    return k


def aa_spec(spec: dict, k: int, seeds: list[int]) -> dict:
    """The sweep definition with its arms replaced by k copies of its first arm (aa0 ... aa<k-1>); `aa: k` recorded.

    Refused in one line where an A/A cannot measure a floor: an lr grid, a decode sweep, fewer than 2 seeds.
    """
    if spec.get("command", "train") != "train":
        raise ConfigError(f"aa: an A/A sweep measures training speed; command: {spec['command']} is not allowed")
    if spec.get("lr_grid") is not None:
        raise ConfigError("aa: an A/A sweep repeats one config; drop the lr grid (give the baseline its lr)")
    if len(seeds) < 2:
        raise ConfigError(f"aa: seeds {seeds}: an A/A needs >= 2 seeds per arm (e.g. --seeds 0,1,2)")
    baseline = next(iter(spec["arms"]))
    copies = {f"aa{i}": list(spec["arms"][baseline]) for i in range(k)}
    return {**spec, "arms": copies, "aa": k, "aa_of": baseline}
