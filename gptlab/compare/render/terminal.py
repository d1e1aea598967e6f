"""The terminal writer: the report document through rich, every section the terminal is shown, in order.

A table is a rich table (one that leaves columns to the files at most TERMINAL_WIDTH wide, in a pipe any other at
most PIPE_WIDTH or COLUMN_WIDTH per column); every sentence and note is one line, never wrapped by rich (a pipe
keeps it whole for grep; a terminal wraps it).
"""

from __future__ import annotations

import sys

from gptlab.compare.render import words
from gptlab.compare.render.sections import Document, LoggedLines, Notes, Preformatted, Section, Sentences, Shown, Table

TERMINAL_WIDTH = 120
PIPE_WIDTH = 220  # a table's width in a pipe ...
COLUMN_WIDTH = 20  # ... or this per column, for a table with more columns than fit in it (decode has 14)
PIPE_CONSOLE = 400  # our own console's width in a pipe: each table is given its own width above


def _line(console, text: str) -> None:
    console.print(text, highlight=False, markup=False, emoji=False, soft_wrap=True)


def _table(console, t: Table, own: bool) -> None:
    """The table without its hidden columns (the files have them), then its note."""
    from rich.table import Table as RichTable

    keep = [i for i, h in enumerate(t.headers) if h not in t.hidden]
    table = RichTable(title=t.title)
    for i in keep:
        table.add_column(t.headers[i], justify="left" if t.headers[i] in t.left else "right")
    for row in t.rows:
        table.add_row(*(row[i] for i in keep))
    width = None
    if own and t.hidden:
        width = min(console.width, TERMINAL_WIDTH)
    elif own and not console.is_terminal:
        width = min(PIPE_CONSOLE, max(PIPE_WIDTH, COLUMN_WIDTH * len(keep)))
    console.print(table, width=width)
    if t.hidden:
        _line(console, f"({', '.join(t.hidden)}: in comparison.md and comparison.html)")
    if t.note:
        _line(console, t.note)


def _section(console, s: Section, own: bool) -> None:
    if isinstance(s, Table):
        _table(console, s, own)
    elif isinstance(s, Sentences):
        for line in s.lines:
            _line(console, line)
    elif isinstance(s, Notes):
        for n in s.notes:
            _line(console, words.note(n))
    elif isinstance(s, LoggedLines):
        for x in s.items:
            _line(console, f"logged: {x.describe()}")
    elif isinstance(s, Preformatted):
        _line(console, s.text)
    # a Legend (flags are colours in HTML), Figures and Runs are the files'


def print_document(doc: Document, console=None) -> None:
    """Print every section of `doc` the terminal is shown, on `console` (default: our own on stdout)."""
    from rich.console import Console

    own = console is None  # our own console: each table drawn at the width it is given here
    console = console or Console(width=None if sys.stdout.isatty() else PIPE_CONSOLE)
    for s in doc.sections:
        if s.shown is not Shown.FILES:
            _section(console, s, own)
