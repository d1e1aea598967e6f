"""gptlab-compare <-> W&B: offline fallback without a key, linked run ids, table and native charts read back from
the offline run, and the saved workspace view's spec (panels, x-axes, grouping, filter) — never the network."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from gptlab.cli.compare import main
from gptlab.compare.reading.runs import load_run, wandb_identity
from gptlab.compare.render import wandb_log, workspace
from gptlab.util.extras import missing
from helpers.compare import default_loss, write_run, write_sweep
from helpers.wandb_read import inspect_records, inspect_summary, of_type

ARMS = {"mha": 1000.0, "gqa": 1250.0, "mqa": 1400.0}  # attention choice -> tokens/s of seed 0

# gptlab[workspaces] (wandb-workspaces needs wandb >= 0.28.2): absent from the floor-version venv of make test-floor;
# its absence is refused in one line (test_extras.py)
NEEDS_WORKSPACES = pytest.mark.skipif(missing("wandb_workspaces"), reason="gptlab[workspaces] is not installed")


@pytest.fixture
def no_key(tmp_path, monkeypatch):
    """No W&B API key anywhere (env, ~/.netrc, $NETRC) and WANDB_MODE unset: mode auto must mean offline."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("NETRC", str(home / ".netrc"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)


def _sweep(tmp_path: Path, second_choice: dict | None = None) -> Path:
    """mha / gqa / mqa x 2 seeds; even jobs record summary["wandb"], odd ones only the id file + logger config."""
    specs = [
        dict(
            seed=s,
            choices={"attention": a, **(second_choice or {})},
            tokens_per_s=tps + 100 * s,
            peak_mem_bytes=(64 + 8 * s) * 2**20,
            loss_at=lambda st, s=s: default_loss(st) + 0.02 * s,
        )
        for a, tps in ARMS.items()
        for s in range(2)
    ]
    sweep = write_sweep(tmp_path / "sweeps" / "attn", specs)
    for job in range(len(specs)):
        run = sweep / str(job)
        if job % 2 == 0:
            summary = json.loads((run / "summary.json").read_text())
            summary["wandb"] = {
                "id": f"sum{job}",
                "project": "abl",
                "entity": None,
                "group": "attn",
                "mode": "offline",
                "folders": [f"{run}/wandb/offline-run-1-sum{job}"],
            }
            (run / "summary.json").write_text(json.dumps(summary))
        else:
            (run / "wandb_run_id").write_text(f"idf{job}\n")
            cfg = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
            cfg["logger"] = {"wandb": {"project": "abl", "entity": None, "group": "attn"}}
            (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    return sweep


def _run(args: list, capsys) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _table(folder: Path, summary: dict, key: str) -> dict:
    """A logged wandb.Table read back from the offline run's files."""
    return json.loads((folder / "files" / summary[key]["path"]).read_text())


def _merged(records: list[dict], kind: str) -> dict:
    """All `update` payloads of one record type merged in log order (config, summary)."""
    merged: dict = {}
    for rec in of_type(records, kind):
        merged.update(rec.get("update", {}))
    return merged


def test_wandb_without_key_logs_offline_links_runs_and_native_charts(tmp_path, capsys, no_key):
    sweep = _sweep(tmp_path)
    rc, out, err = _run([sweep, "--out", tmp_path / "out", "--wandb"], capsys)
    assert rc == 0, err
    # the fixture's seeds differ in peak memory on purpose (its W&B table is checked below): that flag and the note
    # that its runs are not timed, nothing else
    said = [line for line in err.splitlines() if "peak memory varies" not in line]
    assert len(said) == 1 and said[0].startswith("note: speed not timed: no timing session covers the baseline"), err
    folder = Path(re.search(r"upload later with: wandb sync (\S+)", out).group(1))
    folders = " ".join(f"{sweep}/{j}/wandb/offline-run-1-sum{j}" for j in (0, 2, 4))  # as summary.json lists them
    assert f"W&B: 3 offline folders of the compared runs; upload them with: wandb sync {folders}\n" in out
    assert folder.parent == tmp_path / "out" / "wandb" and folder.name.startswith("offline-run-")
    records = inspect_records(folder)
    run = of_type(records, "run")[0]
    assert (run["job_type"], run["run_group"], run["project"]) == ("comparison", "attn", "abl")

    config = {**run["config"]["update"], **_merged(records, "config")}  # init config, then chart specs
    labels = ["attention=mha", "attention=gqa, attention.n_kv_head=2", "attention=mqa, attention.n_kv_head=1"]
    assert config["labels"] == labels and config["step"] == 100 and config["sweep"] == "attn"
    assert config["runs"] == [
        {
            "path": str((sweep / str(j)).resolve()),
            "wandb_id": f"sum{j}" if j % 2 == 0 else f"idf{j}",
            "project": "abl",
            "entity": None,
            "group": "attn",
            "label": labels[j // 2],
        }
        for j in range(6)
    ]
    charts = {
        k.split("_wandb.visualize.", 1)[1]: v["panel_config"]["panelDefId"]
        for k, v in config.items()
        if k.startswith("_wandb.visualize.")
    }
    assert charts == {
        "charts/val_loss_vs_step": "wandb/lineseries/v0",
        **{f"charts/{m}": "wandb/bar/v0" for m in ("tokens_per_s", "mfu", "peak_mem_bytes")},
        **{f"charts/{m}_error_bars": "wandb/lineseries/v0" for m in ("tokens_per_s", "mfu", "peak_mem_bytes")},
    }

    summary = inspect_summary(folder)
    assert summary["comparison"]["nrows"] == 3 and summary["n_groups"] == 3 and summary["n_runs"] == 6
    assert [row[0] for row in _table(folder, summary, "comparison")["data"]] == labels
    assert summary["plots/val_loss_vs_step"]["_type"] == "image-file"

    # val/loss vs step: mean, min and max line per group at the 4 eval steps; the band spans the 2 seeds
    curves = _table(folder, summary, "charts/val_loss_vs_step_table")
    assert curves["columns"] == ["step", "lineKey", "lineVal"] and len(curves["data"]) == 3 * 3 * 4
    at_100 = {key: val for step, key, val in curves["data"] if step == 100}
    gqa = "attention=gqa, attention.n_kv_head=2"
    assert at_100[f"{gqa} mean"] == pytest.approx(default_loss(100) + 0.01)
    assert at_100[f"{gqa} max"] - at_100[f"{gqa} min"] == pytest.approx(0.02)

    # bars: label / mean / std / min / max / n over seeds, and the error bars as mean ± std segments
    bars = _table(folder, summary, "charts/tokens_per_s_table")
    assert bars["columns"] == wandb_log.STAT_COLUMNS
    gqa = bars["data"][1]
    assert gqa[0] == "attention=gqa, attention.n_kv_head=2" and gqa[1:4] == pytest.approx(
        [1300.0, statistics.stdev([1250, 1350]), 1250.0]
    )
    assert gqa[4:] == [1350.0, 2]
    errs = _table(folder, summary, "charts/tokens_per_s_error_bars_table")["data"]
    key = "2: attention=gqa, attention.n_kv_head=2"
    assert [row for row in errs if row[1] == key] == [
        [2, key, pytest.approx(1300 - 70.7107, abs=1e-3)],
        [2, key, pytest.approx(1300 + 70.7107, abs=1e-3)],
    ]
    mem = _table(folder, summary, "charts/peak_mem_bytes_table")["data"]
    assert [r[3:5] for r in mem] == [[64 * 2**20, 72 * 2**20]] * 3


def test_run_identity_prefers_summary_then_id_file_and_reads_both_logger_layouts(tmp_path):
    new = write_run(tmp_path / "new")
    summary = json.loads((new / "summary.json").read_text())
    summary["wandb"] = {"id": "fromsummary", "project": "p1", "entity": "team", "group": "g1"}
    (new / "summary.json").write_text(json.dumps(summary))
    (new / "wandb_run_id").write_text("fromfile\n")
    assert wandb_identity(load_run(new)) == {"id": "fromsummary", "project": "p1", "entity": "team", "group": "g1"}

    old = write_run(tmp_path / "old", leaves={"logger.project": "p-old", "logger.group": "${sweep}"})
    (old / "wandb_run_id").write_text("abc123\n")
    assert wandb_identity(load_run(old)) == {"id": "abc123", "project": "p-old", "entity": None, "group": None}

    moved = write_run(tmp_path / "moved", leaves={"logger.wandb.project": "p-new", "logger.wandb.entity": "me"})
    (moved / "wandb_run_id").write_text("Not A Valid Id!\n")
    assert wandb_identity(load_run(moved)) == {"id": None, "project": "p-new", "entity": "me", "group": None}


def test_wanted_and_mode_flags(tmp_path, capsys, monkeypatch, no_key):
    assert wandb_log.wanted(None) is False and wandb_log.wanted(True) is True
    assert wandb_log.wanted(None, "offline") is True and wandb_log.wanted(True, "disabled") is False
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert wandb_log.wanted(None) is True and wandb_log.wanted(False) is False
    monkeypatch.delenv("WANDB_MODE")

    sweep = _sweep(tmp_path)
    rc, _, err = _run([sweep, "--out", tmp_path / "online", "--wandb-mode", "online"], capsys)
    assert rc == 2 and not (tmp_path / "online").exists()
    assert err.strip().splitlines() == [
        "gptlab-compare: error: --wandb-mode online needs a W&B API key (set WANDB_API_KEY or run `wandb login`); "
        "allowed without one: auto, offline, disabled"
    ]
    rc, out, err = _run([sweep, "--out", tmp_path / "off", "--wandb", "--wandb-mode", "disabled"], capsys)
    assert rc == 0 and "W&B:" not in out and not (tmp_path / "off" / "wandb").exists()
    with pytest.raises(SystemExit) as bad:
        main([str(sweep), "--wandb-mode", "cloud"])
    assert bad.value.code == 2 and "--wandb-mode: invalid choice: 'cloud'" in capsys.readouterr().err


def test_online_start_failure_falls_back_offline_with_one_warning(tmp_path, capsys, monkeypatch, no_key):
    import wandb

    real_init = wandb.init

    def online_unreachable(**kwargs):
        if kwargs.get("mode") == "online":
            raise RuntimeError("api unreachable")
        return real_init(**kwargs)

    monkeypatch.setattr(wandb, "init", online_unreachable)
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)  # auto -> online, which fails without touching the network
    rc, out, err = _run([_sweep(tmp_path), "--out", tmp_path / "out", "--wandb"], capsys)
    assert rc == 0
    said = [line for line in err.strip().splitlines() if "peak memory varies" not in line]
    assert said[0].startswith("note: speed not timed") and said[1:] == [
        "warning: W&B online start failed (api unreachable); logging offline instead"
    ]
    assert re.search(r"upload later with: wandb sync \S+offline-run-", out)


def _spec_panels(spec: dict) -> dict[str, list[tuple]]:
    """section name -> [(title, x-axis, metrics, groupBy, groupArea)] from the stored view."""
    sections = spec["spec"]["section"]["panelBankConfig"]["sections"]
    return {
        s["name"]: [
            (
                p["config"]["chartTitle"],
                p["config"]["xAxis"],
                p["config"]["metrics"],
                p["config"].get("groupBy"),
                p["config"]["groupArea"],
            )
            for p in s["panels"]
        ]
        for s in sections
    }


@NEEDS_WORKSPACES
def test_workspace_spec_offline_panels_axes_grouping_and_filter(tmp_path, capsys, no_key):
    sweep = _sweep(tmp_path, second_choice=None)
    swiglu = write_run(
        sweep / "6",
        seed=0,
        choices={"attention": "mha", "mlp": "swiglu"},
        leaves={"logger.wandb.project": "abl", "logger.wandb.group": "attn"},
    )
    (swiglu / "wandb_run_id").write_text("idf6\n")
    rc, out, err = _run([sweep, "--out", tmp_path / "out", "--workspace"], capsys)
    assert rc == 0 and "warning: W&B" not in err, err
    path = tmp_path / "out" / "workspace.json"
    assert f"-m gptlab.compare.render.workspace push {path}" in out
    spec = json.loads(path.read_text())
    assert (spec["entity"], spec["project"], spec["displayName"]) == ("", "abl", "gptlab sweep attn")

    panels = _spec_panels(spec)
    assert list(panels) == ["val/loss by choice/attention", "val/loss by choice/mlp", "speed and memory"]
    for choice in ("attention", "mlp"):
        assert panels[f"val/loss by choice/{choice}"] == [
            (f"val/loss vs {t} by choice/{choice}", x, ["val/loss"], f"choice/{choice}.value", "minmax")
            for x, t in (
                ("step", "step"),
                ("tokens", "tokens"),
                ("train_s", "training time (s)"),
                ("wall_s", "wall time (s)"),
            )
        ]
    # two choices vary: speed follows the run set's nested grouping (one line per attention x mlp combination)
    assert [(p[1], p[2], p[3], p[4]) for p in panels["speed and memory"]] == [
        ("step", [m], None, "stddev") for m in ("perf/tokens_per_s", "perf/mfu", "mem/peak_bytes")
    ]
    runset = spec["spec"]["section"]["runSets"][0]
    assert [(f["key"]["name"], f["op"], f["value"]) for f in runset["filters"]["filters"]] == [
        ("group", "=", "attn"),
        ("jobType", "!=", "comparison"),
    ]
    assert [g["name"] for g in runset["grouping"]] == ["choice/attention.value", "choice/mlp.value"]
    assert spec["spec"]["section"]["settings"]["xAxis"] == "step"
    assert spec["spec"]["section"]["settings"]["maxRuns"] == 10  # 7 runs fit the default

    back = workspace.from_spec(spec)  # what `push` saves
    assert [s.name for s in back.sections] == list(panels)
    assert back.runset_settings.filters == "Metric(\"Group\") == 'attn' and Metric(\"JobType\") != 'comparison'"


@NEEDS_WORKSPACES
def test_workspace_groups_by_the_varying_config_value_when_no_choice_varies(tmp_path):
    runs = [
        load_run(write_run(tmp_path / f"r{i}", seed=i % 2, leaves={"optimizer.lr": 10.0 ** -(2 + i // 2)}))
        for i in range(4)
    ]
    assert workspace.varying_choices(runs) == [] and workspace.group_keys(runs) == ["optimizer.lr"]
    panels = _spec_panels(workspace.to_spec(workspace.build_workspace(runs, "lr", "gptlab", "team")))
    assert list(panels) == ["val/loss by optimizer.lr", "speed and memory"]
    assert {p[3] for ps in panels.values() for p in ps} == {"optimizer.lr.value"}  # W&B's path of a flat dotted key
    same = [load_run(write_run(tmp_path / f"s{i}", seed=i)) for i in range(2)]  # seeds only: group by the arm
    assert workspace.group_keys(same) == ["arm"]


@NEEDS_WORKSPACES
def test_workspace_online_is_saved_and_push_needs_a_key(tmp_path, capsys, monkeypatch, no_key):
    import wandb_workspaces.workspaces as ws

    sweep = _sweep(tmp_path)
    (tmp_path / "off").mkdir()
    workspace.publish([load_run(sweep / str(j)) for j in range(6)], tmp_path / "off", "auto")
    assert workspace.main(["push", str(tmp_path / "off" / "workspace.json")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: pushing a workspace needs a W&B API key (set WANDB_API_KEY or run `wandb login`)"
    ]

    import wandb

    saved = []  # Workspace.save and the default-entity lookup are the only calls that would reach W&B
    monkeypatch.setattr(ws.Workspace, "save", lambda self: saved.append(self) or SimpleNamespace(url="VIEW-URL"))
    monkeypatch.setattr(wandb, "Api", lambda: SimpleNamespace(default_entity="me"))
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert workspace.main(["push", str(tmp_path / "off" / "workspace.json"), "--entity", "team-a"]) == 0
    assert capsys.readouterr().out.strip() == "VIEW-URL"
    assert (saved[-1].entity, saved[-1].project, len(saved[-1].sections)) == ("team-a", "abl", 2)

    rc, out, _ = _run([sweep, "--out", tmp_path / "on", "--workspace", "--wandb-mode", "online", "--no-wandb"], capsys)
    assert rc == 0 and "W&B workspace: saved VIEW-URL" in out and "push" not in out
    assert saved[-1].entity == "me"  # no entity recorded by the runs: the key's default entity
