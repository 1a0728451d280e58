"""RegistryApp: every tx kind, CheckTx refusals, determinism, persistence, crash replay, proven answers."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import pytest

from gentorrent.config import REPUTATION
from gentorrent.crypto.keys import Identity, OnionKey
from gentorrent.wire import gentorrent_pb2 as pb
from verifier.abci import app as appmod
from gentorrent.ledger import txs
from gentorrent.ledger import sections
from gentorrent.ledger import queries
from testkit.registry_view import registry
from verifier.abci.app import RegistryApp
from verifier.abci.interface import BlockContext, ValidatorInfo
from gentorrent.ledger.sections import DirectoryFormatError
from verifier.abci.store import StoreError

VALIDATORS = [Identity.from_seed(bytes([100 + i]) * 32) for i in range(4)]
GENESIS_MS = 1_700_000_000_000
CHAIN = "gt-test"


@dataclass(frozen=True)
class Node:
    identity: Identity
    onion: bytes
    seed: int

    @classmethod
    def make(cls, seed: int) -> "Node":
        ident = Identity.from_seed(bytes([seed]) * 32)
        return cls(ident, OnionKey.generate().public_key, seed)

    @property
    def hex(self) -> str:
        return self.identity.node_id_hex

    def reg_user(self, seq: int, address: str = "", region: str = "eu") -> bytes:
        address = address or f"127.0.0.1:{7000 + self.seed}"  # one address, one node
        return txs.register_user(self.identity, address, self.onion, region, seq, chain_id=CHAIN)

    def reg_model(self, seq: int, capacity: int = 5, model: str = "smollm2-135m") -> bytes:
        return txs.register_model(self.identity, f"127.0.0.1:{9000 + self.seed}", model, capacity, seq,
                                  onion_key=self.onion, chain_id=CHAIN)


NODES = [Node.make(i) for i in range(1, 7)]


def new_app(path: Path, app_state: bytes = b"{}") -> RegistryApp:
    app = RegistryApp(path)
    app.init_chain(CHAIN, [ValidatorInfo(v.public_key, 10) for v in VALIDATORS], app_state, GENESIS_MS)
    return app


def ctx(height: int) -> BlockContext:
    return BlockContext(height=height, time_ms=GENESIS_MS + 1000 * height,
                        proposer=VALIDATORS[height % 4].public_key, hash=bytes([height % 256]) * 32)


def run_block(app: RegistryApp, height: int, block: list[bytes]) -> tuple:
    res = app.finalize_block(block, ctx(height))
    app.commit()
    return res


def codes(res) -> list[int]:
    return [r.code for r in res.tx_results]


@pytest.fixture
def app(tmp_path):
    a = new_app(tmp_path / "state.db")
    yield a
    a.close()


def test_every_tx_kind_is_applied_and_queried(app):
    user, model = NODES[0], NODES[1]
    assert codes(run_block(app, 1, [user.reg_user(1), model.reg_model(1, capacity=3)])) == [0, 0]
    q = app.query(f"/user/{user.hex}")
    assert q.code == 0 and q.height == 1
    entry = pb.UserEntry.FromString(q.value)
    assert entry.address == "127.0.0.1:7001" and entry.onion_key == user.onion and entry.region == "eu"
    assert entry.registered_height == 1 and entry.public_key == user.identity.public_key
    m = sections.decode_model(app.query(f"/model/{model.hex}").value)
    assert (m.capacity, m.model, m.reputation, m.trusted) == (3, "smollm2-135m", REPUTATION.initial_reputation, True)
    assert sections.decode_user(q.value).node_id == user.identity.node_id
    with pytest.raises(DirectoryFormatError):
        sections.decode_user(b"\xff")

    update_u = txs.update_user(user.identity, "10.1.1.1:7100", user.onion, "us", 2, chain_id=CHAIN)
    update_m = txs.update_model(model.identity, "10.1.1.2:9100", "gemma3-270m", 9, 2, chain_id=CHAIN)
    assert codes(run_block(app, 2, [update_u, update_m])) == [0, 0]
    entry = pb.UserEntry.FromString(app.query(f"/user/{user.hex}").value)
    assert (entry.address, entry.region, entry.registered_height, entry.updated_height) == ("10.1.1.1:7100", "us", 1, 2)
    m = pb.ModelEntry.FromString(app.query(f"/model/{model.hex}").value)
    assert (m.address, m.model, m.capacity, m.registered_height, m.updated_height) == (
        "10.1.1.2:9100", "gemma3-270m", 9, 1, 2)
    assert json.loads(app.query(f"/account/{user.identity.public_key.hex()}").value) ["last_sequence"] == 2

    d = registry(app)
    assert [u.node_id for u in d.users] == [user.identity.node_id]
    assert d.model(model.identity.node_id).capacity == 9 and len(d.trusted_models("gemma3-270m")) == 1

    gone = [txs.deregister_user(user.identity, 3, chain_id=CHAIN),
            txs.deregister_model(model.identity, 3, chain_id=CHAIN)]
    assert codes(run_block(app, 3, gone)) == [0, 0]
    assert app.query(f"/user/{user.hex}").code == appmod.CODE_NOT_FOUND
    assert app.query(f"/model/{model.hex}").code == appmod.CODE_NOT_FOUND
    d = registry(app)
    assert d.users == () and d.models == () and d.height == 3
    info = json.loads(app.query("/info").value)
    assert info["height"] == 3 and info["users"] == 0 and info["app_hash"] == app.info().last_block_app_hash.hex()


def test_stateful_rules(app):
    a, b = NODES[0], NODES[1]
    res = run_block(app, 1, [
        a.reg_user(5),
        a.reg_user(6),  # already registered
        txs.update_user(b.identity, "127.0.0.1:1", b.onion, "eu", 1, chain_id=CHAIN),  # not registered
        txs.deregister_model(a.identity, 7, chain_id=CHAIN),  # a is a user, not a model
        a.reg_model(8),  # the same identity may also run a model node
    ])
    assert codes(res) == [0, txs.CODE_ALREADY_REGISTERED, txs.CODE_NOT_REGISTERED, txs.CODE_NOT_REGISTERED, 0]
    assert res.tx_results[0].events == (("kind", "register_user"), ("node_id", a.hex), ("sequence", "5"))
    # a failed tx does not consume its sequence: b may still use 1
    assert codes(run_block(app, 2, [b.reg_user(1), a.reg_user(4)])) == [0, txs.CODE_REPLAY]


def _state_fingerprint(app: RegistryApp) -> tuple:
    return app.info(), registry(app), app.query("/info").value


def test_check_tx_refuses_bad_input_without_state_change(app):
    a, b = NODES[0], NODES[1]
    good = a.reg_user(1)
    signed = pb.SignedTx.FromString(good)
    bad_sig = pb.SignedTx(body=signed.body, signature=bytes(64)).SerializeToString()
    body = pb.TxBody.FromString(signed.body)
    body.register_user.onion_key = b"short"
    body_bytes = body.SerializeToString(deterministic=True)
    bad_field = pb.SignedTx(body=body_bytes, signature=a.identity.sign(txs.TX_SIGNING_DOMAIN + body_bytes))
    before = _state_fingerprint(app)
    cases = {
        "bad signature": (bad_sig, txs.CODE_BAD_SIGNATURE),
        "malformed field": (bad_field.SerializeToString(), txs.CODE_INVALID_FIELD),
        "garbage": (b"\x00\x01\x02", txs.CODE_MALFORMED),
        "oversize": (b"\x0a" * (64 * 1024 + 1), txs.CODE_OVERSIZE),
    }
    for name, (raw, code) in cases.items():
        res = app.check_tx(raw)
        assert res.code == code, name
        assert res.log, name  # a clear reason, never a silent refusal
    assert app.check_tx(good).ok
    dup = app.check_tx(good)
    assert dup.code == txs.CODE_REPLAY and "sequence" in dup.log
    assert app.check_tx(a.reg_user(2)).code == txs.CODE_ALREADY_REGISTERED  # pending in the mempool
    assert app.check_tx(b.reg_user(1)).ok
    assert _state_fingerprint(app) == before  # CheckTx never touches committed state

    run_block(app, 1, [good])
    assert app.check_tx(good).code == txs.CODE_REPLAY  # replay of a committed tx
    assert app.check_tx(b.reg_user(1)).ok  # mempool view was reset to the new state: recheck passes


def test_replay_after_deregistration_is_refused(app, tmp_path):
    a = NODES[0]
    register = a.reg_user(1)
    run_block(app, 1, [register, txs.deregister_user(a.identity, 2, chain_id=CHAIN)])
    assert app.query(f"/user/{a.hex}").code == appmod.CODE_NOT_FOUND
    assert app.check_tx(register).code == txs.CODE_REPLAY
    before = app.info()
    res = run_block(app, 2, [register])
    assert codes(res) == [txs.CODE_REPLAY]
    assert app.query(f"/user/{a.hex}").code == appmod.CODE_NOT_FOUND
    assert before.last_block_app_hash != res.app_hash  # height moved on, but nothing else:
    other = new_app(tmp_path / "other.db")
    run_block(other, 1, [register, txs.deregister_user(a.identity, 2, chain_id=CHAIN)])
    assert run_block(other, 2, []).app_hash == res.app_hash
    other.close()


def test_invalid_txs_in_a_block_change_nothing(tmp_path):
    a, b = NODES[0], NODES[1]
    x, y = new_app(tmp_path / "x.db"), new_app(tmp_path / "y.db")
    good = a.reg_user(1)
    junk = [b"\x00", pb.SignedTx(body=b"\x08\x01", signature=bytes(64)).SerializeToString(), good,
            b.reg_model(1, capacity=1)[:-1]]
    rx = run_block(x, 1, junk)
    ry = run_block(y, 1, [good])
    assert codes(rx)[2] == 0 and all(c != 0 for i, c in enumerate(codes(rx)) if i != 2)
    assert rx.app_hash == ry.app_hash
    x.close(), y.close()


def test_prepare_and_process_proposal(app):
    a, b, c = NODES[0], NODES[1], NODES[2]
    mempool = [a.reg_user(1), a.reg_user(1), b"\x00junk", b.reg_model(1), c.reg_user(1)]
    chosen = app.prepare_proposal(mempool, 10**6, ctx(1))
    assert chosen == [mempool[0], mempool[3], mempool[4]]
    assert app.process_proposal(chosen, ctx(1))
    assert not app.process_proposal(mempool, ctx(1))  # a duplicate and junk: reject the block
    assert not app.process_proposal(chosen, ctx(5))  # not the next height
    limit = len(mempool[0]) + 11
    assert app.prepare_proposal(mempool, limit, ctx(1)) == [mempool[0]]
    assert app.prepare_proposal(mempool, 0, ctx(1)) == []
    assert app.info().last_block_height == 0  # proposals are simulations


def _blocks() -> list[list[bytes]]:
    a, b, c, d = NODES[:4]
    return [
        [a.reg_user(1), b.reg_model(1, capacity=2)],
        [],
        [c.reg_user(1, region="ap"),
         txs.update_model(b.identity, "127.0.0.1:9999", "smollm2-135m", 4, 2, chain_id=CHAIN)],
        [d.reg_model(1), a.reg_user(1), txs.deregister_user(c.identity, 2, chain_id=CHAIN)],
        [txs.update_user(a.identity, "127.0.0.1:7777", a.onion, "eu", 9, chain_id=CHAIN)],
    ]


def test_two_apps_fed_the_same_blocks_agree(tmp_path):
    x, y = new_app(tmp_path / "x.db"), new_app(tmp_path / "y.db")
    assert x.info() == y.info()
    hashes = set()
    for h, block in enumerate(_blocks(), start=1):
        rx, ry = run_block(x, h, block), run_block(y, h, block)
        assert rx == ry
        assert x.info() == y.info()
        hashes.add(rx.app_hash)
    assert len(hashes) == len(_blocks())  # every height has its own app hash
    assert registry(x) == registry(y) and x.info() == y.info()
    z = new_app(tmp_path / "z.db")
    blocks = _blocks()
    blocks[2] = blocks[2][:1]  # one registration fewer: another state, another hash
    for h, block in enumerate(blocks, start=1):
        rz = run_block(z, h, block)
    assert rz.app_hash != rx.app_hash
    for a in (x, y, z):
        a.close()


def test_restart_resumes_and_crash_between_finalize_and_commit_replays(tmp_path):
    blocks = _blocks()
    ref = new_app(tmp_path / "ref.db")
    ref_hashes = [run_block(ref, h, b).app_hash for h, b in enumerate(blocks, start=1)]

    path = tmp_path / "node.db"
    app = new_app(path)
    for h in (1, 2, 3):
        run_block(app, h, blocks[h - 1])
    crashed = app.finalize_block(blocks[3], ctx(4))  # ... and the process dies before Commit
    assert crashed.app_hash == ref_hashes[3]
    app.close()

    app = RegistryApp(path)
    assert app.info().last_block_height == 3
    assert app.info().last_block_app_hash == ref_hashes[2]
    assert registry(app).users
    with pytest.raises(appmod.AppError):
        app.init_chain(CHAIN, [ValidatorInfo(v.public_key, 10) for v in VALIDATORS], b"{}", GENESIS_MS)
    assert run_block(app, 4, blocks[3]).app_hash == ref_hashes[3]  # replay of the lost block
    assert run_block(app, 5, blocks[4]).app_hash == ref_hashes[4]
    app.close()
    reopened = RegistryApp(path)
    assert reopened.info() == ref.info()
    assert registry(reopened) == registry(ref) and reopened.info() == ref.info()
    reopened.close(), ref.close()


def test_finalize_twice_before_commit_keeps_only_the_last(app):
    a, b = NODES[0], NODES[1]
    app.finalize_block([a.reg_user(1)], ctx(1))
    res = app.finalize_block([b.reg_user(1)], ctx(1))
    app.commit()
    assert app.info().last_block_app_hash == res.app_hash
    assert app.query(f"/user/{a.hex}").code == appmod.CODE_NOT_FOUND
    assert app.query(f"/user/{b.hex}").code == 0


def test_a_damaged_store_is_refused(tmp_path):
    path = tmp_path / "s.db"
    app = new_app(path)
    run_block(app, 1, [NODES[0].reg_user(1)])
    app.close()
    db = sqlite3.connect(path)
    db.execute("UPDATE accounts SET last_sequence = 0")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="does not match"):
        RegistryApp(path)


def test_a_proven_answer_recomputes_the_app_hash(app):
    run_block(app, 1, [NODES[0].reg_user(1), NODES[1].reg_model(1), NODES[2].reg_user(1)])
    query = queries.UserLookup(NODES[0].identity.node_id)
    answer = queries.decode_answer(app.query(query.path, query.data, 1).value, 1 << 20)
    assert answer.app_hash == app.info().last_block_app_hash and answer.height == 1
    assert query.read(answer.seen).node_id == NODES[0].identity.node_id
    roster = queries.decode_answer(app.query("/proof/roster/smollm2-135m", b"", 1).value, 1 << 20)
    assert queries.Roster("smollm2-135m").read(roster.seen)[0].onion_key == NODES[1].onion  # queries are sealed to it
    with pytest.raises(queries.AnswerError):
        queries.decode_answer(b"\xff\xff", 1 << 20)


def test_query_errors(app):
    assert app.query("/nope").code == appmod.CODE_UNKNOWN_PATH
    assert app.query("/user/xyz").code == appmod.CODE_BAD_QUERY
    assert app.query("/user/" + "A" * 64).code == appmod.CODE_BAD_QUERY
    assert app.query("/proof/catalog", height=7).code == appmod.CODE_BAD_HEIGHT
    assert app.query("/proof/catalog", height=0).code == 0
    assert app.query("/proof/relays/eu", b"\x00" * 7).code == appmod.CODE_BAD_QUERY
    assert json.loads(app.query("/account/" + "00" * 32).value) == {"last_sequence": 0, "lease_expires_ms": 0}


def test_lifecycle_misuse(tmp_path):
    fresh = RegistryApp(tmp_path / "f.db")
    assert fresh.info().last_block_height == 0 and fresh.info().last_block_app_hash == b""
    assert fresh.check_tx(NODES[0].reg_user(1)).code == appmod.CODE_NOT_INITIALIZED
    assert fresh.query("/proof/catalog").code == appmod.CODE_NOT_INITIALIZED
    with pytest.raises(appmod.AppError):
        fresh.finalize_block([], ctx(1))
    with pytest.raises(ValueError):
        fresh.init_chain("c", [ValidatorInfo(b"short", 1)], b"", 0)
    with pytest.raises(ValueError):
        fresh.init_chain("c", [ValidatorInfo(VALIDATORS[0].public_key, 1)], b"[1]", 0)
    h1 = fresh.init_chain("c", [ValidatorInfo(VALIDATORS[0].public_key, 1)], b"", 0)
    h2 = fresh.init_chain("c", [ValidatorInfo(VALIDATORS[0].public_key, 1)], b"", 0)  # re-init at height 0
    assert h1 == h2 == fresh.info().last_block_app_hash
    with pytest.raises(appmod.AppError):
        fresh.commit()
    run_block(fresh, 1, [])
    with pytest.raises(appmod.AppError):
        fresh.finalize_block([], ctx(3))
    fresh.close()


def _random_tx(rng, seqs: dict) -> bytes:
    node = rng.choice(NODES)
    key = node.identity.public_key
    seq = seqs.get(key, 0) + 1 if rng.random() < 0.85 else max(1, seqs.get(key, 0))  # some replays
    seqs[key] = max(seqs.get(key, 0), seq)
    address = f"127.0.0.1:{rng.randint(9000, 9003)}"  # few addresses: one address, one node is exercised
    user = (address, node.onion, rng.choice(["eu", "us", "ap"]))
    model = (address, rng.choice(["a", "b"]), rng.randint(1, 10))
    build = {txs.register_user: user, txs.update_user: user, txs.register_model: model, txs.update_model: model,
             txs.deregister_user: (), txs.deregister_model: (), txs.renew_lease: ()}
    builder = rng.choice(list(build))
    return builder(node.identity, *build[builder], seq, chain_id=CHAIN)


@pytest.mark.parametrize("seed,lease_s", [(1, 300), (2, 5)])  # 5 s: leases end within the 20 blocks
def test_random_histories_agree_across_restarts_and_crashes(tmp_path, seed, lease_s):
    import random

    rng = random.Random(seed)
    seqs: dict = {}
    blocks = [[_random_tx(rng, seqs) for _ in range(rng.randint(0, 6))] for _ in range(20)]
    app_state = json.dumps({"registry": {"lease_s": lease_s}}).encode()
    steady = new_app(tmp_path / "steady.db", app_state)
    seen_codes: set[int] = set()
    path = tmp_path / "flaky.db"
    flaky = new_app(path, app_state)
    listed, lapsed = 0, 0
    for h, block in enumerate(blocks, start=1):
        expected = run_block(steady, h, block)
        seen_codes |= set(codes(expected))
        d = registry(steady)
        for r in d.users + d.models:  # a lapsed lease is gone
            lease = json.loads(steady.query(f"/account/{r.public_key.hex()}").value)["lease_expires_ms"]
            assert lease > ctx(h).time_ms
        kinds = [tx_kind(tx) for tx, code in zip(block, codes(expected)) if code == 0]
        if len(d.users) + len(d.models) < listed and not any(k.startswith("deregister") for k in kinds):
            lapsed += 1
        listed = len(d.users) + len(d.models)
        if rng.random() < 0.3:  # crash after FinalizeBlock, before Commit
            assert flaky.finalize_block(block, ctx(h)).app_hash == expected.app_hash
            flaky.close()
            flaky = RegistryApp(path)
            assert flaky.info().last_block_height == h - 1
        got = run_block(flaky, h, block)
        assert got == expected
        if rng.random() < 0.3:  # clean restart
            flaky.close()
            flaky = RegistryApp(path)
        assert flaky.info() == steady.info()
        assert registry(flaky) == registry(steady) and flaky.info() == steady.info()
        # the address index a restarted app rebuilds refuses exactly what the steady one refuses
        probe = _random_tx(rng, dict(seqs))
        assert flaky.check_tx(probe) == steady.check_tx(probe)
    assert {0, txs.CODE_REPLAY, txs.CODE_NOT_REGISTERED, txs.CODE_ADDRESS_TAKEN} <= seen_codes
    assert (lapsed > 0) == (lease_s * 1000 < len(blocks) * 1000)  # records leave only when leases end
    steady.close(), flaky.close()


def tx_kind(raw: bytes) -> str:
    return txs.decode_tx(raw, CHAIN).kind
