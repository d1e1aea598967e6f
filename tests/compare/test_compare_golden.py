"""Golden reports: every frozen scenario (tests/helpers/golden.py) gives, byte for byte, the terminal output,
comparison.md, the JSON documents and the HTML text stored under tests/compare/golden/<scenario>/.

A change of wording made on purpose is regenerated with GPTLAB_GOLDEN_UPDATE=1 and shows in the diff; anything
else that moves a report fails here. Floats in JSON are stored to 10 significant digits and compared within a
relative 1e-6, or 1e-12 absolute near zero: the last digits of scipy's and statsmodels' results differ between
builds (statsmodels 0.15 against 0.14: an F of 3.4e-26 where it was 0.0, 11.05389593 for 11.05389594, which
rounding to 10 digits cannot absorb, and a ladder fit's standard errors 2e-7 apart, as an iterative fit converges);
what a report prints never differs. Embedded PNGs are left out (their bytes belong to matplotlib's version)."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest

from gptlab.cli.compare import main
from helpers import golden

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("GPTLAB_GOLDEN_UPDATE") == "1"
PNG = re.compile(r"data:image/png;base64,[A-Za-z0-9+/=]+")


def _rounded(doc):
    if isinstance(doc, float):
        return float(f"{doc:.10g}")
    if isinstance(doc, dict):
        return {k: _rounded(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_rounded(v) for v in doc]
    return doc


def _differences(got, want, where: str = "$") -> list[str]:
    """Where two JSON documents differ: structure, keys, strings, ints and bools exactly; floats (an int standing
    for one too) within a relative 1e-6, 1e-12 absolute near zero; NaN only equals NaN."""
    number = (int, float)
    if isinstance(want, float) or isinstance(got, float):
        both = isinstance(got, number) and isinstance(want, number) and bool not in (type(got), type(want))
        same = both and ((math.isnan(got) and math.isnan(want)) or math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-12))
        return [] if same else [f"{where}: {got!r} != {want!r}"]
    if isinstance(want, dict) and isinstance(got, dict):
        if sorted(got) != sorted(want):
            return [f"{where}: keys {sorted(got)} != {sorted(want)}"]
        return [d for k in want for d in _differences(got[k], want[k], f"{where}.{k}")]
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{where}: {len(got)} items != {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want)) for d in _differences(g, w, f"{where}[{i}]")]
    return [] if type(got) is type(want) and got == want else [f"{where}: {got!r} != {want!r}"]


def test_json_documents_differ_only_by_float_noise():
    """The comparison the JSON goldens use: float noise passes, anything a reader would see fails."""
    assert _differences({"F": 3.4e-26, "b": [11.05389593, 1]}, {"F": 0.0, "b": [11.05389594, 1]}) == []
    assert _differences({"b_se": 0.01129546288}, {"b_se": 0.01129546538}) == []
    assert _differences({"x": float("nan")}, {"x": float("nan")}) == []
    assert _differences({"x": 1.00001}, {"x": 1.0}) == ["$.x: 1.00001 != 1.0"]
    assert _differences({"x": 1e-9}, {"x": 0.0}) == ["$.x: 1e-09 != 0.0"]
    assert _differences({"x": [1, 2]}, {"x": [1]}) == ["$.x: 2 items != 1"]
    assert _differences({"x": "a"}, {"y": "a"}) == ["$: keys ['x'] != ['y']"]
    assert _differences({"x": True}, {"x": 1}) == ["$.x: True != 1"]
    assert _differences({"x": 0.5}, {"x": "0.5"}) == ["$.x: 0.5 != '0.5'"]
    assert _differences({"x": 2}, {"x": 3}) == ["$.x: 2 != 3"]


def _normalise(text: str, tmp: Path) -> str:
    return PNG.sub("data:image/png;base64,<PNG>", text.replace(str(tmp), "<TMP>"))


def _outputs(tmp: Path, out: Path, code: int, stdout: str, stderr: str) -> dict[str, str]:
    """The texts a scenario produced, by file name, normalised (tmp path, PNG bytes, JSON float digits)."""
    got = {"exit_code.txt": f"{code}\n", "stdout.txt": stdout, "stderr.txt": stderr}
    for path in sorted(out.rglob("*")) if out.is_dir() else []:
        name = path.relative_to(out).as_posix().replace("/", "__")
        if path.suffix == ".json":
            doc = _rounded(json.loads(path.read_text()))
            got[name] = json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
        elif path.suffix in (".md", ".html", ".txt"):
            got[name] = path.read_text()
    return {k: _normalise(v, tmp) for k, v in got.items()}


@pytest.mark.parametrize("scenario", sorted(golden.SCENARIOS))
def test_report_matches_its_golden_copy(scenario, tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("GPTLAB_CACHE", str(cache))
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps the terminal table at the console width
    build = golden.SCENARIOS[scenario]
    args = build(tmp_path, cache) if scenario == "with_floor" else build(tmp_path)
    out = tmp_path / "out"
    capsys.readouterr()
    code = main([*args, "--out", str(out), "--no-wandb"])
    captured = capsys.readouterr()
    got = _outputs(tmp_path, out, code, captured.out, captured.err)
    folder = GOLDEN / scenario
    if UPDATE:
        if folder.is_dir():
            for old in folder.iterdir():
                old.unlink()
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in got.items():
            (folder / name).write_text(text)
    want = {p.name: p.read_text() for p in sorted(folder.iterdir())} if folder.is_dir() else {}
    assert sorted(got) == sorted(want), f"{scenario}: files differ; regenerate with GPTLAB_GOLDEN_UPDATE=1"
    for name in want:
        if name.endswith(".json"):
            wrong = _differences(json.loads(got[name]), json.loads(want[name]))
            assert not wrong, f"{scenario}/{name} differs from its golden copy: " + "; ".join(wrong[:5])
        else:
            assert got[name] == want[name], f"{scenario}/{name} differs from its golden copy"
