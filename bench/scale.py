"""The directory at internet scale: prints ONE JSON line (`--tiny`: the make-test size).

A registry of `--nodes` users (default 100,000) in the real ABCI application (RegistryApp,
its SQLite store and registry tree): most are loaded as records, `--signed` of them register
with real signed transactions, so renewals and updates are real Ed25519 transactions. Then:

- commit_1000_ms: application CPU to FinalizeBlock + Commit a block of 1,000 changes
  (registrations of new nodes), after CheckTx saw them (the verified cache) and cold;
- renewals_2000_ms: the same for a block of 2,000 lease renewals (goal <= 200 ms), and the
  committee's renewal load at this size with the genesis' lease (tx/s);
- proofs: bytes and client CPU to verify (header + commit of 4 real signatures included) of a
  sample of 12 relays, one peer's record, a roster of 20 model nodes, its changes since h;
- user_bytes_per_min, model_member_bytes_per_min: what a user node and a model-group member
  fetch in steady state, from those sizes and the cadences of config (path renewal, roster
  refresh, peers met): the goal is <= 20 KB/min for a user node;
- first_view: bytes and CPU a new node needs before it can build its paths (its own record,
  a relay sample, the catalogue, one roster): goals <= 200 KB and <= 1 s;
- flood: 10,000 registrations from one attacker (one /24, no valid proof of work): committee
  CPU to refuse them, whether an honest registration still commits within 2 blocks, and whether
  the proofs a client fetches changed;
- sybil_cpu_hours: what holding 10 % of relay positions among `--nodes` honest relays costs
  at the production rules (proof of work, relays per /24), from the measured attempt time;
- live (`--live-s`): the same questions counted on running nodes: a committee of four real
  verifier nodes, an echo model node that follows its group's roster as a member does, and user
  nodes that ask it, in one process over gRPC/TLS; the answers and bytes each fetched per minute,
  by kind, in steady state (after start-up), to hold the cadences of the model above against.

Every time is CPU time of this process (time.process_time), so a loaded machine inflates it
less than wall time; the floors are stated beside each figure in the README.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import io
import hashlib
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gentorrent.config import CLOVES, REGISTRY, ROUTING, SIMS  # noqa: E402
from gentorrent.crypto.keys import Identity, OnionKey  # noqa: E402
from gentorrent.ledger import pow as pow_rule, queries, txs  # noqa: E402
from gentorrent.ledger.chain import (Validator,  # noqa: E402
                                     ValidatorSet)
from gentorrent.ledger.chain_params import RegistryRules  # noqa: E402
from gentorrent.ledger.light_client import Committee, verify_reply  # noqa: E402
from gentorrent.ledger.sections import Account, UserRecord  # noqa: E402
from gentorrent.ledger.txs import Role  # noqa: E402
from verifier.abci.app import RegistryApp  # noqa: E402
from testkit.signed_proofs import signed_proof  # noqa: E402
from verifier.abci.interface import BlockContext, ValidatorInfo  # noqa: E402
from verifier.abci.state import StateView  # noqa: E402

CHAIN = "scale"
T0 = 1_800_000_000_000
MEMBERS = [Identity.from_seed(bytes([150 + i]) * 32) for i in range(4)]
COMMITTEE = Committee(CHAIN, ValidatorSet([Validator(m.public_key, 1) for m in MEMBERS]))
MODEL = "smollm2-135m"
#: peers a user node meets per minute (new predecessors and successors on paths through it):
#: N users each build `proxies_kept` paths of `path_length` hops per `path_renewal_s`, and with
#: single-use paths n more for each ask (at the simulators' asks a day), so each relay carries
#: that many hop slots, each a predecessor and a successor to look up
PATHS_PER_MIN = (CLOVES.proxies_kept / (CLOVES.path_renewal_s / 60)
                 + (CLOVES.n * SIMS.linkability_asks_per_day / (24 * 60) if CLOVES.single_use_paths else 0.0))
PEERS_PER_MIN = 2 * CLOVES.path_length * PATHS_PER_MIN
USER_ROSTER_REFRESH_S = REGISTRY.user_roster_refresh_s
MEMBER_ROSTER_REFRESH_S = ROUTING.directory_refresh_s


def cpu_ms(fn) -> tuple[float, object]:
    t = time.process_time()
    out = fn()
    return (time.process_time() - t) * 1000, out


class Bench:
    def __init__(self, root: Path, nodes: int, signed: int, pow_bits: int) -> None:
        # production rules but a lighter proof of work (the bench signs thousands) and no cap of
        # registrations per block (the bench commits blocks of 1,000 registrations to time them)
        self.rules = {**RegistryRules.production().to_json(), "pow_bits": pow_bits,
                      "pow_memory_kib": REGISTRY.pow_memory_kib, "registrations_per_block": 0}
        self.app = RegistryApp(root / "state.db")
        self.app.init_chain(CHAIN, [ValidatorInfo(m.public_key, 1) for m in MEMBERS],
                            json.dumps({"registry": self.rules}).encode(), T0)
        self.pow = pow_rule.PowParams(pow_bits, REGISTRY.pow_memory_kib)
        self.height = 0
        self.hashes = {0: self.app.info().last_block_app_hash}
        self.bulk_load(nodes - signed)
        self.signed = [Identity.from_seed(hashlib.sha256(b"signed%d" % i).digest()) for i in range(signed)]
        self.onion = OnionKey.generate().public_key
        for i in range(0, signed, 1000):
            regs = [self.register(ident, 10, i + j) for j, ident in enumerate(self.signed[i:i + 1000])]
            self.block(regs)
        self.models = [Identity.from_seed(hashlib.sha256(b"model%d" % i).digest()) for i in range(20)]
        self.block([txs.register_model(m, f"172.16.{i}.1:9000", MODEL, 5, 1, self.onion, chain_id=CHAIN,
                                       pow_nonce=pow_rule.solve(self.pow, CHAIN, m.public_key))
                    for i, m in enumerate(self.models)])

    def register(self, ident: Identity, a: int, i: int, seq: int = 1) -> bytes:
        """A real registration of relay number `i` in a.0.0.0/8: its own /24 (the genesis caps them)."""
        return txs.register_user(ident, f"{a}.{i // 250 % 250}.{i % 250}.1:7000", self.onion, "default", seq,
                                 chain_id=CHAIN, pow_nonce=pow_rule.solve(self.pow, CHAIN, ident.public_key))

    def bulk_load(self, n: int) -> None:
        """Records of `n` relays written straight into the committed state (the store and the
        tree, as a block would): what the registry holds, without signing n transactions."""
        c = self.app._committed
        view = StateView(c)
        view.height, view.time_ms = 0, T0
        rng = random.Random(7)
        for i in range(n):
            pk = rng.randbytes(32)
            node_id = hashlib.sha256(pk).digest()
            address = f"{1 + i // 2_000_000 % 9}.{i // 1000 % 250}.{i // 4 % 250}.{i % 4 + 1}:7000"
            view._put(Role.USER, UserRecord(node_id, pk, address, rng.randbytes(32), "default"), None)
            view.accounts.set(pk, Account(pk, 1, T0 + c.params.lease_ms))
        app_hash = view.app_hash()
        self.app._store.write(view, app_hash)
        view.fold_into_base()
        self.app._app_hash = app_hash
        self.app._mempool = StateView(c, self.app._verified)
        self.app._snapshots = {}
        self.app._snapshot(StateView(c))
        self.hashes[0] = app_hash

    def block(self, raw: list[bytes], check: bool = True) -> tuple[float, list[int]]:
        """CheckTx each (as the mempool does), then FinalizeBlock + Commit: CPU ms of the latter."""
        if check:
            for tx in raw:
                self.app.check_tx(tx)
        self.height += 1
        ctx = BlockContext(self.height, T0 + 1000 * self.height, MEMBERS[0].public_key, bytes(32))
        t = time.process_time()
        res = self.app.finalize_block(raw, ctx)
        self.app.commit()
        ms = (time.process_time() - t) * 1000
        self.hashes[self.height] = res.app_hash
        return ms, [r.code for r in res.tx_results]

    def idle(self) -> None:
        self.block([])

    # ------------------------------------------------------------------ proofs as a client gets them

    def header_proof(self, height: int) -> bytes:
        return signed_proof(CHAIN, height, self.hashes[height], T0 + 1000 * (height + 1), COMMITTEE.validators, MEMBERS)

    def fetch(self, query, **kwargs) -> tuple[int, float, object]:
        """(bytes on the wire, client CPU ms to verify, the answer) of one proven query."""
        self.idle()  # the header of the next block certifies the state queried
        h = self.height - 1
        q = self.app.query(query.path, query.data, h)
        assert q.code == 0, q.log
        proof = self.header_proof(h)
        ms, answer = cpu_ms(lambda: verify_reply(query, q.value, h, proof, COMMITTEE, **kwargs).result)
        return len(q.value) + len(proof) + len(query.path) + len(query.data), ms, answer


def run(args) -> dict:
    out: dict = {"bench": "scale", "nodes": args.nodes, "signed": args.signed}
    with tempfile.TemporaryDirectory() as tmp:
        t = time.process_time()
        b = Bench(Path(tmp), args.nodes, args.signed, args.pow_bits)
        out["build_cpu_s"] = round(time.process_time() - t, 1)
        out["registry_entries"] = b.app._committed.tree.size

        # --- 1,000 changes, warm (CheckTx saw them) and cold (a proposer's own)
        fresh = [Identity.from_seed(hashlib.sha256(b"new%d" % i).digest()) for i in range(2 * args.changes)]
        warm = [b.register(ident, 11, i) for i, ident in enumerate(fresh[:args.changes])]
        cold = [b.register(ident, 12, i) for i, ident in enumerate(fresh[args.changes:])]
        ms, codes = b.block(warm)
        assert set(codes) == {0}, set(codes)
        out["commit_1000_ms"] = round(ms, 1)
        ms, codes = b.block(cold, check=False)
        assert set(codes) == {0}, set(codes)
        out["commit_1000_cold_ms"] = round(ms, 1)

        # --- renewals
        renewals = [txs.renew_lease(ident, 2, chain_id=CHAIN) for ident in b.signed[:args.renewals]]
        ms, codes = b.block(renewals)
        assert set(codes) == {0}, set(codes)
        out["renewals"] = len(renewals)
        out["renewals_block_ms"] = round(ms, 1)
        out["renewals_block_goal_ms"] = 200
        lease_s = b.rules["lease_s"]
        out["renewal_tx_per_s_at_100k"] = round(100_000 * REGISTRY.renewals_per_lease / lease_s, 1)
        out["renewal_tx_bytes"] = len(renewals[0])

        # --- proofs
        rng = random.Random(5)
        draws = tuple(rng.getrandbits(64) for _ in range(CLOVES.proxies_kept * CLOVES.path_length))
        size, ms, (count, relays) = b.fetch(queries.RelaySample("default", draws))
        out["sample_relays"], out["sample_bytes"], out["sample_verify_ms"] = len(relays), size, round(ms, 2)
        assert count >= args.nodes
        size, ms, _ = b.fetch(queries.UserLookup(b.signed[7].node_id))
        out["peer_record_bytes"], out["peer_verify_ms"] = size, round(ms, 2)
        size, ms, roster = b.fetch(queries.Roster(MODEL))
        out["roster_members"], out["roster_bytes"], out["roster_verify_ms"] = len(roster), size, round(ms, 2)
        since = b.height - 1
        held = {m.node_id: m for m in roster}
        b.block([txs.update_model(b.models[3], "172.16.3.9:9000", MODEL, 7, 2, b.onion, chain_id=CHAIN)])
        size, ms, changed = b.fetch(queries.Roster(MODEL, since=since), held=held)
        assert len(changed) == 20
        out["roster_changes_bytes"], out["roster_changes_verify_ms"] = size, round(ms, 2)
        size_catalog, ms_catalog, _ = b.fetch(queries.Catalog())
        out["catalog_bytes"] = size_catalog

        # --- steady state per minute, and a new node's first usable view
        samples_per_min = 60 / CLOVES.path_renewal_s  # one sample of N x l relays per renewal round
        user = (out["sample_bytes"] * samples_per_min + out["roster_changes_bytes"] * 60 / USER_ROSTER_REFRESH_S
                + out["peer_record_bytes"] * PEERS_PER_MIN)
        out["user_bytes_per_min"] = round(user)
        out["user_bytes_per_min_goal"] = 20_000
        out["model_member_bytes_per_min"] = round(out["roster_changes_bytes"] * 60 / MEMBER_ROSTER_REFRESH_S
                                                  + out["peer_record_bytes"] * PEERS_PER_MIN)
        out["cadences_s"] = {"sample": CLOVES.path_renewal_s, "user_roster": USER_ROSTER_REFRESH_S,
                             "member_roster": MEMBER_ROSTER_REFRESH_S, "peers_met_per_min": round(PEERS_PER_MIN, 2)}
        own_size, own_ms, _ = b.fetch(queries.UserLookup(b.signed[0].node_id))
        first = own_size + out["sample_bytes"] + size_catalog + out["roster_bytes"]
        first_ms = own_ms + out["sample_verify_ms"] + ms_catalog + out["roster_verify_ms"]
        out["first_view_bytes"], out["first_view_cpu_ms"] = first, round(first_ms, 1)
        out["first_view_goal"] = {"bytes": 200_000, "cpu_ms": 1000}

        # --- a flood of registrations from one attacker
        before = b.fetch(queries.RelaySample("default", draws))[0]
        attacker = [Identity.from_seed(hashlib.sha256(b"sybil%d" % i).digest()) for i in range(args.flood)]
        flood = [txs.register_user(a, f"66.6.6.{i % 250 + 1}:{7000 + i // 250}", b.onion, "default", 1,
                                   chain_id=CHAIN, pow_nonce=i) for i, a in enumerate(attacker)]
        t = time.process_time()
        flood_codes = [b.app.check_tx(tx).code for tx in flood]
        flood_ms = (time.process_time() - t) * 1000
        honest = Identity.from_seed(b"honest after the flood".ljust(32, b"."))
        honest_tx = b.register(honest, 13, 1)
        committed_after = None
        mempool = [tx for tx, code in zip(flood, flood_codes) if code == 0] + [honest_tx]
        for blocks in (1, 2):
            chosen = b.app.prepare_proposal(mempool, 4 * 1024 * 1024, BlockContext(b.height + 1, 0, b"\0" * 32))
            b.block(chosen, check=False)
            mempool = [tx for tx in mempool if tx not in chosen]
            if b.app.query(f"/user/{honest.node_id_hex}").code == 0:
                committed_after = blocks
                break
        after = b.fetch(queries.RelaySample("default", draws))[0]
        out["flood"] = {"registrations": args.flood, "refused": sum(c != 0 for c in flood_codes),
                        "codes": sorted(set(flood_codes)), "committee_cpu_ms": round(flood_ms),
                        "cpu_us_per_registration": round(flood_ms * 1000 / args.flood, 1),
                        "honest_committed_after_blocks": committed_after,
                        "sample_bytes_before_after": [before, after]}

        # --- what 10 % of the relay positions costs at the production rules
        chal = pow_rule.challenge(CHAIN, honest.public_key)
        params = pow_rule.PowParams(REGISTRY.pow_bits, REGISTRY.pow_memory_kib)
        attempt_ms, _ = cpu_ms(lambda: [pow_rule.attempt(params, chal, n) for n in range(20)])
        attempt_ms /= 20
        sybils = round(args.nodes / 9)  # s / (honest + s) = 10 %
        out["pow_attempt_ms"] = round(attempt_ms, 3)
        out["honest_registration_cpu_s"] = round(params.expected_attempts * attempt_ms / 1000, 1)
        out["sybil"] = {"relays_for_10pct": sybils,
                        "cpu_hours": round(sybils * params.expected_attempts * attempt_ms / 3.6e6, 1),
                        "distinct_24s_needed": -(-sybils // REGISTRY.relays_per_24),
                        "pow_bits": REGISTRY.pow_bits, "relays_per_24": REGISTRY.relays_per_24}
        b.app.close()
    return out


# --------------------------------------------------------------------------- on running nodes


def _counted(directory, tally: dict) -> None:
    """Count each proven answer `directory` fetches, by kind (/proof/<kind>/...), at its transport."""
    send = directory.reader.send

    async def counted(v, path, data):
        reply = await send(v, path, data)
        kind = path.split("/")[2]
        tally[kind][0] += 1
        tally[kind][1] += len(reply.value) + len(reply.proof) + len(path) + len(data)
        return reply

    directory.reader.send = counted


def _per_min(after: dict, before: dict, seconds: float) -> dict:
    return {kind: [round((n - before.get(kind, (0, 0))[0]) * 60 / seconds, 2),
                   round((b - before.get(kind, (0, 0))[1]) * 60 / seconds)] for kind, (n, b) in sorted(after.items())}


async def live(root: Path, users: int, seconds: float, ask_every_s: float) -> dict:
    """The directory traffic of running nodes: answers and bytes per minute by kind."""
    from gentorrent.ledger.committee import CommitteeDirectory
    from testkit.committee import free_base_port
    from testkit.echo_model import EchoModelNode
    from user_client.node import UserNode
    from verifier import cli
    from verifier.node import VerifierNode

    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["--log-level", "WARNING", "init", "--validators", "4", "--out", str(root / "c"),
                         "--base-port", str(free_base_port(4)), "--timeouts", "fast", "--chain-id", "live"]) == 0
    genesis = str(root / "c" / "v0" / "genesis.json")
    tallies: dict[str, dict] = {}

    def directory(name: str, **kwargs) -> CommitteeDirectory:
        d = CommitteeDirectory.from_args(genesis, root / name, **kwargs)
        tallies[name] = collections.defaultdict(lambda: [0, 0])
        _counted(d, tallies[name])
        return d

    started: list = []
    tasks: list[asyncio.Task] = []
    try:
        for i in range(4):
            v = VerifierNode(root / "c" / f"v{i}")
            await v.start()
            started.append(v)
        model = EchoModelNode(root / "model", directory("model", roster_refresh_s=ROUTING.directory_refresh_s))
        await model.start()
        started.append(model)

        async def member() -> None:  # what model_node.gossip's refresh_roster does, at its cadence
            while True:
                with contextlib.suppress(Exception):
                    await model.directory.follow(model.model)
                    await model.directory.refresh()
                await asyncio.sleep(ROUTING.directory_refresh_s)

        async def asking(u: UserNode) -> None:
            while True:
                with contextlib.suppress(Exception):
                    await u.ask("how far is the moon?", model=model.model)
                await asyncio.sleep(ask_every_s)

        nodes = [UserNode(root / f"u{i}", directory(f"u{i}")) for i in range(users)]
        for u in nodes:
            await u.start(build_paths=False)
            started.append(u)
        tasks = [asyncio.ensure_future(member())] + [asyncio.ensure_future(asking(u)) for u in nodes]
        await asyncio.sleep(max(ask_every_s, ROUTING.directory_refresh_s))  # start-up: first paths, first asks
        before = {name: {k: tuple(v) for k, v in t.items()} for name, t in tallies.items()}
        t0 = time.monotonic()
        await asyncio.sleep(seconds)
        elapsed = time.monotonic() - t0
        per_user = [_per_min(tallies[f"u{i}"], before[f"u{i}"], elapsed) for i in range(users)]
        kinds = sorted({k for u in per_user for k in u})
        mean = {k: [round(sum(u.get(k, [0, 0])[j] for u in per_user) / users, 2) for j in (0, 1)] for k in kinds}
        member = _per_min(tallies["model"], before["model"], elapsed)
        return {"seconds": round(elapsed), "users": users, "ask_every_s": ask_every_s,
                "registry_entries": started[0].app._committed.tree.size,
                "user_per_min": mean, "user_bytes_per_min": round(sum(b for _, b in mean.values())),
                "member_per_min": member, "asks_answered": len(model.prompts),
                # the cadences the per-minute model above assumes, against what the nodes did
                "roster_answers_per_min": {"user": mean.get("roster", [0])[0], "user_model": 60 / USER_ROSTER_REFRESH_S,
                                           "member": member.get("roster", [0])[0],
                                           "member_model": 60 / MEMBER_ROSTER_REFRESH_S}}
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for node in reversed(started):
            await node.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="the make-test size: 3,000 nodes")
    p.add_argument("--nodes", type=int, default=100_000)
    p.add_argument("--signed", type=int, default=2_500, help="nodes registered with real signed transactions")
    p.add_argument("--changes", type=int, default=1_000)
    p.add_argument("--renewals", type=int, default=2_000)
    p.add_argument("--flood", type=int, default=10_000)
    p.add_argument("--pow-bits", type=int, default=4, help="this chain's proof of work (the registrations the "
                                                            "bench signs must solve it)")
    p.add_argument("--live-s", type=float, default=240.0, help="seconds of steady state counted on running nodes")
    p.add_argument("--live-users", type=int, default=6)
    p.add_argument("--ask-every-s", type=float, default=20.0, help="how often each live user node asks")
    args = p.parse_args()
    if args.tiny:
        args.nodes, args.signed, args.changes, args.renewals, args.flood = 3_000, 300, 100, 200, 300
        args.live_s, args.live_users, args.ask_every_s = 6.0, 4, 3.0
    out = run(args)
    if args.live_s > 0:
        with tempfile.TemporaryDirectory() as tmp:
            out["live"] = asyncio.run(live(Path(tmp), args.live_users, args.live_s, args.ask_every_s))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
