"""A proposer killed between signing its proposal and logging the signed message (failpoint
verifier.after_sign, seen in the crash-point scenario): the signer's durable state holds a
signature for a block the node must not replace. The new block is logged before signing, so
the restarted node proposes exactly that block again instead of being refused a signature
for a new one (and losing the round)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gentorrent.config import CONSENSUS_FAST
from testkit.simnet import CHAIN, KvHost, identities
from verifier.consensus.driver import Broadcast, Driver, Refused
from verifier.consensus.privval import PrivValidator
from gentorrent.ledger.chain import Proposal, Step, Validator, ValidatorSet
from verifier.consensus.wal import WriteAheadLog

IDS = identities(4, seed=41)
VALS = ValidatorSet([Validator(i.public_key, 1) for i in IDS])
ME = VALS.proposer(1, 0)


class _Crash(Exception):
    """The process dies here (nothing after this line runs)."""


class _DiesAfterSigningAProposal:
    def __init__(self, privval: PrivValidator) -> None:
        self.privval = privval

    def sign(self, step, height, round_, sign_bytes):
        sig = self.privval.sign(step, height, round_, sign_bytes)  # durable before it returns
        if step is Step.PROPOSE:
            raise _Crash()
        return sig


def _start(home: Path, clock: float, crash: bool):
    wal = WriteAheadLog(home / "cs.wal")
    privval = PrivValidator(IDS[ME], home / "sign_state.json", before_sign=wal.sync)
    signer = _DiesAfterSigningAProposal(privval) if crash else privval
    driver = Driver(CHAIN, VALS, ME, signer, KvHost(VALS, ME, lambda: clock), CONSENSUS_FAST, journal=wal.append)
    return driver, driver.start_height(1, replay=wal.events_for_height(1))


def test_restarted_proposer_re_proposes_the_block_it_signed(tmp_path):
    home = tmp_path / "a"
    home.mkdir()
    with pytest.raises(_Crash):
        _start(home, clock=1.0, crash=True)
    survivor = shutil.copytree(home, tmp_path / "b")  # the files as a kill -9 leaves them
    signed_before = PrivValidator(IDS[ME], survivor / "sign_state.json")
    assert signed_before.last == (1, 0, int(Step.PROPOSE))

    # one second later the node would build a different block (another time): refused
    driver, effects = _start(survivor, clock=2.0, crash=False)
    assert not [e for e in effects if isinstance(e, Refused)], effects
    proposals = [e.message for e in effects if isinstance(e, Broadcast) and isinstance(e.message, Proposal)]
    assert len(proposals) == 1
    p = proposals[0]
    assert p.sign_bytes(CHAIN) == signed_before.last_bytes and p.signature == signed_before.last_signature
    assert p.block.header.time_ms == 1000  # the block of before the crash, not a new one
