"""The light client cannot be rolled back (gentorrent.ledger.light_client, its pure core): per
subject, a lower height than one accepted is refused, and so is an answer certified too long
ago. Which verifiers are asked, in which order, and what survives f of them lying or down is in
tests/test_registry_queries.py (real proofs); tests/test_registry_attacks.py replays real ones
from real processes."""

from __future__ import annotations

import pytest

from gentorrent.ledger.light_client import LightClient, ProvenReply, RolledBack, StaleDirectory

NOW = 1_700_000_000_000
AGE_MS = 120_000


def reply(height: int, age_s: float = 1.0, result=None) -> ProvenReply:
    return ProvenReply(height=height, time_ms=NOW - int(age_s * 1000), result=result)


def test_a_lower_height_than_the_accepted_one_is_refused_for_that_subject_only():
    client = LightClient(AGE_MS)
    client.accept_answer("roster:m", reply(100))
    with pytest.raises(RolledBack, match="older than height 100"):
        client.check_answer("roster:m", reply(99), NOW)
    client.check_answer("roster:m", reply(100), NOW)  # the same height again is fine
    client.check_answer("user:abc", reply(42), NOW)  # another subject has its own floor
    with pytest.raises(RolledBack):
        client.accept_answer("roster:m", reply(42))
    assert client.answered["roster:m"] == 100


def test_an_answer_certified_too_long_ago_is_refused():
    client = LightClient(AGE_MS)
    client.check_answer("s", reply(5, age_s=119), NOW)
    with pytest.raises(StaleDirectory, match="certified 3600 s ago"):
        client.check_answer("s", reply(5, age_s=3600), NOW)  # e.g. a verifier whose clock runs an hour behind
