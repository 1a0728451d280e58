"""`gt-model`: run a model node (`serve`), ask it how it is doing (`status`), list `models`.

`serve` checks that the model's weights are on disk *before* starting anything heavy, so a
missing checkpoint is a one-line error in a second rather than a stack trace after a minute.
With `--committee GENESIS` the node joins the network by itself (ARCHITECTURE.md §3.1): once
the engine is up and the gRPC/TLS server listens, it registers with a signed transaction
(identity, advertised address, TLS certificate, onion key, model, capacity), waits until the
committee's checked directory lists it, keeps its lease renewed, and from then on takes its
clove intake's proxies, its model group (forwarding and gossip) and every peer's pinned
certificate from that directory. Forwarding in the group is on unless `--no-forwarding`.
Then it writes `node.json` in its home (address, node id, public key, certificate file): that
is how `gt-model status`, the devnet and the tests find it. SIGINT/SIGTERM stop it cleanly
(server drained, engine stopped, file removed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

from gentorrent.cli import Parser, Stages, UsageError, check_can_listen, float_in, host_port, int_in, run
from gentorrent.config import MODEL_NODE, ModelNodeParams
from gentorrent.ledger.genesis import GenesisError

STATE_FILE = "node.json"
log = logging.getLogger("gt-model")


def default_home() -> Path:
    return Path(os.environ.get("GENTORRENT_HOME", Path.home() / ".gentorrent" / "model"))


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="gt-model", description="GenTorrent model node: serve a model with vLLM to the overlay")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    s = sub.add_parser("serve", help="serve one model with vLLM over gRPC/TLS")
    s.add_argument("--model", default=MODEL_NODE.default_model, help="catalogue name (see `gt-model models`)")
    s.add_argument("--weights", type=Path, help="folder of a Hugging Face checkpoint for --model")
    s.add_argument("--home", type=Path, default=None, help="keys, config.toml, logs, node.json")
    s.add_argument("--listen", type=host_port, default="127.0.0.1:50061", help="HOST:PORT (port 0: any free)")
    s.add_argument("--capacity", type=int_in(MODEL_NODE.min_capacity, MODEL_NODE.max_capacity),
                   default=MODEL_NODE.default_capacity,
                   help=f"capacity score {MODEL_NODE.min_capacity}..{MODEL_NODE.max_capacity}")
    s.add_argument("--tensor-parallel-size", type=int_in(1, 64), default=None, metavar="N",
                   help=f"GPU engines: spread the model over N GPUs (default {MODEL_NODE.tensor_parallel_size}; "
                        "a CPU engine runs in one process)")
    s.add_argument("--gpu-memory-utilization", type=float_in(0, 1, low_open=True), default=None, metavar="F",
                   help=f"GPU engines: share of each GPU's memory the engine may take, in (0, 1] "
                        f"(default {MODEL_NODE.gpu_memory_utilization}; ignored on a CPU)")
    s.add_argument("--verbose", action="store_true", help="show vLLM's own INFO logs")
    s.add_argument("--stop-with-parent", action="store_true",
                   help="shut down when the process that started this one exits (tests, devnets)")
    s.add_argument("--metrics", type=host_port, default=None, metavar="HOST:PORT",
                   help="serve Prometheus text on http://HOST:PORT/metrics")
    s.add_argument("--committee", metavar="GENESIS", type=Path, default=None,
                   help="the committee's genesis file: register this node there, then serve the overlay and "
                        "its model group from the committee's checked directory")
    s.add_argument("--advertise", metavar="HOST:PORT", default=None,
                   help="the address to register, when peers reach this node elsewhere than --listen "
                        "(needed with a wildcard --listen such as 0.0.0.0:50061)")
    s.add_argument("--no-forwarding", action="store_true",
                   help="with --committee: never forward requests to (or gossip with) the model group")
    s.add_argument("--directory", type=Path, default=None,
                   help="TESTS AND BENCHMARKS ONLY: a static directory JSON file instead of the committee")
    s.add_argument("--dishonest", default=None, metavar="KIND",
                   choices=("pruned", "noisy", "other-model", "random", "replay", "selective"),
                   help="TESTS AND BENCHMARKS ONLY: cheat while claiming --model "
                        "(model_node.cheaters: pruned, noisy, other-model, random, replay, selective)")
    # --- routing: the model group of --model, from the verified directory
    s.add_argument("--forwarding", action="store_true",
                   help="with --directory FILE (tests): join the group of --model as a --committee node does")
    s.add_argument("--gossip-interval", type=float_in(0.1, 3600), default=None, metavar="SECONDS",
                   help="seconds between gossip rounds of the model group (default: config ROUTING)")
    st = sub.add_parser("status", help="what a running node serves and its load")
    st.add_argument("--home", type=Path, default=None, help="the node's home (default: $GENTORRENT_HOME or "
                                                              "~/.gentorrent/model)")
    st.add_argument("--timeout", type=float_in(0.1, 600), default=10.0, help="seconds to wait for the node")
    sub.add_parser("models", help="list the model catalogue and what each model needs")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "models":
        return run(_models, "gt-model")
    if args.command == "status":
        return run(lambda: asyncio.run(_status(args.home or default_home(), args.timeout)), "gt-model")
    return run(lambda: _serve(args), "gt-model")


def _models() -> int:
    from model_node.catalogue import CATALOGUE

    for e in CATALOGUE.values():
        where = f"pip: {e.pip_name}" if e.embedded else f"hf: {e.hf_id}"
        print(f"{e.name:14s} {e.description}  [{where}]")
        print(f"{'':14s} needs: {e.needs}; context {e.context} tokens")
    return 0


# --------------------------------------------------------------------------- serve


def _load_params(home: Path, args=None) -> ModelNodeParams:
    """The home's [model_node] settings, with the engine options given on the command line."""
    from dataclasses import replace

    from gentorrent import settings

    params = settings.load_home(home)["model_node"]
    given = {k: getattr(args, k) for k in ("tensor_parallel_size", "gpu_memory_utilization")
             if args is not None and getattr(args, k, None) is not None}
    return replace(params, **given)


def _check_hardware(args, params: ModelNodeParams) -> None:
    """--- GPU engines: the model fits the GPUs as asked, or a clear error before loading."""
    from model_node import catalogue
    from model_node.engine import local_gpus_gib

    gpus = local_gpus_gib()
    if not gpus and args.gpu_memory_utilization is not None:
        print("gt-model: note: --gpu-memory-utilization has no effect on a CPU machine", file=sys.stderr)
    catalogue.check_hardware(catalogue.lookup(args.load_model), gpus, params.tensor_parallel_size,
                             params.gpu_memory_utilization)


def _serve(args) -> int:
    from gentorrent.crypto import tls
    from model_node import catalogue

    from gentorrent.ledger.txs import TxError, check_listen

    home = (args.home or default_home()).resolve()
    args.load_model = args.model
    if args.forwarding and not args.directory:  # --- routing
        print("gt-model: --forwarding goes with --directory FILE (with --committee the group forwards unless "
              "--no-forwarding)", file=sys.stderr)
        return 2
    if args.committee and args.directory:
        print("gt-model: give --committee GENESIS or --directory FILE, not both", file=sys.stderr)
        return 2
    args.forwarding = (args.forwarding or bool(args.committee)) and not args.no_forwarding
    try:
        if args.committee or args.directory:  # it will register: refuse an address nobody can dial now
            check_listen(args.listen, args.advertise)
    except TxError as exc:
        print(f"gt-model: {exc}", file=sys.stderr)
        return 2
    try:
        if args.dishonest:  # a cheating node, for the verification tests
            from model_node import cheaters

            plan = cheaters.prepare(args.dishonest, args.model, args.weights)
            args.load_model, args.weights = plan.load_model, plan.weights
        catalogue.check_available(args.load_model, args.weights)
        params = _load_params(home, args)
        _check_hardware(args, params)
        check_can_listen(args.listen, "--listen")
        if args.metrics:
            check_can_listen(args.metrics, "--metrics")
        tls.check_key_files(home)  # a key file others can read: refused, saying what to run
    except ValueError as exc:  # CatalogueError, settings.ConfigError, KeyFilePermissionError
        print(f"gt-model: cannot serve {args.model!r}: {exc}", file=sys.stderr)
        return 2
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO" if args.verbose else "WARNING")
    home.mkdir(parents=True, exist_ok=True)
    _setup_logging(home)
    from gentorrent.ledger.committee import RegistrationError

    try:
        return asyncio.run(_serve_async(args, home, params))
    except catalogue.CatalogueError as exc:
        print(f"gt-model: cannot serve {args.model!r}: {exc}", file=sys.stderr)
        return 2
    except (RegistrationError, TxError, GenesisError) as exc:
        print(f"gt-model: cannot join the network: {exc}", file=sys.stderr)
        return 2


#: start-up stages of `gt-model serve` (shown on stderr with their times)
STAGES = ["preparing the weights", "loading the vLLM engine", "opening the overlay intake"]
ENGINE_START_FILE = "engine_start.json"  # in the model cache: this machine's last start-up time per model


def last_engine_start(model: str) -> float | None:
    """How long the engine of `model` took to start the last time on this machine (the next
    start's estimate, for gt-model and gt-devnet); None when it never started here."""
    from model_node.catalogue import cache_root

    try:
        return float(json.loads((cache_root() / ENGINE_START_FILE).read_text())[model])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _note_engine_start(model: str, seconds: float) -> None:
    from model_node.catalogue import cache_root

    path = cache_root() / ENGINE_START_FILE
    with contextlib.suppress(OSError, ValueError):
        known = json.loads(path.read_text()) if path.exists() else {}
        known[model] = round(seconds, 1)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known))
        os.replace(tmp, path)


def _setup_logging(home: Path) -> None:
    (home / "logs").mkdir(exist_ok=True)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    file_handler = logging.FileHandler(home / "logs" / "gt-model.log")
    stderr = logging.StreamHandler()
    for h in (file_handler, stderr):
        h.setFormatter(fmt)
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    root.addHandler(file_handler)
    root.addHandler(stderr)


async def _serve_async(args, home: Path, params: ModelNodeParams) -> int:
    from gentorrent.crypto import tls
    from gentorrent.crypto.keys import NodeKeys
    from model_node import catalogue
    from model_node.engine import Engine
    from model_node.service import LocalGenerator, ModelNodeService
    from gentorrent.wire import gentorrent_pb2_grpc as rpc

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if args.stop_with_parent:
        asyncio.ensure_future(_watch_parent(os.getppid(), stop))

    keys = NodeKeys.load_or_create(home)
    tls_id = tls.TlsIdentity.load_or_create(home, keys.identity)
    t0 = time.monotonic()
    stages = Stages("gt-model", STAGES)
    try:  # the port first: a taken port is an error now, not after a minute of engine loading
        server, port = tls.new_server(tls_id, args.listen)
    except Exception as exc:  # grpc raises RuntimeError for a port it cannot bind
        raise UsageError(f"cannot listen on {args.listen}: {exc}; choose another --listen (port 0: any free)") \
            from None
    stages.begin(STAGES[0], detail=f"{args.load_model} (an embedded model is converted once into "
                                   f"{catalogue.cache_root()})")
    model = await asyncio.to_thread(catalogue.resolve, getattr(args, "load_model", args.model), args.weights)
    stages.begin(STAGES[1], usual_s=last_engine_start(args.load_model), detail=str(model.path))
    ticker = asyncio.ensure_future(stages.ticking())
    engine_task = asyncio.ensure_future(Engine.start(model, params))
    stop_task = asyncio.ensure_future(stop.wait())
    await asyncio.wait({engine_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
    ticker.cancel()
    if not engine_task.done():
        log.info("stopped while the engine was starting")
        engine_task.cancel()
        await server.stop(None)
        return 0
    engine = engine_task.result()
    _note_engine_start(args.load_model, engine.startup_s)
    stages.begin(STAGES[2])
    state = home / STATE_FILE
    directory = metrics_runner = None
    try:
        from gentorrent.ledger.txs import advertised_address

        address = advertised_address(args.listen, port, args.advertise) if (args.committee or args.directory) \
            else f"{args.listen.rpartition(':')[0]}:{port}"
        generator = LocalGenerator(engine, keys.identity, params)
        if args.dishonest:  # a cheating node claims --model whatever it really runs
            from model_node import cheaters

            engine.model = args.model
            generator = cheaters.make_generator(args.dishonest, generator, args.model)
            log.warning("DISHONEST node (%s): serving %s as %s", args.dishonest, args.load_model, args.model)
        directory = _directory(args, home)  # who the proxies and the group's members are
        router = gossip = None
        if args.forwarding:  # serve here or forward to a group peer (Algorithm 2)
            from model_node.forwarding import build_routing

            router, gossip = build_routing(keys.identity, generator, args.capacity, directory,
                                           args.gossip_interval)
        intake = None
        if directory is not None:  # the overlay: cloves in, reply cloves out to the users' proxies
            from gentorrent.channels import ChannelPool
            from model_node.intake import CloveIntake

            intake = CloveIntake(keys.identity.node_id_hex, keys.onion, router or generator, directory,
                                 ChannelPool(own=tls_id))  # proxies' relays demand a client certificate
        service = ModelNodeService(generator, capacity=args.capacity, address=address, clove_intake=intake,
                                   forwarder=router, gossip=gossip, generate_route=router)
        rpc.add_ModelNodeServicer_to_server(service, server)
        await server.start()
        # before registering: a node that cannot serve its metrics stops unlisted
        metrics_runner, metrics_url = await _serve_metrics(args.metrics, service)
        if args.committee:  # listed only once it answers: register, wait until committed
            record = _model_record(keys, tls_id, address, engine.model, args.capacity)
            if not await _register(directory, record, stop):
                return 0
        if gossip is not None:
            gossip.start()
        _write_state(state, {
            "metrics": metrics_url,
            "address": address, "node_id": keys.identity.node_id_hex,
            "public_key": keys.identity.public_key.hex(), "model": engine.model,
            "cert_file": str(home / tls.CERT_FILE), "pid": os.getpid(), "capacity": args.capacity,
            "engine_startup_s": round(engine.startup_s, 2), "ready_s": round(time.monotonic() - t0, 2),
        })
        log.info("serving %s on %s as node %s (ready in %.1f s)", engine.model, address,
                 keys.identity.node_id_hex[:16], time.monotonic() - t0)
        stages.finish(f"serving {engine.model} on {address}")
        print(f"gt-model: serving {engine.model} on {address} node {keys.identity.node_id_hex}", flush=True)
        await stop.wait()
        log.info("shutting down")
        state.unlink(missing_ok=True)
        await server.stop(params.shutdown_grace_s)
        if gossip is not None:
            await gossip.close()
        if intake is not None:
            await intake.close()
    finally:  # also after a failed step (a taken --metrics port): no half-open servers
        state.unlink(missing_ok=True)
        await server.stop(0)
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        if directory is not None:
            await directory.close()
        engine.shutdown()
    log.info("stopped")
    return 0


def _directory(args, home: Path):
    """The directory this node works from: the committee's (light-client checked) or a static
    file (tests); None when neither is given (then it serves direct Generate calls only)."""
    if args.committee:
        from gentorrent.ledger.committee import CommitteeDirectory

        return CommitteeDirectory.from_args(str(args.committee), home)
    if args.directory:
        from gentorrent.ledger.directory import StaticDirectory

        return StaticDirectory(args.directory)
    return None


async def _register(directory, record, stop: asyncio.Event) -> bool:
    """Register with the committee and wait until its directory lists this node; False if the
    node was told to stop first. Raises RegistrationError when the committee refuses."""
    log.info("registering with the committee as %s", record.address)
    task = asyncio.ensure_future(directory.register_model(record))
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return False
    task.result()  # a refusal raises here
    log.info("registered: the committee's directory lists this node at height %d", directory.height)
    mine = next((m for m in directory.models() if m.node_id == record.node_id), None)
    if mine is not None and not mine.trusted:  # the key's standing outlives its registration
        log.warning("the committee lists this node as UNTRUSTED (reputation %.3f, kept from when this key was "
                    "last registered): users send it no asks until it answers its challenges well for its "
                    "probation (a verifier's dashboard shows how many epochs are left)", mine.reputation)
    return True


def _model_record(keys, tls_id, address: str, model: str, capacity: int):
    """What this node registers: identity, advertised address, certificate, onion key, model."""
    from gentorrent.ledger.sections import ModelRecord

    return ModelRecord(node_id=keys.identity.node_id, public_key=keys.identity.public_key, address=address,
                       model=model, onion_key=keys.onion.public_key, tls_cert_pem=tls_id.cert_pem,
                       capacity=capacity)


async def _serve_metrics(listen: str | None, service) -> tuple:
    """--- Prometheus text: load, served requests, prefix-cache counters."""
    if not listen:
        return None, ""
    from aiohttp import web

    from gentorrent.metrics import metrics_route, serve_app
    from model_node.metrics import ModelMetrics

    view = ModelMetrics()
    app = web.Application()
    app.router.add_routes([metrics_route(lambda: view.update(service.status_dict()))])
    host = listen.rpartition(":")[0]
    try:
        runner, port = await serve_app(app, host, int(listen.rpartition(":")[2]))
    except OSError as exc:
        raise UsageError(f"--metrics {listen}: cannot listen there ({exc.strerror or exc}); pick a free port",
                         code=1) from None
    return runner, f"http://{host}:{port}/metrics"


async def _watch_parent(parent: int, stop: asyncio.Event) -> None:
    """An orphaned node (its test run or devnet killed) must not serve on forever."""
    while not stop.is_set():
        if os.getppid() != parent:
            log.info("parent process %d is gone: stopping", parent)
            stop.set()
        await asyncio.sleep(1.0)


def _write_state(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


# --------------------------------------------------------------------------- status


def read_state(home: Path) -> dict:
    """The running node's node.json; raises FileNotFoundError when no node runs there."""
    return json.loads((Path(home) / STATE_FILE).read_text())


async def _status(home: Path, timeout: float) -> int:
    from gentorrent.crypto import tls
    from gentorrent.wire import gentorrent_pb2 as pb
    from gentorrent.wire import gentorrent_pb2_grpc as rpc

    try:
        state = read_state(home)
    except (OSError, ValueError):
        print(f"gt-model: no model node is running with home {home} (no {STATE_FILE})", file=sys.stderr)
        return 1
    try:
        channel = await tls.connect(state["address"], Path(state["cert_file"]).read_bytes(), timeout=timeout)
    except (OSError, tls.TlsError) as exc:
        print(f"gt-model: node at {state['address']} does not answer: {exc}", file=sys.stderr)
        return 1
    try:
        reply = await rpc.ModelNodeStub(channel).Status(pb.Empty(), timeout=timeout)
    finally:
        await channel.close()
    print(json.dumps(json.loads(reply.json), indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
