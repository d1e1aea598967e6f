"""Compare like with like: drop copied runs, refuse runs scored on different validation sets, line the runs up at one
point (equal step, or equal tokens), and compute the per-group rows with their verdicts and power, and the warnings
and notes met on the way as Note values (compare/render/json_report.py writes them into comparison.json).

Speed is a measurement of its own: a row's speed-up and verdict, its timed tokens/s, step ms and MFU come from the
timing session that covers the runs (compare/tables/timed.py), or the row is "not timed". The training runs' own
tokens/s and step ms stay in the row as records (with their outside-load and run-order caveats), never a verdict."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, cast

from gptlab.compare.reading.align import Point, align
from gptlab.compare.reading.claims import attach_claims
from gptlab.compare.reading.clock import WALL, Clock, clock_of
from gptlab.compare.reading.group import (
    Group,
    assign_labels,
    check_same_task,
    diff_items,
    find_baseline,
    group_runs,
    one_run_per_seed,
)
from gptlab.compare.reading.identical import identical_groups, mixed_fingerprints, shared
from gptlab.compare.reading.identity import dedupe
from gptlab.compare.reading.like import (
    BUDGET_KEYS,
    UNSET,
    VAL_SET_KEYS,
    arm_notes,
    check_like,
    overhead_warnings,
    value,
)
from gptlab.compare.reading.logged import Logged, by_arm
from gptlab.compare.reading.runs import Run
from gptlab.compare.reading.timing import Matching, Session
from gptlab.compare.statistics import speed, stats, verdict
from gptlab.compare.statistics.noise_floor import Floor, load_limit, mem_limit
from gptlab.compare.statistics.order import confounded, started
from gptlab.compare.statistics.power import Power, arm_power
from gptlab.compare.statistics.rounds import Paired, RoundSpeed
from gptlab.compare.statistics.stats import ALPHA
from gptlab.compare.statistics.verdict import Status, Verdict
from gptlab.compare.tables.evals import eval_rows
from gptlab.compare.tables.machine import Peak, common_peak, machine_warnings, peak_warnings, run_mfu
from gptlab.compare.tables.probes import probe_rows
from gptlab.compare.tables.timed import GroupSpeed, covering, group_figures, not_timed, untimed_note
from gptlab.compare.tables.val_sets import val_set_rows
from gptlab.util.note import Note, note, warning

LOSS, SPEED = "val/loss", "tokens_per_s"  # what the main table's two verdicts compare


@dataclass
class Row:
    """One group's line of the table; keys up to `flops_per_token` are the comparison.json contract. tokens_per_s and
    step_ms (and their spreads) are the training runs' records; mfu, speedup and speed are the timing session's
    (None / not timed where no session times the group; the record's MFU is mfu_during_training)."""

    label: str
    choices: dict[str, str]
    n_seeds: int
    val_loss_mean: float
    val_loss_std: float | None
    delta_val_loss: float
    tokens_per_s: float | None
    step_ms: float | None
    mfu: float | None
    peak_mem_bytes: int | None
    speedup: float | None
    params: int | None
    flops_per_token: float | None
    val_acc_mean: float | None = None
    differs: dict[str, str] = field(default_factory=dict)
    seeds: list[Any] = field(default_factory=list)
    val_losses: list[float] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    claimed: dict[str, float] | None = None
    # Speed with its noise: mean ± std over seeds of each run's median; the verdicts on val loss and speed.
    tokens_per_s_std: float | None = None
    step_ms_std: float | None = None
    tokens_per_s_seeds: list[float] = field(default_factory=list)
    loss: Verdict = field(default_factory=lambda: Verdict(LOSS, Status.NOT_MEASURED))
    speed: Verdict = field(default_factory=not_timed)
    outside_load: float | None = None
    under_load: bool = False  # the training runs' records were taken under outside load (a caveat, never a verdict)
    order_confounded: bool = False  # the training runs' order (or load) can stand in for the arm (a record's caveat)
    model_fingerprint: str | None = None
    identical_to: list[str] = field(default_factory=list)
    # Like with like: the step this group is compared at (arms differ only when compared at equal tokens), the
    # budget, and the power vs the baseline.
    at_step: int = 0
    budget: dict[str, str] = field(default_factory=dict)
    power: Power | None = None
    # Peak memory's (max - min) / min over seeds; `mem_varies` when above the measurement's own spread (the noise
    # floor's, else noise_floor.MEM_SPREAD_DEFAULT).
    peak_mem_spread: float | None = None
    mem_varies: bool = False
    # What the table and the tokens/s plot show (one statistic beside the geometric-mean speed-up): the geometric
    # mean over seeds and the geometric sd factor (×/÷).
    tokens_per_s_gmean: float | None = None
    tokens_per_s_gsd: float | None = None
    step_ms_gmean: float | None = None
    step_ms_gsd: float | None = None
    # Timed alone (the timing session, compare/tables/timed.py): the arm that stands for the group, its figures and
    # the session's A/A over the rounds the speed-up was paired in; None where not timed.
    timed_arm: str | None = None
    timed_tokens_per_s: float | None = None
    timed_step_ms: float | None = None
    speed_aa: Paired | None = None
    mfu_during_training: float | None = None

    @property
    def significant(self) -> bool | None:
        """Whether Δ val loss is beyond seed noise (None: 1 seed on a side, no test)."""
        return None if self.loss.status in (Status.NO_TEST, Status.NOT_MEASURED) else self.loss.decided

    @property
    def p_value(self) -> float | None:
        return 1.0 if self.loss.status is Status.BASELINE else self.loss.p

    @property
    def delta_ci(self) -> list[float] | None:
        """The 95% Welch interval of delta_val_loss (None with 1 seed on a side)."""
        return list(self.loss.interval) if self.loss.interval else None

    @property
    def speedup_ci(self) -> list[float] | None:
        return list(self.speed.interval) if self.speed.interval else None

    def to_json(self) -> dict[str, Any]:
        """The row of comparison.json but its `power`, whose decisions are words (compare/render/json_report.py adds
        it): its fields, the two verdicts as values and their figures."""
        doc = {k: v for k, v in asdict(self).items() if k != "power"}
        doc.update(loss=self.loss.to_json(), speed=self.speed.to_json(), significant=self.significant)
        doc.update(p_value=self.p_value, delta_ci=self.delta_ci, speedup_ci=self.speedup_ci, speedup_p=self.speed.p)
        return doc


@dataclass
class Comparison:
    """Everything the reports need: the step (the baseline's), the baseline label, rows (baseline first), warnings,
    the point every run is compared at, the one MFU peak, notes (arm differences in budget, the clock, the point) and,
    for one part of --split-by, its key values. Warnings and notes are Note values: words.note words them."""

    step: int
    baseline: str
    rows: list[Row]
    groups: list[Group]
    warnings: list[Note]
    targets: list[Any] = field(default_factory=list)  # target.TargetResult per --target / --threshold
    thresholds: list[Any] = field(default_factory=list)  # threshold.Threshold per --threshold
    decode: list[Any] = field(default_factory=list)  # decode.DecodeRow per group and point, when runs have decode.json
    point: Point | None = None
    peak: Peak | None = None
    notes: list[Note] = field(default_factory=list)
    split: dict[str, str] = field(default_factory=dict)
    validation_set: dict[str, str] = field(default_factory=dict)
    compute: Any = None  # compute.EqualCompute: val loss at equal FLOPs and wall time, the matched arms
    matrix: Any = None  # matrix.Matrix: every arm under every lens (equal steps, FLOPs, wall time, own lr, matched)
    probes: list[Any] = field(default_factory=list)  # probes.ProbeRow per probe/* metric the runs logged
    evals: list[Any] = field(default_factory=list)  # evals.EvalRow per eval.json metric (gptlab-eval)
    val_sets: list[Any] = field(default_factory=list)  # val_sets.ValSetRow per data.val_sets set the runs scored
    logged: list[Logged] = field(default_factory=list)  # what each arm's runs logged as warnings (train.log)
    # The machine's measured noise floor (None: the default heuristic; it sets the outside load above which a
    # training record is 'under load' and the peak-memory spread, never a speed verdict), the report's line on it.
    noise_floor: Floor | None = None
    floor_note: str = ""
    load_limit: float = speed.OUTSIDE_LOAD_LIMIT
    clock: Clock = field(default_factory=lambda: Clock(WALL))  # the training records' time axis (time to target)
    timing: Matching | None = None  # the timing session the speed figures come from, matched to the groups

    def at(self) -> str:
        """Where the runs are compared, in words: `step 100` or `12,800 tokens`."""
        return self.point.describe() if self.point else f"step {self.step}"


def _budget_end(run: Run) -> bool:
    """True when the run's last eval is at its own train.max_steps (it finished a shorter budget, not early)."""
    steps = value(run, "train.max_steps")
    return steps != UNSET and str(run.val_steps()[-1]) == steps


def stop_warnings(runs: list[Run], point: Point) -> list[Note]:
    """One warning per run that crashed, is unfinished or stopped before the others (a finished run of a shorter
    budget is an arm difference, named by like.arm_notes instead)."""
    reach = max(r.val_steps()[-1] for r in runs)
    out = []
    for run in runs:
        last = run.val_steps()[-1]
        if run.status == "finished" and _budget_end(run):
            continue
        if run.status != "finished":
            why = f"status {run.status}, last val/loss at step {last}"
        elif last < reach:
            why = f"stopped early, last val/loss at step {last}"
        else:
            continue
        out.append(
            warning(f"{run.path}: {why} (others reach {reach}); compared at {point.describe()}", subject=str(run.path))
        )
    return out


def _first(runs: list[Run], key: str) -> Any:
    return next((r.summary[key] for r in runs if r.summary.get(key) is not None), None)


def _mem_spread(peaks: list[float | None]) -> float | None:
    """(max - min) / min of the seeds' peak memory; None with fewer than 2 measured."""
    values = [float(p) for p in peaks if p is not None and p > 0]
    return (max(values) - min(values)) / min(values) if len(values) > 1 else None


def _row(g: Group, point: Point, peak: Peak, floor: Floor | None = None) -> Row:
    runs = g.runs
    losses = [float(r.by_step[point.step_of(r)]["val/loss"]) for r in runs]
    evals = [r.by_step[point.step_of(r)] for r in runs]
    accs = [float(e["val/acc"]) for e in evals if e.get("val/acc") is not None]
    peaks = [speed.run_speed(r, "peak_mem_bytes", "mem/peak_bytes", max) for r in runs]
    tps = speed.per_run(runs, "tokens_per_s_median", "perf/tokens_per_s")
    ms = speed.per_run(runs, "step_ms_median", "perf/step_ms")
    (tps_mean, tps_std), (ms_mean, ms_std) = speed.spread(tps), speed.spread(ms)
    (tps_g, tps_gsd), (ms_g, ms_gsd) = speed.geometric(tps), speed.geometric(ms)
    load = speed.outside_load(runs)
    spread = _mem_spread(peaks)
    return Row(
        label=g.label,
        choices=dict(runs[0].choices),
        n_seeds=len(runs),
        val_loss_mean=stats.mean(losses),
        val_loss_std=stats.std(losses),
        delta_val_loss=0.0,
        tokens_per_s=tps_mean,
        step_ms=ms_mean,
        mfu=None,
        peak_mem_bytes=max((int(p) for p in peaks if p is not None), default=None),
        speedup=None,
        params=_first(runs, "params"),
        flops_per_token=_first(runs, "flops_per_token"),
        val_acc_mean=stats.mean(accs) if accs else None,
        seeds=[r.config.get("seed") for r in runs],
        val_losses=losses,
        runs=[str(r.path) for r in runs],
        tokens_per_s_std=tps_std,
        step_ms_std=ms_std,
        tokens_per_s_seeds=tps,
        outside_load=load,
        under_load=load is not None and load > load_limit(floor),
        model_fingerprint=shared(g, "model_fingerprint"),
        at_step=point.step_of(runs[0]),
        budget={k: value(runs[0], k) for k in BUDGET_KEYS},
        peak_mem_spread=spread,
        mem_varies=spread is not None and spread > mem_limit(floor),
        tokens_per_s_gmean=tps_g,
        tokens_per_s_gsd=tps_gsd,
        step_ms_gmean=ms_g,
        step_ms_gsd=ms_gsd,
        mfu_during_training=stats.median(cast(list[float], [run_mfu(r, peak) for r in runs])),
    )


def _timed(row: Row, found: GroupSpeed) -> None:
    """The row's speed from the timing session (compare/tables/timed.py): figures, speed-up and verdict."""
    row.timed_arm = found.arm.name if found.arm is not None else None
    row.timed_tokens_per_s, row.timed_step_ms, row.mfu = found.tokens_per_s, found.step_ms, found.mfu
    row.speed = found.verdict
    row.speedup = found.verdict.effect
    row.speed_aa = found.rounds.aa if found.rounds is not None else None


def _versus(row: Row, base: Row, rounds: RoundSpeed | None = None) -> None:
    """Fill delta, the val-loss verdict and the power (val loss from the seeds, speed from the timed `rounds`) of row
    against the baseline row."""
    row.delta_val_loss = row.val_loss_mean - base.val_loss_mean
    if row is base:
        row.loss = verdict.baseline(LOSS)
        return
    identical = base.label in row.identical_to  # the same experiment twice: any gap is seed noise
    row.loss = verdict.difference(LOSS, row.val_losses, base.val_losses, ALPHA, identical)
    paired = rounds.speedup if rounds is not None else None
    row.power = arm_power(row.val_losses, base.val_losses, row.loss.decided, identical, row.speed, paired)
    row.loss = row.loss.with_mde(row.power.mde_val_loss)
    row.speed = row.speed.with_mde(row.power.mde_speedup)


def identity_warnings(rows: list[Row], groups: list[Group], limit: float = speed.OUTSIDE_LOAD_LIMIT) -> list[Note]:
    """One warning per identical pair, per group with mixed fingerprints, per group whose training runs recorded
    outside load above `limit` (their tokens/s records) and per group whose peak memory varies between seeds."""
    out = [
        warning(
            f"'{a.label}' and '{b.label}' build the identical model (fingerprint {a.model_fingerprint}) and differ "
            "only in model config: every difference between them is noise",
            subject=b.label,
        )
        for i, a in enumerate(rows)
        for b in rows[i + 1 :]
        if b.label in a.identical_to
    ]
    out += [
        warning(
            f"'{g.label}': its runs recorded different model fingerprints (code changed between seeds?)",
            subject=g.label,
        )
        for g in groups
        if mixed_fingerprints(g)
    ]
    out += [
        warning(
            f"'{row.label}': tokens/s during training taken under outside load (other processes used up to "
            f"{100 * cast(float, row.outside_load):.0f}% of the cores in one of its runs; limit {100 * limit:.0f}%): a "
            "record not to be trusted, which no verdict uses",
            subject=row.label,
        )
        for row in rows
        if row.under_load
    ]
    out += [
        warning(
            f"'{row.label}': peak memory varies by {100 * cast(float, row.peak_mem_spread):.1f}% between its seeds, "
            "more than the measurement's own spread; the table shows the largest",
            subject=row.label,
        )
        for row in rows
        if row.mem_varies
    ]
    starts = _cpu_starts(groups)
    if len(starts) > 1:
        out.append(
            warning(
                f"peak memory: on the CPU {starts['forked']} run(s) were forked from a warm interpreter (a local "
                f"sweep's queue) and {starts['fresh']} started fresh; a forked run's resident set leaves out the "
                "library pages its server loaded (~50 MB), so their peak memory differs by how they started",
                subject="peak memory",
            )
        )
    return out


def _cpu_starts(groups: list[Group]) -> dict[str, int]:
    """How many CPU runs started forked and how many fresh (provenance.json; runs that do not say are left out)."""
    counts: dict[str, int] = {}
    for run in (r for g in groups for r in g.runs):
        hardware = run.provenance.get("hardware") or {}
        start = hardware.get("process_start")
        if start in ("forked", "fresh") and not str(hardware.get("device", "cpu")).startswith("cuda"):
            counts[start] = counts.get(start, 0) + 1
    return counts


def _rows(ordered: list[Group], point: Point, peak: Peak, floor: Floor | None, timed: list[GroupSpeed]) -> list[Row]:
    """One row per group (the baseline's first): what differs from the baseline, its identical twins, its timed
    speed, its verdicts."""
    base = ordered[0]
    rows = [_row(g, point, peak, floor) for g in ordered]
    twins = identical_groups(ordered)
    for g, row, found in zip(ordered, rows, timed):
        row.differs = dict(diff_items(g, base)) if g is not base else {}
        row.identical_to = [h.label for h in twins.get(id(g), [])]
        _timed(row, found)
    for row, found in zip(rows, timed):
        _versus(row, rows[0], found.rounds)
    return rows


def _run_order(ordered: list[Group], rows: list[Row]) -> tuple[str | None, dict[str, str]]:
    """(why every arm's training runs are confounded with run order, or None; per arm, why it is against the
    baseline): each arm so confounded has its training records flagged (never its timed speed verdict)."""
    order_why = confounded([g.runs for g in ordered])
    # each arm against the baseline as well: pooled over every arm, one arm run after all the others went unseen
    arm_why = {
        row.label: why for g, row in zip(ordered[1:], rows[1:]) if (why := confounded([ordered[0].runs, g.runs]))
    }
    for row in rows[1:]:
        row.order_confounded = bool(order_why or row.label in arm_why)
    return order_why, arm_why


def order_warnings(order_why: str | None, arm_why: dict[str, str], groups: list[Group]) -> list[Note]:
    """One warning when every arm's training runs are confounded with run order, else one per arm confounded against
    the baseline: their tokens/s during training are records no verdict uses, and may be the order's. Runs that
    recorded no start time leave the check unmade: one warning says so, never a silent pass."""
    fix = "gptlab-sweep launches arms interleaved; rerun the runs that way"
    lacking = [r for g in groups for r in g.runs if started(r) is None] if len(groups) > 1 else []
    if lacking:
        more = f" and {len(lacking) - 1} more" if len(lacking) > 1 else ""
        return [
            warning(
                f"{lacking[0].path}{more} recorded no start time (summary started_at, written before it was kept): "
                "whether run order or load made the training runs' tokens/s differ was not checked, so those "
                "records carry no such caveat (speed verdicts come from a timing session only)",
                subject=str(lacking[0].path),
                fix="time the arms alone: the timing session needs no start times",
            )
        ]
    if order_why:
        return [
            warning(
                f"tokens/s during training is confounded with run order: {order_why}; no ratio of those records is a "
                "finding (speed verdicts come from a timing session only)",
                fix=fix,
            )
        ]
    return [
        warning(
            f"'{label}' tokens/s during training is confounded with run order against the baseline: {why}; no ratio of "
            "those records is a finding (speed verdicts come from a timing session only)",
            subject=label,
            fix=fix,
        )
        for label, why in arm_why.items()
    ]


def _token_notes(point: Point, rows: list[Row]) -> list[Note]:
    """The note that the arms are compared at equal tokens, each at its own step (none at equal steps)."""
    if point.by != "tokens":
        return []
    steps = ", ".join(f"'{r.label}' step {r.at_step}" for r in rows)
    return [
        note(f"note: compared at equal tokens, {point.value:,}, since the arms differ in tokens per step ({steps})")
    ]


def _extra_tables(cmp: Comparison, point: Point) -> None:
    """The probe, eval and validation-set tables, each with its warnings (appended in that order)."""
    labels = [r.label for r in cmp.rows]
    cmp.probes, probe_warnings = probe_rows(cmp.groups, labels, point)
    cmp.evals, eval_warnings = eval_rows(cmp.groups, labels)
    same_model = [cmp.baseline in r.identical_to for r in cmp.rows]  # an arm that builds the baseline's model: noise
    cmp.val_sets, val_set_warnings = val_set_rows(cmp.groups, labels, point, same_model)
    cmp.warnings += probe_warnings + eval_warnings + val_set_warnings


def compare(
    runs: list[Run],
    baseline: str | None = None,
    step: int | None = None,
    claims: dict[str, dict[str, float]] | None = None,
    peak_flops: float | None = None,
    floor: Floor | None = None,
    floor_note: str = "",
    timings: Sequence[Session] = (),
    paths: Sequence[str] = (),
) -> Comparison:
    """Compare like with like: count copied runs once, refuse runs of different tasks or validation sets
    (ConfigError), choose the baseline and the point (equal step, or equal tokens), and compute one row per group
    (baseline first); speed from the first of `timings` (reading/timing.py find_timings) that times the baseline,
    MFU against its peak (or `peak_flops`), else "not timed" with the command that times `paths`; the training
    records' load limit from the machine's measured noise `floor` when given (noise_floor.lookup)."""
    runs, copies = dedupe(runs)
    check_same_task(runs)
    unchecked = check_like(runs)
    groups = group_runs(runs)
    replays = one_run_per_seed(groups)
    kept = {id(r) for g in groups for r in g.runs}
    runs = [r for r in runs if id(r) in kept]  # a replay counted once is gone from the point and every warning too
    point, unequal = align(runs, step)
    base = find_baseline(groups, baseline)
    assign_labels(groups, base)
    ordered = [base] + [g for g in groups if g is not base]
    peak = common_peak(runs, peak_flops)
    matching, timing_warnings = covering(timings, ordered, base)
    rows = _rows(ordered, point, peak, floor, group_figures(ordered, base, matching, peak_flops))
    order_why, arm_why = _run_order(ordered, rows)
    if claims:
        attach_claims(rows, ordered, claims)
    clock = clock_of(runs)
    warnings = copies + replays + unchecked + unequal + stop_warnings(runs, point)
    warnings += identity_warnings(rows, ordered, load_limit(floor)) + order_warnings(order_why, arm_why, ordered)
    warnings += peak_warnings(runs, peak) + machine_warnings(runs) + overhead_warnings(runs, clock) + timing_warnings
    cmp = Comparison(point.step_of(base.runs[0]), base.label, rows, ordered, warnings, point=point, peak=peak)
    cmp.notes = arm_notes(ordered, base) + ([clock.note] if clock.note else []) + _token_notes(point, rows)
    cmp.notes += [] if matching is not None else [untimed_note(runs, paths)]
    cmp.noise_floor, cmp.floor_note, cmp.load_limit = floor, floor_note, load_limit(floor)
    cmp.clock, cmp.timing = clock, matching
    # check_like made every recorded value equal: the first run that recorded each key speaks for all
    cmp.validation_set = {k: next((v for r in runs if (v := value(r, k)) != UNSET), UNSET) for k in VAL_SET_KEYS}
    _extra_tables(cmp, point)
    cmp.logged = by_arm([(g.label, [r.path for r in g.runs]) for g in ordered])
    return cmp


def add_targets(cmp: Comparison, runs: list[Run], targets: list, thresholds: list, key: str | None) -> None:
    """Steps-to-target rows for each --target and --threshold target (once each), then each threshold's answer."""
    from gptlab.compare.tables.target import Timed, check_metric, steps_to_target
    from gptlab.compare.tables.threshold import threshold

    for flag, wanted in (("--target", targets), ("--threshold", thresholds)):
        for t in wanted:
            check_metric(t, runs, flag)
    timed = []  # each group's timed step (cmp.groups and cmp.rows share one order), None where not timed
    for g, row in zip(cmp.groups, cmp.rows):
        arm = cmp.timing.arm_of(g) if cmp.timing is not None else None
        timed.append(Timed(arm.step_ms / 1000.0, row.speed) if arm is not None and arm.step_ms else None)
    results: dict = {}
    for t in [*targets, *thresholds]:
        results.setdefault(t, steps_to_target(cmp.groups, t, timed))
    cmp.targets = list(results.values())
    cmp.thresholds = [threshold(cmp.groups, results[t], key) for t in thresholds]
