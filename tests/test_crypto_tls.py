"""Pinned TLS with real gRPC servers on 127.0.0.1."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from cryptography import x509

from gentorrent.crypto import tls
from gentorrent.crypto.keys import Identity
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc


class _Health(rpc.RelayServicer):
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id

    async def Health(self, request, context):
        return pb.HealthReply(node_id=self.node_id, role="user", serving=True)


async def _serve(identity: Identity, tls_id: tls.TlsIdentity):
    server, port = tls.new_server(tls_id, "127.0.0.1:0")
    rpc.add_RelayServicer_to_server(_Health(identity.node_id_hex), server)
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
def node():
    identity = Identity.generate()
    return identity, tls.make_self_signed(identity)


async def test_pinned_certificate_connects_and_answers(node):
    identity, tls_id = node
    server, address = await _serve(identity, tls_id)
    try:
        channel = await tls.connect(address, tls_id.cert_pem, timeout=5)
        reply = await rpc.RelayStub(channel).Health(pb.Empty(), timeout=5)
        assert reply.node_id == identity.node_id_hex
        await channel.close()
    finally:
        await server.stop(None)


async def test_other_certificate_is_refused_with_clear_error(node):
    identity, tls_id = node
    impostor = tls.make_self_signed(Identity.generate())
    server, address = await _serve(identity, impostor)
    try:
        with pytest.raises(tls.PinnedCertificateError) as err:
            await tls.connect(address, tls_id.cert_pem, timeout=3)
        assert tls_id.fingerprint in str(err.value)
        assert impostor.fingerprint in str(err.value)
    finally:
        await server.stop(None)


async def test_unreachable_peer_is_not_reported_as_wrong_certificate(node):
    _, tls_id = node
    with pytest.raises(tls.TlsError) as err:
        await tls.connect("127.0.0.1:1", tls_id.cert_pem, timeout=1)
    assert not isinstance(err.value, tls.PinnedCertificateError)
    assert "cannot reach" in str(err.value)


async def _serve_bound(identity: Identity, tls_id: tls.TlsIdentity, identify_callers: bool = False):
    class Caller(rpc.RelayServicer):
        async def Health(self, request, context):  # says which node's key signed the caller's leaf
            leaf = tls.caller_certificate(context)
            return pb.HealthReply(node_id=tls.leaf_node_id(leaf) or "", serving=tls.leaf_signed_by(
                leaf, CALLERS[tls.leaf_node_id(leaf)]) if tls.leaf_node_id(leaf) in CALLERS else False)

    server, port = tls.new_server(tls_id, "127.0.0.1:0", identify_callers)
    rpc.add_RelayServicer_to_server(Caller() if identify_callers else _Health(identity.node_id_hex), server)
    await server.start()
    return server, f"127.0.0.1:{port}"


CALLERS: dict[str, bytes] = {}  # node id -> registered key, as the caller's server looks it up


async def test_a_node_is_pinned_by_its_ed25519_key_alone():
    """No certificate in the registry: a peer pins the node's key (`anchor_pem`), and accepts
    any leaf that key signed; a leaf of another key, or one the node's key did not sign, is
    refused with an error naming what was presented."""
    node, other = Identity.generate(), Identity.generate()
    server, address = await _serve_bound(node, tls.TlsIdentity.bound(node))
    impostor, impostor_address = await _serve_bound(node, tls.make_self_signed(node))  # its id, not its key's
    try:
        channel = await tls.connect(address, tls.anchor_pem(node.public_key), timeout=5)
        assert (await rpc.RelayStub(channel).Health(pb.Empty(), timeout=5)).node_id == node.node_id_hex
        await channel.close()
        fresh = tls.TlsIdentity.bound(node)  # a new leaf, never registered anywhere: still the node
        assert fresh.cert_pem != tls.TlsIdentity.bound(node).cert_pem and tls.leaf_signed_by(fresh.cert_pem,
                                                                                               node.public_key)
        with pytest.raises(tls.PinnedCertificateError, match="not one signed by the pinned key"):
            await tls.connect(address, tls.anchor_pem(other.public_key), timeout=3)
        with pytest.raises(tls.PinnedCertificateError):
            await tls.connect(impostor_address, tls.anchor_pem(node.public_key), timeout=3)
    finally:
        await server.stop(None)
        await impostor.stop(None)


async def test_a_caller_is_the_node_whose_key_signed_its_leaf():
    """Mutual TLS with callers a server cannot know in advance: the handshake only checks that
    the caller's chain reaches the public network root; the server's handler then checks the
    leaf against the registered key of the node it names. A stranger with a self-signed
    certificate fails the handshake; one that names a registered node in a leaf signed by its
    own key is named, but refused by the check."""
    server_id, member, forger = Identity.generate(), Identity.generate(), Identity.generate()
    CALLERS[member.node_id_hex] = member.public_key
    server, address = await _serve_bound(server_id, tls.TlsIdentity.bound(server_id), identify_callers=True)
    pin = tls.anchor_pem(server_id.public_key)
    try:
        channel = tls.pinned_channel(address, pin, own=tls.TlsIdentity.bound(member))
        reply = await rpc.RelayStub(channel).Health(pb.Empty(), timeout=5)
        assert reply.node_id == member.node_id_hex and reply.serving
        await channel.close()

        # anyone can mint an introduction (the root key is public): the forger names the member
        # and puts its own key in, so its leaf, signed by that key, passes the handshake
        from cryptography.hazmat.primitives.serialization import Encoding

        claimed = tls._node_name(member.node_id_hex)
        forged = tls.TlsIdentity.bound(forger)
        intro = tls._ca(claimed, tls._ROOT_NAME, forger.private_key.public_key(), 7).sign(
            tls._network_root_key(), None).public_bytes(Encoding.PEM)
        leaf = x509.load_pem_x509_certificate(forged.cert_pem)
        forged_leaf = (x509.CertificateBuilder().subject_name(leaf.subject).issuer_name(claimed)
                       .public_key(leaf.public_key()).serial_number(8).not_valid_before(leaf.not_valid_before_utc)
                       .not_valid_after(leaf.not_valid_after_utc).add_extension(
                           leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value, False)
                       .sign(forger.private_key, None).public_bytes(Encoding.PEM))
        claims_member = tls.TlsIdentity(forged_leaf, forged.key_pem, forged_leaf + intro)
        channel = tls.pinned_channel(address, pin, own=claims_member)
        reply = await rpc.RelayStub(channel).Health(pb.Empty(), timeout=5)
        assert not reply.serving  # the forger's leaf is not the member's key's
        await channel.close()

        channel = tls.pinned_channel(address, pin, own=tls.make_self_signed(member))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await rpc.RelayStub(channel).Health(pb.Empty(), timeout=3)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        await channel.close()
    finally:
        await server.stop(None)


def test_certificate_names_the_node_and_keys_persist(tmp_path):
    from gentorrent.crypto.keys import NodeKeys

    keys = NodeKeys.load_or_create(tmp_path)
    again = NodeKeys.load_or_create(tmp_path)
    assert keys.identity.node_id == again.identity.node_id
    assert keys.onion.public_key == again.onion.public_key
    assert (tmp_path / NodeKeys.IDENTITY_FILE).stat().st_mode & 0o077 == 0
    cert = tls.TlsIdentity.load_or_create(tmp_path, keys.identity)
    assert tls.TlsIdentity.load_or_create(tmp_path, keys.identity) == cert
    assert tls.leaf_node_id(cert.cert_pem) == keys.identity.node_id_hex
    assert tls.leaf_signed_by(cert.cert_pem, keys.identity.public_key)
    assert (tmp_path / tls.PIN_FILE).read_bytes() == tls.anchor_pem(keys.identity.public_key)
    (tmp_path / tls.CERT_FILE).write_bytes(tls.make_self_signed(keys.identity).cert_pem)  # a home from before
    assert tls.leaf_signed_by(tls.TlsIdentity.load_or_create(tmp_path, keys.identity).cert_pem,
                              keys.identity.public_key)


# --------------------------------------------------------------------------- key files


def test_private_keys_are_0600_from_the_first_byte(tmp_path, monkeypatch):
    """No window in which a key file is readable by others: the attack is a crash (or a reader)
    between writing the key and tightening its mode, simulated by a chmod that fails."""
    import os

    from gentorrent.crypto.keys import NodeKeys

    def no_chmod(*args, **kwargs):
        raise OSError("chmod interrupted")

    monkeypatch.setattr(os, "chmod", no_chmod)
    monkeypatch.setattr(type(tmp_path), "chmod", no_chmod)
    old = os.umask(0o022)
    try:
        keys = None
        try:
            keys = NodeKeys.load_or_create(tmp_path)
            tls.TlsIdentity.load_or_create(tmp_path, keys.identity)
        except OSError:
            pass  # a writer that relies on chmod fails here; what matters is what it left on disk
    finally:
        os.umask(old)
    for name in (NodeKeys.IDENTITY_FILE, NodeKeys.ONION_FILE, tls.KEY_FILE):
        path = tmp_path / name
        assert not path.exists() or path.stat().st_mode & 0o077 == 0, (name, oct(path.stat().st_mode))
    assert keys is not None and (tmp_path / tls.KEY_FILE).exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no half-written leftovers


@pytest.mark.parametrize("name", ["tls.key.pem", "identity.key.pem", "onion.key.pem"])
def test_a_key_file_others_can_read_is_refused_saying_what_to_run(tmp_path, name):
    from gentorrent.crypto.keys import KeyFilePermissionError, NodeKeys

    keys = NodeKeys.load_or_create(tmp_path)
    tls.TlsIdentity.load_or_create(tmp_path, keys.identity)
    (tmp_path / name).chmod(0o644)
    with pytest.raises(KeyFilePermissionError) as err:
        keys = NodeKeys.load_or_create(tmp_path)
        tls.TlsIdentity.load_or_create(tmp_path, keys.identity)
    assert f"chmod 600 {tmp_path / name}" in str(err.value) and "644" in str(err.value)
    (tmp_path / name).chmod(0o600)  # what the message says to run: then it loads
    tls.TlsIdentity.load_or_create(tmp_path, NodeKeys.load_or_create(tmp_path).identity)


# --------------------------------------------------------------------------- pinning by node id


def test_peers_are_pinned_by_node_id_never_by_a_claimed_address(tmp_path):
    """Address hijack: an attacker registers the victim's address under its own key. Lookups go
    by node id, so the victim's key is still the one pinned, and a caller's leaf maps to exactly
    the node whose key signed it."""
    from gentorrent.ledger.peers import PeerIndex
    from gentorrent.ledger.directory import StaticDirectory
    from gentorrent.ledger.sections import UserRecord

    def record(identity: Identity, address: str) -> UserRecord:
        return UserRecord(identity.node_id, identity.public_key, address, b"o" * 32)

    victim, attacker = Identity.generate(), Identity.generate()
    directory = StaticDirectory(tmp_path / "d.json")
    for r in (record(victim, "127.0.0.1:7000"), record(attacker, "127.0.0.1:7000")):  # the victim's address
        asyncio.run(directory.register_user(r))
    index = PeerIndex(directory)
    assert index.get(victim.node_id_hex).public_key == victim.public_key
    assert index.get(attacker.node_id_hex).public_key == attacker.public_key
    assert index.identify(tls.TlsIdentity.bound(victim).cert_pem).node_id == victim.node_id_hex
    assert index.identify(tls.TlsIdentity.bound(attacker).cert_pem).node_id == attacker.node_id_hex
    assert index.identify(tls.make_self_signed(victim).cert_pem) is None  # names the victim, not signed by it
    assert index.identify(tls.TlsIdentity.bound(Identity.generate()).cert_pem) is None  # not registered
