"""The devnet on the emulated WAN (`gt-devnet up --wan short --echo`), as an operator types it.

Every node runs in its own network namespace behind an emulated access line (4-20 ms one way,
0.5 % loss, 20 Mbit/s: the `short` profile, so that the run fits in make test); one user node
of five sits behind NAT. Model nodes are the echo stand-in (the real clove intake, keys and
signed receipts): the network is what is tested, not the engine. Users ask through relays in
other namespaces and get answers whose receipts their user node checked against the committee's
key of the signer. `down` removes every namespace, also when `up` was killed (SIGKILL) or
interrupted (SIGINT, Ctrl-C).

The node behind NAT: a member dials it back before it registers (verifier/dial_back.py), cannot
reach it, and it registers client-only (no address): it asks like any user, since its links are
its own outbound connections, and nobody chooses it as a hop. What does not work yet, said out
loud: a model node behind NAT cannot serve at all; relays that carry NAT'd model nodes come next.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devnet import network as devnet
from devnet.supervisor import STATE_FILE as PROCESSES_FILE
from devnet.supervisor import running
from devnet.wan import namespaces

ROOT = Path(__file__).resolve().parents[1]
UP = ["up", "--wan", "short", "--echo", "--users", "5", "--honest", "2", "--dishonest", "0", "--no-dashboard"]

pytestmark = [pytest.mark.network,
              pytest.mark.skipif(namespaces.can_build_reason() != "", reason=namespaces.can_build_reason())]


def _cli(root: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "devnet.network", "--root", str(root), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def _netns_inode(path: str) -> int:
    return os.stat(path).st_ino


@pytest.mark.timeout(600)
def test_users_ask_through_relays_across_namespaces_and_get_signed_answers(tmp_path):
    root = tmp_path / "devnet"
    prefix = namespaces.prefix_for(root)
    try:
        up = _cli(root, *UP)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        assert "behind NAT: u04" in up.stdout
        state = devnet.DevnetState.load(root)
        plan = namespaces.WanPlan.load(root)
        assert state.wan["profile"] == "short" and state.wan["prefix"] == prefix

        # every node's process runs in its own planned namespace, on its own /16
        processes = json.loads((root / PROCESSES_FILE).read_text())
        for node in state.nodes:
            process = processes[{"verifier": "verifier-", "model": "model-", "user": "user-"}[node.role] + node.name]
            placed = plan.node(node.name)
            assert _netns_inode(f"/proc/{process['pid']}/ns/net") == \
                _netns_inode(str(namespaces.NETNS_DIR / placed.netns)), node.name
            assert node.address.rpartition(":")[0] == placed.address  # what it registered
        assert len({n.address.split(".")[1] for n in state.nodes}) == len(state.nodes)
        nat_user = state.of_role("user")[4]
        assert nat_user.extra.get("nat") and plan.node("u04").nat

        # a public user asks: served and signed by a registered model node, over k or more paths of
        # l relays, every relay another user node in another namespace
        users = {u.address: u.name for u in state.of_role("user")}
        models = {m.node_id for m in state.of_role("model")}
        for who in ("0", "4"):  # ... and the user behind NAT asks too: its links are its own outbound ones
            out = _cli(root, "ask", f"Hello over the WAN from user {who}", "--user", who, "--json",
                       "--max-tokens", "16")
            assert out.returncode == 0, out.stderr[-2000:]
            answer = json.loads(out.stdout)
            assert answer["text"].endswith(f"Hello over the WAN from user {who}")  # the echo of the prompt
            assert answer["served_by"] in models and answer["served_by_registered_height"] > 0
            paths = answer["paths"]
            assert len(paths) >= 3 and all(len(p) == 3 for p in paths)
            asker = state.of_role("user")[int(who)]
            assert all(hop in users and hop not in (asker.address, nat_user.address) for p in paths for hop in p), \
                (paths, users)
            assert answer["timings_ms"]["first_chunk_ms"] > 0

        # status, from the operator's namespace: every node up, the emulator carried the traffic
        out = _cli(root, "status", "--json")
        assert out.returncode == 0, out.stderr[-2000:]
        report = json.loads(out.stdout)
        assert all(row["running"] for row in report["nodes"])
        # the user behind NAT: no member could dial it back, so it registered client-only
        relaying = {row["name"]: row.get("relaying") for row in report["nodes"] if row["role"] == "user"}
        assert relaying.pop("u04") is False and all(relaying.values()), report["nodes"]
        emulator = report["wan"]["emulator"]
        assert emulator["delivered"] > 1000 and emulator["ok"]
        assert sum(n["lost"] for n in emulator["nodes"].values()) > 0  # the profile's loss was applied
    finally:
        down = _cli(root, "down")
    assert down.returncode == 0, down.stderr
    assert namespaces.existing(prefix) == []
    assert running(root) == []


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["killed", "ctrl-c"])
def test_nothing_is_left_after_up_is_killed_or_interrupted(tmp_path, sig):
    """SIGKILL: `up` cannot clean up; its namespaces and nodes stay until `gt-devnet down` finds
    them (by the state files, and the namespaces by their name prefix). SIGINT: `up` stops
    what it started and removes its namespaces itself."""
    root = tmp_path / "devnet"
    prefix = namespaces.prefix_for(root)
    proc = subprocess.Popen([sys.executable, "-m", "devnet.network", "--root", str(root), *UP], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "verifiers started" in line:  # namespaces, emulator, committee: all running now
                proc.send_signal(signal.SIGSTOP)  # held here: the rest of `up` takes seconds only
                break
        assert namespaces.existing(prefix), "".join(seen)
        deadline = time.monotonic() + 30  # (a process just spawned counts once it has exec'd: a loaded machine)
        while len(running(root)) < 5 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(running(root)) >= 5  # the emulator and four verifiers
        proc.send_signal(sig)
        proc.send_signal(signal.SIGCONT)  # (a stopped process takes SIGINT once it runs again)
        proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    if sig == signal.SIGKILL:
        assert namespaces.existing(prefix) and running(root)  # what a crash leaves behind...
        down = _cli(root, "down")  # ...until down removes it
        assert down.returncode == 0, down.stderr
        assert "stopped" in down.stdout
    else:
        assert proc.returncode != 0
    assert namespaces.existing(prefix) == []
    assert running(root) == []

