"""The floor of an overlay path: bare gRPC stream hops that only pass frames on (benchmarks only).

A `bare hop` is one process with one TLS server (mutual TLS, as a relay's: its leaf signed by
its identity key, pinned by that key; callers present a leaf chained to the public network
root, gentorrent.crypto.tls) and one
long-lived outbound Link stream to the next hop towards the source; every LinkFrame it reads
from that stream it writes back on the stream its caller (the next hop towards the sink)
opened: no layer, no lookup, no crypto beyond TLS. That is the direction replies take in the
overlay: links are opened towards the model node (user -> hop 1 -> hop 2 -> proxy -> model
node), replies flow back against it, read on the client side of a stream and written on the
server side of the next. Chained source <- hop l <- ... <- hop 1 <- sink (arrows: who dials
whom), l = 3 and four such paths, it carries reply messages of the overlay's shape (one clove
frame per path and message, of the reply clove's size) over the same number of processes,
links, gRPC reads and writes, in the same direction, as the overlay's replies. What it costs
is what an overlay reply message cannot cost less than in this stack; bench/overlay.py
--stream measures both in one run.

    python -m testkit.bare_chain --dir DIR --next-address HOST:PORT --next-cert FILE   # next: towards the source

prints {"address": ...} once listening; DIR holds its tls.crt.pem / tls.key.pem, the chain it
presents as a caller (chain.pem) and its pin (tls.pin.pem, what the hop that dials it trusts);
stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from pathlib import Path
from typing import Callable

import grpc

from gentorrent.crypto import tls
from gentorrent.crypto.keys import Identity
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc


CHAIN_FILE = "chain.pem"


def make_identity(directory: Path) -> tls.TlsIdentity:
    """A fresh key-bound TLS identity written to `directory` (as a relay's: tls.TlsIdentity.bound),
    with its pin (tls.PIN_FILE)."""
    directory.mkdir(parents=True, exist_ok=True)
    identity = Identity.generate()
    own = tls.TlsIdentity.bound(identity)
    (directory / tls.CERT_FILE).write_bytes(own.cert_pem)
    (directory / tls.KEY_FILE).write_bytes(own.key_pem)
    (directory / CHAIN_FILE).write_bytes(own.client_chain)
    (directory / tls.PIN_FILE).write_bytes(tls.anchor_pem(identity.public_key))
    return own


def load_identity(directory: Path) -> tls.TlsIdentity:
    return tls.TlsIdentity(*((directory / name).read_bytes() for name in (tls.CERT_FILE, tls.KEY_FILE, CHAIN_FILE)))


class BareHop(rpc.RelayServicer):
    """Passes every frame from the hop towards the source on to its caller, unchanged."""

    def __init__(self, own: tls.TlsIdentity, next_address: str, next_cert: bytes) -> None:
        self.own = own
        self.next_address, self.next_cert = next_address, next_cert
        self._channel: grpc.aio.Channel | None = None

    async def Link(self, request_iterator, context) -> None:
        if self._channel is None:
            self._channel = await tls.connect(self.next_address, self.next_cert, self.own)
        upstream = rpc.RelayStub(self._channel).Link()
        await upstream.write(pb.LinkFrame())  # opens the stream at the next hop
        while True:
            frame = await upstream.read()
            if frame is grpc.aio.EOF:
                return
            await context.write(frame)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()


class BareSource(rpc.RelayServicer):
    """The start of bare paths (where a model node would be): each hop that dials it gets the
    frames `send` is given for its path, written on the server side as a model node's are."""

    def __init__(self) -> None:
        self.paths: list[asyncio.Queue] = []
        self.opened = asyncio.Event()
        self.expected = 0

    def send(self, path: int, frame: pb.LinkFrame) -> None:
        self.paths[path].put_nowait(frame)

    async def Link(self, request_iterator, context) -> None:
        queue: asyncio.Queue = asyncio.Queue()
        self.paths.append(queue)
        await context.read()  # the opening frame
        if len(self.paths) >= self.expected:
            self.opened.set()
        while True:
            await context.write(await queue.get())


class BareSink:
    """The end of bare paths (where the user is): dials each path's first hop and counts the
    frames that come back, calling `on_frame` for each."""

    def __init__(self, own: tls.TlsIdentity, on_frame: Callable[[pb.LinkFrame], None]) -> None:
        self.own = own
        self.on_frame = on_frame
        self.frames = 0
        self._channels: list[grpc.aio.Channel] = []
        self._tasks: list[asyncio.Task] = []

    async def dial(self, address: str, cert: bytes) -> None:
        channel = await tls.connect(address, cert, self.own)
        self._channels.append(channel)
        call = rpc.RelayStub(channel).Link()
        await call.write(pb.LinkFrame())
        self._tasks.append(asyncio.ensure_future(self._read(call)))

    async def _read(self, call) -> None:
        while True:
            frame = await call.read()
            if frame is grpc.aio.EOF:
                return
            self.frames += 1
            self.on_frame(frame)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for channel in self._channels:
            await channel.close()


async def _serve(directory: Path, next_address: str, next_cert: bytes) -> None:
    own = load_identity(directory)
    hop = BareHop(own, next_address, next_cert)
    server, port = tls.new_server(own, "127.0.0.1:0", identify_callers=True)
    rpc.add_RelayServicer_to_server(hop, server)
    await server.start()
    print(json.dumps({"address": f"127.0.0.1:{port}"}), flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(None)
    await hop.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m testkit.bare_chain", description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, type=Path)
    ap.add_argument("--next-address", required=True)
    ap.add_argument("--next-cert", required=True, type=Path)
    args = ap.parse_args(argv)
    asyncio.run(_serve(args.dir, args.next_address, args.next_cert.read_bytes()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
