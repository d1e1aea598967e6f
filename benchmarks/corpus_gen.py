"""Generated English-like corpora for the data-at-scale benchmark (benchmarks/data_scale.py): words from a fixed list
with Zipf weights (seeded numpy RNG), 12 a line, as one .txt document and as a .jsonl of ~4 KB documents holding the
same text; kept on disk and reused while their spec is unchanged."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

WORDS = (
    "the of and to a in is it you that he was for on are with as I his they be at one have this from or had by "
    "not word but what some we can out other were all there when up use your how said an each she which do their "
    "time if will way about many then them write would like so these her long make thing see him two has look "
    "more day could go come did number sound no most people my over know water than call first who may down "
    "side been now find any new work part take get place made live where after back little only round man year "
    "came show every good me give our under name very through just form sentence great think say help"
).split()
TABLE = [w + " " for w in WORDS] + [w + "\n" for w in WORDS]  # the last word of a line carries the newline
WORDS_PER_LINE, BLOCK_LINES, DOC_BYTES, SEED = 12, 20_000, 4096, 0


def generate(folder: Path, label: str, nbytes: int, jsonl_too: bool = True) -> dict:
    """<label>.txt and (jsonl_too) <label>.jsonl with the same text, the .txt nbytes long (to the end of a line);
    kept if there."""
    txt, jsonl, stamp = folder / f"{label}.txt", folder / f"{label}.jsonl", folder / f"{label}.json"
    spec = {"bytes": nbytes, "seed": SEED, "words": len(WORDS), "words_per_line": WORDS_PER_LINE, "v": 1}
    if not jsonl_too:
        spec["jsonl"] = False
    kept = stamp.is_file() and txt.is_file() and (jsonl.is_file() or not jsonl_too)
    if kept and json.loads(stamp.read_text())["spec"] == spec:
        return json.loads(stamp.read_text())
    rng = np.random.default_rng(SEED)
    p = 1 / np.arange(1, len(WORDS) + 1)  # Zipf: "the" is the commonest word
    p /= p.sum()
    t0, written, docs, per_doc = time.perf_counter(), 0, 0, None
    with open(txt, "w") as ft, open(jsonl if jsonl_too else os.devnull, "w") as fj:
        while written < nbytes:
            idx = rng.choice(len(WORDS), size=(BLOCK_LINES, WORDS_PER_LINE), p=p)  # (lines, words)
            idx[:, -1] += len(WORDS)
            text = "".join(map(TABLE.__getitem__, idx.ravel().tolist()))  # ASCII: characters = bytes
            per_doc = per_doc or max(1, round(DOC_BYTES * BLOCK_LINES / len(text)))  # lines per ~4 KB document
            if written + len(text) > nbytes:
                text = text[: text.find("\n", nbytes - written - 1) + 1]
            ft.write(text)
            written += len(text)
            lines = text.splitlines()
            fj.write(
                "".join(
                    json.dumps({"text": "\n".join(lines[i : i + per_doc])}) + "\n"
                    for i in range(0, len(lines), per_doc)
                )
            )
            docs += -(-len(lines) // per_doc)
    info = {
        "spec": spec,
        "txt": str(txt),
        "jsonl": str(jsonl) if jsonl_too else None,
        "txt_bytes": txt.stat().st_size,
        "jsonl_bytes": jsonl.stat().st_size if jsonl_too else None,
        "jsonl_docs": docs,
        "generate_s": time.perf_counter() - t0,
    }
    stamp.write_text(json.dumps(info))
    return info
