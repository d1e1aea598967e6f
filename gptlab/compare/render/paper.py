"""The paper writers: comparison.csv and comparison.tex from the report document's tables marked `paper` (the verdict
matrix and the main table), each cell as the report words it (a verdict with its 95% interval) and every caveat the
cell carries (its verdict's: under load, interpolated, edge lr, ...; and the flags of its row that highlight it) as a
footnote mark — never dropped. The LaTeX is booktabs tabulars and nothing else: every special character escaped,
the symbols the report uses (Δ ± × ≥ ...) in math mode, any other character outside ASCII spelled as its code."""

from __future__ import annotations

import csv
import io
import string
import unicodedata
from dataclasses import dataclass

from gptlab.compare.render.sections import Document, Table

MARK = "^"  # a CSV cell's footnote marks follow it: `not measured at equal FLOPs ^a`
TEX_SPECIAL = {
    "\\": r"$\backslash$",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\~{}",
    "^": r"\^{}",
    "<": r"$<$",
    ">": r"$>$",
    "|": r"$|$",
    "[": "{[}",  # never read as \\'s optional argument at the start of a row
    "]": "{]}",
    "Δ": r"$\Delta$",
    "±": r"$\pm$",
    "×": r"$\times$",
    "÷": r"$\div$",
    "≥": r"$\geq$",
    "≤": r"$\leq$",
    "≈": r"$\approx$",
    "α": r"$\alpha$",
    "µ": r"$\mu$",
    "→": r"$\rightarrow$",
    "·": r"$\cdot$",
    "–": "--",
    "—": "---",
    "…": r"\ldots{}",
    "’": "'",
    "‘": "`",
    "“": "``",
    "”": "''",
}


@dataclass(frozen=True)
class Marked:
    """One table ready to write: its title, headers, each cell with its footnote letters, the footnotes in order."""

    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple[tuple[str, tuple[str, ...]], ...], ...]
    footnotes: tuple[tuple[str, str], ...]


def _letter(i: int) -> str:
    """a, b, ..., z, aa, ab, ...: the i-th footnote's mark."""
    letters = string.ascii_lowercase
    return letters[i] if i < len(letters) else _letter(i // len(letters) - 1) + letters[i % len(letters)]


def _cell_notes(t: Table, i: int, j: int) -> list[str]:
    """The caveats of row i's cell j: its marks, then the flags of its row that highlight its column."""
    own = list(t.marks[i][j]) if i < len(t.marks) and j < len(t.marks[i]) else []
    flags = t.flags[i] if i < len(t.flags) else ()
    return own + [f"{f.text}: {f.meaning}" for f in flags if t.headers[j] in f.columns]


def marked(t: Table) -> Marked:
    """A table with every cell's caveats numbered as footnotes (one letter per distinct caveat, in reading order)."""
    letters: dict[str, str] = {}
    rows = []
    for i, line in enumerate(t.paper_rows or t.rows):
        cells = []
        for j, text in enumerate(line):
            notes = _cell_notes(t, i, j)
            for n in notes:
                letters.setdefault(n, _letter(len(letters)))
            cells.append((text, tuple(dict.fromkeys(letters[n] for n in notes))))
        rows.append(tuple(cells))
    footnotes = tuple((letter, text) for text, letter in letters.items())
    return Marked(t.heading or t.title, t.headers, tuple(rows), footnotes)


def tables(doc: Document) -> list[Marked]:
    """The document's paper tables (the verdict matrix, the main table), in reading order."""
    return [marked(s) for s in doc.sections if isinstance(s, Table) and s.paper]


def write_csv(doc: Document) -> str:
    """comparison.csv: per table a title row, the header row, the rows (a cell's footnote marks after it: `^a,b`),
    then one row per footnote (`^a`, its text); a blank row between tables."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for k, t in enumerate(tables(doc)):
        if k:
            writer.writerow([])
        writer.writerow([t.title])
        writer.writerow(t.headers)
        for row in t.rows:
            writer.writerow([f"{text} {MARK}{','.join(m)}" if m else text for text, m in row])
        for letter, text in t.footnotes:
            writer.writerow([f"{MARK}{letter}", text])
    return out.getvalue()


def escape(text: str) -> str:
    """Text as LaTeX typesets it with no package: specials escaped, the report's symbols in math mode, any other
    character outside ASCII by its accentless letter or its code point."""
    out = []
    for ch in text:
        if ch in TEX_SPECIAL:
            out.append(TEX_SPECIAL[ch])
        elif ch.isascii():
            out.append(ch)
        else:
            plain = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode()
            out.append(escape(plain) if plain else f"[U+{ord(ch):04X}]".replace("[", "{[}").replace("]", "{]}"))
    return "".join(out)


def _tex_table(t: Marked) -> list[str]:
    """One table float: caption, a booktabs tabular, the footnotes under it."""
    lines = [r"\begin{table}[htbp]", r"\centering", rf"\caption{{{escape(t.title)}}}", r"\small"]
    lines += [rf"\begin{{tabular}}{{{'l' * len(t.headers)}}}", r"\toprule"]
    lines.append(" & ".join(escape(h) for h in t.headers) + r" \\")
    lines.append(r"\midrule")
    for row in t.rows:
        cells = [escape(text) + (rf"\textsuperscript{{{','.join(m)}}}" if m else "") for text, m in row]
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    if t.footnotes:
        lines += [r"\par\smallskip", r"\footnotesize"]
        lines += [rf"\textsuperscript{{{letter}}}~{escape(text)}\par" for letter, text in t.footnotes]
    return [*lines, r"\end{table}"]


def write_tex(doc: Document) -> str:
    """comparison.tex: each paper table as a table float with a booktabs tabular (\\usepackage{booktabs}, nothing
    else), to \\input into a paper."""
    lines = [f"% {escape(doc.title)}: written by gptlab-compare; needs \\usepackage{{booktabs}} and no other package"]
    for t in tables(doc):
        lines += ["", *_tex_table(t)]
    return "\n".join(lines) + "\n"
