"""Who colluders link to whom, as the code behaves: position tells, entry guards, shared proxies.

`sims/anonymity.py` is the paper's Appendix A4 (a static snapshot, relays that do not know
their position, paths never reused). This simulator follows what the code does over a day (or
30 days) and what a colluding set learns from it:

* **Colluders**: a fraction f of all user nodes (every user node is a relay) and, by default,
  the model node that serves the asks (`--honest-model` leaves it out). Colluders share what
  they see at once.
* **Senders**: `--observed` honest users, each asking unrelated questions (no sessions) as a
  Poisson process of `--asks-per-day`. Users churn as in `sims/churn`: identities leave for good
  after a memoryless lifetime (mean `--lifetime-days`) and newcomers take their place, so a
  sender stops asking when it leaves, and a guard that leaves is replaced.
* **Paths as the code builds them** (`user_client/paths.py`, `user_client/asking.py`): l relays
  per path, the last one the proxy; without fresh proxies a user keeps `kept` paths, renews them
  all every `renewal_s`, and each ask takes the n least-sent ones (ties at random), so all asks
  of a renewal period share proxies; with fresh proxies (`CLOVES.single_use_paths`) every ask
  gets n paths no other ask used. Relays are drawn distinct within a user's live paths (the
  code's least-used-first rule); with entry guards hop 1 of every path is the user's first
  guard (`gentorrent/overlay/guards.py`), which changes when it leaves or at its rotation.

What colluders learn about one ask (the four cloves of an ask leave the sender together, so
colluders on its paths link them by timing; the model node links them to the ask itself):

* **Position known** (no position defence, the code before 2026-12-02): every relay knows its
  position -- the proxy because it hands cloves to a model node, hop 1 because only the asker
  asks it for a hop-local ack, any hop from the reply delay once the model node tells its
  generation time (THREAT_MODEL.md). A colluding hop 1 names the sender of the ask.
* **Position hidden** (every relay asks for acks, the proxy holds forward, return and
  confirmation messages for a random time up to `OVERLAY.position_cover_s`): a relay knows
  only whether it is the proxy. Colluders of one ask still order themselves by timing
  (relative levels, assumed exact), so they know their absolute positions when a colluding
  proxy anchors them, when their levels span hop 1 to hop l-1, or when two colluders at the
  earliest level share their predecessor (only the sender precedes two paths' first hops).
  Otherwise a lone earliest colluder gives its predecessor probability 1 / (l - 1 - span).
* **Entry guards**: a guard knows it is one (its client builds every path through it for
  weeks), so a colluding guard names its client on every ask; a colluder further on knows it
  is not a guard, so its predecessor is not the sender. With the model node it learns the
  sender's guard, which links the asks it sees to each other (the Vanguards problem), not to
  the user.
* **Shared proxies**: the model node links asks that share a proxy; an ask linked to a named
  ask is linked to its user too.
* Without the model node, naming the sender of an ask needs a colluding proxy on it (the
  proxy sees the model node).

Figures: normalised entropy of the sender (A4's metric, `sims.anonymity.normalized_entropy`),
the share of asks named outright, the share linked to their user (named, or sharing proxies
with a named ask), the share of users with at least one ask linked over the horizon, and the
share of a user's ask pairs the adversary can tie together. Monte Carlo, numpy PCG64, seeded.
Assumptions: colluders are placed uniformly (Bernoulli(f) per draw for N > `EXACT_RELAYS`,
exact draws without replacement below); timing links among colluders are exact; the timing
advantage left under the cover holds (at most the hop latency over the hold's bound per
observation, THREAT_MODEL.md) is not counted; path repairs after churn are not modelled
(paths last at most one renewal period, far shorter than a lifetime); guards are never
offline for a while and back (a guard that leaves, leaves for good).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from gentorrent.config import CLOVES, GUARDS, SIMS
from sims.anonymity import normalized_entropy
from sims.common import (
    SimArgumentError, Table, base_parser, fraction_grid, markdown_table, pivot, plot_lines, progress, require,
    run_main, write_csv,
)

DAY_S = 24 * 3600.0
#: below this many relays, relays are drawn exactly (distinct ids, as the code's least-used rule)
EXACT_RELAYS = 256
#: users simulated together (bounds memory whatever --observed says)
CHUNK_USERS = 250


@dataclass(frozen=True)
class Policy:
    """Which defences the code runs."""

    name: str
    label: str
    hidden: bool  # relays do not learn their position from acks or timing
    guards: bool  # entry guards carry every path's first hop
    fresh: bool  # every ask over paths (proxies) no other ask used


POLICIES = (
    Policy("today", "the code before 2026-12-02: position known, first hops per path, 4 of 6 paths per ask", False, False, False),
    Policy("hidden", "position hidden only", True, False, False),
    Policy("guards", "entry guards only", False, True, False),
    Policy("fresh", "fresh proxies per ask only", False, False, True),
    Policy("all", "all three (fresh proxies are `CLOVES.single_use_paths`)", True, True, True),
    Policy("shipped", "what the code's defaults run: position hidden, entry guards "
                      f"{'on' if GUARDS.enabled else 'off'}, fresh proxies {'on' if CLOVES.single_use_paths else 'off'}",
           True, GUARDS.enabled, CLOVES.single_use_paths),
)
POLICY = {p.name: p for p in POLICIES}


@dataclass(frozen=True)
class Setup:
    """One network and its colluders."""

    users: int = SIMS.anonymity_users  # N: user nodes, every one a relay
    f: float = 0.1
    n: int = CLOVES.n
    l: int = CLOVES.path_length
    kept: int = CLOVES.proxies_kept
    renewal_s: float = CLOVES.path_renewal_s
    asks_per_day: float = SIMS.linkability_asks_per_day
    horizon_s: float = DAY_S
    observed: int = SIMS.linkability_observed
    lifetime_s: float = SIMS.linkability_lifetime_days * DAY_S  # inf: nobody leaves
    guard_life_s: tuple[float, float] = (GUARDS.lifetime_min_s, GUARDS.lifetime_max_s)
    model_colludes: bool = True
    # every sender asks at exactly these times (s) instead of as a Poisson process: how a test of
    # the real overlay asks, so that the simulator's interval is for the very same set-up
    ask_schedule: tuple[float, ...] | None = None

    @property
    def relays(self) -> int:
        """Relays a sender can draw: every other user node."""
        return self.users - 1

    @property
    def colluders(self) -> int:
        return min(int(round(self.f * self.users)), self.relays)


@dataclass
class Asks:
    """Every ask of one run, in (user, time) order, and what the adversary made of it."""

    user: np.ndarray  # (A,) sender index
    time: np.ndarray  # (A,) seconds
    named: np.ndarray  # (A,) the adversary names its sender outright
    q: np.ndarray  # (A,) the probability the adversary gives its best candidate
    linked: np.ndarray  # (A,) tied to its sender: named, or in one group with a named ask
    group: np.ndarray  # (A,) component of asks the adversary ties together
    proxy_group: np.ndarray  # (A,) asks the model node alone ties together (shared proxies)
    entropy: np.ndarray  # (A,) normalised entropy of the sender


# --------------------------------------------------------------------------- drawing relays


def draw_relays(rng: np.random.Generator, rows: int, slots: int, setup: Setup,
                avoid: np.ndarray | None = None) -> np.ndarray:
    """Relay ids (rows, slots), distinct within a row as far as the relays allow (the code's
    least-used-first rule), never `avoid[row]` (the guard, already on every path)."""
    if setup.relays <= EXACT_RELAYS:
        usable = setup.relays - (0 if avoid is None else 1)
        rounds = []
        for _ in range(-(-slots // max(usable, 1))):
            keys = rng.random((rows, setup.relays))
            if avoid is not None:
                keys[np.arange(rows), avoid] = np.inf  # sorted last, cut off
            rounds.append(np.argsort(keys, axis=1)[:, :usable])
        return np.concatenate(rounds, axis=1)[:, :slots]
    ids = rng.integers(0, setup.relays, size=(rows, slots))
    if avoid is not None:  # the guard is one of N - 1: move the rare hit to another relay
        hit = ids == avoid[:, None]
        ids[hit] = (ids[hit] + rng.integers(1, setup.relays, size=int(hit.sum()))) % setup.relays
    return ids


def guard_epochs(rng: np.random.Generator, users: int, setup: Setup) -> tuple[np.ndarray, np.ndarray]:
    """Each user's guards over the horizon: (start times, guard ids), padded with inf / -1.

    A guard is used from its start until it leaves (memoryless, mean lifetime) or rotates
    (uniform in the guard lifetime range), whichever comes first; then the next one."""
    starts, ids = [np.zeros(users)], [rng.integers(0, setup.relays, size=users)]
    current = np.zeros(users)
    while True:
        leave = rng.exponential(setup.lifetime_s, size=users) if math.isfinite(setup.lifetime_s) \
            else np.full(users, np.inf)
        rotate = rng.uniform(*setup.guard_life_s, size=users)
        current = current + np.minimum(leave, rotate)
        if not (current < setup.horizon_s).any():
            break
        starts.append(np.where(current < setup.horizon_s, current, np.inf))
        ids.append(np.where(current < setup.horizon_s, rng.integers(0, setup.relays, size=users), -1))
    return np.stack(starts, axis=1), np.stack(ids, axis=1)


def ask_times(rng: np.random.Generator, users: int, setup: Setup) -> tuple[np.ndarray, np.ndarray]:
    """(user, time) of every ask, sorted: Poisson asks until the user leaves or the horizon
    (or the set-up's fixed schedule, for every user)."""
    if setup.ask_schedule is not None:
        times = np.sort(np.asarray(setup.ask_schedule, dtype=float))
        return np.repeat(np.arange(users), times.size), np.tile(times, users)
    leaves = rng.exponential(setup.lifetime_s, size=users) if math.isfinite(setup.lifetime_s) \
        else np.full(users, np.inf)
    active = np.minimum(leaves, setup.horizon_s)
    counts = rng.poisson(setup.asks_per_day * active / DAY_S)
    user = np.repeat(np.arange(users), counts)
    t = rng.random(user.size) * active[user]
    order = np.lexsort((t, user))
    return user[order], t[order]


# --------------------------------------------------------------------------- paths of the asks


def _windows(user: np.ndarray, t: np.ndarray, setup: Setup) -> tuple[np.ndarray, np.ndarray, int]:
    """Renewal window of each ask (an index into the windows that hold asks) and its rank there."""
    key = user.astype(np.int64) * (1 + int(setup.horizon_s // setup.renewal_s)) + (t // setup.renewal_s).astype(np.int64)
    uniq, window = np.unique(key, return_inverse=True)
    first = np.searchsorted(key, uniq)  # asks are sorted by (user, time), so by key
    rank = np.arange(key.size) - first[window]
    return window, rank, uniq.size


def _pick(rng: np.random.Generator, window: np.ndarray, rank: np.ndarray, windows: int, setup: Setup) -> np.ndarray:
    """The n paths (of `kept`) each ask takes: the least sent first, ties at random (PathPool.pick)."""
    sends = np.zeros((windows, setup.kept))
    picked = np.empty((window.size, setup.n), dtype=np.int64)
    for j in range(int(rank.max()) + 1 if rank.size else 0):
        rows = np.flatnonzero(rank == j)  # one ask per window: no two rows touch one window
        w = window[rows]
        order = np.argsort(sends[w] + 0.5 * rng.random((rows.size, setup.kept)), axis=1)[:, :setup.n]
        picked[rows] = order
        np.add.at(sends, (np.repeat(w, setup.n), order.ravel()), 1.0)
    return picked


def path_colluders(rng: np.random.Generator, user: np.ndarray, t: np.ndarray, policy: Policy,
                   setup: Setup, guards: tuple[np.ndarray, np.ndarray] | None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every ask: which hops of its n paths collude (A, n, l), its proxy group (asks that
    share proxies share a group), and the id of the guard it went through (-1 without)."""
    a, bad = user.size, setup.colluders
    guard = np.full(a, -1, dtype=np.int64)
    if guards is not None:
        starts, ids = guards
        epoch = (starts[user] <= t[:, None]).sum(axis=1) - 1
        guard = ids[user, epoch]
    hops = setup.l - (1 if policy.guards else 0)
    if policy.fresh:
        rows, slots = a, setup.n * hops
        avoid = guard if policy.guards else None
        relays = draw_relays(rng, rows, slots, setup, avoid).reshape(a, setup.n, hops)
        group = np.arange(a)
    else:
        window, rank, windows = _windows(user, t, setup)
        first = np.searchsorted(window, np.arange(windows))  # first ask of each window
        avoid = guard[first] if policy.guards else None
        built = draw_relays(rng, windows, setup.kept * hops, setup, avoid).reshape(windows, setup.kept, hops)
        picked = _pick(rng, window, rank, windows, setup)
        relays = built[window[:, None], picked]
        group = _proxy_groups(window, picked, setup)
    if policy.guards:
        relays = np.concatenate([np.broadcast_to(guard[:, None, None], (a, setup.n, 1)), relays], axis=2)
    return relays < bad, group, guard


def _proxy_groups(window: np.ndarray, picked: np.ndarray, setup: Setup) -> np.ndarray:
    """Asks of one window that share a path (transitively) are one group for the model node."""
    a = window.size
    nodes = window[:, None] * setup.kept + picked  # a (window, path) node per path used
    rows = np.repeat(np.arange(a), setup.n)
    graph = coo_matrix((np.ones(rows.size), (rows, a + nodes.ravel())),
                       shape=(a + nodes.max() + 1 if a else 0,) * 2)
    return connected_components(graph, directed=False)[1][:a] if a else np.zeros(0, dtype=np.int64)


# --------------------------------------------------------------------------- what colluders infer


def infer(bad: np.ndarray, policy: Policy, model_colludes: bool) -> tuple[np.ndarray, np.ndarray]:
    """(named, q) for asks whose colluding hops are `bad` (A, n, l): whether the adversary
    names the sender outright, and the probability it gives its best candidate for the sender.
    Without the model node, naming needs a colluding proxy on the ask (it sees the model node)."""
    a, n, l = bad.shape
    proxy = bad[:, :, l - 1].any(axis=1)
    if policy.guards:  # the guard knows its client; any other colluder knows it is not a guard
        named = bad[:, 0, 0].copy()
        q = named.astype(float)
    elif not policy.hidden:  # every relay knows its position: a colluding hop 1 names the sender
        named = bad[:, :, 0].any(axis=1)
        q = named.astype(float)
    else:  # colluders order themselves by timing; only anchors make the order absolute
        levels = bad[:, :, : l - 1].any(axis=1)  # (A, l-1): levels holding a non-proxy colluder
        has = levels.any(axis=1)
        low = np.argmax(levels, axis=1)
        high = (l - 2) - np.argmax(levels[:, ::-1], axis=1)
        shifts = (l - 1) - (high - low)  # absolute placements consistent with what they saw
        at_low = bad[np.arange(a), :, low].sum(axis=1)
        known = proxy | (at_low >= 2) | (shifts == 1)
        named = has & known & (low == 0)
        q = np.where(named, 1.0, np.where(has & ~known, 1.0 / np.maximum(shifts, 1), 0.0))
    if not model_colludes:
        named = named & proxy
    return named, q


def simulate(setup: Setup, policy: Policy, seed: int, point: int = 0) -> Asks:
    """Every ask of `setup.observed` senders over the horizon under `policy` (one run)."""
    parts = []
    for chunk, lo in enumerate(range(0, setup.observed, CHUNK_USERS)):
        users = min(CHUNK_USERS, setup.observed - lo)
        rng = np.random.default_rng([seed, point, chunk])
        user, t = ask_times(rng, users, setup)
        guards = guard_epochs(rng, users, setup) if policy.guards else None
        bad, group, guard = path_colluders(rng, user, t, policy, setup, guards)
        named, q = infer(bad, policy, setup.model_colludes)
        seen_guard = policy.guards & bad[:, :, 1:].any(axis=(1, 2)) & setup.model_colludes
        tied = _adversary_groups(user, group, guard, seen_guard, named)
        linked = _spread(named, tied)
        off = lo << 32
        parts.append((user + lo, t, named, q, linked, tied.astype(np.int64) + off, group.astype(np.int64) + off))
    user, t, named, q, linked, tied, group = (np.concatenate(x) for x in zip(*parts))
    base = normalized_entropy(np.zeros((1, 1)), setup.f, setup.users)[0]
    ent = np.full(q.size, base)
    if (q > 0).any():
        ent[q > 0] = normalized_entropy(q[q > 0, None], setup.f, setup.users)
    return Asks(user, t, named, q, linked, tied, group, ent)


def _adversary_groups(user: np.ndarray, proxy_group: np.ndarray, guard: np.ndarray,
                      seen_guard: np.ndarray, named: np.ndarray) -> np.ndarray:
    """Components of asks the adversary ties together: shared proxies, one guard seen by a
    colluder further on (with the model node), and every named ask of one user."""
    a = user.size
    if a == 0:
        return np.zeros(0, dtype=np.int64)
    big = int(user.max()) + 1
    keys = [proxy_group.astype(np.int64),
            np.where(seen_guard, guard * big + user, -1 - np.arange(a)),
            np.where(named, user, -1 - np.arange(a))]
    cols, offset = [], a
    for k in keys:
        _, inv = np.unique(k, return_inverse=True)
        cols.append(offset + inv)
        offset += inv.max() + 1
    rows = np.tile(np.arange(a), len(keys))
    graph = coo_matrix((np.ones(rows.size), (rows, np.concatenate(cols))), shape=(offset, offset))
    return connected_components(graph, directed=False)[1][:a]


def _spread(named: np.ndarray, group: np.ndarray) -> np.ndarray:
    """An ask in one group with a named ask is linked to its user."""
    if group.size == 0:
        return named.copy()
    hit = np.zeros(int(group.max()) + 1, dtype=bool)
    hit[group[named]] = True
    return hit[group]


# --------------------------------------------------------------------------- figures


@dataclass(frozen=True)
class Figures:
    entropy: float
    asks_named: float
    asks_linked: float
    users_linked: float
    pairs_linked: float  # of a user's ask pairs, the share the adversary ties together
    pairs_proxy: float  # ... that the model node alone ties by their proxies
    asks: int
    users: int

    @staticmethod
    def stderr(share: float, count: int) -> float:
        return math.sqrt(max(share * (1 - share), 0.0) / max(count, 1))


def figures(asks: Asks) -> Figures:
    """The run's figures: shares over asks, over users that asked, over a user's ask pairs."""
    if asks.user.size == 0:
        return Figures(1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0)
    users = np.unique(asks.user)
    per_user = np.zeros(int(users.max()) + 1, dtype=bool)
    per_user[asks.user[asks.linked]] = True
    counts = np.bincount(asks.user)
    pairs = float((counts * (counts - 1) // 2).sum())
    return Figures(float(asks.entropy.mean()), float(asks.named.mean()), float(asks.linked.mean()),
                   float(per_user[users].mean()), _tied_pairs(asks.group) / pairs if pairs else 0.0,
                   _tied_pairs(asks.proxy_group) / pairs if pairs else 0.0, int(asks.user.size),
                   int(users.size))


def _tied_pairs(group: np.ndarray) -> float:
    """Pairs of asks in one group (groups never span two users)."""
    sizes = np.unique(group, return_counts=True)[1]
    return float((sizes * (sizes - 1) // 2).sum())


def share_interval(setup: Setup, policy: Policy, what: str, runs: int, seed: int,
                   coverage: float = 0.99) -> tuple[float, float, float]:
    """(low, mean, high) of a figure over `runs` independent runs of one set-up: the interval a
    measurement of that set-up on the real overlay must fall into."""
    values = np.array([getattr(figures(simulate(setup, policy, seed, point=r)), what) for r in range(runs)])
    tail = (1 - coverage) / 2
    return float(np.quantile(values, tail)), float(values.mean()), float(np.quantile(values, 1 - tail))


def run(fs: Sequence[float], setup: Setup, policies: Sequence[Policy], seed: int) -> Table:
    rows = []
    for policy in policies:
        for i, f in enumerate(fs):
            fig = figures(simulate(replace(setup, f=float(f)), policy, seed, point=i))
            rows.append((policy.name, float(f), fig.entropy, fig.asks_named, fig.asks_linked,
                         fig.users_linked, Figures.stderr(fig.users_linked, fig.users), fig.pairs_linked,
                         fig.pairs_proxy, fig.asks, fig.users))
    return Table(("policy", "f", "entropy", "asks_named", "asks_linked", "users_linked", "users_stderr",
                  "pairs_linked", "pairs_proxy", "asks", "users"), tuple(rows))


def lifetime_sweep(lifetimes_days: Sequence[float], setup: Setup, policies: Sequence[Policy],
                   seed: int) -> Table:
    """Users ever linked over the horizon, as the nodes' identity lifetime varies."""
    rows = []
    for policy in policies:
        for i, days in enumerate(lifetimes_days):
            fig = figures(simulate(replace(setup, lifetime_s=days * DAY_S), policy, seed, point=100 + i))
            rows.append((policy.name, float(days), fig.users_linked, fig.asks_linked, fig.users))
    return Table(("policy", "lifetime_days", "users_linked", "asks_linked", "users"), tuple(rows))


def main(argv: list[str] | None = None) -> int:
    p = base_parser(__doc__.splitlines()[0], "linkability")
    p.add_argument("--N", type=int, default=SIMS.anonymity_users, help="user nodes (every one a relay)")
    p.add_argument("--f", default="0.01,0.05,0.1,0.2", help="colluding share of user nodes")
    p.add_argument("--observed", type=int, default=SIMS.linkability_observed, help="senders followed")
    p.add_argument("--asks-per-day", type=float, default=SIMS.linkability_asks_per_day)
    p.add_argument("--lifetime-days", type=float, default=SIMS.linkability_lifetime_days,
                   help="mean identity lifetime of a node (0: nobody leaves)")
    p.add_argument("--days", type=float, default=1.0, help="horizon of the f table")
    p.add_argument("--goal-days", type=float, default=30.0, help="horizon of the goal's figures")
    p.add_argument("--goal-f", type=float, default=0.1)
    p.add_argument("--sweep", default="7,30,90,365,0", help="lifetimes (days; 0 = nobody leaves) of the sweep")
    p.add_argument("--honest-model", action="store_true", help="the model node does not collude")
    a = p.parse_args(argv)
    require(3 <= a.N <= 10_000_000, "--N must lie in 3..10,000,000")
    require(1 <= a.observed <= 1_000_000, "--observed must lie in 1..1,000,000")
    require(0 < a.asks_per_day <= 10_000, "--asks-per-day must lie in (0, 10,000]")
    require(a.lifetime_days >= 0 and 0 < a.days <= 365 and 0 < a.goal_days <= 365,
            "lifetime >= 0, horizons in (0, 365] days")
    try:
        sweep = [float(x) for x in a.sweep.split(",") if x.strip()]
    except ValueError as exc:
        raise SimArgumentError(f"bad --sweep {a.sweep!r}: {exc}") from None
    require(len(sweep) <= 20 and all(x >= 0 for x in sweep), "--sweep takes at most 20 lifetimes >= 0")
    fs = fraction_grid(a.f)
    life = a.lifetime_days * DAY_S if a.lifetime_days > 0 else math.inf
    setup = Setup(users=a.N, observed=a.observed, asks_per_day=a.asks_per_day, lifetime_s=life,
                  horizon_s=a.days * DAY_S, model_colludes=not a.honest_model)
    t0 = time.monotonic()
    progress(f"linkability: N={a.N} observed={a.observed} asks/day={a.asks_per_day} "
             f"lifetime={a.lifetime_days} d, model node colludes: {setup.model_colludes}")
    table = run(fs, setup, POLICIES, a.seed)
    progress(f"linkability: f table done in {time.monotonic() - t0:.0f} s")
    goal = replace(setup, horizon_s=a.goal_days * DAY_S, f=a.goal_f)
    goal_rows = []
    for pol in POLICIES:
        fig = figures(simulate(goal, pol, a.seed, point=50))
        goal_rows.append((pol.name, fig.users_linked, fig.stderr(fig.users_linked, fig.users),
                          fig.asks_linked, fig.pairs_linked, fig.entropy))
    sweep_table = lifetime_sweep([x if x > 0 else math.inf for x in sweep], goal,
                                 [POLICY["guards"], POLICY["all"], POLICY["shipped"]], a.seed)
    progress(f"linkability: goal and sweep done in {time.monotonic() - t0:.0f} s")
    a.out.mkdir(parents=True, exist_ok=True)
    write_csv(table, a.out / "linkability.csv")
    write_csv(sweep_table, a.out / "linkability_lifetimes.csv")
    md = _markdown(a, table, goal_rows, sweep_table)
    (a.out / "linkability.md").write_text(md)
    if not a.no_plot:
        _plot(a, table)
    print(md)
    progress(f"linkability: done in {time.monotonic() - t0:.1f} s -> {a.out}")
    return 0


def _markdown(a, table: Table, goal_rows: list, sweep: Table) -> str:
    head = (f"# Linkability as the code behaves, N = {a.N}\n\n"
            f"Command: `python -m sims.linkability` (observed={a.observed}, asks/day={a.asks_per_day:g}, "
            f"mean node lifetime {a.lifetime_days:g} d, seed={a.seed}, the model node "
            f"{'honest' if a.honest_model else 'colluding'}). Policies:\n\n"
            + "".join(f"- `{p.name}`: {p.label}\n" for p in POLICIES)
            + "\nThe paper's A4 figure at f = 0.05: 0.965 (`sims/anonymity.py` 0.966); it assumes relays "
              "that never know their position and paths never reused.\n")
    parts = [head]
    for what, title in (("entropy", "normalised entropy of the sender (A4's metric), mean over asks"),
                        ("asks_named", "share of asks whose sender the adversary names"),
                        ("asks_linked", "share of asks linked to their sender (named, or sharing proxies / a seen guard with a named ask)"),
                        ("users_linked", f"share of users with an ask linked to them over {a.days:g} day(s)"),
                        ("pairs_linked", "share of a user's ask pairs the adversary ties together"),
                        ("pairs_proxy", "share of a user's ask pairs the model node alone ties by their proxies "
                                        "(two asks of different users: about n^2 / N)")):
        cols, rows = pivot(table, "f", "policy", what)
        parts.append(f"\n## {title}\n\n" + markdown_table(cols, rows))
    parts.append(f"\n## The goal: f = {a.goal_f:g} user nodes plus the model node, {a.goal_days:g} days\n\n"
                 "Tor's guard bound: at most the colluding share of users ever linked (one guard per "
                 "guard lifetime).\n\n"
                 + markdown_table(["policy", "users ever linked", "stderr", "asks linked", "ask pairs tied",
                                   "entropy"], goal_rows))
    cols, rows = pivot(sweep, "lifetime_days", "policy", "users_linked")
    parts.append(f"\n## Users ever linked over {a.goal_days:g} days vs the nodes' mean lifetime "
                 "(inf: nobody leaves)\n\nA guard that leaves is replaced by a fresh one: each guard a "
                 "user goes through is another draw of f.\n\n" + markdown_table(cols, rows))
    return "".join(parts)


def _plot(a, table: Table) -> None:
    curves = {f"{p.name}: users linked/day": ([d["f"] for d in table.select(policy=p.name)],
                                             [d["users_linked"] for d in table.select(policy=p.name)])
              for p in POLICIES}
    curves.update({f"{p.name}: asks linked": ([d["f"] for d in table.select(policy=p.name)],
                                              [d["asks_linked"] for d in table.select(policy=p.name)])
                   for p in (POLICY["today"], POLICY["shipped"])})
    styles = {k: "--" for k in curves if "asks" in k}
    plot_lines(a.out / "linkability.png", curves, styles=styles, ylim=(0.0, 1.02),
               title=f"Linked to their sender, N = {a.N} (model node colluding: {not a.honest_model})",
               xlabel="colluding share of user nodes f", ylabel="share", legend_loc="upper left")


if __name__ == "__main__":
    raise SystemExit(run_main(main))
