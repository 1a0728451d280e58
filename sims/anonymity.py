"""Sender anonymity under colluding relays: the normalized entropy of the paper's Appendix A4.

Model
-----
N users, a fraction f of them malicious and colluding; the sender is honest. A message leaves
the sender over one or more paths of relays drawn uniformly from the other N - 1 users (with
replacement, which for N = 10,000 and <= 24 relays equals placing fN malicious users at random).
On a path, a *chain* is a maximal run of consecutive malicious relays; its *predecessor* (the
node just before it: the sender for a chain at hop 1, else an honest relay) is the attacker's
candidate for the source. Appendix A4 gives each candidate the probability

    p = 1 / (L + 1 - c),     c = f L  (paper, default)   or   c = m  (``--count observed``),

L the relays on the path and m the malicious ones the attacker sees: the chain's predecessor is
one of the L + 1 - c honest nodes of the path, sender included. What is left, 1 - sum(p), is
spread evenly over the other (1 - f) N - |candidates| honest users, and the metric is the
entropy of that distribution over log2 N. Without a malicious relay the attacker knows only
that the sender is honest: (log2 (1 - f) N) / log2 N, which is 1 at f = 0.

What colluders can link decides which chains they reason about together (a *view*):

* ``onion``: one path of l relays (``SIMS.onion_path_length``); colluders on it link by
  circuit/timing, as A4 assumes. One view per message.
* ``garlic_cast``: cloves take random walks of ``SIMS.garlic_walk_hops`` hops; the cloves of a
  message are linkable across walks, so all chains on the k walks A4 counts form one view. A
  node that precedes several chains (the sender, when several first hops are malicious) is the
  candidate of each: its probabilities combine as 1 - prod(1 - p).
* ``gentorrent``: the paper's design. One path ID per path (the same on each hop), different
  IDs on different paths: colluders link chains on one path, never across paths. Each path is
  a view; the message's anonymity is the mean over its n paths (what an attacker can say about
  the source of a clove it holds).
* ``gentorrent_per_hop``: ours (ARCHITECTURE.md §3.2): a fresh link ID per hop, so two colluders on
  one path link only when adjacent. Each chain is its own view (with ``--count observed`` the
  attacker counts only that chain's relays); a path's anonymity is the mean over its chains.
  A relay does not know its position: acknowledgements end at the next hop, so it cannot time
  the model node (THREAT_MODEL.md), and a clove it tags dies at the next honest hop.
* ``gentorrent_acks_e2e``: the same design before hop-local acknowledgements (measured: with
  end-to-end acks every relay knew its position from their timing, and hop 1 and a colluding
  proxy linked by tagging). A path whose first relay is malicious names the sender (entropy
  0); a malicious relay further on knows its predecessor is not the sender (no information).

Assumptions: a static snapshot (no churn, no repeated observations of one path over time, no
intersection attacks across messages), a passive adversary, no traffic analysis beyond what a
view links, an honest model node. Monte Carlo with numpy's PCG64: the same seed gives the same
figures, and gentorrent / gentorrent_per_hop share their random draws (common random numbers),
so their difference is not noise.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from gentorrent.config import CLOVES, SIMS
from sims.common import (
    SYSTEM_COLORS, Table, base_parser, fraction_grid, markdown_table, pivot,
    plot_lines, progress, require, run_main, write_csv,
)

Linking = Literal["message", "path", "chain", "position"]
Count = Literal["paper", "observed"]
SOURCE = -1  # key of "the sender" among candidate predecessors (relay ids are >= 0)


@dataclass(frozen=True)
class System:
    """How a system routes one message and what its colluders can link."""

    name: str
    label: str
    paths: int  # paths observed per message
    hops: int  # relays per path
    linking: Linking


def systems(n: int, k: int, l: int, onion_l: int, walk_hops: int) -> list[System]:
    """The four systems of the figure for the given (n, k, l)."""
    return [
        System("onion", f"onion (1 path, {onion_l} hops; under GenTorrent when l = {onion_l})",
               1, onion_l, "path"),
        System("garlic_cast", f"Garlic Cast ({k} linked walks of {walk_hops})", k, walk_hops,
               "message"),
        System("gentorrent", f"GenTorrent (paper: path IDs, n={n}, l={l})", n, l, "path"),
        System("gentorrent_per_hop", f"GenTorrent, per-hop link IDs (ours, n={n}, l={l})", n, l,
               "chain"),
        System("gentorrent_acks_e2e", "GenTorrent with end-to-end acks (before; relays knew their position)",
               n, l, "position"),
    ]


def normalized_entropy(cand: np.ndarray, f: float, users: int) -> np.ndarray:
    """A4's normalized entropy for each row of candidate probabilities (0 = no candidate).

    The rest of the mass goes evenly to the (1 - f) N - |candidates| other honest users; if
    the candidates hold all of it (or no other honest user is left) they are renormalized.
    """
    cand = np.asarray(cand, dtype=float)
    g = (cand > 0).sum(axis=1)
    total = cand.sum(axis=1)
    pool = (1.0 - f) * users - g
    full = (total >= 1.0) | (pool <= 0)
    scale = np.where(full & (total > 0), total, 1.0)
    p = cand / scale[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.where(p > 0, p * np.log2(p), 0.0).sum(axis=1)
        rest = np.where(full, 0.0, 1.0 - total)
        h += np.where(rest > 0, -rest * np.log2(rest / np.maximum(pool, 1e-300)), 0.0)
    return h / np.log2(users)


def combine_duplicates(keys: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """Merge candidates with the same key in a row: p = 1 - prod(1 - p_i). Absent = prob 0."""
    rows, cols = keys.shape
    present = probs > 0
    # absent entries get keys that are unique and sort last, so they never merge
    big = np.iinfo(np.int64).max - cols
    k = np.where(present, keys, big + np.arange(cols)[None, :])
    order = np.argsort(k, axis=1, kind="stable")
    ks = np.take_along_axis(k, order, axis=1)
    with np.errstate(divide="ignore"):
        lq = np.log1p(-np.take_along_axis(np.where(present, probs, 0.0), order, axis=1))
    acc = np.empty_like(lq)
    acc[:, 0] = lq[:, 0]
    for j in range(1, cols):
        same = ks[:, j] == ks[:, j - 1]
        acc[:, j] = np.where(same, acc[:, j - 1] + lq[:, j], lq[:, j])
    last = np.ones_like(ks, dtype=bool)
    last[:, :-1] = ks[:, 1:] != ks[:, :-1]
    out = np.where(last, -np.expm1(acc), 0.0)
    return np.where(np.take_along_axis(present, order, axis=1), out, 0.0)


def entropy_of_placements(malicious: np.ndarray, relay_ids: np.ndarray, f: float, users: int,
                          linking: Linking, count: Count) -> np.ndarray:
    """Per-message normalized entropy for given placements, shape (runs, paths, hops) -> (runs,).

    ``relay_ids`` identify relays (so a relay on two linked walks is one candidate).
    """
    runs, paths, hops = malicious.shape
    if linking == "position":  # a relay that knows it is first names the sender; later ones learn nothing
        base = normalized_entropy(np.zeros((1, 1)), f, users)[0]
        return np.where(malicious[..., 0], 0.0, base).mean(axis=1)
    before = np.zeros_like(malicious)
    before[..., 1:] = malicious[..., :-1]
    starts = malicious & ~before
    pred = np.full(relay_ids.shape, SOURCE, dtype=np.int64)
    pred[..., 1:] = relay_ids[..., :-1]
    if linking == "chain":
        seen = _chain_lengths(malicious, starts) if count == "observed" else None
    else:
        seen = np.broadcast_to(malicious.sum(axis=2, keepdims=True), malicious.shape)
    c = f * hops if count == "paper" else seen
    p_chain = np.where(starts, 1.0 / np.maximum(hops + 1 - c, 1e-12), 0.0)
    p_chain = np.minimum(p_chain, 1.0)
    if linking == "message":
        cand = combine_duplicates(pred.reshape(runs, -1), p_chain.reshape(runs, -1))
        return normalized_entropy(cand, f, users)
    if linking == "path":
        cand = combine_duplicates(pred.reshape(runs * paths, hops),
                                  p_chain.reshape(runs * paths, hops))
        return normalized_entropy(cand, f, users).reshape(runs, paths).mean(axis=1)
    # chain: every chain is a view with one candidate; a path averages its chains
    per_chain = normalized_entropy(p_chain.reshape(-1, 1), f, users).reshape(malicious.shape)
    chains = starts.sum(axis=2)
    base = normalized_entropy(np.zeros((1, 1)), f, users)[0]
    per_path = np.where(chains > 0,
                        np.where(starts, per_chain, 0.0).sum(axis=2) / np.maximum(chains, 1),
                        base)
    return per_path.mean(axis=1)


def _chain_lengths(malicious: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """At each chain start, the length of the chain (elsewhere 0)."""
    hops = malicious.shape[-1]
    length = np.zeros(malicious.shape, dtype=np.int64)
    run = np.zeros(malicious.shape[:-1], dtype=np.int64)
    for h in range(hops - 1, -1, -1):  # run length of malicious relays from hop h onwards
        run = np.where(malicious[..., h], run + 1, 0)
        length[..., h] = run
    return np.where(starts, length, 0)


def sample_placements(system: System, f: float, users: int, runs: int,
                      rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Relays of ``runs`` messages: ids among the N - 1 other users, the first round(fN) bad."""
    bad = min(int(round(f * users)), users - 1)
    ids = rng.integers(0, users - 1, size=(runs, system.paths, system.hops), dtype=np.int64)
    return ids < bad, ids


def simulate(system: System, f: float, users: int, runs: int, seed: int, point: int,
             count: Count = "paper") -> tuple[float, float]:
    """Mean normalized entropy and its standard error for one system at one f.

    The generator is seeded by (seed, point, paths, hops): systems of the same shape share draws.
    """
    rng = np.random.default_rng([seed, point, system.paths, system.hops])
    h = np.empty(runs)
    for lo in range(0, runs, 50_000):  # bounded memory whatever --runs says
        hi = min(runs, lo + 50_000)
        mal, ids = sample_placements(system, f, users, hi - lo, rng)
        h[lo:hi] = entropy_of_placements(mal, ids, f, users, system.linking, count)
    return float(h.mean()), float(h.std(ddof=1) / np.sqrt(runs)) if runs > 1 else 0.0


def run(fs: Sequence[float], *, users: int, n: int, k: int, l: int, onion_l: int,
        walk_hops: int, runs: int, seed: int, count: Count = "paper") -> Table:
    """The whole figure as a table (system, f, entropy, stderr)."""
    rows = []
    for sys_ in systems(n, k, l, onion_l, walk_hops):
        for i, f in enumerate(fs):
            mean, se = simulate(sys_, float(f), users, runs, seed, i, count)
            rows.append((sys_.name, float(f), mean, se))
    return Table(("system", "f", "entropy", "stderr"), tuple(rows))


def main(argv: list[str] | None = None) -> int:
    p = base_parser(__doc__.splitlines()[0], "anonymity")
    p.add_argument("--N", type=int, default=SIMS.anonymity_users, help="users in the network")
    p.add_argument("--f", default="0:0.3:0.025",
                   help="malicious fractions, start:stop:step or a,b,c")
    p.add_argument("--n", type=int, default=CLOVES.n, help="paths (cloves) per message")
    p.add_argument("--k", type=int, default=CLOVES.k,
                   help="cloves needed = Garlic Cast walks the attacker links (A4)")
    p.add_argument("--l", type=int, default=CLOVES.path_length, help="relays per GenTorrent path")
    p.add_argument("--onion-l", type=int, default=SIMS.onion_path_length)
    p.add_argument("--walk-hops", type=int, default=SIMS.garlic_walk_hops)
    p.add_argument("--count", choices=["paper", "observed"], default="paper",
                   help="c in p = 1/(L+1-c): A4's expected f*L, or the malicious relays seen")
    p.set_defaults(runs=200_000)
    a = p.parse_args(argv)
    require(a.N >= 2, "--N must be at least 2")
    require(1 <= a.k <= a.n <= 64, "need 1 <= k <= n <= 64")
    require(1 <= a.l <= 64 and 1 <= a.onion_l <= 64 and 1 <= a.walk_hops <= 64,
            "path lengths must lie in 1..64")
    require(1 <= a.runs <= 10_000_000, "--runs must lie in 1..10,000,000")
    fs = fraction_grid(a.f)
    t0 = time.monotonic()
    progress(f"anonymity: N={a.N} n={a.n} k={a.k} l={a.l} runs={a.runs} count={a.count}")
    table = run(fs, users=a.N, n=a.n, k=a.k, l=a.l, onion_l=a.onion_l, walk_hops=a.walk_hops,
                runs=a.runs, seed=a.seed, count=a.count)
    a.out.mkdir(parents=True, exist_ok=True)
    write_csv(table, a.out / "anonymity.csv")
    cols, rows = pivot(table, "f", "system", "entropy")
    labels = {s.name: s.label for s in systems(a.n, a.k, a.l, a.onion_l, a.walk_hops)}
    md = (f"# Anonymity: normalized entropy (paper A4), N = {a.N}\n\n"
          f"Command: `python -m sims.anonymity` (runs={a.runs}, seed={a.seed}, "
          f"count={a.count}). Paper at f = 0.05: onion 0.954, Garlic Cast 0.903, "
          f"GenTorrent 0.965.\n\n" + markdown_table(cols, rows) + "\n"
          + "".join(f"- `{k_}`: {v}\n" for k_, v in labels.items())
          + "\nUnder A4 one onion path and one GenTorrent path (colluders link within a path, "
            "never across paths) are the same observation, so those two curves coincide; the "
            "paper's onion figure (0.954) is what A4 gives with the observed count "
            "(`--count observed`). Per-hop link IDs help only when a path holds two separate "
            "chains of colluders, so the gain grows with f. `gentorrent_acks_e2e` is what relays "
            "could do before acknowledgements became hop-local: each knew its position from ack "
            "timing, so a malicious first hop named the sender outright. What a relay can still "
            "time (the delay from a forward clove to the next reply clove on its path, which "
            "includes the model node's generation time) is in THREAT_MODEL.md.\n")
    (a.out / "anonymity.md").write_text(md)
    if not a.no_plot:
        order = ["gentorrent_acks_e2e", "garlic_cast", "gentorrent", "gentorrent_per_hop", "onion"]  # onion on top
        curves = {labels[s]: ([d["f"] for d in table.select(system=s)],
                              [d["entropy"] for d in table.select(system=s)])
                  for s in order}
        styles = {labels["gentorrent_per_hop"]: "--", labels["onion"]: ":", labels["gentorrent_acks_e2e"]: "-."}
        colors = {labels[s]: SYSTEM_COLORS[s] for s in order}
        plot_lines(a.out / "anonymity.png", curves, styles=styles, colors=colors,
                   title=f"Sender anonymity, N = {a.N} (A4 metric, count = {a.count})",
                   xlabel="fraction of colluding malicious users f",
                   ylabel="normalized entropy", legend_loc="lower left")
    print(md)
    progress(f"anonymity: done in {time.monotonic() - t0:.1f} s -> {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
