"""compare's bookkeeping keys (reading/group.py IGNORED_KEYS) and the settings' `curve=False` rule cannot drift apart.

compare may not import config/ (tests/test_layout.py: compare imports errors, util, sinks and the two layouts), so it
cannot derive the keys from the rule; this test ties the two lists instead: every settings key compare ignores when it
groups runs is curve-free, and every curve-free key compare still groups by is named below with its reason.
"""

from __future__ import annotations

from dataclasses import fields

from gptlab.compare.reading.group import IGNORED_KEYS, is_bookkeeping
from gptlab.config.schema import SETTINGS
from gptlab.config.settings import config_key

# Curve-free for a resume, yet two runs that differ in them are two arms to compare: they change the speed the table
# compares (the machine's layout and threads, the prefetch depth) or where the curve starts (another run's weights).
GROUPED_PREFIXES = ("hardware.",)
GROUPED = {"train.prefetch", "train.init_from"}
# Keys compare ignores that no settings dataclass holds: extra validation sets are the data group's, and only observe.
NOT_SETTINGS = {"data.val_sets"}


def _keys(curve_free: bool | None = None) -> set[str]:
    """Every settings key (those whose rule says curve=False, with curve_free)."""
    return {
        config_key(f, group)
        for cls, group in SETTINGS
        for f in fields(cls)
        if curve_free is None or (f.metadata.get("curve") is False) == curve_free
    }


def test_every_settings_key_compare_ignores_is_curve_free():
    assert IGNORED_KEYS - _keys() == NOT_SETTINGS
    assert IGNORED_KEYS & _keys(curve_free=False) == set()


def test_every_curve_free_key_is_bookkeeping_to_compare_or_named_as_an_arm_difference():
    grouped = {k for k in _keys(curve_free=True) if not is_bookkeeping(k)}
    assert {k for k in grouped if not k.startswith(GROUPED_PREFIXES)} == GROUPED
    assert all(is_bookkeeping(k) for k in IGNORED_KEYS)
