"""Who a peer is: the registry as a connection sees it.

Pinning is by node id (ARCHITECTURE.md §3.1-3.2). A connection names the node it wants
(`ChannelPool.to(peer)`), and the only certificates it accepts are those signed by the Ed25519
key the registry holds for that node id (gentorrent.crypto.tls); the address is only where to
dial. So a second registration of somebody's address cannot redirect traffic meant for them:
the attacker cannot sign for the key pinned for the node the connection names. `PeerIndex` is
the registry seen this way: node id -> (role, address, key), and the caller of a server is the
registered node whose key signed the leaf certificate it presented (a predecessor is a key, not
a claimed address).
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
    """A registered node as a connection sees it: who (node id), what, where, which key."""

    node_id: str  # hex
    role: str  # USER (runs a relay) or MODEL
    address: str
    public_key: bytes  # Ed25519: what its certificates and its signed hellos are checked with


#: node id (hex) -> the registered peer, or None
PeerLookup = Callable[[str], "Peer | None"]


class PeerIndex:
    """The peers this node holds by node id, rebuilt from the directory; others looked up by id."""

    def __init__(self, directory: Directory) -> None:
        """A node this index does not hold yet is looked up by id (`resolve`)."""
        self.directory = directory
        self.version = 0
        self._by_id: dict[str, Peer] = {}
        self.rebuild()

    def rebuild(self) -> None:
        by_id: dict[str, Peer] = {}
        for role, records in ((USER, self.directory.users()), (MODEL, self.directory.models())):
            for r in records:
                by_id[r.node_id_hex] = Peer(r.node_id_hex, role, r.address, r.public_key)
        if by_id != self._by_id:
            self._by_id = by_id
            self.version += 1

    def get(self, node_id: str) -> Peer | None:
        return self._by_id.get(node_id)

    async def resolve(self, node_id: str) -> Peer | None:
        """The peer `node_id`, looked up in the registry (by node id, with a proof) when this
        node does not hold it yet: a node met on a link, never the whole registry."""
        peer = self._by_id.get(node_id)
        if peer is not None:
            return peer
        try:
            raw = bytes.fromhex(node_id)
        except ValueError:
            return None
        if len(raw) != 32:
            return None
        for role, lookup in ((USER, self.directory.user), (MODEL, self.directory.model)):
            try:
                record = await lookup(raw)
            except Exception:  # noqa: BLE001 - the committee out of reach: a miss, as before
                return None
            if record is not None:
                peer = Peer(record.node_id_hex, role, record.address, record.public_key)
                self._by_id[node_id] = peer
                self.version += 1
                return peer
        return None

    async def identify_caller(self, cert_pem: bytes | None) -> Peer | None:
        """`identify`, looking up the node the caller's leaf names when it is not held yet."""
        peer = self.identify(cert_pem)
        node_id = tls.leaf_node_id(cert_pem) if cert_pem and peer is None else None
        if node_id is not None and await self.resolve(node_id) is not None:
            peer = self.identify(cert_pem)
        return peer

    def user(self, node_id: str) -> Peer | None:
        peer = self.get(node_id)
        return peer if peer is not None and peer.role == USER else None

    def model(self, node_id: str) -> Peer | None:
        peer = self.get(node_id)
        return peer if peer is not None and peer.role == MODEL else None

    def identify(self, cert_pem: bytes | None) -> Peer | None:
        """The registered node whose key signed the leaf `cert_pem` a caller presented in its
        TLS handshake, or None (a stranger, or a leaf signed by another key than its node's)."""
        node_id = tls.leaf_node_id(cert_pem) if cert_pem else None
        peer = self.get(node_id) if node_id else None
        if peer is None or not tls.leaf_signed_by(cert_pem, peer.public_key):
            return None
        return peer
