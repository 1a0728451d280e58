"""A real committee: 4 `gt-verifier` processes over gRPC/TLS on 127.0.0.1 with RegistryApp.

They commit registrations; one is killed with SIGKILL and the others go on; restarted, it
catches up to the same app hash. A light client checks the directory against the genesis
committee and rejects forged ones (too few signatures, unknown keys, wrong app hash).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from consensus_netkit import Member, free_base_port
from gentorrent.crypto.keys import Identity
from gentorrent.crypto.tls import connect
from gentorrent.ledger.light_client import (BadSignature, Committee, TooFewSignatures, UnknownKey, WrongAppHash,
                                            committee_reader, verify_reply)
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc
from gentorrent.ledger.authtree import Tree
from gentorrent.ledger import queries
from testkit.waiting import until
from gentorrent.ledger.chain import (Block, BlockHeader, Commit, CommitSig, DirectoryProofCodec, Vote,
                                      VoteType)
from gentorrent.ledger.genesis import Genesis

pytestmark = [pytest.mark.network, pytest.mark.timeout(180)]
ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "verifier.cli", "--log-level", "WARNING", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


class Committee4:
    def __init__(self, tmp: Path) -> None:
        out = cli("init", "--validators", "4", "--out", str(tmp), "--base-port", str(free_base_port(4)),
                  "--timeouts", "fast", "--chain-id", "test-committee")
        assert out.returncode == 0, out.stderr
        self.homes = [tmp / f"v{i}" for i in range(4)]
        self.genesis = Genesis.load(self.homes[0])
        self.procs: dict[int, subprocess.Popen] = {}

    def start(self, i: int) -> None:
        log = open(self.homes[i] / "node.log", "ab")
        self.procs[i] = subprocess.Popen(
            [sys.executable, "-m", "verifier.cli", "--log-level", "INFO", "start", "--home", str(self.homes[i])],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)

    def stop_all(self) -> list[int]:
        codes = []
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                codes.append(p.wait(timeout=15))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(-9)
        return codes

    async def stub(self, i: int):
        v = self.genesis.validators[i]
        channel = await connect(v.address, v.tls_cert_pem, timeout=15)
        return channel, rpc.VerifierStub(channel)

    async def status(self, i: int) -> pb.VerifierStatusReply:
        channel, stub = await self.stub(i)
        try:
            return await stub.Status(pb.Empty(), timeout=5)
        finally:
            await channel.close()

    async def wait_height(self, i: int, height: int, timeout: float = 40) -> pb.VerifierStatusReply:
        deadline = time.monotonic() + timeout
        while True:
            try:
                st = await self.status(i)
                if st.height >= height:
                    return st
            except Exception:  # noqa: BLE001 - not up yet
                if time.monotonic() > deadline:
                    raise
            if time.monotonic() > deadline:
                raise AssertionError(f"v{i} stuck below height {height}")
            await asyncio.sleep(0.2)


async def submit(stub, tx: bytes) -> None:
    reply = await stub.SubmitTx(pb.TxRequest(tx=tx), timeout=5)
    assert reply.code == 0, reply.log


async def wait_registered(committee: Committee4, node: int, member: Member, timeout: float = 30) -> None:
    channel, stub = await committee.stub(node)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            q = await stub.Query(pb.QueryRequest(path=f"/user/{member.identity.node_id_hex}"), timeout=5)
            if q.code == 0:
                return
            await asyncio.sleep(0.2)
    finally:
        await channel.close()
    raise AssertionError(f"user never registered on v{node}")


async def _proven_registered(reader, member: Member) -> bool:
    """Whether the proven answer (the newest certified state of the verifiers asked) has `member`."""
    return (await reader.ask(queries.UserLookup(member.identity.node_id))).result is not None


async def block_at(committee: Committee4, node: int, height: int) -> Block:
    channel, stub = await committee.stub(node)
    try:
        async for item in stub.GetBlocks(pb.BlockRangeRequest(from_height=height, to_height=height), timeout=5):
            return Block.decode(item.block)
    finally:
        await channel.close()
    raise AssertionError(f"v{node} has no block {height}")


async def test_four_processes_commit_survive_a_kill_and_catch_up(tmp_path):
    committee = Committee4(tmp_path)
    try:
        for i in range(4):
            committee.start(i)
        await asyncio.gather(*(committee.wait_height(i, 3) for i in range(4)))

        members = [Member(k) for k in range(4)]
        channel, stub = await committee.stub(0)
        for m in members[:2]:
            await submit(stub, m.register("test-committee"))
        await channel.close()
        for i in range(4):
            for m in members[:2]:
                await wait_registered(committee, i, m)

        # the light client gets proven answers from the verifiers and checks them against genesis
        verified = Committee.from_genesis(committee.genesis)
        reader = committee_reader(committee.genesis, timeout=5.0)
        for m in members[:2]:  # (a proof is certified by the next block: it may lag the members' state by one)
            await until(lambda m=m: _proven_registered(reader, m), 30, f"a proven lookup of {m.identity.node_id_hex[:12]}")
        await reader.close()
        await check_forgeries(committee, verified, members[0].identity.node_id)

        # kill -9 one validator: the other three go on and commit more registrations
        committee.procs[3].kill()
        committee.procs[3].wait(timeout=10)
        before = (await committee.status(0)).height
        channel, stub = await committee.stub(1)
        for m in members[2:]:
            await submit(stub, m.register("test-committee"))
        await channel.close()
        for i in range(3):
            for m in members[2:]:
                await wait_registered(committee, i, m)
        after = await committee.wait_height(0, before + 10)

        # restart it: it catches up and computes the same app hash
        committee.start(3)
        st3 = await committee.wait_height(3, after.height + 5, timeout=60)
        for m in members:
            await wait_registered(committee, 3, m)
        await committee.wait_height(0, st3.height + 1)
        certified = (await block_at(committee, 0, st3.height + 1)).header.last_app_hash
        assert st3.app_hash == certified
        assert (await block_at(committee, 3, st3.height)).hash() == (await block_at(committee, 0, st3.height)).hash()
        status_cli = cli("status", "--home", str(committee.homes[3]))
        assert status_cli.returncode == 0 and json.loads(status_cli.stdout)["height"] >= st3.height

        # a non-validating node joins with the genesis alone and follows the chain
        obs = tmp_path / "observer"
        joined = cli("init", "--home", str(obs), "--join", str(committee.homes[0] / "genesis.json"),
                     "--listen", f"127.0.0.1:{free_base_port(1)}", "--timeouts", "fast")
        assert joined.returncode == 0, joined.stderr
        committee.homes.append(obs)
        committee.start(4)
        target = (await committee.status(0)).height
        deadline = time.monotonic() + 40
        while True:
            out = cli("status", "--home", str(obs))
            if out.returncode == 0 and json.loads(out.stdout)["height"] >= target:
                break
            assert time.monotonic() < deadline, f"observer did not follow: {out.stdout} {out.stderr}"
            time.sleep(0.5)
        seen = json.loads(out.stdout)
        assert seen["detail"]["validator_index"] is None
        await committee.wait_height(0, seen["height"] + 1)
        assert bytes.fromhex(seen["app_hash"]) == (await block_at(committee, 0, seen["height"] + 1)).header.last_app_hash
    finally:
        codes = committee.stop_all()
    assert codes == [0] * len(codes), f"unclean shutdown: {codes}"


async def check_forgeries(committee: Committee4, verified: Committee, node_id: bytes) -> None:
    query = queries.UserLookup(node_id)
    channel, stub = await committee.stub(2)
    try:
        reply = await stub.Query(pb.QueryRequest(path=query.path, data=query.data), timeout=5)
    finally:
        await channel.close()
    assert reply.code == 0

    def verify_directory(value, height, proof, committee_):
        return verify_reply(query, value, height, proof, committee_)

    assert verify_directory(reply.value, reply.height, reply.proof, verified).result.node_id == node_id
    height, header_bytes, commit_bytes = DirectoryProofCodec.decode(reply.proof)
    header, commit = BlockHeader.decode(header_bytes), Commit.decode(commit_bytes)

    def with_commit(c: Commit) -> bytes:
        return DirectoryProofCodec.encode(height, header_bytes, c.encode())

    few = dataclasses.replace(commit, signatures=commit.signatures[:2])
    with pytest.raises(TooFewSignatures, match="too few signatures"):
        verify_directory(reply.value, reply.height, with_commit(few), verified)

    strangers = [Identity.generate() for _ in range(4)]
    forged_sigs = []
    for s in strangers:
        vote = Vote(VoteType.PRECOMMIT, header.height, commit.round, header.hash(), 0)
        forged_sigs.append(CommitSig(s.public_key, s.sign(vote.sign_bytes(verified.chain_id))))
    forged = dataclasses.replace(commit, signatures=tuple(forged_sigs))
    with pytest.raises(UnknownKey, match="unknown key"):
        verify_directory(reply.value, reply.height, with_commit(forged), verified)

    # a well-formed value for another state (no users, no models) under the genuine proof
    fake_value = queries.encode_answer(height, os.urandom(32), os.urandom(32), query.prove(Tree()))
    with pytest.raises(WrongAppHash, match="wrong app hash"):
        verify_directory(fake_value, reply.height, reply.proof, verified)

    # one signature replaced by another validator's signature over something else
    bad = list(commit.signatures)
    bad[0] = CommitSig(bad[0].public_key, bad[1].signature)
    with pytest.raises(BadSignature):
        verify_directory(reply.value, reply.height, with_commit(dataclasses.replace(commit, signatures=tuple(bad))),
                         verified)
