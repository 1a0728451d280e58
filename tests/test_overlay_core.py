"""Pure cores of the overlay: path table, replay filter, sealing, clove reassembly, relay choice."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from gentorrent.config import OverlayParams
from gentorrent.crypto import sida
from gentorrent.crypto.keys import OnionKey
from gentorrent.overlay import sealing
from gentorrent.overlay.pathtable import Drop, DropReason, HopEntry, PathTable, ReplayFilter
from gentorrent.overlay.reassembly import CloveGroups
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.ledger.directory import StaticDirectory
from gentorrent.ledger.sections import UserRecord
from user_client.paths import NotEnoughRelays, PathPool, ProxyPath, choose_relays


def _entry(i: int, peer: str = "p", now: float = 0.0, successor: str | None = "s") -> HopEntry:
    return HopEntry(bytes([i]) * 16, bytes([i + 100]) * 16, peer, successor, b"k" * 32, now, now)


def test_path_table_routes_both_ways_and_counts_use():
    table = PathTable(OverlayParams(), idle_expiry_s=10)
    e = _entry(1)
    table.add(e)
    assert table.forward_entry(e.link_in, 1.0) is e
    assert table.return_entry(e.link_out, 2.0) is e
    assert (e.forwarded, e.returned, e.last_used) == (1, 1, 2.0)
    with pytest.raises(Drop) as err:
        table.forward_entry(e.link_out, 3.0)  # an outgoing ID is not valid inbound
    assert err.value.reason is DropReason.UNKNOWN_LINK


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
    table.forward_entry(bytes([2]) * 16, 8.0)
    assert [e.predecessor for e in table.expire(12.0)] == ["a"]
    table.add(_entry(3, "a", now=12))  # quota of "a" is free again
    with pytest.raises(Drop) as err:
        table.forward_entry(bytes([2]) * 16, 30.0)
    assert err.value.reason is DropReason.EXPIRED and len(table) == 1


def test_replay_filter_is_per_link_and_bounded():
    f = ReplayFilter(capacity=2)
    f.check_and_add(b"L1", b"x")
    f.check_and_add(b"L2", b"x")
    with pytest.raises(Drop):
        f.check_and_add(b"L1", b"x")
    f.check_and_add(b"L3", b"y")  # evicts the oldest
    f.check_and_add(b"L1", b"x")


@settings(max_examples=30, deadline=None)
@given(st.binary(max_size=3000), st.integers(min_value=16, max_value=1024))
def test_padding_round_trips_to_bucket_multiples(data, bucket):
    padded = sealing.pad(data, bucket)
    assert len(padded) % bucket == 0 and len(padded) > len(data)
    assert sealing.unpad(padded) == data


def test_query_seal_opens_only_with_the_model_key_and_validates():
    model, other = OnionKey.generate(), OnionKey.generate()
    query = pb.OverlayQuery(request=pb.GenerateRequest(model="m", prompt="hi"), reply_key=b"r" * 32, k=1,
                            routes=[pb.ReplyRoute(proxy_address="127.0.0.1:1", link_id=b"l" * 16)])
    sealed = sealing.seal_query(model.public_key, query)
    assert sealing.open_query(model.private_key, sealed) == query
    with pytest.raises(sealing.SealError):
        sealing.open_query(other.private_key, sealed)
    bad = pb.OverlayQuery()
    bad.CopyFrom(query)
    bad.k = 2  # more than the routes
    with pytest.raises(sealing.SealError):
        sealing.open_query(model.private_key, sealing.seal_query(model.public_key, bad))


def test_clove_seals_carry_the_group_but_share_no_bytes():
    model = OnionKey.generate()
    group = b"g" * 16
    cloves = sida.split(b"q" * 700, 4, 3)
    tokens = [bytes([i]) * sealing.TOKEN_BYTES for i in range(len(cloves))]
    envelopes = [sealing.seal_clove(model.public_key, group, c, t) for c, t in zip(cloves, tokens)]
    assert [sealing.open_clove(model.private_key, e) for e in envelopes] == [(group, c, t) for c, t in zip(cloves, tokens)]
    for i in range(4):
        for j in range(i + 1, 4):
            assert _longest_common(envelopes[i], envelopes[j]) <= 8


def test_reply_cloves_have_distinct_tags_and_open_per_index():
    key = b"K" * 32
    reply = pb.OverlayReply(seq=3, chunk=pb.GenerateChunk(text="answer", final=True))
    cloves = sida.split(sealing.seal_reply(key, reply), 4, 3)
    blobs = [sealing.seal_reply_clove(key, i, 3, c) for i, c in enumerate(cloves)]
    assert len({b[:16] for b in blobs}) == 4
    assert blobs[2][:16] == sealing.reply_tag(key, 2, 3)
    reader = sealing.TagReader(key)
    assert [reader.read(b[:16]) for b in blobs] == [(i, 3) for i in range(4)]
    assert sealing.TagReader(b"k" * 32).read(blobs[0][:16]) is None  # another request's tag
    opened = [sealing.open_reply_clove(key, i, 3, b) for i, b in enumerate(blobs)]
    assert sealing.open_reply(key, 3, sida.combine(opened[1:])) == reply
    with pytest.raises(sealing.SealError):
        sealing.open_reply_clove(key, 1, 3, blobs[2])  # wrong index: wrong key
    with pytest.raises(sealing.SealError):
        sealing.open_reply(key, 4, sida.combine(opened))  # replayed under another seq


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
    return UserRecord(bytes.fromhex(f"{i:064x}"), b"p" * 32, f"127.0.0.1:{1000 + i}", b"o" * 32, b"cert", region)


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


def test_path_pool_renews_failed_and_old_paths_and_picks_distinct_proxies():
    pool = PathPool(keep=3, renewal_s=100)

    class _S:
        first_link = b"x"
        reply_link = b"y"

    paths = [ProxyPath(i, ("a", "b", proxy), _S(), built_at=0) for i, proxy in enumerate(["p", "p", "q"])]
    for p in paths:
        pool.add(p)
    assert pool.missing(50) == 0
    picked = pool.pick(2, 50, random.Random(0))
    assert {p.proxy for p in picked} == {"p", "q"}
    paths[0].failed = True
    assert pool.missing(50) == 1 and pool.stale(50) == [paths[0]]
    assert sorted(p.path_id for p in pool.stale(150)) == [0, 1, 2]


def _longest_common(a: bytes, b: bytes) -> int:
    """Length of the longest common substring, bounded search (9 is enough to fail)."""
    grams = {a[i:i + 9] for i in range(len(a) - 8)}
    return 9 if any(b[i:i + 9] in grams for i in range(len(b) - 8)) else 8


async def test_intake_drops_bad_cloves_with_reasons_and_serves_a_good_query(tmp_path):
    from gentorrent.channels import ChannelPool
    from model_node.intake import CloveIntake

    served = []

    async def generate(request):
        served.append(request.prompt)
        if False:
            yield None

    model = OnionKey.generate()
    intake = CloveIntake(model, generate, StaticDirectory(tmp_path / "none.json"), ChannelPool())
    query = pb.OverlayQuery(request=pb.GenerateRequest(model="m", prompt="hello"), reply_key=b"r" * 32, k=3,
                            routes=[pb.ReplyRoute(proxy_address=f"127.0.0.1:{i}", link_id=b"l" * 16)
                                    for i in range(4)])
    cloves = sida.split(sealing.seal_query(model.public_key, query), 4, 3)
    tokens = [bytes([0xA0 + i]) * sealing.TOKEN_BYTES for i in range(4)]
    envelopes = [sealing.seal_clove(model.public_key, b"g" * 16, c, t) for c, t in zip(cloves, tokens)]
    acks = [await intake.submit(pb.CloveEnvelope(payload=e)) for e in envelopes[:2]]
    assert all(a.ok for a in acks)
    replay = await intake.submit(pb.CloveEnvelope(payload=envelopes[1]))
    assert (replay.ok, replay.reason) == (False, "replay")
    decoded = await intake.submit(pb.CloveEnvelope(payload=envelopes[2]))
    assert decoded.ok  # k-th clove: decoded
    late = await intake.submit(pb.CloveEnvelope(payload=envelopes[3]))
    assert (late.ok, late.reason) == (True, "late")  # not the proxy's fault
    # every clove that opened is acknowledged with its own delivery token, whatever its fate
    assert [a.delivery_token for a in (*acks, replay, decoded, late)] == [tokens[0], tokens[1], tokens[1],
                                                                         tokens[2], tokens[3]]
    other = OnionKey.generate()
    wrong_key = await intake.submit(pb.CloveEnvelope(payload=sealing.seal_clove(other.public_key, b"h" * 16, b"x",
                                                                                 tokens[0])))
    assert wrong_key.reason == "bad_seal" and wrong_key.delivery_token == b""  # never opened: no proof
    # k cloves that decode to something that is not a query
    junk = [sealing.seal_clove(model.public_key, b"j" * 16, c) for c in sida.split(b"not a query", 4, 3)]
    results = [await intake.submit(pb.CloveEnvelope(payload=e)) for e in junk[:3]]
    assert results[-1].reason == "bad_query"
    huge = await intake.submit(pb.CloveEnvelope(payload=bytes(3 * 1024 * 1024)))
    assert huge.reason == "oversize" and huge.delivery_token == b""
    for _ in range(5):
        await asyncio.sleep(0)  # let the serving task run
    await intake.close()
    assert served == ["hello"]
    assert intake.drops.as_dict() == {"bad_query": 1, "bad_seal": 1, "late": 1, "oversize": 1, "replay": 1}
