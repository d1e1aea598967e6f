"""Render a comparison.html to a PNG with headless Chromium (offline), trimmed to the page's content.

python -m gptlab.compare.render.screenshot outputs/sweeps/attention/comparison/comparison.html report.png
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image, ImageChops

from gptlab.errors import ConfigError

CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome")
# Offline, no first-run or update traffic, no sandbox (containers), no GPU (headless servers).
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)
MAX_HEIGHT = 16384  # Chromium refuses larger surfaces


def find_chromium() -> str:
    """$GPTLAB_CHROMIUM, else the first Chromium on the usual paths; a one-line error when there is none."""
    wanted = os.environ.get("GPTLAB_CHROMIUM")
    for name in [wanted] if wanted else CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    where = f"GPTLAB_CHROMIUM={wanted}" if wanted else ", ".join(CANDIDATES)
    raise ConfigError(f"no Chromium found ({where}); install chromium or set GPTLAB_CHROMIUM")


def estimate_height(page: str, width: int) -> int:
    """A window height generous enough for the whole report: table rows, list items and rows of figures."""
    columns = max(1, (width - 64) // 616)  # the report's figure grid: 600 px columns, 16 px gap, 2em margins
    figure_rows = -(-len(re.findall(r"<img\b", page)) // columns)
    per_figure = (width - 64) / columns * 0.8 + 60  # 8x5 figures, caption above
    text = 40 * len(re.findall(r"<tr\b", page)) + 48 * len(re.findall(r"<li\b", page))
    return int(min(MAX_HEIGHT, 400 + text + figure_rows * per_figure))


def _run_chromium(binary: str, url: str, png: Path, width: int, height: int, timeout: float) -> None:
    """One headless capture of width x height pixels; kills Chromium's whole process group on timeout."""
    with tempfile.TemporaryDirectory(prefix="gptlab-chromium-") as profile:
        cmd = [
            binary,
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--screenshot={png}",
            f"--window-size={width},{height}",
            url,
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise RuntimeError(f"Chromium did not finish within {timeout:g} s") from None
    if proc.returncode != 0 or not png.is_file():
        last = next((ln for ln in reversed(err.strip().splitlines()) if ln.strip()), "no output")
        raise RuntimeError(f"Chromium exited with {proc.returncode} ({last.strip()[:200]})")


def content_bottom(png: Path) -> int:
    """Pixel row just below the last one that differs from the page background (the top-left pixel)."""
    with Image.open(png) as im:
        rgb = im.convert("RGB")
    box = ImageChops.difference(rgb, Image.new("RGB", rgb.size, rgb.getpixel((0, 0)))).getbbox()
    return box[3] if box else 0


def screenshot(html: Path, png: Path, width: int = 1400, timeout: float = 120.0) -> Path:
    """Render `html` at `width` px in headless Chromium into `png`, cropped below the content; returns png."""
    html, png = Path(html).resolve(), Path(png).resolve()
    if not html.is_file():
        raise ConfigError(f"'{html}' is not a file (give the comparison.html to render)")
    if width < 320:
        raise ConfigError(f"width={width}: must be at least 320 pixels")
    binary = find_chromium()
    png.parent.mkdir(parents=True, exist_ok=True)
    height = estimate_height(html.read_text(errors="replace"), width)
    while True:
        _run_chromium(binary, html.as_uri(), png, width, height, timeout)
        bottom = content_bottom(png)
        if bottom < height - 8 or height >= MAX_HEIGHT:
            break
        height = min(MAX_HEIGHT, 2 * height)  # content reached the window's edge: the page is taller
    with Image.open(png) as im:
        im.crop((0, 0, width, min(height, bottom + 32))).save(png)
    return png


def main(argv: list[str] | None = None) -> int:
    """Command line: html, png, --width; one-line errors, exit 2 for bad input and 1 for a failed render."""
    parser = argparse.ArgumentParser(
        prog="python -m gptlab.compare.render.screenshot", description=__doc__.splitlines()[0]
    )
    parser.add_argument("html", type=Path, help="the report to render (comparison.html)")
    parser.add_argument("png", type=Path, help="where to write the PNG")
    parser.add_argument("--width", type=int, default=1400, help="page width in pixels (default 1400)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds Chromium may take (default 120)")
    args = parser.parse_args(argv)
    try:
        out = screenshot(args.html, args.png, args.width, args.timeout)
    except ConfigError as exc:
        print(f"screenshot: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"screenshot: error: {exc}", file=sys.stderr)
        return 1
    with Image.open(out) as im:
        print(f"wrote {out} ({im.width}x{im.height})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
