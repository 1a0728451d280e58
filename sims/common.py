"""Output plumbing shared by the simulators: one result table -> CSV, markdown, PNG.

Every simulator produces the same shape of result, a long table of rows
``(system, x, metric...)``; keeping the writers here means the three simulators only
describe their model, and their figures look alike (one line per system, side by side).
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: one colour per system, the same in every figure
SYSTEM_COLORS = {"onion": "C0", "garlic_cast": "C1", "gentorrent": "C2", "gentorrent_static": "C2",
                 "gentorrent_per_hop": "C3", "gentorrent_repair": "C3", "gentorrent_sealed": "C3",
                 "gentorrent_acks_e2e": "C7"}

#: repository root (sims/ sits directly under it)
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT_DIR = REPO_ROOT / "results" / "sims"


class SimArgumentError(ValueError):
    """A simulator parameter is out of its domain."""


@dataclass(frozen=True)
class Table:
    """A result table: column names and rows of equal length."""

    columns: tuple[str, ...]
    rows: tuple[tuple[object, ...], ...]

    def column(self, name: str) -> list[object]:
        i = self.columns.index(name)
        return [r[i] for r in self.rows]

    def select(self, **where: object) -> list[dict[str, object]]:
        """Rows (as dicts) whose named columns equal the given values."""
        out = []
        for r in self.rows:
            d = dict(zip(self.columns, r))
            if all(d[k] == v for k, v in where.items()):
                out.append(d)
        return out


def fraction_grid(text: str) -> np.ndarray:
    """Parse ``"0:0.3:0.025"`` (start:stop:step, stop included) or ``"0,0.05,0.1"``."""
    try:
        if ":" in text:
            start, stop, step = (float(x) for x in text.split(":"))
            if step <= 0:
                raise SimArgumentError("grid step must be positive")
            count = int(round((stop - start) / step)) + 1
            grid = start + step * np.arange(count)
        else:
            grid = np.array([float(x) for x in text.split(",") if x.strip()])
    except ValueError as exc:
        raise SimArgumentError(f"bad grid {text!r}: {exc}") from exc
    if grid.size == 0 or grid.size > 1000:
        raise SimArgumentError(f"grid {text!r} must hold 1..1000 values")
    if np.any(grid < 0) or np.any(grid > 1):
        raise SimArgumentError(f"fractions must lie in [0, 1]: {text!r}")
    return np.round(grid, 10)


def base_parser(description: str, name: str) -> argparse.ArgumentParser:
    """Arguments every simulator has: runs, seed, output folder, quiet."""
    p = argparse.ArgumentParser(prog=f"python -m sims.{name}", description=description,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--runs", type=int, help="Monte Carlo runs per point")
    p.add_argument("--seed", type=int, default=1,
                   help="seed of numpy's PCG64; same seed, same figures")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT_DIR, help="output folder")
    p.add_argument("--no-plot", action="store_true", help="write CSV and markdown only")
    return p


def require(cond: bool, message: str) -> None:
    if not cond:
        raise SimArgumentError(message)


def write_csv(table: Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(table.columns)
        for r in table.rows:
            w.writerow([_fmt(v) for v in r])


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    head = "| " + " | ".join(columns) + " |"
    sep = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(_fmt(v) for v in r) + " |" for r in rows]
    return "\n".join([head, sep, *body]) + "\n"


def pivot(table: Table, x: str, series: str, value: str,
          xs: Sequence[object] | None = None) -> tuple[list[str], list[list[object]]]:
    """Wide form: one row per x, one column per series (for markdown)."""
    names = list(dict.fromkeys(table.column(series)))
    xs = list(dict.fromkeys(table.column(x))) if xs is None else list(xs)
    cells = {(d[x], d[series]): d[value] for d in table.select()}
    rows = [[xv, *[cells.get((xv, s), "") for s in names]] for xv in xs]
    return [x, *names], rows


def plot_lines(path: Path, curves: Mapping[str, tuple[Sequence[float], Sequence[float]]], *,
               title: str, xlabel: str, ylabel: str, ylim: tuple[float, float] | None = None,
               styles: Mapping[str, str] | None = None, hlines: Mapping[str, float] | None = None,
               vlines: Mapping[str, float] | None = None, legend_loc: str = "best",
               logx: bool = False, colors: Mapping[str, str] | None = None) -> None:
    """One PNG, one line per system (Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 4.4), dpi=120)
    markers = "osD^v<>px*"
    for i, (label, (xs, ys)) in enumerate(curves.items()):
        style = (styles or {}).get(label, "-")
        every = max(1, len(xs) // 12)
        ax.plot(xs, ys, style, label=label, marker=markers[i % len(markers)], markevery=every,
                markersize=4, linewidth=1.6, color=(colors or {}).get(label, f"C{i % 10}"))
    for label, y in (hlines or {}).items():
        ax.axhline(y, color="grey", linestyle=":", linewidth=1)
        ax.annotate(label, (1.0, y), xycoords=("axes fraction", "data"),
                    textcoords="offset points", xytext=(-22, -10), fontsize=8, color="grey")
    for label, xv in (vlines or {}).items():
        ax.axvline(xv, color="grey", linestyle=":", linewidth=1)
        ax.annotate(label, (xv, ax.get_ylim()[0]), textcoords="offset points", xytext=(3, 4),
                    fontsize=8, color="grey", rotation=90)
    if logx:
        ax.set_xscale("log")
    if ylim:
        ax.set_ylim(*ylim)
    ax.set_title(title, fontsize=11)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc=legend_loc)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def progress(message: str) -> None:
    """Progress on stderr so stdout stays the summary."""
    print(message, file=sys.stderr, flush=True)


def run_main(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """Turn a SimArgumentError into a clear CLI error (exit 2), like argparse does."""
    try:
        return main(argv)
    except SimArgumentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _fmt(v: object) -> str:
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.4f}"
    return str(v)
