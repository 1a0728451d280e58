"""gt-user: run a user node and ask through the anonymous overlay.

    gt-user start --home DIR --committee GENESIS [--listen H:P [--advertise H:P]] [--api-listen H:P]
                  [--region R]
    gt-user ask "QUESTION" [--home DIR] [--system TEXT] [--session NAME] [--model NAME] [--no-stream] [--json]
    gt-user ask - < question.txt          (the question from stdin: any size up to the prompt limit)
    gt-user status [--home DIR] [--json]
    gt-user serve-api --listen 127.0.0.1:PORT --home DIR --committee GENESIS ...   (start, with the API on a chosen address)

`start` registers the node with the committee of GENESIS (a signed transaction, waited for
until it is committed, then renewed), runs it in the foreground (relay for others, keep proxy
paths, local API) from the committee's light-client-checked directory, showing its start-up
stages on stderr, and writes DIR/node.json naming its local API, which `ask` and `status` talk
to. `--directory FILE` (a static JSON directory instead of the committee) is for tests and
benchmarks of the overlay alone. `ask` sends a chat question (the model's chat template
applies, as for any OpenAI client); with `--session NAME` the conversation's history stays on
this node and goes with every turn, so follow-ups are answered in context, by the same model
node.

Exit status: 0 answered; 1 no model node could answer (try again later); 2 a bad argument or
file (nothing was changed); 3 no user node is running at --home, or it could not join.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path

from gentorrent.cli import Parser, Stages, UsageError, check_can_listen, float_in, host_port, int_in, run
from gentorrent.config import MODEL_NODE, USER_API, WIRE

DEFAULT_HOME = Path(os.environ.get("GT_USER_HOME", Path.home() / ".gentorrent" / "user"))
NODE_FILE = "node.json"
EXIT_NO_ANSWER = 1
EXIT_USAGE = 2
EXIT_NO_NODE = 3
PROG = "gt-user"
STAGES = ["starting the local API", "listening and registering", "building proxy paths"]


# --------------------------------------------------------------------------- running a node


def _check_directory(args) -> None:
    """The directory source is readable and well-formed, before anything starts."""
    if args.committee:
        from gentorrent.ledger.genesis import Genesis, GenesisError

        try:
            Genesis.load(Path(args.committee))
        except (GenesisError, OSError, ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"--committee {args.committee}: not a usable genesis file ({exc}); give the "
                             "committee's genesis.json") from None
        return
    if not args.directory:
        raise UsageError("give --committee GENESIS: the committee's genesis file (genesis.json), from which this "
                         "node registers itself and reads the directory")
    path = Path(args.directory)
    if not path.is_file():
        raise UsageError(f"no directory: {path} does not exist; give --committee GENESIS (or --directory FILE)")
    from gentorrent.ledger.directory import StaticDirectory

    try:
        StaticDirectory(path)
    except Exception as exc:  # DirectoryError, or records that do not decode
        raise UsageError(f"--directory {path}: not a directory file ({type(exc).__name__}: {exc})") from None


def _directory(args):
    if args.committee:
        from gentorrent.ledger.committee import CommitteeDirectory

        return CommitteeDirectory.from_args(args.committee, Path(args.home))
    from gentorrent.ledger.directory import StaticDirectory

    return StaticDirectory(Path(args.directory))


def _load_config(home: Path) -> dict:
    """HOME/config.toml (optional): a typo in any section or key stops the node at start."""
    from gentorrent import settings
    from gentorrent.crypto import tls
    from gentorrent.crypto.keys import KeyFormatError

    try:
        tls.check_key_files(home)  # a key file others can read: refused, saying what to run
        return settings.load_home(home, settings.USER_SECTIONS)
    except (settings.ConfigError, KeyFormatError) as exc:
        raise UsageError(str(exc)) from None


async def _run_node(args, api_listen: str) -> int:
    from user_client.node import UserNode
    from user_client.openai_api import ApiServer

    from gentorrent.ledger.committee import RegistrationError
    from gentorrent.ledger.txs import TxError, check_listen

    home = Path(args.home)
    conf = _load_config(home)
    _check_directory(args)
    try:
        check_listen(args.listen, args.advertise)  # a wildcard without --advertise: stop here
    except TxError as exc:
        raise UsageError(str(exc)) from None
    check_can_listen(api_listen, "--api-listen" if args.command == "start" else "--listen")
    check_can_listen(args.listen, "--listen" if args.command == "start" else "--relay-listen")
    stages = Stages(PROG, STAGES)
    audits = conf["audits"] if args.audits else dataclasses.replace(conf["audits"], user_enabled=False)
    if not args.audit_reuse:
        audits = dataclasses.replace(audits, user_reusable=False)
    if args.audit_rate is not None:
        audits = dataclasses.replace(audits, rate=args.audit_rate)
    node = UserNode(home, _directory(args), listen=args.listen, region=args.region,
                    cloves=conf["cloves"], params=conf["overlay"], advertise=args.advertise, audits=audits)
    api = ApiServer(node, api_listen, conf["user_api"])
    stages.begin(STAGES[0], detail=api_listen)
    try:  # the API's port first: a taken port stops here, before the node registers anywhere
        await api.start()
    except OSError as exc:
        raise UsageError(f"cannot listen on --api-listen {api_listen}: {exc.strerror}; choose another "
                         "address (port 0: any free)") from None
    stages.begin(STAGES[1], detail=args.listen)
    try:
        await node.start(build_paths=False)
    except (RegistrationError, TxError) as exc:
        await node.stop()
        await api.stop()
        raise UsageError(f"cannot join the network: {exc}", EXIT_NO_NODE) from None
    except Exception as exc:
        await node.stop()
        await api.stop()
        raise UsageError(f"the node could not start: {type(exc).__name__}: {exc}", code=1) from None
    info = {"pid": os.getpid(), "address": node.address, "api": api.url, "node_id": node.node_id_hex}
    (home / NODE_FILE).write_text(json.dumps(info))
    print(json.dumps(info), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await _build_paths(node, stages, api.url)
        await stop.wait()
    finally:
        (home / NODE_FILE).unlink(missing_ok=True)
        await api.stop()
        await node.stop()
    return 0


async def _build_paths(node, stages: Stages, api_url: str) -> None:
    """First paths, with their count as progress; too few relays yet is not fatal (the
    maintenance loop keeps trying) and says so."""
    need = node.cloves.n
    stages.begin(STAGES[2], detail=f"{need} needed, {node.cloves.proxies_kept} kept")
    try:
        await node.paths.fill()
    except Exception as exc:  # too few relays yet
        stages.end()
        print(f"{PROG}: paths not ready yet ({exc}); the node keeps trying and answers asks once it holds "
              f"{need}", file=sys.stderr, flush=True)
        return
    usable = node.paths.status().get("usable", 0)
    stages.finish(f"{usable} proxy paths held; ask with `gt-user ask` or any OpenAI client at {api_url}/v1")


def cmd_start(args) -> int:
    return asyncio.run(_run_node(args, args.api_listen))


def cmd_serve_api(args) -> int:
    return asyncio.run(_run_node(args, args.listen_api))


# --------------------------------------------------------------------------- talking to a node


def _api_url(home: str) -> str:
    path = Path(home) / NODE_FILE
    try:
        return str(json.loads(path.read_text())["api"])
    except (OSError, ValueError, KeyError, TypeError):
        raise UsageError(f"no running user node at {home} (start one with `gt-user start --home {home}`)",
                         EXIT_NO_NODE) from None


def _post(url: str, body: dict, timeout: float):
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        return urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        raise _api_error(exc.code, exc.read()) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UsageError(f"cannot reach the user node's API at {url}: {reason} (is `gt-user start` "
                         "running?)", EXIT_NO_NODE) from None


def _api_error(status: int, body: bytes) -> UsageError:
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = f"HTTP {status}"
    return UsageError(message, EXIT_USAGE if status in (400, 404, 413) else EXIT_NO_ANSWER)


def _question(text: str) -> str:
    """The question; `-` reads it from stdin (no shell limit on its size)."""
    if text == "-":
        data = sys.stdin.buffer.read(WIRE.max_prompt_bytes + 1)
        text = data.decode("utf-8", errors="replace")
    if len(text.encode()) > WIRE.max_prompt_bytes:
        raise UsageError(f"the question is larger than {WIRE.max_prompt_bytes} bytes; shorten it")
    if not text.strip():
        raise UsageError("the question is empty; give it as an argument or pipe it in with `-`")
    return text


def cmd_ask(args) -> int:
    question = _question(args.prompt)
    url = _api_url(args.home) + "/gt/ask"
    body = {"prompt": question, "model": args.model, "session": args.session, "system": args.system,
            "stream": args.stream, "raw": args.raw, "max_tokens": args.max_tokens,
            "temperature": args.temperature, "top_p": args.top_p, "seed": args.seed}
    with _post(url, {k: v for k, v in body.items() if v is not None}, args.timeout) as response:
        if not args.stream:
            answer = json.loads(response.read())
            print(json.dumps(answer) if args.json else answer["text"])
            if not args.json:
                _describe(answer)
            return 0
        for raw in response:
            line = json.loads(raw)
            if "error" in line:
                raise UsageError(line["error"]["message"], EXIT_NO_ANSWER)
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
    usage = answer.get("usage", {})
    print(f"[served by {answer['served_by'][:16]} over {len(answer['paths'])} paths of "
          f"{len(answer['paths'][0]) if answer['paths'] else 0} relays; {usage.get('prompt_tokens', 0)} prompt + "
          f"{usage.get('completion_tokens', 0)} answer tokens; {stages}]", file=sys.stderr)


def cmd_status(args) -> int:
    url = _api_url(args.home) + "/gt/status"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            status = json.loads(response.read())
    except (urllib.error.URLError, OSError) as exc:
        raise UsageError(f"cannot reach the user node's API at {url}: {getattr(exc, 'reason', exc)}",
                         EXIT_NO_NODE) from None
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


def _home(p: argparse.ArgumentParser) -> None:
    p.add_argument("--home", default=str(DEFAULT_HOME),
                   help="the node's home: keys, TLS certificate, config.toml, node.json (default: $GT_USER_HOME "
                        "or ~/.gentorrent/user)")


def _node_options(p: argparse.ArgumentParser) -> None:
    _home(p)
    p.add_argument("--committee", metavar="GENESIS",
                   help="the committee's genesis.json: register this node there and work from its light-client-"
                        "checked directory")
    p.add_argument("--directory", metavar="FILE",
                   help="TESTS AND BENCHMARKS ONLY: a static directory JSON file instead of the committee")
    p.add_argument("--region", default="default", help="the region this node relays in (paths stay in a region)")
    p.add_argument("--advertise", metavar="HOST:PORT", type=host_port,
                   help="relay address to register, when peers reach this node elsewhere than --listen "
                        "(a wildcard listen address, a port forward); default: the address it listens on")
    p.add_argument("--audits", action=argparse.BooleanOptionalAction, default=True,
                   help="hand a random share of this node's asks (prompt, reply, the node's receipt) to the "
                        "committee, anonymously, to check model nodes on real traffic (--no-audits: never; "
                        "config.toml [audits] user_enabled = false does the same)")
    p.add_argument("--audit-reuse", action=argparse.BooleanOptionalAction, default=True,
                   help="let the committee reuse this node's audited asks, rewritten and without any id, as "
                        "challenges to other model nodes: prompts no public corpus holds, so a cheater cannot "
                        "look challenges up (--no-audit-reuse: audits are only scored; config.toml [audits] "
                        "user_reusable = false does the same)")
    p.add_argument("--audit-rate", type=float_in(0, 1), default=None, metavar="R",
                   help="the committee's audit rate, when it runs another than the default (config.toml "
                        "[audits] rate does the same); a higher rate than the committee's only wastes work")


def parser() -> argparse.ArgumentParser:
    ap = Parser(prog=PROG, description="GenTorrent user node: ask LLMs anonymously, relay for others")
    ap.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                    help="how much the node logs to stderr")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("start", help="run a user node (relay, proxy paths, local API) in the foreground")
    _node_options(p)
    p.add_argument("--listen", default="127.0.0.1:0", type=host_port,
                   help="relay address, HOST:PORT (port 0: any free)")
    p.add_argument("--api-listen", default="127.0.0.1:0", type=host_port,
                   help="the local API (OpenAI-compatible), HOST:PORT; keep it on loopback")
    p.set_defaults(func=cmd_start)
    p = sub.add_parser("serve-api", help="`start` with the OpenAI-compatible API on a chosen address")
    _node_options(p)
    p.add_argument("--listen", dest="listen_api", required=True, type=host_port,
                   help="API address, e.g. 127.0.0.1:8000 (then base_url http://127.0.0.1:8000/v1)")
    p.add_argument("--relay-listen", dest="listen", default="127.0.0.1:0", type=host_port,
                   help="relay address, HOST:PORT (port 0: any free)")
    p.set_defaults(func=cmd_serve_api)
    p = sub.add_parser("ask", help="ask a question through the overlay (needs a running `gt-user start`)")
    p.add_argument("prompt", metavar="QUESTION", help="the question; `-` reads it from stdin")
    _home(p)
    p.add_argument("--model", default=MODEL_NODE.default_model, help="which model answers")
    p.add_argument("--system", metavar="TEXT", help="a system prompt before the question")
    p.add_argument("--session", metavar="NAME",
                   help="keep a conversation: its history stays on this node and goes with every turn")
    p.add_argument("--raw", action="store_true",
                   help="send the question as a raw prompt, without the chat template (base models)")
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=USER_API.stream,
                   help="print the answer as it arrives")
    p.add_argument("--json", action="store_true", help="print the answer as one JSON object")
    p.add_argument("--max-tokens", type=int_in(1, MODEL_NODE.max_new_tokens), default=None,
                   help=f"longest answer in tokens (default {USER_API.max_tokens})")
    p.add_argument("--temperature", type=float_in(0, MODEL_NODE.max_temperature), default=None,
                   help=f"sampling temperature, 0 = greedy (default {USER_API.temperature})")
    p.add_argument("--top-p", type=float_in(0, 1, low_open=True), default=None,
                   help=f"nucleus sampling share (default {USER_API.top_p})")
    p.add_argument("--seed", type=int_in(0, 2 ** 63 - 1), default=None, help="sampling seed (reproducible answers)")
    p.add_argument("--timeout", type=float_in(1, 3600), default=300.0, help="seconds to wait for the answer")
    p.set_defaults(func=cmd_ask)
    p = sub.add_parser("status", help="paths, proxies and relayed traffic of the running node")
    _home(p)
    p.add_argument("--json", action="store_true", help="print the status as one JSON object")
    p.set_defaults(func=cmd_status)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level), format="%(levelname)s %(name)s: %(message)s")
    return run(lambda: args.func(args), PROG)


if __name__ == "__main__":
    sys.exit(main())
