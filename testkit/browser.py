"""Headless Chromium for the dashboard tests and the screenshot in results/ (Debian's `chromium`).

`dump_dom` returns the DOM Chromium renders; `screenshot` writes a PNG of the page;
`colour_pixels` counts the pixels of a given colour in a PNG, which is how a test checks
that the rendered page shows its elements (badges, curves) and not merely that the HTML
names them. Background networking is off: the browser talks to the page's host only.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
         "--hide-scrollbars", "--force-device-scale-factor=1")


class BrowserMissing(RuntimeError):
    pass


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        raise BrowserMissing("Debian chromium is not installed; `make setup` installs it (deploy/install_system.sh)")
    return exe


def _run(*args: str, timeout: float = 90.0) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="gt-chromium-") as profile:
        out = subprocess.run([_chromium(), *FLAGS, f"--user-data-dir={profile}", *args],
                             capture_output=True, timeout=timeout, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"chromium failed ({out.returncode}): {out.stderr[-2000:]}")
    return out


def dump_dom(url: str) -> str:
    return _run("--dump-dom", url).stdout


def screenshot(url: str, png: Path, width: int = 1400, height: int = 1000) -> Path:
    png = Path(png).resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    _run(f"--screenshot={png}", f"--window-size={width},{height}", "--virtual-time-budget=2000", url)
    if not png.is_file():
        raise RuntimeError(f"chromium wrote no screenshot to {png}")
    return png


def colour_pixels(png: Path, rgb: tuple[int, int, int], tolerance: int = 12) -> int:
    """Pixels of `png` within `tolerance` of `rgb` on every channel."""
    from PIL import Image

    with Image.open(png) as image:
        pixels = image.convert("RGB").getdata()
        return sum(1 for p in pixels if all(abs(a - b) <= tolerance for a, b in zip(p, rgb)))


def colour_rows(png: Path, rgb: tuple[int, int, int], tolerance: int = 12) -> list[tuple[int, int]]:
    """Bands of consecutive image rows holding that colour: (first row, last row) each, e.g.
    one band per badge of a table column."""
    from PIL import Image

    with Image.open(png) as image:
        image = image.convert("RGB")
        w, h = image.size
        data = image.load()
        hit = [any(all(abs(a - b) <= tolerance for a, b in zip(data[x, y], rgb)) for x in range(0, w, 2))
               for y in range(h)]
    bands, start = [], None
    for y, on in enumerate(hit + [False]):
        if on and start is None:
            start = y
        elif not on and start is not None:
            bands.append((start, y - 1))
            start = None
    return bands
