"""Who a peer is: the registry as a connection sees it.

Pinning is by node id (ARCHITECTURE.md §3.1-3.2). A connection names the node it wants
(`ChannelPool.to(peer)`), and the only certificate it accepts is the one the registry holds for
that node id; the address is only where to dial. So a second registration of somebody's
address cannot redirect traffic meant for them: the attacker's certificate is not the one
pinned for the node the connection names. `PeerIndex` is the registry seen this way: node id
-> (role, address, certificate), and certificate -> node id for servers that must say who
called them (a predecessor is a certificate, not a claimed address). A record whose
certificate names another node id (`tls.cert_node_id`) is left out, so one certificate never
stands for two nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from gentorrent.crypto import tls
from gentorrent.ledger.directory import Directory

USER = "user"
MODEL = "model"


@dataclass(frozen=True)
class Peer:
    """A registered node as a connection sees it: who (node id), what, where, which certificate."""

    node_id: str  # hex
    role: str  # USER (runs a relay) or MODEL
    address: str
    cert_pem: bytes
    public_key: bytes = b""  # Ed25519: what a model node checks a proxy's signed hello with


#: node id (hex) -> the registered peer, or None
PeerLookup = Callable[[str], "Peer | None"]


class PeerIndex:
    """The directory by node id and by certificate, rebuilt when the directory changes."""

    def __init__(self, directory: Directory, on_miss: Callable[[], None] | None = None) -> None:
        """`on_miss` is called when a lookup finds nothing: the node may want to re-read a
        directory in which a peer that just registered is missing."""
        self.directory = directory
        self.on_miss = on_miss
        self.version = 0
        self._by_id: dict[str, Peer] = {}
        self._by_cert: dict[bytes, str] = {}
        self._roots_sent = -1
        self.rebuild()

    def rebuild(self) -> None:
        by_id: dict[str, Peer] = {}
        for role, records in ((USER, self.directory.users()), (MODEL, self.directory.models())):
            for r in records:
                if tls.cert_node_id(r.tls_cert_pem) != r.node_id_hex:
                    continue  # a certificate naming another node: never pinned, never admitted
                by_id[r.node_id_hex] = Peer(r.node_id_hex, role, r.address, r.tls_cert_pem, r.public_key)
        if by_id != self._by_id:
            self._by_id = by_id
            self._by_cert = {tls.fingerprint(p.cert_pem): p.node_id for p in by_id.values()}
            self.version += 1

    def get(self, node_id: str) -> Peer | None:
        peer = self._by_id.get(node_id)
        if peer is None and self.on_miss is not None:
            self.on_miss()
        return peer

    def user(self, node_id: str) -> Peer | None:
        peer = self.get(node_id)
        return peer if peer is not None and peer.role == USER else None

    def model(self, node_id: str) -> Peer | None:
        peer = self.get(node_id)
        return peer if peer is not None and peer.role == MODEL else None

    def identify(self, cert_pem: bytes | None) -> Peer | None:
        """The registered node that presented `cert_pem` in a TLS handshake, or None. Compared
        by fingerprint (SHA-256 of the DER), not by PEM text, which encoders lay out differently."""
        try:
            node_id = self._by_cert.get(tls.fingerprint(cert_pem)) if cert_pem else None
        except tls.TlsError:
            return None
        return self._by_id.get(node_id) if node_id else None

    def client_roots(self) -> bytes | None:
        """For tls.server_credentials: every registered certificate, or None if unchanged
        since the last call (gRPC then keeps the roots it has)."""
        if self._roots_sent == self.version:
            return None
        self._roots_sent = self.version
        return b"".join(sorted(p.cert_pem for p in self._by_id.values())) or None
