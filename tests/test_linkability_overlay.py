"""The linkability simulator against the real overlay: the same set-up measured both ways
(testkit/scenarios/adversary_linking.py on real relays, sims/linkability.py's interval)."""

from __future__ import annotations

import pytest

from gentorrent.config import CloveParams
from sims.linkability import POLICY, share_interval
from testkit.scenarios.adversary_linking import linking_setup, measure_linking

pytestmark = [pytest.mark.network, pytest.mark.timeout(300)]

USERS, COLLUDERS, WINDOWS, PER_WINDOW = 20, 4, 12, 2
# the shipped n, l and paths kept, pooled as the "today" policy models the code
CLOVES = CloveParams(n=4, k=3, path_length=3, proxies_kept=6, single_use_paths=False)


async def test_asks_named_on_the_real_overlay_fall_inside_the_simulators_interval(tmp_path):
    out = await measure_linking(tmp_path, USERS, COLLUDERS, WINDOWS, PER_WINDOW, cloves=CLOVES,
                                guards=False, hide_position=False)  # the code as the "today" policy models it
    assert out["answered"] == out["asks"] == WINDOWS * PER_WINDOW and out["wrong"] == 0, out
    setup = linking_setup(USERS, COLLUDERS, WINDOWS, PER_WINDOW, CLOVES)
    lo, mean, hi = share_interval(setup, POLICY["today"], "asks_named", runs=4000, seed=1)
    measured = out["named"] / out["asks"]
    print(f"asks named: measured {measured:.3f}, simulated {mean:.3f} [{lo:.3f}, {hi:.3f}]")
    assert lo <= measured <= hi, (measured, lo, mean, hi, out)
