"""Security checks end to end on 127.0.0.1 (real user nodes relaying over pinned TLS, the echo
model node as a real process): an unregistered node can neither open a path through a relay
nor be made a hop of one; a server presenting a certificate its registered key did not sign
is refused before any byte of RPC reaches it; no private key material appears in the logs
of the processes we start. (Relays not reading plaintext and challenges looking like asks
are in tests/test_overlay_network.py.)"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from gentorrent.config import CloveParams, OverlayParams
from gentorrent.crypto import onion
from devnet.supervisor import Supervisor, python_module, wait_until
from testkit.keyleaks import home_secrets, scan_for_secrets
from testkit.echo_model import ECHO_PREFIX
from testkit.localnet import start_user_nodes
from user_client.node import UserNode
from gentorrent.ledger.directory import StaticDirectory

pytestmark = [pytest.mark.network, pytest.mark.timeout(180)]
ROOT = Path(__file__).resolve().parents[1]
CLOVES = CloveParams(n=2, k=1, path_length=2, proxies_kept=2)
FAST = OverlayParams(first_reply_timeout_s=10.0, reply_idle_timeout_s=15.0, forward_timeout_s=5.0,
                     establish_timeout_s=5.0, maintenance_interval_s=1.0, build_attempts=6)


@pytest.fixture
async def overlay(tmp_path):
    directory = tmp_path / "directory.json"
    nodes = await start_user_nodes(5, directory, tmp_path, cloves=CLOVES, params=FAST, maintain=False)
    # a node that never registers: its own directory file, so the committee's stays clean
    outsider = UserNode(tmp_path / "outsider", StaticDirectory(tmp_path / "outsider.json"), cloves=CLOVES,
                        params=FAST, maintain=False)
    await outsider.start(build_paths=False)
    yield nodes, outsider, directory
    for n in nodes + [outsider]:
        await n.stop()


async def test_unregistered_node_cannot_open_a_path_nor_be_a_hop(overlay):
    nodes, outsider, _ = overlay
    relay, other = nodes[1], nodes[2]
    # 1. the outsider asks a registered relay to carry its path: its leaf is signed by a key
    #    the registry does not hold, so the relay's Link handler refuses it before a single frame
    outsider.relay.hub.peers = lambda node_id: relay.index.get(node_id)  # it knows whom to dial
    hops = [onion.HopSpec(relay.keys.identity.node_id, relay.keys.onion.public_key)]
    blob, _ = onion.build_onion(hops, issued_s=int(time.time()))
    link = outsider.relay.hub.link_to(relay.node_id_hex)
    reply = await link.establish(blob, 5)
    assert (reply.ok, reply.reason) == (False, "next_hop_unreachable") and not link.alive
    # 2. a registered user builds a path whose second hop is the unregistered node
    me = nodes[0]
    blob, _ = onion.build_onion([onion.HopSpec(relay.keys.identity.node_id, relay.keys.onion.public_key),
                                 onion.HopSpec(outsider.keys.identity.node_id, outsider.keys.onion.public_key)],
                                issued_s=int(time.time()))
    reply = await me.relay.hub.link_to(relay.node_id_hex).establish(blob, 5)
    assert (reply.ok, reply.reason) == (False, "unknown_peer")
    assert outsider.relay.status()["table"] == other.relay.status()["table"]  # it saw nothing either
    assert relay.relay.drops.as_dict() == {"unauthenticated": 1, "unknown_peer": 1}
    assert relay.relay.hub.accepted == 1  # the registered user's link only


async def test_a_server_with_another_certificate_than_the_registered_one_is_refused(overlay, tmp_path):
    nodes, _, directory = overlay
    me, victim = nodes[0], nodes[3]
    address, registered_cert = victim.address, victim.tls.cert_pem
    await victim.stop()
    # an impostor takes over the registered address with its own key and certificate
    impostor = UserNode(tmp_path / "impostor", StaticDirectory(tmp_path / "impostor.json"), listen=address,
                        cloves=CLOVES, params=FAST, maintain=False)
    await impostor.start(build_paths=False)
    try:
        assert impostor.address == address and impostor.tls.cert_pem != registered_cert
        # dialled by node id, as every peer does: only a certificate the victim's key signed is accepted
        blob, _ = onion.build_onion([onion.HopSpec(victim.keys.identity.node_id, victim.keys.onion.public_key)],
                                    issued_s=int(time.time()))
        link = me.relay.hub.link_to(victim.node_id_hex)
        reply = await link.establish(blob, 5)
        assert (reply.ok, reply.reason) == (False, "next_hop_unreachable") and not link.alive
        # relays dialling it refuse it the same way: a path through it cannot be established
        relay = nodes[1]
        blob, _ = onion.build_onion([onion.HopSpec(relay.keys.identity.node_id, relay.keys.onion.public_key),
                                     onion.HopSpec(victim.keys.identity.node_id, victim.keys.onion.public_key)],
                                    issued_s=int(time.time()))
        reply = await me.relay.hub.link_to(relay.node_id_hex).establish(blob, 10)
        assert (reply.ok, reply.reason) == (False, "next_hop_unreachable")
        assert impostor.relay.status()["table"] == nodes[2].relay.status()["table"]  # never reached it
        assert impostor.relay.hub.accepted == 0
    finally:
        await impostor.stop()


async def test_no_private_key_material_in_the_logs_of_real_processes(tmp_path):
    """A real echo model node process (DEBUG logging) serves asks from user nodes; its log
    must hold neither a PEM private key nor any of its raw private keys. The scanner itself
    is checked on the key files (it must find them)."""
    directory = tmp_path / "directory.json"
    sup = Supervisor(tmp_path / "procs")
    home = tmp_path / "model"
    sup.spawn("echo-model", python_module("testkit.echo_model", "--home", str(home),
                                          "--directory", str(directory)),
              env={"GRPC_VERBOSITY": "DEBUG", "PYTHONUNBUFFERED": "1"}, cwd=ROOT)
    nodes = []
    try:
        log = sup.logs / "echo-model.log"
        await asyncio.to_thread(wait_until, lambda: log.exists() and "address" in log.read_text(), 60,
                                "the echo model node to start")
        # the process decodes with the default clove parameters, so the askers use them too
        nodes = await start_user_nodes(8, directory, tmp_path, params=FAST, maintain=False)
        await nodes[0].paths.fill()
        for i in range(3):
            answer = await nodes[0].ask(f"secret question {i}")
            assert answer.text == ECHO_PREFIX + f"secret question {i}"
    finally:
        for n in nodes:
            await n.stop()
        sup.stop_all()
    secrets = home_secrets(home)
    assert len(scan_for_secrets([home / "identity.key.pem", home / "tls.key.pem"], secrets)) >= 2
    assert os.path.getsize(log) > 0
    assert scan_for_secrets([log], secrets) == [], log.read_text()[-2000:]
