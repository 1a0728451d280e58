"""What every command-line tool shares (gt-user, gt-model, gt-verifier, gt-devnet).

The rules (ARCHITECTURE.md §5): a bad argument or file is one line on stderr saying what is
wrong and what to do, exit status 2, and nothing changed; no traceback reaches a user; every
option has help text; `--version` everywhere; long start-up says which stage it is in, how
long it has taken and about how long it usually takes.

    parser = Parser(prog="gt-x", description=...)       # one-line errors, --version
    p.add_argument("--listen", type=host_port, ...)     # validated types below
    return run(main_body, prog="gt-x")                   # exceptions -> one line, exit code
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Callable, TextIO

import gentorrent

# Exit statuses of every command (README "Exit statuses" is this table):
EXIT_OK = 0  # done; a node stopped by SIGINT/SIGTERM, at any stage, also exits 0
EXIT_FAILED = 1  # it ran and failed: no answer (try again later), a halted verifier, a node that broke
EXIT_USAGE = 2  # a bad argument or file, or a home another process holds; nothing was changed
EXIT_NO_NODE = 3  # no node runs at --home (or it does not answer), or the node could not join the network
EXIT_INTERRUPTED = 130  # a command (ask, status, init) interrupted by Ctrl-C


class UsageError(Exception):
    """A bad argument or file found after parsing: one line, exit 2, nothing changed."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (what is wrong, where to look) and --version."""

    def __init__(self, *args, version: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if version:
            self.add_argument("--version", action="version", version=f"%(prog)s {gentorrent.__version__}",
                              help="print the version and exit")

    def add_subparsers(self, **kwargs):
        kwargs.setdefault("parser_class", _SubParser)
        return super().add_subparsers(**kwargs)

    def error(self, message: str):  # noqa: D401 - argparse's hook
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


class _SubParser(Parser):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, version=False, **kwargs)


def run(body: Callable[[], int], prog: str, stderr: TextIO | None = None) -> int:
    """Run a command's body; every failure becomes one line and an exit status."""
    err = stderr or sys.stderr
    try:
        return body()
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=err)
        return exc.code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `gt-x ... | head`: the reader left; say nothing more
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


# --------------------------------------------------------------------------- argument types


def host_port(text: str) -> str:
    """HOST:PORT (port 0: any free port); the host may be a name, an IPv4 or a [IPv6] address."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535 or " " in host:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT with a port from 0 to 65535 "
                                         "(e.g. 127.0.0.1:8000)")
    return text


def port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number from 1 to 65535")
    return int(text)


def int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{value} is not from {low} to {high}" if high is not None
                                             else f"{value} is below {low}")
        return value

    parse.__name__ = "integer"
    return parse


def float_in(low: float, high: float, low_open: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (low < value if low_open else low <= value) or not value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not in {'(' if low_open else '['}{low:g}, {high:g}]")
        return value

    parse.__name__ = "number"
    return parse


def readable_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{text}: cannot read it ({exc.strerror})") from None
    return path


def add_trust_anchor(p: argparse.ArgumentParser) -> None:
    """`--trust-anchor HEIGHT:HASH`: the option every node that reads the committee takes."""
    from gentorrent.config import REGISTRY
    from gentorrent.ledger.light_client import TrustAnchor

    def anchor(text: str) -> TrustAnchor:
        try:
            return TrustAnchor.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    anchor.__name__ = "trust anchor"
    p.add_argument("--trust-anchor", type=anchor, default=None, metavar="HEIGHT:HASH",
                   help="with --committee: trust this recent block first (the trust_anchor `gt-verifier status` "
                        "prints on a member you trust). Needed once the genesis file, or what this node verified "
                        f"last, is older than the trusting period ({REGISTRY.trusting_period_s / 86400:.0f} days)")


def check_can_listen(address: str, what: str) -> None:
    """Fail now (one line) when HOST:PORT cannot be listened on, before anything starts or
    registers: a bind without SO_REUSEPORT, closed at once (port 0 always works). With
    SO_REUSEADDR, as grpc and aiohttp bind: a node restarted on its port while old connections
    sit in TIME_WAIT binds it, and so must the check."""
    import socket

    host, _, port_text = address.rpartition(":")
    if int(port_text) == 0:
        return
    try:
        infos = socket.getaddrinfo(host.strip("[]"), int(port_text), type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UsageError(f"{what} {address}: unknown host ({exc.strerror})") from None
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(sockaddr)
        except OSError as exc:
            raise UsageError(f"cannot listen on {what} {address}: {exc.strerror}; choose another address "
                             "(port 0: any free)") from None


def check_directory_source(committee: str | Path | None, directory: str | Path | None,
                           directory_may_be_missing: bool = False, trust_anchor: object = None) -> None:
    """The genesis (or a test's static directory file) is readable and well-formed, before
    anything starts: a wrong --committee is a one-line error in a second, not after an engine
    has loaded for a minute. A --trust-anchor is a block of the committee's chain: it needs one."""
    if trust_anchor is not None and not committee:
        raise UsageError("--trust-anchor goes with --committee GENESIS (it is a block of that chain)")
    if committee:
        from gentorrent.ledger.genesis import Genesis, GenesisError

        try:
            Genesis.load(Path(committee))
        except (GenesisError, OSError, ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"--committee {committee}: not a usable genesis file ({exc}); give the "
                             "committee's genesis.json") from None
        return
    if not directory:
        return
    path = Path(directory)
    if not path.is_file():
        if directory_may_be_missing:
            return
        raise UsageError(f"no directory: {path} does not exist; give --committee GENESIS (or --directory FILE)")
    from gentorrent.ledger.directory import StaticDirectory

    try:
        StaticDirectory(path)
    except Exception as exc:  # DirectoryError, or records that do not decode
        raise UsageError(f"--directory {path}: not a directory file ({type(exc).__name__}: {exc})") from None


def take_home(home: Path):
    """This process's lock on a node home (gentorrent.home_lock), or exit 2 naming the holder."""
    from gentorrent.home_lock import HomeInUse, lock_home

    try:
        return lock_home(home)
    except HomeInUse as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot use {home} as the node's home: {exc.strerror or exc}") from None


def ports_fit(base: int, count: int, what: str = "--base-port") -> None:
    """`count` consecutive ports from `base` must all be valid ports."""
    if base + count - 1 > 65535:
        raise UsageError(f"{what} {base} with {count} nodes needs ports up to {base + count - 1}, above 65535; "
                         f"choose a base port of at most {65536 - count}")


def committee_size_note(n: int) -> str | None:
    """A warning for committees that tolerate no faulty member (BFT needs N >= 3f + 1)."""
    if n < 4:
        return (f"a committee of {n} tolerates no faulty or offline member (it takes 4 to tolerate one, "
                "3f + 1 for f); fine for a test, not for a network")
    return None


def every_option_has_help(parser: argparse.ArgumentParser) -> list[str]:
    """Options and sub-commands without help text, for tests (`prog sub --opt`)."""
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                if not helps.get(name):
                    missing.append(f"{parser.prog} {name}")
                missing += every_option_has_help(sub)
        elif not isinstance(action, argparse._HelpAction) and (not action.help or action.help == argparse.SUPPRESS):
            missing.append(f"{parser.prog} {'/'.join(action.option_strings) or action.dest}")
    return missing


# --------------------------------------------------------------------------- stopping


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM (call inside the running loop, first thing): every
    start-up stage races it, so Ctrl-C at any stage stops the node within seconds, cleanly."""
    import signal

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def until_stopped(work, stop: asyncio.Event, grace_s: float = 3.0):
    """Run `work` (a coroutine) unless `stop` is set first; returns (True, its result) or
    (False, None) when stopped, after cancelling it (waiting at most `grace_s` for it to end)."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if task.done():
        return True, task.result()
    task.cancel()
    await asyncio.wait({task}, timeout=grace_s)
    return False, None


# --------------------------------------------------------------------------- progress


class Stages:
    """Start-up in numbered stages on stderr: `[2/4] loading the vLLM engine ...`, a note every
    `every_s` while a stage runs (elapsed, and the usual duration when known), and its time
    when done. stdout stays free for what scripts read (a node's JSON line)."""

    def __init__(self, prog: str, names: list[str], out: TextIO | None = None, every_s: float = 15.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.prog, self.names, self.out, self.every_s, self.clock = prog, names, out or sys.stderr, every_s, clock
        self.t0 = clock()
        self.current: tuple[int, str, float, float | None] | None = None

    def _say(self, text: str) -> None:
        print(f"{self.prog}: {text}", file=self.out, flush=True)

    def begin(self, name: str, usual_s: float | None = None, detail: str = "") -> None:
        self.end()
        index = self.names.index(name) + 1 if name in self.names else len(self.names)
        usual = f", usually ~{usual_s:.0f} s" if usual_s else ""
        self._say(f"[{index}/{len(self.names)}] {name}{': ' + detail if detail else ''}{usual} ...")
        self.current = (index, name, self.clock(), usual_s)

    def note(self) -> None:
        """The running stage's elapsed time (call it every few seconds; it speaks every `every_s`)."""
        if self.current is None:
            return
        index, name, started, usual = self.current
        elapsed = self.clock() - started
        of = f" of ~{usual:.0f} s" if usual else ""
        self._say(f"[{index}/{len(self.names)}] {name}: {elapsed:.0f} s{of}")

    def end(self) -> None:
        if self.current is not None:
            index, name, started, _ = self.current
            self._say(f"[{index}/{len(self.names)}] {name}: done in {self.clock() - started:.1f} s")
            self.current = None

    def finish(self, text: str) -> None:
        self.end()
        self._say(f"{text} (ready after {self.clock() - self.t0:.1f} s)")

    async def ticking(self) -> None:
        """A task that notes the running stage every `every_s` (cancel it when done)."""
        while True:
            await asyncio.sleep(self.every_s)
            self.note()
