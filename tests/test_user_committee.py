"""User nodes registered with a real committee (one `gt-verifier` process) build proxy paths
from its light-client-checked directory."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from gentorrent.config import CloveParams, OverlayParams
from gentorrent.ledger.committee import CommitteeDirectory
from testkit.committee import free_base_port
from user_client.node import UserNode

pytestmark = [pytest.mark.network, pytest.mark.timeout(240)]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def committee(tmp_path):
    out = tmp_path / "committee"
    subprocess.run([sys.executable, "-m", "verifier.cli", "--log-level", "WARNING", "init", "--validators", "1",
                    "--out", str(out), "--base-port", str(free_base_port(1)), "--timeouts", "fast"],
                   cwd=ROOT, check=True, capture_output=True, timeout=60)
    home = out / "v0"
    proc = subprocess.Popen([sys.executable, "-m", "verifier.cli", "--log-level", "WARNING", "start",
                             "--home", str(home)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=open(tmp_path / "verifier.log", "wb"))
    try:
        line = proc.stdout.readline()
        assert b"listening" in line, (tmp_path / "verifier.log").read_text()[-2000:]
        yield home / "genesis.json"
    finally:
        proc.terminate()
        proc.wait(30)


async def _listed(me: UserNode, count: int) -> dict:
    """The users `me`'s directory lists (node id -> record), once it lists `count` (at most 30 s)."""
    for _ in range(60):
        await me.refresh_directory()
        if len(me.directory.users()) == count:
            break
        await asyncio.sleep(0.5)
    return {u.node_id_hex: u for u in me.directory.users()}


async def test_user_nodes_register_with_the_committee_and_build_paths(committee, tmp_path):
    cloves = CloveParams(proxies_kept=2)
    params = OverlayParams(maintenance_interval_s=1.0)
    nodes = []
    for i in range(5):
        home = tmp_path / f"user{i}"
        directory = CommitteeDirectory.from_args(str(committee), home)
        node = UserNode(home, directory, cloves=cloves, params=params, maintain=False)
        await node.start(build_paths=False)
        nodes.append(node)
    try:
        me = nodes[0]
        registered = await _listed(me, 5)
        assert set(registered) == {n.node_id_hex for n in nodes}
        assert registered[nodes[3].node_id_hex].onion_key == nodes[3].keys.onion.public_key
        for node in nodes:
            await node.refresh_directory()
        assert await me.paths.fill() == 2
        for path in me.paths.pool.paths.values():
            assert me.address not in path.relays and len(set(path.relays)) == 3
        # a restarted node on a new port updates its entry instead of registering twice
        await nodes[4].stop()
        moved = UserNode(tmp_path / "user4", CommitteeDirectory.from_args(str(committee), tmp_path / "user4"),
                         cloves=cloves, params=params, maintain=False)
        await moved.start(build_paths=False)
        nodes[4] = moved
        for _ in range(60):
            await me.refresh_directory()
            entry = {u.node_id_hex: u for u in me.directory.users()}[moved.node_id_hex]
            if entry.address == moved.address:
                break
            await asyncio.sleep(0.5)
        assert entry.address == moved.address and len(me.directory.users()) == 5
    finally:
        for node in nodes:
            await node.stop()


async def test_attack_a_user_nobody_can_dial_is_registered_client_only_and_never_a_hop(committee, tmp_path):
    """The attack on every path: a user node behind NAT (here: one advertising a port nothing
    listens on) registered its address as a relay, relays chose it, and every path through it
    failed at establishment. A member now dials each user back before it registers (verifier/
    dial_back.py): that one registers client-only (no address), builds its own paths through
    the others, and is never a hop of theirs; the others registered their addresses."""
    import socket

    cloves = CloveParams(proxies_kept=2)
    params = OverlayParams(maintenance_interval_s=1.0)
    with socket.socket() as s:  # a port that was free a moment ago: nothing answers there
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    nodes = []
    for i in range(5):
        home = tmp_path / f"user{i}"
        advertise = f"127.0.0.1:{dead_port}" if i == 4 else None
        node = UserNode(home, CommitteeDirectory.from_args(str(committee), home), cloves=cloves, params=params,
                        maintain=False, advertise=advertise)
        await node.start(build_paths=False)
        nodes.append(node)
    hidden, me = nodes[4], nodes[0]
    try:
        assert not hidden.relaying and hidden.status()["reachability"].startswith("client-only"), hidden.status()
        assert all(n.relaying for n in nodes[:4]), [n.status()["reachability"] for n in nodes]
        listed = await _listed(me, 5)
        assert listed[hidden.node_id_hex].address == "" and not listed[hidden.node_id_hex].relays
        assert {listed[n.node_id_hex].address for n in nodes[:4]} == {n.address for n in nodes[:4]}
        for node in nodes:
            await node.refresh_directory()
        assert await me.paths.fill() == 2 and me.paths.build_failures == 0, me.paths.status()
        assert await hidden.paths.fill() == 2, hidden.paths.status()  # it asks through the others
        for node in (me, hidden):
            for path in node.paths.pool.paths.values():
                assert hidden.address not in path.relays and "" not in path.relays
    finally:
        for node in nodes:
            await node.stop()
