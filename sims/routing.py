"""Routing simulator: HR-tree + load balancing vs. cache-aware and cache-blind baselines.

A discrete-event model of a group of 8 or 16 heterogeneous model nodes (half A100-like, half
A6000-like; see `sims/routing_engine.py` -- the cost profiles are documented estimates that
`bench/routing.py` is to re-calibrate on the real engine), Poisson arrivals at several rates
and four workloads (`sims/routing_workloads.py`). Policies:

- random           each request is served where it enters the group (no forwarding);
- round_robin      a central dispatcher cycling over the nodes;
- least_load       a central dispatcher with instant loads: min active / capacity score;
- ours             GenTorrent: the request enters at a random node, which runs the REAL
                   cores -- `Sentry.observe`, `LayoutSwitchingTree.search` (an `HRTree` per
                   chunk layout), `policy.choose_node` -- on its own view: its own subtree
                   and load are fresh, peers' subtrees (`export_delta`/`merge_delta`), loads
                   and Sentry statistics/layouts arrive by gossip every 5 s (staggered), so
                   they are up to 5 s stale; a forward costs `forward_delay_s`, updates the
                   forwarder's table (`note_forwarded`) and tree (optimistic `insert`); the
                   serving node inserts the prompt in its own subtree; a forwarded request is
                   never forwarded again; the Sentry refreshes L after 250 requests;
- sglang           SGLang's `cache_aware` router (sgl-router cache_aware.rs) as a central
                   router: imbalanced if max-min load > 64 and max > 1.5 min -> least load;
                   else the best prefix match if its match rate > 0.3, else the worker with the
                   smallest tree; its trees are approximate (what it routed), LRU-bounded by
                   each worker's KV capacity; loads are instant and absolute;
- oracle           a central greedy router with perfect instant knowledge of every node's real
                   prefix cache and queue: min estimated time to first token.

Outputs go to results/sims/routing.{md,csv} and results/sims/routing_<workload>.png.
`python -m sims.routing` is the default run (8 and 16 nodes, 4 workloads, 4 rates, 6 policies,
800 requests each: ~100 s of CPU; wall time grows with machine load); `--quick` a small one
for tests (8 nodes, ToolUse and Mixed, 2 rates, 300 requests: ~5 s of CPU).
Rates are multiples (0.5, 0.75, 1, 1.5) of what the group could serve with no prefix cache.
"""

from __future__ import annotations

import argparse
import csv
import heapq
import itertools
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from gentorrent.config import ROUTING, RoutingParams
from gentorrent.routing.chunking import ChunkHasher
from gentorrent.routing.hrtree import HRTree, LayoutSwitchingTree, NodeTable
from gentorrent.routing.policy import choose_node
from gentorrent.routing.sentry import Sentry
from sims.routing_engine import PROFILES, Job, SimNode, block_keys
from sims.routing_workloads import WORKLOADS, RequestFactory, generate

POLICIES = ("random", "round_robin", "least_load", "sglang", "ours", "oracle")


@dataclass(frozen=True)
class SimConfig:
    nodes: int = 8
    profiles: tuple[str, ...] = ("a100-8b", "a6000-8b")  # alternated over the nodes
    forward_delay_s: float = 0.02  # one extra model-node-to-model-node hop
    gossip_interval_s: float = ROUTING.gossip_interval_s
    # the cores' parameters, adapted to 8B-on-GPU prompts of ~2k-16k tokens: 256-token
    # default chunks keep trees at a few thousand nodes per member; the Sentry refreshes
    # after 250 requests so that a layout switch happens inside every run.
    routing: RoutingParams = replace(ROUTING, default_chunk_length=256, sentry_refresh_requests=250)
    # statistics leave out the first 10 % of requests: every policy starts with cold caches
    # and the gossiping ones with no view of their peers until the first round (5 s); the
    # figures are for a group that has been running
    warmup_fraction: float = 0.1
    sglang_balance_abs: int = 64
    sglang_balance_rel: float = 1.5
    sglang_cache_threshold: float = 0.3
    seed: int = 1


# ----------------------------------------------------------------------------- policies


class Cluster:
    """The nodes and what every central policy may look at."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.nodes = [SimNode(i, PROFILES[cfg.profiles[i % len(cfg.profiles)]])
                      for i in range(cfg.nodes)]
        self.block = self.nodes[0].profile.block_tokens


class Policy:
    name = "base"
    central = True  # requests reach the chosen node without an extra hop

    def __init__(self, cluster: Cluster, rng: np.random.Generator) -> None:
        self.cluster = cluster
        self.rng = rng

    def route(self, job: Job, tokens: np.ndarray, now: float) -> tuple[int, bool]:
        raise NotImplementedError

    def on_arrival_at_node(self, idx: int, job: Job, tokens: np.ndarray, now: float) -> None:
        pass

    def gossip(self, idx: int, now: float) -> None:
        pass


class RandomPolicy(Policy):
    name = "random"

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


class SGLangCacheAware(Policy):
    """sgl-router's cache_aware rule over per-worker approximate trees (block-granular)."""

    name = "sglang"

    def __init__(self, cluster, rng):
        super().__init__(cluster, rng)
        from sims.routing_engine import PrefixCache
        self.trees = [PrefixCache(n.profile.kv_tokens // n.profile.block_tokens)
                      for n in cluster.nodes]

    def route(self, job, tokens, now):
        cfg = self.cluster.cfg
        loads = [n.active for n in self.cluster.nodes]
        hi, lo = max(loads), min(loads)
        if hi - lo > cfg.sglang_balance_abs and hi > lo * cfg.sglang_balance_rel:
            target = loads.index(lo)
        else:
            matches = [t.match(job.keys) for t in self.trees]
            best = max(range(len(matches)), key=lambda i: (matches[i], -i))
            rate = matches[best] * job.block / max(1, job.n_tokens)
            if rate > cfg.sglang_cache_threshold:
                target = best
            else:
                target = min(range(len(self.trees)), key=lambda i: (len(self.trees[i]), i))
        self.trees[target].insert(job.keys)
        return target, False


class OraclePolicy(Policy):
    """Greedy on perfect instant state: min (queued prefill + own uncached prefill) time."""

    name = "oracle"

    def route(self, job, tokens, now):
        best, best_t = 0, math.inf
        for n in self.cluster.nodes:
            unc = n.uncached_if_sent(job.keys, job.n_tokens, job.block)
            p = n.profile
            t = (n.pending_prefill_tokens() + unc) * p.prefill_s_per_token \
                + len(n.dec) * p.decode_per_seq_s * 20 + len(n.queue) * p.decode_base_s
            if t < best_t:
                best, best_t, best_unc = n.idx, t, unc
        job.est_uncached = best_unc
        return best, False


class OursPolicy(Policy):
    """GenTorrent: each node decides alone with its HR-tree, node table and Sentry."""

    name = "ours"
    central = False

    def __init__(self, cluster, rng):
        super().__init__(cluster, rng)
        cfg = cluster.cfg
        self.params = cfg.routing
        self.ids = [f"m{i:02d}" for i in range(len(cluster.nodes))]
        self.hasher = ChunkHasher(self.params.hash_bits, self.params.hash_seed)
        self.sentries = [Sentry(i, self.params) for i in self.ids]
        self.tables = [NodeTable(self.params) for _ in self.ids]
        self.trees = [self._new_tree(i, self.sentries[i].layout) for i in range(len(self.ids))]
        for t in self.tables:
            for i, n in enumerate(cluster.nodes):
                t.update(self.ids[i], active=0, capacity=n.profile.capacity_score, now=0.0)
        self.forwards = 0
        self.tree_hits = 0
        self.decisions = 0
        self.layout_switches = 0
        self.delta_bytes = 0
        self.deltas = 0

    def _new_tree(self, i: int, layout) -> LayoutSwitchingTree:
        tree = LayoutSwitchingTree(HRTree(self.ids[i], layout, self.params, self.hasher))
        for j, n in enumerate(self.cluster.nodes):
            tree.set_kv_capacity(self.ids[j], n.profile.kv_tokens)
        return tree

    def route(self, job, tokens, now):
        entry = int(self.rng.integers(len(self.ids)))
        me = self.cluster.nodes[entry]
        self.sentries[entry].observe(tokens)
        table = self.tables[entry]
        table.update(self.ids[entry], active=me.active, capacity=me.profile.capacity_score,
                     now=now)
        tree = self.trees[entry]
        match = tree.search(tokens, now)
        d = choose_node(self.ids[entry], match, table, hops=0, now=now, params=self.params)
        self.decisions += 1
        self.tree_hits += bool(match.candidates)
        target = self.ids.index(d.node_id)
        if d.forward:
            self.forwards += 1
            table.note_forwarded(d.node_id)
            tree.insert(tokens, d.node_id, now)  # optimistic, replaced by its next delta
        return target, d.forward

    def on_arrival_at_node(self, idx, job, tokens, now):
        # the serving node records what its engine is about to hold (its own subtree)
        self.trees[idx].insert(tokens, self.ids[idx], now)

    def gossip(self, i, now):
        """Node i's gossip round: its subtree delta, load and Sentry state to every peer."""
        me = self.cluster.nodes[i]
        src = self.trees[i]
        full = None
        for j in range(len(self.ids)):
            if j == i:
                continue
            dst = self.trees[j]
            since = dst.version(self.ids[i]) if dst.layout.layout_id == src.layout.layout_id else -1
            if since < src.version(self.ids[i]):
                if full is None:
                    full = src.export_delta(self.ids[i], 0)
                data = full
            else:
                data = src.export_delta(self.ids[i], since)  # header only
            self.delta_bytes += len(data)
            self.deltas += 1
            dst.merge_delta(data, now)
            self.tables[j].update(self.ids[i], active=me.active,
                                  capacity=me.profile.capacity_score, now=now)
            self.sentries[j].merge_stats(self.sentries[i].export_stats())
            if self.sentries[j].merge_layout(self.sentries[i].export_layout(), self.ids[i],
                                             self.ids, now) is not None:
                self._switch(j, now)
        if self.sentries[i].tick(self.ids, now) is not None:
            self._switch(i, now)

    def _switch(self, j: int, now: float) -> None:
        self.layout_switches += 1
        self.trees[j].switch(self.sentries[j].layout, now)


POLICY_CLASSES = {c.name: c for c in (RandomPolicy, RoundRobinPolicy, LeastLoadPolicy,
                                      SGLangCacheAware, OursPolicy, OraclePolicy)}


# ----------------------------------------------------------------------------- event loop


@dataclass
class RunResult:
    workload: str
    nodes: int
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
    wall_s: float


def simulate(cfg: SimConfig, policy_name: str, requests, rate: float, workload: str) -> RunResult:
    t0 = time.perf_counter()
    cluster = Cluster(cfg)
    rng = np.random.default_rng([cfg.seed, POLICIES.index(policy_name)])
    policy = POLICY_CLASSES[policy_name](cluster, rng)
    block = cluster.block
    max_len = max(len(r.tokens) for r in requests)
    mult = np.random.default_rng(12345).integers(1, 2**63, max_len, dtype=np.uint64) | np.uint64(1)
    heap: list = []
    seq = itertools.count()
    for r in requests:
        heapq.heappush(heap, (r.arrival, next(seq), "arrive", r))
    if not policy.central:
        n = len(cluster.nodes)
        for i in range(n):
            heapq.heappush(heap, (cfg.gossip_interval_s * (i + 1) / n, next(seq), "gossip", i))
    tokens_of: dict[int, np.ndarray] = {}
    finished: list[Job] = []
    pending = len(requests)

    def schedule(node: SimNode) -> None:
        t = node.next_time()
        if t < math.inf:
            heapq.heappush(heap, (t, next(seq), "node", (node.idx, node.epoch)))

    while heap and pending:
        now, _, kind, data = heapq.heappop(heap)
        if kind == "arrive":
            r = data
            job = Job(r.rid, r.arrival, len(r.tokens), r.out_len,
                      block_keys(r.tokens, block, mult), block)
            target, forwarded = policy.route(job, r.tokens, now)
            job.forwarded = forwarded
            if forwarded:
                tokens_of[r.rid] = r.tokens
                heapq.heappush(heap, (now + cfg.forward_delay_s, next(seq), "reach", (target, job)))
            else:
                _reach(cluster, policy, target, job, r.tokens, now, finished, schedule)
        elif kind == "reach":
            target, job = data
            _reach(cluster, policy, target, job, tokens_of.pop(job.rid), now, finished, schedule)
        elif kind == "node":
            idx, epoch = data
            node = cluster.nodes[idx]
            if node.epoch != epoch:
                continue
            finished += node.process(now)
            schedule(node)
        elif kind == "gossip":
            policy.gossip(data, now)
            heapq.heappush(heap, (now + cfg.gossip_interval_s, next(seq), "gossip", data))
        pending = len(requests) - len(finished)
    return _summarise(workload, cfg, policy, rate, finished, time.perf_counter() - t0)


def _reach(cluster, policy, target, job, tokens, now, finished, schedule) -> None:
    policy.on_arrival_at_node(target, job, tokens, now)
    node = cluster.nodes[target]
    if not job.est_uncached:
        job.est_uncached = node.uncached_if_sent(job.keys, job.n_tokens, job.block)
    finished += node.arrive(job, now)
    schedule(node)


def _summarise(workload, cfg, policy, rate, jobs, wall) -> RunResult:
    skip = int(cfg.warmup_fraction * len(jobs))
    jobs = [j for j in jobs if j.rid >= skip]
    lat = np.array([j.finish - j.arrival for j in jobs])
    ttft = np.array([j.first_token - j.arrival for j in jobs])
    hit = sum(j.cached for j in jobs) / max(1, sum(j.n_tokens for j in jobs))
    fwd = sum(j.forwarded for j in jobs) / max(1, len(jobs))
    tree_hit = policy.tree_hits / policy.decisions if getattr(policy, "decisions", 0) else math.nan
    return RunResult(workload, cfg.nodes, policy.name, rate, len(jobs), float(lat.mean()),
                     float(np.percentile(lat, 99)), float(ttft.mean()),
                     float(np.percentile(ttft, 99)), hit, fwd, tree_hit, wall)


# ----------------------------------------------------------------------------- experiment


def nocache_capacity(workload: str, cfg: SimConfig, factory: RequestFactory) -> float:
    """Requests/s the group could serve with no prefix cache: the unit of the rate grid.

    Per request and node: prefill of the whole prompt, plus its share of decode steps in a
    nominal batch of 32 sequences."""
    reqs = generate(workload, 1.0, 300, cfg.seed + 99, factory)
    mean_tokens = float(np.mean([len(r.tokens) for r in reqs]))
    mean_out = float(np.mean([r.out_len for r in reqs]))
    per_s = 0.0
    for i in range(cfg.nodes):
        p = PROFILES[cfg.profiles[i % len(cfg.profiles)]]
        decode = mean_out * (p.decode_base_s + 32 * p.decode_per_seq_s) / 32
        per_s += 1.0 / (mean_tokens * p.prefill_s_per_token + decode)
    return per_s


def run_grid(node_counts, workloads, load_factors, n_requests, policies, seed=1, log=print):
    results: list[RunResult] = []
    factory = RequestFactory(seed)
    for nodes in node_counts:
        cfg = SimConfig(nodes=nodes, seed=seed)
        for w in workloads:
            unit = nocache_capacity(w, cfg, factory)
            for f in load_factors:
                rate = round(unit * f, 2)
                reqs = generate(w, rate, n_requests, seed, factory)
                for p in policies:
                    res = simulate(cfg, p, reqs, rate, w)
                    results.append(res)
                    log(f"  {nodes:2d} nodes {w:8s} rate {rate:6.2f}/s {p:12s} mean {res.mean_s:7.2f}s "
                        f"p99 {res.mean_s and res.p99_s:7.2f}s ttft {res.ttft_mean_s:6.2f}s "
                        f"hit {res.hit_rate:5.1%} fwd {res.forward_rate:5.1%} ({res.wall_s:.1f}s)")
    return results


def write_outputs(results: list[RunResult], out_dir: Path, stem: str = "routing") -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    fields = list(RunResult.__dataclass_fields__)
    with open(out_dir / f"{stem}.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(fields)
        for r in results:
            w.writerow([getattr(r, f) if not isinstance(getattr(r, f), float)
                        else f"{getattr(r, f):.4f}" for f in fields])
    headline = headline_figures(results)
    lines = ["# Routing simulator results", "",
             "Generated by `python -m sims.routing` (sims/routing.py). Serving costs are the "
             "documented estimates of sims/routing_engine.py, not yet calibrated on a real engine.",
             "", "## Headline (averaged over the rate grid)", "",
             "| nodes | workload | ours vs round robin: mean | p99 | ours vs SGLang-style: mean | p99 |",
             "|---|---|---|---|---|---|"]
    for (nodes, w), h in sorted(headline.items()):
        lines.append(f"| {nodes} | {w} | {h['mean_vs_rr']:+.1%} | {h['p99_vs_rr']:+.1%} | "
                     f"{h['mean_vs_sglang']:+.1%} | {h['p99_vs_sglang']:+.1%} |")
    lines += ["", "## Ours against the baselines, per rate", "",
              "| nodes | workload | rate/s | vs RR mean | vs RR p99 | vs RR TTFT | vs SGLang mean "
              "| vs SGLang p99 | hit ours / RR / SGLang / oracle |",
              "|---|---|---|---|---|---|---|---|---|"]
    by = {(r.nodes, r.workload, r.rate, r.policy): r for r in results}
    for (nodes, w, rate, pol), o in sorted(by.items()):
        rr, sg, orc = (by.get((nodes, w, rate, b)) for b in ("round_robin", "sglang", "oracle"))
        if pol != "ours" or rr is None or sg is None or orc is None:
            continue
        lines.append(f"| {nodes} | {w} | {rate:.2f} | {o.mean_s / rr.mean_s - 1:+.0%} | "
                     f"{o.p99_s / rr.p99_s - 1:+.0%} | {o.ttft_mean_s / rr.ttft_mean_s - 1:+.0%} | "
                     f"{o.mean_s / sg.mean_s - 1:+.0%} | {o.p99_s / sg.p99_s - 1:+.0%} | "
                     f"{o.hit_rate:.0%} / {rr.hit_rate:.0%} / {sg.hit_rate:.0%} / {orc.hit_rate:.0%} |")
    lines += ["", "Negative = lower latency than the baseline.", "", "## All runs", "",
              "| nodes | workload | rate/s | policy | mean s | p99 s | TTFT mean s | TTFT p99 s "
              "| cache hit | forwarded | tree hit |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.nodes} | {r.workload} | {r.rate:.2f} | {r.policy} | {r.mean_s:.2f} | "
                     f"{r.p99_s:.2f} | {r.ttft_mean_s:.2f} | {r.ttft_p99_s:.2f} | {r.hit_rate:.1%} | "
                     f"{r.forward_rate:.1%} | {r.tree_hit_rate:.1%} |")
    (out_dir / f"{stem}.md").write_text("\n".join(lines) + "\n")
    _plots(results, out_dir, stem)
    return headline


def load_csv(path: Path) -> list[RunResult]:
    types = {f: t for f, t in RunResult.__annotations__.items()}
    conv = {"str": str, "int": int, "float": float}
    with open(path) as fh:
        return [RunResult(**{k: conv[types[k]](v) for k, v in row.items()})
                for row in csv.DictReader(fh)]


def headline_figures(results: list[RunResult]) -> dict:
    """Per (nodes, workload): relative change of ours vs round robin and vs sglang, averaged
    over the rates (mean of per-rate ratios - 1)."""
    out = {}
    keys = sorted({(r.nodes, r.workload) for r in results})
    for key in keys:
        by = {(r.policy, r.rate): r for r in results if (r.nodes, r.workload) == key}
        rates = sorted({rate for (_, rate) in by})

        def ratio(base, attr):
            vals = [getattr(by[("ours", x)], attr) / getattr(by[(base, x)], attr)
                    for x in rates if ("ours", x) in by and (base, x) in by]
            return float(np.mean(vals)) - 1 if vals else math.nan

        out[key] = {"mean_vs_rr": ratio("round_robin", "mean_s"),
                    "p99_vs_rr": ratio("round_robin", "p99_s"),
                    "mean_vs_sglang": ratio("sglang", "mean_s"),
                    "p99_vs_sglang": ratio("sglang", "p99_s")}
    return out


def _plots(results, out_dir: Path, stem: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    metrics = [("mean_s", "mean latency (s)"), ("p99_s", "p99 latency (s)"),
               ("ttft_mean_s", "mean TTFT (s)"), ("hit_rate", "prefix-cache hit rate")]
    for nodes in sorted({r.nodes for r in results}):
        for w in sorted({r.workload for r in results}):
            rs = [r for r in results if r.nodes == nodes and r.workload == w]
            if not rs:
                continue
            fig, axes = plt.subplots(1, 4, figsize=(18, 4))
            for ax, (attr, label) in zip(axes, metrics):
                for p in POLICIES:
                    pts = sorted((r.rate, getattr(r, attr)) for r in rs if r.policy == p)
                    if pts:
                        ax.plot(*zip(*pts), marker="o", label=p)
                ax.set_xlabel("request rate (req/s)")
                ax.set_ylabel(label)
                if attr != "hit_rate":
                    ax.set_yscale("log")
                ax.grid(alpha=0.3)
            axes[0].legend(fontsize=8)
            fig.suptitle(f"{WORKLOADS[w].name}, {nodes} heterogeneous model nodes")
            fig.tight_layout()
            fig.savefig(out_dir / f"{stem}_{w}_{nodes}n.png", dpi=90)
            plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small run (tests): 8 nodes, 2 rates")
    ap.add_argument("--out", default="results/sims", help="output folder")
    ap.add_argument("--requests", type=int, default=None, help="requests per run")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--replot", action="store_true", help="re-render md/PNG from the CSV only")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    if args.replot:
        stem = "routing_quick" if args.quick else "routing"
        write_outputs(load_csv(Path(args.out) / f"{stem}.csv"), Path(args.out), stem)
        return 0
    if args.quick:
        grid = dict(node_counts=(8,), workloads=("tooluse", "mixed"), load_factors=(0.75, 1.5),
                    n_requests=args.requests or 300, policies=POLICIES)
        stem = "routing_quick"
    else:
        grid = dict(node_counts=(8, 16), workloads=tuple(WORKLOADS), load_factors=(0.5, 0.75, 1.0, 1.5),
                    n_requests=args.requests or 800, policies=POLICIES)
        stem = "routing"
    print(f"routing sim: {grid}", flush=True)
    results = run_grid(seed=args.seed, log=lambda s: print(s, flush=True), **grid)
    headline = write_outputs(results, Path(args.out), stem)
    for (nodes, w), h in sorted(headline.items()):
        print(f"{nodes:2d} nodes {w:8s} ours vs RR: mean {h['mean_vs_rr']:+.1%} p99 {h['p99_vs_rr']:+.1%}"
              f" | vs SGLang: mean {h['mean_vs_sglang']:+.1%} p99 {h['p99_vs_sglang']:+.1%}")
    print(f"wrote {args.out}/{stem}.md, .csv, PNGs in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
