"""The committee dashboard after N epochs nobody watched: prints ONE JSON line, writes the PNG.

A scripted 4-member committee (testkit.dashboard: real consensus, epochs and reputation; scripted
reference model and model nodes, one honest and one cheating) runs N epochs while node 0's
dashboard records history without page views; then headless Chromium screenshots the page
into results/dashboard.png (or the path given).

    .venv/bin/python bench/dashboard.py [EPOCHS] [PNG]
    .venv/bin/python bench/dashboard.py --tiny     # 1 epoch, the PNG in a temporary folder
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from testkit import browser
from testkit.dashboard import watched_committee
from verifier.dashboard import CURVE_RGB, TRUSTED_RGB, UNTRUSTED_RGB

ROOT = Path(__file__).resolve().parents[1]


async def main(epochs: int, png: Path) -> dict:
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gt-dashboard-") as tmp:
        async with watched_committee(Path(tmp), epochs, timeout=60.0 * epochs) as w:
            took = time.monotonic() - t0
            points = {name: list(w.live.history.reputations(ident.node_id_hex))
                      for name, ident in (("honest", w.honest), ("cheat", w.cheat))}
            await asyncio.to_thread(browser.screenshot, w.url, png)
    return {"bench": "dashboard", "epochs": epochs, "seconds": round(took, 1),
            "reputation": {k: [round(v, 3) for v in vs] for k, vs in points.items()},
            "screenshot": str(png), "curve_pixels": browser.colour_pixels(png, CURVE_RGB),
            "trusted_badges": len(browser.colour_rows(png, TRUSTED_RGB)),
            "untrusted_badges": len(browser.colour_rows(png, UNTRUSTED_RGB))}


if __name__ == "__main__":
    if sys.argv[1:] == ["--tiny"]:
        n, out = 1, Path(tempfile.mkdtemp(prefix="gt-dashboard-png-")) / "dashboard.png"
    else:
        n = int(sys.argv[1]) if len(sys.argv) > 1 else 5
        out = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "results" / "dashboard.png"
    print(json.dumps(asyncio.run(main(n, out))), flush=True)
