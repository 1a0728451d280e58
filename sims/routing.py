"""Routing simulator: GenTorrent's decentralized policy against SGLang's router as shipped.

A discrete-event model of a group of model nodes (alternately an H100 and an A100 serving
Llama-3-8B, or the measured CPU engine: `sims/routing_engine.py` documents every cost and
its source) under Poisson arrivals, on seven workloads (`sims/routing_workloads.py`). Policies:

- no_forward   the request is served where it enters the group: a model node picked at
               random (user nodes pick entry nodes at random, for anonymity). The baseline
               of the "≥ 50 % better than no forwarding" goal.
- round_robin  a central dispatcher cycling over the nodes.
- least_load   a central dispatcher on fresh loads: min outstanding requests / capacity.
- sglang       SGLang's cache_aware router as shipped (`sims/sglang_router.py`: approximate
               character radix tree per worker, 2^26-character cap evicted every 120 s, its
               thresholds and tie-breaking), central, fed with fresh outstanding-request counts
               exactly as the real router counts them. A request reaches its worker at once.
- ours         GenTorrent: the request enters at a random node whose `GroupRouting` (the same
               object a live model node holds: Sentry, layout-switching HR-tree, node table,
               Algorithm 2 in `gentorrent/routing/policy.py`) decides with `RoutingParams` as
               shipped in gentorrent/config.py. It knows its own load and subtree fresh and
               everything else from gossip: every node sends every peer its subtree delta,
               load and Sentry state each gossip interval (5 s; staggered rounds), so peers'
               state is up to 5 s old. A forward costs `forward_delay_s` (one model-node hop)
               and the serving node records the prompt in its own subtree, as the live node
               does (`decide(tokens, hops=1)`).
- oracle       a central greedy router with perfect instant knowledge of every engine's real
               prefix cache and queue: min estimated time to first token. A reference only.

Each run is one (workload, nodes, seed, load) group and every policy sees the same requests.
Load is a multiple of what the group could serve with no prefix cache (`nocache_capacity`).
Statistics leave out the first 10 % of requests (cold caches; gossiping nodes know no peer
before the first round).

    .venv/bin/python -m sims.routing            # the full sweep (progress on stderr)
    .venv/bin/python -m sims.routing --quick    # a small one (tests)
    .venv/bin/python -m sims.routing --replot   # tables and PNGs again from the CSV

The last line on stdout is ONE JSON line of headline figures (`headline`).
"""

from __future__ import annotations

import abc
import argparse
import csv
import gc
import heapq
import itertools
import json
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from gentorrent.config import ROUTING, RoutingParams
from gentorrent.routing.group import GroupRouting, LocalLoad, PeerReport
from sims.routing_engine import PROFILES, Job, SimNode, block_keys
from sims.routing_workloads import WORKLOADS, Request, RequestFactory, generate
from sims.sglang_router import SGLangConfig, SGLangRouter

POLICIES = ("no_forward", "round_robin", "least_load", "sglang", "ours", "oracle")
GPU_PAIR = ("h100-llama3-8b", "a100-llama3-8b")


@dataclass(frozen=True)
class SimConfig:
    nodes: int = 8
    profiles: tuple[str, ...] = GPU_PAIR  # alternated over the nodes
    forward_delay_s: float = 0.02  # one extra model-node-to-model-node hop
    routing: RoutingParams = ROUTING  # GenTorrent's shipped defaults
    sglang: SGLangConfig = SGLangConfig()  # sgl-router's shipped defaults
    warmup_fraction: float = 0.1
    seed: int = 1


# ----------------------------------------------------------------------------- policies


class Cluster:
    """The nodes and what every central policy may look at."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.nodes = [SimNode(i, PROFILES[cfg.profiles[i % len(cfg.profiles)]])
                      for i in range(cfg.nodes)]


class Policy(abc.ABC):
    name = "base"
    central = True  # requests reach the chosen node without an extra hop

    def __init__(self, cluster: Cluster, rng: np.random.Generator) -> None:
        self.cluster = cluster
        self.rng = rng

    @abc.abstractmethod
    def route(self, job: Job, tokens: np.ndarray, now: float) -> tuple[int, bool]:
        """(the node the request goes to, whether it is a forward)."""

    def on_arrival_at_node(self, idx: int, tokens: np.ndarray, now: float, hops: int) -> int | None:
        """A forwarded request (hops > 0) reached node idx: None to serve it there, or the
        node to pass it on to."""
        return None

    def gossip(self, idx: int, now: float) -> None:
        pass

    def stats(self) -> dict:
        return {}


class NoForwardPolicy(Policy):
    name = "no_forward"

    def route(self, job, tokens, now):
        return int(self.rng.integers(len(self.cluster.nodes))), False


class RoundRobinPolicy(Policy):
    name = "round_robin"

    def __init__(self, cluster, rng):
        super().__init__(cluster, rng)
        self._next = itertools.cycle(range(len(cluster.nodes)))

    def route(self, job, tokens, now):
        return next(self._next), False


class LeastLoadPolicy(Policy):
    name = "least_load"

    def route(self, job, tokens, now):
        nodes = self.cluster.nodes
        return min(range(len(nodes)),
                   key=lambda i: (nodes[i].active / nodes[i].profile.capacity_score, i)), False


class SGLangPolicy(Policy):
    """`sims/sglang_router.py` with the router's own fresh outstanding-request counts."""

    name = "sglang"

    def __init__(self, cluster, rng):
        super().__init__(cluster, rng)
        self.router = SGLangRouter(len(cluster.nodes), cluster.cfg.seed, cluster.cfg.sglang)

    def route(self, job, tokens, now):
        loads = [n.active for n in self.cluster.nodes]
        return self.router.select(tokens, loads, now), False

    def stats(self):
        d = self.router.decisions
        total = max(1, sum(d.values()))
        return {"sglang_balance_share": d["balance"] / total, "sglang_evictions": self.router.evictions}


class OraclePolicy(Policy):
    """Greedy on perfect instant state: min estimated time to first token."""

    name = "oracle"

    def route(self, job, tokens, now):
        best, best_t = 0, math.inf
        for n in self.cluster.nodes:
            p = n.profile
            unc = n.uncached_if_sent(job.keys, job.n_tokens, job.block)
            backlog = n.cur_rem * p.linear_s_per_token + sum(
                p.prefill_s(j.n_tokens, 0) for j in n.queue)
            t = backlog + p.prefill_s(job.n_tokens, job.n_tokens - unc) \
                + len(n.dec) * p.decode_step_s(1, 0) / max(1, p.max_seqs) * 8
            if t < best_t:
                best, best_t = n.idx, t
        return best, False


class OursPolicy(Policy):
    """GenTorrent: each node decides alone with its own `GroupRouting`, fed by gossip."""

    name = "ours"
    central = False

    def __init__(self, cluster, rng):
        super().__init__(cluster, rng)
        cfg = cluster.cfg
        self.params = cfg.routing
        self.ids = [f"m{i:02d}" for i in range(len(cluster.nodes))]
        self.roster = {m: n.profile.capacity_score for m, n in zip(self.ids, cluster.nodes)}
        self.groups = [GroupRouting(self.ids[i], n.profile.capacity_score, n.profile.kv_tokens,
                                    version_base=0, params=self.params)
                       for i, n in enumerate(cluster.nodes)]
        self.delta_bytes = 0
        self.deltas = 0

    def _load(self, i: int) -> LocalLoad:
        n = self.cluster.nodes[i]
        return LocalLoad(active=n.active, queued=len(n.queue))

    def route(self, job, tokens, now):
        entry = int(self.rng.integers(len(self.ids)))
        d = self.groups[entry].decide(tokens, 0, now, self._load(entry))
        return (self.ids.index(d.node_id) if d.forward else entry), d.forward

    def on_arrival_at_node(self, idx, tokens, now, hops):
        if hops == 0:
            return None
        # the Forward RPC: served here (recorded in this node's own subtree), or passed on
        d = self.groups[idx].decide(tokens, hops, now, self._load(idx))
        return self.ids.index(d.node_id) if d.forward else None

    def gossip(self, i, now):
        """Node i's gossip round: a signed message to every peer (the shell's job), merged."""
        src = self.groups[i]
        n = self.cluster.nodes[i]
        load = self._load(i)
        stats, layout = src.sentry.export_stats(), src.sentry.export_layout()
        deltas: dict[int, bytes] = {}
        for j, dst in enumerate(self.groups):
            if j == i:
                continue
            since = dst.holds_version(self.ids[i])
            data = deltas.get(since)
            if data is None:
                data = deltas[since] = src.outgoing_delta(since)
            self.delta_bytes += len(data)
            self.deltas += 1
            # the roster as each member's shell passes it: the others, with registered capacity
            roster = {m: c for m, c in self.roster.items() if m != self.ids[j]}
            seq = max(int(now * 1000), src.holds_version(self.ids[i]))  # an honest signed clock
            dst.merge_peer(PeerReport(self.ids[i], seq, load, n.profile.capacity_score,
                                      n.profile.kv_tokens, data, stats, layout), now, roster)
        src.tick({m: c for m, c in self.roster.items() if m != self.ids[i]}, now)

    def stats(self):
        c = [g.counters for g in self.groups]
        req = max(1, sum(x.requests for x in c))
        return {"tree_hit_rate": sum(x.tree_hits for x in c) / req,
                "layout_epoch": max(g.sentry.layout.epoch for g in self.groups),
                "delta_bytes_per_message": self.delta_bytes / max(1, self.deltas)}


POLICY_CLASSES = {c.name: c for c in (NoForwardPolicy, RoundRobinPolicy, LeastLoadPolicy,
                                      SGLangPolicy, OursPolicy, OraclePolicy)}


# ----------------------------------------------------------------------------- event loop


@dataclass
class RunResult:
    workload: str
    nodes: int
    seed: int
    load: float  # multiple of the no-cache capacity
    policy: str
    rate: float
    n: int
    mean_s: float
    p99_s: float
    ttft_mean_s: float
    ttft_p99_s: float
    hit_rate: float  # prompt tokens served from the prefix cache / all prompt tokens
    forward_rate: float
    tree_hit_rate: float
    sim_s: float  # simulated seconds
    wall_s: float


def _job(r: Request, block: int, arrival: float) -> Job:
    full = block_keys(np.concatenate([r.tokens, r.reply]), block) if r.reply is not None else None
    return Job(r.rid, arrival, len(r.tokens), r.out_len, block_keys(r.tokens, block), block, full)


def simulate(cfg: SimConfig, policy_name: str, requests: list[Request], rate: float,
             workload: str, load: float = 0.0) -> RunResult:
    """One policy on one request stream (pure: same inputs, same result)."""
    gc.disable()  # millions of short-lived tree nodes: the cyclic collector only costs here
    try:
        return _simulate(cfg, policy_name, requests, rate, workload, load)
    finally:
        gc.enable()
        gc.collect()


def _simulate(cfg: SimConfig, policy_name: str, requests: list[Request], rate: float,
              workload: str, load: float) -> RunResult:
    t0 = time.perf_counter()
    cluster = Cluster(cfg)
    rng = np.random.default_rng([cfg.seed, POLICIES.index(policy_name)])
    policy = POLICY_CLASSES[policy_name](cluster, rng)
    block = cluster.nodes[0].profile.block_tokens
    heap: list = []
    seq = itertools.count()
    for r in requests:
        if not math.isnan(r.arrival):
            heapq.heappush(heap, (r.arrival, next(seq), "arrive", r))
    if not policy.central:
        n = len(cluster.nodes)
        for i in range(n):
            heapq.heappush(heap, (ROUTING.gossip_interval_s * (i + 1) / n, next(seq), "gossip", i))
    pending: dict[int, tuple[Request, np.ndarray]] = {}
    by_rid = {r.rid: r for r in requests}
    finished: list[Job] = []
    now = 0.0

    def schedule(node: SimNode) -> None:
        t = node.next_time()
        if t < math.inf:
            heapq.heappush(heap, (t, next(seq), "node", (node.idx, node.epoch)))

    def done(jobs: list[Job], t: float) -> None:
        for job in jobs:
            finished.append(job)
            nxt = by_rid[job.rid].follow_up
            if nxt is not None:  # a chat's next turn, after the user's think time
                heapq.heappush(heap, (t + by_rid[job.rid].think_s, next(seq), "arrive", nxt))

    def reach(target: int, job: Job, tokens: np.ndarray, t: float, hops: int) -> None:
        onward = policy.on_arrival_at_node(target, tokens, t, hops)
        if onward is not None:
            job.hops = hops + 1
            pending[job.rid] = (by_rid[job.rid], tokens)
            heapq.heappush(heap, (t + cfg.forward_delay_s, next(seq), "reach", (onward, job)))
            return
        node = cluster.nodes[target]
        done(node.arrive(job, t), t)
        schedule(node)

    while heap and len(finished) < len(requests):
        now, _, kind, data = heapq.heappop(heap)
        if kind == "arrive":
            r = data
            job = _job(r, block, now)
            target, forwarded = policy.route(job, r.tokens, now)
            job.forwarded = forwarded
            if forwarded:
                job.hops = 1
                pending[r.rid] = (r, r.tokens)
                heapq.heappush(heap, (now + cfg.forward_delay_s, next(seq), "reach", (target, job)))
            else:
                reach(target, job, r.tokens, now, 0)
        elif kind == "reach":
            target, job = data
            _, tokens = pending.pop(job.rid)
            reach(target, job, tokens, now, job.hops)
        elif kind == "node":
            idx, epoch = data
            node = cluster.nodes[idx]
            if node.epoch != epoch:
                continue
            done(node.process(now), now)
            schedule(node)
        elif kind == "gossip":
            policy.gossip(data, now)
            heapq.heappush(heap, (now + ROUTING.gossip_interval_s, next(seq), "gossip", data))
    return _summarise(workload, cfg, policy, rate, load, finished, now, time.perf_counter() - t0)


def _summarise(workload, cfg, policy, rate, load, jobs, sim_s, wall) -> RunResult:
    skip = int(cfg.warmup_fraction * (max(j.rid for j in jobs) + 1))
    jobs = [j for j in jobs if j.rid >= skip]
    lat = np.array([j.finish - j.arrival for j in jobs])
    ttft = np.array([j.first_token - j.arrival for j in jobs])
    hit = sum(j.cached for j in jobs) / max(1, sum(j.n_tokens for j in jobs))
    fwd = sum(j.forwarded for j in jobs) / max(1, len(jobs))
    tree_hit = policy.stats().get("tree_hit_rate", math.nan)
    return RunResult(workload, cfg.nodes, cfg.seed, load, policy.name, rate, len(jobs),
                     float(lat.mean()), float(np.percentile(lat, 99)), float(ttft.mean()),
                     float(np.percentile(ttft, 99)), hit, fwd, tree_hit, sim_s, wall)


# ----------------------------------------------------------------------------- experiment


def nocache_capacity(workload: str, cfg: SimConfig, factory: RequestFactory) -> float:
    """Requests/s the group could serve with no prefix cache: the unit of the load grid.

    Per request and node: prefill of the whole prompt alone, plus its share of decode steps
    in a batch of 32 sequences of the workload's mean context."""
    reqs = generate(workload, 1.0, 300, cfg.seed + 99, factory)
    mean_tokens = float(np.mean([len(r.tokens) for r in reqs]))
    mean_out = float(np.mean([r.out_len for r in reqs]))
    per_s = 0.0
    for i in range(cfg.nodes):
        p = PROFILES[cfg.profiles[i % len(cfg.profiles)]]
        decode = mean_out * p.decode_step_s(32, mean_tokens + mean_out / 2) / 32
        per_s += 1.0 / (p.prefill_s(int(mean_tokens)) + decode)
    return per_s


@dataclass(frozen=True)
class Grid:
    workloads: tuple[str, ...]
    node_counts: tuple[int, ...]
    seeds: tuple[int, ...]
    loads: tuple[float, ...]
    policies: tuple[str, ...] = POLICIES
    profiles: tuple[str, ...] = GPU_PAIR
    sim_seconds: float = 90.0  # requests per run: the load's rate times this...
    min_requests: int = 300  # ...but at least this many
    max_requests: int = 6000  # ...and at most this many
    routing: RoutingParams = ROUTING

    def groups(self) -> list[tuple[str, int, int, float]]:
        return [(w, n, s, f) for w in self.workloads for n in self.node_counts
                for s in self.seeds for f in self.loads]


FULL = Grid(workloads=tuple(WORKLOADS), node_counts=(4, 8, 16, 32), seeds=(1, 2, 3),
            loads=(0.5, 1.0, 1.5))
# This machine's measured engine (SmolLM2-135M on 2 CPU cores): every node alike; only the
# workloads whose prompts fit its 8k context (ToolUse and LongDoc documents do not).
CPU = Grid(workloads=("coding", "chat", "sysprompt", "rag"), node_counts=(4, 8), seeds=(1, 2, 3),
           loads=(0.5, 1.0, 1.5), profiles=("cpu-smollm2",))
QUICK = Grid(workloads=("tooluse", "chat"), node_counts=(4,), seeds=(1,), loads=(1.0,),
             sim_seconds=30.0, min_requests=150, max_requests=400)


def ideal_bound(cfg: SimConfig, requests: list[Request], rate: float, workload: str,
                load: float) -> RunResult:
    """Not a router: each request alone on the fastest engine, with every block any earlier
    request had already computed served from cache. No routing can beat its mean or p99
    (queueing and decode batching only add), so where it is not 50 % below no forwarding,
    that goal is out of reach for any policy."""
    fast = max((PROFILES[p] for p in cfg.profiles), key=lambda p: (p.capacity_score, -p.floor_s))
    seen: set[int] = set()
    lat, ttft, hit, total = [], [], 0, 0
    skip = int(cfg.warmup_fraction * len(requests))
    for r in sorted(requests, key=lambda r: r.rid):
        keys = block_keys(r.tokens, fast.block_tokens)
        cached = 0
        for k in keys:
            if k not in seen:
                break
            cached += 1
        cached = min(cached * fast.block_tokens, len(r.tokens) - 1)
        seen.update(keys)
        if r.reply is not None:
            seen.update(block_keys(np.concatenate([r.tokens, r.reply]), fast.block_tokens))
        if r.rid < skip:
            continue
        first = fast.prefill_s(len(r.tokens), cached)
        ttft.append(first)
        lat.append(first + (r.out_len - 1) * fast.decode_step_s(1, len(r.tokens) + r.out_len / 2))
        hit += cached
        total += len(r.tokens)
    lat_a, ttft_a = np.array(lat), np.array(ttft)
    return RunResult(workload, cfg.nodes, cfg.seed, load, "ideal", rate, len(lat),
                     float(lat_a.mean()), float(np.percentile(lat_a, 99)), float(ttft_a.mean()),
                     float(np.percentile(ttft_a, 99)), hit / max(1, total), 0.0, math.nan, 0.0, 0.0)


def run_group(grid: Grid, group: tuple[str, int, int, float]) -> list[RunResult]:
    w, nodes, seed, load = group
    cfg = SimConfig(nodes=nodes, seed=seed, profiles=grid.profiles, routing=grid.routing)
    factory = RequestFactory(seed)
    rate = round(nocache_capacity(w, cfg, factory) * load, 3)
    n = int(min(grid.max_requests, max(grid.min_requests, rate * grid.sim_seconds)))
    reqs = generate(w, rate, n, seed, factory)
    out = [simulate(cfg, p, reqs, rate, w, load) for p in grid.policies]
    return out + [ideal_bound(cfg, reqs, rate, w, load)]


def run_grid(grid: Grid, log=lambda s: print(s, file=sys.stderr, flush=True), jobs: int = 1,
             done: list[RunResult] | None = None, sink=None) -> list[RunResult]:
    """Every group of the grid not already in `done`; `sink(rows)` gets each group's rows as
    it finishes (the CLI appends them to the CSV, so an interrupted sweep resumes)."""
    results = list(done or [])
    have = {(r.workload, r.nodes, r.seed, r.load) for r in results}
    groups = [g for g in grid.groups() if g not in have]
    t0 = time.perf_counter()

    def finish(k: int, g, rows: list[RunResult]) -> None:
        results.extend(rows)
        if sink is not None:
            sink(rows)
        _log_group(log, k, len(groups), g, rows, t0)

    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(jobs) as ex:
            futures = [ex.submit(run_group, grid, g) for g in groups]
            for k, (g, f) in enumerate(zip(groups, futures), 1):
                finish(k, g, f.result())
    else:
        for k, g in enumerate(groups, 1):
            finish(k, g, run_group(grid, g))
    return results


def _log_group(log, k: int, total: int, group, res: list[RunResult], t0: float) -> None:
    by = {r.policy: r for r in res}
    elapsed = time.perf_counter() - t0
    parts = " ".join(f"{p}={r.mean_s:.2f}/{r.p99_s:.1f}" for p, r in by.items())
    w, nodes, seed, load = group
    log(f"[{k}/{total}] {w} {nodes}n seed {seed} load {load}: mean/p99 s {parts} "
        f"({elapsed:.0f} s elapsed, ~{elapsed / k * (total - k):.0f} s left)")


# ----------------------------------------------------------------------------- outputs


def group_rows(results: list[RunResult]) -> list[dict]:
    """Per group: ours (and the oracle and the ideal bound) relative to no forwarding and to
    SGLang, as ratio - 1; which goals are met."""
    by: dict[tuple, dict[str, RunResult]] = {}
    for r in results:
        by.setdefault((r.workload, r.nodes, r.seed, r.load), {})[r.policy] = r
    rows = []
    for key in sorted(by, key=lambda k: (list(WORKLOADS).index(k[0]), k[1], k[3], k[2])):
        g = by[key]
        if not {"ours", "no_forward", "sglang"} <= set(g):
            continue
        nf, sg = g["no_forward"], g["sglang"]
        row = {"workload": key[0], "nodes": key[1], "seed": key[2], "load": key[3],
               "rate": g["ours"].rate, "runs": g}
        for name in ("ours", "sglang", "oracle", "ideal", "least_load"):
            if name in g:
                row[f"{name}_vs_nf_mean"] = g[name].mean_s / nf.mean_s - 1
                row[f"{name}_vs_nf_p99"] = g[name].p99_s / nf.p99_s - 1
        row["vs_nf_mean"], row["vs_nf_p99"] = row["ours_vs_nf_mean"], row["ours_vs_nf_p99"]
        row["vs_sg_mean"] = g["ours"].mean_s / sg.mean_s - 1
        row["vs_sg_p99"] = g["ours"].p99_s / sg.p99_s - 1
        shared = WORKLOADS[key[0]].shared_prefixes
        row["goal_nf"] = (not shared) or (row["vs_nf_mean"] <= -0.5 and row["vs_nf_p99"] <= -0.5)
        row["goal_sg"] = row["vs_sg_mean"] <= 0.10 and row["vs_sg_p99"] <= 0.10
        ideal = g.get("ideal")
        row["nf_reachable"] = ideal is None or (ideal.mean_s <= 0.5 * nf.mean_s
                                                and ideal.p99_s <= 0.5 * nf.p99_s)
        rows.append(row)
    return rows


def headline(results: list[RunResult]) -> dict:
    """The figures the README quotes: per workload, over all its groups (ratio - 1)."""
    rows = group_rows(results)

    def summary(rs: list[dict]) -> dict:
        f: dict = {"groups": len(rs), "goal_nf_met": sum(r["goal_nf"] for r in rs),
                   "goal_nf_reachable": sum(r["nf_reachable"] for r in rs),
                   "goal_sg_met": sum(r["goal_sg"] for r in rs)}
        for k in ("vs_nf_mean", "vs_nf_p99", "vs_sg_mean", "vs_sg_p99"):
            v = np.array([r[k] for r in rs])
            f[k] = {"median": round(float(np.median(v)), 3), "best": round(float(v.min()), 3),
                    "worst": round(float(v.max()), 3)}
        return f

    out: dict = {"sim": "routing", **{k: v for k, v in summary(rows).items() if not k.startswith("vs_")}}
    out["workloads"] = {w: summary([r for r in rows if r["workload"] == w])
                        for w in WORKLOADS if any(r["workload"] == w for r in rows)}
    return out


FIELDS = list(RunResult.__dataclass_fields__)


def _csv_row(r: RunResult) -> list:
    return [f"{v:.4f}" if isinstance(v, float) else v for v in (getattr(r, f) for f in FIELDS)]


def write_csv(results: list[RunResult], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(FIELDS)
        w.writerows(_csv_row(r) for r in results)


def append_csv(rows: list[RunResult], path: Path) -> None:
    new = not path.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", newline="") as fh:
        w = csv.writer(fh)
        if new:
            w.writerow(FIELDS)
        w.writerows(_csv_row(r) for r in rows)


def load_csv(path: Path) -> list[RunResult]:
    conv = {"str": str, "int": int, "float": float}
    types = RunResult.__annotations__
    with open(path) as fh:
        return [RunResult(**{k: conv[types[k]](v) for k, v in row.items()}) for row in csv.DictReader(fh)]


def write_outputs(results: list[RunResult], out_dir: Path, stem: str, grid: Grid) -> dict:
    """CSV (complete, in grid order), markdown and PNG; returns the headline."""
    order = {g: i for i, g in enumerate(grid.groups())}
    results = sorted(results, key=lambda r: (order.get((r.workload, r.nodes, r.seed, r.load), 1e9),
                                             (POLICIES + ("ideal",)).index(r.policy)))
    write_csv(results, out_dir / f"{stem}.csv")
    head = headline(results)
    from sims import routing_report
    routing_report.write(results, group_rows(results), head, out_dir, stem, grid)
    return head


GRIDS = {"gpu": FULL, "cpu": CPU, "quick": QUICK}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", choices=tuple(GRIDS), default="gpu",
                    help="gpu: H100/A100 groups (default); cpu: this machine's measured engine; "
                         "quick: a small run for tests")
    ap.add_argument("--quick", action="store_true", help="same as --grid quick")
    ap.add_argument("--out", default="results/sims", help="output folder")
    ap.add_argument("--replot", action="store_true", help="re-render md/PNG from the CSV only")
    ap.add_argument("--fresh", action="store_true", help="ignore groups already in the CSV")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (results do not change)")
    ap.add_argument("--workloads", default=None, help="comma-separated subset (this run only)")
    ap.add_argument("--nodes", default=None, help="comma-separated node counts (this run only)")
    args = ap.parse_args(argv)
    name = "quick" if args.quick else args.grid
    grid = GRIDS[name]
    stem = {"gpu": "routing", "cpu": "routing_cpu", "quick": "routing_quick"}[name]
    out = Path(args.out)
    csv_path = out / f"{stem}.csv"
    t0 = time.perf_counter()
    done = [] if args.fresh or not csv_path.exists() else load_csv(csv_path)
    if args.fresh and csv_path.exists():
        csv_path.unlink()
    if not args.replot:
        run = grid
        if args.workloads:
            run = replace(run, workloads=tuple(args.workloads.split(",")))
        if args.nodes:
            run = replace(run, node_counts=tuple(int(x) for x in args.nodes.split(",")))
        todo = len([g for g in run.groups() if g not in {(r.workload, r.nodes, r.seed, r.load) for r in done}])
        print(f"routing sim ({name}): {todo} of {len(run.groups())} groups to run, "
              f"{len(run.policies)} policies each", file=sys.stderr, flush=True)
        done = run_grid(run, jobs=args.jobs, done=done, sink=lambda rows: append_csv(rows, csv_path))
    wanted = set(grid.groups())
    complete = [r for r in done if (r.workload, r.nodes, r.seed, r.load) in wanted]
    head = write_outputs(complete, out, stem, grid)
    print(f"wrote {out}/{stem}.md, .csv, PNG in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    print(json.dumps(head), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
