"""Pure cores of the overlay: path table, replay windows, sealing, clove reassembly, relay choice.
(The attacks these cores defend against are in tests/test_overlay_attacks.py.)"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from gentorrent.config import OverlayParams
from gentorrent.crypto import sida
from gentorrent.crypto.keys import OnionKey
from gentorrent.overlay import sealing
from gentorrent.crypto import onion
from gentorrent.overlay.pathtable import Drop, DropReason, HopEntry, PathTable, RecentSet, SeqWindow
from gentorrent.overlay.reassembly import AskBook, CloveGroups
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.ledger.directory import StaticDirectory
from gentorrent.ledger.sections import UserRecord
from user_client.paths import NotEnoughRelays, PathPool, ProxyPath, choose_relays


def _entry(i: int, peer: str = "p", now: float = 0.0, successor: str | None = "s") -> HopEntry:
    return HopEntry(bytes([i]) * 16, bytes([i + 100]) * 16, peer, successor, bytes([i]) * 32, now, now)


def test_path_table_routes_both_ways_and_counts_use():
    table = PathTable(OverlayParams(), idle_expiry_s=10)
    e = _entry(1)
    table.add(e)
    assert table.forward_entry(e.link_in, "p", 1.0) is e
    assert (e.forwarded, e.last_used) == (0, 0.0)  # found, not counted: it may still fail its MAC
    table.used(e, 1.0, forward=True)
    assert table.return_entry(e.link_out, "s", False, 2.0) is e
    table.used(e, 2.0, forward=False)
    assert (e.forwarded, e.returned, e.last_used) == (1, 1, 2.0)
    with pytest.raises(Drop) as err:
        table.forward_entry(e.link_out, "p", 3.0)  # an outgoing ID is not valid inbound
    assert err.value.reason is DropReason.UNKNOWN_LINK


def test_a_link_id_is_only_valid_from_the_neighbour_it_belongs_to():
    table = PathTable(OverlayParams(), idle_expiry_s=10)
    e, proxy = _entry(1), _entry(2, successor=None)
    table.add(e)
    table.add(proxy)
    for bad in (lambda: table.forward_entry(e.link_in, "someone else", 1.0),
                lambda: table.return_entry(e.link_out, "p", False, 1.0),  # the predecessor, not the successor
                lambda: table.return_entry(e.link_out, "s", True, 1.0),  # a model node on a relay's link
                lambda: table.return_entry(onion.reply_link(proxy.hop_key, 0), "m", False, 1.0)):  # a relay on a reply link
        with pytest.raises(Drop) as err:
            bad()
        assert err.value.reason is DropReason.UNKNOWN_LINK
    assert (e.forwarded, e.returned, proxy.returned) == (0, 0, 0)


def test_a_proxy_accepts_fresh_reply_links_in_a_sliding_window():
    params = OverlayParams(reply_link_window=8)
    table = PathTable(params, idle_expiry_s=100)
    proxy = _entry(3, successor=None)
    table.add(proxy)
    with pytest.raises(Drop):
        table.return_entry(proxy.link_out, "m", True, 1.0)  # the onion's link_out is not a reply link
    for j in (0, 3, 7):
        assert table.return_entry(onion.reply_link(proxy.hop_key, j), "m", True, 1.0) is proxy
    assert table.return_entry(onion.reply_link(proxy.hop_key, 10), "m", True, 1.0) is proxy  # window slid
    with pytest.raises(Drop):
        table.return_entry(onion.reply_link(proxy.hop_key, 1), "m", True, 1.0)  # fell out of it
    assert table.return_entry(onion.reply_link(proxy.hop_key, 13), "m", True, 1.0) is proxy
    table.remove(proxy)
    assert not table._by_out  # every reply link went with the entry


def test_path_table_refuses_duplicates_and_enforces_limits_without_change():
    table = PathTable(OverlayParams(max_paths=3, max_paths_per_peer=2), idle_expiry_s=10)
    table.add(_entry(1, "a"))
    table.add(_entry(2, "a"))
    with pytest.raises(Drop) as err:
        table.add(_entry(3, "a"))
    assert err.value.reason is DropReason.PEER_LIMIT
    with pytest.raises(Drop) as err:
        table.add(_entry(1, "b"))
    assert err.value.reason is DropReason.DUPLICATE_LINK
    table.add(_entry(4, "b"))
    with pytest.raises(Drop) as err:
        table.add(_entry(5, "c"))
    assert err.value.reason is DropReason.TABLE_FULL
    assert len(table) == 3 and table.stats()["peers"] == 2


def test_idle_paths_expire_and_free_the_peer_quota():
    table = PathTable(OverlayParams(max_paths_per_peer=1), idle_expiry_s=10)
    table.add(_entry(1, "a", now=0))
    table.add(_entry(2, "b", now=0))
    table.used(table.forward_entry(bytes([2]) * 16, "b", 8.0), 8.0, forward=True)
    assert [e.predecessor for e in table.expire(12.0)] == ["a"]
    table.add(_entry(3, "a", now=12))  # quota of "a" is free again
    with pytest.raises(Drop) as err:
        table.forward_entry(bytes([2]) * 16, "b", 30.0)
    assert err.value.reason is DropReason.EXPIRED and len(table) == 1


def test_a_used_single_use_path_is_forgotten_after_its_linger_and_an_unused_one_keeps_the_full_expiry():
    """The onion's linger applies once a clove has passed: a used single-use path frees its
    predecessor's quota a minute after its ask, a ready one waits for its ask as long as any
    path, and a linger longer than the relay's own expiry cannot keep a path longer."""
    table = PathTable(OverlayParams(), idle_expiry_s=1800)
    used, ready, greedy = (replace(_entry(i, "u"), linger_s=linger) for i, linger in ((1, 60), (2, 60), (3, 10**6)))
    for entry in (used, ready, greedy):
        table.add(entry)
    table.used(table.forward_entry(used.link_in, "u", 5.0), 5.0, forward=True)
    table.used(table.forward_entry(greedy.link_in, "u", 5.0), 5.0, forward=True)
    assert table.expire(64.0) == [] and table.expire(66.0) == [used]
    with pytest.raises(Drop) as err:
        table.forward_entry(used.link_in, "u", 66.0)
    assert err.value.reason is DropReason.UNKNOWN_LINK
    assert table.expire(1800.0) == [] and table.expire(1806.0) == [ready, greedy] and len(table) == 0


def test_sequence_window_refuses_repeats_and_old_numbers_and_tolerates_reordering():
    w = SeqWindow(size=8)
    for seq in (100, 102, 101, 105):
        w.check_and_add(seq)
    for replay in (100, 101, 105, 97):  # seen, seen, seen, older than the window
        with pytest.raises(Drop) as err:
            w.check_and_add(replay)
        assert err.value.reason is DropReason.REPLAY
    w.check_and_add(99)  # not seen, still inside the window
    w.check_and_add(1000)  # a jump clears the bitmap
    with pytest.raises(Drop):
        w.check_and_add(105)
    r = RecentSet(capacity=2)
    r.check_and_add(b"a")
    with pytest.raises(Drop):
        r.check_and_add(b"a")


@settings(max_examples=30, deadline=None)
@given(st.binary(max_size=3000), st.integers(min_value=16, max_value=1024))
def test_padding_round_trips_to_size_classes(data, minimum):
    padded = sealing.pad(data, minimum)
    assert len(padded) > len(data) and len(padded) == sealing.size_class(len(data) + 1, minimum)
    assert len(padded) == minimum or len(padded) & (len(padded) - 1) == 0  # the minimum or a power of two
    assert len(padded) <= max(minimum, 2 * len(data) + 1)  # never more than about twice the size
    assert sealing.unpad(padded) == data


def _query(k: int = 3, routes: int = 4, prompt: str = "hi") -> pb.OverlayQuery:
    return pb.OverlayQuery(request=pb.GenerateRequest(model="m", prompt=prompt), reply_key=b"r" * 32, k=k,
                           routes=[pb.ReplyRoute(proxy=bytes([i + 1]) * 32, link_id=bytes([i]) * 16)
                                   for i in range(routes)])


def test_an_ask_opens_only_with_the_model_key_once_and_validates():
    model, other = OnionKey.generate(), OnionKey.generate()
    sealed = sealing.seal_ask(model.public_key, _query(), 4, 3)
    secret, n, k = sealing.open_box(model.private_key, sealed.envelopes[2])
    assert (n, k) == (4, 3)
    tags = sealing.clove_tags(secret, n)
    assert [sealing.envelope_tag(e) for e in sealed.envelopes] == tags  # later cloves: found by tag
    opened = [sealing.open_envelope(secret, i, e) for i, e in enumerate(sealed.envelopes)]
    assert [t for _, t in opened] == sealed.tokens
    assert sealing.open_query(sida.combine([c for c, _ in opened[:3]])) == _query()
    with pytest.raises(sealing.SealError):
        sealing.open_box(other.private_key, sealed.envelopes[0])
    with pytest.raises(sealing.SealError):
        sealing.open_envelope(secret, 1, sealed.envelopes[0])  # another index: another key
    for bad in (_query(k=5), _query(routes=5)):  # k above the routes; more routes than n = 4
        with pytest.raises(sealing.SealError):
            sealing.open_query(sealing.pad(bad.SerializeToString(), 64))


def test_envelopes_of_one_ask_share_no_bytes():
    model = OnionKey.generate()
    envelopes = sealing.seal_ask(model.public_key, _query(prompt="q" * 700), 4, 3).envelopes
    assert len({len(e) for e in envelopes}) == 1
    for i in range(4):
        for j in range(i + 1, 4):
            assert _longest_common(envelopes[i], envelopes[j]) <= 8


def test_reply_cloves_have_distinct_tags_and_open_per_index():
    key = b"K" * 32
    reply = pb.OverlayReply(seq=3, chunk=pb.GenerateChunk(text="answer", final=True), delivered=[b"t" * 16])
    blobs = sealing.ReplySealer(key, 4).cloves(reply, 3)
    assert len({b[:16] for b in blobs}) == 4 and len({len(b) for b in blobs}) == 1
    assert blobs[2][:16] == sealing.reply_tag(key, 2, 3)
    opener = sealing.ReplyOpener(key, 4)
    assert [opener.tags.read(b[:16]) for b in blobs] == [(i, 3) for i in range(4)]
    assert sealing.TagReader(b"k" * 32).read(blobs[0][:16]) is None  # another request's tag
    opened = [opener.clove(i, b) for i, b in enumerate(blobs)]
    assert opener.message(3, sida.combine(opened[1:])) == reply
    with pytest.raises(sealing.SealError):
        opener.clove(1, blobs[2])  # wrong index: wrong key
    with pytest.raises(sealing.SealError):
        opener.message(4, sida.combine(opened))  # replayed under another seq
    report = sealing.ReplySealer(key, 4).delivery_report(1, 0, [b"t" * 16], 3)
    hit = opener.tags.read(report[:16])
    assert hit == (1, sealing.DELIVERY_SEQ) and opener.report(1, hit[1], report) == [b"t" * 16]


def test_ask_book_finds_asks_by_tag_refuses_replays_and_forgets_after_grace():
    book = AskBook(max_asks=2, timeout_s=10, seen_s=100, grace_s=1)
    ask = book.add(b"s" * 32, 4, 3, [b"a" * 16, b"b" * 16], now=0)
    assert book.lookup(b"b" * 16) == (ask, 1) and book.lookup(b"c" * 16) is None
    with pytest.raises(Drop) as err:
        book.add(b"s" * 32, 4, 3, [b"a" * 16], now=0)
    assert err.value.reason is DropReason.REPLAY
    book.add(b"t" * 32, 4, 3, [b"x" * 16], now=0)
    with pytest.raises(Drop) as err:
        book.add(b"u" * 32, 4, 3, [b"y" * 16], now=0)
    assert err.value.reason is DropReason.BUSY
    ask.decoded = True
    book.replied(ask, now=1)
    book.expire(now=3)  # past the grace: forgotten, and its tags with it ...
    assert book.lookup(b"a" * 16) is None and len(book) == 1
    with pytest.raises(Drop) as err:  # ... but its secret is not: its cloves cannot be served again
        book.add(b"s" * 32, 4, 3, [b"a" * 16], now=50)
    assert err.value.reason is DropReason.REPLAY
    book.add(b"s" * 32, 4, 3, [b"a" * 16], now=200)  # long after (the query's own time refuses it then)


def test_clove_groups_decode_at_k_skip_corruption_and_drop_late():
    groups = CloveGroups(k=3, max_groups=2, timeout_s=5, max_cloves=4)
    cloves = sida.split(b"message", 4, 3)
    bad = cloves[0][:-1] + bytes([cloves[0][-1] ^ 1])
    assert groups.add("a", bad, 0) is None
    assert groups.add("a", cloves[1], 0) is None
    assert groups.add("a", cloves[2], 0) is None  # 3 cloves, one corrupted: not yet
    assert groups.add("a", cloves[3], 0) == b"message"
    with pytest.raises(Drop) as err:
        groups.add("a", cloves[0], 0)
    assert err.value.reason is DropReason.LATE
    groups.add("b", cloves[0], 0)
    groups.add("c", cloves[0], 0)
    with pytest.raises(Drop) as err:
        groups.add("d", cloves[0], 0)
    assert err.value.reason is DropReason.BUSY
    assert groups.expire(10) == 2 and len(groups) == 0


def _user(i: int, region: str = "eu") -> UserRecord:
    return UserRecord(bytes.fromhex(f"{i:064x}"), b"p" * 32, f"127.0.0.1:{1000 + i}", b"o" * 32, region)


def test_relays_same_region_never_self_least_used_first():
    users = [_user(i) for i in range(6)] + [_user(10 + i, "us") for i in range(5)]
    rng = random.Random(1)
    usage = Counter({u.address: 5 for u in users[:2]})
    for _ in range(20):
        chosen = choose_relays(users, users[5].node_id_hex, "eu", 3, rng, usage)
        addresses = {u.address for u in chosen}
        assert len(addresses) == 3
        assert all(u.region == "eu" for u in chosen) and users[5] not in chosen
        assert not addresses & {users[0].address, users[1].address}  # 3 unused relays exist
    with pytest.raises(NotEnoughRelays):
        choose_relays(users[:3], users[0].node_id_hex, "eu", 3, rng)


def test_a_path_never_takes_two_relays_of_one_ipv4_16_or_ipv6_32():
    """Path selection by network prefix (the genesis' distinct_path_prefixes): an operator who
    registers many relays in one /16 (as many /24s as the per-/24 cap asks) still holds at most
    one hop of any path; 127.x.y.z addresses are distinct /16s on one Linux machine."""
    import dataclasses

    sybils = [dataclasses.replace(_user(100 + i), address=f"127.9.{i}.1:7000") for i in range(30)]
    honest = [dataclasses.replace(_user(200 + i), address=a) for i, a in enumerate(
        ["127.10.0.1:7000", "127.11.0.1:7000", "[2001:db8:1::1]:7000", "[2001:db8:1::2]:7000", "[2001:db9::1]:7000"])]
    rng = random.Random(3)
    from gentorrent.ledger.addresses import path_prefix

    for _ in range(200):
        chosen = choose_relays(sybils + honest, "", "eu", 3, rng, distinct_prefixes=True)
        prefixes = [path_prefix(u.address) for u in chosen]
        assert len(set(prefixes)) == 3, prefixes
    assert path_prefix("[2001:db8:1::1]:7000") == path_prefix("[2001:db8:1::2]:7000") == "2001:db8::/32"
    with pytest.raises(NotEnoughRelays, match="networks"):
        choose_relays(sybils, "", "eu", 2, rng, distinct_prefixes=True)
    assert len(choose_relays(sybils, "", "eu", 3, rng)) == 3  # the devnet's genesis: one /16 is fine


def test_path_pool_renews_failed_and_old_paths_and_picks_distinct_proxies():
    pool = PathPool(keep=3, renewal_s=100)

    class _S:
        first_link = b"x"

    paths = [ProxyPath(i, ("a", "b", proxy), ("A", "B", proxy.upper()), _S(), built_at=0)
             for i, proxy in enumerate(["p", "p", "q"])]
    for p in paths:
        pool.add(p)
    assert pool.missing(50) == 0
    picked = pool.pick(2, 50, random.Random(0))
    assert {p.proxy for p in picked} == {"p", "q"}
    paths[0].failed = True
    assert pool.missing(50) == 1 and pool.stale(50) == [paths[0]]
    assert sorted(p.path_id for p in pool.stale(150)) == [0, 1, 2]


def test_a_single_use_pool_never_hands_one_path_to_two_asks():
    """A verifier's probing user node: every challenge leaves over paths of its own, so the
    relays and proxies cannot link two challenges of an epoch by the path they share."""
    class _S:
        first_link = b"x"

    def pool_of(single_use: bool) -> PathPool:
        pool = PathPool(keep=4, renewal_s=100, single_use=single_use)
        for i, proxy in enumerate("pqrs"):
            pool.add(ProxyPath(i, ("a", "b", proxy), ("A", "B", proxy.upper()), _S(), built_at=0))
        return pool

    shared = pool_of(False)  # an ordinary user reuses its paths (until they are renewed)
    assert {p.path_id for p in shared.pick(4, 50, random.Random(0))} == \
        {p.path_id for p in shared.pick(4, 50, random.Random(1))}
    single = pool_of(True)
    first, second = single.pick(2, 50, random.Random(0)), single.pick(2, 50, random.Random(0))
    assert len(first) == len(second) == 2 and not {p.path_id for p in first} & {p.path_id for p in second}
    assert single.pick(1, 50, random.Random(0)) == [] and single.missing(50) == 4  # the manager builds new ones


def _longest_common(a: bytes, b: bytes) -> int:
    """Length of the longest common substring, bounded search (9 is enough to fail)."""
    grams = {a[i:i + 9] for i in range(len(a) - 8)}
    return 9 if any(b[i:i + 9] in grams for i in range(len(b) - 8)) else 8


async def test_intake_opens_one_box_per_ask_drops_bad_cloves_and_serves_a_good_query(tmp_path):
    from model_node.intake import CloveIntake

    served = []

    async def generate(request):
        served.append(request.prompt)
        if False:
            yield None

    model = OnionKey.generate()
    intake = CloveIntake("ab" * 32, model, generate, StaticDirectory(tmp_path / "none.json"))
    query = _query(prompt="hello")
    query.issued_s = int(intake.wall_clock())
    sealed = sealing.seal_ask(model.public_key, query, 4, 3)
    e = sealed.envelopes
    for envelope in (e[0], e[1], e[1], e[2], e[3]):  # the second e[1] is a replay
        intake.submit(envelope)
    assert intake.public_key_ops == 1  # one X25519 for the whole ask: later cloves are found by tag
    other = OnionKey.generate()
    intake.submit(sealing.seal_ask(other.public_key, query, 4, 3).envelopes[0])  # sealed to another node
    stale = _query(prompt="old")
    stale.issued_s = int(intake.wall_clock()) - 3600
    for envelope in sealing.seal_ask(model.public_key, stale, 4, 3).envelopes[:3]:
        intake.submit(envelope)
    intake.submit(bytes(3 * 1024 * 1024))
    for _ in range(20):
        await asyncio.sleep(0)  # let the serving task run (and the directory refresh it shares)
    await intake.close()
    assert served == ["hello"]
    # the routes name no registered proxy here: the answer and the stale-query error (4 + 4) go nowhere
    assert intake.drops.as_dict() == {"bad_seal": 1, "late": 1, "oversize": 1, "replay": 1, "stale": 1,
                                      "unknown_peer": 8}


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=700), st.integers(0, 3))
def test_envelope_and_reply_decoders_raise_only_seal_errors(blob, index):
    """Hostile bytes at the model node's and the user's decoders: a SealError, nothing else."""
    model = _MODEL_KEY
    opener = sealing.ReplyOpener(b"K" * 32, 4)
    for decode in (lambda: sealing.open_box(model.private_key, blob), lambda: sealing.envelope_tag(blob),
                   lambda: sealing.open_envelope(b"s" * 32, index, blob), lambda: sealing.open_query(blob),
                   lambda: opener.clove(index, blob), lambda: opener.message(index, blob),
                   lambda: opener.report(index, sealing.DELIVERY_SEQ, blob)):
        try:
            decode()
        except sealing.SealError:
            pass


_MODEL_KEY = OnionKey.generate()
