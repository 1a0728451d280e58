"""Registry transactions: builders produce what decode_tx accepts; bad input gets a stable code."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from gentorrent.config import WIRE
from gentorrent.crypto.keys import Identity, OnionKey
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.ledger import txs
from gentorrent.ledger.txs import TxError, decode_tx

ALICE = Identity.from_seed(bytes([1]) * 32)
BOB = Identity.from_seed(bytes([2]) * 32)
ONION = OnionKey.generate().public_key
CHAIN = "gt-test"


def _code(raw: bytes) -> int:
    with pytest.raises(TxError) as info:
        decode_tx(raw, CHAIN)
    return info.value.code


def _resign(body: pb.TxBody, identity: Identity = ALICE) -> bytes:
    body_bytes = body.SerializeToString(deterministic=True)
    sig = identity.sign(txs.TX_SIGNING_DOMAIN + body_bytes)
    return pb.SignedTx(body=body_bytes, signature=sig).SerializeToString()


def test_every_builder_round_trips():
    built = {
        "register_user": txs.register_user(ALICE, "127.0.0.1:7001", ONION, "eu-west", 1, chain_id=CHAIN),
        "update_user": txs.update_user(ALICE, "[::1]:7002", ONION, "us", 2, chain_id=CHAIN),
        "deregister_user": txs.deregister_user(ALICE, 3, chain_id=CHAIN),
        "register_model": txs.register_model(BOB, "[2001:db8::9]:9000", "smollm2-135m", 7, 10, chain_id=CHAIN),
        "update_model": txs.update_model(BOB, "10.0.0.2:9000", "gemma3-270m", 10, 11, chain_id=CHAIN),
        "deregister_model": txs.deregister_model(BOB, 12, chain_id=CHAIN),
    }
    for kind, raw in built.items():
        tx = decode_tx(raw, CHAIN)
        assert tx.kind == kind
        assert tx.raw == raw and len(tx.hash) == 32
    user = decode_tx(built["update_user"], CHAIN)
    assert user.signer == ALICE.public_key and user.sequence == 2 and user.node_id == ALICE.node_id
    assert user.payload == txs.Registration(txs.UserInfo("[::1]:7002", ONION, "us"), new=False)
    model = decode_tx(built["register_model"], CHAIN).payload
    assert model == txs.Registration(txs.ModelInfo("[2001:db8::9]:9000", "smollm2-135m", 7), new=True)


def test_tampered_body_or_foreign_signature_is_a_bad_signature():
    raw = txs.register_user(ALICE, "127.0.0.1:7001", ONION, "eu", 1, chain_id=CHAIN)
    signed = pb.SignedTx.FromString(raw)
    body = pb.TxBody.FromString(signed.body)
    body.register_user.region = "us"  # changed after signing
    forged = pb.SignedTx(body=body.SerializeToString(deterministic=True), signature=signed.signature)
    assert _code(forged.SerializeToString()) == txs.CODE_BAD_SIGNATURE
    # Bob signs a body that claims Alice as signer
    assert _code(_resign(pb.TxBody.FromString(signed.body), BOB)) == txs.CODE_BAD_SIGNATURE
    short = pb.SignedTx(body=signed.body, signature=signed.signature[:10])
    assert _code(short.SerializeToString()) == txs.CODE_BAD_SIGNATURE


def test_signature_does_not_verify_without_the_domain_tag():
    raw = txs.deregister_user(ALICE, 5, chain_id=CHAIN)
    signed = pb.SignedTx.FromString(raw)
    undomained = pb.SignedTx(body=signed.body, signature=ALICE.sign(signed.body))
    assert _code(undomained.SerializeToString()) == txs.CODE_BAD_SIGNATURE


def test_oversize_is_refused_before_decoding():
    assert _code(b"\x0a" + b"\xff" * WIRE.max_tx_bytes) == txs.CODE_OVERSIZE


def test_garbage_and_non_canonical_encodings_are_malformed():
    assert _code(b"\x00garbage") == txs.CODE_MALFORMED
    raw = txs.deregister_user(ALICE, 5, chain_id=CHAIN)
    assert _code(raw + b"\x18\x01") == txs.CODE_MALFORMED  # unknown field 3 appended
    signed = pb.SignedTx.FromString(raw)
    # the same body with a field written twice decodes to the same message: still refused
    doubled_body = signed.body + b"\x10\x05"
    doubled = pb.SignedTx(body=doubled_body, signature=ALICE.sign(txs.TX_SIGNING_DOMAIN + doubled_body))
    assert _code(doubled.SerializeToString()) == txs.CODE_MALFORMED


def test_missing_kind_and_bad_signer_length():
    assert _code(_resign(pb.TxBody(chain_id=CHAIN, signer=ALICE.public_key, sequence=1))) == txs.CODE_UNKNOWN_KIND
    body = pb.TxBody(chain_id=CHAIN, signer=ALICE.public_key[:31], sequence=1, deregister_user=pb.Deregistration())
    assert _code(_resign(body)) == txs.CODE_MALFORMED


# (an empty address is a client-only user: tests/test_registry_rules.py)
@pytest.mark.parametrize("field,value", [
    ("address", "no-port"), ("address", "10.0.0.1:0"), ("address", "10.0.0.1:70000"), ("address", "1 0.0.0.1:80"),
    ("address", "10.0.0.1:080"), ("onion_key", b"\x01" * 31), ("onion_key", bytes(32)),
    ("region", ""), ("region", "EU"), ("region", "x" * 25),
])
def test_malformed_user_fields_are_refused(field, value):
    reg = pb.UserRegistration(address="127.0.0.1:7001", onion_key=ONION, region="eu")
    setattr(reg, field, value)
    body = pb.TxBody(chain_id=CHAIN, signer=ALICE.public_key, sequence=1, register_user=reg)
    assert _code(_resign(body)) == txs.CODE_INVALID_FIELD


@pytest.mark.parametrize("field,value", [
    ("capacity", 0), ("capacity", 11), ("model", ""), ("model", "bad model"), ("model", "m" * 97),
])
def test_malformed_model_fields_are_refused(field, value):
    reg = pb.ModelRegistration(address="127.0.0.1:9000", model="smollm2-135m", capacity=5)
    setattr(reg, field, value)
    body = pb.TxBody(chain_id=CHAIN, signer=ALICE.public_key, sequence=1, register_model=reg)
    assert _code(_resign(body)) == txs.CODE_INVALID_FIELD


def test_builders_refuse_bad_fields_and_sequences_at_the_client():
    with pytest.raises(TxError):
        txs.register_model(ALICE, "127.0.0.1:9000", "m", 11, 1, chain_id=CHAIN)
    with pytest.raises(TxError):
        txs.deregister_user(ALICE, 0, chain_id=CHAIN)
    assert _code(_resign(pb.TxBody(chain_id=CHAIN, signer=ALICE.public_key, sequence=0,
                                   deregister_user=pb.Deregistration()))) == txs.CODE_INVALID_FIELD


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_crash_the_decoder(data):
    try:
        decode_tx(data, CHAIN)
    except TxError as exc:
        assert exc.code in (txs.CODE_MALFORMED, txs.CODE_BAD_SIGNATURE, txs.CODE_UNKNOWN_KIND,
                            txs.CODE_INVALID_FIELD)


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=2000), st.integers(min_value=0, max_value=255))
def test_any_single_byte_flip_is_refused(pos, delta):
    raw = bytearray(txs.register_user(ALICE, "127.0.0.1:7001", ONION, "eu", 1, chain_id=CHAIN))
    if delta == 0:
        return
    raw[pos % len(raw)] ^= delta
    with pytest.raises(TxError):
        decode_tx(bytes(raw), CHAIN)


@pytest.mark.parametrize("spelling", [
    "localhost:7001", "LOCALHOST:7001", "node.example.org:7001", "127.1:7001", "2130706433:7001",
    "127.000.000.001:7001", "127.0.0.1.:7001", "[::ffff:127.0.0.1]:7001", "[::FFFF:7F00:1]:7001",
    "[2001:DB8::1]:7001", "[2001:db8:0::1]:7001", "::1:7001", "[127.0.0.1]:7001", "[fe80::1%eth0]:7001",
])
def test_an_address_has_one_spelling_on_the_chain(spelling):
    """One address, one node: every other spelling of an endpoint (names, short and integer
    IPv4 forms, IPv4-mapped IPv6, upper case, uncompressed IPv6, trailing dots) is refused,
    with the canonical form named when there is one, so one machine cannot hold one
    registration per spelling."""
    reg = pb.UserRegistration(address=spelling, onion_key=ONION, region="eu")
    raw = _resign(pb.TxBody(chain_id=CHAIN, signer=ALICE.public_key, sequence=1, register_user=reg))
    assert _code(raw) == txs.CODE_INVALID_FIELD
    from gentorrent.ledger import addresses

    try:
        canonical = addresses.canonical(spelling)
    except addresses.AddressError:
        return
    assert canonical in ("127.0.0.1:7001", "[2001:db8::1]:7001") and canonical != spelling
    with pytest.raises(TxError, match=f"register '{canonical}'".replace("[", "\\[").replace("]", "\\]")):
        txs.register_user(ALICE, spelling, ONION, "eu", 1, chain_id=CHAIN)
    assert txs.advertised_address(spelling, 7001, None) == canonical  # what a node registers instead


def test_a_user_record_is_at_most_200_bytes_encoded():
    """Every field bounded: the largest user record the rules admit (the longest canonical
    address, the longest region, heights far in the future) encodes in at most 200 bytes."""
    from gentorrent.ledger.sections import UserRecord, encode

    worst = UserRecord(ALICE.node_id, ALICE.public_key, "[2001:db8:ffff:ffff:ffff:ffff:ffff:ffff]:65535", ONION,
                       "x" * txs.MAX_REGION_CHARS, registered_height=2**40, updated_height=2**40)
    txs.validate_user(txs.UserInfo(worst.address, worst.onion_key, worst.region), ALICE.node_id)
    assert len(encode(worst.to_pb())) <= 200


def test_model_onion_key_is_carried_and_checked():
    raw = txs.register_model(BOB, "127.0.0.1:9000", "smollm2-135m", 5, 1, onion_key=ONION, chain_id=CHAIN)
    assert decode_tx(raw, CHAIN).payload.info.onion_key == ONION
    with pytest.raises(TxError) as err:
        txs.register_model(BOB, "127.0.0.1:9000", "smollm2-135m", 5, 2, onion_key=bytes(32), chain_id=CHAIN)
    assert err.value.code == txs.CODE_INVALID_FIELD and "onion_key" in str(err.value)
