"""The house's walls, checked by walking the imports of gptlab/ (and of the tests and benchmarks that use it).

- no import cycles between gptlab modules (function-local and TYPE_CHECKING imports count: a cycle hidden inside a
  function is still two modules that cannot be read apart);
- no re-exports: every `from gptlab.X import name` names a module or something defined in X itself;
- no arrow back up: every import goes to a room (a sub-package of gptlab, or errors.py) at or below the importer's in
  ROOMS, a declared order, bottom to top;
- compare/ reads run directories and imports nothing of training: errors, util, sinks and the sweep layout only;
- compare/'s own rooms keep their order too (COMPARE_ROOMS: reading, statistics, tables, studies, render, modes);
- library code (and the benchmarks, which run a CLI in its own process as a user does) never imports a CLI module;
- gptlab/ holds sub-packages by concept and only `__init__.py` and `errors.py` beside them;
- no verdict word is compared anywhere: code decides from a Verdict's status, never from compare/render/words.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gptlab"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}

# The rooms, bottom to top: a module may import its own room and the rooms before it, never one after it. A new
# sub-package goes where its imports put it (test_every_room_is_in_the_declared_order says when one is missing).
ROOMS = (
    "errors",
    "util",
    "costs",
    "runtime",
    "data",
    "infer",  # KV caches and decoding: model's generate borrows infer/cache.py
    "model",
    "optim",
    "state",
    "sinks",  # provenance reads checkpoint identity (state)
    "config",  # builds model, data, optim from conf/; a trained run rebuilt from its saved config (config/trained.py)
    "interop",  # export and lm-eval read a trained run back through config/trained.py
    "train",  # with its profiler (train/profile/): profile=true times the training loss itself
    "sweep",
    "compare",  # reads run dirs; may read the sweep layout, never training (test_compare_imports_nothing_of_training)
    "study",  # orchestration over sweep/ and compare/ (until-decided looks), so that no CLI holds a loop
    "cli",
)
# what compare/ may import: the run reader needs no torch, Hydra or training code
COMPARE_MAY_IMPORT = ("gptlab.errors", "gptlab.util", "gptlab.sinks", "gptlab.sweep.layout", "gptlab.state.layout")


def _imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, imported name or None) for every gptlab import in a file, relative ones resolved."""
    name = _module_name(path) if path.is_relative_to(PACKAGE) else ""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.split(".")[0] == "gptlab"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] == "gptlab":
                found += [(module, a.name) for a in node.names]
    return found


def _edges() -> dict[str, set[str]]:
    """gptlab module -> the gptlab modules it imports (a submodule imported by name counts as that submodule)."""
    edges: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        targets = set()
        for module, imported in _imports(path):
            full = f"{module}.{imported}" if imported else module
            targets.add(full if full in MODULES else module)
        edges[name] = {t for t in targets if t in MODULES and t != name}
    return edges


def _room(module: str) -> str:
    """gptlab.train.profile.steps -> train; gptlab.errors -> errors; the package itself -> ''."""
    return module.split(".")[1] if "." in module else ""


def _arrows_up(edges: dict[str, set[str]], order: tuple[str, ...]) -> list[str]:
    """Every import from a room to a room after it in `order` (the package's own __init__ imports nothing)."""
    rank = {room: i for i, room in enumerate(order)}
    return sorted(
        f"{name} -> {target} ({_room(name)} is below {_room(target)})"
        for name, targets in edges.items()
        if _room(name)
        for target in targets
        if _room(target) and rank[_room(target)] > rank[_room(name)]
    )


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _defined(path: Path) -> set[str]:
    """Names a module defines itself at its top level (functions, classes, assignments, including under if/try)."""
    names: set[str] = set()

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(node.orelse)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
                visit(getattr(node, "finalbody", []))

    visit(ast.parse(path.read_text()).body)
    return names


def _users() -> list[Path]:
    return sorted([*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")])


def test_cycle_finder_finds_a_planted_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(edges) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert _cycles(_edges()) == []


def test_no_reexports():
    """`from gptlab.X import name` must find `name` defined in X (or be the submodule X.name)."""
    defined = {name: _defined(path) for name, path in MODULES.items()}
    bad = []
    for path in _users():
        for module, imported in _imports(path):
            if imported is None or imported == "*" or f"{module}.{imported}" in MODULES:
                continue
            if module in defined and imported not in defined[module]:
                bad.append(f"{path.relative_to(ROOT)}: from {module} import {imported}")
    assert bad == []


def test_order_checker_finds_a_planted_arrow_up():
    order = ("errors", "model", "train")
    edges = {"gptlab.model.gpt": {"gptlab.train.loop", "gptlab.errors"}, "gptlab.train.loop": {"gptlab.model.gpt"}}
    assert _arrows_up(edges, order) == ["gptlab.model.gpt -> gptlab.train.loop (model is below train)"]
    assert _arrows_up({"gptlab.train.loop": {"gptlab.train.loss", "gptlab.model.gpt"}}, order) == []


def test_every_room_is_in_the_declared_order():
    rooms = {_room(name) for name in MODULES} - {""}
    assert sorted(rooms) == sorted(ROOMS), "place a new room in ROOMS where its imports put it"


def test_no_import_runs_back_up():
    assert _arrows_up(_edges(), ROOMS) == []


# compare's own rooms, bottom to top: reading runs, statistics, the tables a comparison computes, studies over a
# sweep, rendering (the only room that makes words); modes.py on top is what gptlab-compare calls
COMPARE_ROOMS = ("reading", "statistics", "tables", "studies", "render", "modes")


def _compare_room(module: str) -> str:
    """gptlab.compare.tables.analysis -> tables; gptlab.compare.modes -> modes; outside compare -> ''."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "compare" else ""


def test_compare_rooms_import_nothing_above_them():
    rank = {room: i for i, room in enumerate(COMPARE_ROOMS)}
    rooms = {_compare_room(name) for name in MODULES} - {""}
    assert rooms == set(COMPARE_ROOMS), "place a new compare room in COMPARE_ROOMS where its imports put it"
    bad = sorted(
        f"{name} -> {target}"
        for name, targets in _edges().items()
        if _compare_room(name)
        for target in targets
        if _compare_room(target) and rank[_compare_room(target)] > rank[_compare_room(name)]
    )
    assert bad == []


def test_compare_imports_nothing_of_training():
    bad = [
        f"{name} imports {target}"
        for name, targets in _edges().items()
        if _room(name) == "compare"
        for target in targets
        if _room(target) != "compare" and not any(target == m or target.startswith(m + ".") for m in COMPARE_MAY_IMPORT)
    ]
    assert bad == []


def test_library_code_never_imports_a_cli():
    bad = [
        f"{name} imports {target}"
        for name, targets in _edges().items()
        if _room(name) != "cli"
        for target in targets
        if _room(target) == "cli"
    ]
    for path in sorted((ROOT / "benchmarks").rglob("*.py")):
        for module, imported in _imports(path):
            full = f"{module}.{imported}" if imported else module
            if _room(full) == "cli":
                bad.append(f"{path.relative_to(ROOT)} imports {full}")
    assert bad == []


def test_top_level_is_packages_by_concept():
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    packages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    assert modules == ["__init__.py", "errors.py"]
    assert len(modules) + len(packages) <= 20, packages


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_module_has_a_docstring_or_is_an_empty_package(module):
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    assert ast.get_docstring(tree) or not tree.body, f"{path.relative_to(ROOT)} has no module docstring"


# Words only compare/render/words.py may produce; compared against anywhere else, a rewording would change a decision.
VERDICT_WORDS = (
    "faster", "slower", "within noise", "significant", "under outside load", "lower val loss",
    "higher val loss", "better", "worse", "n/a",
)  # fmt: skip


def test_no_verdict_word_is_compared_anywhere():
    """Code decides from the Verdict (status, direction, caveats), never from its words: a == / != / in against a
    verdict word, or a startswith / endswith of one, outside compare/render/words.py is refused."""
    found = []
    for path in [*sorted(PACKAGE.rglob("*.py")), *sorted((ROOT / "benchmarks").rglob("*.py"))]:
        if path.name == "words.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            literals: list[ast.AST] = []
            if isinstance(node, ast.Compare):
                literals = [node.left, *node.comparators]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in ("startswith", "endswith"):
                    literals = list(node.args)
            texts = [
                c.value
                for lit in literals
                for c in ([lit] if not isinstance(lit, ast.Tuple) else lit.elts)
                if isinstance(c, ast.Constant) and isinstance(c.value, str)
            ]
            hits = [t for t in texts if any(t == w or t.startswith(w) for w in VERDICT_WORDS)]
            if hits:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {hits}")
    assert found == []
