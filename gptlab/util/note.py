"""A note is a value: what kind it is, what it is about, what it says and the fix, so nothing sorts notes by words.

Every report section that carries footnotes (a comparison's warnings and notes, a study's caveats) holds `Note`
values; `gptlab/compare/render/words.py` (`words.note`) is the one place a Note becomes a line of text.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class NoteKind(Enum):
    """WARNING: the reading may be wrong or incomplete (highlighted in every report); NOTE: context for a reader."""

    WARNING = "warning"
    NOTE = "note"


@dataclass(frozen=True)
class Note:
    """One footnote: `text` is a plain sentence without a leading 'warning:'; `subject` the arm, run, key or file it
    is about ('' when the whole report); `fix` the command or step that resolves it ('' when none)."""

    kind: NoteKind
    text: str
    subject: str = ""
    fix: str = ""

    @property
    def is_warning(self) -> bool:
        return self.kind is NoteKind.WARNING


def warning(text: str, subject: str = "", fix: str = "") -> Note:
    """A WARNING note."""
    return Note(NoteKind.WARNING, text, subject, fix)


def note(text: str, subject: str = "", fix: str = "") -> Note:
    """A NOTE note."""
    return Note(NoteKind.NOTE, text, subject, fix)
