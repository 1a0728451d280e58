"""Pinned gRPC channels to peers, opened once and reused.

Opening a TLS channel costs a handshake; relays, proxies and model nodes talk to the same few
neighbours all the time, so channels are cached. A channel to a peer that went away is
dropped (`forget`) so that the next use starts afresh.

Pinning is by node id: a connection names the node it wants (`ChannelPool.to(peer)`, a
`gentorrent.ledger.peers.Peer` or a registry record), and accepts only certificates signed by
the Ed25519 key the registry holds for that node id (`tls.anchor_pem`); the address is only
where to dial. Verifiers, pinned by the genesis' certificates, are dialled with `get`.
"""

from __future__ import annotations

from typing import Protocol

import grpc

from gentorrent.crypto import tls


class Pinned(Protocol):
    """What a channel needs of a registered peer: where to dial, and the key it is pinned by."""

    address: str
    public_key: bytes


class ChannelPool:
    def __init__(self, own: tls.TlsIdentity | None = None) -> None:
        """`own`: the certificate this node presents to servers that ask for one (relays)."""
        self.own = own
        self._channels: dict[tuple[str, bytes], grpc.aio.Channel] = {}

    def get(self, address: str, cert_pem: bytes) -> grpc.aio.Channel:
        key = (address, cert_pem)  # bytes hash once and cache it: cheap on the hot path
        channel = self._channels.get(key)
        if channel is None:
            channel = tls.pinned_channel(address, cert_pem, self.own)
            self._channels[key] = channel
        return channel

    def to(self, peer: Pinned) -> grpc.aio.Channel:
        """A channel to the node `peer` names, accepting only certificates its registered key signed."""
        return self.get(peer.address, tls.anchor_pem(peer.public_key))

    async def forget(self, address: str) -> None:
        for key in [k for k in self._channels if k[0] == address]:
            await self._channels.pop(key).close()

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()
