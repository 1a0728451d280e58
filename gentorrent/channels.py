"""Pinned gRPC channels to peers, opened once and reused.

Opening a TLS channel costs a handshake; relays, proxies and model nodes talk to the same few
neighbours all the time, so channels are cached by (address, pinned certificate). A channel
to a peer that went away is dropped (`forget`) so that the next use starts afresh.
"""

from __future__ import annotations

import grpc

from gentorrent.crypto import tls

from typing import Callable

#: where a node finds the certificate to pin for an address (None: not a registered peer)
CertLookup = Callable[[str], "bytes | None"]


class ChannelPool:
    def __init__(self, own: tls.TlsIdentity | None = None) -> None:
        self.own = own
        self._channels: dict[tuple[str, bytes], grpc.aio.Channel] = {}

    def get(self, address: str, cert_pem: bytes) -> grpc.aio.Channel:
        key = (address, cert_pem)  # bytes hash once and cache it: cheap on the hot path
        channel = self._channels.get(key)
        if channel is None:
            channel = tls.pinned_channel(address, cert_pem, self.own)
            self._channels[key] = channel
        return channel

    async def forget(self, address: str) -> None:
        for key in [k for k in self._channels if k[0] == address]:
            await self._channels.pop(key).close()

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()
