"""The committee as replicated state (verifier/abci/committee.py, gentorrent/ledger/committee_changes.py):
a change needs approvals of more than 2/3 of the power signing the block, applies once and in
order, and its validator updates come back from FinalizeBlock and apply two heights later, in
the app as in consensus; evidence of double signing removes the accused at once; every refusal
has a stable code and changes nothing."""

from __future__ import annotations

import json

import pytest

from gentorrent.crypto.keys import Identity
from gentorrent.crypto.tls import make_self_signed
from gentorrent.ledger import committee_changes as changes
from gentorrent.ledger.genesis import GenesisValidator
from gentorrent.ledger.txs import CODE_NOT_REGISTERED, CODE_REPLAY, CODE_UNAUTHORIZED, CODE_INVALID_FIELD
from gentorrent.wire import gentorrent_pb2 as pb
from verifier.abci.app import RegistryApp
from verifier.abci.interface import BlockContext, ValidatorInfo

CHAIN = "gt-committee"
MEMBERS = [Identity.from_seed(bytes([40 + i]) * 32) for i in range(4)]
NEWCOMER = Identity.from_seed(b"\x55" * 32)
T0 = 1_700_000_000_000


def card(identity: Identity, power: int = 1, name: str = "v4") -> pb.MemberCard:
    return changes.card_of(GenesisValidator(name, identity.public_key, power, "127.0.0.1:27004",
                                            make_self_signed(identity).cert_pem, b"\x07" * 32))


class Chain:
    """A RegistryApp driven block by block, as the engine does."""

    def __init__(self, path) -> None:
        self.app = RegistryApp(path)
        self.app.init_chain(CHAIN, [ValidatorInfo(m.public_key, 1) for m in MEMBERS], b"{}", T0)
        self.height = 0
        self.seq = {}

    def block(self, txs=(), misbehavior=()):
        self.height += 1
        ctx = BlockContext(self.height, T0 + self.height * 1000, MEMBERS[0].public_key, bytes(32), tuple(misbehavior))
        assert self.app.process_proposal(list(txs), ctx) or txs  # (a refused tx makes the proposal invalid)
        result = self.app.finalize_block(list(txs), ctx)
        self.app.commit()
        return result

    def submit(self, change: pb.CommitteeChange, by: Identity = MEMBERS[0]):
        seq = self.seq[by.public_key] = self.seq.get(by.public_key, 0) + 1
        tx = changes.change_tx(by, change, seq, chain_id=CHAIN)
        check = self.app.check_tx(tx)
        return check, tx

    def committee(self) -> dict:
        return json.loads(self.app.query("/committee").value)

    def validators(self) -> set[bytes]:
        return {v.public_key for v in self.app.validators()}


def approved(change: pb.CommitteeChange, *by: Identity) -> pb.CommitteeChange:
    for m in by:
        change = changes.approve(CHAIN, change, m)
    return change


def test_a_newcomer_added_with_more_than_two_thirds_applies_two_heights_later(tmp_path):
    c = Chain(tmp_path / "app.sqlite")
    c.block()
    add = pb.CommitteeChange(number=1, add=card(NEWCOMER))
    check, _ = c.submit(approved(add, *MEMBERS[:2]))  # 2 of 4: not more than 2/3
    assert check.code == CODE_UNAUTHORIZED and "more than 2/3" in check.log
    check, tx = c.submit(approved(add, *MEMBERS[:3]))
    assert check.ok, check.log
    result = c.block([tx])  # block 2
    assert [(u.public_key, u.power) for u in result.validator_updates] == [(NEWCOMER.public_key, 1)]
    assert c.committee()["cards"][0]["name"] == "v4"  # its card is known at once: members dial it
    c.block()  # block 3: still the old committee signs
    assert NEWCOMER.public_key not in c.validators()
    c.block()  # block 4 = 2 + 2: the newcomer signs
    assert NEWCOMER.public_key in c.validators() and c.committee()["changes"] == 1
    check, _ = c.submit(approved(add, *MEMBERS[:3]))  # the same change again: number used
    assert check.code == CODE_REPLAY


def test_remove_reweight_and_rotate_follow_the_committee_and_refuse_what_does_not_apply(tmp_path):
    c = Chain(tmp_path / "app.sqlite")
    c.block()
    power = pb.CommitteeChange(number=1, power=pb.ValidatorEntry(public_key=MEMBERS[1].public_key, power=3))
    assert c.submit(approved(power, *MEMBERS[:3]))[0].ok
    result = c.block([c.submit(approved(power, *MEMBERS[:3]))[1]])
    assert [(u.public_key, u.power) for u in result.validator_updates] == [(MEMBERS[1].public_key, 3)]
    c.block(), c.block()
    assert {x.public_key: x.power for x in c.app.validators()}[MEMBERS[1].public_key] == 3
    # member 1 now holds 3 of 6: without it, 3 of 6 is not more than 2/3
    remove = pb.CommitteeChange(number=2, remove=MEMBERS[3].public_key)
    assert c.submit(approved(remove, MEMBERS[0], MEMBERS[2], MEMBERS[3]))[0].code == CODE_UNAUTHORIZED
    rotate = pb.CommitteeChange(number=2, rotate=pb.Rotation(old_key=MEMBERS[2].public_key, card=card(NEWCOMER, 9)))
    check, tx = c.submit(approved(rotate, *MEMBERS[:3]))
    assert check.ok, check.log
    c.block([tx])
    c.block(), c.block()
    v = {x.public_key: x.power for x in c.app.validators()}
    assert MEMBERS[2].public_key not in v and v[NEWCOMER.public_key] == 1  # the power stays the member's
    gone = pb.CommitteeChange(number=3, remove=MEMBERS[2].public_key)  # rotated away already
    assert c.submit(approved(gone, MEMBERS[0], MEMBERS[1], MEMBERS[3]))[0].code == CODE_NOT_REGISTERED
    assert c.committee()["removed"][-1]["reason"].startswith("key rotated")
    bad = pb.CommitteeChange(number=3, add=card(NEWCOMER))
    bad.add.address = "0.0.0.0:1"
    with pytest.raises(Exception) as err:
        changes.change_tx(MEMBERS[0], bad, 99, chain_id=CHAIN)
    assert getattr(err.value, "code", None) == CODE_INVALID_FIELD


def test_evidence_of_double_signing_removes_the_accused_and_names_it(tmp_path):
    c = Chain(tmp_path / "app.sqlite")
    c.block()
    before = c.app.info().last_block_app_hash
    result = c.block(misbehavior=(MEMBERS[3].public_key,))  # block 2 carries evidence against member 3
    assert [(u.public_key, u.power) for u in result.validator_updates] == [(MEMBERS[3].public_key, 0)]
    removed = c.committee()["removed"]
    assert removed[-1]["public_key"] == MEMBERS[3].public_key.hex() and removed[-1]["height"] == 2
    assert removed[-1]["reason"] == "double-signed: evidence in block 2"
    assert c.app.info().last_block_app_hash != before
    again = c.block(misbehavior=(MEMBERS[3].public_key,))  # the same accused again: nothing twice
    assert again.validator_updates == ()
    c.block()
    assert MEMBERS[3].public_key not in c.validators() and len(c.validators()) == 3
    # the last members cannot all be removed: evidence against everyone keeps one
    for m in MEMBERS[:3]:
        c.block(misbehavior=(m.public_key,))
    for _ in range(3):
        c.block()
    assert len(c.validators()) == 1


def test_the_committee_and_its_pending_changes_survive_a_restart(tmp_path):
    c = Chain(tmp_path / "app.sqlite")
    c.block()
    add = approved(pb.CommitteeChange(number=1, add=card(NEWCOMER)), *MEMBERS[:3])
    c.block([c.submit(add)[1]])
    view = c.committee()
    c.app.close()
    back = RegistryApp(tmp_path / "app.sqlite")
    assert json.loads(back.query("/committee").value) == view and view["pending"][0]["height"] == 4
    back.close()
