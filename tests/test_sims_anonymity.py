"""The anonymity simulator against cases with known answers (paper Appendix A4)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from sims import anonymity as an
from sims.common import SimArgumentError, fraction_grid

N = 10_000


def _systems():
    return an.systems(n=4, k=3, l=3, onion_l=3, walk_hops=6)


def test_no_malicious_users_gives_entropy_one():
    for s in _systems():
        mean, se = an.simulate(s, 0.0, N, runs=500, seed=3, point=0)
        assert mean == pytest.approx(1.0, abs=1e-12)
        assert se == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("linking", ["path", "message", "chain"])
def test_single_path_with_every_relay_malicious_identifies_sender(linking):
    mal = np.ones((1, 1, 3), dtype=bool)
    ids = np.array([[[7, 8, 9]]])
    h = an.entropy_of_placements(mal, ids, 0.05, N, linking, "observed")
    assert h[0] == pytest.approx(0.0, abs=1e-12)
    # the paper's expected count reaches certainty only when every user is malicious
    assert an.entropy_of_placements(mal, ids, 1.0, N, linking, "paper")[0] == pytest.approx(0.0)
    assert an.entropy_of_placements(mal, ids, 0.05, N, linking, "paper")[0] > 0.5


def test_candidate_on_two_linked_chains_combines_evidence():
    keys = np.array([[an.SOURCE, an.SOURCE, 5, 9]])
    probs = np.array([[0.5, 0.5, 0.2, 0.0]])
    out = an.combine_duplicates(keys, probs)
    assert sorted(out[0][out[0] > 0].tolist()) == pytest.approx([0.2, 0.75])
    # linked walks (Garlic Cast) where both first hops are bad: sharper than either path alone
    mal = np.array([[[True, False], [True, False]]])
    ids = np.array([[[1, 2], [3, 4]]])
    linked = an.entropy_of_placements(mal, ids, 0.05, N, "message", "paper")[0]
    separate = an.entropy_of_placements(mal, ids, 0.05, N, "path", "paper")[0]
    assert linked < separate


def _exact_single_path(l: int, f: float, count: str) -> float:
    """Independent enumeration of A4 on one path of l relays (relay bad w.p. bad / (N - 1))."""
    q = round(f * N) / (N - 1)
    total = 0.0
    for bits in itertools.product([0, 1], repeat=l):
        pr = math.prod(q if b else 1 - q for b in bits)
        chains = sum(1 for i, b in enumerate(bits) if b and (i == 0 or not bits[i - 1]))
        c = f * l if count == "paper" else sum(bits)
        p = 1.0 / (l + 1 - c) if chains else 0.0
        rest = 1.0 - chains * p
        h = -chains * p * math.log2(p) if chains else 0.0
        if rest > 0:
            h -= rest * math.log2(rest / ((1 - f) * N - chains))
        total += pr * h / math.log2(N)
    return total


@pytest.mark.parametrize("count", ["paper", "observed"])
def test_onion_matches_exact_enumeration(count):
    onion = _systems()[0]
    mean, se = an.simulate(onion, 0.1, N, runs=200_000, seed=5, point=0, count=count)
    assert abs(mean - _exact_single_path(3, 0.1, count)) < 4 * se + 1e-4


def test_per_hop_link_ids_never_worse_than_path_ids():
    _, _, gt, per_hop, _ = _systems()
    for i, f in enumerate([0.1, 0.3, 0.5]):
        for count in ("paper", "observed"):
            a, _ = an.simulate(gt, f, N, runs=20_000, seed=2, point=i, count=count)
            b, _ = an.simulate(per_hop, f, N, runs=20_000, seed=2, point=i, count=count)
            assert b > a


def test_seed_reproduces_exactly_and_differs_across_seeds():
    kw = dict(users=N, n=4, k=3, l=3, onion_l=3, walk_hops=6, runs=2_000)
    a = an.run([0.05, 0.2], seed=11, **kw)
    b = an.run([0.05, 0.2], seed=11, **kw)
    c = an.run([0.05, 0.2], seed=12, **kw)
    assert a == b
    assert a.column("entropy") != c.column("entropy")


def test_cli_writes_csv_markdown_png(tmp_path):
    assert an.main(["--runs", "200", "--f", "0,0.1", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "anonymity.csv").read_text().startswith("system,f,entropy,stderr")
    assert "| f | onion |" in (tmp_path / "anonymity.md").read_text()
    assert (tmp_path / "anonymity.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_parameters_are_refused(tmp_path):
    with pytest.raises(SimArgumentError):
        fraction_grid("0:1.5:0.5")
    with pytest.raises(SimArgumentError):
        an.main(["--k", "5", "--n", "4", "--out", str(tmp_path)])
    assert an.run_main(an.main, ["--runs", "0", "--out", str(tmp_path)]) == 2
    assert not (tmp_path / "anonymity.csv").exists()


def test_a_relay_that_knows_its_position_costs_far_more_than_path_ids():
    """End-to-end acks told every relay its position: a malicious first hop named the sender."""
    _, _, gt, per_hop, acks_e2e = _systems()
    for i, f in enumerate([0.05, 0.2]):
        before, _ = an.simulate(acks_e2e, f, N, runs=20_000, seed=2, point=i)
        now, _ = an.simulate(per_hop, f, N, runs=20_000, seed=2, point=i)
        assert before < now - 0.02
    # exactly: the mean over n paths of "first hop malicious -> 0, else the no-information value"
    mal = np.array([[[True, False, False], [False, True, True], [False, False, False], [False, False, True]]])
    base = an.normalized_entropy(np.zeros((1, 1)), 0.05, N)[0]
    got = an.entropy_of_placements(mal, np.arange(12).reshape(1, 4, 3), 0.05, N, "position", "paper")[0]
    assert got == pytest.approx(3 * base / 4)
