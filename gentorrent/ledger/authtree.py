"""The registry's authenticated state: a history-independent Merkle treap with subtree counts.

One data structure, pure (no I/O, no clocks, no randomness): the committee's app hash commits
to every registry record through the root of this tree, a change costs O(log N) node updates
(never a re-encoding of a whole section), and any answer about the registry comes with a proof
that a light client checks against that root alone (ARCHITECTURE.md §3.1).

Why a treap and not the `trie` package's Merkle Patricia tries (whose proofs would serve
membership): a client must be able to draw relays *by index* and check that the record it got
sits at that index among the total count, so that neither the verifier that answers nor a
registrant that grinds node ids can raise its share of a sample (bench/scale.py). That needs the
size of every subtree inside the hashed nodes, which a trie does not keep; IAVL keeps it (its
inner nodes carry `size`), but its shape depends on the order of insertions. A treap whose
priorities are a hash of the key is *history independent*: a set of keys has exactly one treap,
whatever the order it was built in, so a node that replays the chain, restarts from its store,
or runs under another PYTHONHASHSEED computes the same root byte for byte (tests/test_authtree.py).

Hashes (SHA-256, domain-separated, sizes inside):
    value_hash(v)         = H(v)
    entry_hash(k, vh)     = H(0x00 || len(k) as 2 bytes || k || vh)
    node_hash(n)          = H(0x01 || size as 8 bytes || entry_hash || left hash || right hash)
    empty subtree         = 32 zero bytes
The root hash therefore commits to the number of entries and to each entry's rank.

Trees are persistent: `apply` returns a new tree and shares every untouched node with the old
one, so a snapshot (the state at height H, served while H+1 is being built) costs nothing.
Within one `apply` nodes created for it are changed in place (a transient owner token), and
hashes are computed once, lazily, when `root_hash` is read.

Proofs are pruned trees in preorder: every node is either pruned (its hash and size), empty,
or revealed as an entry hash (rank proofs: its key is not needed), as a key and value hash (a
search path, or an entry whose value the client already holds), or as a key and value. A whole
subtree of a range whose entries the client holds already is pruned too: the client rebuilds it
from what it holds (one treap per key set) and compares hashes, so what changed in a range
since the client last saw it costs proof bytes per change, not per entry of the range. The
verifier recomputes the root hash and sizes, so it learns the rank of every revealed entry, and
from the keys it was shown it learns which key interval each pruned subtree covers; `Verified`
turns that into answers that are complete or raise `Incomplete`: the entry at a rank, the
number of keys below a bound, one key's value (or its absence), every entry of a key range.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Mapping, Sequence

from gentorrent.varint import encode_uvarint

HASH_BYTES = 32
EMPTY_HASH = bytes(HASH_BYTES)
MAX_KEY_BYTES = 255
MAX_VALUE_BYTES = 64 * 1024
#: deepest proof a verifier walks (a treap of 10^6 random keys is about 50 deep)
MAX_DEPTH = 128
MAX_PROOF_NODES = 1 << 20
MAX_SIZE = 1 << 48

_PRIORITY_DOMAIN = b"gentorrent/treap-priority/v1\x00"

# proof node kinds
_EMPTY, _PRUNED, _HASHED, _KEYED, _FULL = range(5)


class ProofError(ValueError):
    """A proof that is malformed, or that does not show what was asked."""


class Incomplete(ProofError):
    """A well-formed proof that leaves out something the question needs."""


class NotHeld(Incomplete):
    """A pruned subtree of a range is not the entries the client holds there: one it holds
    changed or is gone. Proven, not a fault of the prover: the subtree is in the tree whose
    root the client checks, so another answer at that height says the same."""


def value_hash(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


def entry_hash(key: bytes, vhash: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + len(key).to_bytes(2, "big") + key + vhash).digest()


def node_hash(size: int, ehash: bytes, left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + size.to_bytes(8, "big") + ehash + left + right).digest()


def priority(key: bytes) -> int:
    """A key's heap priority: a hash of the key, so the tree's shape depends on its keys only."""
    return int.from_bytes(hashlib.sha256(_PRIORITY_DOMAIN + key).digest()[:8], "big")


# --------------------------------------------------------------------------- nodes


class _Node:
    __slots__ = ("key", "value", "prio", "left", "right", "size", "hash", "ehash", "owner")

    def __init__(self, key: bytes, value: bytes, prio: int, left: "_Node | None", right: "_Node | None",
                 size: int, owner: object) -> None:
        self.key = key
        self.value = value
        self.prio = prio
        self.left = left
        self.right = right
        self.size = size
        self.hash: bytes | None = None
        self.ehash: bytes | None = None  # entry_hash(key, value_hash(value)), once known
        self.owner = owner


def _size(n: _Node | None) -> int:
    return n.size if n is not None else 0


def _above(a: _Node, b: _Node) -> bool:
    """Whether `a` belongs above `b` (max-heap on priority, ties broken by key)."""
    return a.prio > b.prio or (a.prio == b.prio and a.key > b.key)


def _own(n: _Node, owner: object) -> _Node:
    if n.owner is owner:
        return n
    m = _Node(n.key, n.value, n.prio, n.left, n.right, n.size, owner)
    m.ehash = n.ehash
    return m


def _fix(n: _Node) -> _Node:
    n.size = 1 + _size(n.left) + _size(n.right)
    n.hash = None
    return n


def _insert(n: _Node | None, key: bytes, value: bytes, prio: int, owner: object) -> _Node:
    if n is None:
        return _Node(key, value, prio, None, None, 1, owner)
    if key == n.key:
        if n.value == value:
            return n
        m = _own(n, owner)
        m.value, m.hash, m.ehash = value, None, None
        return m
    if key < n.key:
        child = _insert(n.left, key, value, prio, owner)
        if child is n.left and child.owner is not owner:  # unchanged (owned: changed in place)
            return n
        m = _own(n, owner)
        m.left = child
        if _above(child, m):  # rotate right: the child (owned, just made) goes up
            m.left = child.right
            child.right = _fix(m)
            return _fix(child)
        return _fix(m)
    child = _insert(n.right, key, value, prio, owner)
    if child is n.right and child.owner is not owner:
        return n
    m = _own(n, owner)
    m.right = child
    if _above(child, m):  # rotate left
        m.right = child.left
        child.left = _fix(m)
        return _fix(child)
    return _fix(m)


def _replace(root: _Node | None, key: bytes, value: bytes, owner: object) -> _Node | None:
    """The tree with the value of an existing `key` replaced (no change of shape: the common
    case of a record update, done without recursion); None if `key` is absent."""
    path = []
    n = root
    while n is not None and n.key != key:
        path.append(n)
        n = n.left if key < n.key else n.right
    if n is None:
        return None
    if n.value == value:
        return root
    child = _own(n, owner)
    child.value, child.hash, child.ehash = value, None, None
    for parent in reversed(path):
        if parent.owner is owner:  # owned nodes form a prefix of the path: link and stop copying
            if parent.left is n:
                parent.left = child
            else:
                parent.right = child
            parent.hash = None
            for above in path[:path.index(parent)]:
                above.hash = None
            return root
        m = _own(parent, owner)
        if m.left is n:
            m.left = child
        else:
            m.right = child
        m.hash = None
        n, child = parent, m
    return child


def _merge(a: _Node | None, b: _Node | None, owner: object) -> _Node | None:
    """The treap of a's and b's entries (every key of a below every key of b)."""
    if a is None:
        return b
    if b is None:
        return a
    if _above(a, b):
        m = _own(a, owner)
        m.right = _merge(a.right, b, owner)
        return _fix(m)
    m = _own(b, owner)
    m.left = _merge(a, b.left, owner)
    return _fix(m)


def _delete(n: _Node | None, key: bytes, owner: object) -> _Node | None:
    if n is None:
        return None
    if key == n.key:
        return _merge(n.left, n.right, owner)
    if key < n.key:
        child = _delete(n.left, key, owner)
        if child is n.left and (child is None or child.owner is not owner):
            return n
        m = _own(n, owner)
        m.left = child
        return _fix(m)
    child = _delete(n.right, key, owner)
    if child is n.right and (child is None or child.owner is not owner):
        return n
    m = _own(n, owner)
    m.right = child
    return _fix(m)


def _hash_of(n: _Node | None) -> bytes:
    if n is None:
        return EMPTY_HASH
    if n.hash is None:
        if n.ehash is None:
            n.ehash = entry_hash(n.key, value_hash(n.value))
        n.hash = node_hash(n.size, n.ehash, _hash_of(n.left), _hash_of(n.right))
    return n.hash


# --------------------------------------------------------------------------- the tree


def _check_entry(key: bytes, value: bytes) -> None:
    if not isinstance(key, bytes) or not 0 < len(key) <= MAX_KEY_BYTES:
        raise ValueError(f"a key is 1..{MAX_KEY_BYTES} bytes")
    if not isinstance(value, bytes) or len(value) > MAX_VALUE_BYTES:
        raise ValueError(f"a value is at most {MAX_VALUE_BYTES} bytes")


class Tree:
    """An immutable sorted map bytes -> bytes with a Merkle root; see the module docstring."""

    __slots__ = ("_root",)

    def __init__(self, root: _Node | None = None) -> None:
        self._root = root

    @classmethod
    def from_items(cls, items: Iterable[tuple[bytes, bytes]]) -> "Tree":
        """The tree of `items` (any order) in O(N log N) for sorting plus O(N) for building."""
        entries = sorted(items)
        owner = object()
        stack: list[_Node] = []
        previous = None
        for key, value in entries:
            _check_entry(key, value)
            if key == previous:
                raise ValueError("duplicate key")
            previous = key
            node = _Node(key, value, priority(key), None, None, 1, owner)
            last = None
            while stack and _above(node, stack[-1]):
                last = stack.pop()
            node.left = last
            if stack:
                stack[-1].right = node
            stack.append(node)
        root = stack[0] if stack else None
        _set_sizes(root)
        return cls(root)

    @property
    def size(self) -> int:
        return _size(self._root)

    def __len__(self) -> int:
        return _size(self._root)

    @property
    def root_hash(self) -> bytes:
        return _hash_of(self._root)

    def get(self, key: bytes) -> bytes | None:
        n = self._root
        while n is not None:
            if key == n.key:
                return n.value
            n = n.left if key < n.key else n.right
        return None

    def at(self, rank: int) -> tuple[bytes, bytes]:
        """The entry with `rank` keys below it."""
        if not 0 <= rank < self.size:
            raise IndexError(rank)
        n = self._root
        while True:
            left = _size(n.left)
            if rank < left:
                n = n.left
            elif rank == left:
                return n.key, n.value
            else:
                rank -= left + 1
                n = n.right

    def rank(self, key: bytes) -> int:
        """How many keys are below `key`."""
        n, below = self._root, 0
        while n is not None:
            if key <= n.key:
                n = n.left
            else:
                below += _size(n.left) + 1
                n = n.right
        return below

    def items(self, lo: bytes | None = None, hi: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Entries with lo <= key < hi, in key order."""
        stack: list[_Node] = []
        n = self._root
        while stack or n is not None:
            if n is not None:
                if lo is not None and n.key < lo:
                    n = n.right
                    continue
                stack.append(n)
                n = n.left
                continue
            n = stack.pop()
            if hi is not None and n.key >= hi:
                return
            yield n.key, n.value
            n = n.right

    def apply(self, changes: Mapping[bytes, bytes | None]) -> "Tree":
        """A new tree with `changes` made (a value sets its key, None deletes it); the order of
        `changes` does not matter: the result is the one treap of the resulting key set."""
        owner = object()
        root = self._root
        for key, value in changes.items():
            if value is None:
                root = _delete(root, key, owner)
            else:
                _check_entry(key, value)
                root = _replace(root, key, value, owner) or _insert(root, key, value, priority(key), owner)
        return Tree(root)

    # ------------------------------------------------------------------ proofs

    def prove(self, *, keys: Iterable[bytes] = (), ranks: Iterable[int] = (),
              ranges: Iterable[tuple[bytes, bytes]] = (), bounds: Iterable[bytes] = (),
              withhold: Callable[[bytes, bytes], bool] | None = None, subtrees: bool = True) -> bytes:
        """One proof answering all of: the value (or absence) of each of `keys`, the entry at
        each of `ranks`, every entry of each [lo, hi) of `ranges` (as key and value hash where
        `withhold(key, value)`: the client holds it already; with `subtrees`, a subtree of
        such entries inside one range as its hash and size), the number of keys below each of
        `bounds`. What `Verified` needs to answer each, nothing more: a key that is present is
        proven as the entry at its rank (the path to it by hashes, ~35 bytes a level fewer than
        by keys); only an absence needs the keys along its search path."""
        keys = frozenset(keys)
        present = {k for k in keys if self.get(k) is not None}
        wanted = _Wanted(keys - present, frozenset(r for r in ranks if 0 <= r < self.size)
                         | {self.rank(k) for k in present}, tuple(ranges), tuple(bounds), withhold,
                         subtrees and withhold is not None, {})
        out = bytearray()
        _prove(self._root, None, None, 0, wanted, out)
        return bytes(out)


def _set_sizes(n: _Node | None) -> int:
    if n is None:
        return 0
    n.size = 1 + _set_sizes(n.left) + _set_sizes(n.right)
    return n.size


# --------------------------------------------------------------------------- building proofs


def _may_contain(lo: bytes | None, hi: bytes | None, key: bytes) -> bool:
    """Whether a subtree known to hold keys strictly inside (lo, hi) may hold `key`."""
    return (lo is None or lo < key) and (hi is None or key < hi)


def _may_meet(lo: bytes | None, hi: bytes | None, a: bytes, b: bytes) -> bool:
    """Whether a subtree strictly inside (lo, hi) may hold a key of [a, b). One predicate for the
    prover and the verifier, so an honest proof always reveals what the check looks for."""
    return a < b and (hi is None or a < hi) and (lo is None or lo < b)


@dataclass(frozen=True)
class _Wanted:
    keys: frozenset[bytes]
    ranks: frozenset[int]
    ranges: tuple[tuple[bytes, bytes], ...]
    bounds: tuple[bytes, ...]
    withhold: Callable[[bytes, bytes], bool] | None
    subtrees: bool  # a subtree of withheld entries goes as its hash (the client rebuilds it)
    _held: dict = field(compare=False, repr=False)  # id(node) -> whether its subtree is all withheld

    def needs_keys(self, lo: bytes | None, hi: bytes | None) -> bool:
        return self.needs_point(lo, hi) or any(_may_meet(lo, hi, a, b) for a, b in self.ranges)

    def needs_point(self, lo: bytes | None, hi: bytes | None) -> bool:
        """Whether a key or bound asked may lie inside (lo, hi) (its search path must be shown)."""
        return any(_may_contain(lo, hi, k) for k in self.keys) or any(_may_contain(lo, hi, b) for b in self.bounds)

    def needs_rank(self, offset: int, size: int) -> bool:
        return any(offset <= r < offset + size for r in self.ranks)

    def in_range(self, key: bytes) -> bool:
        return any(a <= key < b for a, b in self.ranges)

    def held_subtree(self, n: _Node) -> bool:
        """Whether every entry of `n`'s subtree lies in one range and is withheld: the client
        holds them all and rebuilds the subtree (checked before walking it: never more than
        one range's entries)."""
        if not self.subtrees:
            return False
        first, last = n, n
        while first.left is not None:
            first = first.left
        while last.right is not None:
            last = last.right
        if not any(a <= first.key and last.key < b for a, b in self.ranges):
            return False
        return self._all_withheld(n)

    def _all_withheld(self, n: _Node | None) -> bool:
        if n is None:
            return True
        known = self._held.get(id(n))
        if known is None:
            known = self._all_withheld(n.left) and self._all_withheld(n.right) and self.withhold(n.key, n.value)
            self._held[id(n)] = known
        return known


def _prove(n: _Node | None, lo: bytes | None, hi: bytes | None, offset: int, wanted: _Wanted,
           out: bytearray) -> None:
    if n is None:
        out.append(_EMPTY)
        return
    keyed = wanted.needs_keys(lo, hi)
    if not wanted.needs_rank(offset, n.size) and (not keyed or not wanted.needs_point(lo, hi)
                                                  and wanted.held_subtree(n)):
        out.append(_PRUNED)
        out += _hash_of(n)
        out += encode_uvarint(n.size)
        return
    rank = offset + _size(n.left)
    full = n.key in wanted.keys or rank in wanted.ranks or wanted.in_range(n.key)
    if full and wanted.in_range(n.key) and wanted.withhold is not None and wanted.withhold(n.key, n.value) \
            and n.key not in wanted.keys and rank not in wanted.ranks:
        full = False
    if full:
        out.append(_FULL)
        out += encode_uvarint(len(n.key))
        out += n.key
        out += encode_uvarint(len(n.value))
        out += n.value
    elif keyed:
        out.append(_KEYED)
        out += encode_uvarint(len(n.key))
        out += n.key
        out += value_hash(n.value)
    else:
        out.append(_HASHED)
        out += entry_hash(n.key, value_hash(n.value))
    shown = full or keyed  # the verifier learns this key and tightens the children's intervals
    _prove(n.left, lo, n.key if shown else hi, offset, wanted, out)
    _prove(n.right, n.key if shown else lo, hi, rank + 1, wanted, out)


# --------------------------------------------------------------------------- checking proofs


@dataclass(frozen=True)
class Entry:
    """A revealed entry: its rank always; its key unless only its hash was shown; its value
    when shown in full (else `value_hash`)."""

    rank: int
    key: bytes | None
    value: bytes | None
    value_hash: bytes | None
    lo: bytes | None  # the open key interval it is known to lie in (for entries shown by hash)
    hi: bytes | None


@dataclass(frozen=True)
class Gap:
    """A pruned subtree: `size` entries from rank `rank`, keys strictly inside (lo, hi), whose
    root hash is `hash` (a client that holds its entries rebuilds it: `Verified.entries_in`)."""

    rank: int
    size: int
    lo: bytes | None
    hi: bytes | None
    hash: bytes


@dataclass(frozen=True)
class Verified:
    """What a proof shows about the tree whose root is `root_hash` (compare it with the
    committed root before believing anything here)."""

    root_hash: bytes
    size: int
    entries: tuple[Entry, ...]
    gaps: tuple[Gap, ...]
    _by_key: dict = field(default_factory=dict, compare=False, repr=False)
    _by_rank: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for e in self.entries:
            self._by_rank[e.rank] = e
            if e.key is not None:
                self._by_key[e.key] = e

    def at(self, rank: int) -> tuple[bytes, bytes]:
        """The key and value at `rank` (Incomplete unless shown in full)."""
        e = self._by_rank.get(rank)
        if e is None or e.value is None or e.key is None:
            raise Incomplete(f"the proof does not show the entry at rank {rank}")
        return e.key, e.value

    def rank_of(self, bound: bytes) -> int:
        """How many keys of the tree are below `bound`."""
        below = 0
        for e in self.entries:
            if e.key is not None:
                below += e.key < bound
            elif e.hi is not None and e.hi <= bound:
                below += 1
            elif not (e.lo is not None and e.lo >= bound):
                raise Incomplete("the proof does not show where the bound falls")
        for g in self.gaps:
            if g.hi is not None and g.hi <= bound:
                below += g.size
            elif not (g.lo is not None and g.lo >= bound):
                raise Incomplete("the proof does not show where the bound falls")
        return below

    def lookup(self, key: bytes) -> bytes | None:
        """The value of `key`, or None when the proof shows it is absent."""
        e = self._by_key.get(key)
        if e is not None:
            if e.value is None:
                raise Incomplete("the proof shows the key but not its value")
            return e.value
        if any(_may_contain(g.lo, g.hi, key) for g in self.gaps) or any(
                e.key is None and _may_contain(e.lo, e.hi, key) for e in self.entries):
            raise Incomplete("the proof neither shows the key nor rules it out")
        return None

    def entries_in(self, lo: bytes, hi: bytes, held: Mapping[bytes, bytes] | None = None) -> list[Entry]:
        """Every entry with lo <= key < hi, in key order (values may be hashes only). A pruned
        subtree of the range is rebuilt from `held` (key -> value: what the client holds): it
        stands for exactly those of them in its interval if their treap has its hash, and its
        entries come back as value hashes."""
        if any(e.key is None and _may_meet(e.lo, e.hi, lo, hi) for e in self.entries):
            raise Incomplete("the proof leaves out part of the range")
        out = [e for e in self.entries if e.key is not None and lo <= e.key < hi]
        gaps = [g for g in self.gaps if _may_meet(g.lo, g.hi, lo, hi)]
        if gaps:
            if held is None:
                raise Incomplete("the proof leaves out part of the range")
            keys = sorted(k for k in held if lo <= k < hi)
            for g in gaps:
                out += _rebuilt(g, [k for k in keys if _may_contain(g.lo, g.hi, k)], held)
        return sorted(out, key=lambda e: e.rank)


def _rebuilt(gap: Gap, keys: list[bytes], held: Mapping[bytes, bytes]) -> list[Entry]:
    """The entries of a pruned subtree, from the held entries in its interval (`keys`, sorted)."""
    if len(keys) != gap.size or Tree.from_items((k, held[k]) for k in keys).root_hash != gap.hash:
        raise NotHeld(f"{len(keys)} entries held where the tree has {gap.size} others: one held changed or is gone")
    return [Entry(gap.rank + i, k, None, value_hash(held[k]), gap.lo, gap.hi) for i, k in enumerate(keys)]


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.pos = 0
        self.nodes = 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise ProofError("the proof ends early")
        b = self.data[self.pos]
        self.pos += 1
        return b

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ProofError("the proof ends early")
        chunk = bytes(self.data[self.pos:self.pos + n])
        self.pos += n
        return chunk

    def varint(self, limit: int) -> int:
        n = shift = 0
        while True:
            b = self.byte()
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
            if shift > 63:
                raise ProofError("a varint in the proof is too long")
        if n > limit:
            raise ProofError(f"a length or size in the proof is over its limit ({n} > {limit})")
        return n


def verify(proof: bytes, max_bytes: int = 16 * 1024 * 1024) -> Verified:
    """What `proof` shows; raises ProofError if it is malformed. The caller compares
    `root_hash` with the root it trusts."""
    if len(proof) > max_bytes:
        raise ProofError(f"the proof is {len(proof)} bytes, the limit is {max_bytes}")
    reader = _Reader(proof)
    entries: list[Entry] = []
    gaps: list[Gap] = []
    root, size = _verify(reader, None, None, 0, 0, entries, gaps)
    if reader.pos != len(proof):
        raise ProofError("trailing bytes after the proof")
    return Verified(root, size, tuple(entries), tuple(gaps))


def _verify(r: _Reader, lo: bytes | None, hi: bytes | None, offset: int, depth: int,
            entries: list[Entry], gaps: list[Gap]) -> tuple[bytes, int]:
    if depth > MAX_DEPTH:
        raise ProofError(f"the proof is deeper than {MAX_DEPTH}")
    r.nodes += 1
    if r.nodes > MAX_PROOF_NODES:
        raise ProofError("the proof has too many nodes")
    kind = r.byte()
    if kind == _EMPTY:
        return EMPTY_HASH, 0
    if kind == _PRUNED:
        h = r.take(HASH_BYTES)
        size = r.varint(MAX_SIZE)
        if size == 0 or h == EMPTY_HASH:
            raise ProofError("a pruned subtree must be non-empty")
        gaps.append(Gap(offset, size, lo, hi, h))
        return h, size
    key = value = vhash = ehash = None
    if kind == _HASHED:
        ehash = r.take(HASH_BYTES)
    elif kind in (_KEYED, _FULL):
        key = r.take(r.varint(MAX_KEY_BYTES))
        if not key or not _may_contain(lo, hi, key):
            raise ProofError("a key of the proof is out of order")
        if kind == _KEYED:
            vhash = r.take(HASH_BYTES)
        else:
            value = r.take(r.varint(MAX_VALUE_BYTES))
            vhash = value_hash(value)
        ehash = entry_hash(key, vhash)
    else:
        raise ProofError(f"unknown proof node kind {kind}")
    left_hi, right_lo = (key, key) if key is not None else (hi, lo)
    lh, ls = _verify(r, lo, left_hi, offset, depth + 1, entries, gaps)
    rank = offset + ls
    entries.append(Entry(rank, key, value, vhash, lo, hi))
    rh, rs = _verify(r, right_lo, hi, rank + 1, depth + 1, entries, gaps)
    size = ls + rs + 1
    if size > MAX_SIZE:
        raise ProofError("the proof's sizes overflow")
    return node_hash(size, ehash, lh, rh), size


def sample_ranks(draws: Sequence[int], start: int, count: int) -> list[int]:
    """The ranks that 64-bit `draws` (the client's own random numbers) pick uniformly among the
    `count` entries from rank `start`: draw * count >> 64, so the verifier that answers cannot
    choose, and the client checks each against the proven count."""
    if count <= 0:
        return []
    return [start + ((d * count) >> 64) for d in draws]
