"""No function in gptlab/ is longer than 60 lines: short enough to read on one screen (../shared/DESIGN.md, Style).

The rule: a function's length is its `def` line through the last line of its body, decorators excluded, docstring,
comments and blank lines inside it included (ast's lineno to end_lineno). Methods and nested functions count on
their own, and a nested function's lines count in its enclosing function too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 60


def long_functions(source: str, name: str = "<source>") -> list[str]:
    """'name:line function (N lines)' for every def / async def in `source` longer than LIMIT lines."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1  # lineno is the def line, after any decorators
            if length > LIMIT:
                found.append(f"{name}:{node.lineno} {node.name} ({length} lines)")
    return found


def _function(lines: int, decorators: int = 0, indent: str = "") -> str:
    """A def of exactly `lines` lines (the def line and lines - 1 body statements) under `decorators` decorators."""
    head = [f"{indent}@staticmethod"] * decorators + [f"{indent}def f():"]
    return "\n".join(head + [f"{indent}    x = {i}" for i in range(lines - 1)]) + "\n"


def test_the_rule_counts_the_def_line_through_the_body_and_not_the_decorators():
    assert long_functions(_function(LIMIT)) == []
    assert long_functions(_function(LIMIT + 1)) == ["<source>:1 f (61 lines)"]
    assert long_functions(_function(LIMIT, decorators=3)) == []  # 63 lines with its decorators: still 60
    method = "class C:\n" + _function(LIMIT + 1, decorators=1, indent="    ")
    assert long_functions(method) == ["<source>:3 f (61 lines)"]  # line 3: the def, below its decorator
    assert long_functions("async " + _function(LIMIT + 1)) == ["<source>:1 f (61 lines)"]


def test_no_function_in_gptlab_is_over_60_lines():
    found = [
        hit
        for path in sorted((ROOT / "gptlab").rglob("*.py"))
        for hit in long_functions(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    ]
    assert not found, f"{len(found)} function(s) over {LIMIT} lines; split them into named pieces:\n" + "\n".join(found)
