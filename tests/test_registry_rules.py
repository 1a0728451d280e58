"""The registry's rules against an attacker who only signs transactions (the real RegistryApp):
one address, one node; every transaction bound to its chain; registrations are leases."""

from __future__ import annotations

import json

import pytest

from gentorrent.crypto.keys import Identity, OnionKey
from gentorrent.crypto.tls import make_self_signed
from gentorrent.ledger import txs
from gentorrent.ledger.genesis import Genesis, GenesisError, GenesisValidator, lease_ms_of
from gentorrent.ledger.sections import (DirectoryFormatError, UserRecord, decode_directory, encode_directory,
                                        encode_users, section_hash)
from verifier.abci.app import RegistryApp
from verifier.abci.interface import BlockContext, ValidatorInfo

CHAIN = "registry-test"
T0 = 1_700_000_000_000
LEASE_S = 10
VALIDATOR = Identity.from_seed(bytes([1]) * 32)


class Node:
    def __init__(self, seed: int) -> None:
        self.identity = Identity.from_seed(bytes([seed]) * 32)
        self.cert = make_self_signed(self.identity).cert_pem
        self.onion = OnionKey.generate().public_key
        self.seq = 0

    def next(self) -> int:
        self.seq += 1
        return self.seq

    def user(self, address: str, chain: str = CHAIN, kind: str = "register_user") -> bytes:
        return getattr(txs, kind)(self.identity, address, self.onion, self.cert, "eu", self.next(), chain_id=chain)

    def model(self, address: str, kind: str = "register_model") -> bytes:
        return getattr(txs, kind)(self.identity, address, "smollm2-135m", 5, self.cert, self.next(), self.onion,
                                  chain_id=CHAIN)

    def renew(self) -> bytes:
        return txs.renew_lease(self.identity, self.next(), chain_id=CHAIN)


class Chain:
    """The application driven block by block, one second of block time per height."""

    def __init__(self, path, lease_s: float = LEASE_S, chain_id: str = CHAIN) -> None:
        self.app = RegistryApp(path)
        state = json.dumps({"registry": {"lease_s": lease_s}}).encode()
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
        return decode_directory(self.app.query("/directory").value)

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
        txs.register_user(node.identity, "10.0.0.1:7000", node.onion, node.cert, "eu", 99, chain_id="")


# --------------------------------------------------------------------------- leases


def test_a_registration_lapses_one_lease_after_its_last_renewal(chain):
    stays, lapses, model = Node(40), Node(41), Node(42)
    assert chain.block(stays.user("10.0.0.1:1"), lapses.user("10.0.0.2:1"), model.model("10.0.0.3:1")) == [0, 0, 0]
    registered_at = T0 + 1000 * chain.height
    assert chain.directory().user(stays.identity.node_id).expires_ms == registered_at + LEASE_S * 1000
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
    assert lease_ms_of({}) == 300_000 and lease_ms_of({"registry": {"lease_s": 30}}) == 30_000
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
    txs.check_listen(address, "node.example.org:50071")  # listening there is fine with --advertise


def test_a_directory_listing_one_address_twice_is_refused():
    """Defence in depth on the client: a directory value is refused if two records share an
    address, whoever certified it."""
    a, b = Node(70), Node(71)
    records = sorted((UserRecord(n.identity.node_id, n.identity.public_key, "10.0.0.1:1", n.onion, n.cert)
                      for n in (a, b)), key=lambda r: r.node_id)
    users = encode_users(records)
    value = encode_directory(1, users, b"", section_hash(b""), section_hash(b""))
    with pytest.raises(DirectoryFormatError, match="listed for two nodes"):
        decode_directory(value)
