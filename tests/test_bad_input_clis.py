"""Bad input through every CLI besides gptlab-train (sample, sweep, compare, flops, decode, export, cache,
speculative): ONE table of (command, arguments, needle); gptlab-train's own table is tests/test_bad_input.py.

Each row must end in exactly one stderr line `error: ...` (gptlab-compare: `gptlab-compare: error: ...`) containing
the needle, no traceback, no usage or Hydra block, exit code 2, and nothing written: no file appears in {tmp} (the
working directory, where Hydra would put an output folder; empty folders are allowed) or {tmp}/out, and the trained
run {run}, the folder of the user's own files {user} and the token cache stay byte-identical. Rows run in-process
(main(argv), or sys.argv for the Hydra CLIs flops and decode); rows marked `process` run as real `python -m
gptlab.cli.<command>` processes too. Placeholders: {tmp} an empty folder (not a run dir), {run} a finished 2-step
run made once per module by the real gptlab-train, {nockpt} a run dir without checkpoints, {user} a folder of the
user's own files, {bad} broken sweep files.
"""

from __future__ import annotations

import hashlib
import importlib
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from gptlab.data import default_cache_dir
from helpers.cli import run_cli
from helpers.train import FAST, train_env

HYDRA_CLIS = ("flops", "decode")  # read sys.argv (Hydra's @main)


@dataclass
class Row:
    id: str
    cli: str  # gptlab.cli.<cli>
    args: list[str]
    needle: str
    process: bool = False


TABLE = [
    Row(
        "sample-temperature-negative",
        "sample",
        ["{tmp}", "--temperature", "-1"],
        "--temperature=-1.0: must be >= 0 (0 = greedy)",
        process=True,
    ),
    Row(
        "sample-temperature-nan",
        "sample",
        ["{tmp}", "--temperature", "nan"],
        "--temperature=nan: must be a finite number >= 0 (0 = greedy)",
    ),
    Row("sample-tokens-negative", "sample", ["{tmp}", "--tokens", "-5"], "--tokens=-5: must be >= 0"),
    Row("sample-top-k-zero", "sample", ["{tmp}", "--top-k", "0"], "--top-k=0: must be >= 1"),
    Row("sample-top-k-negative", "sample", ["{tmp}", "--top-k=-3"], "--top-k=-3: must be >= 1"),
    Row("sample-seed-negative", "sample", ["{tmp}", "--seed=-1"], "--seed=-1: must be in [0, 2**63)"),
    Row("sample-seed-too-big", "sample", ["{tmp}", f"--seed={2**64}"], f"--seed={2**64}: must be in [0, 2**63)"),
    Row(
        "sample-tokens-not-int",
        "sample",
        ["{tmp}", "--tokens", "abc"],
        "gptlab-sample: argument --tokens: invalid int value: 'abc'",
    ),
    Row(
        "sample-unknown-flag",
        "sample",
        ["{tmp}", "--top_p", "0.9"],
        "gptlab-sample: unrecognized arguments: --top_p 0.9",
    ),
    Row("sample-not-a-run-dir", "sample", ["{tmp}"], "{tmp}: not a run directory (no .hydra/config.yaml)"),
    Row(
        "sweep-seeds-letters",
        "sweep",
        ["fast", "--seeds", "a,b", "--out", "{tmp}/out"],
        "--seeds: 'a,b' is not a comma-separated list of integers",
        process=True,
    ),
    Row(
        "sweep-seeds-empty-item",
        "sweep",
        ["fast", "--seeds", "1,,2", "--out", "{tmp}/out"],
        "--seeds: '1,,2' is not a comma-separated list of integers",
    ),
    Row(
        "sweep-seeds-float",
        "sweep",
        ["fast", "--seeds", "0.5", "--out", "{tmp}/out"],
        "--seeds: '0.5' is not a comma-separated list of integers",
    ),
    Row(
        "sweep-seeds-negative",
        "sweep",
        ["fast", "--seeds=-1,2", "--out", "{tmp}/out"],
        "--seeds: seed -1 is out of range; allowed: integers in [0, 2**63)",
    ),
    Row(
        "sweep-seeds-too-big",
        "sweep",
        ["fast", f"--seeds=0,{2**63}", "--out", "{tmp}/out"],
        f"--seeds: seed {2**63} is out of range; allowed: integers in [0, 2**63)",
    ),
    Row(
        "sweep-unknown-name",
        "sweep",
        ["nosuch", "--out", "{tmp}/out"],
        "sweep 'nosuch': no such sweep file; available:",
    ),
]


SPEC = ["--target", "{run}", "--draft", "{run}"]
TABLE += [
    # gptlab-sample on a run
    Row("sample-prompt-without-text", "sample", ["{run}", "--prompt"], "argument --prompt: expected one argument"),
    Row("sample-no-checkpoint", "sample", ["{nockpt}"], "{nockpt}: no readable checkpoint in {nockpt}/checkpoints"),
    Row(
        "sample-temperature-inf",
        "sample",
        ["{run}", "--temperature", "inf"],
        "--temperature=inf: must be a finite number >= 0",
    ),
    # gptlab-sweep: extra overrides the sweep would silently replace, or that compose with nothing; sweep files
    Row(
        "sweep-extra-seed",
        "sweep",
        ["fast", "seed=5", "--dry-run", "--out", "{tmp}/out"],
        "seed=5: gptlab-sweep sets seed for each run itself (from the sweep file's seeds; use --seeds N,M)",
        process=True,
    ),
    Row("sweep-extra-arm", "sweep", ["fast", "arm=x", "--out", "{tmp}/out"], "arm=x: gptlab-sweep sets arm for"),
    Row("sweep-extra-sweep-name", "sweep", ["fast", "sweep=x", "--out", "{tmp}/out"], "sweep=x: gptlab-sweep sets"),
    Row(
        "sweep-extra-run-dir",
        "sweep",
        ["fast", "hydra.run.dir={tmp}/x", "--out", "{tmp}/out"],
        "gptlab-sweep sets hydra.run.dir for each run itself (to <sweep dir>/<arm>/seed<k>",
    ),
    Row(
        "sweep-lr-with-lr-grid",
        "sweep",
        ["fast", "--lr-grid", "1e-3,2e-3", "optimizer.lr=1", "--out", "{tmp}/out"],
        "optimizer.lr=1: gptlab-sweep sets optimizer.lr for each run itself (from the lr grid",
    ),
    Row(
        "sweep-extra-typo",
        "sweep",
        ["fast", "train.max_step=3", "--dry-run", "--out", "{tmp}/out"],
        "extra override: train.max_step: no such key or group (did you mean train.max_steps?)",
    ),
    Row(
        "sweep-extra-unknown-choice",
        "sweep",
        ["fast", "attention=gqaa", "--out", "{tmp}/out"],
        "extra override: attention=gqaa: no such option (did you mean attention=gqa?)",
    ),
    Row(
        "sweep-subdir",
        "sweep",
        ["fast", "hydra.sweep.subdir=x", "--out", "{tmp}/out"],
        "hydra.sweep.subdir=x: gptlab-sweep puts each run in <sweep dir>/<arm>/seed<k>",
    ),
    Row("sweep-lr-grid-letters", "sweep", ["fast", "--lr-grid", "a,b", "--out", "{tmp}/out"], "lr grid 'a,b': allowed"),
    Row("sweep-unknown-flag", "sweep", ["fast", "--bogus", "--out", "{tmp}/out"], "unrecognized arguments: --bogus"),
    Row("sweep-status-not-a-sweep", "sweep", ["status", "{tmp}"], "{tmp}: not a gptlab-sweep dir (no sweep.yaml)"),
    Row(
        "sweep-file-arm-name",
        "sweep",
        ["{bad}/armname.yaml", "--out", "{tmp}/out"],
        "{bad}/armname.yaml: arm name '../x': allowed: letters, digits",
    ),
    Row(
        "sweep-file-duplicate-key",
        "sweep",
        ["{bad}/dup.yaml", "--out", "{tmp}/out"],
        "{bad}/dup.yaml: key 'a' is given twice in one mapping (line 3)",
    ),
    Row(
        "sweep-file-unknown-key",
        "sweep",
        ["{bad}/key.yaml", "--out", "{tmp}/out"],
        "{bad}/key.yaml: 'bogus' is not a sweep file key; allowed:",
    ),
    Row(
        "sweep-file-seed-twice", "sweep", ["{bad}/seeds.yaml", "--out", "{tmp}/out"], "seeds: [0, 0] lists a seed twice"
    ),
    Row(
        "sweep-file-arm-not-a-list",
        "sweep",
        ["{bad}/type.yaml", "--out", "{tmp}/out"],
        "arm 'a' must be a list of override strings",
    ),
    # gptlab-compare
    Row(
        "compare-no-runs",
        "compare",
        ["{user}", "--out", "{tmp}/out"],
        "'{user}' contains no run directories (none has summary.json, metrics.jsonl, decode.json)",
    ),
    Row(
        "compare-unknown-flag",
        "compare",
        ["{run}", "--bogus"],
        "gptlab-compare: error: unrecognized arguments: --bogus",
        process=True,
    ),
    Row("compare-step-not-int", "compare", ["{run}", "--step", "x"], "argument --step: invalid int value: 'x'"),
    Row("compare-step-missing", "compare", ["{run}", "--step", "3", "--out", "{tmp}/out"], "has no val/loss at"),
    Row("compare-out-is-a-run", "compare", ["{run}", "--out", "{run}"], "--out '{run}' is a run directory"),
    Row(
        "compare-claims-missing",
        "compare",
        ["{run}", "--claims", "{tmp}/nope.yaml", "--out", "{tmp}/out"],
        "--claims '{tmp}/nope.yaml' does not exist",
    ),
    Row(
        "compare-baseline-unknown",
        "compare",
        ["{run}", "--baseline", "attention=zzz", "--out", "{tmp}/out"],
        "--baseline 'attention=zzz' matches no group",
    ),
    # gptlab-flops (Hydra): one line for Hydra's own errors too; keys and values checked as gptlab-train checks them
    Row("flops-unknown-choice", "flops", ["model=gpt3"], "model=gpt3: no such option (did you mean", process=True),
    Row(
        "flops-unknown-key",
        "flops",
        ["attention.widnow=1"],
        "attention.widnow: no such key or group (did you mean attention.window?)",
    ),
    Row("flops-appended-root-key", "flops", ["+foo=1"], "foo: not a config key; allowed: arm, attention,"),
    Row("flops-appended-train-key", "flops", ["+train.foo=1"], "train.foo: not a train key; allowed:"),
    Row("flops-bad-train-value", "flops", ["train.max_steps=abc"], "train.max_steps='abc': expected an integer"),
    Row(
        "flops-other-schedules-knob",
        "flops",
        ["schedule=constant", "schedule.min_lr_ratio=0.5"],
        "schedule.min_lr_ratio: not a key of schedule=constant; allowed here: warmup_steps",
    ),
    Row("flops-mode", "flops", ["mode=bogus"], "mode=bogus: not allowed; allowed: train, prefill, decode"),
    Row("flops-format", "flops", ["format=xml"], "format=xml: not allowed; allowed: table, json"),
    Row("flops-dtype", "flops", ["dtype=fp4"], "dtype=fp4: not allowed; allowed: fp32, bf16, fp16, fp8"),
    Row("flops-seq-len", "flops", ["seq_len=100000"], "seq_len=100000: exceeds model.block_size=128"),
    Row("flops-batch-zero", "flops", ["batch_size=0"], "batch_size=0: expected a positive integer"),
    Row("flops-override-syntax", "flops", ["model.n_layer=["], "cannot parse override 'model.n_layer=['"),
    Row("flops-world-size-alone", "flops", ["world_size=0"], "world_size=0: needs a strategy"),
    # gptlab-decode (Hydra): keys it never reads are refused, not dropped
    Row(
        "decode-train-key",
        "decode",
        ["run={run}", "train.max_steps=3"],
        "train.max_steps=3: gptlab-decode does not read it",
        process=True,
    ),
    Row("decode-optimizer-key", "decode", ["optimizer.lr=1"], "optimizer.lr=1: gptlab-decode does not read it"),
    Row("decode-data-choice", "decode", ["data=text"], "data=text: gptlab-decode does not read it"),
    Row("decode-logger", "decode", ["logger=wandb"], "logger=wandb: gptlab-decode does not read it"),
    Row("decode-appended-root-key", "decode", ["run={run}", "+foo=1"], "foo: not a config key; allowed:"),
    Row(
        "decode-model-key-with-run",
        "decode",
        ["run={run}", "model.n_layer=4"],
        "model.n_layer=4: with run={run} the model comes from the run's own config",
    ),
    Row(
        "decode-out-over-summary",
        "decode",
        ["run={run}", "out={run}/summary.json"],
        "out={run}/summary.json: that is the run dir {run}'s own summary.json",
    ),
    Row("decode-not-a-run", "decode", ["run={tmp}"], "{tmp}: not a run directory (no .hydra/config.yaml)"),
    Row("decode-batch-zero", "decode", ["batch_sizes=[0]"], "batch_sizes=[0]: allowed: one or a list of integers >= 1"),
    Row("decode-cache-kind", "decode", ["cache=foo"], "cache='foo': 'foo' is not a cache kind"),
    Row("decode-kv-quant", "decode", ["kv_quant=int4"], "kv_quant='int4': allowed: null, int8"),
    Row("decode-new-tokens", "decode", ["new_tokens=1"], "new_tokens=1: allowed: an integer >= 2"),
    Row(
        "decode-inert-global-every",
        "decode",
        ["model=tiny", "attention.global_every=2"],
        "attention.global_every=2 has no effect without attention.window (attention=mha)",
    ),
    Row("decode-unknown-choice", "decode", ["attention=gqaa"], "attention=gqaa: no such option"),
    # gptlab-export
    Row("export-not-a-run", "export", ["{tmp}"], "{tmp}: not a run directory (no .hydra/config.yaml)", process=True),
    Row("export-out-is-the-run", "export", ["{run}", "--out", "{run}"], "--out={run}: must not be the run dir itself"),
    Row(
        "export-out-over-run-files",
        "export",
        ["{run}", "--out", "{run}/checkpoints"],
        "--out={run}/checkpoints: that is the run dir {run}'s own checkpoints",
    ),
    Row(
        "export-out-user-folder", "export", ["{run}", "--out", "{user}"], "--out={user}: holds other files (notes.txt)"
    ),
    Row(
        "export-checkpoint-missing",
        "export",
        ["{run}", "--checkpoint", "{tmp}/nope.pt", "--out", "{tmp}/out"],
        "--checkpoint={tmp}/nope.pt: not a checkpoint file or .dcp dir",
    ),
    Row("export-unknown-flag", "export", ["{run}", "--bogus"], "unrecognized arguments: --bogus"),
    # gptlab-cache
    Row("cache-rm-short-key", "cache", ["rm", "abc"], "'abc': give at least 6 characters of a key", process=True),
    Row("cache-rm-no-match", "cache", ["rm", "zzzzzzzz"], "'zzzzzzzz' matches 0 cache entries in"),
    Row("cache-prune-bad-age", "cache", ["prune", "--older-than", "5x"], "--older-than '5x': allowed: a number and"),
    Row("cache-prune-without-age", "cache", ["prune"], "gptlab-cache prune: the following arguments are required"),
    Row("cache-unknown-command", "cache", ["bogus"], "argument command: invalid choice: 'bogus'"),
    # gptlab-speculative (flags checked before any run is read; --out never over a run's files)
    Row("spec-k-zero", "speculative", [*SPEC, "--k", "0", "--out", "{tmp}/s.json"], "--k=0: must be >= 1"),
    Row(
        "spec-temperature-negative",
        "speculative",
        [*SPEC, "--temperature", "-1", "--out", "{tmp}/s.json"],
        "--temperature=-1.0: must be >= 0 (0 = greedy)",
        process=True,
    ),
    Row("spec-top-k-zero", "speculative", [*SPEC, "--top-k", "0", "--out", "{tmp}/s.json"], "--top-k=0: must be >= 1"),
    Row(
        "spec-seed-negative",
        "speculative",
        [*SPEC, "--seed=-1", "--out", "{tmp}/s.json"],
        "--seed=-1: must be in [0, 2**63)",
    ),
    Row(
        "spec-tokens-one", "speculative", [*SPEC, "--tokens", "1", "--out", "{tmp}/s.json"], "--tokens=1: must be >= 2"
    ),
    Row("spec-threads-zero", "speculative", [*SPEC, "--threads", "0", "--out", "{tmp}/s.json"], "--threads=0: must be"),
    Row(
        "spec-out-over-summary",
        "speculative",
        [*SPEC, "--out", "{run}/summary.json"],
        "--out={run}/summary.json: that is the run dir {run}'s own summary.json",
    ),
    Row("spec-out-is-a-folder", "speculative", [*SPEC, "--out", "{tmp}"], "--out={tmp}: is a directory"),
    Row(
        "spec-target-not-a-run",
        "speculative",
        ["--target", "{tmp}", "--draft", "{run}", "--out", "{tmp}/s.json"],
        "{tmp}: not a run directory (no .hydra/config.yaml)",
    ),
    Row("spec-draft-missing", "speculative", ["--target", "{run}"], "the following arguments are required: --draft"),
]


def digest(path: Path) -> dict[str, str]:
    """sha256 of every file under path (Hydra's and gptlab-train's logs and the lock left out)."""
    files = [p for p in sorted(path.rglob("*")) if p.is_file() and p.name not in {"train.log", ".gptlab.lock"}]
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.fixture(scope="module")
def places(tmp_path_factory) -> dict[str, str]:
    """{run}: a 2-step run by the real gptlab-train (a .hydra/ and a tokenizer, as users have them), and the rest."""
    base = tmp_path_factory.mktemp("bad_cli")
    run = base / "run"
    args = [*FAST, "train.max_steps=2", "train.eval_interval=2", f"hydra.run.dir={run}"]
    proc = run_cli("gptlab.cli.train", *args, env=train_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    nockpt = base / "nockpt"
    shutil.copytree(run / ".hydra", nockpt / ".hydra")
    user = base / "user"
    user.mkdir()
    (user / "notes.txt").write_text("the user's own file\n")
    bad = base / "bad"
    bad.mkdir()
    (bad / "armname.yaml").write_text('seeds: [0]\narms:\n  "../x": [attention=gqa]\n')
    (bad / "dup.yaml").write_text("seeds: [0]\narms:\n  a: [attention=gqa]\n  a: [attention=mqa]\n")
    (bad / "key.yaml").write_text("seeds: [0]\nbogus: 1\narms:\n  a: [attention=gqa]\n")
    (bad / "seeds.yaml").write_text("seeds: [0, 0]\narms:\n  a: [attention=gqa]\n")
    (bad / "type.yaml").write_text("seeds: [0]\narms:\n  a: attention=gqa\n")
    return {"run": str(run), "nockpt": str(nockpt), "user": str(user), "bad": str(bad)}


def kept(places: dict[str, str]) -> dict[str, dict[str, str]]:
    """What must stay byte-identical: the run, the user's folder, the token cache."""
    paths = [Path(places["run"]), Path(places["user"]), default_cache_dir()]
    return {str(p): digest(p) if p.is_dir() else {} for p in paths}


def check(code, stderr: str, needle: str, tmp: Path) -> list[str]:
    """What is wrong with one outcome (empty when it behaved)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    problems = []
    if code != 2:
        problems.append(f"exit code {code!r}, expected 2")
    one = len(lines) == 1 and lines[0].startswith(("error: ", "gptlab-compare: error: "))
    if not one or needle not in lines[0] or "Traceback" in stderr:
        problems.append(f"stderr is not one line 'error: ...{needle}...': {stderr[-1500:]!r}")
    written = [str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file()]
    if written or (tmp / "out").exists():
        problems.append(f"wrote {written or 'out/'}")
    return problems


def call(row: Row, args: list[str], monkeypatch) -> int:
    """The CLI's main in this process: argv for the argparse CLIs, sys.argv for the Hydra ones."""
    main = importlib.import_module(f"gptlab.cli.{row.cli}").main
    if row.cli in HYDRA_CLIS:
        monkeypatch.setattr(sys, "argv", [f"gptlab-{row.cli}", *args])
        monkeypatch.setenv("HYDRA_FULL_ERROR", "0")
    try:
        code = main() if row.cli in HYDRA_CLIS else main(args)
    except SystemExit as stop:
        code = stop.code
    return code


@pytest.mark.parametrize("row", TABLE, ids=lambda r: r.id)
def test_bad_cli_input(row, places, tmp_path, capfd, monkeypatch):
    """One row: one stderr line naming the key or file, exit 2, nothing written, the run and the user's files intact."""
    values = {**places, "tmp": str(tmp_path)}
    args = [a.format(**values) for a in row.args]
    needle = row.needle.format(**values)
    monkeypatch.chdir(tmp_path)  # a Hydra CLI's output folder would land here
    before = kept(places)
    code = call(row, args, monkeypatch)
    problems = check(code, capfd.readouterr().err, needle, tmp_path)
    assert not problems, problems
    if row.process:
        proc = run_cli(f"gptlab.cli.{row.cli}", *args, timeout=120, cwd=tmp_path)
        problems = check(proc.returncode, proc.stderr, needle, tmp_path)
        assert not problems, f"as a process: {problems}"
    assert kept(places) == before, "a refused command changed the run, the user's files or the cache"


def test_table_is_named_and_covers_every_cli():
    assert len({r.id for r in TABLE}) == len(TABLE)
    assert {r.cli for r in TABLE} == {"sample", "sweep", "compare", "flops", "decode", "export", "cache", "speculative"}
    assert {r.cli for r in TABLE if r.process} == {r.cli for r in TABLE}  # each also as a real process


def test_broken_sweep_yaml_and_non_numeric_summary_are_one_line_errors(tmp_path):
    """A sweep file that is not YAML, and a summary whose val loss is text, end in one named line (exit 2)."""
    import json as _json

    from gptlab.sinks.jsonl import SUMMARY_FIX

    bad = tmp_path / "broken.yaml"
    bad.write_text("arms: {a: [x=1]\nseeds: [0")
    out = run_cli("gptlab.cli.sweep", str(bad), "--dry-run", timeout=120)
    assert out.returncode == 2 and out.stderr.strip().splitlines()[-1].startswith(f"error: {bad}: not valid YAML (")
    assert len(out.stderr.strip().splitlines()) == 1
    run = tmp_path / "runs" / "r0"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(_json.dumps({"final_val_loss": "abc", "status": "finished", "steps": 4}))
    (run / "metrics.jsonl").write_text('{"step": 4, "val/loss": 2.5}\n')
    out = run_cli("gptlab.cli.compare", str(tmp_path / "runs"), "--out", str(tmp_path / "cmp"), timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        f"gptlab-compare: error: {run / 'summary.json'}: final_val_loss='abc' is not a number (a damaged or "
        f"hand-edited file); {SUMMARY_FIX}"
    ]
    assert not (tmp_path / "cmp").exists()
