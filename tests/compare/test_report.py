"""The gptlab-compare report: seed bands, markers, units and error bars on the figures; flags; a Chromium screenshot."""

from __future__ import annotations

import base64
import json
import math
import re
import statistics
from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import PathCollection, PolyCollection
from matplotlib.container import ErrorbarContainer
from PIL import Image
from rich.console import Console

from gptlab.compare.reading.runs import discover, load_run
from gptlab.compare.reading.timing import read_timing
from gptlab.compare.render import document, html_page, markdown, terminal
from gptlab.compare.render.plots import make_plots, x_at_evals
from gptlab.compare.render.report import cells
from gptlab.compare.render.screenshot import estimate_height
from gptlab.compare.tables.analysis import compare
from helpers.cli import cli_env, run_cli
from helpers.compare import default_loss, write_sweep, write_timing
from helpers.paths import REPO

CHROMIUM = Path("/usr/bin/chromium")
SEED_SHIFT = (0.0, 0.03, 0.06)  # val-loss offset of seeds 0, 1, 2: the band spans 0.06
# arm -> (loss offset, tokens/s of seeds 0..2, MiB of seeds 0..2, extra write_run kwargs)
ARMS = {
    "mha": (0.0, (1000.0, 1030.0, 970.0), (64, 66, 65), dict(fingerprint="fp-mha")),
    "gqa": (0.01, (1010.0, 990.0, 1020.0), (64, 65, 66), dict(fingerprint="fp-mha", leaves={"attention.n_kv_head": 4})),
    "mqa": (0.2, (1500.0, 1520.0, 1480.0), (40, 41, 45), dict(fingerprint="fp-mqa", outside_load=0.6)),
}
LABELS = ["attention=mha", "attention=gqa, attention.n_kv_head=4", "attention=mqa, attention.n_kv_head=1"]
# the three arms timed alone (gqa builds mha's model: the identical model, speed within noise)
RATES = {
    "mha": [1000.0, 990.0, 1010.0],
    "mha#2": [1004.0, 985.0, 1012.0],
    "gqa": [1001.0, 988.0, 1011.0],
    "mqa": [1400.0, 1380.0, 1420.0],
}


def _loss(shift: float):
    return lambda step: default_loss(step) + shift


def _step_ms(tps: float) -> float:
    """Slow steps (128 tokens in 1.28e6/tps ms) so that 100 steps take ~2 min: the wall axis switches to minutes."""
    return 1.28e6 / tps


def _write(root: Path) -> Path:
    """3 arms x 3 seeds; each run's metrics start with an older-style step-0 eval row (no tokens, no wall_s)."""
    specs = [
        dict(
            seed=s,
            choices={"attention": arm},
            loss_at=_loss(shift + SEED_SHIFT[s]),
            tokens_per_s=tps[s],
            step_ms=_step_ms(tps[s]),
            peak_mem_bytes=mib[s] * 2**20,
            **extra,
        )
        for arm, (shift, tps, mib, extra) in ARMS.items()
        for s in range(3)
    ]
    sweep = write_sweep(root, specs)
    for job, spec in enumerate(specs):
        metrics = sweep / str(job) / "metrics.jsonl"
        metrics.write_text(json.dumps({"step": 0, "val/loss": spec["loss_at"](0)}) + "\n" + metrics.read_text())
    return sweep


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """(comparison, images, open figures, output dir), built once for the module."""
    out = tmp_path_factory.mktemp("report")
    sweep = _write(out / "sweep")
    arms = {arm: (sweep / str(3 * i), ARMS[arm][3]["fingerprint"]) for i, arm in enumerate(ARMS)}  # seed-0 runs
    session = read_timing(write_timing(out / "timing", arms, RATES))
    cmp = compare([load_run(p) for p in discover([str(sweep)])], timings=[session])
    figures: dict = {}
    images = make_plots(cmp, out, figures=figures)
    (out / "comparison.html").write_text(html_page.write(document.build(cmp, images)))
    for fig in figures.values():
        fig.canvas.draw()  # tick labels exist only once drawn
    yield cmp, images, figures, out
    import matplotlib.pyplot as plt

    for fig in figures.values():
        plt.close(fig)


def _ticks(ax, axis: str = "x") -> list[str]:
    """Text of the tick labels inside the view (matplotlib also keeps some just outside it)."""
    lo, hi = sorted(getattr(ax, f"get_{axis}lim")())
    return [
        t.get_text()
        for t in getattr(ax, f"get_{axis}ticklabels")()
        if lo <= t.get_position()[0 if axis == "x" else 1] <= hi
    ]


def _curves(ax) -> dict[str, object]:
    """Group label -> its mean line (legend text without the seed count)."""
    lines = [line for line in ax.get_lines() if line.get_label().startswith("attention")]
    return {line.get_label().split(" (n=")[0]: line for line in lines}


def test_every_loss_plot_has_a_band_per_group_markers_and_step_zero(report):
    cmp, images, figures, _ = report
    assert [r.label for r in cmp.rows] == LABELS
    assert "val_loss_vs_wall_time" not in figures  # one time axis: the runs' training time
    for name in ("val_loss_vs_step", "val_loss_vs_training_time", "val_loss_vs_tokens"):
        ax = figures[name].axes[0]
        assert "band = min–max over seeds" in ax.get_title()
        assert "band: min–max over seeds" in [t.get_text() for t in ax.get_legend().get_texts()]
        bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
        assert len(bands) == 3, name
        curves = _curves(ax)
        assert list(curves) == LABELS
        for (shift, *_), line, band in zip(ARMS.values(), curves.values(), bands):
            assert line.get_marker() == "o" and len(line.get_xdata()) == 5  # evals at 0, 25, 50, 75, 100
            assert line.get_xdata()[0] == 0
            assert line.get_ydata()[-1] == pytest.approx(default_loss(100) + shift + statistics.mean(SEED_SHIFT))
            lo, hi = band.get_paths()[0].vertices[:, 1].min(), band.get_paths()[0].vertices[:, 1].max()
            assert (lo, hi) == pytest.approx((default_loss(100) + shift, default_loss(0) + shift + 0.06))


def test_x_axes_are_tokens_and_the_seeds_mean_training_time_with_readable_units(report):
    _, _, figures, _ = report
    tokens = figures["val_loss_vs_tokens"].axes[0]
    assert list(_curves(tokens)["attention=mha"].get_xdata()) == [0, 3200, 6400, 9600, 12800]
    labels = _ticks(tokens)
    assert "4k" in labels and "10k" in labels and not any("000" in t for t in labels)
    wall = figures["val_loss_vs_training_time"].axes[0]
    assert wall.get_xlabel() == "training time (min), x = mean over seeds"
    for arm, label in zip(ARMS, LABELS):  # 100 steps at each seed's own step time, averaged, in minutes
        mean_min = statistics.mean(100 * _step_ms(t) / 1000 for t in ARMS[arm][1]) / 60
        assert _curves(wall)[label].get_xdata()[-1] == pytest.approx(mean_min)
    assert _ticks(wall) == ["0", "0.5", "1", "1.5", "2"]
    step = figures["val_loss_vs_step"].axes[0]
    assert any(line.get_label() == "common step 100" for line in step.get_lines())


def _bar_parts(ax) -> tuple[ErrorbarContainer, np.ndarray]:
    err = next(c for c in ax.containers if isinstance(c, ErrorbarContainer))
    dots = np.concatenate([c.get_offsets() for c in ax.collections if isinstance(c, PathCollection)])
    return err, dots


def _geometric(values: list[float]) -> tuple[float, float, float]:
    """(bar, low, high): geometric mean, divided and multiplied by the geometric sd factor."""
    g, f = statistics.geometric_mean(values), math.exp(statistics.stdev(math.log(v) for v in values))
    return g, g / f, g * f


def _arithmetic(values: list[float]) -> tuple[float, float, float]:
    m, s = statistics.mean(values), statistics.stdev(values)
    return m, m - s, m + s


@pytest.mark.parametrize(
    "name, per_seed, stat, title",
    [
        # tokens/s: the statistic the geometric-mean speed-up divides (one statistic per figure)
        ("tokens_per_s", lambda tps, mib: list(tps), _geometric, "geometric mean ×/÷ geometric sd over seeds"),
        ("peak_memory", lambda tps, mib: [float(m) for m in mib], _arithmetic, "mean ± std over seeds"),
    ],
)
def test_speed_and_memory_bars_show_spread_error_bars_and_every_run(report, name, per_seed, stat, title):
    _, _, figures, _ = report
    ax = figures[name].axes[0]
    assert title in ax.get_title() and "dots = each run" in ax.get_title()
    err, dots = _bar_parts(ax)
    segments = err.lines[2][0].get_segments()
    assert len(segments) == 3 and len(dots) == 9
    for i, (_, tps, mib, _) in enumerate(ARMS.values()):
        values = per_seed(tps, mib)
        bar, low, high = stat(values)
        assert sorted(segments[i][:, 1]) == pytest.approx([low, high])
        mine = dots[np.abs(dots[:, 0] - i) < 0.4]
        assert sorted(mine[:, 1]) == pytest.approx(sorted(values))
        assert ax.patches[i].get_height() == pytest.approx(bar)
    ticks = _ticks(ax, "y")
    if name == "tokens_per_s":
        assert "1k" in ticks and not any("000" in t for t in ticks)
    else:
        assert ax.get_ylabel() == "peak memory (MiB)" and "60" in ticks


def test_each_png_is_drawn_once_and_is_the_bytes_of_matplotlibs_own_save(report, tmp_path):
    """tight_layout() leaves a placeholder layout engine, with which savefig draws the whole figure twice; the plots
    are saved without it (one draw), and the PNG is byte for byte what savefig writes with it left on."""
    from matplotlib.layout_engine import PlaceHolderLayoutEngine

    from gptlab.compare.render.plots import save_png

    _, images, figures, _ = report
    for name, fig in figures.items():
        draws = []
        fig.draw = lambda renderer, draw=fig.draw, draws=draws: draws.append(1) or draw(renderer)
        try:
            save_png(fig, tmp_path / f"{name}.png", dpi=100)
            assert len(draws) == 1 and fig.get_layout_engine() is None, name
            fig.set_layout_engine(PlaceHolderLayoutEngine(True, True))  # as tight_layout() leaves it
            fig.savefig(tmp_path / f"{name}-plain.png", dpi=100)
            assert len(draws) == 3, name  # matplotlib's own save: a layout draw, then the render
        finally:
            del fig.draw
            fig.set_layout_engine(None)
        assert (tmp_path / f"{name}-plain.png").read_bytes() == images[name].read_bytes(), name
        assert (tmp_path / f"{name}.png").read_bytes() == images[name].read_bytes(), name


def test_flags_in_the_table_markdown_and_terminal(report):
    cmp, images, _, _ = report
    headers, body = cells(cmp)
    flags = [line[headers.index("flags")] for line in body]
    # mqa's seeds peak at 40, 41 and 45 MiB: 12.5% apart, above the 5% a seed of one config may vary without a floor
    assert flags == ["identical model", "identical model; speed within noise", "under load; peak mem varies"]
    md = markdown.write(document.build(cmp, images))
    header = next(line for line in md.splitlines() if line.startswith("| label |"))  # below the verdicts
    assert "| flags |" in header + " " and "identical model; speed within noise |" in md
    assert "shaded band = min–max over seeds" in md and "bar = mean ± std over seeds, dots = each run" in md
    console = Console(width=400, record=True)
    terminal.print_document(document.build(cmp), console)
    assert "identical model; speed within noise" in console.export_text()


def test_html_highlights_flags_with_a_legend_and_embeds_every_plot(report):
    _, images, _, out = report
    page = (out / "comparison.html").read_text()
    assert re.findall(r'<tr data-flags="([^"]*)">', page) == ["identical", "identical noise", "load mem"]
    mqa_row = page[page.index('<tr data-flags="load mem">') :].split("</tr>")[0]
    assert mqa_row.count('class="flag-mem"') == 1  # the peak mem cell
    assert mqa_row.count('class="flag-load"') == 2  # tokens/s and step ms during training: records
    assert '<span class="flag flag-load">under load</span>' in mqa_row
    gqa_row = page[page.index('<tr data-flags="identical noise">') :].split("</tr>")[0]
    assert 'class="flag-noise"' in gqa_row and 'class="flag-identical"' in gqa_row
    legend = page[page.index('<ul class="legend">') :].split("</ul>")[0]
    assert [m for m in re.findall(r'class="flag flag-(\w+)"', legend)] == ["identical", "noise", "load", "mem"]
    assert re.search(r"td\.flag-load,\.flag-load\{background:#[0-9a-f]{6}\}", page)
    srcs = re.findall(r'<img alt="(\w+)" src="data:image/png;base64,([^"]+)"', page)
    assert [a for a, _ in srcs] == list(images) and len(srcs) == 7
    assert all(base64.b64decode(s)[:4] == b"\x89PNG" for _, s in srcs)


def _near(img: np.ndarray, rgb: tuple[int, int, int], tol: int = 3) -> np.ndarray:
    """Boolean mask of pixels within tol of rgb on every channel."""
    return (np.abs(img[..., :3].astype(int) - np.array(rgb)) <= tol).all(axis=-1)


def _long_dark_runs(img: np.ndarray, length: int = 300) -> list[tuple[int, int]]:
    """(row, first column) of every horizontal run of >= length dark pixels (axis spines; text never is)."""
    found = []
    for r, row in enumerate(img.max(axis=-1) < 128):
        edges = np.diff(np.concatenate([[0], row.astype(int), [0]]))
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        found += [(r, int(a)) for a, b in zip(starts, ends) if b - a >= length]
    return found


@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium not installed: no headless screenshot")
def test_headless_chromium_screenshot_shows_the_table_and_every_plot(report):
    _, _, _, out = report
    png = out / "shot.png"
    proc = run_cli(
        "gptlab.compare.render.screenshot",
        str(out / "comparison.html"),
        str(png),
        cwd=REPO,
        timeout=180,
        env=cli_env(PYTHONPATH=str(REPO)),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    img = np.asarray(Image.open(png).convert("RGB"))
    assert proc.stdout.strip() == f"wrote {png} ({img.shape[1]}x{img.shape[0]})"
    height, window = img.shape[0], estimate_height((out / "comparison.html").read_text(), 1400)
    assert img.shape[1] == 1400 and 2500 < height < window - 200, window  # four rows of figures, trimmed below the last
    assert len(np.unique(img.reshape(-1, 3), axis=0)) > 200
    top = img[: height // 5]
    assert (top.max(axis=-1) < 90).sum() > 2000  # dark text: the title and the table
    assert _near(top, (0xFF, 0xD6, 0xD6)).sum() > 500 and _near(top, (0xDB, 0xE8, 0xFF)).sum() > 500  # flag cells
    # each plot's top and bottom axis lines, 7 plots in 2 columns; the Δ val loss plot (left, second row) has one
    # panel per arm (2 here), each with a third long dark line: its zero line
    spines = _long_dark_runs(img)
    assert len(spines) == 18 and min(r for r, _ in spines) > height // 5
    assert sum(c < 700 for _, c in spines) == 2 + 2 * 3 + 2 + 2 and sum(c > 700 for _, c in spines) == 6
    assert _near(img[-height // 5 :], (120, 173, 210), 4).sum() > 2000  # the memory plot's blue bar is rendered
    assert (img[-30:] == img[-1, 0]).all() and not (img[-40:] == img[-1, 0]).all()  # trimmed 32 px below the content


def test_screenshot_cli_bad_input_is_one_line(tmp_path):
    env = cli_env(PYTHONPATH=str(REPO))
    screenshot = "gptlab.compare.render.screenshot"
    proc = run_cli(screenshot, str(tmp_path / "nope.html"), str(tmp_path / "x.png"), cwd=REPO, timeout=60, env=env)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert proc.stderr.startswith("screenshot: error: ") and "nope.html' is not a file" in proc.stderr
    (tmp_path / "a.html").write_text("<p>hi</p>")
    proc = run_cli(
        screenshot,
        str(tmp_path / "a.html"),
        str(tmp_path / "x.png"),
        cwd=REPO,
        timeout=60,
        env={**env, "GPTLAB_CHROMIUM": str(tmp_path / "no-chromium")},
    )
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert "no Chromium found (GPTLAB_CHROMIUM=" in proc.stderr and not (tmp_path / "x.png").exists()


def test_eval_x_values_start_at_zero_and_interpolate_between_logged_steps(tmp_path):
    run = write_sweep(tmp_path, [dict(seed=0, step_ms=100.0)]) / "0"
    metrics = run / "metrics.jsonl"  # a newer run: its step-0 eval row carries the eval's own 2 s and 0 tokens
    rows = [{"step": 0, "val/loss": 4.0, "tokens": 0, "wall_s": 2.0}, {"step": 12, "val/loss": 3.0}]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows) + metrics.read_text())
    loaded = load_run(run)
    wall, tokens = x_at_evals(loaded, "wall_s"), x_at_evals(loaded, "tokens")
    assert wall[0] == 0.0 and tokens[0] == 0.0
    assert wall[12] == pytest.approx(1.2) and tokens[12] == pytest.approx(12 * 128)  # between the rows at 10 and 15
    assert wall[100] == pytest.approx(10.0) and sorted(wall) == [0, 12, 25, 50, 75, 100]
