"""Command-line polish: generated --help with YAML comments, runnable sweep commands, completion misuse in one
line, one progress line per eval step, train.log holds the run's lines, a user's hydra.sweep.dir is honoured."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gptlab.cli.help import group_page, groups, read_yaml_doc, render
from gptlab.cli.sweep import main as sweep_main
from gptlab.errors import ConfigError
from gptlab.sinks.progress import CONSOLE_LOG, ProgressSink
from gptlab.sweep.spec import take_sweep_dir
from gptlab.util.paths import CONF_DIR
from helpers.cli import run_cli
from helpers.train import FAST, train_env

BIN = Path(sys.executable).parent
INLINE = re.compile(r"^(\s*)([A-Za-z_][A-Za-z0-9_]*):\s+([^#\s][^#]*?)\s+#\s*(.+)$")  # key: value  # comment


def inline_comments(path: Path) -> dict[str, tuple[str, str]]:
    """{dotted key: (value, comment)} for the keys of a YAML file that carry a comment on their own line."""
    found, parents = {}, []
    for raw in path.read_text().splitlines():
        head = re.match(r"^(\s*)([A-Za-z_][A-Za-z0-9_]*):\s*(#.*)?$", raw)
        if head:  # a mapping opens
            parents = [p for p in parents if p[0] < len(head.group(1))] + [(len(head.group(1)), head.group(2))]
            continue
        match = INLINE.match(raw)
        if match:
            parents = [p for p in parents if p[0] < len(match.group(1))]
            found[".".join([*(k for _, k in parents), match.group(2)])] = (match.group(3), match.group(4))
    return found


# ---------------------------------------------------------------- gptlab-train --help
def test_help_lists_every_group_option_and_each_root_key_with_its_comment(tmp_path):
    proc = run_cli("gptlab.cli.train", "--help", cwd=tmp_path, env=train_env(), timeout=120)
    assert proc.returncode == 0 and proc.stderr == ""
    page = proc.stdout.splitlines()
    folders = sorted(d.name for d in CONF_DIR.iterdir() if d.is_dir() and d.name != "hydra")
    assert {"logger", "launcher", "attention"} <= set(folders)
    for group in folders:
        line = next(l for l in page if l.split()[:1] == [group])
        assert line.split()[1:] and all(o.stem in line for o in (CONF_DIR / group).glob("*.yaml")), line
    assert next(l for l in page if l.split()[:1] == ["attention"]).split()[1:].count("[mha]") == 1
    assert "'logger=[wandb," in next(l for l in page if l.split()[:1] == ["logger"])
    root = {k: v for k, v in inline_comments(CONF_DIR / "train.yaml").items() if not k.startswith("hydra")}
    assert {"seed", "data_seed", "train.batch_size", "sample.tokens"} <= set(root)
    for key, (value, comment) in root.items():
        line = next(l for l in page if l.strip().startswith(f"{key}="))
        assert line.strip().startswith(f"{key}={value} ") and comment in line, (key, line)
    resume = next(l for l in page if l.strip().startswith("train.resume="))
    assert "refused when the config differs" in resume  # the comment's continuation line joins it
    text = proc.stdout
    for how in (
        "gptlab-train --help GROUP",
        "-m attention=mha,gqa seed=0,1,2",
        "+KEY=VALUE",
        "gptlab-sweep NAME",
        "--hydra-help",
        "--shell-completion install=bash",
        "hydra.sweep.dir=DIR",
    ):
        assert how in text, how


@pytest.mark.parametrize("group", sorted(groups()))
def test_help_group_page_shows_every_option_key_with_its_comment(group):
    page = group_page(group).splitlines()
    for option in sorted((CONF_DIR / group).glob("*.yaml")):
        doc = read_yaml_doc(option)
        where = {None: group, "_global_": ""}.get(doc.package, doc.package)
        start = next(i for i, l in enumerate(page) if l in (option.stem, f"{option.stem}  (default)"))
        section = page[start : page.index("", start) if "" in page[start:] else None]
        for key, (value, comment) in inline_comments(option).items():
            dotted = f"{where}.{key}" if where else key
            line = next(l for l in section if l.strip().startswith(f"{dotted}="))
            assert line.strip().startswith(f"{dotted}={value} ") and comment in line, (option, line)


@pytest.mark.parametrize(
    "cli,args,out,said,exit_code",
    [
        ("gptlab.cli.train", ["--help"], "stdout", "usage:", None),
        ("gptlab.cli.train", ["attention=nope"], "stderr", "error: attention=nope: no such option; available: ", 2),
        ("gptlab.cli.flops", ["--help", "attention"], "stdout", "attention: pick with attention=OPTION", None),
        ("gptlab.cli.decode", ["--help", "attention"], "stdout", "attention: pick with attention=OPTION", None),
    ],
    ids=["help", "config-error", "flops-help", "decode-help"],
)
def test_help_and_config_errors_answer_without_importing_torch(tmp_path, cli, args, out, said, exit_code):
    """`gptlab-train --help` reads the YAML under conf/, and a bad choice is refused at composition: neither imports
    torch, nor does --help of gptlab-flops and gptlab-decode. On this 2-core machine (3 calls each) --help took
    2.19 s when gptlab.data imported torch for its annotations (now 0.33 s), and the error 2.3 s when the CLI
    imported the training loop for the class TrainingDiverged (now 0.5 s); gptlab-flops --help imported the
    schema (and torch) at the top."""
    code = (
        "import runpy, sys\n"
        f"sys.argv, code = ['{cli}', *{args!r}], None\n"
        f"try:\n    runpy.run_module('{cli}', run_name='__main__')\nexcept SystemExit as e:\n    code = e.code\n"
        "print('torch imported:', 'torch' in sys.modules, code, file=sys.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=train_env(), capture_output=True, text=True, timeout=120
    )
    assert said in getattr(proc, out), proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"torch imported: False {exit_code}", proc.stderr


def test_help_group_page_through_the_cli_and_its_packages(tmp_path):
    proc = run_cli("gptlab.cli.train", "--help", "attention", cwd=tmp_path, env=train_env(), timeout=120)
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("attention: pick with attention=OPTION (default: mha)")
    assert "mha  (default)" in lines and "gqa" in lines
    gqa = lines[lines.index("gqa") :]
    assert gqa[1].strip().startswith("Grouped-query attention")  # the file's header comment
    assert re.search(r"^\s+attention\.impl=sdpa\s+naive \| sdpa \| flash \| flex$", proc.stdout, re.M)
    assert "_target_" not in proc.stdout and "_partial_" not in proc.stdout
    launcher, logger, data = render("launcher"), render("logger"), render("data")
    assert re.search(r"hydra\.launcher\.mem_gb=null\s+Memory per node in GB", launcher)  # comment above the key
    assert "logger.wandb.mode=auto" in logger and "wandb  (default)" in logger  # `# @package logger.wandb`
    assert re.search(r"data\.name=null\s+hub dataset name", data)


def test_help_for_an_unknown_group_is_one_line(tmp_path):
    proc = run_cli("gptlab.cli.train", "--help", "nope", cwd=tmp_path, env=train_env(), timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"error: --help nope: no such config group or section; allowed: {', '.join(groups())}, train, sample "
        "(or --help alone)"
    ]


@pytest.mark.parametrize("cli", ["gptlab.cli.train", "gptlab.cli.flops", "gptlab.cli.decode"])
def test_every_key_value_cli_has_help_train_and_help_group(tmp_path, cli):
    """--help train (the run keys with their comments) and --help GROUP work alike on train, flops and decode."""
    train = run_cli(cli, "--help", "train", cwd=tmp_path, env=train_env(), timeout=120)
    assert train.returncode == 0, train.stderr
    doc = {e.key: e for e in read_yaml_doc(CONF_DIR / "train.yaml").entries}
    assert "train.batch_size=32" in train.stdout and doc["train.batch_size"].comment in train.stdout
    assert "train.max_steps=" in train.stdout and "model." not in train.stdout
    group = run_cli(cli, "--help", "attention", cwd=tmp_path, env=train_env(), timeout=120)
    assert group.returncode == 0 and group.stdout == group_page("attention") + "\n", group.stderr
    bad = run_cli(cli, "--help", "nope", cwd=tmp_path, env=train_env(), timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1 and "--help nope" in bad.stderr


def test_comment_reader(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text(
        "# @package logger.x\n# Header line one\n# line two\ndefaults:\n  - override /a: b\n"
        "_target_: a.B\nname: 'a # b'  # quoted hash stays in the value\n# above the key\n"
        "nested:\n  inner: [1, 2]   # inline\n                  # continued\n  plain: 3\nlist:\n  - 1\n"
    )
    doc = read_yaml_doc(path)
    assert doc.package == "logger.x" and doc.header == ["Header line one", "line two"]
    assert [(e.key, e.value, e.comment) for e in doc.entries] == [
        ("name", "'a # b'", "quoted hash stays in the value"),
        ("nested", "", "above the key"),
        ("nested.inner", "[1, 2]", "inline continued"),
        ("nested.plain", "3", ""),
    ]


# ---------------------------------------------------------------- shell completion
@pytest.mark.parametrize(
    "args",
    [
        ["--shell-completion"],
        ["-sc", "install=tcsh"],
        ["--shell-completion", "install=bash", "uninstall=bash"],
        ["-sc", "bash"],
    ],
)
def test_completion_misuse_is_one_line(tmp_path, args):
    proc = run_cli("gptlab.cli.train", *args, cwd=tmp_path, env=train_env(), timeout=120)
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("error: --shell-completion: got ") and "install=SHELL" in line
    assert "SHELL: bash, zsh, fish" in line and 'eval "$(gptlab-train --shell-completion install=bash)"' in line


def test_completion_install_and_query_work_for_gptlab_train(tmp_path):
    exe = str(BIN / "gptlab-train")
    install = subprocess.run([exe, "--shell-completion", "install=bash"], capture_output=True, text=True, timeout=120)
    assert (
        install.returncode == 0
        and "complete -o nospace -o default -F hydra_bash_completion gptlab-train" in install.stdout
    )
    line = "gptlab-train attention=g"
    env = dict(os.environ, COMP_LINE=line, COMP_POINT=str(len(line)))
    query = subprocess.run([exe, "-sc", "query=bash"], env=env, capture_output=True, text=True, timeout=120)
    assert query.returncode == 0 and query.stdout.split() == ["attention=gqa"]


# ---------------------------------------------------------------- progress lines
def _loop_rows(bar: ProgressSink, steps: int, every: int) -> None:
    """Rows in the loop's order: a train row at step s, then the eval row at s when s is an eval step."""
    bar.log({"val/loss": 5.0}, 0)
    for step in range(1, steps + 1):
        bar.log({"train/loss": 5.0 - step / 10, "perf/tokens_per_s": 1000.0}, step)
        if step % every == 0 or step == steps:
            bar.log({"val/loss": 5.0 - step / 8}, step)
    bar.close()


def test_piped_progress_prints_one_line_per_eval_step():
    out = io.StringIO()
    _loop_rows(ProgressSink(total_steps=6, stream=out, interval_s=0.0, eval_interval=3, clock=lambda: 0.0), 6, 3)
    lines = out.getvalue().splitlines()
    assert [int(l.split()[1].split("/")[0]) for l in lines] == [0, 1, 2, 3, 4, 5, 6]
    assert lines[3] == "step 3/6 | loss 4.7 | val 4.625 | 1,000 tok/s"
    assert lines[6].startswith("step 6/6 | loss 4.4 | val 4.25")
    out = io.StringIO()  # without the eval interval the last step is still one line
    _loop_rows(ProgressSink(total_steps=6, stream=out, interval_s=60.0, clock=lambda: 0.0), 6, 3)
    assert [l.split()[1] for l in out.getvalue().splitlines()] == ["0/6", "3/6", "6/6"]


def test_progress_lines_are_copied_to_the_console_log_only():
    records, out = [], io.StringIO()
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logger = logging.getLogger(CONSOLE_LOG)
    logger.addHandler(handler)
    try:
        _loop_rows(ProgressSink(total_steps=4, stream=out, interval_s=60.0, eval_interval=2, clock=lambda: 0.0), 4, 2)
    finally:
        logger.removeHandler(handler)
    assert records == out.getvalue().splitlines() and len(records) == 3
    assert logger.propagate is False  # never on the console a second time through the root logger


# ---------------------------------------------------------------- a real run: train.log and piped stderr
def test_train_log_holds_the_runs_lines_and_piped_stderr_one_line_per_eval(tmp_path):
    run = tmp_path / "run"
    proc = run_cli(
        "gptlab.cli.train",
        *FAST,
        "train.max_steps=6",
        "train.eval_interval=3",
        "attention=gqa",
        "attention.n_kv_head=4",
        f"hydra.run.dir={run}",
        cwd=tmp_path,
        env=train_env(),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    progress = [l for l in proc.stderr.splitlines() if l.startswith("step ")]
    assert [l.split()[1] for l in progress] == ["0/6", "3/6", "6/6"]
    log = (run / "train.log").read_text()
    assert (
        "[gptlab.train.run][WARNING] - no-op choice: attention=gqa with attention.n_kv_head=4 == model.n_head=4" in log
    )
    for line in progress:
        assert f"[gptlab.console][INFO] - {line}" in log
    assert "run finished: finished after 6 steps" in log and f"run dir        {run}" in log
    assert "gptlab.console" not in proc.stdout and proc.stdout.count("run finished:") == 1


# ---------------------------------------------------------------- gptlab-sweep
def _mini_sweep(tmp_path: Path) -> Path:
    path = tmp_path / "mini.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "description": "test",
                "seeds": [0],
                "overrides": [*FAST, "train.max_steps=2", "train.eval_interval=1"],
                "arms": {"base": ["mlp.ratio=2"]},
            }
        )
    )
    return path


@pytest.mark.slow  # over 2.5 s: make test-fast stays under ~3 min
def test_dry_run_prints_a_runnable_quoted_command_and_honours_hydra_sweep_dir(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out, sweep = tmp_path / "my sweeps", str(_mini_sweep(tmp_path))  # a space: the printed command must quote it
    assert sweep_main([sweep, "--dry-run", f"hydra.sweep.dir={out}"]) == 0
    printed = capsys.readouterr().out
    [line] = [l for l in printed.splitlines() if l.startswith("[mini] base__seed0: ")]
    command = line.split(": ", 1)[1]
    run = out / "base" / "seed0"
    assert f"'hydra.run.dir={run}'" in command  # quoted: the path has a space
    words = shlex.split(command)
    assert words[0] == "gptlab-train" and words.count(f"hydra.run.dir={run}") == 1
    assert "arm=base" in words and "sweep=mini" in words and "seed=0" in words
    assert f"[mini] sweep dir: {out}  (0 finished runs skipped)" in printed and not out.exists()
    env = dict(os.environ, OMP_NUM_THREADS="2", PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    ran = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert json.loads((run / "summary.json").read_text())["status"] == "finished"
    cfg = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
    assert (cfg["arm"], cfg["sweep"], cfg["seed"], cfg["mlp"]["ratio"]) == ("base", "mini", 0, 2)
    assert sweep_main([sweep, "--out", str(out)]) == 0  # --out means the same dir: the finished run is skipped
    assert "[mini] all 1 runs finished, nothing to launch" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["hydra.sweep.dir=a", "--out", "b"],
            "error: hydra.sweep.dir=a and --out b name two different sweep dirs; give one of them (they mean the same)",
        ),
        (
            ["hydra.sweep.subdir=x"],
            "error: hydra.sweep.subdir=x: gptlab-sweep puts each run in <sweep dir>/<arm>/seed<k>",
        ),
        (
            ["+hydra.sweep.dir=out/${now:%H}"],
            "error: hydra.sweep.dir=out/${now:%H}: gptlab-sweep needs the sweep dir "
            "before Hydra runs, so no interpolation",
        ),
    ],
)
def test_sweep_refuses_what_it_cannot_honour_in_one_line(tmp_path, capsys, monkeypatch, extra, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        sweep_main([str(_mini_sweep(tmp_path)), "--dry-run", *extra])
    assert stop.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(message)


def test_take_sweep_dir():
    assert take_sweep_dir(None, ["a=1", "hydra.sweep.dir=x", "b=2"]) == (Path("x"), ["a=1", "b=2"])
    assert take_sweep_dir(Path("x"), ["++hydra.sweep.dir=x"]) == (Path("x"), [])  # the same dir twice is fine
    assert take_sweep_dir(Path("y"), ["hydra.run.dir=z"]) == (Path("y"), ["hydra.run.dir=z"])
    with pytest.raises(ConfigError, match="--out"):
        take_sweep_dir(None, ["hydra.sweep.subdir=${seed}"])
