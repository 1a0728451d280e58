"""Message confidentiality against colluding relays (paper §4.2): the share of messages whose
content an adversary recovers, with and without brute-force matching of cloves across paths.

Model
-----
N users, a fraction f of them malicious and colluding. A message is split by (n, k) S-IDA into
n cloves, one per path; any k cloves rebuild the S-IDA payload. Relays are drawn uniformly
from the N - 1 other users (with replacement; round(fN) of them are malicious); a path is
*compromised* when at least one of its relays is malicious (that relay holds the clove).

* ``brute force``: colluders pool every clove they see and try all k-subsets of concurrent
  cloves until one decodes (the AEAD tag tells them when), so the payload falls as soon as
  k or more of the n paths are compromised. The paper calls this "a big assumption".
* ``no brute force``: cloves on different paths carry nothing in common (different path or
  link IDs, padded blobs), so colluders can only combine cloves that meet at one malicious
  relay: the payload falls when one malicious user relays k or more cloves of the message.

Systems: ``garlic_cast`` (n random walks of ``SIMS.garlic_walk_hops`` hops), ``gentorrent``
(the paper: n paths of l relays, the payload is the plaintext), and ``gentorrent_sealed`` (ours,
ARCHITECTURE.md §3.3: every clove travels in an envelope sealed to the model node's X25519 key,
so relays, even k colluding proxies, hold envelopes they cannot open and have no clove to
combine; the content falls only if the model node colludes too, and this figure assumes it
does not: a model node reads the prompt by design).
The reply travels the same paths, so its exposure is the same as the query's.

Assumptions: a static snapshot, the same relays carry the query and the reply, a passive
adversary that does not break AES-GCM, X25519 or the IDA, and no relay on two paths of one
user except by chance. numpy PCG64, seeded; the three systems of one (n, hops) share draws.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gentorrent.config import CLOVES, SIMS
from sims.common import (
    SYSTEM_COLORS, Table, base_parser, fraction_grid, markdown_table, pivot, plot_lines,
    progress, require, run_main, write_csv,
)

ADVERSARIES = ("brute_force", "no_brute_force")


@dataclass(frozen=True)
class System:
    name: str
    label: str
    hops: int
    sealed: bool  # every clove sealed to the model node: relays never hold a clove they can use


def systems(n: int, k: int, l: int, walk_hops: int) -> list[System]:
    return [
        System("garlic_cast", f"Garlic Cast ({n} walks of {walk_hops}, k={k})", walk_hops, False),
        System("gentorrent", f"GenTorrent (paper, n={n}, k={k}, l={l})", l, False),
        System("gentorrent_sealed", f"GenTorrent, end-to-end sealed (ours, n={n}, k={k}, l={l})",
               l, True),
    ]


def payload_recovered(malicious: np.ndarray, relay_ids: np.ndarray, k: int,
                      brute_force: bool) -> np.ndarray:
    """Which messages' S-IDA payload the colluders rebuild; (runs, n, hops) -> (runs,) bool."""
    if brute_force:
        return malicious.any(axis=2).sum(axis=1) >= k
    return _one_relay_sees(malicious, relay_ids) >= k


def _one_relay_sees(malicious: np.ndarray, relay_ids: np.ndarray) -> np.ndarray:
    """Most distinct paths of a message that one malicious relay sits on, per run."""
    runs, paths, hops = malicious.shape
    width = paths * hops
    # one key per (relay, path): absent or repeated-on-the-same-path entries get unique keys
    unique = -1 - np.arange(width, dtype=np.int64).reshape(paths, hops)
    keys = np.where(malicious, relay_ids, unique[None])
    keys = np.sort(keys, axis=2)
    dup = np.zeros_like(keys, dtype=bool)
    dup[..., 1:] = keys[..., 1:] == keys[..., :-1]
    keys = np.where(dup & (keys >= 0), unique[None], keys).reshape(runs, width)
    keys = np.sort(keys, axis=1)
    best = (keys >= 0).astype(np.int64)  # a malicious relay sees at least its own path
    streak = best.copy()
    for j in range(1, width):
        same = (keys[:, j] == keys[:, j - 1]) & (keys[:, j] >= 0)
        streak[:, j] = np.where(same, streak[:, j - 1] + 1, streak[:, j])
    return streak.max(axis=1)


def simulate(system: System, f: float, *, users: int, n: int, k: int, runs: int, seed: int,
             point: int) -> dict[str, float]:
    """Recovered share of content per adversary for one system at one f."""
    rng = np.random.default_rng([seed, point, n, system.hops])
    bad = min(int(round(f * users)), users - 1)
    hit = {a: 0 for a in ADVERSARIES}
    for lo in range(0, runs, 50_000):
        m = min(runs, lo + 50_000) - lo
        ids = rng.integers(0, users - 1, size=(m, n, system.hops), dtype=np.int64)
        mal = ids < bad
        for a in ADVERSARIES:
            got = payload_recovered(mal, ids, k, brute_force=(a == "brute_force"))
            content = np.zeros_like(got) if system.sealed else got  # sealed: nothing relays can open
            hit[a] += int(content.sum())
    return {a: hit[a] / runs for a in ADVERSARIES}


def run(fs: Sequence[float], *, users: int, n: int, k: int, l: int, walk_hops: int, runs: int,
        seed: int) -> Table:
    rows = []
    for sys_ in systems(n, k, l, walk_hops):
        for i, f in enumerate(fs):
            rec = simulate(sys_, float(f), users=users, n=n, k=k, runs=runs, seed=seed, point=i)
            for a in ADVERSARIES:
                rows.append((sys_.name, a, float(f), 1.0 - rec[a], rec[a]))
    return Table(("system", "adversary", "f", "confidentiality", "recovered_share"), tuple(rows))


def main(argv: list[str] | None = None) -> int:
    p = base_parser(__doc__.splitlines()[0], "confidentiality")
    p.add_argument("--N", type=int, default=SIMS.anonymity_users, help="users in the network")
    p.add_argument("--f", default="0:0.3:0.025",
                   help="malicious fractions, start:stop:step or a,b,c")
    p.add_argument("--n", type=int, default=CLOVES.n)
    p.add_argument("--k", type=int, default=CLOVES.k)
    p.add_argument("--l", type=int, default=CLOVES.path_length, help="relays per GenTorrent path")
    p.add_argument("--walk-hops", type=int, default=SIMS.garlic_walk_hops)
    p.set_defaults(runs=200_000)
    a = p.parse_args(argv)
    require(a.N >= 2, "--N must be at least 2")
    require(1 <= a.k <= a.n <= 64, "need 1 <= k <= n <= 64")
    require(1 <= a.l <= 64 and 1 <= a.walk_hops <= 64, "path lengths must lie in 1..64")
    require(1 <= a.runs <= 10_000_000, "--runs must lie in 1..10,000,000")
    fs = fraction_grid(a.f)
    t0 = time.monotonic()
    progress(f"confidentiality: N={a.N} n={a.n} k={a.k} l={a.l} runs={a.runs}")
    table = run(fs, users=a.N, n=a.n, k=a.k, l=a.l, walk_hops=a.walk_hops, runs=a.runs,
                seed=a.seed)
    a.out.mkdir(parents=True, exist_ok=True)
    write_csv(table, a.out / "confidentiality.csv")
    wide = Table(("f", "series", "confidentiality"),
                 tuple((d["f"], f"{d['system']} / {d['adversary']}", d["confidentiality"])
                       for d in table.select()))
    cols, rows = pivot(wide, "f", "series", "confidentiality")
    labels = {s.name: s.label for s in systems(a.n, a.k, a.l, a.walk_hops)}
    md = (f"# Confidentiality: share of messages whose content stays hidden, N = {a.N}\n\n"
          f"Command: `python -m sims.confidentiality` (runs={a.runs}, seed={a.seed}). Paper at "
          f"f = 0.1 with brute force: Garlic Cast 0.73, GenTorrent 0.88; without: ~1.\n\n"
          + markdown_table(cols, rows) + "\n"
          + "".join(f"- `{k_}`: {v}\n" for k_, v in labels.items())
          + "\nThe paper's GenTorrent figure (0.88 at f = 0.1) corresponds to four users per "
            "path that can hold a clove (`--l 4`); with our l = 3 relays (the last one is the "
            "proxy) a path is compromised less often. Sealing the message to the model node "
            "before S-IDA leaves relays only ciphertext, whatever they match.\n")
    (a.out / "confidentiality.md").write_text(md)
    if not a.no_plot:
        curves, styles, colors = {}, {}, {}
        for s, lab in labels.items():
            for adv, style in (("brute_force", "-"), ("no_brute_force", "--")):
                if s == "gentorrent_sealed" and adv == "no_brute_force":
                    continue  # the same line: sealed content never leaks to relays
                sel = table.select(system=s, adversary=adv)
                name = (f"{lab}, either adversary" if s == "gentorrent_sealed"
                        else f"{lab}, {adv.replace('_', ' ')}")
                curves[name] = ([d["f"] for d in sel], [d["confidentiality"] for d in sel])
                styles[name] = style
                colors[name] = SYSTEM_COLORS[s]
        plot_lines(a.out / "confidentiality.png", curves, styles=styles, colors=colors,
                   title=f"Confidentiality vs. colluding relays, N = {a.N}",
                   xlabel="fraction of colluding malicious users f",
                   ylabel="share of messages kept confidential", ylim=(0.0, 1.02),
                   legend_loc="lower left")
    print(md)
    progress(f"confidentiality: done in {time.monotonic() - t0:.1f} s -> {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
