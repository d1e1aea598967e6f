"""gptlab-cache list | rm KEY | prune --older-than 30d: what gptlab keeps in its cache ($GPTLAB_CACHE, else
~/.cache/gptlab), and removing it.

Entries: token caches (`tokens/<key>/`: the corpus, tokenizer, tokens, bytes and last use of each), unfinished
token builds (`tokens/<key>.partial`), cached hub-source descriptions (`sources/`), the measured machine peaks
(`hardware_peaks_*.json`), the noise floors `gptlab-sweep --aa` stored (`noise_floors_*.json`), and the Arrow
scratch copies of local dataset folders a killed `data=hf` run left (`hf-scratch/<pid>-<hash>`). An entry another
process is building (its lock is held) is never removed.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gptlab.cli import fail
from gptlab.data import default_cache_dir
from gptlab.data.corpus import LAST_USED
from gptlab.errors import ConfigError
from gptlab.state.layout import lock_held

AGE = re.compile(r"^(?P<n>\d+)(?P<unit>[smhd])$")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass
class Entry:
    key: str
    kind: str  # tokens | stale (an older cache format: never read again) | partial | source | peaks | floors | scratch
    path: Path
    bytes: int
    last_used: float
    corpus: str = ""
    tokenizer: str = ""
    tokens: int | None = None


def _refuse(prog: str, message: str):
    """A subcommand's argparse error as one line (its own parser would print a usage block)."""
    fail(f"{prog}: {message}")


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _last_used(path: Path) -> float:
    marker = path / LAST_USED
    return (marker if marker.exists() else path).stat().st_mtime


def entries(cache: Path) -> list[Entry]:
    """Everything in the cache, newest use first."""
    found = []
    tokens = cache / "tokens"
    for folder in sorted(tokens.glob("*")) if tokens.is_dir() else []:
        if folder.is_dir() and folder.name.endswith(".partial"):
            found.append(Entry(folder.name, "partial", folder, _size(folder), folder.stat().st_mtime))
        elif folder.is_dir():
            try:
                index = json.loads((folder / "index.json").read_text())
            except (OSError, ValueError):
                index = {}
            found.append(
                Entry(
                    folder.name,
                    "tokens",
                    folder,
                    _size(folder),
                    _last_used(folder),
                    corpus=str(index.get("source", "?"))[:60],
                    tokenizer=str(index.get("tokenizer", "?")),
                    tokens=index.get("tokens"),
                )  # fmt: skip
            )
    for path in sorted((cache / "sources").glob("*.json")) if (cache / "sources").is_dir() else []:
        found.append(Entry(path.stem, "source", path, path.stat().st_size, path.stat().st_mtime))
    for path in sorted(cache.glob("hardware_peaks_*.json")):
        found.append(Entry(path.stem, "peaks", path, path.stat().st_size, path.stat().st_mtime))
    for path in sorted(cache.glob("noise_floors_*.json")):  # gptlab-sweep --aa's stored floors, per machine
        found.append(Entry(path.stem, "floors", path, path.stat().st_size, path.stat().st_mtime))
    for folder in sorted((cache / "hf-scratch").glob("*")) if (cache / "hf-scratch").is_dir() else []:
        # a local dataset folder's Arrow copy while its tokens are built; one left here is a killed run's
        found.append(Entry(folder.name, "scratch", folder, _size(folder), folder.stat().st_mtime))
    return sorted(found, key=lambda e: -e.last_used)


def _pid_alive(name: str) -> bool:
    """Whether the process a scratch dir is named after (<pid>-<hash>) still runs."""
    try:
        os.kill(int(name.split("-", 1)[0]), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _busy(entry: Entry) -> bool:
    """True while a build holds the entry's lock (tokens/<key>.lock), or a scratch dir's process still runs."""
    if entry.kind == "scratch":
        return _pid_alive(entry.key)
    key = entry.key.removesuffix(".partial")
    return entry.kind in ("tokens", "stale", "partial") and lock_held(entry.path.parent / f"{key}.lock")


def _remove(entry: Entry) -> None:
    if _busy(entry):
        raise ConfigError(f"{entry.key}: a run is building this cache entry now; try again when it has finished")
    if entry.path.is_dir():
        shutil.rmtree(entry.path)
    else:
        entry.path.unlink()


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def format_list(found: list[Entry], now: float) -> str:
    lines = [f"{'key':<14} {'kind':<8} {'tokenizer':<9} {'tokens':>12} {'size':>10} {'last use':>9}  corpus"]
    for e in found:
        tokens = f"{e.tokens:,}" if e.tokens is not None else "-"
        age = f"{(now - e.last_used) / 86400:.1f}d"
        lines.append(
            f"{e.key[:14]:<14} {e.kind:<8} {e.tokenizer or '-':<9} {tokens:>12} {_human(e.bytes):>10} {age:>9}  {e.corpus}"
        )
    lines.append(f"{len(found)} entries, {_human(sum(e.bytes for e in found))}")
    return "\n".join(lines)


def parse_age(text: str) -> float:
    match = AGE.match(text.strip())
    if not match:
        raise ConfigError(f"--older-than {text!r}: allowed: a number and a unit s, m, h or d (e.g. 30d)")
    return int(match["n"]) * UNITS[match["unit"]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gptlab-cache", description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.error = lambda message: fail(f"gptlab-cache: {message}")  # type: ignore[method-assign]
    sub = parser.add_subparsers(dest="command", required=True)
    listing = sub.add_parser("list", help="every entry: kind, tokenizer, tokens, size, last use, corpus")
    rm = sub.add_parser("rm", help="remove one entry by its key (or a unique prefix of 6+ characters)")
    rm.add_argument("key")
    prune = sub.add_parser("prune", help="remove entries not used for a while")
    for command in (listing, rm, prune):  # a subcommand's own parser prints its usage block otherwise
        command.error = functools.partial(_refuse, command.prog)  # type: ignore[method-assign]
    prune.add_argument("--older-than", required=True, help="e.g. 30d, 12h")
    prune.add_argument("--dry-run", action="store_true", help="list what would go, remove nothing")
    args = parser.parse_args(argv)
    try:
        cache, now = default_cache_dir(), time.time()
        found = entries(cache)
        if args.command == "list":
            print(format_list(found, now))
        elif args.command == "rm":
            if len(args.key) < 6:
                raise ConfigError(f"{args.key!r}: give at least 6 characters of a key (gptlab-cache list shows them)")
            hits = [e for e in found if e.key.startswith(args.key)]
            if len(hits) != 1:
                raise ConfigError(f"{args.key!r} matches {len(hits)} cache entries in {cache}; allowed: exactly one")
            _remove(hits[0])
            print(f"removed {hits[0].path} ({_human(hits[0].bytes)})")
        else:
            age = parse_age(args.older_than)
            old = [e for e in found if now - e.last_used > age and not _busy(e)]
            for e in old:
                if not args.dry_run:
                    _remove(e)
            verb = "would remove" if args.dry_run else "removed"
            print(f"{verb} {len(old)} entries ({_human(sum(e.bytes for e in old))}) unused for over {args.older_than}")
    except ConfigError as err:
        fail(err)
    return 0


if __name__ == "__main__":
    sys.exit(main())
