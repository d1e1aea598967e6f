"""Golden reports: every frozen scenario (tests/helpers/golden.py) gives, byte for byte, the terminal output,
comparison.md, the JSON documents and the HTML text stored under tests/compare/golden/<scenario>/.

A change of wording made on purpose is regenerated with GPTLAB_GOLDEN_UPDATE=1 and shows in the diff; anything
else that moves a report fails here. Floats in JSON are compared to 10 significant digits (the last bits of
scipy's results may differ between builds; what a report prints never does), embedded PNGs are left out (their
bytes belong to matplotlib's version)."""

from __future__ import annotations

import json
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
        assert got[name] == want[name], f"{scenario}/{name} differs from its golden copy"
