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

Exit status (README "Exit statuses", gentorrent.cli): 0 answered (or a node stopped by Ctrl-C);
1 no answer, also a stalled, garbled or cut stream (try again later); 2 a bad argument or file,
or a home another process holds (nothing was changed); 3 no user node is running at --home, or
it could not join.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

from gentorrent.cli import EXIT_FAILED as EXIT_NO_ANSWER
from gentorrent.cli import (EXIT_NO_NODE, EXIT_USAGE, Parser, Stages, UsageError, add_trust_anchor, check_can_listen,
                            check_directory_source, float_in, host_port, int_in, run, stop_on_signals, take_home,
                            until_stopped)
from gentorrent.config import MODEL_NODE, USER_API, WIRE
from user_client.api_access import ApiAccess
from user_client.api_access import check_listen as check_api_listen

DEFAULT_HOME = Path(os.environ.get("GT_USER_HOME", Path.home() / ".gentorrent" / "user"))
NODE_FILE = "node.json"
API_KEY_ENV = "GT_USER_API_KEY"  # the API key, when not on the command line (as vLLM's VLLM_API_KEY)
PROG = "gt-user"
STAGES = ["starting the local API", "listening and registering", "building proxy paths"]


# --------------------------------------------------------------------------- running a node


def _check_directory(args) -> None:
    """The directory source is readable and well-formed, before anything starts."""
    if not args.committee and not args.directory:
        raise UsageError("give --committee GENESIS: the committee's genesis file (genesis.json), from which this "
                         "node registers itself and reads the directory")
    check_directory_source(args.committee, args.directory, trust_anchor=args.trust_anchor)


def _directory(args):
    if args.committee:
        from gentorrent.ledger.committee import CommitteeDirectory
        from gentorrent.ledger.light_client import TrustFileError

        try:
            return CommitteeDirectory.from_args(args.committee, Path(args.home), trust_anchor=args.trust_anchor)
        except TrustFileError as exc:  # a damaged trust file: the operator decides (see its message)
            raise UsageError(str(exc)) from None
    from gentorrent.ledger.directory import StaticDirectory

    return StaticDirectory(Path(args.directory))


def _load_config(home: Path) -> dict:
    """HOME/config.toml (optional): a typo in any section or key stops the node at start."""
    from gentorrent import settings
    from gentorrent.crypto import tls
    from gentorrent.crypto.keys import KeyFormatError

    try:
        tls.check_key_files(home)  # a key file others can read: refused, saying what to run
        return settings.load_home(home, settings.USER)
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
    api_flag = "--api-listen" if args.command == "start" else "--listen"
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    try:
        check_api_listen(api_listen, api_key)  # every interface, and no key: refused
    except ValueError as exc:
        raise UsageError(f"{api_flag}: {exc}") from None
    try:
        ApiAccess.make(api_listen, api_key, args.cors_origin)
    except ValueError as exc:
        raise UsageError(f"--cors-origin: {exc}") from None
    lock = take_home(home)  # one process per home, before anything in it is written (and before its ports)
    check_can_listen(api_listen, api_flag)
    check_can_listen(args.listen, "--listen" if args.command == "start" else "--relay-listen")
    stages = Stages(PROG, STAGES)
    audits = conf["audits"] if args.audits else dataclasses.replace(conf["audits"], user_enabled=False)
    if not args.audit_reuse:
        audits = dataclasses.replace(audits, user_reusable=False)
    if args.audit_rate is not None:
        audits = dataclasses.replace(audits, rate=args.audit_rate)
    node = UserNode(home, _directory(args), listen=args.listen, region=args.region,
                    cloves=conf["cloves"], params=conf["overlay"], advertise=args.advertise, audits=audits)
    api = ApiServer(node, api_listen, conf["user_api"], api_key=api_key, cors_origins=tuple(args.cors_origin))
    stop = stop_on_signals()  # Ctrl-C at any stage below stops the node cleanly (exit 0)
    wrote = False
    try:
        stages.begin(STAGES[0], detail=api_listen)
        try:  # the API's port first: a taken port stops here, before the node registers anywhere
            await api.start()
        except OSError as exc:
            raise UsageError(f"cannot listen on --api-listen {api_listen}: {exc.strerror}; choose another "
                             "address (port 0: any free)") from None
        stages.begin(STAGES[1], detail=args.listen)
        try:
            started, _ = await until_stopped(node.start(build_paths=False), stop)
        except (RegistrationError, TxError) as exc:
            raise UsageError(f"cannot join the network: {exc}", EXIT_NO_NODE) from None
        except Exception as exc:
            raise UsageError(f"the node could not start: {type(exc).__name__}: {exc}", EXIT_NO_ANSWER) from None
        if not started:
            return 0
        info = {"pid": os.getpid(), "address": node.address, "api": api.url, "node_id": node.node_id_hex}
        _write_node_file(home, {**info, "api_key": api_key} if api_key else info)
        wrote = True
        print(json.dumps(info), flush=True)  # listening and registered: other nodes may use it as a relay
        built, _ = await until_stopped(_build_paths(node, stages, api.url), stop)
        if built:
            await stop.wait()
    finally:
        if wrote:
            (home / NODE_FILE).unlink(missing_ok=True)
        await api.stop()
        await node.stop()
        lock.release()
    return 0


def _write_node_file(home: Path, info: dict) -> None:
    """node.json, readable by its owner only: it holds the API key when the node has one (so
    `gt-user ask` on this home needs no flag)."""
    path = home / NODE_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(info))
    os.chmod(path, 0o600)


async def _build_paths(node, stages: Stages, api_url: str, poll_s: float = 1.0) -> None:
    """The first n proxy paths, with their count as progress. Ready means usable: "ready" is
    said only once the node holds the n paths an ask needs (/health says the same). Too few
    relays yet is not fatal: the node keeps building (and relaying for others) meanwhile."""
    need = node.cloves.n
    stages.begin(STAGES[2], detail=f"{need} needed, {node.cloves.proxies_kept} kept")
    said, last_note = None, 0.0
    loop = asyncio.get_running_loop()
    while True:
        try:
            await node.paths.fill()
            problem = ""
        except Exception as exc:  # too few relays yet
            problem = f" ({exc})"
        usable = node.paths.status().get("usable", 0)
        if usable >= need:
            break
        if said != (usable, problem) or loop.time() - last_note >= stages.every_s:
            said, last_note = (usable, problem), loop.time()
            print(f"{PROG}: [{len(STAGES)}/{len(STAGES)}] {STAGES[2]}: {usable} of {need} usable{problem}; not ready yet, "
                  "still trying", file=sys.stderr, flush=True)
        await asyncio.sleep(poll_s)
    stages.finish(f"{usable} proxy paths held; ask with `gt-user ask` or any OpenAI client at {api_url}/v1")


def cmd_start(args) -> int:
    return asyncio.run(_run_node(args, args.api_listen))


def cmd_serve_api(args) -> int:
    return asyncio.run(_run_node(args, args.listen_api))


# --------------------------------------------------------------------------- talking to a node


def _node_file(home: str) -> dict:
    path = Path(home) / NODE_FILE
    try:
        info = json.loads(path.read_text())
        str(info["api"])
        return info
    except (OSError, ValueError, KeyError, TypeError):
        raise UsageError(f"no running user node at {home} (start one with `gt-user start --home {home}`)",
                         EXIT_NO_NODE) from None


def _api(home: str) -> tuple[str, dict]:
    """The running node's API URL and the headers to send it (its key, when it has one)."""
    info = _node_file(home)
    key = info.get("api_key") or os.environ.get(API_KEY_ENV)
    return str(info["api"]), ({"Authorization": f"Bearer {key}"} if key else {})


def _post(url: str, body: dict, timeout: float, headers: dict | None = None):
    request = urllib.request.Request(url, json.dumps(body).encode(),
                                     {"Content-Type": "application/json", **(headers or {})})
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
    base, headers = _api(args.home)
    url = base + "/gt/ask"
    body = {"prompt": question, "model": args.model, "session": args.session, "system": args.system,
            "stream": args.stream, "raw": args.raw, "max_tokens": args.max_tokens,
            "temperature": args.temperature, "top_p": args.top_p, "seed": args.seed}
    with _post(url, {k: v for k, v in body.items() if v is not None}, args.timeout, headers) as response:
        reading = _StreamReading(args)
        try:
            if not args.stream:
                reading.answer(json.loads(response.read()))
            else:
                for raw in response:
                    reading.line(json.loads(raw))
        except (TimeoutError, OSError) as exc:  # a stalled or dropped stream (socket.timeout is a TimeoutError)
            what = f"nothing for {args.timeout:g} s" if isinstance(exc, TimeoutError) else f"{exc}"
            reading.fail(f"the answer stopped arriving ({what}); ask again (--timeout S waits longer)")
        except (ValueError, KeyError, TypeError, AttributeError):  # not the API's JSON lines
            reading.fail("the user node sent something that is not an answer (a garbled stream); ask again")
        if not reading.done:
            reading.fail("the answer was cut off before its end (the stream closed early); ask again")
    return 0


class _StreamReading:
    """What `gt-user ask` prints of an answer, and one line for every way it can fail."""

    def __init__(self, args) -> None:
        self.args, self.done, self.partial = args, False, False

    def line(self, line: dict) -> None:
        if "error" in line:
            self.fail(str(line["error"]["message"]))
        if "delta" in line and not self.args.json:
            print(str(line["delta"]), end="", flush=True)
            self.partial = True
        if "answer" in line:
            self.answer(line["answer"])

    def answer(self, answer: dict) -> None:
        if self.args.json:
            print(json.dumps(answer))
        else:
            print(str(answer["text"]) if not self.args.stream else "")
            _describe(answer)
        self.done = True

    def fail(self, message: str) -> None:
        if self.partial:  # the error goes on a line of its own
            print(flush=True)
        raise UsageError(message, EXIT_NO_ANSWER)


def _describe(answer: dict) -> None:
    t = answer.get("timings_ms", {})
    stages = ", ".join(f"{k[:-3]} {v:.1f} ms" for k, v in t.items())
    usage = answer.get("usage", {})
    print(f"[served by {answer['served_by'][:16]} over {len(answer['paths'])} paths of "
          f"{len(answer['paths'][0]) if answer['paths'] else 0} relays; {usage.get('prompt_tokens', 0)} prompt + "
          f"{usage.get('completion_tokens', 0)} answer tokens; {stages}]", file=sys.stderr)


def cmd_status(args) -> int:
    base, headers = _api(args.home)
    url = base + "/gt/status"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
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
    add_trust_anchor(p)
    p.add_argument("--directory", metavar="FILE",
                   help="TESTS AND BENCHMARKS ONLY: a static directory JSON file instead of the committee")
    p.add_argument("--api-key", metavar="KEY", default=None,
                   help=f"require `Authorization: Bearer KEY` on the API (as vLLM's --api-key; or ${API_KEY_ENV}); "
                        "needed to listen on a wildcard address. `gt-user ask` on this home sends it by itself")
    p.add_argument("--cors-origin", metavar="ORIGIN", action="append", default=[],
                   help="let web pages of ORIGIN (e.g. http://localhost:3000) use the API from a browser; "
                        "repeat for more. Pages of any other origin are refused (CSRF defence)")
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
