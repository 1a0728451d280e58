"""`gt-verifier`: set up, run and inspect a member of the verification committee.

    gt-verifier init --validators 4 --out ./committee [--chain-id ID] [--base-port 26650]
                     [--host 127.0.0.1 | --hosts H0,H1,...] [--timeouts default|fast] [--lease-s S]
                     [--registry auto|production|devnet]
        keys, TLS certificates and one shared genesis for a committee of N, in N home dirs
    gt-verifier init --home DIR --join GENESIS --listen HOST:PORT
        a non-validating node that follows an existing committee (serves queries, relays txs)
    gt-verifier start --home DIR [--abci-socket ADDR] [--dashboard HOST:PORT]
                      [--epochs --reference-model HOST:PORT --reference-cert FILE
                       [--probe-listen H:P [--probe-advertise H:P]] [--challenge-spread-s S]
                       [--challenge-max-tokens N] [--epoch-pause-s S] [--audit-rate R]]
        run the node (embedded Tendermint consensus), or serve the application to CometBFT;
        --epochs also runs verification epochs (verifier.epochs.runner) with that reference model,
        probing through a user node of its own that registers with the committee
    gt-verifier status --home DIR [--address HOST:PORT]
        height, app hash, peers, last commit time (JSON)
    gt-verifier committee card | propose | approve | submit | show --home DIR ...
        change the committee through the chain (verifier/committee_cli.py)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path

import grpc

from gentorrent.cli import (EXIT_FAILED, EXIT_NO_NODE, Parser, UsageError, check_can_listen, committee_size_note,
                            float_in, host_port, int_in, port, ports_fit, run, stop_on_signals, take_home,
                            until_stopped)
from gentorrent.config import AUDITS, EPOCH_RUN, EPOCHS
from gentorrent.crypto.keys import NodeKeys
from gentorrent.crypto.tls import TlsError, TlsIdentity, connect
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc
from verifier import committee_cli
from verifier.consensus.home import DATA_DIR, NodeConfig
from gentorrent.ledger.chain_params import ChainParams, RegistryRules
from gentorrent.ledger.genesis import Genesis, GenesisError, GenesisValidator

log = logging.getLogger("gt-verifier")
HALT_EXIT_AFTER_S = 15.0  # a halted member's last words: one scrape interval of Prometheus' default


def cmd_init(args: argparse.Namespace) -> int:
    if args.join:
        return _init_join(args)
    if not args.out:
        raise UsageError("init needs --out DIR for the members' homes (or --home DIR --join GENESIS to follow "
                         "a committee)")
    ports_fit(args.base_port, args.validators)
    hosts = _member_hosts(args)
    out = Path(args.out)
    homes = [out / f"v{i}" for i in range(args.validators)]
    for home in homes:
        if (home / "config.json").exists():
            raise UsageError(f"{home} already holds a verifier; refusing to overwrite it (choose another --out)")
    note = committee_size_note(args.validators)
    if note:
        print(f"gt-verifier: warning: {note}", file=sys.stderr)
    validators = []
    for i, home in enumerate(homes):
        keys = NodeKeys.load_or_create(home)
        tls = TlsIdentity.load_or_create_self_signed(home, keys.identity)
        listen = f"{hosts[i]}:{args.base_port + i}"
        NodeConfig(moniker=f"v{i}", listen=listen, timeouts=args.timeouts).save(home)
        validators.append(GenesisValidator(f"v{i}", keys.identity.public_key, 1, listen, tls.cert_pem,
                                           audit_key=keys.onion.public_key))  # its box key: audits
    # every parameter of the committee's rules, written out: the genesis, not a member's build, fixes
    # them. The registry's Sybil rules: a committee on loopback is a devnet (every node in one /24),
    # any other gets the production rules, unless --registry says which
    registry = args.registry
    if registry == "auto":
        registry = "devnet" if all(_is_loopback(h) for h in hosts) else "production"
    rules = RegistryRules.loopback if registry == "devnet" else RegistryRules.production
    params = ChainParams(registry=rules(args.lease_s))
    try:
        genesis = Genesis(args.chain_id, int(time.time() * 1000), tuple(validators), params.to_app_state())
    except GenesisError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for home in homes:
        genesis.save(home / "genesis.json")
    print(json.dumps({"chain_id": args.chain_id, "homes": [str(h) for h in homes],
                      "listen": [v.address for v in validators]}, indent=2))
    return 0


def _member_hosts(args: argparse.Namespace) -> list[str]:
    """Each member's host: --hosts, one per member (a committee on several machines), else --host."""
    if not args.hosts:
        return [args.host] * args.validators
    hosts = [h.strip() for h in args.hosts.split(",")]
    if len(hosts) != args.validators or not all(hosts):
        raise UsageError(f"--hosts names {len(hosts)} hosts for {args.validators} members: give one per member "
                         "(comma-separated, in order), or --host for all")
    return hosts


def _init_join(args: argparse.Namespace) -> int:
    if not args.home or not args.listen:
        raise UsageError("--join needs --home DIR and --listen HOST:PORT")
    home = Path(args.home)
    if (home / "config.json").exists():
        raise UsageError(f"{home} already holds a verifier; refusing to overwrite it (choose another --home)")
    try:
        genesis = Genesis.load(Path(args.join))
    except GenesisError as exc:
        raise UsageError(f"--join {args.join}: not a usable genesis file ({exc}); give the committee's "
                         "genesis.json") from None
    keys = NodeKeys.load_or_create(home)
    TlsIdentity.load_or_create_self_signed(home, keys.identity)
    NodeConfig(moniker=f"observer-{keys.identity.node_id_hex[:8]}", listen=args.listen,
               timeouts=args.timeouts).save(home)
    genesis.save(home / "genesis.json")
    print(json.dumps({"home": str(home), "node_id": keys.identity.node_id_hex,
                      "validator": False, "chain_id": genesis.chain_id}, indent=2))
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    from gentorrent.ledger.committee import RegistrationError

    home = Path(args.home)
    _check_home(home)
    epochs = _epoch_args(args)
    listens = {"--listen": args.listen or NodeConfig.load(home).listen, "--dashboard": args.dashboard,
               "--probe-listen": epochs and epochs["probe_listen"]}
    take_home(home)  # one process per home (a second one would write the same blocks and WAL), before its ports
    for what, address in listens.items():
        if address:  # before anything starts: one line, nothing half-open
            check_can_listen(address, what)
    try:
        return asyncio.run(_run(home, args.abci_socket, args.listen, args.dashboard, epochs, args.halt_exit_after))
    except RegistrationError as exc:
        raise UsageError(f"the probing user node could not join the network: {exc}", EXIT_NO_NODE) from None
    except (GenesisError, ValueError, OSError) as exc:
        raise UsageError(f"{type(exc).__name__}: {exc}", code=1) from None


def _check_home(home: Path) -> None:
    """A verifier's home (config.json, genesis.json) before anything starts."""
    try:
        NodeConfig.load(home)
        Genesis.load(home)
    except (GenesisError, OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"--home {home} is not a verifier's home ({exc}); make one with `gt-verifier init`") \
            from None


def _epoch_args(args: argparse.Namespace) -> dict | None:
    """--- verification epochs: what attach_epochs needs, checked before starting."""
    if not getattr(args, "epochs", False):
        return None
    if not args.reference_model or not args.reference_cert:
        raise UsageError("--epochs needs --reference-model HOST:PORT and --reference-cert FILE")
    if not Path(args.reference_cert).is_file():
        raise UsageError(f"--reference-cert {args.reference_cert}: no such file")
    from gentorrent.ledger.txs import TxError, check_listen

    try:
        check_listen(args.probe_listen, args.probe_advertise)  # its probing user node registers its address
    except TxError as exc:
        raise UsageError(f"--probe-listen: {exc}") from None
    params = replace(EPOCH_RUN, challenge_spread_s=args.challenge_spread_s,
                     challenge_max_tokens=args.challenge_max_tokens, epoch_pause_s=args.epoch_pause_s)
    try:  # against the chain's deadlines, before anything starts
        params.fits(Genesis.load(Path(args.home)).params.epochs)
    except ValueError as exc:
        raise UsageError(f"--challenge-spread-s: {exc} (the genesis' epochs.probe_timeout_ms)") from None
    return {"address": args.reference_model, "cert": Path(args.reference_cert),
            "probe_listen": args.probe_listen, "probe_advertise": args.probe_advertise, "params": params,
            "audits": AUDITS if args.audit_rate is None else replace(AUDITS, rate=args.audit_rate)}


async def _run(home: Path, abci_socket: str | None, listen: str | None, dashboard: str | None = None,
               epochs: dict | None = None, halt_exit_after: float = 0.0) -> int:
    stop = stop_on_signals()  # first: Ctrl-C at any stage below stops the member within seconds
    if abci_socket:
        from verifier.abci.app import RegistryApp
        from verifier.abci.socket_server import bound_address, serve

        NodeConfig.load(home)
        app = RegistryApp(home / DATA_DIR / "app.sqlite")
        server = await serve(app, abci_socket)
        print(f"serving the ABCI application to CometBFT at {bound_address(server)}", flush=True)
        await stop.wait()
        server.close()
        await server.wait_closed()
        app.close()
        return 0
    from verifier.node import VerifierNode

    node = VerifierNode(home, listen=listen)
    await node.start()
    live = None
    try:  # a later step that fails (a taken port) stops what already runs: no half-open servers
        if epochs is not None:  # --- verification epochs
            from verifier.epochs.reference import RemoteReference
            from verifier.epochs.wiring import attach_epochs

            attached, _ = await until_stopped(attach_epochs(
                node, RemoteReference.from_args(epochs["address"], epochs["cert"]), "committee", epochs["params"],
                user_listen=epochs["probe_listen"], user_kwargs={"advertise": epochs["probe_advertise"]},
                audits=epochs["audits"]), stop)  # its probing user node registers: a wait
            if not attached:
                return 0
            print(f"verification epochs on, reference model at {epochs['address']}", flush=True)
        # --- status page and /metrics: read-only views of the running node
        if dashboard:
            from verifier.dashboard_live import LiveDashboard

            live = LiveDashboard(node)
            try:
                port = await live.start(dashboard)
            except OSError as exc:
                raise UsageError(f"--dashboard {dashboard}: cannot listen there ({exc.strerror or exc}); "
                                 "pick a free port", code=1) from None
            print(f"dashboard on http://{dashboard.rpartition(':')[0]}:{port}/", flush=True)
        print(f"gt-verifier {node.config.moniker} listening on port {node.port}, height {node.consensus.host.height}",
              flush=True)
        code = await _until_stopped_or_halted(node, stop, halt_exit_after)
        log.info("shutting down")
    finally:
        if live is not None:
            await live.stop()
        await node.stop()
    return code


async def _until_stopped_or_halted(node, stop: asyncio.Event, linger_s: float) -> int:
    """Run until told to stop (exit 0) or until consensus halts: then say why, keep the status,
    the dashboard and /metrics answering "halted" for `linger_s` (a scrape, an operator's look),
    and exit non-zero, so that a supervisor restarts the member (CometBFT panics likewise)."""
    halted = asyncio.ensure_future(node.consensus.halt_event.wait())
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({halted, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():
            return 0
        print(f"gt-verifier: error: consensus halted: {node.consensus.halted}; exiting in {linger_s:g} s with status "
              f"{EXIT_FAILED} (restart it; the log above says why)", file=sys.stderr, flush=True)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(stopped), linger_s)
        return EXIT_FAILED
    finally:
        halted.cancel()
        stopped.cancel()


def cmd_status(args: argparse.Namespace) -> int:
    _check_home(Path(args.home))
    try:
        reply = asyncio.run(_status(Path(args.home), args.address, args.timeout))
    except (GenesisError, TlsError, OSError, grpc.aio.AioRpcError) as exc:
        detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else exc
        raise UsageError(f"the verifier does not answer: {detail} (is `gt-verifier start --home {args.home}` "
                         "running?)", EXIT_NO_NODE) from None
    detail = json.loads(reply.json) if reply.json else {}
    print(json.dumps({"height": reply.height, "app_hash": reply.app_hash.hex(), "peers": list(reply.peers),
                      "last_commit_time_ms": reply.last_commit_time_ms, "node_id": reply.node_id,
                      "halted": detail.get("halted"), "trust_anchor": detail.get("trust_anchor"), "detail": detail},
                     indent=2, sort_keys=True))
    if detail.get("halted"):  # it answers, but it is not working: a monitor must see a failure
        print(f"gt-verifier: error: consensus halted: {detail['halted']}", file=sys.stderr)
        return EXIT_FAILED
    return 0


async def _status(home: Path, address: str | None, timeout: float) -> pb.VerifierStatusReply:
    cfg = NodeConfig.load(home)
    tls = TlsIdentity.load_or_create_self_signed(home, NodeKeys.load_or_create(home).identity)
    channel = await connect(address or cfg.listen, tls.cert_pem, timeout=timeout)
    try:
        return await rpc.VerifierStub(channel).Status(pb.Empty(), timeout=timeout)
    finally:
        await channel.close()


# --------------------------------------------------------------------------- the model catalogue


def cmd_catalogue(args: argparse.Namespace) -> int:
    """`catalogue add`: list a model (its weights digest and engine options) by a signed
    catalogue_add of this member; `catalogue list`: what the committee lists."""
    home = Path(args.home)
    _check_home(home)
    try:
        return asyncio.run(_catalogue(args, home))
    except (GenesisError, OSError) as exc:
        raise UsageError(f"{type(exc).__name__}: {exc}", EXIT_NO_NODE) from None


async def _catalogue(args: argparse.Namespace, home: Path) -> int:
    from gentorrent.ledger import txs
    from gentorrent.ledger.committee import CODE_IN_MEMPOOL, CommitteeDirectory, CommitteeUnreachable

    directory = CommitteeDirectory(Genesis.load(home), NodeKeys.load_or_create(home).identity)
    try:
        if args.action == "list":
            print(json.dumps(await directory.catalogue(), indent=1))
            return 0
        entry = _catalogue_entry(args)
        code, text = await directory.submit_signed(
            lambda seq: txs.catalogue_add(directory.identity, entry, seq, chain_id=directory.genesis.chain_id))
        if code not in (txs.CODE_OK, CODE_IN_MEMPOOL):
            raise UsageError(f"the committee refused the entry: {text}")
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            mine = [e for e in await directory.catalogue()
                    if (e["model"], e["weights_digest"]) == (entry.model, entry.weights_digest)]
            if mine:
                print(json.dumps(mine[0], indent=1))
                return 0
            await asyncio.sleep(0.5)
        raise UsageError(f"the entry was accepted but is not in the catalogue after {args.timeout:g} s", EXIT_FAILED)
    except CommitteeUnreachable as exc:
        raise UsageError(f"no verifier answers: {exc}", EXIT_NO_NODE) from None
    finally:
        await directory.close()


def _catalogue_entry(args: argparse.Namespace) -> pb.CatalogueEntry:
    from gentorrent import weights
    from gentorrent.ledger import catalogue
    from gentorrent.ledger.signed_tx import TxError

    if bool(args.weights) == bool(args.digest):
        raise UsageError("give --weights DIR (its digest is computed) or --digest sha256:...")
    try:
        digest = args.digest or weights.weights_digest(Path(args.weights))
        return catalogue.entry_of({"model": args.model, "weights_digest": digest, "dtype": args.dtype or "",
                                   "quantization": args.quantization or "", "kv_cache_dtype": args.kv_cache_dtype or "",
                                   "max_model_len": args.max_model_len or 0})
    except (TxError, weights.WeightsError, OSError) as exc:
        raise UsageError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="gt-verifier", description=__doc__.split("\n")[0])
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="how much the node logs to stderr")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    i = sub.add_parser("init", help="create homes for a committee, or join one")
    i.add_argument("--validators", type=int_in(1, 100), default=4,
                   help="members of the committee (N = 3f + 1 tolerates f faulty ones; 4 tolerates 1)")
    i.add_argument("--out", help="directory for the N homes (v0 .. vN-1)")
    i.add_argument("--chain-id", default="gentorrent-committee", help="the committee's chain id")
    i.add_argument("--host", default="127.0.0.1", help="host every member listens on (edit config.json per machine)")
    i.add_argument("--hosts", metavar="H0,H1,...", default=None,
                   help="each member's own host, in order (members on different machines); instead of --host")
    i.add_argument("--base-port", type=port, default=26650, help="member i listens on base-port + i")
    i.add_argument("--timeouts", choices=("default", "fast"), default="default",
                   help="consensus timeouts: default, or fast (tests on loopback)")
    i.add_argument("--lease-s", type=float_in(1, 10**7), default=None, metavar="S",
                   help="how long a node's registration lasts without renewal (genesis app_state; "
                        "default: config REGISTRY.lease_s)")
    i.add_argument("--registry", choices=("auto", "production", "devnet"), default="auto",
                   help="the registry's Sybil rules in the genesis: production (proof of work, relays per /24 "
                        "and /48, one relay per /16 on a path) or devnet (a light proof of work, no prefix "
                        "rules); auto: devnet when every member's host is loopback")
    i.add_argument("--join", metavar="GENESIS", help="join the committee of this genesis as an observer")
    i.add_argument("--home", help="with --join: the observer's home")
    i.add_argument("--listen", type=host_port, help="with --join: the observer's HOST:PORT")
    i.set_defaults(func=cmd_init)
    s = sub.add_parser("start", help="run a verifier")
    s.add_argument("--home", required=True, help="the member's home (made by `gt-verifier init`)")
    s.add_argument("--listen", type=host_port, help="override config.json's listen address")
    s.add_argument("--dashboard", metavar="HOST:PORT", type=host_port,
                   help="serve the read-only status page (/, /api/status) and /metrics there")
    s.add_argument("--abci-socket", metavar="ADDR", help="serve the app to CometBFT instead (tcp://h:p)")
    s.add_argument("--halt-exit-after", type=float_in(0, 3600), default=HALT_EXIT_AFTER_S, metavar="S",
                   help=f"when consensus halts, keep answering status and /metrics (halted) this long, then exit "
                        f"with status {EXIT_FAILED} for a supervisor to restart the member (default %(default)g s)")
    s.add_argument("--epochs", action="store_true", help="run verification epochs (needs --reference-model)")
    s.add_argument("--reference-model", metavar="HOST:PORT", type=host_port,
                   help="a `gt-model serve` with the honest weights: writes questions, scores replies")
    s.add_argument("--reference-cert", metavar="FILE", help="its TLS certificate (pinned)")
    s.add_argument("--probe-listen", metavar="HOST:PORT", default="127.0.0.1:0", type=host_port,
                   help="relay address of this member's own (probing) user node; it registers with the committee "
                        "like any user node (default %(default)s: a single-machine network)")
    s.add_argument("--probe-advertise", metavar="HOST:PORT", type=host_port,
                   help="the address to register for the probing user node (needed with a wildcard --probe-listen)")
    s.add_argument("--challenge-spread-s", type=float_in(0, 86400), default=EPOCH_RUN.challenge_spread_s,
                   metavar="S", help="each challenge leaves after a random delay in [0, S] (default: spread over the "
                        f"whole probing window the genesis sets, {EPOCH_RUN.spread_s(EPOCHS):g} s by default)")
    s.add_argument("--challenge-max-tokens", type=int_in(1, EPOCH_RUN.max_reply_tokens), default=None, metavar="N",
                   help="cap the replies challenges ask for (default: as the traffic model draws them, like users' "
                        "asks; a cap makes challenges recognisable by max_tokens: only for slow test machines)")
    s.add_argument("--epoch-pause-s", type=float_in(0, 3600), default=EPOCH_RUN.epoch_pause_s, metavar="S",
                   help="wait this long after an epoch opens before taking part in its leader election "
                        "(default %(default)g s: pacing; a demo on one machine may shorten it)")
    s.add_argument("--audit-rate", type=float_in(0, 1), default=None, metavar="R",
                   help=f"share of users' asks this member's audit desk accepts as audited (default {AUDITS.rate:g}; "
                        "the whole committee and its users must use one rate)")
    s.set_defaults(func=cmd_start)
    c = sub.add_parser("catalogue", help="the committee's model catalogue: list it, or add a model (a member)")
    c.add_argument("action", choices=("list", "add"), help="list the catalogue, or add an entry signed by this member")
    c.add_argument("--home", required=True, help="the member's home (its identity signs an addition)")
    c.add_argument("--model", help="add: the model's name (what nodes register and users ask for)")
    c.add_argument("--weights", metavar="DIR", help="add: the checkpoint folder, whose weights digest is listed")
    c.add_argument("--digest", metavar="sha256:HEX", help="add: the weights digest, when the folder is elsewhere")
    c.add_argument("--dtype", choices=("auto", "float32", "float16", "bfloat16"),
                   help="add: the dtype nodes and the reference engines run it with (default: theirs)")
    c.add_argument("--quantization", metavar="METHOD", help="add: vLLM's --quantization to run it with")
    c.add_argument("--kv-cache-dtype", choices=("auto", "fp8", "fp8_e4m3", "fp8_e5m2"), help="add: the KV cache dtype")
    c.add_argument("--max-model-len", type=int_in(16, 1 << 21), metavar="TOKENS", help="add: the context to serve")
    c.add_argument("--timeout", type=float_in(1, 600), default=60.0, help="seconds to wait until it is listed")
    c.set_defaults(func=cmd_catalogue)
    st = sub.add_parser("status", help="ask a running verifier for its status")
    st.add_argument("--home", required=True, help="the member's home")
    st.add_argument("--address", type=host_port, help="default: the home's listen address")
    st.add_argument("--timeout", type=float_in(0.1, 600), default=5.0, help="seconds to wait for the answer")
    st.set_defaults(func=cmd_status)
    committee_cli.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return run(lambda: args.func(args), "gt-verifier")


def _is_loopback(host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


if __name__ == "__main__":
    sys.exit(main())
