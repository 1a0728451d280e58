"""`gt-verifier`: set up, run and inspect a member of the verification committee.

    gt-verifier init --validators 4 --out ./committee [--chain-id ID] [--base-port 26650]
                     [--host 127.0.0.1] [--timeouts default|fast] [--lease-s S]
        keys, TLS certificates and one shared genesis for a committee of N, in N home dirs
    gt-verifier init --home DIR --join GENESIS --listen HOST:PORT
        a non-validating node that follows an existing committee (serves queries, relays txs)
    gt-verifier start --home DIR [--abci-socket ADDR] [--dashboard HOST:PORT]
                      [--epochs --reference-model HOST:PORT --reference-cert FILE
                       [--probe-listen H:P [--probe-advertise H:P]] [--challenge-spread-s S]]
        run the node (embedded Tendermint consensus), or serve the application to CometBFT;
        --epochs also runs verification epochs (verifier.epochs.runner) with that reference model,
        probing through a user node of its own that registers with the committee
    gt-verifier status --home DIR [--address HOST:PORT]
        height, app hash, peers, last commit time (JSON)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

from gentorrent.config import EPOCH_RUN
from gentorrent.crypto.keys import NodeKeys
from gentorrent.crypto.tls import TlsError, TlsIdentity, connect
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc
from verifier.consensus.home import DATA_DIR, NodeConfig
from gentorrent.ledger.genesis import Genesis, GenesisError, GenesisValidator

log = logging.getLogger("gt-verifier")


def cmd_init(args: argparse.Namespace) -> int:
    if args.join:
        return _init_join(args)
    if not args.out or args.validators < 1:
        print("error: init needs --validators N --out DIR (or --home DIR --join GENESIS)", file=sys.stderr)
        return 2
    out = Path(args.out)
    homes = [out / f"v{i}" for i in range(args.validators)]
    for home in homes:
        if (home / "config.json").exists():
            print(f"error: {home} already holds a verifier; refusing to overwrite it", file=sys.stderr)
            return 1
    validators = []
    for i, home in enumerate(homes):
        keys = NodeKeys.load_or_create(home)
        tls = TlsIdentity.load_or_create(home, keys.identity)
        listen = f"{args.host}:{args.base_port + i}"
        NodeConfig(moniker=f"v{i}", listen=listen, timeouts=args.timeouts).save(home)
        validators.append(GenesisValidator(f"v{i}", keys.identity.public_key, 1, listen, tls.cert_pem))
    app_state = {"registry": {"lease_s": args.lease_s}} if args.lease_s is not None else {}
    try:
        genesis = Genesis(args.chain_id, int(time.time() * 1000), tuple(validators), app_state)
    except GenesisError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for home in homes:
        genesis.save(home / "genesis.json")
    print(json.dumps({"chain_id": args.chain_id, "homes": [str(h) for h in homes],
                      "listen": [v.address for v in validators]}, indent=2))
    return 0


def _init_join(args: argparse.Namespace) -> int:
    if not args.home or not args.listen:
        print("error: --join needs --home DIR and --listen HOST:PORT", file=sys.stderr)
        return 2
    home = Path(args.home)
    if (home / "config.json").exists():
        print(f"error: {home} already holds a verifier", file=sys.stderr)
        return 1
    genesis = Genesis.load(Path(args.join))
    keys = NodeKeys.load_or_create(home)
    TlsIdentity.load_or_create(home, keys.identity)
    NodeConfig(moniker=f"observer-{keys.identity.node_id_hex[:8]}", listen=args.listen,
               timeouts=args.timeouts).save(home)
    genesis.save(home / "genesis.json")
    print(json.dumps({"home": str(home), "node_id": keys.identity.node_id_hex,
                      "validator": False, "chain_id": genesis.chain_id}, indent=2))
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    from gentorrent.ledger.committee import RegistrationError

    home = Path(args.home)
    try:
        return asyncio.run(_run(home, args.abci_socket, args.listen, args.dashboard, _epoch_args(args)))
    except (GenesisError, ValueError, OSError, RegistrationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _epoch_args(args: argparse.Namespace) -> dict | None:
    """--- verification epochs: what attach_epochs needs, checked before starting."""
    if not getattr(args, "epochs", False):
        return None
    if not args.reference_model or not args.reference_cert:
        raise ValueError("--epochs needs --reference-model HOST:PORT and --reference-cert FILE")
    if not Path(args.reference_cert).is_file():
        raise ValueError(f"--reference-cert {args.reference_cert}: no such file")
    from gentorrent.ledger.txs import check_listen

    check_listen(args.probe_listen, args.probe_advertise)  # its probing user node registers its address
    return {"address": args.reference_model, "cert": Path(args.reference_cert),
            "probe_listen": args.probe_listen, "probe_advertise": args.probe_advertise,
            "params": replace(EPOCH_RUN, challenge_spread_s=args.challenge_spread_s)}  # checks the range


async def _run(home: Path, abci_socket: str | None, listen: str | None, dashboard: str | None = None,
               epochs: dict | None = None) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
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
    from verifier.consensus.node import VerifierNode

    node = VerifierNode(home, listen=listen)
    await node.start()
    if epochs is not None:  # --- verification epochs
        from verifier.epochs.reference import RemoteReference
        from verifier.epochs.wiring import attach_epochs

        await attach_epochs(node, RemoteReference.from_args(epochs["address"], epochs["cert"]), "committee",
                            epochs["params"], user_listen=epochs["probe_listen"],
                            user_kwargs={"advertise": epochs["probe_advertise"]})
        print(f"verification epochs on, reference model at {epochs['address']}", flush=True)
    # --- status page and /metrics: read-only views of the running node
    live = None
    if dashboard:
        from verifier.dashboard_live import LiveDashboard

        live = LiveDashboard(node)
        print(f"dashboard on http://{dashboard.rpartition(':')[0]}:{await live.start(dashboard)}/", flush=True)
    print(f"gt-verifier {node.config.moniker} listening on port {node.port}, height {node.host.height}",
          flush=True)
    await stop.wait()
    log.info("shutting down")
    if live is not None:
        await live.stop()
    await node.stop()
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    try:
        reply = asyncio.run(_status(Path(args.home), args.address, args.timeout))
    except (GenesisError, TlsError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    detail = json.loads(reply.json) if reply.json else {}
    print(json.dumps({"height": reply.height, "app_hash": reply.app_hash.hex(), "peers": list(reply.peers),
                      "last_commit_time_ms": reply.last_commit_time_ms, "node_id": reply.node_id,
                      "detail": detail}, indent=2, sort_keys=True))
    return 0


async def _status(home: Path, address: str | None, timeout: float) -> pb.VerifierStatusReply:
    cfg = NodeConfig.load(home)
    tls = TlsIdentity.load_or_create(home, NodeKeys.load_or_create(home).identity)
    channel = await connect(address or cfg.listen, tls.cert_pem, timeout=timeout)
    try:
        return await rpc.VerifierStub(channel).Status(pb.Empty(), timeout=timeout)
    finally:
        await channel.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gt-verifier", description=__doc__.split("\n")[0])
    p.add_argument("--log-level", default="INFO")
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("init", help="create homes for a committee, or join one")
    i.add_argument("--validators", type=int, default=4)
    i.add_argument("--out", help="directory for the N homes (v0 .. vN-1)")
    i.add_argument("--chain-id", default="gentorrent-committee")
    i.add_argument("--host", default="127.0.0.1")
    i.add_argument("--base-port", type=int, default=26650)
    i.add_argument("--timeouts", choices=("default", "fast"), default="default")
    i.add_argument("--lease-s", type=float, default=None, metavar="S",
                   help="how long a node's registration lasts without renewal (genesis app_state; "
                        "default: config REGISTRY.lease_s)")
    i.add_argument("--join", metavar="GENESIS", help="join the committee of this genesis as an observer")
    i.add_argument("--home")
    i.add_argument("--listen")
    i.set_defaults(func=cmd_init)
    s = sub.add_parser("start", help="run a verifier")
    s.add_argument("--home", required=True)
    s.add_argument("--listen", help="override config.json's listen address")
    s.add_argument("--dashboard", metavar="HOST:PORT",
                   help="serve the read-only status page (/, /api/status) and /metrics there")
    s.add_argument("--abci-socket", metavar="ADDR", help="serve the app to CometBFT instead (tcp://h:p)")
    s.add_argument("--epochs", action="store_true", help="run verification epochs (needs --reference-model)")
    s.add_argument("--reference-model", metavar="HOST:PORT",
                   help="a `gt-model serve` with the honest weights: writes questions, scores replies")
    s.add_argument("--reference-cert", metavar="FILE", help="its TLS certificate (pinned)")
    s.add_argument("--probe-listen", metavar="HOST:PORT", default="127.0.0.1:0",
                   help="relay address of this member's own (probing) user node; it registers with the committee "
                        "like any user node (default %(default)s: a single-machine network)")
    s.add_argument("--probe-advertise", metavar="HOST:PORT",
                   help="the address to register for the probing user node (needed with a wildcard --probe-listen)")
    s.add_argument("--challenge-spread-s", type=float, default=EPOCH_RUN.challenge_spread_s, metavar="S",
                   help="each challenge leaves after a random delay in [0, S] (default %(default)s)")
    s.set_defaults(func=cmd_start)
    st = sub.add_parser("status", help="ask a running verifier for its status")
    st.add_argument("--home", required=True)
    st.add_argument("--address", help="default: the home's listen address")
    st.add_argument("--timeout", type=float, default=5.0)
    st.set_defaults(func=cmd_status)
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
