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
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from gentorrent.cli import (EXIT_NO_NODE, Parser, Stages, UsageError, add_trust_anchor, check_can_listen,
                            check_directory_source, float_in, host_port, int_in, run, stop_on_signals, take_home,
                            until_stopped)
from gentorrent.config import MAX_CAPACITY, MIN_CAPACITY, MODEL_NODE, ModelNodeParams
from gentorrent.ledger.genesis import GenesisError
from model_node import tools

if TYPE_CHECKING:
    from model_node.catalogue import ResolvedModel
    from model_node.engine import Engine
    from model_node.service import LocalGenerator

STATE_FILE = "node.json"
DIGEST_FILE = "weights_digest.json"  # in the home: the weights' digest, while the files are unchanged
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
    s.add_argument("--capacity", type=int_in(MIN_CAPACITY, MAX_CAPACITY),
                   default=MODEL_NODE.default_capacity,
                   help=f"capacity score {MIN_CAPACITY}..{MAX_CAPACITY}")
    s.add_argument("--tensor-parallel-size", type=int_in(1, 64), default=None, metavar="N",
                   help=f"GPU engines: spread the model over N GPUs (default {MODEL_NODE.tensor_parallel_size}; "
                        "a CPU engine runs in one process)")
    s.add_argument("--gpu-memory-utilization", type=float_in(0, 1, low_open=True), default=None, metavar="F",
                   help=f"GPU engines: share of each GPU's memory the engine may take, in (0, 1] "
                        f"(default {MODEL_NODE.gpu_memory_utilization}; ignored on a CPU)")
    s.add_argument("--max-model-len", type=int_in(16, 1 << 21), default=None, metavar="TOKENS",
                   help=f"the context the engine serves (default {MODEL_NODE.max_model_len}, or the model's own if "
                        "smaller); as vLLM's --max-model-len")
    s.add_argument("--dtype", default=None, choices=("auto", "float32", "float16", "bfloat16"),
                   help=f"the weights' dtype in the engine (default {MODEL_NODE.cpu_dtype} on a CPU, "
                        f"{MODEL_NODE.gpu_dtype} on a GPU); as vLLM's --dtype")
    s.add_argument("--quantization", default=None, metavar="METHOD",
                   help="vLLM's --quantization (e.g. fp8 to quantize 16-bit weights on load; a quantized "
                        "checkpoint, AWQ or GPTQ, says so itself)")
    s.add_argument("--kv-cache-dtype", default=None, choices=("auto", "fp8", "fp8_e4m3", "fp8_e5m2"),
                   help="the KV cache's dtype (default auto: the model's); as vLLM's --kv-cache-dtype")
    s.add_argument("--verbose", action="store_true", help="show vLLM's own INFO logs")
    s.add_argument("--stop-with-parent", action="store_true",
                   help="shut down when the process that started this one exits (tests, devnets)")
    s.add_argument("--metrics", type=host_port, default="127.0.0.1:0", metavar="HOST:PORT",
                   help="serve Prometheus text on http://HOST:PORT/metrics (default %(default)s: on loopback, any "
                        "free port; node.json names the URL)")
    s.add_argument("--no-metrics", action="store_true", help="serve no /metrics")
    s.add_argument("--tool-call-parser", default=tools.DEFAULT_TOOL_PARSER, metavar="NAME",
                   help="vLLM's tool parser for tool_choice \"auto\" (vLLM's --tool-call-parser, default "
                        "%(default)s; none: auto returns text only). Forced tool choices need none: guided decoding")
    s.add_argument("--committee", metavar="GENESIS", type=Path, default=None,
                   help="the committee's genesis file: register this node there, then serve the overlay and "
                        "its model group from the committee's checked directory")
    add_trust_anchor(s)
    s.add_argument("--advertise", metavar="HOST:PORT", default=None,
                   help="the address to register, when peers reach this node elsewhere than --listen "
                        "(needed with a wildcard --listen such as 0.0.0.0:50061)")
    s.add_argument("--no-forwarding", action="store_true",
                   help="with --committee: never forward requests to (or gossip with) the model group")
    s.add_argument("--directory", type=Path, default=None,
                   help="TESTS AND BENCHMARKS ONLY: a static directory JSON file instead of the committee")
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


class Serving:
    """What `serve` loads and what answers the requests: the claimed model, honestly.

    The one seam through which the verification tests and the devnet run a dishonest node on
    this very code (testkit/dishonest_model.py plugs a cheater in); `gt-model` itself only ever
    serves honestly."""

    #: whether it serves the weights it loaded as what they are: a cheater (False) registers no
    #: weights digest and skips the catalogue's check before its engine starts
    honest: bool = True

    def weights(self, model: str, weights: Path | None) -> tuple[str, Path | None]:
        """The catalogue model and weights folder to load for the claimed `model`."""
        return model, weights

    async def start_engine(self, model: "ResolvedModel", params: ModelNodeParams) -> "Engine":
        """Start vLLM on the loaded model, and remember how long that took on this machine."""
        from model_node.engine import Engine

        engine = await Engine.start(model, params)
        _note_engine_start(model.name, engine.startup_s)
        return engine

    def generator(self, honest: "LocalGenerator", claimed: str) -> "LocalGenerator":
        """What answers requests, given the honest generator over the loaded engine."""
        return honest


def main(argv: list[str] | None = None, serving: Serving | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "models":
        return run(_models, "gt-model")
    if args.command == "status":
        return run(lambda: asyncio.run(_status(args.home or default_home(), args.timeout)), "gt-model")
    return run(lambda: _serve(args, serving or Serving()), "gt-model")


def _models() -> int:
    from model_node.catalogue import CATALOGUE

    for e in CATALOGUE.values():
        where = f"pip: {e.pip_name}" if e.embedded else f"hf: {e.hf_id}"
        print(f"{e.name:14s} {e.description}  [{where}]")
        print(f"{'':14s} needs: {e.needs}; context {e.context} tokens")
    return 0


# --------------------------------------------------------------------------- serve


def load_config(home: Path, args=None) -> dict:
    """The home's config.toml as gt-model applies it (settings.MODEL: [model_node] for the engine
    and service, [routing] for forwarding and gossip, [cloves] and [overlay] for the clove
    intake), with the engine options given on the command line; any other section is refused."""
    from dataclasses import replace

    from gentorrent import settings

    conf = settings.load_home(home, settings.MODEL)
    given = {k: getattr(args, k) for k in ("tensor_parallel_size", "gpu_memory_utilization", "max_model_len", "dtype",
                                           "quantization", "kv_cache_dtype")
             if args is not None and getattr(args, k, None) is not None}
    return {**conf, "model_node": replace(conf["model_node"], **given)}


def _check_hardware(args, params: ModelNodeParams) -> None:
    """--- GPU engines: the model fits the GPUs as asked, or a clear error before loading."""
    from model_node import catalogue
    from model_node.engine import local_gpus_gib

    gpus = local_gpus_gib()
    if not gpus and args.gpu_memory_utilization is not None:
        print("gt-model: note: --gpu-memory-utilization has no effect on a CPU machine", file=sys.stderr)
    entry = catalogue.lookup(args.load_model, args.weights)
    folder = args.weights if args.weights is not None else (
        catalogue.cache_root() / "models" / entry.name if entry.embedded else None)
    catalogue.check_hardware(entry, gpus, params.tensor_parallel_size, params.gpu_memory_utilization,
                             catalogue.weights_in_memory_gib(entry, folder, params.quantization))


def _serve(args, serving: Serving) -> int:
    from gentorrent.crypto import tls
    from model_node import catalogue

    from gentorrent.ledger.txs import TxError, check_listen

    home = (args.home or default_home()).resolve()
    args.load_model, args.home_dir = args.model, home
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
        args.load_model, args.weights = serving.weights(args.model, args.weights)
        catalogue.check_available(args.load_model, args.weights)
        check_directory_source(args.committee, args.directory, directory_may_be_missing=True,
                               trust_anchor=args.trust_anchor)
        conf = load_config(home, args)
        _check_hardware(args, conf["model_node"])
        take_home(home)  # one process per home: before its ports, the keys, the logs or the engine
        check_can_listen(args.listen, "--listen")
        if args.no_metrics:
            args.metrics = None
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
        return asyncio.run(_serve_async(args, home, conf, serving))
    except catalogue.CatalogueError as exc:
        print(f"gt-model: cannot serve {args.model!r}: {exc}", file=sys.stderr)
        return 2
    except (RegistrationError, TxError, GenesisError) as exc:
        print(f"gt-model: cannot join the network: {exc}", file=sys.stderr)
        return EXIT_NO_NODE


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


async def _serve_async(args, home: Path, conf: dict, serving: Serving) -> int:
    """`conf`: load_config's sections, each handed to the part it configures; `serving`: what
    loads and what answers (Serving)."""
    from gentorrent.crypto import tls
    from gentorrent.crypto.keys import NodeKeys
    from model_node import catalogue
    from model_node.service import LocalGenerator, ModelNodeService
    from gentorrent.wire import gentorrent_pb2_grpc as rpc
    from gentorrent.wire import gentorrent_pb2 as pb

    params = conf["model_node"]
    stop = stop_on_signals()  # first: Ctrl-C at any stage below stops the node within seconds
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
    resolved, model = await until_stopped(asyncio.to_thread(_prepare, args), stop)
    if not resolved:
        await server.stop(None)
        _abandon_start("preparing the weights")
    directory = _directory(args, home)  # who the proxies and the group's members are
    if args.committee and serving.honest:  # before the engine: the catalogue lists these weights?
        checked, params = await until_stopped(_with_catalogue(directory, args, params), stop)
        if not checked:
            await server.stop(None)
            await directory.close()
            return 0
    stages.begin(STAGES[1], usual_s=last_engine_start(args.load_model), detail=f"{model.path} ({args.weights_digest})")
    ticker = asyncio.ensure_future(stages.ticking())
    started, engine = await until_stopped(serving.start_engine(model, params), stop, grace_s=0.5)
    ticker.cancel()
    if not started:
        await server.stop(None)
        _abandon_start("loading the engine")
    stages.begin(STAGES[2])
    state = home / STATE_FILE
    metrics_runner = None
    try:
        from gentorrent.ledger.txs import advertised_address

        address = advertised_address(args.listen, port, args.advertise) if (args.committee or args.directory) \
            else f"{args.listen.rpartition(':')[0]}:{port}"
        from model_node.metrics import ModelMetrics

        view = ModelMetrics()
        generator = serving.generator(LocalGenerator(engine, keys.identity, params, tool_parser=args.tool_call_parser,
                                                     on_finished=view.observe_request), args.model)
        router = gossip = None
        if args.forwarding:  # serve here or forward to a group peer (Algorithm 2)
            from model_node.forwarding import build_routing

            router, gossip = build_routing(keys.identity, generator, args.capacity, directory,
                                           args.gossip_interval, params=conf["routing"])
        intake = None
        if directory is not None:  # the overlay: cloves in, reply cloves out to the users' proxies
            from gentorrent.channels import ChannelPool
            from model_node.intake import CloveIntake

            intake = CloveIntake(keys.identity.node_id_hex, keys.onion, router or generator, directory,
                                 ChannelPool(own=tls_id),  # proxies' relays demand a client certificate
                                 cloves=conf["cloves"], params=conf["overlay"], max_active=params.max_queued_requests)
        service = ModelNodeService(generator, capacity=args.capacity, address=address, clove_intake=intake,
                                   forwarder=router, gossip=gossip, generate_route=router,
                                   serving=pb.CatalogueEntry(model=engine.model, weights_digest=args.weights_digest,
                                                             max_model_len=engine.max_model_len,
                                                             **engine.scoring_options()))
        rpc.add_ModelNodeServicer_to_server(service, server)
        await server.start()
        # before registering: a node that cannot serve its metrics stops unlisted
        metrics_runner, metrics_url = await _serve_metrics(args.metrics, service, view)
        if args.committee:  # listed only once it answers: register, wait until committed
            record = _model_record(keys, address, engine.model, args.capacity,
                                   args.weights_digest if serving.honest else "")  # a cheater claims none
            if not await _register(directory, record, stop):
                return 0
        if gossip is not None:
            gossip.start()
        _write_state(state, {
            "metrics": metrics_url,
            "address": address, "node_id": keys.identity.node_id_hex,
            "public_key": keys.identity.public_key.hex(), "model": engine.model,
            "cert_file": str(home / tls.PIN_FILE), "pid": os.getpid(), "capacity": args.capacity,
            "engine_startup_s": round(engine.startup_s, 2), "ready_s": round(time.monotonic() - t0, 2),
            "weights_digest": args.weights_digest,
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


#: how long no engine process may appear before an abandoned start-up exits, and the most it waits
ABANDON_QUIET_S, ABANDON_MAX_S = 1.0, 3.0


def _refuse_new_processes() -> None:
    """From now on the start-up thread starts no process: vLLM's engine is spawned by
    multiprocessing (spawnv_passfds; fork for the fork context), and one spawned after the
    children were swept outlived this process (seen on a loaded machine: a `spawn_main` child
    left in the terminal's process group). The thread gets an error instead, which nobody reads:
    this process exits."""
    import multiprocessing.util

    def refuse(*_args, **_kwargs):
        raise RuntimeError("gt-model is stopping: no new process")

    multiprocessing.util.spawnv_passfds = refuse
    os.fork = refuse


def _abandon_start(stage: str) -> NoReturn:
    """Stopped while a start-up thread works (converting weights, building the vLLM engine):
    such a thread cannot be cancelled, and asyncio.run would wait for it to finish (the engine
    loading to its end, 40 s and more) before exiting. Nothing of it is kept (the conversion
    commits by a rename, the engine holds nothing on disk), so the engine's processes are
    stopped and this one leaves now: within seconds, without a traceback, exit status 0."""
    import psutil  # a dependency of vLLM

    log.info("stopped while %s", stage)
    _refuse_new_processes()
    # the building thread goes on meanwhile: a spawn it had begun shows up only after a sweep (seen:
    # an engine left loading, its SIGINT blocked, holding this process's stderr): sweep until none
    # has appeared for ABANDON_QUIET_S, at most ABANDON_MAX_S
    me, started, quiet_since = psutil.Process(), time.monotonic(), time.monotonic()
    while time.monotonic() - quiet_since < ABANDON_QUIET_S and time.monotonic() - started < ABANDON_MAX_S:
        children = me.children(recursive=True)
        if children:
            quiet_since = time.monotonic()
            for child in children:
                with contextlib.suppress(psutil.Error):
                    child.terminate()
            _, alive = psutil.wait_procs(children, timeout=2.0)
            for child in alive:
                with contextlib.suppress(psutil.Error):
                    child.kill()
        time.sleep(0.05)
    print(f"gt-model: stopped while {stage}", file=sys.stderr, flush=True)
    logging.shutdown()
    sys.stdout.flush()
    os._exit(0)


#: engine options a catalogue entry names (CatalogueEntry field -> ModelNodeParams field; "" / 0: none)
CATALOGUE_OPTIONS = {"dtype": "dtype", "quantization": "quantization", "kv_cache_dtype": "kv_cache_dtype",
                     "max_model_len": "max_model_len"}


async def _with_catalogue(directory, args, params: ModelNodeParams) -> ModelNodeParams:
    """The committee's catalogue, read before the engine loads: weights the catalogue does not
    list for this model name stop the node now (the registration would be refused after the
    engine's minute of loading), and a listed entry's engine options apply where the command
    line gave none. An unreachable committee is no error here: the registration waits for it."""
    from dataclasses import replace

    from gentorrent.ledger import catalogue as committee_catalogue
    from gentorrent.ledger.committee import CommitteeUnreachable
    from gentorrent.ledger.signed_tx import TxError

    try:
        listed = [e for e in await asyncio.wait_for(directory.catalogue(), 30) if e.get("model") == args.model]
    except (CommitteeUnreachable, asyncio.TimeoutError, ValueError) as exc:
        log.warning("cannot read the committee's catalogue yet (%s); the registration will tell", exc)
        return params
    try:
        committee_catalogue.check_listed([committee_catalogue.entry_of(
            {k: e[k] for k in committee_catalogue.FIELDS}) for e in listed], args.model, args.weights_digest)
    except TxError as exc:
        raise UsageError(f"cannot join the network: {exc}", EXIT_NO_NODE) from None
    mine = next((e for e in listed if e["weights_digest"] == args.weights_digest), None)
    if mine is None:
        return params
    given = {field for field in CATALOGUE_OPTIONS if getattr(args, field, None) is not None}
    options = {CATALOGUE_OPTIONS[f]: mine[f] for f in CATALOGUE_OPTIONS if f not in given and mine.get(f)}
    if options:
        log.info("the committee's catalogue runs %s with %s", args.model, options)
    return replace(params, **options)


def _directory(args, home: Path):
    """The directory this node works from: the committee's (light-client checked) or a static
    file (tests); None when neither is given (then it serves direct Generate calls only)."""
    if args.committee:
        from gentorrent.ledger.committee import CommitteeDirectory
        from gentorrent.ledger.light_client import TrustFileError

        from gentorrent.config import ROUTING

        try:  # the group's roster is followed at the routing refresh, not a user node's pace
            return CommitteeDirectory.from_args(str(args.committee), home, trust_anchor=args.trust_anchor,
                                                roster_refresh_s=ROUTING.directory_refresh_s)
        except TrustFileError as exc:  # a damaged trust file: the operator decides (see its message)
            raise UsageError(str(exc)) from None
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


def _model_record(keys, address: str, model: str, capacity: int, weights_digest: str = ""):
    """What this node registers: identity (peers pin its key), advertised address, onion key,
    model, and its weights' digest (which the committee's catalogue must list, when it lists
    the model)."""
    from gentorrent.ledger.sections import ModelRecord

    return ModelRecord(node_id=keys.identity.node_id, public_key=keys.identity.public_key, address=address,
                       model=model, onion_key=keys.onion.public_key, capacity=capacity,
                       weights_digest=weights_digest)


def _prepare(args):
    """Stage 1: the weights (an embedded model is converted once), and --tool-call-parser
    checked against vLLM's parsers (importing vLLM, which the engine needs next anyway)."""
    from model_node import catalogue

    args.tool_call_parser = _tool_parser(args.tool_call_parser)
    model = catalogue.resolve(args.load_model, args.weights)
    args.weights_digest = catalogue.cached_weights_digest(model.path, args.home_dir / DIGEST_FILE)
    return model


def _tool_parser(name: str | None) -> str | None:
    """--tool-call-parser: one of vLLM's registered tool parsers, or none."""
    if not name or name.lower() == "none":
        return None
    from vllm.tool_parsers import ToolParserManager

    known = ToolParserManager.list_registered()
    if name not in known:
        raise UsageError(f"--tool-call-parser {name!r} is not one of vLLM's: {', '.join(sorted(known))}")
    return name


async def _serve_metrics(listen: str | None, service, view) -> tuple:
    """--- Prometheus text: vLLM's request families, load, served requests, prefix-cache counters."""
    if not listen:
        return None, ""
    from aiohttp import web

    from gentorrent.metrics import metrics_route, serve_app

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
        return EXIT_NO_NODE
    try:
        channel = await tls.connect(state["address"], Path(state["cert_file"]).read_bytes(), timeout=timeout)
    except (OSError, tls.TlsError) as exc:
        print(f"gt-model: node at {state['address']} does not answer: {exc}", file=sys.stderr)
        return EXIT_NO_NODE
    try:
        reply = await rpc.ModelNodeStub(channel).Status(pb.Empty(), timeout=timeout)
    finally:
        await channel.close()
    print(json.dumps(json.loads(reply.json), indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
