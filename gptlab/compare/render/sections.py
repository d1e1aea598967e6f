"""The report document's parts: one frozen type per kind of section, and the Document that orders them.

A section holds finished text (cells, sentences, Note values, figure paths), never a Comparison: the terminal,
Markdown, HTML and W&B writers each know only how to draw a kind. `key` names a section for the machines: its HTML
class and its W&B table ('' for neither); `shown` says which writers draw it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from gptlab.compare.reading.logged import Logged
from gptlab.util.note import Note


class Shown(Enum):
    """Which writers draw a section: every one, the terminal alone (a short reminder of what the files say at
    length) or the files alone (comparison.md, .html and the W&B run)."""

    EVERYWHERE = "everywhere"
    TERMINAL = "terminal"
    FILES = "files"


@dataclass(frozen=True)
class Flag:
    """A flag a table row can carry: its key (the HTML class flag-<key>), its text in the flags column, what it
    means (the legend) and the columns it highlights."""

    key: str
    text: str
    meaning: str
    columns: tuple[str, ...] = ()


@dataclass(frozen=True)
class Table:
    """A table of text cells. `title`: the terminal's caption; `heading`: the files' section heading (None: none);
    `left`: the columns the terminal aligns left; `hidden`: the columns the terminal leaves out (it then draws the
    table at most 120 wide and says where they are); `flags`: per row, the Flags it carries (empty: an unflagged
    table), drawn as badges in the column `flag_column`; `note`: the sentence under the table. `paper`: also written
    to comparison.csv and comparison.tex (render/paper.py), where `paper_rows` (when given) replace the rows (each
    verdict with its interval spelled out) and `marks`, per row and column, are the caveats a cell carries, set as
    footnotes together with the flags of its row that highlight it."""

    key: str
    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    heading: str | None = None
    left: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ()
    flags: tuple[tuple[Flag, ...], ...] = ()
    flag_column: str = ""
    note: str = ""
    shown: Shown = Shown.EVERYWHERE
    paper: bool = False
    paper_rows: tuple[tuple[str, ...], ...] = ()
    marks: tuple[tuple[tuple[str, ...], ...], ...] = ()


@dataclass(frozen=True)
class Sentences:
    """Sentences read as a list (a bullet each in the files, a line each on the terminal, which leaves out the
    heading)."""

    key: str
    lines: tuple[str, ...]
    heading: str | None = None
    shown: Shown = Shown.EVERYWHERE


@dataclass(frozen=True)
class Notes:
    """Footnotes as Note values; every writer words them with words.note and marks the warnings."""

    notes: tuple[Note, ...]
    key: str = ""
    shown: Shown = Shown.EVERYWHERE


@dataclass(frozen=True)
class Legend:
    """What each flag of a table means (drawn where the flags are colours: the HTML page)."""

    flags: tuple[Flag, ...]
    key: str = "legend"
    shown: Shown = Shown.FILES


@dataclass(frozen=True)
class LoggedLines:
    """What the arms' runs logged as warnings while they trained (train.log), beside each arm."""

    heading: str
    items: tuple[Logged, ...]
    key: str = "logged"
    shown: Shown = Shown.EVERYWHERE


@dataclass(frozen=True)
class Preformatted:
    """A study's own text (factorial effects, the lr grid's table), kept as it is laid out."""

    heading: str
    text: str
    key: str = ""
    shown: Shown = Shown.EVERYWHERE


@dataclass(frozen=True)
class Figure:
    """One PNG: its name (the image's alt text), caption and file."""

    name: str
    caption: str
    path: Path


@dataclass(frozen=True)
class Figures:
    """PNGs: linked from comparison.md, embedded in the HTML page, logged to W&B; never on the terminal."""

    figures: tuple[Figure, ...]
    key: str = "figs"
    shown: Shown = Shown.FILES


@dataclass(frozen=True)
class Runs:
    """The compared runs (label, seed, run dir under `root`, W&B run, outside load) and the settings they share."""

    root: str
    rows: tuple[tuple[str, ...], ...]
    shared: tuple[tuple[str, str], ...]
    key: str = "runs"
    shown: Shown = Shown.FILES


Section = Table | Sentences | Notes | Legend | LoggedLines | Preformatted | Figures | Runs


@dataclass(frozen=True)
class Document:
    """A whole report: its title, what the HTML heading adds (the baseline), and the sections in reading order."""

    title: str
    subtitle: str
    sections: tuple[Section, ...]
