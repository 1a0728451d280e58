"""Property tests of the onion codec and the clove layers."""

from __future__ import annotations

import itertools
import os
import random

import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from gentorrent.config import CLOVES
from gentorrent.crypto import onion

KEYS = [X25519PrivateKey.generate() for _ in range(onion.MAX_HOPS + 2)]


def _path(length: int, start: int = 0):
    priv = KEYS[start : start + length]
    hops = [onion.HopSpec(bytes([start, i + 1]) * 16, k.public_key()) for i, k in enumerate(priv)]
    return priv, hops


def _walk(first: bytes, priv):
    """Peel an onion hop by hop; returns the layers and the onion each hop received."""
    seen, layers, current = [], [], first
    for key in priv:
        seen.append(current)
        layer = onion.peel(current, key)
        layers.append(layer)
        current = layer.onion
    return layers, seen


def _shares_9_bytes(a: bytes, b: bytes) -> bool:
    windows = {a[i : i + 9] for i in range(len(a) - 8)}
    return any(b[i : i + 9] in windows for i in range(len(b) - 8))


# --------------------------------------------------------------------------- establishment


def test_defaults_come_from_config():
    assert onion.ONION_SIZE == CLOVES.onion_size and onion.LINK_ID_BYTES == CLOVES.link_id_bytes
    assert onion.MAX_HOPS >= CLOVES.path_length


@settings(max_examples=25, deadline=None)
@given(length=st.integers(1, onion.MAX_HOPS), start=st.integers(0, 1))
def test_onion_peels_in_order_with_constant_size(length, start):
    priv, hops = _path(length, start)
    first, path = onion.build_onion(hops, issued_s=1_700_000_000)
    assert path.first_hop == hops[0].node_id.hex() and len(path.link_ids) == length + 1
    layers, seen = _walk(first, priv)
    assert all(len(o) == onion.ONION_SIZE for o in seen)
    for h, layer in enumerate(layers):
        assert layer.issued_s == 1_700_000_000  # every hop can refuse the onion once it is old
        assert layer.next_hop == (hops[h + 1].node_id.hex() if h + 1 < length else None)
        assert (layer.onion is None) == (h == length - 1)
        assert layer.link_in == path.link_ids[h] and layer.link_out == path.link_ids[h + 1]
        assert layer.hop_key == path.hop_keys[h]
    assert len(set(path.link_ids)) == length + 1 and len(set(path.hop_keys)) == length
    # what two different hops receive shares no byte string longer than 8 bytes
    for a, b in itertools.combinations(seen, 2):
        assert not _shares_9_bytes(a, b)


def test_every_hop_reads_the_linger_its_onion_asks_for_and_an_onion_without_one_reads_zero():
    """A single-use path tells its relays how long to keep it once used (pathtable.idle_limit);
    an onion built without (a pooled path, or a user before 2026-12-04) reads 0 at every hop."""
    priv, hops = _path(CLOVES.path_length)
    layers, _ = _walk(onion.build_onion(hops, linger_s=90)[0], priv)
    assert [layer.linger_s for layer in layers] == [90] * CLOVES.path_length
    layers, _ = _walk(onion.build_onion(hops)[0], priv)
    assert [layer.linger_s for layer in layers] == [0] * CLOVES.path_length
    for bad in (-1, 1 << 16):
        with pytest.raises(onion.OnionError, match="linger_s"):
            onion.build_onion(hops, linger_s=bad)


def test_peel_only_with_the_right_key_in_order():
    priv, hops = _path(CLOVES.path_length)
    first, _ = onion.build_onion(hops)
    for wrong in priv[1:] + [X25519PrivateKey.generate()]:
        with pytest.raises(onion.OnionError):
            onion.peel(first, wrong)
    second = onion.peel(first, priv[0]).onion
    for wrong in [priv[0], priv[2]]:
        with pytest.raises(onion.OnionError):
            onion.peel(second, wrong)
    raw = priv[1].private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    assert onion.peel(second, raw).next_hop == hops[2].node_id.hex()  # raw 32-byte keys work too


def test_every_bit_flip_of_a_middle_layer_is_rejected():
    priv, hops = _path(3)
    first, _ = onion.build_onion(hops)
    middle = onion.peel(first, priv[0]).onion
    rng = random.Random(2)
    bits = list(range(0, 48 * 8)) + rng.sample(range(48 * 8, onion.ONION_SIZE * 8), 1500)
    for bit in bits:
        bad = bytearray(middle)
        bad[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(onion.OnionError):
            onion.peel(bytes(bad), priv[1])


@settings(max_examples=60, deadline=None)
@given(hop=st.integers(0, 2), bit=st.integers(0, onion.ONION_SIZE * 8 - 1))
def test_tampered_layer_rejected_at_any_hop(hop, bit):
    priv, hops = _path(3)
    first, _ = onion.build_onion(hops)
    _, seen = _walk(first, priv)
    bad = bytearray(seen[hop])
    bad[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(onion.OnionError):
        onion.peel(bytes(bad), priv[hop])


def test_onion_bytes_look_uniform_at_every_position():
    """A hop cannot tell its position: what hop 1, 2 and 3 receive has the same byte statistics."""
    priv, hops = _path(3)
    by_position = [[], [], []]
    for _ in range(40):
        _, seen = _walk(onion.build_onion(hops)[0], priv)
        for h, o in enumerate(seen):
            by_position[h].append(np.frombuffer(o, np.uint8))
    counts = [np.bincount(np.concatenate(v), minlength=256) for v in by_position]
    for c in counts:
        assert stats.chisquare(c).pvalue > 1e-4
    assert stats.chi2_contingency(np.vstack(counts)).pvalue > 1e-4
    # and the tail (where fillers sit) is as uniform as the rest
    tails = np.concatenate([o[-onion.FILLER_BYTES * 2 :] for o in by_position[2]])
    assert stats.chisquare(np.bincount(tails, minlength=256)).pvalue > 1e-4


def test_two_paths_share_no_link_ids_or_keys():
    _, hops = _path(3)
    _, a = onion.build_onion(hops)
    _, b = onion.build_onion(hops)
    assert not set(a.link_ids) & set(b.link_ids) and not set(a.hop_keys) & set(b.hop_keys)


def test_deterministic_given_rng():
    _, hops = _path(3)

    def make_rng(seed):
        r = random.Random(seed)
        return lambda n: r.randbytes(n)

    assert onion.build_onion(hops, make_rng(5)) == onion.build_onion(hops, make_rng(5))
    assert onion.build_onion(hops, make_rng(5))[0] != onion.build_onion(hops, make_rng(6))[0]


@pytest.mark.parametrize(
    "case",
    ["no hops", "too many hops", "bad node id", "bad key", "short onion", "bad link ids"],
)
def test_bad_input_raises_clear_error(case):
    priv, hops = _path(3)
    with pytest.raises(onion.OnionError):
        if case == "no hops":
            onion.build_onion([])
        elif case == "too many hops":
            onion.build_onion(_path(onion.MAX_HOPS)[1] + _path(1)[1])
        elif case == "bad node id":  # successors are named by node id, never by address
            onion.build_onion([hops[0], onion.HopSpec(b"127.0.0.1:7000", hops[1].onion_key)])
        elif case == "bad key":
            onion.build_onion([onion.HopSpec(bytes(32), b"short")])
        elif case == "short onion":
            onion.peel(bytes(100), priv[0])
        else:
            onion.build_onion(hops, link_ids=[bytes(16)] * 3)


def test_explicit_link_ids_are_used():
    priv, hops = _path(2)
    links = [bytes([i]) * onion.LINK_ID_BYTES for i in range(3)]
    first, path = onion.build_onion(hops, link_ids=links)
    layers, _ = _walk(first, priv)
    assert [(x.link_in, x.link_out) for x in layers] == [(links[0], links[1]), (links[1], links[2])]


# --------------------------------------------------------------------------- clove layers


def _established(length: int):
    priv, hops = _path(length)
    return onion.build_onion(hops)[1]


@settings(max_examples=40, deadline=None)
@given(length=st.integers(1, 5), payload=st.binary(max_size=3000), pad=st.booleans(), seq=st.integers(0, 2**40))
def test_forward_and_return_round_trip_with_constant_size(length, payload, pad, seq):
    path = _established(length)
    pad_to = 3000 if pad else None
    blob = onion.wrap_forward(path, payload, seq, pad_to=pad_to)
    views, seqs = [blob], []
    for key in path.hop_keys[:-1]:
        hop_seq, blob = onion.peel_forward(key, blob)
        seqs.append(hop_seq)
        views.append(blob)
    proxy_seq, opened = onion.open_forward(path.hop_keys[-1], blob)
    assert opened == payload
    seqs.append(proxy_seq)
    # every hop reads the clove's number plus its own secret offset: the same clove shows a
    # different number at every hop
    assert [(s - onion.hop_keys(k).seq_offset) % 2**64 for s, k in zip(seqs, path.hop_keys)] == [seq] * length
    assert len(set(seqs)) == length
    back = onion.seal_return(path.hop_keys[-1], payload, pad_to=pad_to)
    rviews = [back]
    for key in reversed(path.hop_keys[:-1]):
        back = onion.wrap_return(key, back)
        rviews.append(back)
    assert onion.unwrap_return(path, back) == payload
    assert len({len(v) for v in views}) == 1 and len({len(v) for v in rviews}) == 1
    if pad:
        assert len(views[0]) == onion.forward_size(3000, length)
    for a, b in itertools.combinations(views, 2):
        assert not _shares_9_bytes(a, b)
    for a, b in itertools.combinations(rviews, 2):
        assert not _shares_9_bytes(a, b)


@settings(max_examples=60, deadline=None)
@given(bit=st.integers(0, (onion.forward_size(100, 3)) * 8 - 1), hop=st.integers(0, 2))
def test_a_tampered_forward_clove_dies_at_the_next_hop(bit, hop):
    """Per-hop integrity: whichever hop flips whichever bit, the very next hop refuses the clove."""
    path = _established(3)
    blob = onion.wrap_forward(path, os.urandom(100), 0)
    for key in path.hop_keys[:hop]:
        _, blob = onion.peel_forward(key, blob)
    bad = bytearray(blob)
    bad[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(onion.CloveLayerError):
        if hop < 2:
            onion.peel_forward(path.hop_keys[hop], bytes(bad))
        else:
            onion.open_forward(path.hop_keys[hop], bytes(bad))


@settings(max_examples=60, deadline=None)
@given(bit=st.integers(0, (16 + 4 + 100 + 16) * 8 - 1))
def test_a_tampered_return_clove_is_rejected_by_the_user(bit):
    other = _established(2)
    back = bytearray(onion.wrap_return(other.hop_keys[0], onion.seal_return(other.hop_keys[1], os.urandom(100))))
    back[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(onion.CloveLayerError):
        onion.unwrap_return(other, bytes(back))


def test_fresh_reply_links_are_unrelated_and_known_only_to_key_holders():
    a, b = _established(3), _established(3)
    links = [onion.reply_link(a.hop_keys[-1], j) for j in range(64)]
    assert len(set(links)) == 64 and all(len(x) == onion.LINK_ID_BYTES for x in links)
    assert not set(links) & {onion.reply_link(b.hop_keys[-1], j) for j in range(64)}
    for x, y in itertools.combinations(links[:16], 2):
        assert not _shares_9_bytes(x, y)


def test_clove_layers_only_open_with_the_right_keys():
    a, b = _established(3), _established(3)
    blob = onion.wrap_forward(a, b"secret", 0)
    with pytest.raises(onion.CloveLayerError):
        onion.open_forward(a.hop_keys[-1], blob)  # intermediate layers not removed
    with pytest.raises(onion.CloveLayerError):
        onion.peel_forward(b.hop_keys[0], blob)  # another path's hop
    with pytest.raises(onion.CloveLayerError):
        onion.unwrap_return(b, onion.seal_return(a.hop_keys[-1], b"x"))
    with pytest.raises(onion.CloveLayerError):
        onion.peel_forward(b"short", blob)
    with pytest.raises(onion.CloveLayerError):
        onion.peel_forward(a.hop_keys[0], b"tiny")
    with pytest.raises(onion.CloveLayerError):
        onion.wrap_forward(a, b"too long", 0, pad_to=3)


@pytest.mark.parametrize("sealer", [0, 1, 2])
def test_a_notice_sealed_by_any_hop_is_opened_by_the_user_who_learns_which_hop_sealed_it(sealer):
    """A hop before the proxy seals its word that the path broke like the proxy seals a reply
    (user_client/relay.py `_close`); the hops before it wrap it as they wrap everything, and it
    is as long as the proxy's notice of the same padding, so on the way back no hop can tell who
    sealed it. The user opens it and learns the hop; the proxy-only unwrap refuses it (a hop
    cannot pass its words off as the model node's), and a tampered one opens at no hop."""
    path = _established(3)
    back = onion.seal_return(path.hop_keys[sealer], b"the path broke here", pad_to=48)
    for key in reversed(path.hop_keys[:sealer]):
        back = onion.wrap_return(key, back)
    proxy_notice = onion.seal_return(path.hop_keys[2], b"undelivered", pad_to=48)
    assert len(back) == len(proxy_notice)
    assert onion.unwrap_return_from(path, back) == (sealer, b"the path broke here")
    if sealer < 2:
        with pytest.raises(onion.CloveLayerError):
            onion.unwrap_return(path, back)
    bad = bytearray(back)
    bad[-1] ^= 1
    with pytest.raises(onion.CloveLayerError):
        onion.unwrap_return_from(path, bytes(bad))
