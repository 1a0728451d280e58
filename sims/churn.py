"""Survival of a user's ability to ask under churn (paper §5.2): 3,119 users, 200 leave per minute.

Model
-----
The network keeps N users online: every minute, r departures happen at uniformly random
instants, each of a uniformly random online user, and each leaver is at once replaced by a newcomer
(a new identity, so paths through the leaver are gone for good). A user builds its paths at
t = 0 from relays drawn uniformly among the online users; a path is alive while all its relays
are online (the model node and the asking user stay). A request at time t *survives* when the
user can send it and decode the reply: at least k of its n paths are alive at t (and, with
``--request-s``, stay alive until t + request_s). Systems:

* ``onion``: one path of ``SIMS.onion_path_length`` relays (k = n = 1).
* ``garlic_cast``: n cloves over random walks of ``SIMS.garlic_walk_hops`` hops, any k decode;
  the walks (proxies) are found once.
* ``gentorrent_static``: the paper's Fig. 14 setting, n paths of l relays, k of n, no new proxies.
* ``gentorrent_repair``: ours (ARCHITECTURE.md §3.2): a path whose relay left is rebuilt from the
  online users as soon as the user learns of it, ``SIMS.repair_detect_s`` after the relay left
  (its neighbour sees the stream drop and the user rebuilds; before that, the user may still
  send on the dead path), and every path is renewed every ``CLOVES.path_renewal_s``. Spare
  proxies (N > n, ``CLOVES.proxies_kept``) only shorten that delay, so they are folded into it.

Assumptions: departures are memoryless (each online user is equally likely to leave next,
whatever its age), relays are drawn with replacement, path building is instantaneous, the
whole path fails with any of its relays, no relay is malicious. Runs are independent churn
schedules; each run evaluates all N users as senders. numpy PCG64, seeded.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from gentorrent.config import CLOVES, SIMS
from sims.common import (
    SYSTEM_COLORS, SimArgumentError, Table, base_parser, markdown_table, plot_lines, progress,
    require, run_main, write_csv,
)

MARK_MINUTES = (0, 1, 2, 5, 10, 15, 20, 25, 30)


@dataclass(frozen=True)
class System:
    name: str
    label: str
    paths: int
    hops: int
    k: int
    repair: bool


def systems(n: int, k: int, l: int, onion_l: int, walk_hops: int) -> list[System]:
    return [
        System("onion", f"onion (1 path, {onion_l} hops)", 1, onion_l, 1, False),
        System("garlic_cast", f"Garlic Cast ({n} walks of {walk_hops}, k={k})", n, walk_hops, k,
               False),
        System("gentorrent_static", f"GenTorrent, no new proxies (paper, n={n}, k={k}, l={l})",
               n, l, k, False),
        System("gentorrent_repair", f"GenTorrent + path repair (ours, n={n}, k={k}, l={l})",
               n, l, k, True),
    ]


class ChurnSchedule:
    """Who leaves when: r departures per minute at random instants, random online slots."""

    def __init__(self, users: int, leaves_per_min: int, horizon_s: float,
                 rng: np.random.Generator) -> None:
        minutes = int(np.ceil(horizon_s / 60.0)) + 1
        times = (np.arange(minutes)[:, None] * 60.0
                 + rng.random((minutes, leaves_per_min)) * 60.0).ravel()
        slots = rng.integers(0, users, size=times.size)
        self.users = users
        self._span = minutes * 60.0 + 1.0
        self._keys = np.sort(slots * self._span + times)

    def next_departure(self, slots: np.ndarray, after: np.ndarray | float) -> np.ndarray:
        """When the occupant of each slot, present at ``after``, leaves (inf: not in horizon)."""
        after = np.broadcast_to(np.asarray(after, dtype=float), slots.shape)
        q = slots * self._span + after
        i = np.searchsorted(self._keys, q, side="right")
        found = np.take(self._keys, np.minimum(i, self._keys.size - 1))
        same_slot = (i < self._keys.size) & (np.floor(found / self._span) == slots)
        return np.where(same_slot, found - slots * self._span, np.inf)

    def path_deaths(self, shape: tuple[int, ...], hops: int, built_at: np.ndarray | float,
                    rng: np.random.Generator) -> np.ndarray:
        """Build paths of ``hops`` random relays at ``built_at``; the instant each one breaks."""
        relays = rng.integers(0, self.users, size=(*shape, hops))
        t0 = np.asarray(built_at, dtype=float)[..., None] if np.ndim(built_at) else built_at
        return self.next_departure(relays, t0).min(axis=-1)


def survives(alive_paths: np.ndarray, k: int) -> np.ndarray:
    """A request survives when at least k of its paths are alive (last axis: paths)."""
    return alive_paths.sum(axis=-1) >= k


def static_survival(schedule: ChurnSchedule, system: System, grid_s: np.ndarray,
                    request_s: float, rng: np.random.Generator) -> np.ndarray:
    """Share of users whose fixed paths still carry a request at each grid time."""
    deaths = schedule.path_deaths((schedule.users, system.paths), system.hops, 0.0, rng)
    alive = deaths[None, :, :] > (grid_s + request_s)[:, None, None]
    return survives(alive, system.k).mean(axis=1)


def repair_survival(schedule: ChurnSchedule, system: System, grid_s: np.ndarray,
                    request_s: float, detect_s: float, renewal_s: float,
                    rng: np.random.Generator) -> np.ndarray:
    """Share of users able to ask at each grid time when broken paths are rebuilt.

    Each path slot is a sequence of instances [built, next build): an instance dies at ``death``
    and is replaced at min(death + detect_s, next renewal instant).
    """
    shape = (schedule.users, system.paths)
    built = np.zeros(shape)
    death = schedule.path_deaths(shape, system.hops, built, rng)
    alive_at = np.zeros((grid_s.size, *shape), dtype=bool)
    horizon = float(grid_s[-1]) if grid_s.size else 0.0
    active = np.ones(shape, dtype=bool)
    while active.any():
        renew = (np.floor(built / renewal_s) + 1.0) * renewal_s
        replaced = np.minimum(death + detect_s, renew)
        # grid times this instance serves: built <= t < replaced
        lo = np.searchsorted(grid_s, built, side="left")
        hi = np.searchsorted(grid_s, replaced, side="left")
        for g in range(int(lo[active].min()), int(hi[active].max()) if active.any() else 0):
            serving = active & (lo <= g) & (g < hi)
            alive_at[g] |= serving & (death > grid_s[g] + request_s)
        active = active & (replaced <= horizon)
        built = np.where(active, replaced, built)
        fresh = schedule.path_deaths(shape, system.hops, built, rng)
        death = np.where(active, fresh, death)
    return survives(alive_at, system.k).mean(axis=1)


def run(*, users: int, leaves_per_min: int, duration_min: float, step_s: float, n: int, k: int,
        l: int, onion_l: int, walk_hops: int, runs: int, seed: int, detect_s: float,
        renewal_s: float, request_s: float) -> Table:
    grid = np.arange(0.0, duration_min * 60.0 + 1e-9, step_s)
    horizon = grid[-1] + request_s + detect_s + 60.0
    acc = {s.name: np.zeros(grid.size) for s in systems(n, k, l, onion_l, walk_hops)}
    for r in range(runs):
        rng = np.random.default_rng([seed, r])
        schedule = ChurnSchedule(users, leaves_per_min, horizon, rng)
        for s in systems(n, k, l, onion_l, walk_hops):
            if s.repair:
                acc[s.name] += repair_survival(schedule, s, grid, request_s, detect_s, renewal_s,
                                               rng)
            else:
                acc[s.name] += static_survival(schedule, s, grid, request_s, rng)
    rows = tuple((name, float(t / 60.0), float(v / runs))
                 for name, curve in acc.items() for t, v in zip(grid, curve))
    return Table(("system", "minute", "survival"), rows)


def sweep(rates: list[int], *, minute: float, runs: int, **kw: object) -> Table:
    """Survival at ``minute`` and the worst over the run, for each churn rate (leaves/min)."""
    rows = []
    for rate in rates:
        t = run(leaves_per_min=rate, runs=runs, **kw)  # type: ignore[arg-type]
        for name in dict.fromkeys(t.column("system")):
            sel = t.select(system=name)
            at = min(sel, key=lambda d: abs(float(d["minute"]) - minute))["survival"]
            rows.append((name, rate, at, min(float(d["survival"]) for d in sel)))
    return Table(("system", "leaves_per_min", "survival_at_minute", "survival_worst"),
                 tuple(rows))


def static_survival_analytic(system: System, users: int, leaves_per_min: float,
                             minutes: float) -> float:
    """Closed form for paths that are never rebuilt: P(at least k of n paths alive)."""
    q = relay_survival(users, leaves_per_min, minutes) ** system.hops
    n = system.paths
    return float(sum(math.comb(n, j) * q**j * (1 - q) ** (n - j)
                     for j in range(system.k, n + 1)))


def max_churn_for(system: System, users: int, minutes: float, target: float) -> float:
    """Largest churn (leaves/min) at which static paths still reach ``target`` at ``minutes``."""
    lo, hi = 0.0, float(users)
    for _ in range(60):
        mid = (lo + hi) / 2
        if static_survival_analytic(system, users, mid, minutes) >= target:
            lo = mid
        else:
            hi = mid
    return lo


def _path_survival_where_k_of_n_equals_one_path(n: int, k: int) -> float:
    """q at which P(at least k of n paths alive) = q (one path); 1.0 if k of n never wins."""
    def gain(q: float) -> float:
        return sum(math.comb(n, j) * q**j * (1 - q) ** (n - j) for j in range(k, n + 1)) - q
    lo, hi = 1e-9, 1.0 - 1e-9
    if gain(hi) <= 0:
        return 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if gain(mid) > 0 else (mid, hi)
    return hi


def relay_survival(users: int, leaves_per_min: float, minutes: float) -> float:
    """Chance that a given online user is still there after ``minutes`` whole minutes."""
    return (1.0 - 1.0 / users) ** (leaves_per_min * minutes)


def main(argv: list[str] | None = None) -> int:
    p = base_parser(__doc__.splitlines()[0], "churn")
    p.add_argument("--N", type=int, default=SIMS.churn_users, help="online users")
    p.add_argument("--churn", type=int, default=SIMS.churn_leaves_per_min,
                   help="users leaving (and joining) per minute")
    p.add_argument("--duration", type=float, default=SIMS.churn_duration_min, help="minutes")
    p.add_argument("--step-s", type=float, default=10.0, help="seconds between curve points")
    p.add_argument("--n", type=int, default=CLOVES.n)
    p.add_argument("--k", type=int, default=CLOVES.k)
    p.add_argument("--l", type=int, default=CLOVES.path_length)
    p.add_argument("--onion-l", type=int, default=SIMS.onion_path_length)
    p.add_argument("--walk-hops", type=int, default=SIMS.garlic_walk_hops)
    p.add_argument("--detect-s", type=float, default=SIMS.repair_detect_s,
                   help="repair: seconds from a relay leaving to the rebuilt path")
    p.add_argument("--renewal-s", type=float, default=CLOVES.path_renewal_s,
                   help="repair: every path is renewed this often")
    p.add_argument("--request-s", type=float, default=0.0,
                   help="paths must stay alive this long after the request is sent")
    p.add_argument("--sweep", default="10,25,50,100,200,400",
                   help="churn rates (leaves/min) of the second figure; '' to skip it")
    p.add_argument("--sweep-minute", type=float, default=15.0)
    p.add_argument("--sweep-runs", type=int, default=5)
    p.set_defaults(runs=20)
    a = p.parse_args(argv)
    require(2 <= a.N <= 1_000_000, "--N must lie in 2..1,000,000")
    require(0 <= a.churn <= a.N, "--churn must lie in 0..N")
    require(0 < a.duration <= 24 * 60, "--duration must lie in (0, 1440] minutes")
    require(1.0 <= a.step_s <= 600.0, "--step-s must lie in 1..600")
    require(1 <= a.k <= a.n <= 64, "need 1 <= k <= n <= 64")
    require(1 <= a.l <= 64 and 1 <= a.onion_l <= 64 and 1 <= a.walk_hops <= 64,
            "path lengths must lie in 1..64")
    require(0 <= a.detect_s <= 3600 and 0 <= a.request_s <= 3600, "times must lie in 0..3600 s")
    require(a.renewal_s > 0, "--renewal-s must be positive")
    require(1 <= a.runs <= 10_000, "--runs must lie in 1..10,000")
    try:
        rates = [int(x) for x in a.sweep.split(",") if x.strip()]
    except ValueError as exc:
        raise SimArgumentError(f"bad --sweep {a.sweep!r}: {exc}") from exc
    require(len(rates) <= 50 and all(0 <= r <= a.N for r in rates),
            "--sweep takes at most 50 rates in 0..N")
    require(1 <= a.sweep_runs <= 1_000, "--sweep-runs must lie in 1..1,000")
    t0 = time.monotonic()
    progress(f"churn: N={a.N} churn={a.churn}/min n={a.n} k={a.k} l={a.l} runs={a.runs}")
    table = run(users=a.N, leaves_per_min=a.churn, duration_min=a.duration, step_s=a.step_s,
                n=a.n, k=a.k, l=a.l, onion_l=a.onion_l, walk_hops=a.walk_hops, runs=a.runs,
                seed=a.seed, detect_s=a.detect_s, renewal_s=a.renewal_s, request_s=a.request_s)
    a.out.mkdir(parents=True, exist_ok=True)
    write_csv(table, a.out / "churn.csv")
    labels = {s.name: s.label for s in systems(a.n, a.k, a.l, a.onion_l, a.walk_hops)}
    curve = {s: ([d["minute"] for d in table.select(system=s)],
                 [d["survival"] for d in table.select(system=s)]) for s in labels}
    marks = [m for m in MARK_MINUTES if m <= a.duration]
    rows = []
    for m in marks:
        row: list[object] = [m]
        for s in labels:
            xs, ys = curve[s]
            row.append(ys[int(np.argmin(np.abs(np.asarray(xs) - m)))])
        row.append(relay_survival(a.N, a.churn, m))
        rows.append(row)
    for what, fn in (("worst", min), ("mean", lambda v: sum(v) / len(v))):
        rows.append([what, *[fn(curve[s][1]) for s in labels], ""])
    md = (f"# Churn: share of users able to ask (k of n paths alive), N = {a.N}, "
          f"{a.churn} leave/min\n\n"
          f"Command: `python -m sims.churn` (runs={a.runs}, seed={a.seed}, "
          f"detect_s={a.detect_s}, renewal_s={a.renewal_s}, request_s={a.request_s}). "
          f"Paper (Fig. 14): GenTorrent without new proxies > 0.8 after 15 min.\n\n"
          + markdown_table(["minute", *labels, "one relay (analytic)"], rows) + "\n"
          + "".join(f"- `{k_}`: {v}\n" for k_, v in labels.items()))
    static = {s.name: s for s in systems(a.n, a.k, a.l, a.onion_l, a.walk_hops)}
    gt = static["gentorrent_static"]
    r80 = max_churn_for(gt, a.N, 15.0, 0.8)
    q_even = _path_survival_where_k_of_n_equals_one_path(gt.paths, gt.k)
    md += (f"\nThe repair curve is exactly 1 at each renewal (every {a.renewal_s / 60:g} min). "
           f"Under this memoryless churn a relay is still there after 15 min with probability "
           f"{relay_survival(a.N, a.churn, 15):.3f}, so paths that are never rebuilt cannot "
           f"reach the paper's > 0.8: GenTorrent without new proxies keeps 0.8 at 15 min only "
           f"up to {r80:.1f} leaves/min (closed form). Needing k of n paths, it beats one onion "
           f"path only while a path survives with probability above {q_even:.2f}, and Garlic "
           f"Cast's "
           f"six-hop walks always fail first.\n")
    (a.out / "churn.md").write_text(md)
    if not a.no_plot:
        rep = curve["gentorrent_repair"][1]
        shown = dict(labels, gentorrent_repair=f"{labels['gentorrent_repair']}: "
                     f"worst {min(rep):.3f}, mean {sum(rep) / len(rep):.3f}")
        colors = {shown[s]: SYSTEM_COLORS[s] for s in labels}
        plot_lines(a.out / "churn.png", {shown[s]: c for s, c in curve.items()}, colors=colors,
                   styles={shown["gentorrent_repair"]: "--"}, ylim=(0.0, 1.02),
                   title=f"Survival under churn: N = {a.N}, {a.churn} users leave/min",
                   xlabel="minutes since the paths were built",
                   ylabel="share of users whose request survives",
                   hlines={"0.99": 0.99}, legend_loc="center right")
    if rates:
        progress(f"churn: sweep over {rates} leaves/min, {a.sweep_runs} runs each")
        sw = sweep(rates, minute=a.sweep_minute, runs=a.sweep_runs, users=a.N,
                   duration_min=a.duration, step_s=a.step_s, n=a.n, k=a.k, l=a.l,
                   onion_l=a.onion_l, walk_hops=a.walk_hops, seed=a.seed, detect_s=a.detect_s,
                   renewal_s=a.renewal_s, request_s=a.request_s)
        write_csv(sw, a.out / "churn_sweep.csv")
        srows = [[r, *[sw.select(system=s, leaves_per_min=r)[0][col] for s in labels
                       for col in ("survival_at_minute", "survival_worst")]] for r in rates]
        scols = ["leaves/min", *[f"{s} {c}" for s in labels
                                 for c in (f"@{a.sweep_minute:g}min", "worst")]]
        md += (f"\n## Survival at minute {a.sweep_minute:g} and worst over {a.duration:g} min, "
               f"by churn rate ({a.sweep_runs} runs each)\n\n" + markdown_table(scols, srows))
        (a.out / "churn.md").write_text(md)
        if not a.no_plot:
            plot_lines(a.out / "churn_sweep.png",
                       {labels[s]: (rates, [sw.select(system=s, leaves_per_min=r)[0][
                           "survival_worst" if s == "gentorrent_repair" else
                           "survival_at_minute"] for r in rates]) for s in labels},
                       styles={labels["gentorrent_repair"]: "--"}, ylim=(0.0, 1.02),
                       colors={labels[s]: SYSTEM_COLORS[s] for s in labels},
                       title=f"Survival after {a.sweep_minute:g} min (repair: worst moment) "
                             f"vs. churn, N = {a.N}",
                       xlabel="users leaving per minute (log scale)",
                       ylabel="share of users whose request survives", logx=True,
                       hlines={"0.8": 0.8, "0.99": 0.99}, legend_loc="lower left")
    print(md)
    progress(f"churn: done in {time.monotonic() - t0:.1f} s -> {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
