"""The committee as replicated state: who signs each block, changes that more than 2/3 of it
approved, and members removed for proven double signing (pure rules of the registry app).

The application's `validators` are the committee that signs the block being executed, exactly
the consensus engine's (verifier/consensus/valsets.py): the validator updates of block H, which
FinalizeBlock returns, are kept as pending until height H + 2 and come into force at the start
of that block here too, so every rule that counts the committee's power (the epochs' quorums,
the approvals of a change, who may sign a committee transaction) counts the members signing
the same block. `CommitteeBook` also keeps the cards (address, TLS certificate, audit key) of
members added since genesis (the genesis file holds the others'), so that every member dials
a newcomer before it signs its first block, and the members removed (by a change, or for
double signing: evidence in a block removes the accused at once, `punish`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from gentorrent.ledger import committee_changes as changes
from gentorrent.ledger.txs import CODE_ALREADY_REGISTERED, CODE_NOT_REGISTERED, CODE_REPLAY, CODE_UNAUTHORIZED, Tx, TxError
from gentorrent.wire import gentorrent_pb2 as pb

#: updates of block H apply from H + DELAY (CometBFT's; verifier.consensus.valsets.DELAY)
DELAY = 2
MAX_REMOVED_LISTED = 100

Updates = tuple[tuple[bytes, int], ...]


@dataclass(frozen=True)
class CommitteeBook:
    cards: tuple[pb.MemberCard, ...] = ()  # members added since genesis (and not gone)
    pending: tuple[tuple[int, Updates], ...] = ()  # (first height in force, updates)
    changes: int = 0  # changes applied so far (the next one is number changes + 1)
    removed: tuple[pb.RemovedMember, ...] = ()  # the latest removals, newest last

    def fill(self, meta: pb.MetaSection) -> pb.MetaSection:
        meta.cards.extend(self.cards)
        meta.pending.extend(pb.PendingUpdate(height=h, updates=[pb.ValidatorEntry(public_key=k, power=p)
                                                                for k, p in u]) for h, u in self.pending)
        meta.committee_changes = self.changes
        meta.removed.extend(self.removed)
        return meta

    @classmethod
    def from_meta(cls, meta: pb.MetaSection) -> "CommitteeBook":
        return cls(tuple(meta.cards), tuple((int(p.height), tuple((bytes(u.public_key), int(u.power))
                                                                  for u in p.updates)) for p in meta.pending),
                   int(meta.committee_changes), tuple(meta.removed))


@dataclass
class BlockChanges:
    """What this block changes in the committee (a StateView's, thrown away with it)."""

    updates: dict[bytes, int] = field(default_factory=dict)  # key -> power from height + DELAY (0: out)


# --------------------------------------------------------------------------- in force


def start_block(view) -> None:
    """The pending updates in force from this block's height on change `view.validators`; cards
    of members gone and their epoch keys leave with them."""
    book: CommitteeBook = view.committee
    due = [u for h, u in book.pending if h <= view.height]
    if not due:
        return
    power = dict(view.validators)
    for updates in due:
        for key, p in updates:
            power[key] = p
    view.validators = tuple(sorted((k, p) for k, p in power.items() if p > 0))
    pending = tuple((h, u) for h, u in book.pending if h > view.height)
    coming = {k for _, u in pending for k, p in u if p > 0}
    members = {k for k, _ in view.validators} | coming
    view.committee = replace(book, pending=pending,
                             cards=tuple(c for c in book.cards if bytes(c.public_key) in members))
    if any(m.public_key not in members for m in view.epochs.members):  # (a removed member is no leader)
        epochs = pb.EpochsSection()
        epochs.CopyFrom(view.epochs)
        del epochs.members[:]
        epochs.members.extend(m for m in view.epochs.members if m.public_key in members)
        view.epochs = epochs


def projected(view) -> dict[bytes, int]:
    """Who will be a member once every change decided so far (this block's too) is in force."""
    power = dict(view.validators)
    for _, updates in view.committee.pending:
        for key, p in updates:
            power[key] = p
    for key, p in view.block_changes.updates.items():
        power[key] = p
    return {k: p for k, p in power.items() if p > 0}


# --------------------------------------------------------------------------- changes


def check_change(view, tx: Tx) -> None:
    """Raise TxError unless the change applies now (CheckTx, ProcessProposal, FinalizeBlock)."""
    change: pb.CommitteeChange = tx.payload
    changes.validate(change)
    if change.number != view.committee.changes + 1:
        raise TxError(CODE_REPLAY, f"committee change number {change.number}: the next one is "
                                   f"{view.committee.changes + 1} ({view.committee.changes} applied)")
    current = dict(view.validators)
    approved = changes.approved_power(view.chain_id, change, current)
    total = sum(current.values())
    if approved * 3 <= total * 2:
        raise TxError(CODE_UNAUTHORIZED, f"the change is approved by {approved} of the committee's {total} voting "
                                         f"power; more than 2/3 must approve it")
    after = projected(view)
    action = change.WhichOneof("action")
    if action in ("add", "rotate"):
        card = change.add if action == "add" else change.rotate.card
        if bytes(card.public_key) in after:
            raise TxError(CODE_ALREADY_REGISTERED, f"{bytes(card.public_key).hex()[:16]}… is a member already")
    target = {"remove": change.remove, "power": change.power.public_key,
              "rotate": change.rotate.old_key}.get(action)
    if target is not None and bytes(target) not in after:
        raise TxError(CODE_NOT_REGISTERED, f"{bytes(target).hex()[:16]}… is not a member")
    if action == "remove" and len(after) == 1:
        raise TxError(CODE_UNAUTHORIZED, "the last member cannot be removed")


def apply_change(view, change: pb.CommitteeChange) -> None:
    """A checked change: its updates from height + DELAY, the newcomer's card at once."""
    action = change.WhichOneof("action")
    after = projected(view)
    book: CommitteeBook = view.committee
    cards, removed = book.cards, book.removed
    updates = view.block_changes.updates
    if action == "add":
        updates[bytes(change.add.public_key)] = int(change.add.power)
        cards = _with_card(cards, change.add)
    elif action == "remove":
        updates[bytes(change.remove)] = 0
        removed = _removed(removed, bytes(change.remove), "", view.height, f"removed by committee change {change.number}")
    elif action == "power":
        updates[bytes(change.power.public_key)] = int(change.power.power)
    else:
        old, card = bytes(change.rotate.old_key), pb.MemberCard()
        card.CopyFrom(change.rotate.card)
        card.power = after[old]
        updates[old] = 0
        updates[bytes(card.public_key)] = int(card.power)
        cards = _with_card(cards, card)
        removed = _removed(removed, old, "", view.height, f"key rotated to {bytes(card.public_key).hex()[:16]}… "
                                                          f"by committee change {change.number}")
    view.committee = replace(book, cards=cards, removed=removed, changes=book.changes + 1)


def punish(view, accused: tuple[bytes, ...], height: int) -> None:
    """Members the block's evidence proves signed twice leave the committee (from height +
    DELAY for consensus; at once in the record), unless one would be the last member."""
    for key in sorted(set(accused)):
        after = projected(view)
        if key not in after or len(after) == 1:
            continue
        view.block_changes.updates[key] = 0
        view.committee = replace(view.committee, removed=_removed(
            view.committee.removed, key, "", height, f"double-signed: evidence in block {height}"))


def block_updates(view) -> Updates:
    """The validator updates FinalizeBlock returns for this block (against the committee of
    the next height, which they change from the one after); recorded as pending."""
    base = dict(view.validators)
    for h, updates in view.committee.pending:
        if h <= view.height + 1:
            for key, p in updates:
                base[key] = p
    net = tuple(sorted((k, p) for k, p in view.block_changes.updates.items() if base.get(k, 0) != p))
    return net


def end_block(view) -> Updates:
    updates = block_updates(view)
    if updates:
        view.committee = replace(view.committee, pending=view.committee.pending + ((view.height + DELAY, updates),))
    view.block_changes = BlockChanges()
    return updates


def _with_card(cards: tuple[pb.MemberCard, ...], card: pb.MemberCard) -> tuple[pb.MemberCard, ...]:
    return tuple(sorted([c for c in cards if c.public_key != card.public_key] + [card], key=lambda c: c.public_key))


def _removed(removed: tuple[pb.RemovedMember, ...], key: bytes, name: str, height: int,
             reason: str) -> tuple[pb.RemovedMember, ...]:
    entry = pb.RemovedMember(public_key=key, name=name, height=height, reason=reason)
    return (removed + (entry,))[-MAX_REMOVED_LISTED:]


def to_json(view_or_state) -> dict:
    """The /committee query: the committee signing the next block, what is pending, added
    members' cards, the latest removals."""
    book: CommitteeBook = view_or_state.committee
    return {
        "validators": [{"public_key": k.hex(), "power": p} for k, p in view_or_state.validators],
        "pending": [{"height": h, "updates": [{"public_key": k.hex(), "power": p} for k, p in u]}
                    for h, u in book.pending],
        "cards": [changes.validator_of(c).to_json() for c in book.cards],
        "changes": book.changes,
        "removed": [{"public_key": bytes(r.public_key).hex(), "name": r.name, "height": r.height, "reason": r.reason}
                    for r in book.removed],
    }
