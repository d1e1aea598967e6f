"""Words through one door: no module of gptlab/compare, nor gptlab/cli/compare.py, writes a verdict word in a string
literal but gptlab/compare/render/words.py; every other module asks words.py (which takes Verdict values), so a
report, a plot title, a W&B table and a study's lines say one thing in one vocabulary. (tests/test_layout.py refuses
the other half: code that compares verdict words instead of asking the Verdict.)

The walk reads every string constant and every literal part of an f-string, and skips docstrings (a contract may name
the words it promises) and spellings for code rather than readers: an Enum member's value (a JSON spelling such as
matrix.Outcome.BETTER = "better"), a dict key, a subscript, and a list of bare identifiers (W&B column names such as
"significant").
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from helpers.paths import REPO

WORDS = REPO / "gptlab" / "compare" / "render" / "words.py"
SCANNED = sorted((REPO / "gptlab" / "compare").rglob("*.py")) + [REPO / "gptlab" / "cli" / "compare.py"]

# What a literal may not say, and why each pattern catches verdicts and not prose. Some words are verdicts wherever
# they appear; others are verdicts only where they open a cell or a clause (`better (p=0.003)`, `undecided at the
# cap ...`), while in the middle of a sentence they are prose about a metric or a plan ("lower is better", "the seeds
# that would decide each undecided arm").
VERDICTS = {
    "within noise": (r"\bwithin noise\b", "the verdict on every undecided difference"),
    "beyond noise": (r"\bbeyond noise\b", "the clause of a decided difference"),
    "faster / slower": (r"\b(faster|slower)\b", "a decided ratio: a speed-up, a time to target, decode"),
    "not significant": (r"\bnot significant\b", "the test column of a table"),
    "significant ...": (r"^\W*significant\b", "a test cell: `significant (p=0.003)`"),
    "better / worse ...": (r"^\W*(better|worse)\b", "a decided cell on a metric with a better side"),
    "undecided ...": (r"^\W*undecided\b", "an undecided cell or look: `undecided (p=0.2, ...)`, `undecided at ...`"),
    "(decided)": (r"\(decided\)", "a ladder swap's verdict"),
    "n/a: / n/a (": (r"\bn/a(: | \()", "a missing verdict and its reason: `n/a: 1 seed`, `n/a (needs 2+ seeds)`"),
    "identical model": (
        r"\(identical model\)|: identical model\b",
        "the verdict on two arms that build one model (the flag `identical model` and a warning that two arms "
        "'build the identical model' state the fingerprint's fact, not a test's result)",
    ),
}
PATTERN = re.compile("|".join(f"(?:{rx})" for rx, _ in VERDICTS.values()))
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _is_enum(node: ast.ClassDef) -> bool:
    names = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases]
    return any(n.endswith("Enum") for n in names)


def _keys(tree: ast.AST) -> set[int]:
    """The string constants that spell something for code: Enum values, dict keys, subscripts, identifier lists."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and _is_enum(node):
            found |= {id(c) for stmt in node.body if isinstance(stmt, ast.Assign) for c in ast.walk(stmt.value)}
        elif isinstance(node, ast.Dict):
            found |= {id(k) for k in node.keys if k is not None}
        elif isinstance(node, ast.Subscript):
            found.add(id(node.slice))
        elif isinstance(node, (ast.List, ast.Tuple, ast.Set)) and node.elts:
            if all(isinstance(e, ast.Constant) and isinstance(e.value, str) and IDENTIFIER.fullmatch(e.value)
                   for e in node.elts):  # fmt: skip
                found |= {id(e) for e in node.elts}
    return found


def verdict_literals(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string literal in `source` that writes a verdict word (VERDICTS)."""
    tree = ast.parse(source)
    skip = _docstrings(tree) | _keys(tree)
    found = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in skip
        and PATTERN.search(node.value)
    ]
    return [(n.lineno, n.value) for n in sorted(found, key=lambda n: (n.lineno, n.col_offset))]


@pytest.mark.parametrize("path", [p for p in SCANNED if p != WORDS], ids=lambda p: str(p.relative_to(REPO)))
def test_no_module_but_words_writes_a_verdict_word(path: Path):
    found = verdict_literals(path.read_text())
    assert not found, (
        f"{path.relative_to(REPO)} writes verdict words itself; word them in compare/render/words.py from the "
        f"Verdict: {found}"
    )


def test_a_planted_verdict_literal_is_caught_in_every_form():
    planted = '''
def cell(v, x):
    """Says `within noise`, `faster` or `n/a: 1 seed`: a docstring may name the words."""
    word = "faster" if v.direction > 0 else "slower"
    if v.p is None:
        return f"{x:.2f}× n/a (1 seed)"
    return f"{x:+.4f} {word}" if v.decided else f"{x:+.4f} within noise"


def tail(v):
    return " better (p=0.01)" if v else " (decided)"
'''
    assert [text for _, text in verdict_literals(planted)] == [
        "faster",
        "slower",
        "× n/a (1 seed)",
        " within noise",
        " better (p=0.01)",
        " (decided)",
    ]


def test_code_spellings_and_prose_about_a_metric_are_not_verdicts():
    prose = """
from enum import Enum


class Outcome(str, Enum):
    BETTER = "better"
    UNDECIDED = "undecided"


COLUMNS = ["label", "significant", "speedup"]
ALLOWED = "METRIC=X (lower is better for *loss*, higher for *acc*)"
HELP = "the seeds per arm that would decide each undecided arm"
FLAG = "identical model"
WARN = "'a' and 'b' build the identical model (fingerprint fp): every difference between them is noise"


def f(d):
    return d["within noise"], {"faster": 1}
"""
    assert verdict_literals(prose) == []
