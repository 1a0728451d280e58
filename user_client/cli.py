"""gt-user: run a user node and ask through the anonymous overlay.

    gt-user start --home DIR --committee GENESIS [--listen H:P [--advertise H:P]] [--api-listen H:P]
                  [--region R]
    gt-user ask "PROMPT" [--home DIR] [--model NAME] [--stream] [--session ID] [--json]
    gt-user status [--home DIR] [--json]
    gt-user serve-api --listen 127.0.0.1:PORT --home DIR --committee GENESIS

`start` registers the node with the committee of GENESIS (a signed transaction, waited for
until it is committed, then renewed), runs it in the foreground (relay for others, keep proxy
paths, local API) from the committee's light-client-checked directory, and writes
DIR/node.json naming its local API, which `ask` and `status` talk to. `serve-api` is `start`
with the OpenAI-compatible API on a chosen address. `--directory FILE` (a static JSON
directory instead of the committee) is for tests and benchmarks of the overlay alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path

from gentorrent.config import MODEL_NODE, WIRE

DEFAULT_HOME = Path(os.environ.get("GT_USER_HOME", Path.home() / ".gentorrent" / "user"))
NODE_FILE = "node.json"
EXIT_NO_ANSWER = 1
EXIT_NO_NODE = 2
EXIT_USAGE = 64


class CliError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


# --------------------------------------------------------------------------- running a node


def _directory(args):
    if args.committee:
        from gentorrent.ledger.committee import CommitteeDirectory

        try:
            return CommitteeDirectory.from_args(args.committee, Path(args.home))
        except (OSError, ValueError) as exc:
            raise CliError(f"cannot use the committee genesis {args.committee}: {exc}", EXIT_USAGE) from exc
    if not args.directory:
        raise CliError("give --committee GENESIS: the committee's genesis file (genesis.json), from which this "
                       "node registers itself and reads the directory", EXIT_USAGE)
    path = Path(args.directory)
    if not path.exists():
        raise CliError(f"no directory: {path} does not exist", EXIT_USAGE)
    from gentorrent.ledger.directory import StaticDirectory

    return StaticDirectory(path)


def _load_config(home: Path) -> dict:
    """HOME/config.toml (optional): [cloves] and [overlay] tune this node, and a typo
    in any section or key stops it at start with an error naming the key."""
    from gentorrent import settings
    from gentorrent.crypto import tls
    from gentorrent.crypto.keys import KeyFormatError

    try:
        tls.check_key_files(home)  # a key file others can read: refused, saying what to run
        return settings.load_home(home, settings.USER_SECTIONS)
    except (settings.ConfigError, KeyFormatError) as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc


async def _run_node(args, api_listen: str) -> None:
    from user_client.node import UserNode
    from user_client.openai_api import ApiServer

    from gentorrent.ledger.committee import RegistrationError
    from gentorrent.ledger.txs import TxError, check_listen

    home = Path(args.home)
    conf = _load_config(home)
    try:
        check_listen(args.listen, args.advertise)
    except TxError as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc
    node = UserNode(home, _directory(args), listen=args.listen, region=args.region,
                    cloves=conf["cloves"], params=conf["overlay"], advertise=args.advertise)
    try:
        await node.start(build_paths=False)
    except (RegistrationError, TxError) as exc:
        await node.stop()
        raise CliError(f"cannot join the network: {exc}", EXIT_NO_NODE) from exc
    api = ApiServer(node, api_listen)
    await api.start()
    info = {"pid": os.getpid(), "address": node.address, "api": api.url, "node_id": node.node_id_hex}
    (home / NODE_FILE).write_text(json.dumps(info))
    print(json.dumps(info), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        try:
            await node.paths.fill()
        except Exception as exc:  # too few relays yet: the maintenance loop keeps trying
            logging.getLogger("gt-user").warning("paths not ready yet: %s", exc)
        await stop.wait()
    finally:
        (home / NODE_FILE).unlink(missing_ok=True)
        await api.stop()
        await node.stop()


def cmd_start(args) -> int:
    asyncio.run(_run_node(args, args.api_listen))
    return 0


def cmd_serve_api(args) -> int:
    asyncio.run(_run_node(args, args.listen_api))
    return 0


# --------------------------------------------------------------------------- talking to a node


def _api_url(home: str) -> str:
    path = Path(home) / NODE_FILE
    try:
        info = json.loads(path.read_text())
        return str(info["api"])
    except (OSError, ValueError, KeyError) as exc:
        raise CliError(f"no running user node at {home} (start one with `gt-user start --home {home}`)",
                       EXIT_NO_NODE) from exc


def _post(url: str, body: dict, timeout: float):
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        return urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = str(exc)
        raise CliError(message, EXIT_NO_ANSWER if exc.code == 503 else EXIT_USAGE) from exc
    except urllib.error.URLError as exc:
        raise CliError(f"cannot reach the user node's API at {url}: {exc.reason}", EXIT_NO_NODE) from exc


def cmd_ask(args) -> int:
    url = _api_url(args.home) + "/gt/ask"
    body = {"prompt": args.prompt, "model": args.model, "session": args.session, "stream": args.stream,
            "max_tokens": args.max_tokens, "temperature": args.temperature}
    with _post(url, body, args.timeout) as response:
        if not args.stream:
            answer = json.loads(response.read())
            print(json.dumps(answer) if args.json else answer["text"])
            if not args.json:
                _describe(answer)
            return 0
        for raw in response:
            line = json.loads(raw)
            if "error" in line:
                raise CliError(line["error"], EXIT_NO_ANSWER)
            if "delta" in line and not args.json:
                print(line["delta"], end="", flush=True)
            if "answer" in line:
                if args.json:
                    print(json.dumps(line["answer"]))
                else:
                    print()
                    _describe(line["answer"])
    return 0


def _describe(answer: dict) -> None:
    t = answer.get("timings_ms", {})
    stages = ", ".join(f"{k[:-3]} {v:.1f} ms" for k, v in t.items())
    print(f"[served by {answer['served_by'][:16]} over {len(answer['paths'])} paths of "
          f"{len(answer['paths'][0]) if answer['paths'] else 0} relays; {stages}]", file=sys.stderr)


def cmd_status(args) -> int:
    url = _api_url(args.home) + "/gt/status"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            status = json.loads(response.read())
    except urllib.error.URLError as exc:
        raise CliError(f"cannot reach the user node's API at {url}: {exc.reason}", EXIT_NO_NODE) from exc
    if args.json:
        print(json.dumps(status))
        return 0
    paths, relay, asking = status["paths"], status["relay"], status["asking"]
    print(f"node {status['node_id'][:16]} at {status['address']} (region {status['region']}, "
          f"up {status['uptime_s']} s)")
    print(f"proxy paths: {paths.get('usable', 0)} usable of {paths.get('keep', 0)} kept "
          f"({paths.get('built', 0)} built, {paths.get('build_failures', 0)} failed builds)")
    for p in paths.get("paths", []):
        print(f"  path {p['id']}: {' -> '.join(p['relays'])}{' FAILED' if p['failed'] else ''} "
              f"(sent {p['sends']}, replies {p['replies']})")
    table = relay.get("table", {})
    print(f"relaying: {table.get('paths', 0)} paths ({table.get('as_proxy', 0)} as proxy), "
          f"{table.get('forwarded', 0)} forwarded, {table.get('returned', 0)} returned, drops {relay.get('drops')}")
    print(f"asks: {asking.get('asked', 0)} asked, {asking.get('answered', 0)} answered, drops {asking.get('drops')}")
    return 0


# --------------------------------------------------------------------------- arguments


def _node_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--home", default=str(DEFAULT_HOME), help="node home (keys, TLS, node.json)")
    p.add_argument("--committee", metavar="GENESIS",
                   help="the committee's genesis file: register this node there and work from its checked "
                        "directory")
    p.add_argument("--directory", metavar="FILE",
                   help="TESTS AND BENCHMARKS ONLY: a static directory JSON file instead of the committee")
    p.add_argument("--region", default="default")
    p.add_argument("--advertise", metavar="H:P",
                   help="relay address to register, when peers reach this node elsewhere than --listen "
                        "(a wildcard listen address, a port forward); default: the address it listens on")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gt-user", description="GenTorrent user node: anonymous LLM asks")
    ap.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("start", help="run a user node (relay, proxy paths, local API)")
    _node_options(p)
    p.add_argument("--listen", default="127.0.0.1:0", help="relay address (host:port)")
    p.add_argument("--api-listen", default="127.0.0.1:0", help="local API address")
    p.set_defaults(func=cmd_start)
    p = sub.add_parser("serve-api", help="run a user node with an OpenAI-compatible API on --listen")
    _node_options(p)
    p.add_argument("--listen", dest="listen_api", required=True, help="API address, e.g. 127.0.0.1:8080")
    p.add_argument("--relay-listen", dest="listen", default="127.0.0.1:0", help="relay address")
    p.set_defaults(func=cmd_serve_api)
    p = sub.add_parser("ask", help="ask through the overlay (needs a running `gt-user start`)")
    p.add_argument("prompt")
    p.add_argument("--home", default=str(DEFAULT_HOME))
    p.add_argument("--model", default=MODEL_NODE.default_model)
    p.add_argument("--stream", action="store_true")
    p.add_argument("--session")
    p.add_argument("--json", action="store_true", help="print the answer as one JSON object")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--timeout", type=float, default=300.0)
    p.set_defaults(func=cmd_ask)
    p = sub.add_parser("status", help="paths, proxies and relayed traffic of the running node")
    p.add_argument("--home", default=str(DEFAULT_HOME))
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level), format="%(levelname)s %(name)s: %(message)s")
    if getattr(args, "prompt", None) is not None and len(args.prompt.encode()) > WIRE.max_prompt_bytes:
        print(f"gt-user: error: prompt larger than {WIRE.max_prompt_bytes} bytes", file=sys.stderr)
        return EXIT_USAGE
    try:
        return args.func(args)
    except CliError as exc:
        print(f"gt-user: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
