"""Oracle for consensus message decoding and handling (verifier/consensus/).

Contract checked:
1. gossip.decode_payload (votes, proposals and round states) of arbitrary bytes raises only
   types.DecodeError, and what it accepts is canonical: encode_payload(decode_payload(b)) == b;
2. Driver.on_message / on_timeout / on_round_state of any decoded message (unsigned, badly
   signed, or genuinely signed by committee members with arbitrary heights, rounds, hashes,
   blocks and vote bitmaps) neither raises nor runs away (a bounded CPU budget per event),
   this node never signs two different messages for one (height, round, step), and every
   Decide carries a commit that verify_commit accepts for the decided block.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from functools import lru_cache

from gentorrent.config import CONSENSUS_FAST
from gentorrent.crypto.keys import Identity
from testkit.fuzzing import Draw, Finding, cpu_budget, expect
from verifier.consensus import gossip
from gentorrent.ledger import chain as t
from verifier.consensus.driver import Broadcast, Decide, Driver, SendTo
from verifier.consensus.privval import PrivValidator

CHAIN = "fuzz-chain"
N = 4
EVENT_CPU_S = 2.0  # an honest event costs milliseconds
HUGE_ROUND = 10_000
_ROUNDS = (0, 1, 2, 3, 7, 2**31 - 1, 2**32 - 1)
_HEIGHTS = (0, 1, 1, 1, 2, 3, 2**63, 2**64 - 1)


@lru_cache(maxsize=None)
def committee() -> tuple[tuple[Identity, ...], t.ValidatorSet]:
    ids = tuple(Identity.from_seed(hashlib.sha256(f"fuzz-val-{i}".encode()).digest()) for i in range(N))
    return ids, t.ValidatorSet([t.Validator(i.public_key, 1) for i in ids])


class _Host:
    """Accepts any internally consistent block of the height; proposes an empty one."""

    def __init__(self, validators: t.ValidatorSet, me: int) -> None:
        self.validators = validators
        self.me = me

    def make_block(self, height, round_, evidence) -> t.Block:
        return t.make_block(CHAIN, height, 1000 + round_, self.validators[self.me].public_key, b"", None, (),
                            self.validators, b"", evidence)

    def validate_block(self, block: t.Block) -> bool:
        return block.header.chain_id == CHAIN and block.header.validators_hash == self.validators.hash()


def _block(d: Draw, height: int, proposer: int) -> t.Block:
    ids, vs = committee()
    txs = tuple(d.blob(12) for _ in range(d.below(3)))
    key = ids[proposer % N].public_key
    block = t.make_block(CHAIN if d.below(8) else "other", height, d.uint(2), key, b"", None, txs, vs,
                         d.choice([b"", bytes(32)]))
    if d.below(8) == 0:  # a header that does not match its body
        block = t.Block(block.header, txs + (b"extra",), None, ())
    return block


def _message(d: Draw, blocks: list[t.Block]) -> t.Proposal | t.Vote:
    ids, vs = committee()
    height = d.choice(_HEIGHTS)
    round_ = d.choice(_ROUNDS)
    validator = d.below(N + 2)  # N, N+1: not in the committee
    if d.flag():  # a proposal, usually from the round's proposer
        if d.below(4) and 1 <= height < 2**63:
            validator = vs.proposer(height, round_) if round_ < 64 else validator
        block = d.choice(blocks) if blocks and d.flag() else _block(d, height, validator)
        pol = d.choice([-1, round_ - 1, 0])
        msg = t.Proposal(height, round_, pol, block, validator)
    else:
        vote_type = d.choice([t.VoteType.PREVOTE, t.VoteType.PRECOMMIT])
        block_hash = d.choice([t.NIL] + [b.hash() for b in blocks] + [bytes(32)])
        msg = t.Vote(vote_type, height, round_, block_hash, validator)
    how = d.below(4)
    if validator < N and how:  # genuinely signed
        sig = ids[validator].sign(msg.sign_bytes(CHAIN))
    else:
        sig = d.choice([b"", bytes(64), d.bytes(64)])
    return replace(msg, signature=sig)


def _quorum_round(d: Draw) -> list:
    """Height 1, a small round: the proposer's signed proposal, then signed prevotes and
    precommits of a chosen set of validators for chosen values (the block, nil, another
    hash), shuffled with noise messages and timeouts, so Decide and its commit are reached."""
    ids, vs = committee()
    round_ = d.below(3)
    proposer = vs.proposer(1, round_)
    block = _block(d, 1, proposer)
    proposal = t.Proposal(1, round_, -1, block, proposer)
    events: list = [replace(proposal, signature=ids[proposer].sign(proposal.sign_bytes(CHAIN)))]
    for vote_type in (t.VoteType.PREVOTE, t.VoteType.PRECOMMIT):
        for v in range(N):
            if d.below(5) == 0:
                continue  # this validator stays silent
            value = block.hash() if d.below(4) else d.choice([t.NIL, bytes(32)])
            vote = t.Vote(vote_type, 1, round_, value, v)
            events.append(replace(vote, signature=ids[v].sign(vote.sign_bytes(CHAIN))))
    for _ in range(d.below(3)):
        events.append(_message(d, [block]) if d.flag() else
                      (d.choice(list(t.Step)), 1, d.below(3)))
    shuffled = []
    while events:
        shuffled.append(events.pop(d.below(len(events))))
    return [e for e in shuffled if isinstance(e, tuple) or _decode(t.encode_message(e)) == e]


def _decode(data: bytes) -> gossip.Message | None:
    try:
        with cpu_budget(EVENT_CPU_S, "decode_payload"):
            msg = gossip.decode_payload(data)
    except t.DecodeError:
        return None
    expect(gossip.encode_payload(msg) == data, "decode_payload accepted a non-canonical encoding")
    return msg


def _round_state(d: Draw) -> gossip.RoundState | None:
    """A round state, usually signed by the committee member it names, with arbitrary rounds
    and bitmaps (sometimes sized for another committee)."""
    ids, _ = committee()
    validator = d.below(N + 2)
    entries = []
    for _ in range(d.below(gossip.MAX_ROUNDS + 2)):
        lists = [tuple(gossip.VoteBits(d.choice([t.NIL, bytes(32), b"\x01" * 32]), d.bytes(d.choice([1, 1, 2])))
                       for _ in range(d.below(N + 2))) for _ in range(2)]  # (a few beyond what N can hold)
        entries.append(gossip.RoundEntry(d.choice(_ROUNDS), d.flag(), lists[0], lists[1]))
    state = gossip.RoundState(validator, d.uint(8), d.choice(_HEIGHTS), d.choice(_ROUNDS), d.below(4), tuple(entries))
    if validator < N and d.below(4):
        state = gossip.signed(state, CHAIN, ids[validator].sign)
    again = _decode(gossip.encode_payload(state))
    return again if isinstance(again, gossip.RoundState) else None


class _Watch:
    """The safety properties over every effect the driver emits."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.signed: dict[tuple[int, int, str], bytes] = {}

    def effects(self, effects) -> None:
        expect(isinstance(effects, list), f"driver returned {type(effects).__name__}")
        _, vs = committee()
        for e in effects:
            if (isinstance(e, (Broadcast, SendTo)) and isinstance(e.message, (t.Proposal, t.Vote))
                    and e.message.validator == self.driver.me):
                m = e.message
                step = "proposal" if isinstance(m, t.Proposal) else m.type.name
                sb = m.sign_bytes(CHAIN)
                first = self.signed.setdefault((m.height, m.round, step), sb)
                expect(first == sb, f"double sign: two different {step}s at {m.height}/{m.round}")
            if isinstance(e, Decide):
                try:
                    t.verify_commit(e.commit, CHAIN, vs, e.block.height, e.block.hash())
                except t.CommitError as exc:
                    raise Finding(f"decided block {e.block.height} without a valid commit: {exc}") from exc


def _event(watch: _Watch, what: str, fn, *args) -> None:
    with cpu_budget(EVENT_CPU_S, what):
        effects = fn(*args)
    watch.effects(effects)


def check(data: bytes, avoid_known: bool = False) -> None:
    """`avoid_known` (set by fuzzing.filtered_check while the O(round) proposer bug is open)
    skips events with rounds above HUGE_ROUND, so long runs look for other bugs instead of
    burning EVENT_CPU_S on every one of them."""
    d = Draw(data)
    mode = d.below(4)
    if mode == 3:  # a round that can actually decide: proposal + votes of a quorum, plus noise
        events = _quorum_round(d)
    elif mode == 0:  # raw bytes through the decoder, then into a driver
        msg = _decode(d.rest())
        events = [msg] if msg is not None else []
    else:
        blocks: list[t.Block] = []
        events = []
        for _ in range(d.between(1, 8)):
            if d.below(6) == 0:
                events.append((d.choice(list(t.Step)), d.choice(_HEIGHTS[:5]), d.choice(_ROUNDS[:5])))
                continue
            msg = _message(d, blocks)
            if isinstance(msg, t.Proposal):
                blocks.append(msg.block)
            again = _decode(t.encode_message(msg))
            if again is None:  # e.g. pol_round >= round: the decoder rightly refuses it
                continue
            expect(again == msg, "a message does not survive encode/decode")
            events.append(msg)
    ids, vs = committee()
    me = d.below(N)
    driver = Driver(CHAIN, vs, me, PrivValidator(ids[me]), _Host(vs, me), CONSENSUS_FAST, state_signer=ids[me].sign)
    watch = _Watch(driver)
    _event(watch, "start_height", driver.start_height, 1)
    for ev in events:
        if isinstance(ev, tuple):
            _event(watch, "on_timeout", driver.on_timeout, *ev)
        elif isinstance(ev, gossip.RoundState):
            _event(watch, "on_round_state", driver.on_round_state, ev)
        elif avoid_known and ev.round > HUGE_ROUND:
            continue  # known open bug (see KNOWN_OPEN): proposer() is O(round)
        else:
            _event(watch, f"on_message({type(ev).__name__} h={ev.height} r={ev.round})", driver.on_message, ev)
    for _ in range(d.below(3)):  # peers' round states last (drawn after everything else: older
        state = _round_state(d)  # inputs of this oracle keep their meaning)
        if state is not None:
            _event(watch, "on_round_state", driver.on_round_state, state)
