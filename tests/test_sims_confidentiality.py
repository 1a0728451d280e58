"""The confidentiality simulator against analytic cases (paper §4.2)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sims import confidentiality as co

N = 10_000


def _systems(n=4, k=3, l=3):
    return {s.name: s for s in co.systems(n, k, l, walk_hops=6)}


def _binomial_tail(n: int, q: float, k: int) -> float:
    return sum(math.comb(n, j) * q**j * (1 - q) ** (n - j) for j in range(k, n + 1))


@pytest.mark.parametrize("name,hops", [("gentorrent", 3), ("garlic_cast", 6)])
def test_brute_force_matches_binomial(name, hops):
    f, runs = 0.1, 200_000
    rec = co.simulate(_systems()[name], f, users=N, n=4, k=3, runs=runs, seed=4, point=0)
    q_path = 1 - (1 - round(f * N) / (N - 1)) ** hops
    want = _binomial_tail(4, q_path, 3)
    se = math.sqrt(want * (1 - want) / runs)
    assert abs(rec["brute_force"] - want) < 4 * se


def test_without_brute_force_one_relay_must_carry_k_cloves():
    ids = np.array([[[1, 50], [1, 60], [1, 70], [80, 90]]])  # relay 1 on three paths
    mal = ids < 2
    assert co.payload_recovered(mal, ids, 3, brute_force=False)[0]
    assert not co.payload_recovered(mal, ids, 4, brute_force=False)[0]
    # twice on the same path still counts as one clove
    ids2 = np.array([[[1, 1], [1, 60], [70, 71], [80, 90]]])
    assert not co.payload_recovered(ids2 < 2, ids2, 3, brute_force=False)[0]
    # different malicious relays on k paths: only brute force matches their cloves
    ids3 = np.array([[[0, 50], [1, 60], [0, 70], [80, 90]]])
    assert not co.payload_recovered(ids3 < 2, ids3, 3, brute_force=False)[0]
    assert co.payload_recovered(ids3 < 2, ids3, 3, brute_force=True)[0]


def test_n_equals_k_needs_every_path():
    ids = np.array([[[0, 50], [1, 60], [2, 70], [80, 90]]])
    assert not co.payload_recovered(ids < 3, ids, 4, brute_force=True)[0]
    assert co.payload_recovered(ids < 3, ids, 3, brute_force=True)[0]


def test_sealed_variant_never_leaks_and_f_zero_is_perfect():
    s = _systems()
    for f in (0.0, 0.3, 0.9):
        rec = co.simulate(s["gentorrent_sealed"], f, users=N, n=4, k=3, runs=5_000, seed=1,
                          point=0)
        assert rec == {"brute_force": 0.0, "no_brute_force": 0.0}
    plain = co.simulate(s["gentorrent"], 0.9, users=N, n=4, k=3, runs=5_000, seed=1, point=0)
    assert plain["brute_force"] > 0.9  # the same draws do leak without sealing
    zero = co.simulate(s["garlic_cast"], 0.0, users=N, n=4, k=3, runs=5_000, seed=1, point=0)
    assert zero == {"brute_force": 0.0, "no_brute_force": 0.0}


def test_seed_reproduces_exactly():
    kw = dict(users=N, n=4, k=3, l=3, walk_hops=6, runs=3_000)
    assert co.run([0.1, 0.2], seed=9, **kw) == co.run([0.1, 0.2], seed=9, **kw)
    assert co.run([0.2], seed=9, **kw).column("recovered_share") != \
        co.run([0.2], seed=10, **kw).column("recovered_share")


def test_cli_writes_outputs(tmp_path):
    assert co.main(["--runs", "500", "--f", "0,0.1", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "confidentiality.csv").exists()
    assert "gentorrent_sealed / brute_force" in (tmp_path / "confidentiality.md").read_text()
    assert (tmp_path / "confidentiality.png").read_bytes()[:4] == b"\x89PNG"
    assert co.run_main(co.main, ["--f", "abc", "--out", str(tmp_path / "x")]) == 2
