"""What each arm of a sweep builds, checked before anything runs: every arm built on the meta device, its model
fingerprint, its no-op choices, and arms (or ladder rungs) that build the identical model.

Which differing config keys still leave two arms one experiment is compare's rule (bookkeeping keys aside, only
model config: gptlab/compare/reading/identical.py); sweep/ sits below compare/, so the caller passes it in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from gptlab.sweep.design import Rung
from gptlab.sweep.plan import COMMANDS, planned_overrides


def arm_identity(overrides: list[str], seed: int, command: str = "train") -> tuple[str, dict, list[str]]:
    """(model fingerprint, flat config without hydra, no-op warnings) of one arm, built on the meta device."""
    from omegaconf import OmegaConf

    from gptlab.config.build import build_model, compose
    from gptlab.config.noop import noop_choices
    from gptlab.model.fingerprint import model_fingerprint
    from gptlab.util.tree import flatten

    cfg = compose([*overrides, f"seed={seed}"], COMMANDS[command][2])
    # The vocabulary comes from the tokenizer at run time; arms of one data setup share it, so any size compares.
    model = build_model(cfg, vocab_size=256, device="meta")
    plain = {k: v for k, v in cast(dict, OmegaConf.to_container(cfg, resolve=False)).items() if k != "hydra"}
    return model_fingerprint(model), flatten(plain, empty_as_leaf=True), noop_choices(cfg)


def identity_warnings(
    name: str, spec: dict, extra: list[str], seed: int, one_experiment: Callable[[list[str]], bool]
) -> tuple[list[str], list[str]]:
    """(warnings, errors): no-op choices per arm, one line per pair of arms that build the identical model and whose
    differing config keys are `one_experiment`."""
    warnings, errors, seen = [], [], {}  # type: list[str], list[str], dict[str, tuple[str, dict]]
    for arm in spec["arms"]:
        try:
            fingerprint, flat, noops = arm_identity(
                planned_overrides(name, spec, arm, extra), seed, spec.get("command", "train")
            )
        except Exception as err:  # noqa: BLE001 - Hydra and build errors alike: name the arm, one line
            errors.append(f"[{name}] arm '{arm}' does not build: {str(err).strip().splitlines()[0]}")
            continue
        warnings += [f"[{name}] warning: arm '{arm}': {line}" for line in noops]
        for other, (their_print, their_flat) in seen.items():
            differs = [k for k in set(flat) | set(their_flat) if flat.get(k, None) != their_flat.get(k, None)]
            if fingerprint == their_print and one_experiment(differs) and not spec.get("aa"):  # an A/A's are on purpose
                warnings.append(
                    f"[{name}] warning: arms '{other}' and '{arm}' build the identical model "
                    f"(fingerprint {fingerprint}): the same experiment twice, every difference is noise"
                )
        seen[arm] = (fingerprint, flat)
    return warnings, errors


def ladder_errors(name: str, spec: dict, extra: list[str], seed: int, ladder: list[Rung]) -> list[str]:
    """Every arm at every rung builds, and no two rungs of one arm build the same model (a shared override pinning the
    size the ladder moves would make every rung one size: a flat "power law" from one model, silently)."""
    errors = []
    for arm in spec["arms"]:
        seen: dict[str, str] = {}
        for rung in ladder:
            overrides = [*planned_overrides(name, spec, arm, extra), *rung.overrides]
            try:
                fingerprint, _, _ = arm_identity(overrides, seed, spec.get("command", "train"))
            except Exception as err:  # noqa: BLE001 - Hydra and build errors alike: name the arm and rung, one line
                errors.append(
                    f"[{name}] arm '{arm}' at rung {rung.name} does not build: {str(err).strip().splitlines()[0]}"
                )
                continue
            if fingerprint in seen:
                errors.append(
                    f"[{name}] arm '{arm}': rungs {seen[fingerprint]} and {rung.name} build the same model; "
                    "the ladder's key does not change the size here"
                )
            seen[fingerprint] = rung.name
    return errors
