"""TLS for every gRPC link: certificates bound to the node's Ed25519 key, pinned by that key.

There is no public CA in GenTorrent, and the registry holds no certificate: a node *is* its
Ed25519 identity key, and its TLS certificate is a leaf that this key signs (`TlsIdentity.
load_or_create`): an ECDSA P-256 key does the handshakes (every TLS stack gRPC builds on does
them), the identity key only vouches for it, so the certificate can be re-made at will without
re-registering. To pin a node a peer needs only its public key: `anchor_pem(public_key)` is a
trust anchor naming the node id with that key. A trust anchor is a name and a key (RFC 5280
§6.1); BoringSSL, under gRPC, checks the leaf's signature with the anchor's key and never the
anchor's own signature (measured with grpcio 1.85.1: the anchor carries a signature by another
key and is accepted, an anchor with another key fails with INVALID_SIGNATURE;
tests/test_crypto_tls.py). So `connect` to a node id accepts exactly the certificates its key
signed.

The other direction, a server that must say which node called it: a relay cannot hold the
anchors of 100,000 possible callers, and grpc-python can neither ask for a client certificate
without checking it nor plug in a verifier of its own. So a caller presents its leaf with an
*introduction* certificate for its key issued by a network root whose private key is public
(`NETWORK_ROOT_SEED`): it carries no trust, it only lets the handshake complete, and the server
then checks, in its handler, that the caller's leaf (`caller_certificate`) is signed by the
registered key of the node it names (`leaf_node_id`, `leaf_signed_by`). A stranger completes the
handshake and is refused at the first call.

Verifiers are not in the registry: the genesis pins their own self-signed certificates
(`make_self_signed`), as before.

`connect` turns gRPC's generic UNAVAILABLE into a `PinnedCertificateError` naming what the peer
presented, because "the peer is down" and "the peer is not who the registry says" call for
very different reactions. Certificates carry a fixed DNS name that channels override the
target name with, so addresses (IP:port) may change without re-issuing certificates.

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

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.x509.oid import NameOID

from gentorrent.config import WIRE
from gentorrent.crypto.keys import PUBLIC_KEY_BYTES, Identity, node_id_of, read_private, write_private

#: every certificate names this host; channels override the target name with it
SERVER_NAME = "node.gentorrent"
CERT_FILE = "tls.crt.pem"
KEY_FILE = "tls.key.pem"
#: a registry node's trust anchor (`anchor_pem` of its identity key): what a peer pins it by
PIN_FILE = "tls.pin.pem"
#: how far before its creation a certificate is valid. gRPC's TLS (BoringSSL) checks
#: notBefore/notAfter against the *verifying* node's clock (measured: a client 1 h behind
#: fails with "certificate is not yet valid"), so a certificate made "now" by a node with a
#: fast clock, or checked by a node with a slow one, would cut that node off from the
#: committee. The dates carry no trust here (the pin from the registry does), so the window
#: only has to contain every plausible clock: a year back, ten years ahead.
NOT_BEFORE_BACKDATE = dt.timedelta(days=365)
#: the network root's private key is this public seed: it carries no trust (see the docstring)
NETWORK_ROOT_SEED = hashlib.sha256(b"gentorrent/tls-network-root/v1").digest()
_ORG = "GenTorrent"
#: the validity of anchors and introductions: fixed, so both are functions of the key alone
_FOREVER = (dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc), dt.datetime(9999, 12, 31, 23, 59, 59,
                                                                          tzinfo=dt.timezone.utc))


class TlsError(ConnectionError):
    """A TLS link could not be set up."""


class PinnedCertificateError(TlsError):
    """The peer presented a certificate other than the one pinned for it."""


@dataclass(frozen=True)
class TlsIdentity:
    """A node's TLS certificate and key (PEM), and the chain it presents as a client."""

    cert_pem: bytes
    key_pem: bytes
    chain_pem: bytes = b""  # what it presents to servers that ask (empty: the certificate alone)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.cert_pem)

    @property
    def client_chain(self) -> bytes:
        return self.chain_pem or self.cert_pem

    @classmethod
    def load_or_create(cls, home: Path, identity: Identity) -> "TlsIdentity":
        """A registry node's certificate (a leaf signed by its identity key) and key, made on
        first use, and made again if the home's certificate is not bound to this identity (a
        home from before certificates were bound). The key file is 0600 from its first byte
        (never written readable and chmodded after); one found readable by group or others is
        refused (keys.KeyFilePermissionError) rather than loaded."""
        key_pem, cert_path = _tls_key(Path(home))
        cert = cert_path.read_bytes() if cert_path.exists() else b""
        if not cert or not leaf_signed_by(cert, identity.public_key):
            cert = bound_leaf(identity, key_pem)
            _write_atomic(cert_path, cert)
        pin, pin_path = anchor_pem(identity.public_key), Path(home) / PIN_FILE
        if not pin_path.exists() or pin_path.read_bytes() != pin:
            _write_atomic(pin_path, pin)
        return cls(cert, key_pem, cert + introduction_pem(identity.public_key))

    @classmethod
    def bound(cls, identity: Identity) -> "TlsIdentity":
        """A fresh key-bound certificate and key, in memory only (tests, stand-in nodes)."""
        key_pem = _private_pem(ec.generate_private_key(ec.SECP256R1()))
        cert = bound_leaf(identity, key_pem)
        return cls(cert, key_pem, cert + introduction_pem(identity.public_key))

    @classmethod
    def load_or_create_self_signed(cls, home: Path, identity: Identity) -> "TlsIdentity":
        """A verifier's self-signed certificate and key (the genesis pins it), made on first use."""
        key_pem, cert_path = _tls_key(Path(home))
        if not cert_path.exists():
            _write_atomic(cert_path, make_self_signed(identity, key_pem=key_pem).cert_pem)
        return cls(cert_path.read_bytes(), key_pem)


def _tls_key(home: Path) -> tuple[bytes, Path]:
    """The home's TLS private key (made on first use) and where its certificate lives."""
    home.mkdir(parents=True, exist_ok=True)
    key_path = home / KEY_FILE
    if not key_path.exists():
        write_private(key_path, _private_pem(ec.generate_private_key(ec.SECP256R1())))  # False: another won
    return read_private(key_path), home / CERT_FILE


def _private_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


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
    return TlsIdentity(cert.public_bytes(serialization.Encoding.PEM), _private_pem(key))


# --------------------------------------------------------------------------- certificates bound to a key


def _node_name(node_id_hex: str) -> x509.Name:
    """The name of a node's key: its anchor's subject, its introduction's subject, its leaf's issuer."""
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, _ORG),
                      x509.NameAttribute(NameOID.COMMON_NAME, node_id_hex)])


_ROOT_NAME = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, _ORG),
                        x509.NameAttribute(NameOID.COMMON_NAME, "network root (public key, no trust)")])


def _ed25519(public_key: bytes) -> Ed25519PublicKey:
    if len(public_key) != PUBLIC_KEY_BYTES:
        raise TlsError(f"an Ed25519 public key is {PUBLIC_KEY_BYTES} bytes")
    return Ed25519PublicKey.from_public_bytes(public_key)


def _serial(domain: bytes, public_key: bytes) -> int:
    return int.from_bytes(hashlib.sha256(domain + public_key).digest()[:15], "big") | 1


def _ca(subject: x509.Name, issuer: x509.Name, key, serial: int) -> x509.CertificateBuilder:
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key)
            .serial_number(serial).not_valid_before(_FOREVER[0]).not_valid_after(_FOREVER[1])
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True))


def _network_root_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(NETWORK_ROOT_SEED)


@lru_cache(maxsize=1)
def network_root_pem() -> bytes:
    """The public network root: the client roots of servers that identify callers themselves."""
    key = _network_root_key()
    cert = (x509.CertificateBuilder().subject_name(_ROOT_NAME).issuer_name(_ROOT_NAME).public_key(key.public_key())
            .serial_number(1).not_valid_before(_FOREVER[0]).not_valid_after(_FOREVER[1])
            .add_extension(x509.BasicConstraints(ca=True, path_length=1), critical=True).sign(key, None))
    return cert.public_bytes(serialization.Encoding.PEM)


@lru_cache(maxsize=65536)
def anchor_pem(public_key: bytes) -> bytes:
    """The trust anchor that pins the node whose identity key is `public_key`: its node id and
    that key. Signed by the public network root key only because a certificate must carry some
    signature; no TLS stack checks an anchor's (module docstring)."""
    name = _node_name(node_id_of(public_key).hex())
    cert = _ca(name, name, _ed25519(public_key), _serial(b"anchor", public_key)).sign(_network_root_key(), None)
    return cert.public_bytes(serialization.Encoding.PEM)


@lru_cache(maxsize=1024)
def introduction_pem(public_key: bytes) -> bytes:
    """The network root's certificate for `public_key`: what lets a caller's leaf chain to the
    network root in a server's handshake (no trust: the server checks the leaf itself)."""
    name = _node_name(node_id_of(public_key).hex())
    cert = _ca(name, _ROOT_NAME, _ed25519(public_key), _serial(b"introduction", public_key)).sign(
        _network_root_key(), None)
    return cert.public_bytes(serialization.Encoding.PEM)


def bound_leaf(identity: Identity, key_pem: bytes, days: int = 3650) -> bytes:
    """A TLS leaf certificate for the key in `key_pem`, issued and signed by `identity`."""
    key = serialization.load_pem_private_key(key_pem, password=None)
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, _ORG),
                                 x509.NameAttribute(NameOID.COMMON_NAME, "tls")]))
        .issuer_name(_node_name(identity.node_id_hex))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - NOT_BEFORE_BACKDATE)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(SERVER_NAME)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(identity.private_key, None)
    )
    return cert.public_bytes(serialization.Encoding.PEM)


@lru_cache(maxsize=8192)
def leaf_node_id(cert_pem: bytes) -> str | None:
    """The node id (hex) whose key a leaf names as its issuer; None if it names none."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        names = cert.issuer.get_attributes_for_oid(NameOID.COMMON_NAME)
    except ValueError:
        return None
    value = names[0].value if len(names) == 1 else ""
    if isinstance(value, bytes) or len(value) != 64:
        return None
    try:
        return bytes.fromhex(value).hex()
    except ValueError:
        return None


@lru_cache(maxsize=8192)
def leaf_signed_by(cert_pem: bytes, public_key: bytes) -> bool:
    """Whether the certificate is issued, and signed, by the node whose identity key is `public_key`."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        if leaf_node_id(cert_pem) != node_id_of(public_key).hex():
            return False
        _ed25519(public_key).verify(cert.signature, cert.tbs_certificate_bytes)
    except (ValueError, InvalidSignature, TlsError, TypeError):
        return False
    return True


def caller_certificate(context) -> bytes | None:
    """The leaf certificate (PEM) a gRPC caller presented in the TLS handshake, if any. Only
    servers made with `identify_callers` ask for one; the handshake checked only that it
    chains to the public network root: the handler checks `leaf_signed_by` itself."""
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


def server_credentials(tls: TlsIdentity, identify_callers: bool = False) -> grpc.ServerCredentials:
    """Server credentials; with `identify_callers`, clients must present a certificate chained to
    the public network root, which the handler then checks against the registry."""
    pair = [(tls.key_pem, tls.cert_pem)]
    if not identify_callers:
        return grpc.ssl_server_credentials(pair)
    return grpc.ssl_server_credentials(pair, root_certificates=network_root_pem(), require_client_auth=True)


def new_server(tls: TlsIdentity, listen: str, identify_callers: bool = False) -> tuple[grpc.aio.Server, int]:
    """A grpc.aio server bound to `listen` ("127.0.0.1:0" picks a free port); returns the port."""
    server = grpc.aio.server(options=server_options())
    port = server.add_secure_port(listen, server_credentials(tls, identify_callers))
    if port == 0:
        raise TlsError(f"cannot listen on {listen}")
    return server, port


def pinned_channel(address: str, pinned_cert_pem: bytes, own: TlsIdentity | None = None) -> grpc.aio.Channel:
    """An aio channel that trusts only `pinned_cert_pem` (a node's anchor, or a verifier's
    certificate) and presents `own` for mutual TLS."""
    creds = grpc.ssl_channel_credentials(
        root_certificates=pinned_cert_pem,
        private_key=own.key_pem if own else None,
        certificate_chain=own.client_chain if own else None,
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
    try:
        presented = fetch_certificate(address, timeout)
    except OSError as exc:
        return TlsError(f"cannot reach {address}: {exc}")
    pinned_key = anchor_key(pinned_cert_pem)
    if pinned_key is not None:  # a node pinned by its key
        if not leaf_signed_by(presented, pinned_key):
            return PinnedCertificateError(
                f"{address} presented a certificate of node {str(leaf_node_id(presented))[:16]} (sha256:"
                f"{fingerprint(presented)}), not one signed by the pinned key of node "
                f"{node_id_of(pinned_key).hex()[:16]}; refusing to talk to it")
    elif fingerprint(presented) != fingerprint(pinned_cert_pem):
        return PinnedCertificateError(
            f"{address} presented certificate sha256:{fingerprint(presented)}, but the genesis pins "
            f"sha256:{fingerprint(pinned_cert_pem)}; refusing to talk to it"
        )
    return TlsError(f"TLS handshake with {address} failed although its certificate is the pinned one "
                    "(does it require a client certificate this node does not have?)")


def anchor_key(cert_pem: bytes) -> bytes | None:
    """The Ed25519 key an anchor (`anchor_pem`) pins; None for any other certificate."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = cert.public_key()
    except ValueError:
        return None
    if not isinstance(key, Ed25519PublicKey) or cert.subject != cert.issuer:
        return None
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


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
