"""Adversaries of the registry and the light client, on real processes (see the package
docstring for the contract): the attacks of THREAT_MODEL.md "Registry and TLS".

A `RegistryCommittee` is four real `gt-verifier` processes on 127.0.0.1 (fast timeouts, a
short registration lease) of which one member, v0, is left out: down at first, and free to be
replaced by a Byzantine server holding v0's TLS identity (`ReplayingVerifier`: it answers
/directory with a reply it recorded earlier, validly signed by the committee, only old).
Nodes join through `CommitteeDirectory`, as `gt-user start --committee` and `gt-model serve
--committee` do. tests/test_registry_attacks.py asserts on the same pieces.

- `registry_hijack`: an echo stand-in model node and five user nodes registered themselves;
  an attacker signs registrations of the model node's address (as a model node and as a user
  node, with its own certificate) and of a transaction for another chain, while a user keeps
  asking. Figures: asks answered, hijacks accepted (the attacker's success), transactions and
  bytes the attacker spent.
- `directory_replay`: v0 replays an old directory; clients refresh again and again. Figures:
  refreshes, how many ended on an older height than before (rolled back) or on the replay,
  how often the liar was asked first.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MEMBERS = 4
LEASE_S = 5


def init_committee(out: Path, n: int, chain_id: str, env: dict | None = None,
                   lease_s: float | None = LEASE_S) -> Path:
    """`gt-verifier init` of n members with fast timeouts; the genesis file."""
    from testkit.committee import free_base_port

    argv = [sys.executable, "-m", "verifier.cli", "--log-level", "WARNING", "init", "--validators", str(n),
            "--out", str(out), "--base-port", str(free_base_port(n)), "--timeouts", "fast", "--chain-id", chain_id]
    if lease_s is not None:
        argv += ["--lease-s", str(lease_s)]
    subprocess.run(argv, cwd=ROOT, check=True, capture_output=True, timeout=120, env=env)
    return out / "v0" / "genesis.json"


def start_verifier(home: Path, log: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "verifier.cli", "--log-level", "WARNING", "start", "--home",
                             str(home)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(log, "wb"), env=env,
                            start_new_session=True)


def stop_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


async def until_directory(genesis, timeout_s: float = 60.0):
    """The committee's checked catalogue, once it answers proven queries."""
    from gentorrent.ledger import queries
    from gentorrent.ledger.light_client import DirectoryRejected, committee_reader

    deadline = time.monotonic() + timeout_s
    reader = committee_reader(genesis, timeout=5.0)
    try:
        while True:
            try:
                return await reader.ask(queries.Catalog())
            except DirectoryRejected:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
    finally:
        await reader.close()


class RegistryCommittee:
    """Members v1..v3 running (3 of 4: more than 2/3), v0 left to the scenario."""

    def __init__(self, root: Path, chain_id: str = "adversary") -> None:
        self.root = Path(root)
        self.chain_id = chain_id
        self.genesis_path: Path | None = None
        self.procs: list[subprocess.Popen] = []

    def start(self) -> Path:
        self.genesis_path = init_committee(self.root / "committee", MEMBERS, self.chain_id)
        self.procs = [start_verifier(self.root / "committee" / f"v{i}", self.root / f"v{i}.log")
                      for i in range(1, MEMBERS)]
        from gentorrent.ledger.genesis import Genesis

        asyncio.run(until_directory(Genesis.load(self.genesis_path)))
        return self.genesis_path

    def home(self, i: int) -> Path:
        return self.root / "committee" / f"v{i}"

    def stop(self) -> None:
        stop_all(self.procs)


def node_directory(genesis_path: Path, home: Path):
    from gentorrent.ledger.committee import CommitteeDirectory

    return CommitteeDirectory.from_args(str(genesis_path), home)


async def user_nodes(genesis_path: Path, base: Path, count: int, **kwargs) -> list:
    """`count` user nodes that registered themselves (concurrently) and read the directory."""
    from user_client.node import UserNode

    nodes = [UserNode(base / f"user{i}", node_directory(genesis_path, base / f"user{i}"), maintain=False, **kwargs)
             for i in range(count)]
    await asyncio.gather(*(n.start(build_paths=False) for n in nodes))
    await asyncio.gather(*(n.refresh_directory() for n in nodes))
    return nodes


# --------------------------------------------------------------------------- a Byzantine member


def replaying_verifier(reply):
    """A Verifier servicer that answers every query with `reply` (a proven answer recorded earlier)."""
    from gentorrent.wire import gentorrent_pb2_grpc as rpc

    class ReplayingVerifier(rpc.VerifierServicer):
        asked = 0

        async def Query(self, request, context):
            ReplayingVerifier.asked += 1
            return reply

    return ReplayingVerifier()


async def serve_as(home: Path, address: str, servicer):
    """A gRPC server with the TLS identity of the member at `home`, serving `servicer`."""
    from gentorrent.crypto import tls
    from gentorrent.crypto.keys import NodeKeys
    from gentorrent.wire import gentorrent_pb2_grpc as rpc

    keys = NodeKeys.load_or_create(home)
    server, _ = tls.new_server(tls.TlsIdentity.load_or_create_self_signed(home, keys.identity), address)
    rpc.add_VerifierServicer_to_server(servicer, server)
    await server.start()
    return server


async def query_reply(genesis, index: int, query, wait_s: float = 30.0):
    """The raw reply (value, height, proof) of member `index` to a proven query, once it is
    proven: a member that has not stored the next block's commit yet says "retry" (code 1),
    and a recorded "retry" would be no answer to replay."""
    from gentorrent.crypto import tls
    from gentorrent.wire import gentorrent_pb2 as pb
    from gentorrent.wire import gentorrent_pb2_grpc as rpc
    from verifier.directory_service import CODE_NOT_YET

    v = genesis.validators[index]
    channel = await tls.connect(v.address, v.tls_cert_pem)
    deadline = time.monotonic() + wait_s
    try:
        while True:
            reply = await rpc.VerifierStub(channel).Query(pb.QueryRequest(path=query.path, data=query.data),
                                                          timeout=10)
            if reply.code != CODE_NOT_YET or time.monotonic() > deadline:
                return reply
            await asyncio.sleep(0.2)
    finally:
        await channel.close()


def hijack_txs(victim_address: str, model: str, chain_id: str) -> list[bytes]:
    """What an attacker signs to take a victim's address: a model and a user registration at
    it under the attacker's own key, and one transaction signed for another chain."""
    from gentorrent.crypto.keys import Identity, OnionKey
    from gentorrent.ledger import txs

    attacker = Identity.generate()
    onion = OnionKey.generate().public_key
    return [txs.register_model(attacker, victim_address, model, 10, 1, onion, chain_id=chain_id),
            txs.register_user(attacker, victim_address, onion, "default", 2, chain_id=chain_id),
            txs.register_user(attacker, "127.0.0.1:1", onion, "default", 3, chain_id="another-net")]


# --------------------------------------------------------------------------- scenarios


async def registry_hijack(root: Path, seed: int = 0, quick: bool = False) -> dict:
    from gentorrent.config import CloveParams, OverlayParams
    from gentorrent.ledger.genesis import Genesis
    from testkit.echo_model import EchoModelNode

    cloves = CloveParams(n=4, k=3, path_length=3, proxies_kept=4)
    params = OverlayParams(first_reply_timeout_s=8.0, reply_idle_timeout_s=15.0, maintenance_interval_s=1.0,
                           build_attempts=12)
    committee = RegistryCommittee(root)
    genesis_path = await asyncio.to_thread(committee.start)
    model = EchoModelNode(root / "model", node_directory(genesis_path, root / "model"), cloves=cloves, params=params)
    users: list = []
    sent = answered = accepted = 0
    spent_bytes = 0
    try:
        await model.start()
        users = await user_nodes(genesis_path, root, 5, cloves=cloves, params=params)
        me = users[0]
        await me.paths.fill()
        rounds = 2 if quick else 5
        chain_id = Genesis.load(genesis_path).chain_id
        for r in range(rounds):
            for tx in hijack_txs(model.address, model.model, chain_id):
                code, _ = await me.directory.submit(tx)
                accepted += code == 0
                spent_bytes += len(tx)
            await asyncio.sleep(0.5)
            for node in users:
                await node.refresh_directory()
            sent += 1
            answer = await me.ask(f"question {r}", model=model.model)
            answered += answer.served_by == model.keys.identity.node_id_hex
    finally:
        for node in users:
            await node.stop()
        await model.stop()
        await asyncio.to_thread(committee.stop)
    attempts = 3 * (2 if quick else 5)
    return {"requests_sent": sent, "answered": answered, "lost": sent - answered, "failed_clearly": 0,
            "committed_txs_lost": None, "forks": None, "recover_s": 0.0 if answered == sent else None,
            "note": f"{accepted} of {attempts} hijack/cross-chain txs accepted",
            "extra": {"attacker_success_rate": accepted / attempts, "attacker_txs": attempts,
                      "attacker_bytes": spent_bytes}}


async def directory_replay(root: Path, seed: int = 0, quick: bool = False) -> dict:
    from gentorrent.ledger.genesis import Genesis
    from gentorrent.ledger.light_client import committee_reader

    committee = RegistryCommittee(root)
    genesis_path = await asyncio.to_thread(committee.start)
    genesis = Genesis.load(genesis_path)
    from gentorrent.crypto.keys import NodeKeys
    from gentorrent.ledger import queries

    asked = queries.UserLookup(NodeKeys.load_or_create(root / "users" / "user0").identity.node_id)
    old = await query_reply(genesis, 1, asked)  # the newcomer is not registered yet: a proof of its absence
    newcomer = (await user_nodes(genesis_path, root / "users", 1))[0]  # registered after the recording
    liar = replaying_verifier(old)
    fake = await serve_as(committee.home(0), genesis.validators[0].address, liar)
    clients, refreshes = (3, 4) if quick else (8, 8)
    rolled_back = replayed = 0
    try:
        for c in range(clients):
            reader = committee_reader(genesis, timeout=5.0, rng=random.Random(seed * 1000 + c))
            last = 0
            for _ in range(refreshes):
                d = await reader.ask(asked, confirm=True)
                rolled_back += d.height < last
                replayed += d.height == old.height or d.result is None
                last = d.height
            await reader.close()
    finally:
        await fake.stop(None)
        await newcomer.stop()
        await asyncio.to_thread(committee.stop)
    total = clients * refreshes
    return {"requests_sent": total, "answered": total - rolled_back - replayed, "lost": rolled_back + replayed,
            "failed_clearly": 0, "committed_txs_lost": None, "forks": None, "recover_s": 0.0,
            "note": f"v0 replays height {old.height}; {liar.asked} replies served by the liar, none adopted"
                    if not rolled_back + replayed else f"{rolled_back + replayed} refreshes ended on the replay",
            "extra": {"attacker_success_rate": (rolled_back + replayed) / total, "liar_asked": liar.asked,
                      "refreshes": total}}
