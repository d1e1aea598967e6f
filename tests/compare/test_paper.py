"""For the paper: the verdict matrix and the main table are also written as comparison.csv and comparison.tex, walked
from the same report document, each verdict cell with its interval and every caveat it carries as a footnote (never
dropped); the LaTeX is booktabs tabulars, every special character escaped, no other package."""

from __future__ import annotations

import csv
import re

from gptlab.compare import modes
from gptlab.compare.render import paper
from gptlab.compare.render.sections import Document, Flag, Table
from helpers.compare import write_run


def _report(root):
    """mha against a cheaper mqa, no shared FLOPs grid: the equal-FLOPs cell is interpolated (a caveat)."""
    for seed in range(3):
        curve = lambda s, sd=seed: 1.50 + 2.0 * 0.97**s + 0.002 * sd  # noqa: E731
        write_run(root / "mha" / f"seed{seed}", seed=seed, loss_at=curve, flops_per_token=7.2e5)
        write_run(
            root / "mqa" / f"seed{seed}", seed=seed, choices={"attention": "mqa"},
            loss_at=lambda s, sd=seed: 1.53 + 2.0 * 0.97**s + 0.002 * sd, flops_per_token=6.0e5,
        )  # fmt: skip
    found = modes.tables(modes.Request([str(root)], baseline="attention=mha", out=str(root / "cmp")))
    modes.write_reports(found.comparisons[0], found.out)
    return found.out


def _tables(rows: list[list[str]]) -> list[list[list[str]]]:
    """comparison.csv's tables, split at its blank rows."""
    out: list[list[list[str]]] = [[]]
    for row in rows:
        if row:
            out[-1].append(row)
        else:
            out.append([])
    return out


def test_csv_and_tex_carry_the_matrix_and_main_table_with_intervals_and_caveats(tmp_path):
    out = _report(tmp_path)
    with open(out / "comparison.csv", newline="") as handle:
        matrix, main = _tables(list(csv.reader(handle)))
    assert matrix[0][0].startswith("Verdict matrix: each arm against")
    assert matrix[1][:3] == ["arm", "Δ val loss at equal steps", "Δ val loss at equal FLOPs"]
    arm = matrix[2]
    assert arm[0] == "attention=mqa, attention.n_kv_head=1"
    assert re.fullmatch(r"\+0\.\d{4} \[\+0\.\d{4}, \+0\.\d{4}\] worse", arm[1])  # the verdict with its interval
    assert arm[2] == "not measured at equal FLOPs ^a"  # the caveat survives as a footnote mark ...
    notes = {row[0]: row[1] for row in matrix[3:]}
    assert notes["^a"].startswith("interpolated: not measured at equal FLOPs")  # ... and its footnote
    assert main[0][0].startswith("gptlab-compare: val loss @ step 100")
    delta = main[1].index("Δ val loss vs baseline")
    assert main[2][delta].startswith("+0.0000") and re.match(r"\+0\.\d{4} \[\+0\.\d{4}, \+0\.\d{4}\] ", main[3][delta])

    tex = (out / "comparison.tex").read_text()
    assert tex.isascii() and "\\usepackage" not in tex.split("\n", 1)[1]
    assert tex.count("\\begin{tabular}") == 2 and tex.count("\\toprule") == 2 and tex.count("\\bottomrule") == 2
    assert "attention=mqa, attention.n\\_kv\\_head=1" in tex
    assert "not measured at equal FLOPs\\textsuperscript{a}" in tex
    assert "\\textsuperscript{a}~interpolated: not measured at equal FLOPs" in tex
    assert "$\\Delta$ val loss at equal steps" in tex and "{[}" in tex  # Δ in math mode, a row never opens with [


def test_a_flag_and_a_mark_become_footnotes_and_latex_specials_are_escaped():
    load = Flag("load", "under load", "other processes used the machine: speed not to be trusted", ("tokens/s",))
    table = Table(
        "", "main", ("label", "tokens/s", "speed-up"),
        (("a_1 & 50% #x", "1,000 ×/÷ 1.04", "1.25× [1.10, 1.42] faster"), ("b", "900", "–")),
        flags=((load,), ()), paper=True, marks=(((), (), ("confounded with run order: ...",)), ((), (), ())),
    )  # fmt: skip
    doc = Document("Comparison at step 100", "", (table, Table("", "not for the paper", ("x",), (("y",),))))
    rows = list(csv.reader(paper.write_csv(doc).splitlines()))
    assert rows[2] == ["a_1 & 50% #x", "1,000 ×/÷ 1.04 ^a", "1.25× [1.10, 1.42] faster ^b"]  # in reading order
    assert rows[4:] == [
        ["^a", "under load: other processes used the machine: speed not to be trusted"],
        ["^b", "confounded with run order: ..."],
    ]
    tex = paper.write_tex(doc)
    assert "a\\_1 \\& 50\\% \\#x & 1,000 $\\times$/$\\div$ 1.04\\textsuperscript{a} & " in tex
    assert "1.25$\\times$ {[}1.10, 1.42{]} faster\\textsuperscript{b} \\\\" in tex
    assert "not for the paper" not in tex and tex.isascii()
    assert paper.escape("~^\\{}$<é☃") == "\\~{}\\^{}$\\backslash$\\{\\}\\$$<$e{[}U+2603{]}"
