"""The value checks the run schema (gptlab/config/schema.py) is made of: numbers in a range, booleans, one of a list, text,
`auto` or a value, and lists of a check; each raises a one-line ConfigError naming the key, the value and what is
allowed. `show` spells a value as the config does; `rule` is the field metadata a settings dataclass declares its
keys with (gptlab/config/settings.py, gptlab/model/config.py, gptlab/runtime/hardware.py)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from gptlab.errors import ConfigError

_BOOL_WORDS = {"true", "false", "yes", "no", "on", "off", "0", "1"}


def show(value) -> str:
    """A value as the config spells it: null, true/false, 'text', [1, 2]."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(show, value)) + "]"
    return repr(value)


def _bound(token: str) -> int | float:
    """'1', '0.5', '2**63' as a number (ints stay exact)."""
    base, _, power = token.partition("**")
    try:
        number: int | float = int(base)
    except ValueError:
        number = float(base)
    return number ** int(power) if power else number


def _finite(value) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


@dataclass(frozen=True)
class Number:
    """An int or a finite number within `spec`: '>= 1', '> 0', '[0, 1)', '(0, 1]', '[0, 2**63)'; '' = any."""

    spec: str
    kind: type = float
    null: bool = False
    note: str = ""  # what a special value means, e.g. "0 = greedy"

    def _range(self) -> tuple[str, int | float, str, int | float]:
        if not self.spec:
            return "(", -math.inf, ")", math.inf
        one = re.fullmatch(r"(>=|>)\s*(\S+)", self.spec)
        if one:
            return ("[" if one[1] == ">=" else "("), _bound(one[2]), ")", math.inf
        low, high = self.spec[1:-1].split(",")
        return self.spec[0], _bound(low.strip()), self.spec[-1], _bound(high.strip())

    def contains(self, value) -> bool:
        left, low, right, high = self._range()
        above = value >= low if left == "[" else value > low
        below = value <= high if right == "]" else value < high
        return above and below

    @property
    def text(self) -> str:
        """'>= 1' or 'in [0, 1)', with the note and 'or null' where they apply ('' for any number, not null)."""
        text = "" if not self.spec else self.spec if self.spec[0] == ">" else f"in {self.spec}"
        return " ".join(t for t in (text, f"({self.note})" if self.note else "", "or null" if self.null else "") if t)

    @property
    def _then(self) -> str:
        return f" {self.text}" if self.text else ""

    @property
    def noun(self) -> str:
        return "an integer" if self.kind is int else "a number"

    @property
    def plural(self) -> str:
        return "integers" if self.kind is int else "numbers"

    def __call__(self, key: str, value) -> None:
        if value is None and self.null:
            return
        numeric = isinstance(value, int) or (self.kind is float and isinstance(value, float))
        if isinstance(value, bool) or not numeric:
            raise ConfigError(f"{key}={show(value)}: expected {self.noun}{self._then}")
        if not _finite(value):
            raise ConfigError(f"{key}={show(value)}: must be a finite number{self._then}")
        if not self.contains(value):
            raise ConfigError(f"{key}={show(value)}: must be {self.text}")


@dataclass(frozen=True)
class Bool:
    """true or false only: a quoted 'false' is a string, and 1/'yes' are not booleans either."""

    null: bool = False

    def __call__(self, key: str, value) -> None:
        if isinstance(value, bool) or (value is None and self.null):
            return
        hint = " (unquoted)" if isinstance(value, str) and value.strip().lower() in _BOOL_WORDS else ""
        raise ConfigError(f"{key}={show(value)}: expected true or false{hint}{' or null' if self.null else ''}")


@dataclass(frozen=True)
class OneOf:
    """One of `choices`, compared with its type (the string 'false' is not false, 1 is not true)."""

    choices: tuple

    def __call__(self, key: str, value) -> None:
        if any(type(value) is type(c) and value == c for c in self.choices):
            return
        allowed = ", ".join(show(c) if not isinstance(c, str) else c for c in self.choices)
        hint = " (true/false unquoted)" if isinstance(value, str) and value.strip().lower() in _BOOL_WORDS else ""
        raise ConfigError(f"{key}: {show(value)} is not allowed; allowed: {allowed}{hint}")


@dataclass(frozen=True)
class Text:
    """A string (`numbers`: an int too, e.g. name=123); `many`: or a list of strings."""

    null: bool = False
    numbers: bool = False
    many: bool = False

    def __call__(self, key: str, value) -> None:
        kinds = (str, int) if self.numbers else (str,)
        one = isinstance(value, kinds) and not isinstance(value, bool)
        many = self.many and isinstance(value, list) and all(isinstance(v, str) for v in value)
        if one or many or (value is None and self.null):
            return
        what = "a string or a list of strings" if self.many else "a string"
        raise ConfigError(f"{key}={show(value)}: expected {what}{' or null' if self.null else ''}")


@dataclass(frozen=True)
class Auto:
    """'auto' or a number the inner check accepts."""

    number: Number

    def __call__(self, key: str, value) -> None:
        if value == "auto":
            return
        if isinstance(value, str) or isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}={show(value)}: expected 'auto' or {self.number.noun} {self.number.text}")
        self.number(key, value)


@dataclass(frozen=True)
class Seq:
    """A list of `length` items (any length when None), each passing `item`; `null`: or null."""

    item: Number
    length: int | None = None
    null: bool = False

    def __call__(self, key: str, value) -> None:
        if value is None and self.null:
            return
        count = f"{self.length} " if self.length else ""
        if not isinstance(value, (list, tuple)) or (self.length and len(value) != self.length):
            raise ConfigError(
                f"{key}={show(value)}: expected a list of {count}{self.item.plural}, "
                f"each {self.item.text}{' (or null)' if self.null else ''}"
            )
        for i, v in enumerate(value):
            self.item(f"{key}[{i}]", v)


def rule(
    spec: str = "",
    *,
    note: str = "",
    check=None,
    key: str | None = None,
    required: bool | None = None,
    curve: bool = True,
) -> dict:
    """A config key's schema: a settings dataclass field's metadata, `field(metadata=rule(">= 1"))`, or a
    constructor parameter's, `eps: Annotated[float, rule("> 0")]`.

    The field's annotation gives the type (bool, int, float, str; `| None` allows null); `spec` is a number's
    allowed range, `note` what a special value means, `check` replaces the derived check where the annotation
    cannot say it (one of a list, 'auto' or a number), `key` names the config key when it is not `<group>.<field>`,
    `required` whether the config must have the key (default: when the field has no default value), `curve=False`
    that the key cannot change the loss curve (it observes, or says where and how fast), so a resume may change it.
    """
    return {"range": spec, "note": note, "check": check, "key": key, "required": required, "curve": curve}
