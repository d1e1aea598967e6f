"""A sweep's definition: its file in sweeps/ loaded and checked, the command line's additions (extra overrides,
seeds, an lr grid, a ladder, an A/A, the shared FLOPs grid) merged in and checked, and the result recorded as the
sweep dir's sweep.yaml. A relaunch into the dir grows the recorded sweep in place by added arms, seeds and lrs, on the
FLOPs grid its first launch recorded (gptlab/sweep/equal_flops.py).

A sweep file lists `arms` (name -> overrides), `seeds`, and shared `overrides` (or `factors:`, whose 2^k arms are
generated: gptlab/sweep/design.py). Every refusal is one line naming the file, key or override, before anything runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from gptlab.errors import ConfigError
from gptlab.sweep.aa import aa_spec, parse_aa
from gptlab.sweep.design import Rung, factorial_arms, ladder_conflicts, parse_ladder, rungs
from gptlab.sweep.equal_flops import KEY as FLOPS_KEY
from gptlab.sweep.equal_flops import RECORD_KEY, parse_mode, recorded, settle
from gptlab.sweep.equal_flops import override as grid_override
from gptlab.sweep.identity import ladder_errors
from gptlab.sweep.layout import SWEEP_FILE, is_arm_name, parse_lr_grid, read_sweep
from gptlab.sweep.plan import COMMANDS, is_launch_setting, planned_overrides
from gptlab.util.io import atomic_write_text
from gptlab.util.paths import SWEEPS_DIR

SPEC_KEYS = (
    "description",
    "seeds",
    "overrides",
    "arms",
    "command",
    "lr_grid",
    "ladder",
    "factors",
    "aa",
    "equal_flops",
)
HYDRA_DIR = re.compile(r"^\+{0,2}hydra\.sweep\.(dir|subdir)=(.*)$")

# keys gptlab-sweep sets for each run itself (an extra override of one would be silently replaced): why, what to do
PER_RUN = {
    "seed": "from the sweep file's seeds; use --seeds N,M",
    "sweep": "to the sweep's name; choose where it goes with --out DIR",
    "arm": "to the arm's name in the sweep file",
    "hydra.run.dir": "to <sweep dir>/<arm>/seed<k>; choose the sweep dir with --out DIR",
}


def load_sweep(name: str) -> tuple[str, dict, Path]:
    """(name, definition, file) for a sweep name in sweeps/ or a path to a sweep YAML."""
    path = Path(name) if name.endswith((".yaml", ".yml")) else SWEEPS_DIR / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml")))
        raise ConfigError(f"sweep '{name}': no such sweep file; available: {known}")
    try:
        spec = yaml.load(path.read_text(), Loader=_UniqueKeys) or {}  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(err).split())[:200]})") from None
    except ConfigError as err:  # a key given twice: name the file
        raise ConfigError(f"{path}: {err}") from None
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: a sweep file is a mapping with 'arms' (and optional 'seeds', 'overrides')")
    if "factors" in spec:  # a 2^k factorial: the arms are generated (gptlab/sweep/design.py)
        if "arms" in spec:
            raise ConfigError(f"{path}: give 'factors' (the 2^k arms are generated from them) or 'arms', not both")
        try:
            spec["arms"] = factorial_arms(spec["factors"])
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from None
    if not isinstance(spec.get("arms"), dict) or not spec["arms"]:
        raise ConfigError(f"{path}: 'arms' must map arm names to lists of overrides")
    _check_spec(path, spec)
    if spec.get("command", "train") not in COMMANDS:
        raise ConfigError(f"{path}: command: {spec['command']!r} is not allowed; allowed: {', '.join(COMMANDS)}")
    spec.setdefault("seeds", [0])
    spec.setdefault("overrides", [])
    return path.stem, spec, path


class _UniqueKeys(yaml.SafeLoader):
    """A YAML loader that refuses a key given twice in one mapping (PyYAML keeps the last without a word)."""


def _no_duplicates(loader, node, deep=False):
    keys = [loader.construct_object(k, deep=deep) for k, _ in node.value]
    twice = sorted({str(k) for k in keys if keys.count(k) > 1})
    if twice:
        raise ConfigError(f"key '{twice[0]}' is given twice in one mapping (line {node.start_mark.line + 1})")
    return loader.construct_mapping(node, deep=deep)


_UniqueKeys.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def _check_spec(path: Path, spec: dict) -> None:
    """A sweep file's keys, arm names, seeds and override lists, before anything runs (one line per refusal)."""
    unknown = sorted(str(k) for k in spec if k not in SPEC_KEYS)
    if unknown:
        raise ConfigError(f"{path}: '{unknown[0]}' is not a sweep file key; allowed: {', '.join(SPEC_KEYS)}")
    for arm, overrides in (spec.get("arms") or {}).items():
        if not isinstance(arm, str) or not is_arm_name(arm):
            raise ConfigError(f"{path}: arm name {arm!r}: allowed: letters, digits and _ . + - (no '__', no '/')")
        if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
            raise ConfigError(f"{path}: arm '{arm}' must be a list of override strings, got {overrides!r}")
    seeds = spec.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(type(s) is int and 0 <= s < 2**63 for s in seeds):
        raise ConfigError(f"{path}: seeds: {seeds!r}; allowed: a non-empty list of integers in [0, 2**63)")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"{path}: seeds: {seeds!r} lists a seed twice (it would count as two seeds)")
    overrides = spec.get("overrides", [])
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise ConfigError(f"{path}: overrides must be a list of override strings, got {overrides!r}")


def config_name(spec: dict) -> str:
    """The Hydra config the sweep's command composes (train, or decode for `command: decode`)."""
    return COMMANDS[spec.get("command", "train")][2]


def parse_seeds(text: str) -> list[int]:
    """--seeds "0,1,2" as distinct integers in [0, 2**63) (what gptlab-train accepts as seed), else a one-line
    ConfigError (a seed given twice is refused, as in a sweep file)."""
    try:
        seeds = [int(s) for s in text.split(",")]
    except ValueError:
        raise ConfigError(f"--seeds: {text!r} is not a comma-separated list of integers (e.g. --seeds 0,1,2)") from None
    bad = [s for s in seeds if not 0 <= s < 2**63]
    if bad:
        raise ConfigError(f"--seeds: seed {bad[0]} is out of range; allowed: integers in [0, 2**63)")
    twice = [s for i, s in enumerate(seeds) if s in seeds[:i]]
    if twice:  # one run dir per seed: a repeat would launch into it twice and count its run as two seeds
        raise ConfigError(
            f"--seeds: {text!r} lists seed {twice[0]} twice (it would count as two seeds); allowed: distinct integers"
        )
    return seeds


def take_sweep_dir(out: Path | None, extra: list[str]) -> tuple[Path | None, list[str]]:
    """(sweep dir, the other overrides): a user's hydra.sweep.dir=DIR means --out DIR; subdir is gptlab-sweep's."""
    given, rest = [], []  # type: list[str], list[str]
    for override in extra:
        match = HYDRA_DIR.match(override)
        if match and match.group(1) == "subdir":
            raise ConfigError(
                f"{override}: gptlab-sweep puts each run in <sweep dir>/<arm>/seed<k> (re-runs and "
                f"gptlab-compare rely on it); drop it, and choose the sweep dir with --out DIR"
            )
        (given if match else rest).append(match.group(2) if match else override)
    if not given:
        return out, rest
    if "${" in given[-1]:
        raise ConfigError(
            f"hydra.sweep.dir={given[-1]}: gptlab-sweep needs the sweep dir before Hydra runs, so "
            f"no interpolation; give a plain path (hydra.sweep.dir=DIR or --out DIR)"
        )
    if out is not None and out.resolve() != Path(given[-1]).resolve():
        raise ConfigError(
            f"hydra.sweep.dir={given[-1]} and --out {out} name two different sweep dirs; "
            f"give one of them (they mean the same)"
        )
    return Path(given[-1]), rest


def check_extra(extra: list[str], lr_grid: bool, spec: dict, word: Callable[[BaseException], str] = str) -> None:
    """Refuse an extra override of a key the sweep sets for each run (seed, arm, ...; optimizer.lr under a grid), and
    one that composes with nothing (a typo would fail every arm; `word` puts Hydra's error in one line): one line,
    before anything is planned."""
    for override in extra:
        key = override.lstrip("+~").split("=", 1)[0]
        why = PER_RUN.get(key) or (
            "from the lr grid; drop it, or drop the grid" if lr_grid and key == "optimizer.lr" else None
        )
        if why:
            raise ConfigError(f"{override}: gptlab-sweep sets {key} for each run itself ({why})")
    runs = [o for o in extra if not is_launch_setting(o)]
    if runs:
        from gptlab.config.build import compose

        try:
            compose([*spec.get("overrides", []), *runs], config_name(spec))
        except Exception as err:  # noqa: BLE001 - Hydra's composition errors, as gptlab-train words them
            raise ConfigError(f"extra override: {word(err)}") from None


def check_arm_keys(extra: list[str], spec: dict) -> None:
    """Refuse an extra override of a key an arm sets: it comes after the arm's own overrides, so it would replace
    the arm's setting in every run of that arm without a word (as an lr grid and a ladder refuse an arm setting what
    they set). Overrides of the sweep's shared keys stay allowed (e.g. train.max_steps=100)."""
    for override in extra:
        key = _key(override)
        for arm, overrides in spec["arms"].items():
            theirs = next((o for o in overrides if _key(o) == key), None)
            if theirs is not None:
                raise ConfigError(
                    f"{override}: arm '{arm}' sets {theirs}, which this override would replace in every run of the "
                    "arm; drop it, or change the arm in the sweep file (allowed: overrides of keys no arm sets)"
                )


def _key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


GRID_KEY = "optimizer.lr"  # the key an lr grid sets for each run


def check_grid(name: str, spec: dict, note: Callable[[str], None] = print) -> None:
    """An lr grid needs a sweep that trains, and no arm setting the lr the grid sets (the grid's value would replace
    it silently; refused in one line, as a ladder refuses an arm that sets its size); the sweep's shared lr is
    replaced at every lr, with a note."""
    if spec.get("command", "train") != "train":
        raise ConfigError(
            f"lr grid: sweep '{name}' runs {COMMANDS[spec['command']][0]} (command: {spec['command']}), which trains "
            "nothing: there is no learning rate to grid; drop --lr-grid / lr_grid:"
        )
    for arm, overrides in spec["arms"].items():
        for override in overrides:
            if override.lstrip("+~").split("=", 1)[0] == GRID_KEY:
                raise ConfigError(
                    f"lr grid: arm '{arm}' sets {override}, which the grid would replace at every lr; drop it from the "
                    "arm (every arm runs at every lr of the grid)"
                )
    for override in spec.get("overrides", []):
        if override.lstrip("+~").split("=", 1)[0] == GRID_KEY:
            note(f"note: the lr grid's {GRID_KEY} replaces {override} (the sweep's own lr) at every lr")


def _ladder(
    given: list[str] | None, spec: dict, extra: list[str], note: Callable[[str], None]
) -> dict[str, list[str]] | None:
    """The ladder of --ladder (else the file's `ladder:`), checked against every override (an lr grid runs at every
    rung: <arm>/<rung>/lr<v>/seed<k>)."""
    given = given if given else spec.get("ladder")
    if given is None:
        return None
    ladder = parse_ladder(given)
    for arm, overrides in spec["arms"].items():
        clash = ladder_conflicts(ladder, overrides)
        if clash:
            raise ConfigError(
                f"ladder {', '.join(ladder)}: arm '{arm}' sets {clash}, a size the ladder moves (every rung would "
                "override it, or it would pin one size); drop it from the arm"
            )
    for override in [*spec["overrides"], *extra]:
        key = override.lstrip("+~").split("=", 1)[0]
        if key in ladder:
            note(f"note: the ladder's {key} replaces {override} (the sweep's own size) at every rung")
        elif "model" in ladder and key.startswith("model."):
            note(f"note: {override} applies on top of every model preset of the ladder")
    return ladder


@dataclass(frozen=True)
class Sweep:
    """One sweep as it will run: its definition with the command line's additions, and where it lands."""

    name: str
    spec: dict  # what sweep.yaml records, bar the extra overrides
    seeds: list[int]
    lrs: list[float] | None
    ladder: list[Rung] | None
    sweep_dir: Path
    extra: list[str]  # the command line's overrides for every run
    out: Path | None  # the sweep dir the command line named (--out or hydra.sweep.dir), None for the default

    @property
    def command(self) -> str:
        return self.spec.get("command", "train")

    @property
    def launch(self) -> list[str]:
        """The launch settings (hydra.*, launcher=...) of the file and the command line."""
        return [o for o in [*self.spec["overrides"], *self.extra] if is_launch_setting(o)]


def resolve(
    sweep: str,
    extra: list[str],
    *,
    out: Path | None = None,
    seeds: str | None = None,
    lr_grid: str | None = None,
    ladder: list[str] | None = None,
    factorial: bool = False,
    aa: str | bool | None = None,
    equal_flops: str | None = None,
    note: Callable[[str], None] = print,
    word: Callable[[BaseException], str] = str,
) -> Sweep:
    """The sweep `gptlab-sweep SWEEP EXTRA... --seeds --lr-grid --ladder --factorial --aa --equal-flops` runs (aa: --aa-arms's
    value, True for --aa, None for the file's); ConfigError for anything it refuses. `note` gets the notes on the
    way, `word` words a Hydra composition error."""
    out, extra = take_sweep_dir(out, extra)
    name, spec, _ = load_sweep(sweep)
    if factorial and "factors" not in spec:
        raise ConfigError(f"--factorial: sweep '{name}' has no 'factors:' (name -> overrides of one binary change)")
    sizes = _ladder(ladder, spec, extra, note)
    ladder_rungs = rungs(sizes) if sizes else None
    run_seeds = parse_seeds(seeds) if seeds is not None else list(spec["seeds"])
    grid = lr_grid if lr_grid is not None else spec.get("lr_grid")
    lrs = parse_lr_grid(grid) if grid is not None else None
    if lrs is not None:
        check_grid(name, spec, note)
    check_extra(extra, lrs is not None, spec, word)
    copies = parse_aa(aa if aa is not None else spec.get("aa"))
    if copies is not None:  # the baseline as identical arms (gptlab/sweep/aa.py); its floor is measured at the end
        if sizes is not None or lrs is not None:
            raise ConfigError("aa: an A/A sweep repeats one config; drop the ladder / lr grid")
        spec = aa_spec(spec, copies, run_seeds)
    check_arm_keys(extra, spec)  # the arms that run (an A/A's copies of the baseline)
    sweep_dir = (out or Path("outputs/sweeps") / name).resolve()
    if lr_grid is not None:  # recorded, so `status` and re-runs see the grid
        spec = {**spec, "lr_grid": lrs}
    if sizes is not None:  # recorded (its values as text), so `status`, re-runs and compare see the ladder
        spec = {**spec, "ladder": sizes}
        bad = ladder_errors(name, spec, extra, run_seeds[0], ladder_rungs or [])
        if bad:
            raise ConfigError(bad[0].removeprefix(f"[{name}] "))
    mode = parse_mode(equal_flops if equal_flops is not None else spec.get("equal_flops"))
    spec = _equal_flops(name, spec, extra, mode, sizes is not None, sweep_dir, note)
    return Sweep(name, spec, run_seeds, lrs, ladder_rungs, sweep_dir, extra, out)


def _equal_flops(
    name: str,
    spec: dict,
    extra: list[str],
    mode: int | bool | None,
    ladder: bool,
    sweep_dir: Path,
    note: Callable[[str], None],
) -> dict:
    """The spec with the shared cumulative-FLOPs grid its runs evaluate at (gptlab/sweep/equal_flops.py): planned
    when the arms differ in cost (or N points are asked), the one the sweep dir recorded when it has one; as
    train.eval_flops=[...] among the overrides and flops_grid in the record. Unchanged when no grid is planned."""
    trains = spec.get("command", "train") == "train"
    if mode and ladder:
        raise ConfigError(
            "--equal-flops: a ladder's rungs differ in size by design and are compared rung by rung; one FLOPs grid "
            "across them would lie beyond the small rungs' reach: drop one of the two"
        )
    if mode and not trains:
        raise ConfigError("--equal-flops: a decode sweep trains nothing; drop --equal-flops / equal_flops:")
    if ladder or not trains or (mode is None and spec.get("aa")):  # an A/A's arms are one config: equal cost
        return spec
    arms = {
        arm: [o for o in planned_overrides(name, spec, arm, extra) if not is_launch_setting(o)] for arm in spec["arms"]
    }
    existing = read_sweep(sweep_dir)
    same = existing is not None and _identity(existing.record, False) == _identity(
        {**spec, "extra_overrides": extra}, False
    )
    values, said = settle(arms, mode, recorded(existing.record) if same and existing else None)
    if said:
        note(said)
    if mode is not None:
        spec = {**spec, "equal_flops": mode}
    if values is None:
        return spec
    return {**spec, "overrides": [*spec["overrides"], grid_override(values)], RECORD_KEY: values}


GROWS = ("lr_grid", "seeds", "arms")  # a sweep grows in place by these (record_definition)
SETTLED = ("equal_flops", RECORD_KEY)  # the grid: settled against the dir's record before (equal_flops.settle)


def _identity(doc: dict, grid: bool = True) -> dict:
    """What makes a sweep dir's definition one sweep: all but what grows in place and the grid settled apart;
    grid=False leaves out the planned grid's own override too (a relaunch is told to be the same sweep before its
    grid is added)."""
    out = {k: v for k, v in doc.items() if k not in GROWS + SETTLED}
    if not grid and (RECORD_KEY in doc or type(doc.get("equal_flops")) is int):  # the planned train.eval_flops
        out["overrides"] = [o for o in doc.get("overrides") or [] if o.lstrip("+~").split("=", 1)[0] != FLOPS_KEY]
    return out


def new_arms(sweep_dir: Path, spec: dict) -> list[str]:
    """The arms of `spec` a sweep dir that ran this sweep has not run: a relaunch grows it by them ([] for a new dir)."""
    existing = read_sweep(sweep_dir)
    return [] if existing is None else [arm for arm in spec["arms"] if arm not in existing.arms]


def record_definition(
    sweep_dir: Path, spec: dict, extra: list[str], seeds: list[int] | None = None, write: bool = True
) -> list[float]:
    """Write sweep.yaml once; refuse to mix a different definition into an existing sweep dir. Neither the lr grid,
    the seeds nor the arms are part of a sweep's identity: the same sweep with another grid, other `--seeds` or arms
    added extends the recorded one in place (sweep.yaml then holds the union of the lrs, of the seeds and of the arms
    that were launched, so compare and status expect exactly the runs launched, and finished runs are reused; an arm
    of the dir's name with other overrides is refused; the shared FLOPs grid was settled against the record before:
    equal_flops.settle); returns the lrs it added. `seeds`: the seeds this launch runs (default: the spec's).
    write=False (a dry run): the same checks and answer, nothing written."""
    record = {**spec, "seeds": list(spec.get("seeds", [0]) if seeds is None else seeds), "extra_overrides": extra}
    target = sweep_dir / SWEEP_FILE
    if not target.is_file():
        if write:
            sweep_dir.mkdir(parents=True, exist_ok=True)
            target.write_text(yaml.safe_dump(record, sort_keys=False))
        return []
    existing = read_sweep(sweep_dir)
    if existing is None or _identity(existing.record) != _identity(record):
        raise ConfigError(f"{target}: this sweep dir holds a different sweep definition; pass --out <new dir>")
    ran = existing.record.get("arms") or {}
    changed = next((arm for arm, given in record["arms"].items() if arm in ran and ran[arm] != given), None)
    if changed is not None:
        raise ConfigError(
            f"{target}: arm '{changed}' has other overrides than the arm of that name this sweep dir ran; give the "
            "changed arm a new name (it is added in place), or pass --out <new dir>"
        )
    grown = {
        "seeds": [*existing.seeds, *(s for s in record["seeds"] if s not in existing.seeds)],
        "arms": {**ran, **{arm: given for arm, given in record["arms"].items() if arm not in ran}},
    }
    added: list[float] = []
    if existing.lrs is None or record.get("lr_grid") is None:
        if (existing.lrs is None) != (record.get("lr_grid") is None):  # a grid added, or one dropped
            raise ConfigError(
                f"{target}: this sweep dir holds the same sweep {'with' if existing.lrs else 'without'} an lr grid; "
                "pass --out <new dir>"
            )
    else:
        union = parse_lr_grid(sorted({*existing.lrs, *record["lr_grid"]}))  # distinct dir names checked again
        added = [lr for lr in union if lr not in existing.lrs]
        grown["lr_grid"] = union
    if write and {**existing.record, **grown} != existing.record:
        atomic_write_text(target, yaml.safe_dump({**existing.record, **grown}, sort_keys=False))
    return added
