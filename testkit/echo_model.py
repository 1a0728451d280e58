"""The echo stand-in model node, honest or misbehaving on purpose (tests and benchmarks only).

`EchoModelNode` is a real ModelNode gRPC server with the real clove intake, real keys, TLS and
signed receipts, whose "engine" echoes the prompt back. It can be told to stall (to kill relays
while a request is in flight) or to stream slowly in several chunks (to kill or pause the model
node itself mid-stream). It exists to measure and test the overlay alone; the real model node
(model_node) plugs the same intake into vLLM.

Misbehaving variants are fault drills for the user client, each aimed at one of its checks, so a
test proves that check holds on real processes (`--misbehave KIND`):

- `garbage`: every reply message is random bytes, sealed with the right reply keys and split
  into correctly tagged cloves. The cloves pass every layer of crypto; only the decoder of
  the reply message (sealing.ReplyOpener.message) stands between them and the user.
- `bad-signature`: a well-formed reply, the right text, a receipt naming this node and covering
  the right prompt and tokens, whose Ed25519 signature has one bit flipped. Only the receipt
  check (asking.receipt_is_valid) refuses it.

    python -m testkit.echo_model --home DIR (--directory FILE | --committee GENESIS) [--gossip] [--misbehave KIND]
                                 [--listen H:P [--advertise H:P]] [--model NAME]

With --committee it registers itself as `gt-model serve --committee` does, and writes the same
`node.json` to its home (what the devnet's `--echo` model nodes are).
"""

from __future__ import annotations

import asyncio
import os
import time

import grpc
from pathlib import Path
from typing import AsyncIterator

from gentorrent import generation, receipts
from gentorrent.channels import ChannelPool
from gentorrent.config import CLOVES, MODEL_NODE, OVERLAY, CloveParams, OverlayParams
from gentorrent.crypto import sida, tls
from gentorrent.crypto.keys import NodeKeys
from gentorrent.ledger.directory import Directory, ModelRecord, StaticDirectory
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc
from gentorrent.routing.group import GroupRouting, LocalLoad
from model_node.gossip import GroupGossip
from model_node.intake import CloveIntake

ECHO_PREFIX = "echo: "


def prompt_text(request: pb.GenerateRequest) -> str:
    if request.messages:
        return "\n".join(f"{m.role}: {m.content}" for m in request.messages)
    return request.prompt


class EchoModelNode(rpc.ModelNodeServicer):
    """A ModelNode server whose engine echoes; real keys, TLS, receipts and clove intake."""

    def __init__(self, home: Path, directory_path: Path | Directory, model: str = MODEL_NODE.default_model,
                 chunks: int = 1, cloves: CloveParams = CLOVES, params: OverlayParams = OVERLAY,
                 chunk_delay_s: float = 0.0, context_bytes: int | None = None,
                 stream_tokens: int | None = None, stream_s: float = 0.0, gossip: bool = False,
                 listen: str = "127.0.0.1:0", advertise: str | None = None) -> None:
        """`directory_path`: a static directory file, or any Directory (a CommitteeDirectory:
        then the stand-in registers itself with the committee, as `gt-model serve` does).
        `context_bytes`: the echo engine's "context"; a longer prompt is refused as the
        real engine refuses one longer than its context (or, set very low, a node that
        refuses honest asks by calling them too long). `stream_tokens`: a request for at least
        this many tokens (max_tokens) is answered with exactly this many (the echo, repeated
        or cut), one chunk per token, spread evenly over `stream_s` seconds on a fixed
        schedule (the first at once): an engine generating at a steady rate, as
        bench/overlay.py --stream needs; shorter requests get the one-chunk echo. `gossip`: take
        part in the model group's gossip (model_node.gossip.GroupGossip: signed rounds to every
        trusted node of its model in the directory, every `gossip_interval_s`), as a group member
        does; the echo engine's load is what it serves, its subtree stays empty (no prefix cache)."""
        self.home = Path(home)
        self.directory = directory_path if hasattr(directory_path, "models") else StaticDirectory(directory_path)
        self.model = model
        self.chunks = chunks
        self.chunk_delay_s = chunk_delay_s  # pause before every chunk after the first
        self.stream_tokens = stream_tokens
        self.stream_s = stream_s
        self.keys = NodeKeys.load_or_create(self.home)
        self.tls = tls.TlsIdentity.load_or_create(self.home, self.keys.identity)
        self.channels = ChannelPool(own=self.tls)
        self.intake = CloveIntake(self.keys.identity.node_id_hex, self.keys.onion, self.generate, self.directory,
                                  self.channels, cloves, params)
        self.gate: asyncio.Event | None = None  # when set to an Event, generation waits for it
        self.received = asyncio.Event()  # set when a query was decoded
        self.prompts: list[str] = []
        self.requests: list[pb.GenerateRequest] = []  # every decoded query, as the node saw it
        self.context_bytes = context_bytes
        self.listen, self.advertise = listen, advertise  # where it listens, and registers (behind NAT)
        self.address = ""
        self.weights_digest = ""  # what it registers as its weights' digest (gentorrent.ledger.catalogue)
        self._server = None
        self.gossip: GroupGossip | None = None
        if gossip:
            group = GroupRouting(self.keys.identity.node_id_hex, 1, 100_000, version_base=int(time.time() * 1000))
            self.gossip = GroupGossip(self.keys.identity, model, group, self.directory,
                                      lambda: LocalLoad(active=self.intake.status()["active"]), channels=self.channels)

    @property
    def record(self) -> ModelRecord:
        return ModelRecord(self.keys.identity.node_id, self.keys.identity.public_key, self.address,
                           self.model, self.keys.onion.public_key, weights_digest=self.weights_digest)

    async def start(self) -> None:
        server, port = tls.new_server(self.tls, self.listen)
        rpc.add_ModelNodeServicer_to_server(self, server)
        await server.start()
        self._server = server
        self.address = self.advertise or f"{self.listen.rpartition(':')[0]}:{port}"
        if hasattr(self.directory, "register_model"):
            await self.directory.register_model(self.record)
        else:
            self.directory.add_model(self.record)
        if self.gossip is not None:
            self.gossip.start()

    async def stop(self) -> None:
        if self.gossip is not None:
            await self.gossip.close()
        await self.intake.close()
        if self._server is not None:
            await self._server.stop(None)
        await self.channels.close()
        await self.directory.close()

    # the engine stand-in ------------------------------------------------------

    async def generate(self, request: pb.GenerateRequest) -> AsyncIterator[pb.GenerateChunk]:
        text = prompt_text(request)
        self.requests.append(request)
        if self.context_bytes is not None and len(text.encode()) > self.context_bytes:
            raise generation.ContextLengthError(f"prompt is {len(text.encode())} bytes; the echo context holds "
                                                f"{self.context_bytes}")
        self.prompts.append(text)
        self.received.set()
        if self.gate is not None:
            await self.gate.wait()
        answer = ECHO_PREFIX + text
        streamed = bool(self.stream_tokens) and request.sampling.max_tokens >= self.stream_tokens
        if streamed:
            answer = (answer * (1 + self.stream_tokens // len(answer)))[:self.stream_tokens]
            pieces = list(answer)
        else:
            step = -(-len(answer) // max(1, self.chunks))
            pieces = [answer[i:i + step] for i in range(0, len(answer), step)] or [""]
        loop = asyncio.get_running_loop()
        start = loop.time()
        for i, piece in enumerate(pieces):
            if i and streamed and self.stream_s:
                await asyncio.sleep(max(0.0, start + i * self.stream_s / (len(pieces) - 1) - loop.time()))
            elif i and self.chunk_delay_s:
                await asyncio.sleep(self.chunk_delay_s)
            final = i == len(pieces) - 1
            chunk = pb.GenerateChunk(text=piece, token_ids=list(piece.encode()), final=final,
                                     served_by=self.keys.identity.node_id_hex)
            if final:
                chunk.finish_reason = "stop"
                chunk.receipt.CopyFrom(receipts.make_receipt(
                    self.keys.identity, self.model, request, list(answer.encode()), int(time.time() * 1000),
                    prompt_tokens=len(text.encode())))  # the echo engine's "tokens" are bytes
            yield chunk

    # gRPC ----------------------------------------------------------------------

    async def Link(self, request_iterator, context) -> None:
        await self.intake.Link(request_iterator, context)

    async def Generate(self, request: pb.GenerateRequest, context):
        async for chunk in self.generate(request):
            yield chunk

    async def Health(self, request, context) -> pb.HealthReply:
        return pb.HealthReply(node_id=self.keys.identity.node_id_hex, role="model", serving=True)

    async def Gossip(self, request: pb.GossipMessage, context) -> pb.GossipReply:
        if self.gossip is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this echo node does not gossip")
        return await self.gossip.gossip(request)

    def status(self) -> dict:
        """What the echo node did: its intake's figures, and its gossip's."""
        return {"intake": self.intake.status(), "gossip": self.gossip.status() if self.gossip else None}


# fault drills ---------------------------------------------------------------------------

MISBEHAVIOURS = ("garbage", "bad-signature")


class GarbageReplyIntake(CloveIntake):
    """Seals and tags every reply clove correctly, around a reply message of random bytes."""

    def _release(self, ask, query: pb.OverlayQuery, seq: int, chunk: pb.GenerateChunk) -> None:
        honest = ask.sealer.message(pb.OverlayReply(seq=seq, chunk=chunk, delivered=ask.tokens))
        garbage = os.urandom(len(honest))  # the size an honest reply would have on the wire
        for index, (route, clove) in enumerate(zip(query.routes, sida.split(garbage, len(query.routes), query.k))):
            self._send(route, ask.sealer.clove(index, seq, clove))
        if chunk.final:
            self.asks.replied(ask, self.clock())


class MisbehavingEchoModelNode(EchoModelNode):
    """The echo stand-in with one of MISBEHAVIOURS; everything else (keys, TLS, intake) is real."""

    def __init__(self, *args, misbehave: str, **kwargs) -> None:
        if misbehave not in MISBEHAVIOURS:
            raise ValueError(f"misbehave is one of {MISBEHAVIOURS}")
        super().__init__(*args, **kwargs)
        self.misbehave = misbehave
        if misbehave == "garbage":
            honest = self.intake
            self.intake = GarbageReplyIntake(honest.node_id_hex, honest.onion_key, self.generate, honest.directory,
                                             honest.channels, honest.cloves, honest.params, max_active=honest.max_active)

    async def generate(self, request: pb.GenerateRequest) -> AsyncIterator[pb.GenerateChunk]:
        async for chunk in super().generate(request):
            if self.misbehave == "bad-signature" and chunk.HasField("receipt"):
                signature = bytearray(chunk.receipt.signature)
                signature[0] ^= 0x01
                chunk.receipt.signature = bytes(signature)
            yield chunk


def home_config(home: Path) -> dict:
    """{"cloves", "params"} from the home's [cloves] and [overlay], read as gt-user reads its
    own: the node must decode with its askers' k."""
    from gentorrent import settings

    conf = settings.load_home(home, settings.MODEL)
    return {"cloves": conf["cloves"], "params": conf["overlay"]}


async def _serve_echo(home: Path, directory: Path | None, chunks: int, chunk_delay_s: float = 0.0,
                      admit: int | None = None, misbehave: str | None = None,
                      stream_tokens: int | None = None, stream_s: float = 0.0,
                      committee: Path | None = None, gossip: bool = False, model_name: str = MODEL_NODE.default_model,
                      listen: str = "127.0.0.1:0", advertise: str | None = None) -> None:
    import json
    import signal

    if committee is not None:  # register with the committee, as `gt-model serve --committee` does
        from gentorrent.ledger.committee import CommitteeDirectory

        directory = CommitteeDirectory.from_args(str(committee), home)
    where = {"model": model_name, "listen": listen, "advertise": advertise}
    if misbehave:  # a fault drill: never part of an honest node
        model: EchoModelNode = MisbehavingEchoModelNode(home, directory, chunks=chunks, chunk_delay_s=chunk_delay_s,
                                                        misbehave=misbehave, **where, **home_config(home))
    else:
        model = EchoModelNode(home, directory, chunks=chunks, chunk_delay_s=chunk_delay_s,
                              stream_tokens=stream_tokens, stream_s=stream_s, gossip=gossip, **where,
                              **home_config(home))
    if admit is not None:
        model.intake.max_active = admit
    t0 = time.monotonic()
    await model.start()
    print(json.dumps({"address": model.address, "node_id": model.record.node_id_hex}), flush=True)
    state = Path(home) / "node.json"  # what `gt-model serve` writes (the devnet reads it)
    state.write_text(json.dumps({"address": model.address, "node_id": model.record.node_id_hex,
                                 "cert_file": str(Path(home) / tls.PIN_FILE), "capacity": model.record.capacity,
                                 "model": model.model, "metrics": "", "pid": os.getpid(),
                                 "ready_s": round(time.monotonic() - t0, 2)}))
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    state.unlink(missing_ok=True)
    await model.stop()


def main(argv: list[str] | None = None) -> int:
    """`python -m testkit.echo_model --home DIR --directory FILE`: a stand-in model node."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m testkit.echo_model")
    ap.add_argument("--home", required=True)
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--directory", help="a static directory file")
    where.add_argument("--committee", help="a genesis file: register with its committee and read its directory")
    ap.add_argument("--gossip", action="store_true", help="gossip with the model group (the directory's nodes of its model)")
    ap.add_argument("--model", default=MODEL_NODE.default_model, help="the model name it claims")
    ap.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT")
    ap.add_argument("--advertise", default=None, help="HOST:PORT it registers (default: where it listens)")
    ap.add_argument("--chunks", type=int, default=1, help="stream each answer in this many chunks")
    ap.add_argument("--chunk-delay-s", type=float, default=0.0, help="pause before every chunk after the first")
    ap.add_argument("--stream-tokens", type=int, default=None,
                    help="answer requests for at least this many tokens with exactly this many, one chunk "
                         "each, spread evenly over --stream-s")
    ap.add_argument("--stream-s", type=float, default=0.0, help="seconds one --stream-tokens answer takes")
    ap.add_argument("--admit", type=int, default=None,
                    help="queries served at a time; more are refused as busy (0: refuse every query)")
    ap.add_argument("--misbehave", default=None, choices=("garbage", "bad-signature"),
                    help="FAULT DRILLS ONLY: garbage = undecodable reply "
                         "messages in valid cloves; bad-signature = right answer, receipt signature broken")
    args = ap.parse_args(argv)
    asyncio.run(_serve_echo(Path(args.home), Path(args.directory) if args.directory else None, args.chunks,
                            args.chunk_delay_s, args.admit, args.misbehave, args.stream_tokens, args.stream_s,
                            Path(args.committee) if args.committee else None, args.gossip, args.model, args.listen,
                            args.advertise))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
