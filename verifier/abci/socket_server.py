"""The registry app served over CometBFT's ABCI socket protocol (v0.38), for `--abci-socket`.

Wire format: a stream of protobuf `Request`s (proto/abci/types.proto, CometBFT's field
numbers), each preceded by its length as an unsigned base-128 varint, answered in order by
`Response`s framed the same way. CometBFT opens four connections (consensus, mempool, query,
snapshot) and sends `Flush` whenever it waits for answers; every response before the Flush
response has then been written out. Responses are written as soon as they are computed, so
Flush only has to drain the socket.

All connections share one event loop and the app is synchronous, so requests from the four
connections are applied one at a time, each completely, in arrival order: the app needs no
locks. An app error answers `ResponseException` (CometBFT stops the node on it, which is right
for an out-of-order call); a malformed frame answers `ResponseException` and closes that
connection.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from importlib import metadata
from pathlib import Path
from typing import Callable

from google.protobuf.message import DecodeError

from gentorrent.config import WIRE
from gentorrent.varint import encode_uvarint
from gentorrent.wire.abci import types_pb2 as abci
from verifier.abci.interface import Application, BlockContext, ValidatorInfo

log = logging.getLogger(__name__)

#: CometBFT opens 4; a few spare for `abci-cli` and tests
MAX_CONNECTIONS = 16
#: a frame that has started must finish within this (an idle connection may wait forever:
#: CometBFT's mempool and snapshot connections are silent for long stretches)
FRAME_TIMEOUT_S = 3 * WIRE.rpc_timeout_s
MAX_VARINT_BYTES = 10
APP_NAME = "gentorrent-registry"


class FrameError(ValueError):
    """A malformed or oversized ABCI frame."""


# --------------------------------------------------------------------------- framing (pure)


def frame(message: bytes) -> bytes:
    """`message` with its uvarint length prefix."""
    return encode_uvarint(len(message)) + message


def decode_uvarint(data: bytes, pos: int = 0) -> tuple[int, int]:
    """(value, position after it); FrameError if truncated or longer than 10 bytes."""
    value = shift = 0
    for i in range(MAX_VARINT_BYTES):
        if pos + i >= len(data):
            raise FrameError("truncated varint")
        byte = data[pos + i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos + i + 1
        shift += 7
    raise FrameError("varint longer than 10 bytes")


async def read_frame(reader: asyncio.StreamReader, limit: int = WIRE.max_abci_message_bytes) -> bytes | None:
    """The next message, or None at a clean end of stream."""
    first = await reader.read(1)  # idle wait: no timeout, see FRAME_TIMEOUT_S
    if not first:
        return None
    return await asyncio.wait_for(_rest_of_frame(reader, first, limit), FRAME_TIMEOUT_S)


async def _rest_of_frame(reader: asyncio.StreamReader, first: bytes, limit: int) -> bytes:
    prefix = bytearray(first)
    while prefix[-1] & 0x80:
        if len(prefix) >= MAX_VARINT_BYTES:
            raise FrameError("length prefix longer than 10 bytes")
        prefix += await reader.readexactly(1)
    length, _ = decode_uvarint(bytes(prefix))
    if length > limit:
        raise FrameError(f"frame of {length} bytes exceeds the limit of {limit}")
    return await reader.readexactly(length)


# --------------------------------------------------------------------------- request -> app


def _time_ms(ts: abci.Timestamp) -> int:
    return ts.seconds * 1000 + ts.nanos // 1_000_000


def cometbft_address(public_key: bytes) -> bytes:
    """CometBFT's validator address of an Ed25519 key: SHA-256(key)[:20]."""
    return hashlib.sha256(public_key).digest()[:20]


def _version() -> str:
    try:
        return metadata.version("gentorrent")
    except metadata.PackageNotFoundError:
        return "0"


class AbciHandler:
    """Maps one decoded ABCI Request to the app and back to a Response (no I/O)."""

    def __init__(self, app: Application):
        self.app = app

    def _key_of(self, address: bytes) -> bytes:
        """The Ed25519 key behind a CometBFT address, when the app knows its committee."""
        validators: Callable[[], tuple[ValidatorInfo, ...]] | None = getattr(self.app, "validators", None)
        if validators is not None:
            for v in validators():
                if cometbft_address(v.public_key) == address:
                    return v.public_key
        return address

    def _ctx(self, r, with_hash: bool = True) -> BlockContext:
        return BlockContext(height=r.height, time_ms=_time_ms(r.time), proposer=self._key_of(r.proposer_address),
                            hash=r.hash if with_hash else b"",
                            misbehavior=tuple(self._key_of(m.validator.address) for m in r.misbehavior))

    def handle(self, req: abci.Request) -> abci.Response:
        kind = req.WhichOneof("value")
        try:
            method = getattr(self, f"_{kind}") if kind else None
            if method is None:
                return abci.Response(exception=abci.ResponseException(error=f"unsupported request {kind!r}"))
            return method(getattr(req, kind))
        except Exception as exc:  # noqa: BLE001 - reported to CometBFT, which halts on it
            log.exception("ABCI %s failed", kind)
            return abci.Response(exception=abci.ResponseException(error=f"{kind}: {type(exc).__name__}: {exc}"))

    def _echo(self, r) -> abci.Response:
        return abci.Response(echo=abci.ResponseEcho(message=r.message))

    def _flush(self, r) -> abci.Response:
        return abci.Response(flush=abci.ResponseFlush())

    def _info(self, r) -> abci.Response:
        i = self.app.info()
        return abci.Response(info=abci.ResponseInfo(
            data=APP_NAME, version=_version(), app_version=i.app_version, last_block_height=i.last_block_height,
            last_block_app_hash=i.last_block_app_hash))

    def _init_chain(self, r) -> abci.Response:
        validators = []
        for v in r.validators:
            if v.pub_key.WhichOneof("sum") != "ed25519":
                raise ValueError("only Ed25519 validators are supported")
            validators.append(ValidatorInfo(public_key=v.pub_key.ed25519, power=v.power))
        app_hash = self.app.init_chain(r.chain_id, validators, r.app_state_bytes, _time_ms(r.time))
        return abci.Response(init_chain=abci.ResponseInitChain(app_hash=app_hash))

    def _query(self, r) -> abci.Response:
        q = self.app.query(r.path, r.data, r.height)
        return abci.Response(query=abci.ResponseQuery(code=q.code, log=q.log, value=q.value, height=q.height,
                                                      key=r.data, codespace="" if q.code == 0 else APP_NAME))

    def _check_tx(self, r) -> abci.Response:
        res = self.app.check_tx(r.tx)
        return abci.Response(check_tx=abci.ResponseCheckTx(
            code=res.code, log=res.log, gas_wanted=1, events=_events(res.events),
            codespace="" if res.ok else APP_NAME))

    def _commit(self, r) -> abci.Response:
        return abci.Response(commit=abci.ResponseCommit(retain_height=self.app.commit()))

    def _prepare_proposal(self, r) -> abci.Response:
        txs = self.app.prepare_proposal(list(r.txs), r.max_tx_bytes, self._ctx(r, with_hash=False))
        return abci.Response(prepare_proposal=abci.ResponsePrepareProposal(txs=txs))

    def _process_proposal(self, r) -> abci.Response:
        ok = self.app.process_proposal(list(r.txs), self._ctx(r))
        status = abci.ResponseProcessProposal.ACCEPT if ok else abci.ResponseProcessProposal.REJECT
        return abci.Response(process_proposal=abci.ResponseProcessProposal(status=status))

    def _finalize_block(self, r) -> abci.Response:
        res = self.app.finalize_block(list(r.txs), self._ctx(r))
        return abci.Response(finalize_block=abci.ResponseFinalizeBlock(
            tx_results=[abci.ExecTxResult(code=t.code, log=t.log, events=_events(t.events),
                                          codespace="" if t.ok else APP_NAME) for t in res.tx_results],
            validator_updates=[abci.ValidatorUpdate(pub_key=abci.PublicKey(ed25519=v.public_key), power=v.power)
                               for v in res.validator_updates],
            app_hash=res.app_hash))

    # vote extensions are not used (CometBFT asks only if enabled at a height)
    def _extend_vote(self, r) -> abci.Response:
        return abci.Response(extend_vote=abci.ResponseExtendVote())

    def _verify_vote_extension(self, r) -> abci.Response:
        status = (abci.ResponseVerifyVoteExtension.ACCEPT if not r.vote_extension
                  else abci.ResponseVerifyVoteExtension.REJECT)
        return abci.Response(verify_vote_extension=abci.ResponseVerifyVoteExtension(status=status))

    # state sync is not offered: no snapshots, refuse any offered
    def _list_snapshots(self, r) -> abci.Response:
        return abci.Response(list_snapshots=abci.ResponseListSnapshots())

    def _offer_snapshot(self, r) -> abci.Response:
        return abci.Response(offer_snapshot=abci.ResponseOfferSnapshot(result=abci.ResponseOfferSnapshot.ABORT))

    def _load_snapshot_chunk(self, r) -> abci.Response:
        return abci.Response(load_snapshot_chunk=abci.ResponseLoadSnapshotChunk())

    def _apply_snapshot_chunk(self, r) -> abci.Response:
        return abci.Response(apply_snapshot_chunk=abci.ResponseApplySnapshotChunk(
            result=abci.ResponseApplySnapshotChunk.ABORT))


def _events(pairs: tuple[tuple[str, str], ...]) -> list[abci.Event]:
    if not pairs:
        return []
    return [abci.Event(type="registry",
                       attributes=[abci.EventAttribute(key=k, value=v, index=True) for k, v in pairs])]


# --------------------------------------------------------------------------- the server (shell)


class _Connections:
    def __init__(self, handler: AbciHandler):
        self.handler = handler
        self.open = 0

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open >= MAX_CONNECTIONS:
            writer.close()
            return
        self.open += 1
        peer = writer.get_extra_info("peername")
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError) as exc:
            log.info("ABCI connection %s ended: %s", peer, exc or type(exc).__name__)
        finally:
            self.open -= 1
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                data = await read_frame(reader)
                if data is None:
                    return
                req = abci.Request.FromString(data)
            except (FrameError, DecodeError) as exc:
                writer.write(frame(abci.Response(exception=abci.ResponseException(
                    error=f"malformed request: {exc}")).SerializeToString()))
                await asyncio.wait_for(writer.drain(), FRAME_TIMEOUT_S)
                return
            resp = self.handler.handle(req)
            writer.write(frame(resp.SerializeToString()))
            if req.WhichOneof("value") == "flush":
                await asyncio.wait_for(writer.drain(), FRAME_TIMEOUT_S)


def parse_address(address: str) -> tuple[str, str | tuple[str, int]]:
    """("unix", path) or ("tcp", (host, port)) from "unix:///p", "tcp://h:p" or "h:p"."""
    if address.startswith("unix://"):
        return "unix", address[len("unix://"):]
    rest = address[len("tcp://"):] if address.startswith("tcp://") else address
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"ABCI address must be tcp://host:port or unix:///path, got {address!r}")
    return "tcp", (host.strip("[]") or "127.0.0.1", int(port))


async def serve(app: Application, address: str) -> asyncio.AbstractServer:
    """Start serving `app` at `address` (e.g. "tcp://127.0.0.1:26658"); returns the started
    asyncio server (`close()` + `await wait_closed()` to stop; port 0 picks a free port, see
    `bound_address`)."""
    handler = _Connections(AbciHandler(app))
    kind, where = parse_address(address)
    if kind == "unix":
        path = Path(str(where))
        if path.exists():
            path.unlink()  # a stale socket from a previous run
        return await asyncio.start_unix_server(handler, path=str(path), limit=2**16)
    host, port = where  # type: ignore[misc]
    return await asyncio.start_server(handler, host=host, port=port, limit=2**16)


def bound_address(server: asyncio.AbstractServer) -> str:
    """"tcp://host:port" (or "unix://path") the server actually listens on."""
    name = server.sockets[0].getsockname()
    if isinstance(name, str):
        return f"unix://{name}"
    return f"tcp://{name[0]}:{name[1]}"


# --------------------------------------------------------------------------- standalone entry point


async def run_until_stopped(app: Application, address: str) -> None:
    """Serve until SIGINT / SIGTERM, then close the listener and return."""
    import signal

    server = await serve(app, address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info("ABCI socket server listening on %s", bound_address(server))
    print(f"ABCI socket server listening on {bound_address(server)}", flush=True)
    try:
        await stop.wait()
    finally:
        server.close()
        await server.wait_closed()


def main(argv: list[str] | None = None) -> int:
    """`python -m verifier.abci.socket_server --db STATE.db --listen tcp://127.0.0.1:26658`
    (what `gt-verifier start --abci-socket ADDR` does, without the verifier's other duties)."""
    import argparse

    from verifier.abci.app import RegistryApp

    parser = argparse.ArgumentParser(prog="python -m verifier.abci.socket_server", description=main.__doc__)
    parser.add_argument("--db", type=Path, required=True, help="the app's SQLite state file")
    parser.add_argument("--listen", default="tcp://127.0.0.1:26658", help="tcp://host:port or unix:///path")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        parse_address(args.listen)
    except ValueError as exc:
        parser.error(str(exc))
    app = RegistryApp(args.db)
    try:
        asyncio.run(run_until_stopped(app, args.listen))
    finally:
        app.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
