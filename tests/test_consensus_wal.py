"""Write-ahead log + signer: a validator killed at any point never signs two different votes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gentorrent.config import CONSENSUS_FAST
from testkit.simnet import CHAIN, KvHost, identities
from verifier.consensus.driver import Broadcast, DoubleSignError, Driver, Refused, TimeoutFired, within_drift
from verifier.consensus.privval import PrivValidator
from gentorrent.ledger.chain import (NIL, Proposal, Step, Validator, ValidatorSet, Vote, VoteType)
from verifier.consensus.wal import WriteAheadLog

IDS = identities(4, seed=99)
VALS = ValidatorSet([Validator(i.public_key, 1) for i in IDS])
ME = next(i for i in range(4) if i not in {VALS.proposer(1, r) for r in range(2)})


def signed_vote(type_, r, block_hash, who, height=1) -> Vote:
    v = Vote(type_, height, r, block_hash, who)
    return Vote(type_, height, r, block_hash, who, IDS[who].sign(v.sign_bytes(CHAIN)))


def signed_proposal(r, block, pol=-1) -> Proposal:
    who = VALS.proposer(1, r)
    p = Proposal(1, r, pol, block, who)
    return Proposal(1, r, pol, block, who, IDS[who].sign(p.sign_bytes(CHAIN)))


class Validator1:
    """One validator's durable parts (WAL, sign state) in `home`, and its volatile driver."""

    def __init__(self, home: Path, clock=lambda: 1.0, timely=None) -> None:
        self.home = home
        self.wal = WriteAheadLog(home / "cs.wal")
        self.privval = PrivValidator(IDS[ME], home / "sign_state.json", before_sign=self.wal.sync)
        self.host = KvHost(VALS, ME, clock)
        self.driver = Driver(CHAIN, VALS, ME, self.privval, self.host, CONSENSUS_FAST, journal=self.wal.append,
                             timely=timely)
        self.sent: list = []
        self.refused: list = []
        self._perform(self.driver.start_height(1, replay=self.wal.replay_from(1)))

    def _perform(self, effects) -> None:
        self.sent += [e.message for e in effects if isinstance(e, Broadcast)]
        self.refused += [e for e in effects if isinstance(e, Refused)]

    def receive(self, msg) -> None:
        self.wal.append(msg)
        self._perform(self.driver.on_message(msg))

    def timeout(self, step, r) -> None:
        ev = TimeoutFired(step, 1, r)
        self.wal.append(ev)
        self._perform(self.driver.on_timeout(step, 1, r))


def kill(home: Path, into: Path) -> Path:
    """What survives a kill -9 right now: the files as they are on disk (buffers are lost)."""
    shutil.copytree(home, into)
    return into


def own(sent, type_=None):
    return [m for m in sent if isinstance(m, Vote) and m.validator == ME and (type_ is None or m.type == type_)]


def test_restarted_validator_keeps_its_lock_and_resends_identical_votes(tmp_path):
    node = Validator1(tmp_path / "a")
    v = node.host.make_block(1, 0, ())
    other = [i for i in range(4) if i != ME]
    node.receive(signed_proposal(0, v))
    for i in other:
        node.receive(signed_vote(VoteType.PREVOTE, 0, v.hash(), i))
    before = own(node.sent)
    assert [m.type for m in before] == [VoteType.PREVOTE, VoteType.PRECOMMIT]
    assert node.driver.sm.locked_round == 0

    restarted = Validator1(kill(tmp_path / "a", tmp_path / "b"))
    assert restarted.driver.sm.locked_value == v and restarted.driver.sm.locked_round == 0
    assert own(restarted.sent) == before  # same signatures, nothing new

    # round 1 proposes another block: the restarted node is still locked, prevotes nil
    for i in other:
        restarted.receive(signed_vote(VoteType.PRECOMMIT, 0, NIL, i))
    restarted.timeout(Step.PRECOMMIT, 0)
    w = restarted.host.make_block(1, 1, ())
    w = type(w)(type(w.header)(**{**w.header.__dict__, "time_ms": w.header.time_ms + 5}), w.txs)
    restarted.receive(signed_proposal(1, w))
    assert own(restarted.sent, VoteType.PREVOTE)[-1].block_hash == NIL


def test_signer_refuses_a_conflicting_vote_after_restart(tmp_path):
    node = Validator1(tmp_path / "a")
    v = node.host.make_block(1, 0, ())
    node.receive(signed_proposal(0, v))  # prevote for v is signed
    restarted = Validator1(kill(tmp_path / "a", tmp_path / "b"))
    conflicting = Vote(VoteType.PREVOTE, 1, 0, NIL, ME).sign_bytes(CHAIN)
    with pytest.raises(DoubleSignError):
        restarted.privval.sign(Step.PREVOTE, 1, 0, conflicting)
    with pytest.raises(DoubleSignError):  # an older step is refused too
        restarted.privval.sign(Step.PROPOSE, 1, 0, b"anything")
    same = Vote(VoteType.PREVOTE, 1, 0, v.hash(), ME).sign_bytes(CHAIN)
    assert restarted.privval.sign(Step.PREVOTE, 1, 0, same) == own(node.sent)[0].signature


def test_signature_is_preceded_by_a_wal_sync(tmp_path):
    node = Validator1(tmp_path / "a")
    v = node.host.make_block(1, 0, ())
    syncs = node.wal.syncs
    node.receive(signed_proposal(0, v))
    assert node.wal.syncs == syncs + 1 and node.privval.signed_count == 1
    # the proposal that caused the prevote is on disk before the prevote exists
    assert WriteAheadLog(kill(tmp_path / "a", tmp_path / "b") / "cs.wal").events_for_height(1)[0].block == v


def test_a_torn_wal_tail_is_cut_and_replay_never_double_signs(tmp_path):
    node = Validator1(tmp_path / "a")
    v = node.host.make_block(1, 0, ())
    node.receive(signed_proposal(0, v))
    for i in [i for i in range(4) if i != ME]:
        node.receive(signed_vote(VoteType.PREVOTE, 0, v.hash(), i))
    node.wal.close()
    data = (tmp_path / "a" / "cs.wal").read_bytes()
    signed = {(m.type, m.round): m.signature for m in own(node.sent)}
    full = WriteAheadLog(tmp_path / "a" / "cs.wal").events_for_height(1)
    for cut in range(0, len(data), max(1, len(data) // 40)):
        home = tmp_path / f"cut{cut}"
        shutil.copytree(tmp_path / "a", home)
        (home / "cs.wal").write_bytes(data[:cut])
        survived = WriteAheadLog(home / "cs.wal")
        assert (home / "cs.wal").stat().st_size <= cut  # the torn record is cut off
        assert survived.events_for_height(1) == full[:len(survived.events_for_height(1))]
        survived.close()
        restarted = Validator1(home)
        for m in own(restarted.sent):  # whatever it sends is exactly what it signed before
            assert signed[(m.type, m.round)] == m.signature
        restarted.wal.close()


def test_sign_state_survives_a_torn_slot_and_refuses_a_corrupt_file(tmp_path):
    path = tmp_path / "sign_state.bin"
    pv = PrivValidator(IDS[0], path)
    first = pv.sign(Step.PREVOTE, 5, 0, b"vote-a")
    pv.sign(Step.PRECOMMIT, 5, 0, b"commit-a")
    pv.close()
    data = bytearray(path.read_bytes())
    assert PrivValidator(IDS[0], path).last == (5, 0, 3)
    data[10] ^= 0xFF  # tear slot 0, where the second (newest) state was written
    path.write_bytes(bytes(data))
    back = PrivValidator(IDS[0], path)
    assert back.last == (5, 0, 2)  # the other slot still holds the previous state
    assert back.sign(Step.PREVOTE, 5, 0, b"vote-a") == first
    with pytest.raises(DoubleSignError):
        back.sign(Step.PREVOTE, 5, 0, b"vote-b")
    back.close()
    path.write_bytes(b"\x01" * len(data))
    with pytest.raises(ValueError, match="corrupt sign state"):
        PrivValidator(IDS[0], path)


@pytest.mark.parametrize("cut", ["empty", "header", "half", "all but the crc"])
def test_a_torn_first_write_of_the_sign_state_restarts_as_never_signed(tmp_path, cut):
    """A crash inside the very first sign-state write used to leave a file the node refused to
    start from ("no valid slot"). That signature never left the node (`sign` returns only after
    the fdatasync), so nothing was signed with that state: it restarts as never signed."""
    path = tmp_path / "sign_state.bin"
    pv = PrivValidator(IDS[0], path)
    pv.sign(Step.PREVOTE, 1, 0, b"vote-a")
    pv.close()
    data = path.read_bytes()
    slot = len(data) // 2
    keep = {"empty": slot + 1, "header": slot + 12, "half": slot + slot // 2, "all but the crc": len(data) - 2}[cut]
    torn = bytearray(data[:keep])
    torn[-1] ^= 0x5A  # whatever the disk held there: not the byte being written
    path.write_bytes(bytes(torn))
    back = PrivValidator(IDS[0], path)
    assert back.last == (0, 0, 0) and back.last_bytes == b""
    assert back.sign(Step.PREVOTE, 1, 0, b"vote-b")  # it may sign: the torn state was never released
    back.close()
    assert PrivValidator(IDS[0], path).last == (1, 0, 2)  # and that write holds


def test_no_signature_leaves_before_its_sign_state_is_durable(tmp_path, monkeypatch):
    """The ordering the torn-first-write rule rests on: a write that fails releases nothing,
    and the next attempt writes the same slot again (the last good slot is never overwritten)."""
    import os as _os
    path = tmp_path / "sign_state.bin"
    pv = PrivValidator(IDS[0], path)
    pv.sign(Step.PREVOTE, 1, 0, b"vote-a")

    def broken(fd):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(_os, "fdatasync", broken)
    with pytest.raises(OSError):
        pv.sign(Step.PRECOMMIT, 1, 0, b"commit-a")
    assert pv.last == (1, 0, 2) and pv.signed_count == 1  # nothing released, nothing remembered
    monkeypatch.undo()
    pv.sign(Step.PRECOMMIT, 1, 0, b"commit-b")
    pv.close()
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF  # tear slot 0, where the failed write and its retry went: slot 1 is untouched
    path.write_bytes(bytes(data))
    back = PrivValidator(IDS[0], path)
    assert (back.last, back.last_bytes) == ((1, 0, 2), b"vote-a")


DRIFT_S = CONSENSUS_FAST.max_clock_drift_ms / 1000


@pytest.mark.parametrize("before_s,after_s", [(-0.1, +0.1), (+0.1, -0.1)],
                         ids=["untimely-then-clock-ahead", "timely-then-clock-stepped-back"])
def test_replay_keeps_the_timeliness_verdict_whatever_the_clock_reads_after_a_restart(tmp_path, before_s, after_s):
    """A proposal near the clock-drift bound: prevoted nil (too far ahead) or for its block
    (within). Restarted with the clock on the other side of the bound (time moved on, or NTP
    stepped it back), the node used to judge the replayed proposal again and refuse to sign
    its own earlier step ("step (1, 0, 2) was already signed with other content"). The verdict
    is an input, logged: replay re-sends exactly the prevote it signed."""
    proposer = VALS.proposer(1, 0)
    block = KvHost(VALS, proposer, lambda: 100.0).make_block(1, 0, ())
    t_block = block.header.time_ms / 1000
    clock = [t_block - DRIFT_S + before_s]

    def timely(b):
        return within_drift(b.header.time_ms, int(clock[0] * 1000), CONSENSUS_FAST.max_clock_drift_ms)

    node = Validator1(tmp_path / "a", timely=timely)
    node.receive(signed_proposal(0, block))
    before = own(node.sent, VoteType.PREVOTE)
    assert [v.block_hash for v in before] == [block.hash() if before_s > 0 else NIL]

    clock[0] = t_block - DRIFT_S + after_s
    restarted = Validator1(kill(tmp_path / "a", tmp_path / "b"), timely=timely)
    assert restarted.refused == []
    assert own(restarted.sent, VoteType.PREVOTE) == before  # the same signed prevote, re-sent

    # and the verdict outlives a second restart, also after new inputs were logged
    for i in [i for i in range(4) if i not in (ME,)][:1]:
        restarted.receive(signed_vote(VoteType.PREVOTE, 0, NIL, i))
    restarted.wal.sync()
    clock[0] = t_block - DRIFT_S + before_s
    third = Validator1(kill(tmp_path / "b", tmp_path / "c"), timely=timely)
    assert third.refused == [] and own(third.sent, VoteType.PREVOTE) == before


def test_rotation_keeps_early_records_of_the_next_height(tmp_path):
    wal = WriteAheadLog(tmp_path / "cs.wal", rotate_bytes=1)
    early = signed_vote(VoteType.PREVOTE, 0, NIL, 1, height=2)
    wal.append(signed_vote(VoteType.PREVOTE, 0, NIL, 0, height=1))
    wal.append(early)
    wal.end_height(1)  # rotates: height 1 is dropped, the early height-2 vote is kept
    wal.append(TimeoutFired(Step.PROPOSE, 2, 0))
    wal.close()
    back = WriteAheadLog(tmp_path / "cs.wal")
    assert back.events_for_height(1) == []
    assert back.events_for_height(2) == [early, TimeoutFired(Step.PROPOSE, 2, 0)]


def test_a_forged_own_vote_in_the_wal_is_not_taken_for_ours(tmp_path):
    home = tmp_path / "a"
    node = Validator1(home)
    forged = Vote(VoteType.PREVOTE, 1, 0, NIL, ME, b"\x00" * 64)  # "from us", badly signed
    node.receive(forged)  # the shell logs every received message before checking it
    node.wal.sync()
    restarted = Validator1(kill(home, tmp_path / "b"))
    v = restarted.host.make_block(1, 0, ())
    restarted.receive(signed_proposal(0, v))
    mine = own(restarted.sent, VoteType.PREVOTE)
    assert mine and mine[-1].block_hash == v.hash()
    assert mine[-1].signed_by(CHAIN, IDS[ME].public_key)


def test_early_messages_of_the_next_height_replay_as_they_were_handled_across_two_restarts(tmp_path):
    """Two round-1 messages of height 2 reach the node while it is still at height 1. They are
    inputs like any other: after a restart at height 1 the node holds them again, runs height 2
    with them first (it skips round 0), and a second restart during height 2 replays exactly
    that history instead of the early messages followed by what it did without them."""
    node = Validator1(tmp_path / "a")
    others = [i for i in range(4) if i != ME]
    early = [signed_vote(VoteType.PREVOTE, 1, NIL, i, height=2) for i in others[:2]]
    for m in early:
        node.receive(m)
    node.wal.sync()
    restarted = Validator1(kill(tmp_path / "a", tmp_path / "b"))
    assert restarted.driver.buffered_future()[0] == 2  # held again, not only on disk

    v = restarted.host.make_block(1, 0, ())
    restarted.receive(signed_proposal(0, v))
    for i in others:
        restarted.receive(signed_vote(VoteType.PREVOTE, 0, v.hash(), i))
    for i in others:
        restarted.receive(signed_vote(VoteType.PRECOMMIT, 0, v.hash(), i))
    decided = restarted.driver.decided
    assert decided is not None and decided.block == v
    restarted.host.apply(decided.block, decided.commit)
    restarted.wal.end_height(1)
    restarted.driver.start_height(2)
    assert restarted.driver.sm.round == 1  # the early round-1 messages came first
    restarted.wal.sync()

    again = WriteAheadLog(kill(tmp_path / "b", tmp_path / "c") / "cs.wal")
    third = Driver(CHAIN, VALS, ME, PrivValidator(IDS[ME], tmp_path / "c" / "sign_state.json"),
                   restarted.host, CONSENSUS_FAST)
    third.start_height(2, replay=again.replay_from(2))
    assert third.sm.round == 1 and third.sm.votes.round_power(1) == 2


def test_a_rotation_after_a_restart_keeps_the_early_records_it_read_back(tmp_path):
    """Rotation keeps the early records of the next height from memory (no re-read of the
    file): those written before a restart, read back at open, are kept too."""
    wal = WriteAheadLog(tmp_path / "cs.wal", rotate_bytes=1)
    wal.append(signed_vote(VoteType.PREVOTE, 0, NIL, 0, height=1))
    early = signed_vote(VoteType.PREVOTE, 0, NIL, 1, height=2)
    wal.append(early)
    wal.close()
    again = WriteAheadLog(tmp_path / "cs.wal", rotate_bytes=1)
    later = signed_vote(VoteType.PRECOMMIT, 0, NIL, 2, height=2)
    again.append(later)
    again.end_height(1)
    again.close()
    back = WriteAheadLog(tmp_path / "cs.wal")
    assert back.events_for_height(1) == [] and back.events_for_height(2) == [early, later]
