"""TLS for every gRPC link, with certificates pinned from the committee's registry.

There is no public CA in GenTorrent: each node makes a self-signed certificate, registers it
with the committee next to its Ed25519 identity, and peers trust exactly that certificate
(the pinned certificate is the channel's only root). A server presenting any other
certificate fails the handshake; `connect` turns gRPC's generic UNAVAILABLE into a
`PinnedCertificateError` naming both fingerprints, because "the peer is down" and "the peer
is not who the registry says" call for very different reactions.

Certificates carry the node id in the subject and a fixed DNS name that channels override
the target name with, so addresses (IP:port) may change without re-issuing certificates.

Pinning is by node id (gentorrent.channels): a connection names the node it wants, and the
only certificate it accepts is the one the registry holds for that node id, which must name
that node id in its subject (`cert_node_id`); an address is only where to dial. Overlay
servers (relays) also demand a client certificate (`server_credentials(client_roots=...)`):
the registered certificates are the roots, and `peer_certificate` gives a handler the one
the caller presented, so that a caller is a registered node id, never a claimed address.

The private key is written 0600 from its first byte and atomically (gentorrent.crypto.keys);
a key file that group or others may read is refused with a message saying what to run.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import ipaddress
import socket
import ssl
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gentorrent.config import WIRE
from gentorrent.crypto.keys import Identity, read_private, write_private

#: every certificate names this host; channels override the target name with it
SERVER_NAME = "node.gentorrent"
CERT_FILE = "tls.crt.pem"
KEY_FILE = "tls.key.pem"
#: how far before its creation a certificate is valid. gRPC's TLS (BoringSSL) checks
#: notBefore/notAfter against the *verifying* node's clock (measured: a client 1 h behind
#: fails with "certificate is not yet valid"), so a certificate made "now" by a node with a
#: fast clock, or checked by a node with a slow one, would cut that node off from the
#: committee. The dates carry no trust here (the pin from the registry does), so the window
#: only has to contain every plausible clock: a year back, ten years ahead.
NOT_BEFORE_BACKDATE = dt.timedelta(days=365)


class TlsError(ConnectionError):
    """A TLS link could not be set up."""


class PinnedCertificateError(TlsError):
    """The peer presented a certificate other than the one pinned for it."""


@dataclass(frozen=True)
class TlsIdentity:
    """A node's TLS certificate and key (PEM)."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.cert_pem)

    @classmethod
    def load_or_create(cls, home: Path, identity: Identity) -> "TlsIdentity":
        """The node's certificate and key, made on first use. The key file is 0600 from its
        first byte (never written readable and chmodded after); one found readable by group
        or others is refused (keys.KeyFilePermissionError) rather than loaded."""
        home = Path(home)
        cert_path, key_path = home / CERT_FILE, home / KEY_FILE
        home.mkdir(parents=True, exist_ok=True)
        if not key_path.exists():
            write_private(key_path, make_self_signed(identity).key_pem)  # False: another process won
        key_pem = read_private(key_path)
        if not cert_path.exists():
            _write_atomic(cert_path, make_self_signed(identity, key_pem=key_pem).cert_pem)
        return cls(cert_path.read_bytes(), key_pem)


def check_key_files(home: Path) -> None:
    """Raise keys.KeyFilePermissionError (a ValueError saying what to run) if any private key
    file of the node home at `home` is readable by group or others: for CLIs to check first."""
    from gentorrent.crypto.keys import NodeKeys

    for name in (NodeKeys.IDENTITY_FILE, NodeKeys.ONION_FILE, KEY_FILE):
        if (Path(home) / name).exists():
            read_private(Path(home) / name)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def make_self_signed(identity: Identity, days: int = 3650, key_pem: bytes | None = None) -> TlsIdentity:
    """A self-signed ECDSA P-256 certificate naming the node id.

    ECDSA rather than Ed25519 because every TLS stack gRPC builds on accepts it. The
    certificate is its own CA (basicConstraints CA) so it can be the sole trust root of a
    pinned channel.
    """
    key = (ec.generate_private_key(ec.SECP256R1()) if key_pem is None
           else serialization.load_pem_private_key(key_pem, password=None))
    name = x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "GenTorrent"),
        x509.NameAttribute(NameOID.COMMON_NAME, identity.node_id_hex[:64]),
    ])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - NOT_BEFORE_BACKDATE)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([
            x509.DNSName(SERVER_NAME),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return TlsIdentity(cert.public_bytes(serialization.Encoding.PEM), key_pem)


@lru_cache(maxsize=8192)
def cert_node_id(cert_pem: bytes) -> str | None:
    """The node id (hex) a certificate names in its subject's common name; None if it names
    none. A registered certificate must name its own node's id: a record that carries another
    node's certificate is refused, so one certificate never stands for two node ids."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    except ValueError:
        return None
    value = names[0].value if names else ""
    if isinstance(value, bytes) or len(value) != 64:
        return None
    try:
        bytes.fromhex(value)
    except ValueError:
        return None
    return value.lower()


def peer_certificate(context) -> bytes | None:
    """The certificate (PEM) a gRPC caller presented in the TLS handshake, if any. Only
    servers made with `client_roots` ask for one; there the handshake has already checked it
    against the registered certificates."""
    try:
        certs = context.auth_context().get("x509_pem_cert")
    except (AttributeError, RuntimeError):
        return None
    return bytes(certs[0]) if certs else None


@lru_cache(maxsize=8192)
def fingerprint(cert_pem: bytes) -> str:
    """SHA-256 of the DER certificate, hex: what is pinned and what errors show."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise TlsError(f"not a PEM certificate: {exc}") from exc
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def channel_options() -> list[tuple[str, object]]:
    """Options shared by every channel and server: bounded messages, target-name override."""
    return [
        ("grpc.max_send_message_length", WIRE.max_message_bytes),
        ("grpc.max_receive_message_length", WIRE.max_message_bytes),
        ("grpc.ssl_target_name_override", SERVER_NAME),
        ("grpc.default_authority", SERVER_NAME),
        # fail fast on unreachable peers instead of gRPC's long reconnect backoff
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 2000),
    ]


def server_options() -> list[tuple[str, object]]:
    return [
        ("grpc.max_send_message_length", WIRE.max_message_bytes),
        ("grpc.max_receive_message_length", WIRE.max_message_bytes),
        ("grpc.so_reuseport", 0),
    ]


def server_credentials(
    tls: TlsIdentity, client_roots: Callable[[], bytes | None] | None = None
) -> grpc.ServerCredentials:
    """Server credentials; with `client_roots`, clients must present one of those certificates.

    `client_roots` is called before every handshake (gRPC's dynamic credentials), so a server
    admits exactly the nodes currently in the registry without restarting. It returns the
    PEM bundle of the roots, or None when they did not change since its last answer (the
    bundle is parsed only when the registry changed, not on every connection).
    """
    pair = [(tls.key_pem, tls.cert_pem)]
    if client_roots is None:
        return grpc.ssl_server_credentials(pair)
    first = client_roots() or tls.cert_pem
    initial = grpc.ssl_server_certificate_configuration(pair, root_certificates=first)

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        roots = client_roots()
        return None if roots is None else grpc.ssl_server_certificate_configuration(pair, root_certificates=roots)

    return grpc.dynamic_ssl_server_credentials(initial, fetch, require_client_authentication=True)


def new_server(tls: TlsIdentity, listen: str, client_roots: Callable[[], bytes | None] | None = None
               ) -> tuple[grpc.aio.Server, int]:
    """A grpc.aio server bound to `listen` ("127.0.0.1:0" picks a free port); returns the port."""
    server = grpc.aio.server(options=server_options())
    port = server.add_secure_port(listen, server_credentials(tls, client_roots))
    if port == 0:
        raise TlsError(f"cannot listen on {listen}")
    return server, port


def pinned_channel(address: str, pinned_cert_pem: bytes, own: TlsIdentity | None = None) -> grpc.aio.Channel:
    """An aio channel that trusts only `pinned_cert_pem` (and presents `own` for mutual TLS)."""
    creds = grpc.ssl_channel_credentials(
        root_certificates=pinned_cert_pem,
        private_key=own.key_pem if own else None,
        certificate_chain=own.cert_pem if own else None,
    )
    return grpc.aio.secure_channel(address, creds, options=channel_options())


async def connect(address: str, pinned_cert_pem: bytes, own: TlsIdentity | None = None,
                  timeout: float = WIRE.rpc_timeout_s) -> grpc.aio.Channel:
    """A ready pinned channel, or a clear error saying why not."""
    channel = pinned_channel(address, pinned_cert_pem, own)
    try:
        await asyncio.wait_for(channel.channel_ready(), timeout)
    except (asyncio.TimeoutError, grpc.aio.AioRpcError) as exc:
        await channel.close()
        raise await asyncio.to_thread(diagnose, address, pinned_cert_pem, timeout) from exc
    return channel


def diagnose(address: str, pinned_cert_pem: bytes, timeout: float = 3.0) -> TlsError:
    """Why a pinned channel to `address` failed: wrong certificate, or peer unreachable."""
    expected = fingerprint(pinned_cert_pem)
    try:
        presented = fetch_certificate(address, timeout)
    except OSError as exc:
        return TlsError(f"cannot reach {address}: {exc}")
    got = fingerprint(presented)
    if got != expected:
        return PinnedCertificateError(
            f"{address} presented certificate sha256:{got}, but the registry pins sha256:{expected}; "
            "refusing to talk to it"
        )
    return TlsError(f"TLS handshake with {address} failed although its certificate is the pinned one "
                    "(does it require a client certificate this node does not have?)")


def fetch_certificate(address: str, timeout: float = 3.0) -> bytes:
    """The certificate a TLS server at host:port presents (no verification), as PEM."""
    host, _, port = address.rpartition(":")
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as sock:
        with ctx.wrap_socket(sock, server_hostname=SERVER_NAME) as tls_sock:
            der = tls_sock.getpeercert(binary_form=True)
    if not der:
        raise OSError(f"{address} presented no certificate")
    return ssl.DER_cert_to_PEM_cert(der).encode()
