"""The HTML writer: comparison.html from the report document through templates/report.html.j2, one self-contained
file (inline CSS, every PNG embedded as a base64 data URI, no scripts or URLs)."""

from __future__ import annotations

import base64
import html
from functools import cache
from pathlib import Path

from gptlab.compare.render import words
from gptlab.compare.render.sections import Document, Flag, Shown


def _png(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def flag_classes(flags: tuple[Flag, ...], header: str) -> str:
    """The classes of a cell under `header` in a row carrying `flags`: flag-<key> for each flag that highlights it."""
    return " ".join(f"flag-{f.key}" for f in flags if header in f.columns)


@cache
def _template():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("gptlab.compare.render", "templates"),
        autoescape=False,  # values are escaped by |h (html.escape), as every page so far has been
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(h=html.escape, png=_png, note=words.note)
    env.globals["flag_classes"] = flag_classes
    return env.get_template("report.html.j2")


def write(doc: Document) -> str:
    """comparison.html: the title, then every section the files are shown."""
    sections = [(type(s).__name__, s) for s in doc.sections if s.shown is not Shown.TERMINAL]
    return _template().render(doc=doc, sections=sections)
