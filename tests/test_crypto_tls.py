"""Pinned TLS with real gRPC servers on 127.0.0.1."""

from __future__ import annotations

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
