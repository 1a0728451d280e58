"""A verification committee with scripted model behaviour, for the epoch tests
(tests/test_epochs_runner.py) and the epoch fault scenarios (testkit/scenarios/epochs.py).

Real: 4 VerifierNodes (consensus over gRPC/TLS on loopback, WAL, private reveals; their data on
tmpfs where there is one, testkit/memdisk.py), the epoch
runner, the ABCI epoch rules and reputation, model-node keys and signed receipts. Scripted:
the challenge pool (made-up conversations), the reference model's token scores, and what each model node answers (the live
test with vLLM and the overlay is tests/test_epochs_live.py). Epochs take seconds this way, so
leader faults and model-node faults can be run many times.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import time
from dataclasses import replace
from pathlib import Path

from gentorrent.config import EPOCH_RUN
from gentorrent.crypto.keys import Identity
from gentorrent import receipts
from gentorrent.traffic.corpus import Conversation
from gentorrent.traffic.model import TrafficPool
from testkit.committee import free_base_port
from testkit.memdisk import MemoryFolder
from gentorrent.wire import gentorrent_pb2 as pb
from testkit.selective import CorpusLookup
from verifier import cli
from gentorrent.ledger import txs
from gentorrent.ledger.genesis import loopback_pow_nonce
from gentorrent.ledger.sections import decode_model
from verifier.node import VerifierNode
from testkit.leader_faults import LeaderFaults
from verifier.epochs.runner import EpochRunner, ProbeAnswer, ProbeFailed
from verifier.epochs.scoring import TokenScores

#: fast epochs: greedy challenges, no pacing, challenges sent at once
SCRIPTED_PARAMS = replace(EPOCH_RUN, challenge_temperature=0.0, poll_s=0.1, probe_timeout_s=10.0, epoch_pause_s=0.0,
                          challenge_spread_s=0.0)
HONEST_TOKENS = [5, 6, 7, 8, 9, 10]
CHEAT_TOKENS = [900, 901, 902, 903]
MODEL = "smollm2-135m"
#: one long reply, over and over: honestly sampled (at temperature 0.7) once, so the reference
#: sees it as a sample, not as the greedy choice. Token 600 + r is the r-th likeliest at its position
#: (SAMPLED_TOP), in the shares sampling at 0.7 gives (~0.6 / 0.3 / 0.1): improbable as a whole
#: (ScoreReport.log_prob_bound ~ -40), which is what makes its repeat a replay (repeats.py)
SAMPLED_TOP = (-0.7, -1.2, -2.0, -3.0)
REPLAYED_TOKENS = [600 + (1, 1, 2, 1, 1, 2, 1, 3, 1, 2)[i % 10] for i in range(128)]
BEHAVIOURS = ("honest", "cheat", "down", "replay", "reprompt", "lookup")
#: how long a test waits for epochs to close. An epoch takes 8-25 s here alone, but the four
#: in-process members share one event loop, and every fsync (WAL before each signature, block
#: store per block: ~20 per height) blocks it: CI's run beside the engine tests' disk traffic
#: saw no epoch close within 90 s in five tests (stop 44); their data is now on tmpfs where the
#: machine has one (MemoryFolder). A passing test does not wait longer.
WAIT_EPOCHS_S = 300.0
#: the epoch test files' pytest timeout: room for two such waits
EPOCH_TEST_TIMEOUT_S = 2 * WAIT_EPOCHS_S


def scripted_pool() -> TrafficPool:
    """A small challenge pool of made-up conversations (every shape), so scripted committees do
    not load the real corpus."""
    convs = []
    for i in range(40):
        convs.append(Conversation(f"s{i}", (("user", f"How do I fix problem number {i} in my garden?"),
                                            ("assistant", f"Water it less ({i})."),
                                            ("user", f"And what about problem {i + 1}?"))))
        convs.append(Conversation(f"d{i}", (("user", f"Summarise this text {i}: " + "lorem ipsum " * 200),)))
        convs.append(Conversation(f"c{i}", (("user", f"Why does this fail?\n```\ndef f{i}():\n    return {i}\n```"),)))
    return TrafficPool.build(convs)


@functools.lru_cache(maxsize=1)
def _public_lookup() -> CorpusLookup:
    return CorpusLookup(scripted_pool().user_messages(), threshold=0.5, near_only=False)  # no user sends these


def in_public_pool(text: str) -> bool:
    """A corpus lookup (the selective cheater's, testkit/selective.py) in the scripted pool."""
    return _public_lookup().log_odds(text) > 0


class ScriptedReference:
    """Honest tokens are the greedy choice; a sampled token (600 + rank) is what its rank says."""

    async def score(self, request, token_ids, served_by=None):
        lps, ranks, tops = [], [], []
        for t in token_ids:
            if 600 < t <= 600 + len(SAMPLED_TOP):
                lps.append(SAMPLED_TOP[t - 601])
                ranks.append(t - 600)
                tops.append({601 + r: lp for r, lp in enumerate(SAMPLED_TOP)})
                continue
            honest = t in HONEST_TOKENS
            lps.append(-0.05 if honest else -9.0)
            ranks.append(1 if honest else 40)
            tops.append({t if honest else HONEST_TOKENS[0]: -0.05, 3: -3.0})
        return TokenScores(lps, ranks, tops)


class ScriptedModels:
    """Model nodes behind the prober: 'honest', 'cheat' (wrong tokens), 'down' (no reply),
    'replay' (the same long, honestly scored reply to every prompt), 'reprompt' (honest tokens
    under a receipt for other sampling parameters: what a node, or a forwarder, that changes the
    request signs) or 'lookup' (honest when the asked message is found in the public challenge
    pool, `scripted_pool`, by a 5-gram lookup, as a node that stored the corpus does; wrong tokens
    otherwise).
    A node's behaviour may be changed while epochs run (`set`); a node may forward every
    request to another node (`forward`), which then serves and signs it, as the HR-tree does
    when a group member holds the prompt's prefix."""

    def __init__(self) -> None:
        self.nodes: dict[str, tuple[Identity, str]] = {}
        self.forwards: dict[str, Identity] = {}
        self.asked: list[str] = []
        self.asked_at: list[float] = []

    def add(self, behaviour: str) -> Identity:
        ident = Identity.generate()
        self.nodes[ident.node_id_hex] = (ident, behaviour)
        return ident

    def set(self, ident: Identity, behaviour: str) -> None:
        if behaviour not in BEHAVIOURS:
            raise ValueError(f"behaviour is one of {BEHAVIOURS}")
        self.nodes[ident.node_id_hex] = (ident, behaviour)

    def forward(self, ident: Identity, to: Identity) -> None:
        """`ident` hands every request to `to` (registered or not; unknown nodes serve honestly)."""
        self.forwards[ident.node_id_hex] = to

    async def ask(self, request: pb.GenerateRequest, node_id_hex: str) -> ProbeAnswer:
        self.asked.append(node_id_hex)
        self.asked_at.append(time.monotonic())
        ident, behaviour = self.nodes[node_id_hex]
        if node_id_hex in self.forwards:
            to = self.forwards[node_id_hex]
            ident, behaviour = self.nodes.get(to.node_id_hex, (to, "honest"))
        if behaviour == "down":
            raise ProbeFailed("no reply within 1 s")
        if behaviour == "lookup":
            behaviour = "honest" if in_public_pool(request.messages[-1].content) else "cheat"
        tokens = {"honest": HONEST_TOKENS, "replay": REPLAYED_TOKENS}.get(behaviour, CHEAT_TOKENS)
        signed = request
        if behaviour == "reprompt":
            signed = pb.GenerateRequest()
            signed.CopyFrom(request)
            signed.sampling.temperature = 1.5
        receipt = receipts.make_receipt(ident, request.model, signed, tokens, int(time.time() * 1000))
        return ProbeAnswer(list(tokens), receipt)


class EpochCommittee:
    """Four in-process verifier nodes, each with its epoch runner over the scripted models."""

    def __init__(self, root: Path, chain_id: str = "epochs-test") -> None:
        self.data = MemoryFolder(Path(root) / "members")  # (one event loop for four: testkit/memdisk.py)
        with contextlib.redirect_stdout(io.StringIO()) as said:  # (a bench's stdout is its one JSON line)
            code = cli.main(["--log-level", "WARNING", "init", "--validators", "4", "--out", str(self.data.path),
                             "--base-port", str(free_base_port(4)), "--timeouts", "fast", "--chain-id", chain_id])
        if code != 0:
            self.data.close()
            raise RuntimeError(f"gt-verifier init failed: {said.getvalue()[-500:]}")
        self.chain_id = chain_id
        self.homes = [self.data.path / f"v{i}" for i in range(4)]
        self.nodes: list[VerifierNode] = []
        self.runners: list[EpochRunner] = []

    async def start(self, models: ScriptedModels, faults: LeaderFaults | None = None,
                    params=SCRIPTED_PARAMS) -> None:
        pool = scripted_pool()
        for home in self.homes:
            node = VerifierNode(home)
            await node.start()
            self.nodes.append(node)
        for node in self.nodes:
            runner = EpochRunner(node.epoch_host(), ScriptedReference(), models, params, faults, pool)
            node.epochs = runner
            runner.start()
            self.runners.append(runner)

    async def stop(self) -> None:
        try:
            for node in self.nodes:
                await node.stop()
        finally:
            self.data.close()

    async def submit(self, tx: bytes) -> None:
        reply = await self.nodes[0].consensus.submit_tx(tx, forwarded=False)
        if reply.code != 0:
            raise RuntimeError(f"tx refused ({reply.code}): {reply.log}")

    async def register(self, ident: Identity, port: int) -> None:
        await self.submit(txs.register_model(ident, f"127.0.0.1:{port}", MODEL, 5, 1, chain_id=self.chain_id,
                                             pow_nonce=loopback_pow_nonce(self.chain_id, ident.public_key)))

    def section(self) -> pb.EpochsSection:
        return pb.EpochsSection.FromString(self.nodes[0].app.query("/epochs").value)

    def model(self, ident: Identity):
        return decode_model(self.nodes[0].app.query(f"/model/{ident.node_id_hex}").value)

    async def wait_epochs(self, closed: int, timeout: float = WAIT_EPOCHS_S) -> pb.EpochsSection:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sec = self.section()
            if len(sec.history) >= closed:
                return sec
            await asyncio.sleep(0.2)
        cur = self.section().current
        nodes = [(n.consensus.host.height, len(n.consensus.mempool), n.consensus.gossip) for n in self.nodes]
        raise AssertionError(f"only {len(self.section().history)} epochs closed; now epoch {cur.epoch} phase "
                             f"{cur.phase} since block time {cur.phase_started_ms}, leader {cur.leader.hex()[:12]}; "
                             f"members (height, mempool, gossip): {nodes}; runner logs: "
                             f"{[r.log[-6:] for r in self.runners]}")
