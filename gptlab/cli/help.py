"""`gptlab-train --help [GROUP]`: a help page generated from conf/, with the YAML comments that explain each key.

Hydra's help template prints the composed config without comments, so this reads the YAML files with a small
line reader of its own: each key's dotted name, its value as written and its comment (on the same line, on
indented lines just below it, or on comment lines just above it).
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from gptlab.errors import ConfigError
from gptlab.util.paths import CONF_DIR, SWEEPS_DIR

INTERNAL = ("_target_", "_partial_")  # keys that name code, not something a user sets
USAGE = [
    ("gptlab-train [GROUP=OPTION ...] [KEY=VALUE ...]", "one run"),
    ("gptlab-train -m GROUP=A,B KEY=1,2 ...", "a sweep: one run per combination"),
    ("gptlab-train --help GROUP", "every key of GROUP's options, with comments"),
    ("gptlab-train --help train", "the run keys (any section of conf/train.yaml: train, sample)"),
    ("gptlab-train --cfg job [overrides]", "print the composed config and stop"),
    ("gptlab-train --hydra-help", "Hydra's own flags (--info, --multirun, ...)"),
    ("gptlab-train --shell-completion install=bash", 'tab completion: eval "$(...)"; also zsh, fish'),
]
KEY = re.compile(r"^(\s*)([A-Za-z0-9_.\-]+):(?:\s+(.*))?$")


@dataclass
class Entry:
    """One key of a YAML file: dotted name, value as written, comment."""

    key: str
    value: str
    comment: str = ""


@dataclass
class YamlDoc:
    """A YAML file's package, header comment and keys, in file order; `base`: the option of the same group it
    inherits from (its defaults list names it, e.g. gqa.yaml's `- mha`), whose keys it changes."""

    package: str | None
    header: list[str]
    entries: list[Entry]
    base: str | None = None


def split_comment(text: str) -> tuple[str, str]:
    """('value', 'comment') of a line's text: the comment starts at a # outside quotes after a space."""
    quote = None
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i].strip(), text[i + 1 :].strip()
    return text.strip(), ""


class _Reader:
    """Line-by-line state of read_yaml_doc: open mappings, comments waiting for their key, the last key."""

    def __init__(self) -> None:
        self.doc = YamlDoc(None, [], [])
        self.stack: list[tuple[int, str]] = []  # (indent, key) of the open mappings
        self.pending: list[str] = []  # comment lines waiting for the key below them
        self.last: tuple[int, Entry] | None = None  # (indent, entry) of the last key line, for continued comments
        self.seen_key = False

    def comment(self, indent: int, body: str) -> None:
        """A comment-only line: package, header, the continuation of a key's comment, or one for the next key."""
        if body.startswith("@package"):
            self.doc.package = body.split(None, 1)[1] if " " in body else None
        elif not self.seen_key:
            self.doc.header.append(body)
        elif self.last and self.last[1].comment and indent > self.last[0]:
            self.last[1].comment += " " + body
        else:
            self.pending.append(body)

    def key(self, indent: int, name: str, rest: str) -> None:
        """A `name: value  # comment` line (an empty value opens a mapping)."""
        self.seen_key = True
        while self.stack and self.stack[-1][0] >= indent:
            self.stack.pop()
        value, comment = split_comment(rest)
        dotted = ".".join([*(k for _, k in self.stack), name])
        comment, self.pending, self.last = " ".join([*self.pending, comment]).strip(), [], None
        if not value:
            self.stack.append((indent, name))
        if dotted.split(".")[0] == "defaults" or name in INTERNAL or not (value or comment):
            return
        self.doc.entries.append(Entry(dotted, value, comment))
        self.last = (indent, self.doc.entries[-1]) if value else None


def read_yaml_doc(path: Path) -> YamlDoc:
    """Read one config file's keys with their comments (list items and `defaults` are skipped)."""
    reader = _Reader()
    text = path.read_text()
    inherited = re.search(r"^defaults:[ \t]*\n((?:[ \t]+-[^\n]*\n)+)", text, re.M)
    items = [line.strip()[1:].strip() for line in inherited.group(1).splitlines()] if inherited else []
    reader.doc.base = next((i for i in items if i != "_self_" and not re.search(r"[/:=@ ]", i)), None)
    for raw in text.splitlines():
        indent, text = len(raw) - len(raw.lstrip()), raw.strip()
        match = KEY.match(raw)
        if not text:
            reader.pending = [] if reader.seen_key else reader.pending
        elif text.startswith("#"):
            reader.comment(indent, text[1:].strip())
        elif match and not text.startswith("-"):  # list items and continued values are skipped
            reader.key(indent, match.group(2), match.group(3) or "")
    return reader.doc


def prefix(group: str, package: str | None) -> str:
    """Where an option file's keys land in the run config ('' for `# @package _global_`)."""
    if package is None:
        return group
    return "" if package == "_global_" else package.replace("_group_", group)


def groups(conf_dir: Path = CONF_DIR) -> dict[str, list[str]]:
    """Every config group (a folder of conf/, hydra/ aside) and its options (the file stems)."""
    return {
        d.name: sorted(p.stem for p in d.glob("*.yaml"))
        for d in sorted(conf_dir.iterdir())
        if d.is_dir() and d.name != "hydra" and any(d.glob("*.yaml"))
    }


def defaults(root: Path) -> dict[str, tuple[list[str], bool]]:
    """Each group in the root config's defaults list: (its default options, given as a list = multi-select)."""
    chosen, inside = {}, False
    for raw in root.read_text().splitlines():
        text = split_comment(raw.strip())[0]
        if not raw.startswith((" ", "-")) and text:
            inside = text == "defaults:"
            continue
        match = re.match(r"^-\s*([A-Za-z0-9_]+)\s*:\s*(.*)$", text) if inside else None
        if match:
            value = match.group(2).strip()
            options = [v.strip() for v in value.strip("[]").split(",") if v.strip() not in ("", "null")]
            chosen[match.group(1)] = (options, value.startswith("["))
    return chosen


def _row(left: str, right: str, width: int = 34) -> str:
    """`  left   right`, the right column aligned where the left side fits in `width`."""
    return f"  {left:{width}}  {right}".rstrip() if right else f"  {left}"


def _group_line(name: str, options: list[str], chosen: dict[str, tuple[list[str], bool]]) -> str:
    """One group: its options, the default in brackets, and how to pick it when that is not plain GROUP=X."""
    picked, many = chosen.get(name, ([], False))
    shown = " ".join(f"[{o}]" if o in picked else o for o in options)
    if name not in chosen:
        note = f"optional: +{name}={options[0]}"
    elif not picked:  # a list group with an empty default (probes) is picked like one with a default list
        note = f"none by default: '{name}=[{','.join(options[:2])}]'" if many else f"none by default: {name}=OPTION"
    elif many:
        other = next((o for o in options if o not in picked and o != "none"), picked[0])
        note = f"one or several: '{name}=[{picked[0]},{other}]'"
    else:
        note = ""
    return _row(f"{name:11} {shown}", note, 46)


def overview(conf_dir: Path = CONF_DIR) -> str:
    """The page `gptlab-train --help` prints."""
    root = conf_dir / "train.yaml"
    chosen, doc = defaults(root), read_yaml_doc(root)
    sweeps = ", ".join(sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml")))
    lines = [
        "gptlab-train: train one GPT configuration composed from the config groups in conf/ (or a sweep with -m).",
        "",
        "usage:",
        *(_row(left, right, 48) for left, right in USAGE),
        "",
        "config groups (GROUP=OPTION; [default]; keys and comments: gptlab-train --help GROUP):",
        *(_group_line(name, options, chosen) for name, options in groups(conf_dir).items()),
        "",
        "run keys (conf/train.yaml; KEY=VALUE):",
        *(_row(f"{e.key}={e.value}", e.comment) for e in doc.entries if e.value and e.key.split(".")[0] != "hydra"),
        "",
        "overrides and sweeps:",
        _row("attention=gqa attention.n_kv_head=2", "pick an option, then change one of its keys"),
        _row("+KEY=VALUE", "add a key the config does not have"),
        _row("-m attention=mha,gqa seed=0,1,2", "multirun: every combination is one run (6 here)"),
        _row("-m launcher=local ... | launcher=slurm", "a multirun's runs as parallel processes | SLURM jobs"),
        _row("gptlab-sweep NAME [--dry-run]", f"a shipped ablation from sweeps/: {sweeps}"),
        _row("hydra.run.dir=DIR", "where one run writes (default outputs/runs/<date>/<time>-<id>)"),
        _row("hydra.sweep.dir=DIR", "where a multirun writes (default outputs/sweeps/<sweep>/<date>-<id>)"),
        "  quote for the shell what it would expand: 'logger=[wandb,tensorboard]' 'name=my run'",
    ]
    return "\n".join(lines)


def sections(root: Path) -> list[str]:
    """The top-level sections of a root config (train, sample, profile, ...: mappings, not groups or Hydra's)."""
    keys = [e.key.split(".")[0] for e in read_yaml_doc(root).entries if "." in e.key]
    return [k for k in dict.fromkeys(keys) if k not in ("hydra", "logger")]


def section_page(name: str, root: Path) -> str:
    """`--help train` (any top-level section of the root config): each of its keys with its default and comment."""
    doc = read_yaml_doc(root)
    lines = [f"{name}: keys of {root.name} (set with {name}.KEY=VALUE)"]
    lines += [
        _row(f"  {e.key}={e.value}", e.comment, 36) for e in doc.entries if e.key.startswith(f"{name}.") and e.value
    ]
    return "\n".join(lines)


def group_page(name: str, conf_dir: Path = CONF_DIR, root: str = "train.yaml") -> str:
    """The page `gptlab-train --help GROUP` prints: each option's header and keys with their comments; a top-level
    section of the CLI's root config or of train.yaml under it (`--help train`) prints its keys."""
    known = groups(conf_dir)
    roots = [conf_dir / r for r in dict.fromkeys((root, "train.yaml"))]
    for path in roots:
        if name not in known and name in sections(path):
            return section_page(name, path)
    if name not in known:
        allowed = [*known, *(s for path in roots for s in sections(path))]
        raise ConfigError(
            f"--help {name}: no such config group or section; allowed: {', '.join(allowed)} (or --help alone)"
        )
    picked, many = defaults(conf_dir / "train.yaml").get(name, ([], False))
    how = f"'{name}=[A,B]' (one or several)" if many else f"{name}=OPTION"
    lines = [
        f"{name}: pick with {how} (default: {','.join(picked) or 'none'}); change a key with KEY=VALUE as listed below"
    ]
    for option in known[name]:
        doc = read_yaml_doc(conf_dir / name / f"{option}.yaml")
        where = prefix(name, doc.package)
        lines += ["", f"{option}{'  (default)' if option in picked else ''}"]
        lines += [f"    {line}" for line in doc.header]
        if doc.base:
            lines.append(f"    (the keys of {doc.base}, changed as below)")
        for e in doc.entries:
            key = f"{where}.{e.key}" if where else e.key
            lines.append(_row(f"  {key}={e.value}" if e.value else f"  {key}:", e.comment, 36))
        if not doc.entries:
            lines.append("    (no keys)")
    return "\n".join(lines)


def key_rows(root: Path) -> list[str]:
    """Each top-level key of a CLI's root config (conf/flops.yaml, conf/decode.yaml) with its value and comment."""
    return [
        f"  {e.key}={e.value}\n" + textwrap.fill(e.comment, 110, initial_indent=" " * 6, subsequent_indent=" " * 6)
        for e in read_yaml_doc(root).entries
        if e.value and not e.key.startswith("hydra")
    ]


def help_topic(args: list[str]) -> str | None:
    """The GROUP after --help/-h ('' for the overview), or None when the command line asks for no help."""
    for i, arg in enumerate(args):
        if arg.startswith("--help="):
            return arg.split("=", 1)[1]
        if arg in ("--help", "-h"):
            after = args[i + 1] if i + 1 < len(args) else ""
            return after if after and not after.startswith("-") and "=" not in after else ""
    return None


def render(topic: str) -> str:
    """The help page for a topic: '' = the overview, else a group's page."""
    return overview() if not topic else group_page(topic)
