"""Oracle for the S-IDA clove decoder (gentorrent.crypto.sida.combine).

Contract checked:
1. combine() of arbitrary cloves (random bytes, or valid cloves mutated) raises only
   sida.CloveError (or returns bytes);
2. k genuine cloves of a message, mixed in any order with garbage (random bytes, corrupted
   copies of genuine cloves, fewer than k cloves of another message with the same n, k),
   still decode to exactly that message;
3. up to MAX_HOSTILE well-formed but undecodable cloves, with n and k chosen by the sender,
   cost combine() at most HOSTILE_CPU_S of CPU.
"""

from __future__ import annotations

from gentorrent.crypto import sida
from testkit.fuzzing import Draw, Finding, cpu_budget, expect

MAX_N = 8  # small n keeps one check in the milliseconds
MAX_HOSTILE = 64  # cloves of one group a receiver may hold (overlay reassembly keeps <= 16)
HOSTILE_CPU_S = 2.0  # an honest combine() costs milliseconds
MAX_GARBAGE = 6  # with k <= 5 good ones: at most C(11, 5) = 462 subsets, well under MAX_SUBSETS


def _combine(cloves: list) -> bytes | None:
    try:
        with cpu_budget(5.0, "sida.combine"):
            out = sida.combine(cloves)
    except sida.CloveError:
        return None
    expect(isinstance(out, bytes), f"combine returned {type(out).__name__}, not bytes")
    return out


def _mutate(d: Draw, clove: bytes) -> bytes:
    b = bytearray(clove)
    how = d.below(4)
    if how == 0 and b:  # flip some bits
        for _ in range(d.between(1, 4)):
            b[d.below(len(b))] ^= d.between(1, 255)
    elif how == 1:  # truncate or extend
        cut = d.below(len(b) + 1)
        b = b[:cut] + bytearray(d.blob(8))
    elif how == 2 and len(b) > 4:  # rewrite the header
        b[d.below(4)] = d.uint(1)
    else:  # swap the payload, keep the header
        b[4:] = d.bytes(len(b) - 4)
    return bytes(b)


def _arbitrary(d: Draw) -> None:
    cloves = [d.blob(80) for _ in range(d.below(12))]
    if d.flag():
        cloves.append(d.choice([None, 7, "text", b"", bytearray(b"\x01\x02\x02\x01" + bytes(40))]))
    _combine(cloves)


def _mixed(d: Draw) -> None:
    n = d.between(1, MAX_N)
    k = d.between(1, min(n, 5))
    message = d.blob(200)
    genuine = sida.split(message, n, k, rng=d.rng(b"a"))
    chosen = sorted(set(d.below(n) for _ in range(3 * n)))
    while len(chosen) < k:  # top up deterministically to exactly >= k distinct cloves
        chosen.append(next(i for i in range(n) if i not in chosen))
    good = [genuine[i] for i in chosen]
    garbage: list[bytes] = []
    other = sida.split(d.blob(200), n, k, rng=d.rng(b"b")) if d.flag() else []
    for _ in range(d.below(MAX_GARBAGE + 1)):
        kind = d.below(3)
        if kind == 0:
            garbage.append(d.blob(80))
        elif kind == 1:
            garbage.append(_mutate(d, d.choice(genuine)))
        elif other and sum(c in other for c in garbage) < k - 1:
            garbage.append(d.choice(other))
    pool = good + garbage
    order = []
    while pool:  # a permutation chosen by the input
        order.append(pool.pop(d.below(len(pool))))
    out = _combine(order)
    if out != message:
        raise Finding(f"k={k} of n={n} genuine cloves + {len(garbage)} garbage gave "
                      f"{'an error' if out is None else 'another message'}")


def _hostile_group(d: Draw, avoid_known: bool) -> None:
    """Well-formed cloves that decode to nothing, with n and k chosen by the sender: the
    work combine() does for them must stay bounded (HOSTILE_CPU_S) however large k is."""
    count = d.between(2, 8 if avoid_known else MAX_HOSTILE)
    k = d.between(1, min(count, 4) if avoid_known else count)
    n = d.between(count, 255)
    size = 2 * d.between(1, 8)
    base = d.below(n - count + 1)
    xs = [base + 1 + i for i in range(count)]  # distinct, so every k-subset is a candidate
    cloves = [bytes((sida.VERSION, n, k, x)) + d.bytes(sida.KEY_BYTES + size) for x in xs]
    try:
        with cpu_budget(HOSTILE_CPU_S, f"sida.combine of {len(cloves)} hostile cloves (n={n}, k={k})"):
            sida.combine(cloves)
    except sida.CloveError:
        pass


def check(data: bytes, avoid_known: bool = False) -> None:
    """`avoid_known` (set by fuzzing.filtered_check while the bug is open) keeps hostile
    groups small so long runs look for other bugs."""
    d = Draw(data)
    mode = d.below(4)
    if mode == 3:
        _hostile_group(d, avoid_known)
    elif mode == 0:
        _arbitrary(d)
    elif mode == 1:
        _mixed(d)
    else:  # a valid clove set, mutated
        n = d.between(1, MAX_N)
        k = d.between(1, n)
        cloves = sida.split(d.blob(100), n, k, rng=d.rng())
        _combine([_mutate(d, c) if d.flag() else c for c in cloves])
