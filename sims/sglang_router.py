"""SGLang's cache-aware router as shipped, for the routing simulator's central baseline.

Followed from the sgl-router sources (github.com/sgl-project/sglang):

- `sgl-router/src/policies/cache_aware.rs` (commit 026f853b): `select_worker`. Loads are the
  router's own count of each worker's outstanding requests (fresh and exact: the router sees
  every request start and end). If max - min > balance_abs_threshold AND max >
  min * balance_rel_threshold, the request goes to the least loaded healthy worker (the first
  one in worker order on a tie, `min_by_key`), and the tree still records it there.
  Otherwise `tree.prefix_match(text)` gives the matched text and one worker holding it; if
  matched characters / request characters > cache_threshold that worker is taken, else
  `tree.get_smallest_tenant()`; the tree records the request under the chosen worker.
- `sgl-router/src/policies/tree.rs` (commit 4d40eec0): one multi-tenant radix tree over the
  request's raw text (characters, no tokenizer). `prefix_match` walks while edges match in
  full, stops inside the first partially matched edge, and answers the FIRST tenant of the
  node it stopped at -- the first key of that node's DashMap, i.e. a fixed but arbitrary
  (hash-seeded) order that differs from node to node: modelled here by a seeded random rank
  per (tree node, worker). It refreshes that tenant's timestamps up to the root.
  `get_smallest_tenant` answers the worker with the fewest characters, the first in the
  count map's (hash) order on a tie: modelled by one seeded random order per tree. Tenants
  are only evicted by `evict_tenant_by_size(max_tree_size)`, which a background thread runs
  every `eviction_interval_secs`: for each worker over max_tree_size characters it removes that
  worker from its least recently used leaves (and then from parents that become its leaves)
  until it is at or under the cap. Nothing is evicted between two runs.
- Defaults: `sgl-router/py_src/sglang_router/router_args.py` (commit 083d6013) and the
  launcher's CLI: cache_threshold 0.3, balance_abs_threshold 64, balance_rel_threshold 1.5,
  eviction_interval_secs 120, max_tree_size 2**26 (characters per worker). (The later
  sgl-model-gateway, router_args.py at commit 05e589ad, keeps every value but runs the
  eviction every 60 s; with a 2**26 cap it evicts nothing in our runs either way.)

What the simulator changes, and why it does not matter: prompts are token ids, not text. Each
token id is given a fixed character length (1..7, mean 4, like English BPE tokens) and the
tree works on token ids while counting characters, so match rates and tree sizes are in
characters as in SGLang; the only difference is that two prompts diverging inside a token are
credited no shared characters of that token (at most a few characters of prompts thousands
long). Pure and seeded: time is passed in.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import numpy as np

from sims.routing_workloads import VOCAB

_CHARS = np.random.default_rng(20240601).integers(1, 8, VOCAB + 1).astype(np.int64)


def char_lengths(tokens: np.ndarray) -> np.ndarray:
    """Characters of each token (the text SGLang's tree would see)."""
    return _CHARS[np.minimum(tokens, VOCAB)]


@dataclass(frozen=True)
class SGLangConfig:
    """sgl-router's shipped defaults (router_args.py, see the module docstring)."""

    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    eviction_interval_secs: float = 120.0
    max_tree_size: int = 2**26


class _Node:
    __slots__ = ("tokens", "chars", "children", "tenants", "parent", "salt")

    def __init__(self, tokens: np.ndarray, chars: int, parent: "_Node | None", salt: int) -> None:
        self.tokens = tokens  # the edge's token ids (a view into some prompt)
        self.chars = chars  # characters of the edge
        self.children: dict[int, _Node] = {}
        self.tenants: dict[int, int] = {}  # worker -> last access time (ms)
        self.parent = parent
        self.salt = salt  # this node's map order (see the module docstring)


def _shared(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


class ApproxTree:
    """tree.rs: the router's multi-tenant approximate radix tree (see the module docstring)."""

    def __init__(self, workers: int, seed: int) -> None:
        self._rng = np.random.default_rng([seed, 0x5617])
        self.root = _Node(np.zeros(0, dtype=np.int64), 0, None, self._salt())
        self.char_count = {w: 0 for w in range(workers)}
        self._count_order = [int(w) for w in self._rng.permutation(workers)]
        for w in range(workers):  # init_workers: insert("", url) for every worker
            self.root.tenants[w] = 0

    def _salt(self) -> int:
        return int(self._rng.integers(1, 2**62))

    def _first_tenant(self, node: _Node) -> int | None:
        if not node.tenants:
            return None
        return min(node.tenants, key=lambda w: hash((node.salt, w)))

    # -- tree.rs insert -------------------------------------------------------------------

    def insert(self, tokens: np.ndarray, chars: np.ndarray, tenant: int, now_ms: int) -> None:
        node = self.root
        node.tenants[tenant] = now_ms
        self.char_count.setdefault(tenant, 0)
        i, n = 0, len(tokens)
        while i < n:
            child = node.children.get(int(tokens[i]))
            if child is None:
                new = _Node(tokens[i:], int(chars[i:].sum()), node, self._salt())
                new.tenants[tenant] = now_ms
                self.char_count[tenant] += new.chars
                node.children[int(tokens[i])] = new
                return
            k = _shared(child.tokens, tokens[i:])
            if k < len(child.tokens):
                child = self._split(node, child, k)
            if tenant not in child.tenants:
                self.char_count[tenant] += child.chars
            child.tenants[tenant] = now_ms
            node = child
            i += k

    def _split(self, parent: _Node, child: _Node, k: int) -> _Node:
        """[parent] -> [child] becomes [parent] -> [head] -> [child'] at k tokens."""
        head_chars = int(char_lengths(child.tokens[:k]).sum())
        head = _Node(child.tokens[:k], head_chars, parent, child.salt)  # map cloned: same order
        head.tenants = dict(child.tenants)
        child.tokens = child.tokens[k:]
        child.chars -= head_chars
        child.parent = head
        head.children[int(child.tokens[0])] = child
        parent.children[int(head.tokens[0])] = head
        return head

    # -- tree.rs prefix_match -------------------------------------------------------------

    def prefix_match(self, tokens: np.ndarray, chars: np.ndarray, now_ms: int) -> tuple[int, int | None]:
        """(matched characters, the tenant answered); refreshes that tenant's path."""
        node = self.root
        i, n = 0, len(tokens)
        while i < n:
            child = node.children.get(int(tokens[i]))
            if child is None:
                break
            k = _shared(child.tokens, tokens[i:])
            i += k
            node = child
            if k < len(child.tokens):
                break
        tenant = self._first_tenant(node)
        if tenant is not None:
            walk: _Node | None = node
            while walk is not None:
                walk.tenants[tenant] = now_ms
                walk = walk.parent
        return int(chars[:i].sum()), tenant

    def smallest_tenant(self) -> int:
        """get_smallest_tenant: fewest characters; ties to the first in the map's order."""
        best, best_count = None, None
        for w in self._count_order:
            c = self.char_count.get(w)
            if c is not None and (best_count is None or c < best_count):
                best, best_count = w, c
        return best

    # -- tree.rs evict_tenant_by_size -----------------------------------------------------

    def evict_by_size(self, max_size: int) -> int:
        """Remove over-cap tenants from their least recently used leaves; returns removals."""
        seq = itertools.count()
        heap: list = []
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            for tenant in self._leaf_tenants(node):
                heapq.heappush(heap, (node.tenants[tenant], next(seq), tenant, node))
        removed = 0
        while heap:
            _, _, tenant, node = heapq.heappop(heap)
            if self.char_count.get(tenant, 0) <= max_size:
                continue
            if tenant in node.tenants:
                self.char_count[tenant] = max(0, self.char_count[tenant] - node.chars)
                del node.tenants[tenant]
                removed += 1
            parent = node.parent
            if not node.children and not node.tenants and parent is not None:
                parent.children.pop(int(node.tokens[0]), None)
            if parent is not None and tenant in self._leaf_tenants(parent):
                heapq.heappush(heap, (parent.tenants[tenant], next(seq), tenant, parent))
        return removed

    @staticmethod
    def _leaf_tenants(node: _Node) -> list[int]:
        below = set()
        for child in node.children.values():
            below.update(child.tenants)
        return [t for t in node.tenants if t not in below]

    def tenant_chars(self) -> dict[int, int]:
        """Characters per tenant recomputed from the tree (tests check the running counts)."""
        out = {w: 0 for w in self.char_count}
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            for t in node.tenants:
                out[t] = out.get(t, 0) + node.chars
        return out


class SGLangRouter:
    """cache_aware.rs `select_worker` over `ApproxTree`, with the periodic eviction thread."""

    def __init__(self, workers: int, seed: int, config: SGLangConfig = SGLangConfig()) -> None:
        self.config = config
        self.tree = ApproxTree(workers, seed)
        self.workers = workers
        self._next_eviction = config.eviction_interval_secs
        self.evictions = 0
        self.decisions = {"balance": 0, "cache_hit": 0, "cache_miss": 0}

    def _maybe_evict(self, now: float) -> None:
        while self.config.eviction_interval_secs > 0 and now >= self._next_eviction:
            self.evictions += self.tree.evict_by_size(self.config.max_tree_size)
            self._next_eviction += self.config.eviction_interval_secs

    def select(self, tokens: np.ndarray, loads: list[int], now: float) -> int:
        """The worker for a request, given every worker's outstanding requests right now."""
        self._maybe_evict(now)
        cfg = self.config
        now_ms = int(now * 1000)
        chars = char_lengths(tokens)
        hi, lo = max(loads), min(loads)
        if hi - lo > cfg.balance_abs_threshold and hi > lo * cfg.balance_rel_threshold:
            target = loads.index(lo)
            self.decisions["balance"] += 1
        else:
            matched, tenant = self.tree.prefix_match(tokens, chars, now_ms)
            total = int(chars.sum())
            rate = matched / total if total else 0.0
            if rate > cfg.cache_threshold and tenant is not None:
                target = tenant
                self.decisions["cache_hit"] += 1
            else:
                target = self.tree.smallest_tenant()
                self.decisions["cache_miss"] += 1
        self.tree.insert(tokens, chars, target, now_ms)
        return target
