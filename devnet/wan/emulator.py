"""The link emulator's I/O shell: TUN devices in, TUN devices out, the `links.Wan` core between.

    python -m devnet.wan.emulator --root DEVNET_ROOT

Reads the plan (`wan.json`, made by `devnet.wan.namespaces`), makes one TUN device in each
node's WAN-facing namespace (from a thread that entered that namespace: the machine's own
namespace never sees the device), gives it the node's address, and then moves packets: every
packet read from a node's device goes to the core, and whatever the core delivers is written
to the destination's device at its time. The devices are not persistent: they vanish with this
process, whatever kills it.

The core decides in virtual time; this shell only sleeps until the next due event (select(2),
whose timeout has microseconds where epoll's has milliseconds), so a delivery is never early
and late only by the wake-up and the machine's load: the lateness is measured and reported,
with the shell's CPU time, as the emulator's own floor. It runs at a raised priority (nice
-10): it is the network, and must not wait behind the nodes it carries.

A control socket (`wan.sock` in the root, or in the temporary directory for a deep root:
`control_address`; datagrams of JSON) answers `{"stats": true}`, and
changes every link from now on: `{"loss": 0.05}` sets every pair's loss (the benchmark's loss
levels), `{"perfect": true}` makes every link perfect (the overlay's own cost, measured in the
same run), `{"loss": null}` or `{"perfect": false}` puts the plan's links back.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import hashlib
import json
import os
import resource
import selectors
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

from devnet.wan import namespaces
from devnet.wan.links import Wan
from devnet.wan.namespaces import TUN, WanPlan, enter_netns
from devnet.wan.profiles import PERFECT, crossing_loss

READY_FILE = "wan.ready"
CONTROL_SOCKET = "wan.sock"


def control_address(root: Path, suffix: str = "") -> str:
    """The control socket's path: in the root when it fits a unix socket's 108 bytes, else in
    the temporary directory under a name made from the root (a deep root, as pytest's). A file,
    not an abstract socket: those belong to one network namespace, and the operator's commands
    run in another."""
    path = Path(root).resolve() / f"{CONTROL_SOCKET}{suffix}"
    if len(str(path)) < 100:
        return str(path)
    digest = hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest()[:20]
    return str(Path(tempfile.gettempdir()) / f"gt-{digest}-{CONTROL_SOCKET}{suffix}")
TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
READS_PER_WAKE = 256  # packets read from one device before looking at the others
MAX_PACKET = 65535
PRIORITY = -10  # nice value of the emulator


def open_tun(netns: str, name: str = TUN) -> int:
    """A non-blocking TUN device `name` made inside `netns`; its file descriptor."""
    result: dict = {}

    def make() -> None:
        try:
            enter_netns(netns)
            fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
            fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
            result["fd"] = fd
        except (OSError, namespaces.WanError) as exc:
            result["error"] = exc

    thread = threading.Thread(target=make)  # a thread of its own: setns changes only the caller
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["fd"]


class Emulator:
    def __init__(self, root: Path, plan: WanPlan) -> None:
        self.root = Path(root)
        self.plan = plan
        self.wan = Wan(plan.seed)
        self.fds: dict[str, int] = {}
        self.names: dict[int, str] = {}
        self.selector = selectors.SelectSelector()  # select(2): microsecond timeouts (epoll: milliseconds)
        self.running = True
        self.lateness_max = 0.0
        self.lateness_sum = 0.0
        self.write_drops = 0
        self.loss_override: float | None = None
        self.perfect = False
        self.control = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

    def start(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, PRIORITY)
        except OSError:  # not root after all: an ordinary priority, more lateness (reported)
            pass
        for node in self.plan.nodes:
            fd = open_tun(node.wan_netns)
            self.fds[node.name], self.names[fd] = fd, node.name
            namespaces.configure_tun(node)
            self.wan.add_node(node.name, socket.inet_aton(node.address), node.link_params())
            self.selector.register(fd, selectors.EVENT_READ, node.name)
        path = control_address(self.root)
        Path(path).unlink(missing_ok=True)
        self.control.bind(path)
        self.control.setblocking(False)
        self.selector.register(self.control, selectors.EVENT_READ, None)
        (self.root / READY_FILE).write_text(json.dumps({"pid": os.getpid(), "nodes": len(self.fds)}))

    def run(self) -> None:
        while self.running:
            due = self.wan.next_at()
            timeout = None if due is None else max(0.0, due - time.monotonic())
            for key, _ in self.selector.select(timeout):
                if key.data is None:
                    self._control()
                else:
                    self._read(key.fd, key.data)
            self._deliver(time.monotonic())

    def _read(self, fd: int, name: str) -> None:
        for _ in range(READS_PER_WAKE):
            try:
                packet = os.read(fd, MAX_PACKET)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            self.wan.send(time.monotonic(), name, packet)

    def _deliver(self, now: float) -> None:
        for dst, packet, at in self.wan.advance(now):
            late = time.monotonic() - at
            self.lateness_max = max(self.lateness_max, late)
            self.lateness_sum += late
            try:
                os.write(self.fds[dst], packet)
            except (BlockingIOError, OSError):  # the receiver's queue is full: a loss like any other
                self.write_drops += 1

    def _control(self) -> None:
        try:
            data, sender = self.control.recvfrom(65536)
        except BlockingIOError:
            return
        try:
            request = json.loads(data)
            if "loss" in request or "perfect" in request:
                self.set_links(request.get("loss"), bool(request.get("perfect", False)))
            reply = {"ok": True, **self.stats()}
        except (ValueError, TypeError, KeyError) as exc:
            reply = {"ok": False, "error": str(exc)}
        if sender:
            try:
                self.control.sendto(json.dumps(reply).encode(), sender)
            except OSError:
                pass

    def set_links(self, loss: float | None, perfect: bool = False) -> None:
        """Every link from now on: perfect, or the plan's with every pair losing `loss` (None:
        the plan's own loss)."""
        params = {}
        for node in self.plan.nodes:  # all checked before any link changes
            planned = node.link_params()
            if perfect:
                planned = PERFECT
            elif loss is not None and not planned.perfect:  # the operator's and local links stay perfect
                planned = replace(planned, loss=crossing_loss(float(loss)))
            params[node.name] = planned
        for name, link in params.items():
            self.wan.set_link(name, link)
        self.loss_override, self.perfect = loss, perfect

    def stats(self) -> dict:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        delivered = max(1, self.wan.delivered)
        return {**self.wan.stats(), "write_drops": self.write_drops, "loss_override": self.loss_override,
                "perfect": self.perfect,
                "lateness_ms": {"max": round(self.lateness_max * 1000, 3),
                                "mean": round(self.lateness_sum / delivered * 1000, 4)},
                "cpu_s": round(usage.ru_utime + usage.ru_stime, 3)}

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.control.close()
        Path(control_address(self.root)).unlink(missing_ok=True)
        (self.root / READY_FILE).unlink(missing_ok=True)


def control(root: Path, request: dict, timeout: float = 5.0) -> dict:
    """Send one request to the emulator of the devnet under `root`; its reply."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    reply_path = Path(control_address(root, f".{os.getpid()}-{threading.get_ident()}"))
    reply_path.unlink(missing_ok=True)
    try:
        sock.bind(str(reply_path))
        sock.settimeout(timeout)
        sock.sendto(json.dumps(request).encode(), control_address(root))
        return json.loads(sock.recv(1 << 20))
    finally:
        sock.close()
        reply_path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m devnet.wan.emulator")
    ap.add_argument("--root", required=True, type=Path, help="the devnet's root (its wan.json)")
    args = ap.parse_args(argv)
    plan = WanPlan.load(args.root)
    if plan is None:
        print(f"no WAN plan at {args.root / namespaces.STATE_FILE}", file=sys.stderr)
        return 2
    emulator = Emulator(args.root, plan)

    def stop(*_: object) -> None:
        raise SystemExit(0)  # out of the select at once, through the finally below

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        emulator.start()
        print(f"wan emulator: {len(plan.nodes)} nodes, profile {plan.profile['name']}", flush=True)
        emulator.run()
    finally:
        print(f"wan emulator: stopping; {json.dumps(emulator.stats())}", flush=True)
        emulator.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
