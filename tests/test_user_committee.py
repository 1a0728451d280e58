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
        for _ in range(60):
            await me.refresh_directory()
            if len(me.directory.users()) == 5:
                break
            await asyncio.sleep(0.5)
        registered = {u.node_id_hex: u for u in me.directory.users()}
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
