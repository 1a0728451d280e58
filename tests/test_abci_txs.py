"""Registry transactions: builders produce what decode_tx accepts; bad input gets a stable code."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from gentorrent.config import WIRE
from gentorrent.crypto.keys import Identity, OnionKey
from gentorrent.crypto.tls import make_self_signed
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.ledger import txs
from gentorrent.ledger.txs import TxError, decode_tx

ALICE = Identity.from_seed(bytes([1]) * 32)
BOB = Identity.from_seed(bytes([2]) * 32)
ALICE_CERT = make_self_signed(ALICE).cert_pem
BOB_CERT = make_self_signed(BOB).cert_pem
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
        "register_user": txs.register_user(ALICE, "127.0.0.1:7001", ONION, ALICE_CERT, "eu-west", 1, chain_id=CHAIN),
        "update_user": txs.update_user(ALICE, "[::1]:7002", ONION, ALICE_CERT, "us", 2, chain_id=CHAIN),
        "deregister_user": txs.deregister_user(ALICE, 3, chain_id=CHAIN),
        "register_model": txs.register_model(BOB, "node.example.org:9000", "smollm2-135m", 7, BOB_CERT, 10,
                                             chain_id=CHAIN),
        "update_model": txs.update_model(BOB, "10.0.0.2:9000", "gemma3-270m", 10, BOB_CERT, 11, chain_id=CHAIN),
        "deregister_model": txs.deregister_model(BOB, 12, chain_id=CHAIN),
    }
    for kind, raw in built.items():
        tx = decode_tx(raw, CHAIN)
        assert tx.kind == kind
        assert tx.raw == raw and len(tx.hash) == 32
    user = decode_tx(built["update_user"], CHAIN)
    assert user.signer == ALICE.public_key and user.sequence == 2 and user.node_id == ALICE.node_id
    assert user.payload == txs.UserInfo("[::1]:7002", ONION, ALICE_CERT, "us")
    model = decode_tx(built["register_model"], CHAIN).payload
    assert model == txs.ModelInfo("node.example.org:9000", "smollm2-135m", 7, BOB_CERT)


def test_tampered_body_or_foreign_signature_is_a_bad_signature():
    raw = txs.register_user(ALICE, "127.0.0.1:7001", ONION, ALICE_CERT, "eu", 1, chain_id=CHAIN)
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


@pytest.mark.parametrize("field,value", [
    ("address", "no-port"), ("address", "host:0"), ("address", "host:70000"), ("address", "ho st:80"),
    ("address", "host:080"), ("address", ""), ("onion_key", b"\x01" * 31), ("onion_key", bytes(32)),
    ("region", ""), ("region", "EU"), ("region", "x" * 33), ("tls_cert_pem", b"not a cert"),
    # ids of their own: certificates made at import differ per process (xdist workers compare ids)
    pytest.param("tls_cert_pem", BOB_CERT, id="tls_cert_pem-another-nodes-cert"),  # names another node id
    pytest.param("tls_cert_pem", ALICE_CERT + ALICE_CERT, id="tls_cert_pem-two-certs"),
])
def test_malformed_user_fields_are_refused(field, value):
    reg = pb.UserRegistration(address="127.0.0.1:7001", onion_key=ONION, tls_cert_pem=ALICE_CERT, region="eu")
    setattr(reg, field, value)
    body = pb.TxBody(chain_id=CHAIN, signer=ALICE.public_key, sequence=1, register_user=reg)
    assert _code(_resign(body)) == txs.CODE_INVALID_FIELD


@pytest.mark.parametrize("field,value", [
    ("capacity", 0), ("capacity", 11), ("model", ""), ("model", "bad model"), ("model", "m" * 129),
])
def test_malformed_model_fields_are_refused(field, value):
    reg = pb.ModelRegistration(address="127.0.0.1:9000", model="smollm2-135m", capacity=5, tls_cert_pem=ALICE_CERT)
    setattr(reg, field, value)
    body = pb.TxBody(chain_id=CHAIN, signer=ALICE.public_key, sequence=1, register_model=reg)
    assert _code(_resign(body)) == txs.CODE_INVALID_FIELD


def test_builders_refuse_bad_fields_and_sequences_at_the_client():
    with pytest.raises(TxError):
        txs.register_model(ALICE, "127.0.0.1:9000", "m", 11, ALICE_CERT, 1, chain_id=CHAIN)
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
    raw = bytearray(txs.register_user(ALICE, "127.0.0.1:7001", ONION, ALICE_CERT, "eu", 1, chain_id=CHAIN))
    if delta == 0:
        return
    raw[pos % len(raw)] ^= delta
    with pytest.raises(TxError):
        decode_tx(bytes(raw), CHAIN)


@settings(max_examples=80, deadline=None)
@given(st.binary(min_size=1, max_size=600))
def test_random_certificate_bodies_are_refused_not_raised(der):
    import base64

    pem = b"-----BEGIN CERTIFICATE-----\n" + base64.encodebytes(der) + b"-----END CERTIFICATE-----\n"
    reg = pb.UserRegistration(address="127.0.0.1:7001", onion_key=ONION, tls_cert_pem=pem, region="eu")
    raw = _resign(pb.TxBody(chain_id=CHAIN, signer=ALICE.public_key, sequence=1, register_user=reg))
    assert _code(raw) == txs.CODE_INVALID_FIELD


def test_model_onion_key_is_carried_and_checked():
    raw = txs.register_model(BOB, "127.0.0.1:9000", "smollm2-135m", 5, BOB_CERT, 1, onion_key=ONION, chain_id=CHAIN)
    assert decode_tx(raw, CHAIN).payload.onion_key == ONION
    with pytest.raises(TxError) as err:
        txs.register_model(BOB, "127.0.0.1:9000", "smollm2-135m", 5, BOB_CERT, 2, onion_key=bytes(32), chain_id=CHAIN)
    assert err.value.code == txs.CODE_INVALID_FIELD and "onion_key" in str(err.value)
