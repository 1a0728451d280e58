"""TLS under clock skew. gRPC (BoringSSL) checks a pinned certificate's notBefore/notAfter
against the *client's* clock, so a certificate made "now" used to be refused ("certificate is
not yet valid") by a node whose clock is behind. Certificates are now backdated
(gentorrent.crypto.tls.NOT_BEFORE_BACKDATE); here a real pinned handshake is made from
client processes whose wall clock is off by an hour either way (libfaketime)."""

from __future__ import annotations

import asyncio
import datetime as dt
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from gentorrent.crypto import tls
from gentorrent.crypto.keys import Identity
from testkit import faketime
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc

ROOT = Path(__file__).resolve().parents[1]

_CLIENT = """
import asyncio, sys, time
from gentorrent.crypto import tls
from gentorrent.wire import gentorrent_pb2 as pb, gentorrent_pb2_grpc as rpc
async def main():
    channel = tls.pinned_channel(sys.argv[1], open(sys.argv[2], "rb").read())
    try:
        reply = await rpc.RelayStub(channel).Health(pb.Empty(), timeout=10)
        print("OK", reply.node_id, int(time.time()))
    except Exception as exc:
        print("FAIL", exc, int(time.time()))
    await channel.close()
asyncio.run(main())
"""


def test_certificates_are_valid_from_a_year_before_their_creation():
    cert = x509.load_pem_x509_certificate(tls.make_self_signed(Identity.generate()).cert_pem)
    now = dt.datetime.now(dt.timezone.utc)
    assert cert.not_valid_before_utc <= now - dt.timedelta(days=364)
    assert cert.not_valid_after_utc >= now + dt.timedelta(days=3649)


class _Health(rpc.RelayServicer):
    async def Health(self, request, context):
        return pb.HealthReply(node_id="pinned", role="relay", serving=True)


@pytest.mark.skipif(faketime.library() is None, reason=faketime.MISSING)
@pytest.mark.timeout(120)
async def test_pinned_handshake_works_from_clocks_an_hour_behind_and_ahead(tmp_path):
    ident = tls.make_self_signed(Identity.generate())
    cert = tmp_path / "cert.pem"
    cert.write_bytes(ident.cert_pem)
    server, port = tls.new_server(ident, "127.0.0.1:0")
    rpc.add_RelayServicer_to_server(_Health(), server)
    await server.start()
    try:
        for offset in (-3600, 3600):
            out = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-c", _CLIENT, f"127.0.0.1:{port}", str(cert)], cwd=ROOT,
                capture_output=True, text=True, timeout=60,
                env={"PATH": "/usr/bin:/bin", **faketime.skewed_env(offset)})
            words = out.stdout.split()
            assert words[:2] == ["OK", "pinned"], (offset, out.stdout, out.stderr[-500:])
            skew = int(words[-1]) - int(dt.datetime.now(dt.timezone.utc).timestamp())
            assert abs(skew - offset) < 30, (offset, skew)  # the client's clock really was off
    finally:
        await server.stop(None)
