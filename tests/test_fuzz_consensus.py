"""Property tests of consensus message decoding and handling under hostile input
(oracle: testkit/fuzzing/consensus.py)."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from testkit.fuzzing import filtered_check
from testkit.fuzzing.consensus import CHAIN, committee
from verifier.consensus import gossip
from gentorrent.ledger import chain as t

check = filtered_check("consensus")


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=600))
def test_oracle_holds_on_arbitrary_input(data: bytes) -> None:
    check(data)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_decoder_raises_only_decode_error_and_is_canonical(data: bytes) -> None:
    for blob in (data, b"\x02gt/vote/v1" + data, b"\x01gt/proposal/v1" + data, b"\x03gt/roundstate/v1" + data):
        try:
            msg = gossip.decode_payload(blob)
        except t.DecodeError:
            continue
        assert gossip.encode_payload(msg) == blob


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(list(t.VoteType)), st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1),
       st.sampled_from([t.NIL, bytes(32), b"\x01" * 32]), st.integers(0, 2**32 - 1),
       st.binary(max_size=64))
def test_votes_round_trip(vtype, height, round_, block_hash, validator, sig) -> None:
    vote = t.Vote(vtype, height, round_, block_hash, validator, sig)
    assert t.decode_message(t.encode_message(vote)) == vote


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 2**63), st.integers(0, 50), st.lists(st.binary(max_size=20), max_size=4))
def test_proposals_round_trip(height, round_, txs) -> None:
    ids, vs = committee()
    block = t.make_block(CHAIN, height, 5, ids[0].public_key, b"", None, tuple(txs), vs, b"")
    p = t.Proposal(height, round_, -1, block, 0, ids[0].sign(b"x"))
    assert t.decode_message(t.encode_message(p)) == p
