"""The WAN in a box on real namespaces: the TUN shell carries TCP with the planned delay, NAT
lets a node out and nobody in, nothing reaches an address outside the box, nothing touches the
machine's own namespace, and everything is removed, also after the emulator is killed."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devnet.wan import namespaces
from devnet.wan.emulator import READY_FILE, control
from devnet.wan.profiles import WanProfile

pytestmark = [pytest.mark.network,
              pytest.mark.skipif(namespaces.can_build_reason() != "", reason=namespaces.can_build_reason())]

FIXED = WanProfile("fixed", (0.020, 0.020), 0.0, 0.0, 0.0, nat_users=0.34)  # 20 ms one way, exactly

ECHO_SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 5000)); s.listen(); print("listening", flush=True)
while True:
    c, peer = s.accept(); c.sendall(peer[0].encode()); c.close()
"""

CLIENT = """
import socket, sys, time
t = time.monotonic()
try:
    s = socket.create_connection((sys.argv[1], 5000), timeout=float(sys.argv[2]))
    print(s.recv(100).decode(), round(time.monotonic() - t, 4))
except OSError as exc:
    print("failed", type(exc).__name__)
"""


def _in(node: namespaces.PlacedNode, code: str, *args: str, timeout: float = 30) -> str:
    out = subprocess.run(namespaces.ns_argv(node.netns, [sys.executable, "-c", code, *args]),
                         capture_output=True, text=True, timeout=timeout)
    return out.stdout.strip() + out.stderr.strip()[-300:]


def _root_links() -> list[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return sorted(line.split(":")[1].strip() for line in out.splitlines())


@pytest.fixture
def wan(tmp_path: Path):
    before = _root_links()
    prefix = namespaces.prefix_for(tmp_path)
    plan = namespaces.make_plan(prefix, [("a", "user"), ("b", "user"), ("c", "user")], FIXED, seed=3)
    plan.save(tmp_path)
    emulator = None
    try:
        namespaces.build(plan)
        emulator = subprocess.Popen([sys.executable, "-m", "devnet.wan.emulator", "--root", str(tmp_path)],
                                    start_new_session=True)
        deadline = time.monotonic() + 30
        while not (tmp_path / READY_FILE).exists():
            assert emulator.poll() is None and time.monotonic() < deadline, "the emulator did not start"
            time.sleep(0.05)
        yield plan, emulator
    finally:
        if emulator is not None and emulator.poll() is None:
            emulator.kill()
            emulator.wait(10)
        namespaces.tear_down(tmp_path)
        assert namespaces.existing(prefix) == []
        assert _root_links() == before  # nothing was ever made in the machine's own namespace


def test_tcp_crosses_with_the_planned_delay_and_nat_lets_out_but_not_in(wan, tmp_path):
    plan, _ = wan
    a, b, c = plan.node("a"), plan.node("b"), plan.node("c")
    assert c.nat and not a.nat and not b.nat
    server = subprocess.Popen(namespaces.ns_argv(a.netns, [sys.executable, "-c", ECHO_SERVER]),
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    nat_server = subprocess.Popen(namespaces.ns_argv(c.netns, [sys.executable, "-c", ECHO_SERVER]),
                                  stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert server.stdout.readline().strip() == "listening"
        assert nat_server.stdout.readline().strip() == "listening"
        seen_by_a, seconds = _in(b, CLIENT, a.address, "5").split()
        assert seen_by_a == b.address
        # connect (one round trip) and the server's bytes (one more): 20 ms each way, never early
        assert float(seconds) >= 2 * 2 * 0.020
        # behind NAT: out, as its router's public address; in: dropped without an answer
        seen_by_a, _ = _in(c, CLIENT, a.address, "5").split()
        assert seen_by_a == c.address
        assert _in(a, CLIENT, c.address, "1.5") == "failed TimeoutError"
        # nothing leaves the box: an address no node has is dropped by the emulator
        assert _in(a, CLIENT, "10.200.0.1", "0.5") == "failed TimeoutError"
        stats = control(tmp_path, {"stats": True})
        assert stats["dropped"].get("no_route", 0) >= 1
        assert stats["nodes"]["b"]["up"] >= 3 and stats["lateness_ms"]["max"] >= 0
    finally:
        for p in (server, nat_server):
            p.kill()
            p.wait(10)


def test_loss_set_at_run_time_drops_and_the_profile_comes_back(wan, tmp_path):
    plan, _ = wan
    a, b = plan.node("a"), plan.node("b")
    server = subprocess.Popen(namespaces.ns_argv(a.netns, [sys.executable, "-c", ECHO_SERVER]),
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert server.stdout.readline().strip() == "listening"
        _loss_and_perfect_links(tmp_path, a, b)
    finally:
        server.kill()
        server.wait(10)


def _loss_and_perfect_links(tmp_path, a, b) -> None:
    assert control(tmp_path, {"loss": 0.95})["loss_override"] == 0.95
    assert _in(b, CLIENT, a.address, "1.0") == "failed TimeoutError"  # (SYN retries 1 s apart: none gets there)
    assert control(tmp_path, {"loss": 0.95, "perfect": True})["perfect"] is True  # perfect wins
    seen_by_a, seconds = _in(b, CLIENT, a.address, "1.0").split()
    assert seen_by_a == b.address
    assert control(tmp_path, {"loss": None})["loss_override"] is None
    for bad in ({"loss": "x"}, {"loss": 1.5}):  # a bad request: an error, no change
        reply = control(tmp_path, bad)
        assert reply["ok"] is False and control(tmp_path, {"stats": True})["perfect"] is False
    stats = control(tmp_path, {"stats": True})
    assert stats["nodes"]["b"]["up_bytes"] >= 40 * stats["nodes"]["b"]["up"] > 0  # IPv4 + TCP headers at least


def test_a_killed_emulator_takes_its_devices_and_teardown_removes_the_rest(wan, tmp_path):
    plan, emulator = wan
    a = plan.node("a")
    stray = subprocess.Popen(namespaces.ns_argv(a.netns, ["sleep", "600"]), start_new_session=True)
    assert subprocess.run(["ip", "-n", a.netns, "link", "show", namespaces.TUN], capture_output=True).returncode == 0
    emulator.send_signal(signal.SIGKILL)
    emulator.wait(10)
    deadline = time.monotonic() + 10
    while subprocess.run(["ip", "-n", a.netns, "link", "show", namespaces.TUN], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "the TUN device outlived its emulator"
        time.sleep(0.1)
    assert namespaces.pids_in(a.netns) == [stray.pid]
    removed = namespaces.tear_down(tmp_path)
    assert sorted(removed) == sorted(plan.namespaces())
    assert stray.wait(10) == -signal.SIGTERM  # a process left inside is stopped, not orphaned
    assert not (tmp_path / namespaces.STATE_FILE).exists()
