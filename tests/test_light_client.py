"""The light client cannot be rolled back (gentorrent.ledger.light_client, pure core and its
shell over injected fetchers): lower heights, stale directories, lying and silent verifiers.

Every directory here is what a verifier could really serve: a certified snapshot (the proof
check is tested in test_consensus_node.py); the attacks are about WHICH certified directory a
Byzantine verifier picks. tests/test_registry_attacks.py replays real ones from real processes.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from gentorrent.crypto.keys import Identity
from gentorrent.ledger.genesis import GenesisValidator
from gentorrent.ledger.light_client import (CommitteeReader, DirectoryRejected, LightClient, NotConfirmed,
                                            RolledBack, StaleDirectory)
from gentorrent.ledger.sections import DirectorySnapshot, ModelRecord

NOW = 1_700_000_000_000
AGE_MS = 120_000
VALIDATORS = [GenesisValidator(f"v{i}", Identity.from_seed(bytes([i + 1]) * 32).public_key, 1,
                               f"127.0.0.1:{7000 + i}", b"cert") for i in range(4)]
CHEATER = Identity.from_seed(bytes([50]) * 32)


def snapshot(height: int, cheater_trusted: bool = True, age_s: float = 1.0) -> DirectorySnapshot:
    cheater = ModelRecord(CHEATER.node_id, CHEATER.public_key, "127.0.0.1:9000", "m", bytes(32), b"",
                          trusted=cheater_trusted)
    return DirectorySnapshot(height=height, users=(), models=(cheater,), section_hashes={},
                             time_ms=NOW - int(age_s * 1000))


def reader(answers: dict, client: LightClient | None = None, seed: int = 0) -> CommitteeReader:
    """A reader whose verifier vN answers answers[vN] (a snapshot, or an exception to raise)."""
    asked: list[str] = []

    async def fetch(v: GenesisValidator) -> DirectorySnapshot:
        asked.append(v.name)
        answer = answers[v.name]
        if isinstance(answer, Exception):
            raise answer
        return answer

    r = CommitteeReader(VALIDATORS, fetch, client or LightClient(AGE_MS), random.Random(seed), lambda: NOW)
    r.asked = asked  # type: ignore[attr-defined]
    return r


def refresh(r: CommitteeReader) -> DirectorySnapshot:
    return asyncio.run(r.refresh())


# --------------------------------------------------------------------------- the pure core


def test_a_lower_height_than_the_accepted_one_is_refused():
    client = LightClient(AGE_MS)
    client.adopt(snapshot(100, cheater_trusted=False))
    with pytest.raises(RolledBack, match="older than height 100"):
        client.check(snapshot(99), NOW)
    client.check(snapshot(100, cheater_trusted=False), NOW)  # the same height again is fine
    with pytest.raises(RolledBack):
        client.adopt(snapshot(42))
    assert client.current.height == 100


def test_a_directory_certified_too_long_ago_is_refused():
    client = LightClient(AGE_MS)
    client.check(snapshot(5, age_s=119), NOW)
    with pytest.raises(StaleDirectory, match="certified 3600 s ago"):
        client.check(snapshot(5, age_s=3600), NOW)  # e.g. a verifier whose clock runs an hour behind


def test_only_changes_of_membership_or_trust_need_a_confirmation():
    client = LightClient(AGE_MS)
    assert client.needs_confirmation(snapshot(1))  # nothing accepted yet
    client.adopt(snapshot(1))
    assert not client.needs_confirmation(snapshot(2))  # same nodes, same trust
    assert client.needs_confirmation(snapshot(2, cheater_trusted=False))


# --------------------------------------------------------------------------- the shell: who is asked


def test_a_replayed_old_directory_never_rolls_a_client_back():
    """v3 is Byzantine and replays the directory of height 50, where the cheater was still
    trusted; the honest verifiers are at height 100, where it is untrusted. Whatever the order,
    a client that accepted height 100 stays there; a fresh one never ends on the replay."""
    honest = snapshot(100, cheater_trusted=False)
    answers = {"v0": honest, "v1": honest, "v2": honest, "v3": snapshot(50, cheater_trusted=True)}
    for seed in range(20):
        fresh = reader(answers, seed=seed)
        assert refresh(fresh).height == 100
        assert refresh(fresh).height == 100 and not fresh.client.current.models[0].trusted


def test_a_replay_older_than_the_age_bound_is_refused_even_by_a_fresh_client():
    answers = {"v0": snapshot(7, age_s=600), "v1": DirectoryRejected("down"), "v2": DirectoryRejected("down"),
               "v3": snapshot(7, age_s=600)}
    with pytest.raises(DirectoryRejected, match="certified 600 s ago"):
        refresh(reader(answers))


def test_verifiers_are_asked_in_a_random_order():
    firsts = Counter()
    for seed in range(200):
        r = reader({v.name: snapshot(10) for v in VALIDATORS}, seed=seed)
        refresh(r)
        firsts[r.asked[0]] += 1
    assert set(firsts) == {"v0", "v1", "v2", "v3"} and max(firsts.values()) < 100


def test_a_change_is_confirmed_by_a_second_verifier_and_the_newer_one_wins():
    client = LightClient(AGE_MS)
    client.adopt(snapshot(10))
    r = reader({"v0": snapshot(12, cheater_trusted=False), "v1": snapshot(13, cheater_trusted=False),
                "v2": snapshot(12, cheater_trusted=False), "v3": snapshot(13, cheater_trusted=False)}, client)
    got = refresh(r)
    assert len(r.asked) == 2 and got.height == max(12 if n in ("v0", "v2") else 13 for n in r.asked)
    # no change of standing: one verifier is enough
    r = reader({v.name: snapshot(got.height + 1, cheater_trusted=False) for v in VALIDATORS}, client)
    refresh(r)
    assert len(r.asked) == 1


def test_a_change_nobody_confirms_is_not_adopted_yet():
    client = LightClient(AGE_MS)
    client.adopt(snapshot(10))
    down = ConnectionError("refused")
    answers = {"v0": snapshot(11, cheater_trusted=False), "v1": down, "v2": down, "v3": down}
    with pytest.raises(NotConfirmed):
        refresh(reader(answers, client))
    assert client.current.height == 10


@pytest.mark.parametrize("fault", ["down", "lying", "garbage"])
def test_any_one_verifier_of_four_lying_or_down_is_survived(fault):
    """f = 1 of 3f + 1: whichever verifier is faulty, and in whatever order verifiers are asked,
    every client ends on the honest directory."""
    honest = snapshot(100, cheater_trusted=False)
    bad = {"down": ConnectionError("connection refused"), "lying": snapshot(60, cheater_trusted=True),
           "garbage": DirectoryRejected("wrong app hash")}[fault]
    for faulty in VALIDATORS:
        for seed in range(6):
            answers = {v.name: (bad if v is faulty else honest) for v in VALIDATORS}
            client = LightClient(AGE_MS)
            client.adopt(snapshot(90))
            assert refresh(reader(answers, client, seed)).height == 100
            assert refresh(reader(answers, client, seed + 100)).height == 100


def test_every_verifier_down_is_a_clear_error_naming_each():
    answers = {v.name: ConnectionError(f"{v.name} unreachable") for v in VALIDATORS}
    with pytest.raises(DirectoryRejected) as err:
        refresh(reader(answers))
    assert all(f"{v.name}: ConnectionError" in str(err.value) for v in VALIDATORS)
