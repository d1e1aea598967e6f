"""Files gptlab wrote earlier, read back: each kind has one reader, and each reader refuses a damaged file in one line
that names the file, what is wrong and what to do (`damaged`), never reading it as empty or missing.

`read_json` parses one JSON document (Python's json accepts NaN and Infinity; gptlab writes null there, so a NaN in
a stored file is damage too), `read_yaml` one YAML mapping (Hydra's saved configs); `Check` range-checks one stored value with the run schema's checks (gptlab/util/checks.py)
and words the failure against the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gptlab.errors import ConfigError
from gptlab.util.checks import Bool, Number, OneOf, Text


def damaged(path: Path, what: str, fix: str) -> ConfigError:
    """The one-line error for a stored file that cannot be used: `<path>: <what> (a damaged or hand-edited file);
    <fix>`."""
    return ConfigError(f"{path}: {' '.join(str(what).split())[:300]} (a damaged or hand-edited file); {fix}")


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def read_json(path: Path, fix: str, missing: Any = None) -> Any:
    """The JSON document in `path` (`missing` when there is no such file); a file that cannot be read, is not JSON
    or holds NaN/Infinity raises `damaged` with `fix`."""
    path = Path(path)
    if not path.exists():
        return missing
    try:
        return json.loads(path.read_text(encoding="utf-8"), parse_constant=_no_constant)
    except (OSError, UnicodeDecodeError) as err:
        raise damaged(path, f"cannot be read: {err.strerror if isinstance(err, OSError) else err}", fix) from None
    except ValueError as err:  # JSONDecodeError is a ValueError; so is NaN above
        raise damaged(path, f"not valid JSON: {err}", fix) from None


def read_yaml(path: Path, fix: str, missing: Any = None) -> Any:
    """The YAML mapping in `path` (`missing` when there is no such file); a file that cannot be read, is not YAML or
    is not a mapping raises `damaged` with `fix`."""
    path = Path(path)
    if not path.exists():
        return missing
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise damaged(path, f"cannot be read: {err.strerror if isinstance(err, OSError) else err}", fix) from None
    except yaml.YAMLError as err:
        raise damaged(path, f"not valid YAML: {err}", fix) from None
    if not isinstance(doc, dict):
        raise damaged(path, f"not a YAML mapping (holds {type(doc).__name__})", fix)
    return doc


@dataclass(frozen=True)
class Check:
    """Checks of one stored file's values: each failure is `damaged(path, '<key>=<value>: must be ...', fix)`."""

    path: Path
    fix: str

    def _run(self, check, key: str, value: Any) -> Any:
        try:
            check(key, value)
        except ConfigError as err:
            raise damaged(self.path, str(err), self.fix) from None
        return value

    def number(self, key: str, value: Any, spec: str = "", kind: type = float, null: bool = False) -> Any:
        """A finite number within `spec` ('>= 0', '[0, 1]', ...: gptlab.util.checks.Number), or null when allowed."""
        return self._run(Number(spec, kind, null), key, value)

    def text(self, key: str, value: Any, null: bool = False) -> Any:
        return self._run(Text(null=null), key, value)

    def flag(self, key: str, value: Any) -> Any:
        return self._run(Bool(), key, value)

    def one_of(self, key: str, value: Any, choices: tuple) -> Any:
        return self._run(OneOf(choices), key, value)

    def mapping(self, key: str, value: Any) -> dict:
        if not isinstance(value, dict):
            raise damaged(self.path, f"{key}: expected a mapping, got {type(value).__name__}", self.fix)
        return value

    def fail(self, what: str) -> ConfigError:
        return damaged(self.path, what, self.fix)
