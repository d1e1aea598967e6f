"""Weights & Biases sink: offline unless a key is configured, one W&B run per run directory (resume-safe)."""

from __future__ import annotations

import logging
import netrc
import os
import re
import secrets
import shlex
import shutil
import string
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlparse

from gptlab.errors import ConfigError
from gptlab.util.checks import Text, rule
from gptlab.util.io import atomic_write_text

log = logging.getLogger("gptlab.sinks")

MODES = ("auto", "online", "offline", "disabled")
RUN_ID_FILE = "wandb_run_id"
LAST_STEP_FILE = "wandb/gptlab_last_step"  # the highest step this run logged to W&B (a resume does not log it again)
_ID_CHARS = string.ascii_lowercase + string.digits
_ID_RE = re.compile(r"^[a-z0-9_-]{1,64}$")
_DEFAULT_BASE_URL = "https://api.wandb.ai"
# flops: cumulative training FLOPs (loss against compute); train_s: seconds in training steps alone (no evals)
X_AXES = ("step", "tokens", "wall_s", "train_s", "flops")
RUN_FILES = ("provenance.json", ".hydra/*.yaml", "git*.diff")
DEFAULT_PROJECT = "gptlab"  # logger.wandb.project=null and no WANDB_PROJECT


def _netrc_paths(env: Mapping[str, str]) -> list[Path]:
    """Where W&B looks for credentials: $NETRC, else ~/.netrc and ~/_netrc."""
    if env.get("NETRC"):
        return [Path(env["NETRC"]).expanduser()]
    home = Path(env.get("HOME") or Path.home())
    return [home / ".netrc", home / "_netrc"]


def api_key_configured(environ: Mapping[str, str] | None = None) -> bool:
    """True when W&B can authenticate without a prompt: WANDB_API_KEY, identity token or netrc entry."""
    env = os.environ if environ is None else environ
    if env.get("WANDB_API_KEY") or env.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlparse(env.get("WANDB_BASE_URL") or _DEFAULT_BASE_URL).hostname or ""
    for path in _netrc_paths(env):
        if not path.is_file():
            continue
        try:
            entry = netrc.netrc(str(path)).authenticators(host)
        except (netrc.NetrcParseError, OSError):
            continue  # an unreadable netrc is the same as none
        if entry and entry[2]:
            return True
    return False


def resolve_mode(mode: str, environ: Mapping[str, str] | None = None) -> str:
    """The W&B mode to use: auto -> online with a key, else offline; WANDB_MODE=offline|disabled beats auto."""
    env = os.environ if environ is None else environ
    if mode not in MODES:
        raise ConfigError(f"logger.wandb.mode={mode!r} is not valid; allowed: {', '.join(MODES)}")
    if mode == "auto":
        forced = (env.get("WANDB_MODE") or "").strip().lower()
        if forced in ("offline", "dryrun", "disabled"):
            return "offline" if forced == "dryrun" else forced
        return "online" if api_key_configured(env) else "offline"
    if mode == "online" and not api_key_configured(env):
        raise ConfigError(
            "logger.wandb.mode=online but no W&B API key is configured (set WANDB_API_KEY or run `wandb login`); "
            "use logger.wandb.mode=auto or logger.wandb.mode=offline to log locally"
        )
    return mode


def run_id_for(run_dir: Path) -> str:
    """The W&B run id stored in run_dir/wandb_run_id, created (atomically) on first use."""
    path = run_dir / RUN_ID_FILE
    if path.is_file():
        stored = path.read_text(encoding="utf-8").strip()
        if _ID_RE.match(stored):
            return stored
        log.warning("ignoring malformed W&B run id %r in %s; starting a new W&B run", stored[:80], path)
    run_id = "".join(secrets.choice(_ID_CHARS) for _ in range(8))
    atomic_write_text(path, run_id + "\n")
    return run_id


def _last_step(path: Path) -> int:
    """The step in LAST_STEP_FILE; -1 when absent or unreadable (every row is then logged)."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return -1


def offline_folders(wandb_dir: Path, run_id: str) -> list[Path]:
    """The offline folders of W&B run `run_id` under `wandb_dir`, in start order: `offline-run-<time>-<id>`, and
    `...-<id>-<n>` for a start in the same second as an earlier one (W&B numbers those rather than reuse a folder)."""
    name = re.compile(rf"^offline-run-(\d{{8}}_\d{{6}})-{re.escape(run_id)}(?:-(\d+))?$")
    found = [
        (m.group(1), int(m.group(2) or 0), p) for p in wandb_dir.glob("offline-run-*") if (m := name.match(p.name))
    ]
    return [p for *_, p in sorted(found)]


def _clean_tags(tags: Iterable[Any] | None) -> list[str]:
    """Tags as unique strings of at most 64 characters (the W&B limit), order kept."""
    out: list[str] = []
    for tag in tags or ():
        text = str(tag)[:64]
        if text and text not in out:
            out.append(text)
    return out


def _scalar(value: Any) -> Any:
    """Tensors and numpy scalars as Python numbers (W&B keeps NaN/inf as they are)."""
    return value.item() if hasattr(value, "item") and callable(value.item) else value


class WandbSink:
    """Logs rows, the resolved config, group, tags and summary to one W&B run stored under run_dir.

    A resumed WandbSink (resumed=True) on the same run_dir reuses the id in run_dir/wandb_run_id (resume="allow"),
    so a resumed or requeued job continues the same W&B run. W&B cannot take rows back (an offline start writes a
    folder of its own, and `wandb sync` replays them all), so the steps the last attempt logged after its checkpoint
    are not logged again when the resume redoes them: the highest step logged is kept in LAST_STEP_FILE, and the
    W&B run holds each step once (the first attempt's row; metrics.jsonl holds the redone one). A fresh start in a dir that holds an id (an attempt
    killed before its first checkpoint: its metrics.jsonl is started afresh too) opens a new W&B run, so the old
    attempt's rows never mix into the new run's history or its `wandb sync` command. If W&B cannot start, an online run
    falls back to offline and an offline one to no W&B at all, each with one warning: the local files
    (JsonlSink) are the source of truth and training never stops for W&B.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        config: Mapping[str, Any] | None = None,
        project: str | None = None,
        group: Annotated[str | None, rule(check=Text(null=True, numbers=True))] = None,  # a number names a group too
        name: str | None = None,
        tags: Annotated[Iterable[Any] | None, rule(check=Text(many=True))] = (),
        mode: str = "auto",
        entity: str | None = None,
        job_type: str = "train",
        log_checkpoints: bool = False,
        resumed: bool = False,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.mode = resolve_mode(mode)
        # as wandb.init: a key set explicitly beats WANDB_PROJECT / WANDB_ENTITY, which beat gptlab's own default
        project = project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT
        entity = entity or os.environ.get("WANDB_ENTITY") or None
        self.project, self.entity, self.group, self.tags = project, entity, group, _clean_tags(tags)
        self.sweep_id: str | None = None  # a `wandb agent` sweep's id, when W&B ran this as one of its runs
        self.log_checkpoints = bool(log_checkpoints)
        self.run: Any = None
        self.run_id: str | None = None
        self.run_dir_path: Path | None = None  # the local W&B run folder (what `wandb sync` takes)
        if self.mode == "disabled":
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logged_through = -1  # on a resume: the highest step W&B already holds, not logged again
        if not resumed:
            (self.run_dir / RUN_ID_FILE).unlink(missing_ok=True)
            (self.run_dir / LAST_STEP_FILE).unlink(missing_ok=True)
        else:
            self.logged_through = _last_step(self.run_dir / LAST_STEP_FILE)
        self.run_id = run_id_for(self.run_dir)
        init_args = dict(
            project=project,
            entity=entity,
            group=group,
            name=name,
            tags=self.tags,
            job_type=job_type,
            config=dict(config or {}),
        )
        self.run = self._start(init_args)
        if self.run is not None:
            self._adopt(self.run)
            self.run_dir_path = Path(self.run.settings.sync_dir)
            self._guarded(self._save_run_files)

    def _adopt(self, run: Any) -> None:
        """Record what W&B actually used: under a `wandb agent` it picks the run id and project itself (the agent's
        WANDB_RUN_ID / WANDB_PROJECT beat init's arguments); the id is kept for a resume, summary.json says the rest."""
        actual = str(getattr(run, "id", "") or "")
        if _ID_RE.match(actual) and actual != self.run_id:
            log.info(
                "W&B chose run id %s (a wandb agent's run), not %s; recorded in %s", actual, self.run_id, RUN_ID_FILE
            )
            atomic_write_text(self.run_dir / RUN_ID_FILE, actual + "\n")
            self.run_id = actual
        self.project = str(getattr(run, "project", "") or self.project)
        self.entity = str(getattr(run, "entity", "") or "") or self.entity
        self.group = str(getattr(run, "group", "") or "") or self.group
        self.tags = [str(t) for t in getattr(run, "tags", None) or ()] or self.tags
        self.sweep_id = str(getattr(run, "sweep_id", "") or "") or None

    def _init(self, mode: str, init_args: dict) -> Any:
        """One wandb.init call in `mode`, quiet, with curves plotted against our optimizer step."""
        import wandb  # heavy import, only when W&B logging is configured

        if "WANDB_MODE" in os.environ and not os.environ["WANDB_MODE"].strip():
            del os.environ["WANDB_MODE"]  # set but empty = unset (resolve_mode read it so); wandb's Settings refuse ""
        run = wandb.init(
            dir=str(self.run_dir),
            mode=mode,  # type: ignore[arg-type]  # resolve_mode's value: one of wandb's literals
            id=self.run_id,
            resume="allow",
            reinit="create_new",
            settings=wandb.Settings(silent=True),
            **init_args,
        )
        for axis in X_AXES:  # every row carries them, so any panel can switch its x-axis
            run.define_metric(axis)
        run.define_metric("*", step_metric="step")
        return run

    def _save_run_files(self) -> None:
        """Attach what says how the run was made: provenance.json, the Hydra configs and the code diff."""
        files = Path(self.run.dir)  # copied in (wandb.save of an outside file symlinks it and warns each time)
        for pattern in RUN_FILES:
            for path in sorted(self.run_dir.glob(pattern)):
                copy = files / path.relative_to(self.run_dir)
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, copy)
                self.run.save(str(copy), base_path=str(files), policy="now")

    def _start(self, init_args: dict) -> Any:
        """Start the run; online failure -> offline, offline failure -> no W&B (one warning each)."""
        try:
            return self._init(self.mode, init_args)
        except ConfigError:
            raise
        except Exception as exc:
            reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            if self.mode != "online":
                log.warning("W&B disabled: offline run failed to start (%s); local metrics still written", reason)
                self.mode = "disabled"
                return None
            log.warning("W&B online start failed (%s); logging offline instead (`wandb sync` later)", reason)
        self.mode = "offline"
        return self._start(init_args)

    def offline_folders(self) -> list[Path]:
        """Every offline folder of this W&B run in start order (a resumed run writes one per start)."""
        return [] if self.run_id is None else offline_folders(self.run_dir / "wandb", self.run_id)

    @property
    def sync_command(self) -> str | None:
        """`wandb sync <folder>...` naming every offline folder of the run in order (wandb syncs them in turn)."""
        if self.mode != "offline" or self.run_dir_path is None:
            return None
        return "wandb sync " + " ".join(shlex.quote(str(f)) for f in self.offline_folders() or [self.run_dir_path])

    def where(self) -> dict:
        """The W&B run's identity for summary.json: what gptlab-compare links to."""
        return {
            "id": self.run_id,
            "project": self.project,
            "entity": self.entity,
            "group": self.group,
            "tags": list(self.tags),
            **({"sweep_id": self.sweep_id} if self.sweep_id else {}),
            "mode": self.mode,
            "folders": [str(f) for f in self.offline_folders()] if self.mode == "offline" else [],
        }

    def _guarded(self, call, *args) -> None:
        """Run a W&B call; if the W&B backend broke (its wandb-core process died, ...), let go of it and re-raise."""
        try:
            call(*args)
        except Exception:
            self._abandon()
            raise  # SafeSink warns once and stops calling this sink

    def _abandon(self) -> None:
        """Drop the run and tear the dead W&B service down now, so exiting prints no traceback from its atexit hook."""
        self.run = None
        import wandb

        try:
            wandb.teardown()
        except (Exception, SystemExit):  # the service is already gone; nothing left to flush
            pass

    def truncate_after(self, step: int) -> None:
        """A resume from checkpoint `step` (-1: a fresh start): the steps after it that W&B already holds are not
        logged again."""
        if self.logged_through > step >= 0:
            log.info(
                "W&B already holds steps %d-%d from the last attempt; the resume's rows for them go to the local "
                "files only",
                step + 1,
                self.logged_through,
            )
        else:
            self.logged_through = -1

    def log(self, metrics: dict[str, float], step: int) -> None:
        """One W&B history row; the `step` key is the x-axis of every curve."""
        if self.run is None or step <= self.logged_through:
            return
        row = {k: _scalar(v) for k, v in metrics.items()}
        row["step"] = int(step)
        self._guarded(self.run.log, row)
        (self.run_dir / LAST_STEP_FILE).write_text(f"{int(step)}\n")  # small, and no fsync: a torn one reads -1

    def _log_checkpoint(self) -> None:
        """Upload the final checkpoint as a model artifact (aliases latest and step<N>)."""
        import wandb

        from gptlab.state.checkpoint import latest_path

        path = latest_path(self.run_dir)
        if path is None:
            return
        step = int(path.stem.split("_")[-1]) if path.stem.split("_")[-1].isdigit() else None
        artifact = wandb.Artifact(f"checkpoint-{self.run_id}", type="model", metadata={"step": step})
        (artifact.add_dir if path.is_dir() else artifact.add_file)(str(path))  # a DCP dir (fsdp) or one file
        self.run.log_artifact(artifact, aliases=["latest", *([f"step{step}"] if step is not None else [])])

    def summary(self, values: dict) -> None:
        """Merge end-of-run values into run.summary."""
        if self.run is None:
            return
        self._guarded(self.run.summary.update, {k: _scalar(v) for k, v in values.items()})

    def close(self, status: str = "finished") -> None:
        """Finish the W&B run: exit code 0 when finished or pruned (a tune pruner stopped it on purpose: its summary
        says "pruned"), 1 otherwise (preempted runs are marked so)."""
        run = self.run
        if run is None:
            return
        if status == "preempted":
            self._guarded(run.mark_preempting)
        if self.log_checkpoints and status == "finished":
            self._guarded(self._log_checkpoint)
        self._guarded(lambda: run.finish(exit_code=0 if status in ("finished", "pruned") else 1))
        self.run = None
