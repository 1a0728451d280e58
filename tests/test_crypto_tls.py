"""Pinned TLS with real gRPC servers on 127.0.0.1."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from gentorrent.crypto import tls
from gentorrent.crypto.keys import Identity
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc


class _Health(rpc.RelayServicer):
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id

    async def Health(self, request, context):
        return pb.HealthReply(node_id=self.node_id, role="user", serving=True)


async def _serve(identity: Identity, tls_id: tls.TlsIdentity, client_roots=None):
    server, port = tls.new_server(tls_id, "127.0.0.1:0", client_roots)
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


async def test_mutual_tls_admits_only_registered_clients(node):
    identity, tls_id = node
    member = tls.make_self_signed(Identity.generate())
    stranger = tls.make_self_signed(Identity.generate())
    server, address = await _serve(identity, tls_id, client_roots=lambda: member.cert_pem)
    try:
        channel = tls.pinned_channel(address, tls_id.cert_pem, own=member)
        reply = await rpc.RelayStub(channel).Health(pb.Empty(), timeout=5)
        assert reply.serving
        await channel.close()
        channel = tls.pinned_channel(address, tls_id.cert_pem, own=stranger)
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
    from cryptography import x509
    subject = x509.load_pem_x509_certificate(cert.cert_pem).subject.rfc4514_string()
    assert keys.identity.node_id_hex in subject


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
    """Address hijack: an attacker registers the victim's address with its own certificate.
    Lookups go by node id, so the victim's registered certificate is still the one pinned,
    and a presented certificate maps to exactly the node it names."""
    from gentorrent.ledger.peers import PeerIndex
    from gentorrent.ledger.directory import StaticDirectory
    from gentorrent.ledger.sections import UserRecord

    def record(identity: Identity, address: str, cert: bytes) -> UserRecord:
        return UserRecord(identity.node_id, identity.public_key, address, b"o" * 32, cert)

    victim, attacker, thief = Identity.generate(), Identity.generate(), Identity.generate()
    victim_tls, attacker_tls = tls.make_self_signed(victim), tls.make_self_signed(attacker)
    directory = StaticDirectory(tmp_path / "d.json")
    for r in (record(victim, "127.0.0.1:7000", victim_tls.cert_pem),
              record(attacker, "127.0.0.1:7000", attacker_tls.cert_pem),  # the victim's address
              record(thief, "127.0.0.1:7001", victim_tls.cert_pem)):  # the victim's certificate
        asyncio.run(directory.register_user(r))
    index = PeerIndex(directory)
    assert index.get(victim.node_id_hex).cert_pem == victim_tls.cert_pem
    assert index.get(attacker.node_id_hex).cert_pem == attacker_tls.cert_pem
    assert index.get(thief.node_id_hex) is None  # a certificate naming another node is never pinned
    assert index.identify(victim_tls.cert_pem).node_id == victim.node_id_hex
    assert index.identify(attacker_tls.cert_pem).node_id == attacker.node_id_hex
    assert tls.cert_node_id(victim_tls.cert_pem) == victim.node_id_hex
    assert victim_tls.cert_pem in index.client_roots() and index.client_roots() is None  # unchanged: None
