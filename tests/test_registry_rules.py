"""The registry's rules against an attacker who only signs transactions (the real RegistryApp):
one address, one node; every transaction bound to its chain; registrations are leases."""

from __future__ import annotations

import json

import pytest

from gentorrent.crypto.keys import Identity, OnionKey
from gentorrent.crypto.tls import make_self_signed
from gentorrent.ledger import txs
from gentorrent.ledger.genesis import Genesis, GenesisError, GenesisValidator, lease_ms_of
from testkit.registry_view import registry
from verifier.abci.app import RegistryApp
from verifier.abci.interface import BlockContext, ValidatorInfo

CHAIN = "registry-test"
T0 = 1_700_000_000_000
LEASE_S = 10
VALIDATOR = Identity.from_seed(bytes([1]) * 32)


class Node:
    def __init__(self, seed: int) -> None:
        self.identity = Identity.from_seed(bytes([seed]) * 32)
        self.onion = OnionKey.generate().public_key
        self.seq = 0

    def next(self) -> int:
        self.seq += 1
        return self.seq

    def user(self, address: str, chain: str = CHAIN, kind: str = "register_user") -> bytes:
        return getattr(txs, kind)(self.identity, address, self.onion, "eu", self.next(), chain_id=chain)

    def model(self, address: str, kind: str = "register_model") -> bytes:
        return getattr(txs, kind)(self.identity, address, "smollm2-135m", 5, self.next(), self.onion,
                                  chain_id=CHAIN)

    def renew(self) -> bytes:
        return txs.renew_lease(self.identity, self.next(), chain_id=CHAIN)


class Chain:
    """The application driven block by block, one second of block time per height."""

    def __init__(self, path, lease_s: float = LEASE_S, chain_id: str = CHAIN, **rules) -> None:
        self.app = RegistryApp(path)
        state = json.dumps({"registry": {"lease_s": lease_s, **rules}}).encode()
        self.app.init_chain(chain_id, [ValidatorInfo(VALIDATOR.public_key, 1)], state, T0)
        self.height = 0

    def block(self, *raw: bytes) -> list[int]:
        self.height += 1
        res = self.app.finalize_block(list(raw), BlockContext(self.height, T0 + 1000 * self.height,
                                                              VALIDATOR.public_key, bytes(32)))
        self.app.commit()
        return [r.code for r in res.tx_results]

    def idle(self, seconds: int) -> None:
        for _ in range(seconds):
            self.block()

    def directory(self):
        return registry(self.app)

    def holder_of(self, address: str) -> bytes | None:
        d = self.directory()
        return next((r.node_id for r in d.users + d.models if r.address == address), None)


@pytest.fixture
def chain(tmp_path):
    c = Chain(tmp_path / "app.db")
    yield c
    c.app.close()


# --------------------------------------------------------------------------- one address, one node


def test_a_second_node_cannot_register_or_move_to_a_taken_address(chain):
    """The address hijack: an attacker registers the victim's address with its own certificate,
    so that every node pinning by address would pin the attacker's key. Refused, whatever kind
    of record either of them holds; the victim keeps its address."""
    victim, attacker, model = Node(10), Node(11), Node(12)
    assert chain.block(victim.user("10.0.0.1:7000"), model.model("10.0.0.3:9000")) == [0, 0]
    assert chain.app.check_tx(attacker.user("10.0.0.1:7000")).code == txs.CODE_ADDRESS_TAKEN
    assert chain.block(attacker.user("10.0.0.1:7000"), attacker.model("10.0.0.3:9000")) == \
        [txs.CODE_ADDRESS_TAKEN, txs.CODE_ADDRESS_TAKEN]
    assert chain.holder_of("10.0.0.1:7000") == victim.identity.node_id
    assert chain.holder_of("10.0.0.3:9000") == model.identity.node_id
    # registered elsewhere, the attacker cannot move there by an update either
    assert chain.block(attacker.user("10.0.0.2:7000")) == [0]
    assert chain.block(attacker.user("10.0.0.1:7000", kind="update_user")) == [txs.CODE_ADDRESS_TAKEN]
    refused = chain.app.check_tx(attacker.user("10.0.0.3:9000", kind="update_user"))
    assert refused.code == txs.CODE_ADDRESS_TAKEN and "lease ends" in refused.log
    # one node may keep or change its own address
    assert chain.block(victim.user("10.0.0.1:7000", kind="update_user")) == [0]


def test_client_only_users_register_no_address_and_a_model_node_cannot(chain):
    """A user no member could dial back registers client-only, with no address (user_client/
    node.py): any number of them, since no address is held; a client-only user that becomes
    reachable moves to an address, and back; a model node must be reachable (no empty address)."""
    first, second, model = Node(20), Node(21), Node(22)
    assert chain.block(first.user(""), second.user("")) == [0, 0]
    listed = {u.node_id: u for u in chain.directory().users}
    assert listed[first.identity.node_id].address == "" and not listed[first.identity.node_id].relays
    assert chain.block(first.user("10.0.0.7:7000", kind="update_user")) == [0]
    assert chain.holder_of("10.0.0.7:7000") == first.identity.node_id
    assert chain.block(first.user("", kind="update_user"), second.user("10.0.0.7:7000", kind="update_user")) == [0, 0]
    assert chain.holder_of("10.0.0.7:7000") == second.identity.node_id  # freed by the move to client-only
    with pytest.raises(txs.TxError, match="IP:PORT"):  # refused where it is built, and again by the chain
        model.model("")


def test_an_address_is_free_again_once_its_holder_moves_leaves_or_lapses(chain):
    a, b, c, d = Node(20), Node(21), Node(22), Node(23)
    assert chain.block(a.user("10.0.0.1:1"), b.user("10.0.0.2:1"), c.model("10.0.0.3:1")) == [0, 0, 0]
    assert chain.block(a.user("10.0.0.9:1", kind="update_user"),  # a moves away
                       txs.deregister_user(b.identity, b.next(), chain_id=CHAIN)) == [0, 0]  # b leaves
    assert chain.block(d.user("10.0.0.1:1"), d.model("10.0.0.2:1")) == [0, 0]
    chain.idle(LEASE_S)  # c never renews: its lease ends, and so does d's and a's
    assert chain.holder_of("10.0.0.3:1") is None
    assert chain.block(Node(24).model("10.0.0.3:1")) == [0]


def test_every_tx_is_bound_to_its_chain(chain, tmp_path):
    """A transaction signed for another committee (a test network, say) is refused here, and
    changes nothing; the same node's tx for this chain is accepted."""
    node = Node(30)
    foreign = node.user("10.0.0.1:7000", chain="other-net")
    res = chain.app.check_tx(foreign)
    assert res.code == txs.CODE_WRONG_CHAIN and "other-net" in res.log
    assert chain.block(foreign) == [txs.CODE_WRONG_CHAIN]
    assert chain.directory().users == ()
    other = Chain(tmp_path / "other.db", chain_id="other-net")
    assert other.block(foreign) == [0]  # where it was meant to go
    other.app.close()
    assert chain.block(node.user("10.0.0.1:7000")) == [0]
    with pytest.raises(txs.TxError):
        txs.register_user(node.identity, "10.0.0.1:7000", node.onion, "eu", 99, chain_id="")


# --------------------------------------------------------------------------- leases


def test_a_registration_lapses_one_lease_after_its_last_renewal(chain):
    stays, lapses, model = Node(40), Node(41), Node(42)
    assert chain.block(stays.user("10.0.0.1:1"), lapses.user("10.0.0.2:1"), model.model("10.0.0.3:1")) == [0, 0, 0]
    registered_at = T0 + 1000 * chain.height
    lease = json.loads(chain.app.query(f"/account/{stays.identity.public_key.hex()}").value)["lease_expires_ms"]
    assert lease == registered_at + LEASE_S * 1000
    for _ in range(3):
        chain.idle(LEASE_S // 2)
        assert chain.block(stays.renew(), model.renew()) == [0, 0]
    d = chain.directory()
    assert d.user(lapses.identity.node_id) is None  # gone once block time passed its expiry
    assert d.user(stays.identity.node_id) is not None and d.model(model.identity.node_id) is not None
    assert d.model(model.identity.node_id).reputation == 1.0  # a renewal keeps the committee's standing
    chain.idle(LEASE_S)
    d = chain.directory()
    assert d.users == () and d.models == ()
    assert chain.block(lapses.renew()) == [txs.CODE_NOT_REGISTERED]  # nothing left to renew
    assert chain.block(lapses.user("10.0.0.2:1")) == [0]  # it may register again


def test_a_lease_ends_exactly_at_its_expiry(chain):
    node = Node(50)
    chain.block(node.user("10.0.0.1:1"))
    chain.idle(LEASE_S - 1)
    assert chain.directory().user(node.identity.node_id) is not None
    chain.idle(1)
    assert chain.directory().user(node.identity.node_id) is None


def test_the_lease_comes_from_the_genesis_within_bounds():
    assert lease_ms_of({}) == 7_200_000 and lease_ms_of({"registry": {"lease_s": 30}}) == 30_000
    for bad in ({"registry": {"lease_s": 0}}, {"registry": {"lease_s": "60"}}, {"registry": {"lease": 60}},
                {"registry": {"lease_s": 10**9}}, {"registry": []}):
        with pytest.raises(GenesisError):
            lease_ms_of(bad)
    v = GenesisValidator("v0", VALIDATOR.public_key, 1, "127.0.0.1:1", make_self_signed(VALIDATOR).cert_pem)
    with pytest.raises(GenesisError):
        Genesis(CHAIN, T0, (v,), {"registry": {"lease_s": 1}})
    assert Genesis(CHAIN, T0, (v,), {"registry": {"lease_s": 60}}).lease_ms == 60_000


# --------------------------------------------------------------------------- addresses nobody can dial


@pytest.mark.parametrize("address", ["0.0.0.0:50071", "[::]:50071", "224.0.0.1:50071", "255.255.255.255:1",
                                     "0.1.2.3:80"])
def test_an_unroutable_address_is_never_registered(chain, address):
    node = Node(60)
    with pytest.raises(txs.TxError, match="cannot be dialled"):
        node.user(address)
    with pytest.raises(txs.TxError, match="--advertise"):
        txs.check_listen(address, None)
    txs.check_listen(address, "203.0.113.7:50071")  # listening there is fine with --advertise


# --------------------------------------------------------------------------- Sybils cost something


def _sybil(i: int, address: str, pow_nonce: int = 0, seq: int = 1) -> bytes:
    ident = Identity.from_seed((7_000_000 + i).to_bytes(8, "big") * 4)
    return txs.register_user(ident, address, OnionKey.generate().public_key, "eu", seq, chain_id=CHAIN,
                             pow_nonce=pow_nonce)


def test_a_registration_without_its_proof_of_work_is_refused_and_costs_one_attempt(tmp_path):
    """The genesis sets the work (bits of Argon2id hashcash over the chain id and the key): a
    registration with a wrong nonce is refused (a flood of them costs the committee one small
    attempt each), the right nonce for another key or another chain does not count, and an
    update or renewal of a registered node needs none."""
    from gentorrent.ledger import pow as pow_rule

    chain = Chain(tmp_path / "pow.db", pow_bits=6, pow_memory_kib=64)
    params = pow_rule.PowParams(6, 64)
    honest = Node(80)
    nonce = pow_rule.solve(params, CHAIN, honest.identity.public_key)
    assert pow_rule.verify(params, CHAIN, honest.identity.public_key, nonce)
    assert not pow_rule.verify(params, "another-net", honest.identity.public_key, nonce) or nonce == 0
    flood = [_sybil(i, f"10.1.{i // 200}.{i % 200 + 1}:7000", pow_nonce=nonce) for i in range(40)]
    lucky = [pow_rule.verify(params, CHAIN, txs.decode_tx(t, CHAIN).signer, nonce) for t in flood]
    assert chain.block(*flood) == [0 if ok else txs.CODE_BAD_POW for ok in lucky]  # another key's nonce
    assert sum(lucky) <= 4  # 1 in 2^6 by chance
    bare = txs.register_user(honest.identity, "10.0.0.1:1", honest.onion, "eu", honest.next(), chain_id=CHAIN)
    assert chain.block(bare) == [txs.CODE_BAD_POW] or pow_rule.verify(params, CHAIN, honest.identity.public_key, 0)
    good = txs.register_user(honest.identity, "10.0.0.1:1", honest.onion, "eu", honest.next(), chain_id=CHAIN,
                             pow_nonce=nonce)
    assert chain.block(good) == [0]
    assert chain.block(honest.user("10.0.0.2:1", kind="update_user"), honest.renew()) == [0, 0]
    chain.app.close()


def test_relays_per_network_are_capped_on_distinct_loopback_networks(tmp_path):
    """127.0.0.0/8 is all local on Linux: distinct /24s without namespaces. The genesis caps relays
    per /24 (and /48): the third relay of 127.0.5.0/24 is refused, one in 127.0.6.0/24 is not, a
    relay that leaves frees its place, and moving within its /24 is no new relay."""
    chain = Chain(tmp_path / "caps.db", relays_per_24=2, relays_per_48=1)
    codes = chain.block(_sybil(1, "127.0.5.1:7000"), _sybil(2, "127.0.5.2:7000"), _sybil(3, "127.0.5.3:7000"),
                        _sybil(4, "127.0.6.1:7000"), _sybil(5, "[2001:db8:1::1]:7000"),
                        _sybil(6, "[2001:db8:1:2::1]:7000"), _sybil(7, "[2001:db8:2::1]:7000"))
    assert codes == [0, 0, txs.CODE_PREFIX_FULL, 0, 0, txs.CODE_PREFIX_FULL, 0]
    first = Identity.from_seed((7_000_000 + 1).to_bytes(8, "big") * 4)
    assert chain.block(txs.update_user(first, "127.0.5.9:7000", OnionKey.generate().public_key, "eu", 2,
                                       chain_id=CHAIN)) == [0]  # same /24: still two
    assert chain.block(txs.deregister_user(first, 3, chain_id=CHAIN)) == [0]
    assert chain.block(_sybil(3, "127.0.5.3:7000", seq=2)) == [0]  # its place is free again
    chain.app.close()
    reopened = RegistryApp(tmp_path / "caps.db")  # the index is rebuilt from the records
    assert reopened.check_tx(_sybil(8, "127.0.5.8:7000")).code == txs.CODE_PREFIX_FULL
    reopened.close()


def test_a_block_carries_at_most_the_genesis_registrations_and_the_cache_never_changes_a_result(tmp_path):
    """What a Byzantine proposer can do with transactions no member's CheckTx saw: make every
    member verify them in full. The genesis bounds the expensive ones per block; the rest wait
    for the next block. The verified cache only saves work: the same block gives the same results
    and app hash on a node that checked its transactions before and on one that never saw them."""
    regs = [_sybil(i, f"10.2.0.{i + 1}:7000") for i in range(5)]
    warm, cold = (Chain(tmp_path / f"{n}.db", registrations_per_block=3) for n in ("warm", "cold"))
    assert all(warm.app.check_tx(t).code == 0 for t in regs)
    results = []
    for c in (warm, cold):
        res = c.app.finalize_block(regs, BlockContext(1, T0 + 1000, VALIDATOR.public_key, bytes(32)))
        c.app.commit()
        results.append(([r.code for r in res.tx_results], res.app_hash))
    assert results[0] == results[1] and results[0][0] == [0, 0, 0, txs.CODE_BLOCK_FULL, txs.CODE_BLOCK_FULL]
    assert warm.app._verified.hits >= 3 and cold.app._verified.hits == 0
    for c in (warm, cold):
        c.app.close()
