"""A process as a sweep records it (host, boot, pid, the kernel's start time) and whether that very process still
lives: a pid alone may name another process by now, and a record written by a launcher that was killed is never
updated, so a sweep's state asks the process itself, never the record's word for it (standard library only)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

PROC = Path("/proc")


def _boot() -> str | None:
    """This boot's id (pids and start times count from the boot)."""
    try:
        return (PROC / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
    except OSError:
        return None


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks since boot) of a process, from /proc/<pid>/stat; None where gone or
    unreadable."""
    try:
        fields = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
        return fields[0], int(fields[19])  # fields 3 and 22 of proc(5): the name before ')' may hold spaces
    except (OSError, IndexError, ValueError):
        return None


def record(pid: int) -> dict:
    """What identifies the process `pid` of this host for as long as it lives."""
    stat = _stat(pid)
    return {"host": socket.gethostname(), "boot": _boot(), "pid": pid, "start": stat[1] if stat else None}


def alive(rec: object) -> bool | None:
    """True while the recorded process lives, False once it is gone (or never was: no record); None where this host
    cannot tell (a process of another host)."""
    if not isinstance(rec, dict) or type(rec.get("pid")) is not int or rec["pid"] <= 0:
        return False
    if rec.get("host") not in (None, socket.gethostname()):
        return None
    if rec.get("boot") is not None and _boot() is not None and rec["boot"] != _boot():
        return False  # recorded before this machine rebooted
    stat = _stat(rec["pid"])
    if stat is None:
        return _exists(rec["pid"]) if not PROC.is_dir() else False
    state, start = stat
    return state not in ("Z", "X") and rec.get("start") in (None, start)


def _exists(pid: int) -> bool:
    """A process with this pid exists (where /proc is missing: the pid alone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
