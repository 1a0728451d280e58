"""Identity keys, node ids and signatures."""

from __future__ import annotations

import pytest

from gentorrent.crypto.keys import (Identity, KeyFormatError, OnionKey, SignatureError, node_id_of,
                                    verify_signature)


def test_node_id_is_hash_of_public_key():
    a, b = Identity.generate(), Identity.generate()
    assert a.node_id == node_id_of(a.public_key) != b.node_id
    assert len(a.node_id) == 32


def test_signature_verifies_only_for_signer_and_message():
    a, b = Identity.generate(), Identity.generate()
    sig = a.sign(b"register")
    verify_signature(a.public_key, sig, b"register")
    with pytest.raises(SignatureError):
        verify_signature(b.public_key, sig, b"register")
    with pytest.raises(SignatureError):
        verify_signature(a.public_key, sig, b"registe")
    with pytest.raises(SignatureError):
        verify_signature(a.public_key, sig[:-1], b"register")


def test_pem_round_trip_and_wrong_kind_rejected():
    ident = Identity.generate()
    assert Identity.from_pem(ident.to_pem()).public_key == ident.public_key
    onion = OnionKey.generate()
    assert OnionKey.from_pem(onion.to_pem()).public_key == onion.public_key
    with pytest.raises(KeyFormatError):
        Identity.from_pem(onion.to_pem())
    with pytest.raises(KeyFormatError):
        Identity.from_pem(b"garbage")
    assert "PRIVATE" not in repr(ident) and ident.seed().hex() not in repr(ident)
