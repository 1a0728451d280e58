"""A real 4-process verifier committee on 127.0.0.1 with a FaultProxy on every directed link.

Why per-node genesis files: a verifier dials its peers at the addresses in its own copy of
`genesis.json` (verifier.consensus.node), and nothing else (no hash, no app state) depends on
those addresses. So node i's copy names, for every peer j, the proxy of link i -> j; the
committee's keys, powers and chain id stay identical. Clients (these helpers) talk to every
node directly at its real listen address, so faults hit only validator-to-validator traffic.

Processes run through devnet.supervisor (own process groups, logs under root/logs).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from gentorrent.crypto.keys import Identity, OnionKey
from gentorrent.crypto.tls import connect
from devnet.supervisor import Supervisor, free_port_block, python_module
from testkit.faultproxy import FaultNetwork
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc
from gentorrent.ledger import txs
from gentorrent.ledger.genesis import loopback_pow_nonce
from verifier.consensus.home import NodeConfig
from gentorrent.ledger.chain import Block
from gentorrent.ledger.genesis import Genesis

ROOT = Path(__file__).resolve().parents[1]
RPC_S = 5.0


def free_base_port(n: int) -> int:
    """A base port with n consecutive free ports on 127.0.0.1 (gt-verifier init numbers from it)."""
    return free_port_block(n)


def node_name(i: int) -> str:
    return f"v{i}"


def new_registration(k: int, chain_id: str) -> tuple[str, bytes]:
    """A fresh user's (node id hex, signed registration tx)."""
    identity, onion = Identity.generate(), OnionKey.generate()
    tx = txs.register_user(identity, f"127.0.0.1:{30000 + k % 30000}", onion.public_key, "eu-west", 1,
                           chain_id=chain_id, pow_nonce=loopback_pow_nonce(chain_id, identity.public_key))
    return identity.node_id_hex, tx


@dataclass
class Ledger:
    """Registrations submitted during a scenario: which were accepted by some node's mempool."""

    accepted: dict[str, bytes] = field(default_factory=dict)
    refused: int = 0


class ProxiedCommittee:
    def __init__(self, root: Path, n: int = 4, seed: int = 0,
                 node_env: dict[int, dict[str, str]] | None = None) -> None:
        self.root = Path(root)
        self.n = n
        self.node_env = node_env or {}  # extra environment of node i's first start
        self.seed = seed
        self.net = FaultNetwork(seed)
        self.sup = Supervisor(self.root / "procs")
        self.homes = [self.root / node_name(i) for i in range(n)]
        self.genesis: Genesis | None = None
        self.listen: list[str] = []

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> "ProxiedCommittee":
        out = subprocess.run(python_module("verifier.cli", "--log-level", "WARNING", "init", "--validators",
                                           str(self.n), "--out", str(self.root), "--base-port", str(free_base_port(self.n)),
                                           "--timeouts", "fast", "--chain-id", "faults"),
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"gt-verifier init failed: {out.stderr[-500:]}")
        self.genesis = Genesis.load(self.homes[0])
        self.listen = [NodeConfig.load(h).listen for h in self.homes]
        if any(addr.endswith(":0") for addr in self.listen):
            raise RuntimeError("init gave no fixed ports")
        for i in range(self.n):
            for j in range(self.n):
                if i != j:
                    host, _, port = self.listen[j].rpartition(":")
                    await self.net.add_link(node_name(i), node_name(j), host, int(port))
        for i, home in enumerate(self.homes):
            vals = tuple(v if j == i else replace(v, address=self.net.address(node_name(i), node_name(j)))
                         for j, v in enumerate(self.genesis.validators))
            replace(self.genesis, validators=vals).save(home / "genesis.json")
        for i in range(self.n):
            self.start_node(i, self.node_env.get(i))
        return self

    def start_node(self, i: int, env: dict[str, str] | None = None) -> None:
        """(Re)start node i; `env` adds to its environment (GT_FAILPOINTS, LD_PRELOAD, ...)."""
        self.sup.spawn(node_name(i), python_module("verifier.cli", "--log-level", "INFO", "start", "--home",
                                                   str(self.homes[i])), env=env, cwd=ROOT)

    def exit_code(self, i: int) -> int | None:
        """None while node i runs; its exit status (-9 for SIGKILL) once it ended."""
        return self.sup.exit_code(node_name(i))

    def log_text(self, i: int) -> str:
        return (self.sup.logs / f"{node_name(i)}.log").read_text(errors="replace")

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        self.sup.kill(node_name(i), sig)

    def alive(self, i: int) -> bool:
        return self.sup.alive(node_name(i))

    async def stop(self) -> None:
        for i in range(self.n):  # a paused node ignores SIGTERM until continued
            if self.alive(i):
                self.kill(i, signal.SIGCONT)
        await asyncio.to_thread(self.sup.stop_all, 15.0)
        await self.net.stop()

    def logs(self) -> list[Path]:
        return sorted(self.sup.logs.glob("*.log"))

    # ------------------------------------------------------------------ client side

    async def _call(self, i: int, fn):
        v = self.genesis.validators[i]
        channel = await connect(self.listen[i], v.tls_cert_pem, timeout=RPC_S)
        try:
            return await fn(rpc.VerifierStub(channel))
        finally:
            await channel.close()

    async def status(self, i: int) -> pb.VerifierStatusReply:
        return await self._call(i, lambda s: s.Status(pb.Empty(), timeout=RPC_S))

    async def height(self, i: int) -> int | None:
        try:
            return (await self.status(i)).height
        except Exception:  # noqa: BLE001 - down, paused or starting
            return None

    async def heights(self) -> list[int | None]:
        return list(await asyncio.gather(*(self.height(i) for i in range(self.n))))

    async def top_height(self) -> int:
        """The highest height any reachable node reports (0 if none answers)."""
        return max((h for h in await self.heights() if h is not None), default=0)

    async def wait_height(self, nodes: list[int], height: int, timeout_s: float) -> float:
        """Seconds until every node in `nodes` reached `height`; TimeoutError otherwise."""
        start = time.monotonic()
        while True:
            hs = await asyncio.gather(*(self.height(i) for i in nodes))
            if all(h is not None and h >= height for h in hs):
                return time.monotonic() - start
            if time.monotonic() - start > timeout_s:
                raise TimeoutError(f"nodes {nodes} at {hs}, wanted {height} within {timeout_s:.0f} s")
            await asyncio.sleep(0.3)

    async def submit(self, ledger: Ledger, k: int, to: list[int]) -> bool:
        """Submit one fresh registration to the first node in `to` that accepts it."""
        node_id, tx = new_registration(k, self.genesis.chain_id)
        for i in to:
            try:
                reply = await self._call(i, lambda s: s.SubmitTx(pb.TxRequest(tx=tx), timeout=RPC_S))
            except Exception:  # noqa: BLE001 - that node is down: try the next
                continue
            if reply.code == 0:
                ledger.accepted[node_id] = tx
                return True
        ledger.refused += 1
        return False

    async def missing(self, i: int, node_ids) -> list[str]:
        async def lookup(s):
            out = []
            for nid in node_ids:
                q = await s.Query(pb.QueryRequest(path=f"/user/{nid}"), timeout=RPC_S)
                if q.code != 0:
                    out.append(nid)
            return out
        return await self._call(i, lookup)

    async def blocks(self, i: int, upto: int) -> list[Block]:
        async def fetch(s):
            return [Block.decode(item.block) async for item in
                    s.GetBlocks(pb.BlockRangeRequest(from_height=1, to_height=upto), timeout=30)]
        return await self._call(i, fetch)

    async def send_consensus(self, i: int, payload: bytes) -> pb.Ack:
        return await self._call(i, lambda s: s.Consensus(pb.ConsensusMessage(payload=payload), timeout=RPC_S))


@dataclass
class Audit:
    """The end-of-scenario verdict on a committee."""

    height: int
    forks: int  # heights at which two nodes hold different blocks
    app_hashes_equal: bool
    evidence_against: dict[int, int]  # validator index -> committed duplicate-vote evidence
    committed_txs_lost: int  # accepted registrations missing on some node
    converge_s: float


async def audit(c: ProxiedCommittee, ledger: Ledger, timeout_s: float = 60.0) -> Audit:
    """Wait for every node to pass the highest height seen, then compare the chains block by
    block, the app hashes, the evidence, and every accepted registration on every node."""
    everyone = list(range(c.n))
    top = await c.top_height()
    converge_s = await c.wait_height(everyone, top + 2, timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:  # registrations still in a mempool get a little longer to commit
        missing = await asyncio.gather(*(c.missing(i, list(ledger.accepted)) for i in everyone))
        if not any(missing) or time.monotonic() > deadline:
            break
        await asyncio.sleep(1.0)
    chains = await asyncio.gather(*(c.blocks(i, top + 1) for i in everyone))
    length = min(len(ch) for ch in chains)
    forks = sum(1 for h in range(length) if len({ch[h].hash() for ch in chains}) > 1)
    # block top+1 certifies the app hash after `top`: equal headers mean equal app hashes
    app_equal = len({ch[length - 1].header.last_app_hash for ch in chains}) == 1
    evidence: dict[int, int] = {}
    for block in chains[0]:
        for ev in block.evidence:
            evidence[ev.validator] = evidence.get(ev.validator, 0) + 1
    lost = len(set().union(*map(set, missing)))
    return Audit(top, forks, app_equal, evidence, lost, converge_s)
