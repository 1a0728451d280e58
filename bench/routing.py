"""Routing on real model nodes: HR-tree + load balancing vs round robin, and the engine's cost.

    .venv/bin/python bench/routing.py [--nodes 3] [--requests 45] [--kv-blocks 16] [--tools 8]
    .venv/bin/python bench/routing.py --tiny [--node-info HOME/node.json]   # one node: what make test runs

Starts `--nodes` real `gt-model serve --forwarding` processes (vLLM, smollm2-135m) on
127.0.0.1 with a small KV cache (`--kv-blocks` blocks of 128 tokens each, so eviction
matters), lists them in a directory file (their group roster), and runs one ToolUse-like
stream twice, with fresh tool prompts each time (so one phase cannot reuse the other's cache):
- round robin: request i goes to node i mod n through the Forward RPC with hops = 1, which a
  node always serves itself (the routing policy is bypassed);
- HR-tree + LB: request i enters at node i mod n through Generate, and that node serves it
  or forwards it by its HR-tree and load table (gossip every --gossip-interval s).
ToolUse-like (paper §5, scaled to a CPU): --tools shared system prompts of --system-tokens
tokens, picked Zipf(1.1), each followed by a short distinct question; --output-tokens out;
--clients closed-loop clients (a CPU saturates at a few concurrent prefills).

Before the phases, node 0 measures the engine's serving cost on this machine: prefill
seconds per uncached token (TTFT slope between short and long fresh prompts) and decode
seconds per token (one stream) -- a cross-check, through a whole node, of the fuller profile
bench/engine_profile.py measures for the simulator (results/engine_profile_cpu.json).
The simulator (`python -m sims.routing`) compares the same policy against SGLang's router.

Prints ONE JSON line; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gentorrent.crypto import tls  # noqa: E402
from gentorrent.crypto.keys import NodeKeys  # noqa: E402
from devnet.supervisor import Supervisor, python_module, wait_until  # noqa: E402
from gentorrent.wire import gentorrent_pb2 as pb  # noqa: E402
from gentorrent.wire import gentorrent_pb2_grpc as rpc  # noqa: E402
from gentorrent.ledger.directory import StaticDirectory  # noqa: E402
from gentorrent.ledger.sections import ModelRecord  # noqa: E402

MODEL = "smollm2-135m"
WORDS = ("river stone cloud market engine silver garden letter window thunder paper orange "
         "mountain signal harbor candle meadow bridge lantern forest copper velvet island "
         "winter ladder circus falcon marble pepper saddle timber voyage walnut").split()


def _progress(msg: str) -> None:
    print(f"[bench/routing] {msg}", file=sys.stderr, flush=True)


def prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def tool_prompt(rng: random.Random, tag: str, words: int) -> str:
    """A tool/system prompt: a distinct head (so no two share a first block), then prose."""
    return f"[{tag}] You are a tool-using assistant. Tools and rules follow. " + prose(rng, words)


def zipf_choices(rng: random.Random, n_items: int, n: int, s: float = 1.1) -> list[int]:
    weights = [1 / (i + 1) ** s for i in range(n_items)]
    return rng.choices(range(n_items), weights=weights, k=n)


# --------------------------------------------------------------------------- nodes


class Group:
    def __init__(self, root: Path, n: int, kv_blocks: int, gossip_interval: float) -> None:
        self.root = root
        self.sup = Supervisor(root)
        self.n = n
        self.kv_blocks = kv_blocks
        self.gossip_interval = gossip_interval
        self.info: list[dict] = []
        self.channels: list = []

    def start(self, running: Path | None = None) -> None:
        """Start the n nodes; with `running` (a node.json of a `gt-model serve` already up), use
        that one node instead (a group of one: make test's tiny run on the session's node)."""
        if running is not None:
            self.info.append(json.loads(Path(running).read_text()))
            return
        directory = self.root / "directory.json"
        directory.write_text('{"users": [], "models": []}')
        homes = [self.root / f"node{i}" for i in range(self.n)]
        for i, home in enumerate(homes):
            home.mkdir(parents=True, exist_ok=True)
            (home / "config.toml").write_text(f"[model_node]\nkv_cache_blocks = {self.kv_blocks}\n"
                                               f"max_model_len = {min(8192, (self.kv_blocks - 1) * 128)}\n")  # vLLM keeps 1 block
            self.sup.spawn(f"node{i}", python_module(
                "model_node.cli", "serve", "--model", MODEL, "--home", str(home),
                "--listen", "127.0.0.1:0", "--stop-with-parent", "--forwarding",
                "--directory", str(directory), "--gossip-interval", str(self.gossip_interval)))
        for i, home in enumerate(homes):
            def ready(home=home, i=i) -> bool:
                if not self.sup.alive(f"node{i}"):
                    raise RuntimeError(f"node{i} exited; see {self.sup.logs}/node{i}.log")
                return (home / "node.json").exists()
            wait_until(ready, 1200, f"node{i} engine", _progress, poll_s=1.0)
            self.info.append(json.loads((home / "node.json").read_text()))
        registry = StaticDirectory(directory)
        for home, info in zip(homes, self.info):
            keys = NodeKeys.load_or_create(home)
            registry.add_model(ModelRecord(bytes.fromhex(info["node_id"]), bytes.fromhex(info["public_key"]),
                                           info["address"], MODEL, keys.onion.public_key,
                                           capacity=info["capacity"]))

    async def connect(self) -> None:
        for info in self.info:
            ch = await tls.connect(info["address"], Path(info["cert_file"]).read_bytes(), timeout=30)
            self.channels.append(rpc.ModelNodeStub(ch))

    async def status(self, i: int) -> dict:
        return json.loads((await self.channels[i].Status(pb.Empty(), timeout=60)).json)

    async def wait_formed(self, timeout: float = 180) -> None:
        ids = {info["node_id"] for info in self.info}
        deadline = time.monotonic() + timeout
        while True:
            views = [await self.status(i) for i in range(self.n)]
            if all(ids - {v["node_id"]} <= set(v["routing"].get("members", ())) for v in views):
                return
            if time.monotonic() > deadline:
                raise TimeoutError("the group never formed")
            await asyncio.sleep(1.0)

    def stop(self) -> None:
        self.sup.stop_all()


# --------------------------------------------------------------------------- requests


#: False on a node started without forwarding (--node-info: the session's): it serves every
#: Generate itself, which is what Forward with hops = 1 asks of a group member
FORWARD_RPC = True


async def timed(stub, prompt: str | None, max_tokens: int, hops: int = 0,
                token_ids: list[int] | None = None) -> dict:
    """Send one request; latency, TTFT and who served it."""
    req = pb.GenerateRequest(model=MODEL, prompt=prompt or "",
                             sampling=pb.SamplingParams(temperature=0.0, max_tokens=max_tokens))
    t0 = time.monotonic()
    call = stub.Forward(pb.ForwardRequest(request=req, hops=hops), timeout=600) if hops and FORWARD_RPC else \
        stub.Generate(req, timeout=600)
    first = None
    times = []
    served_by = ""
    async for chunk in call:
        now = time.monotonic()
        if chunk.token_ids:
            times.extend([now] * len(chunk.token_ids))
            first = first or now
        if chunk.final:
            served_by = chunk.served_by
    end = time.monotonic()
    return {"latency": end - t0, "ttft": (first or end) - t0, "served_by": served_by, "times": times}


async def measure_engine_cost(stub, rng: random.Random, tiny: bool = False) -> dict:
    """Prefill s/uncached token and decode s/token on node 0 (nothing else running); `tiny`:
    one short pair and an 8-token decode (make test's run)."""
    short, long_ = [], []
    tok_short, tok_long = (20, 120) if tiny else (60, 1500)  # each of WORDS is one SmolLM2 token (checked)
    for _ in range(1 if tiny else 3):  # fresh prose every time: nothing is cached
        short.append((await timed(stub, prose(rng, tok_short), 1, hops=1))["ttft"])
        long_.append((await timed(stub, prose(rng, tok_long), 1, hops=1))["ttft"])
    r = await timed(stub, "Count from 1 to 200 separated by commas: 1, 2, 3,", 8 if tiny else 96, hops=1)
    ts = r["times"]
    decode = (ts[-1] - ts[0]) / max(1, len(ts) - 1)
    return {"ttft_short_s": statistics.median(short), "ttft_long_s": statistics.median(long_),
            "prefill_s_per_token": (statistics.median(long_) - statistics.median(short)) / (tok_long - tok_short),
            "decode_s_per_token": decode, "decode_tokens": len(ts)}


async def run_phase(group: Group, policy: str, tools: list[str], picks: list[int], rng: random.Random,
                    clients: int, output_tokens: int) -> dict:
    before = [await group.status(i) for i in range(group.n)]
    queue = list(enumerate(picks))
    results: list[dict] = []

    async def client() -> None:
        while queue:
            i, tool = queue.pop(0)
            prompt = tools[tool] + f"\nUser: {prose(rng, 12)}?\nAssistant:"
            node = i % group.n
            r = await timed(group.channels[node], prompt, output_tokens, hops=1 if policy == "round_robin" else 0)
            r["entry"] = node
            results.append(r)
            if len(results) % 10 == 0:
                _progress(f"  {policy}: {len(results)}/{len(picks)} done")

    t0 = time.monotonic()
    await asyncio.gather(*(client() for _ in range(clients)))
    wall = time.monotonic() - t0
    after = [await group.status(i) for i in range(group.n)]
    q = sum(a["load"]["prefix_queries"] - b["load"]["prefix_queries"] for a, b in zip(after, before))
    h = sum(a["load"]["prefix_hits"] - b["load"]["prefix_hits"] for a, b in zip(after, before))
    lat = sorted(r["latency"] for r in results)
    ttft = sorted(r["ttft"] for r in results)
    def routing(key: str) -> int:  # a node without forwarding (--node-info: the session's) routes nothing
        return sum(a["routing"].get(key, 0) - b["routing"].get(key, 0) for a, b in zip(after, before))

    routed, fwd, hits = routing("requests"), routing("forwarded"), routing("tree_hits")
    served = {}
    for r in results:
        served[r["served_by"][:8]] = served.get(r["served_by"][:8], 0) + 1
    return {
        "mean_latency_s": round(statistics.mean(lat), 3),
        "p99_latency_s": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 3),
        "ttft_p50_s": round(statistics.median(ttft), 3),
        "ttft_mean_s": round(statistics.mean(ttft), 3),
        "cache_hit_rate": round(h / q, 4) if q else 0.0,
        "forward_rate": round(fwd / routed, 4) if routed else 0.0,
        "tree_hit_rate": round(hits / routed, 4) if routed else 0.0,
        "served_per_node": sorted(served.values(), reverse=True),
        "wall_s": round(wall, 1), "requests": len(results),
    }


async def run(args) -> dict:
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="gt-bench-routing-"))
    group = Group(root, args.nodes, args.kv_blocks, args.gossip_interval)
    t0 = time.monotonic()
    _progress(f"starting {args.nodes} model nodes (kv {args.kv_blocks} blocks each) under {root}")
    try:
        global FORWARD_RPC
        FORWARD_RPC = args.node_info is None
        await asyncio.to_thread(group.start, args.node_info)
        startup = time.monotonic() - t0
        await group.connect()
        await group.wait_formed()
        kv_tokens = (await group.status(0))["routing"].get("kv_capacity_tokens")
        _progress(f"group formed in {time.monotonic() - t0:.0f} s; KV per node {kv_tokens} tokens")
        cost = await measure_engine_cost(group.channels[0], rng, args.tiny)
        _progress(f"engine cost: {cost}")
        out = {"bench": "routing", "nodes": args.nodes, "model": MODEL, "kv_blocks_per_node": args.kv_blocks,
               "kv_tokens_per_node": kv_tokens, "tools": args.tools, "system_words": args.system_words,
               "requests_per_phase": args.requests, "clients": args.clients, "output_tokens": args.output_tokens,
               "gossip_interval_s": args.gossip_interval, "startup_s": round(startup, 1),
               "engine_cost": {k: round(v, 6) if isinstance(v, float) else v for k, v in cost.items()}}
        for policy in ("round_robin", "hrtree_lb"):
            tools = [tool_prompt(rng, f"{policy}-{t}", args.system_words) for t in range(args.tools)]
            picks = zipf_choices(rng, args.tools, args.requests)
            _progress(f"phase {policy}: {args.requests} requests")
            out[policy] = await run_phase(group, policy, tools, picks, rng, args.clients, args.output_tokens)
            _progress(f"  {policy}: {out[policy]}")
        rr, hr = out["round_robin"], out["hrtree_lb"]
        out["mean_latency_reduction"] = round(1 - hr["mean_latency_s"] / rr["mean_latency_s"], 3)
        out["ttft_p50_reduction"] = round(1 - hr["ttft_p50_s"] / rr["ttft_p50_s"], 3)
        out["wall_s"] = round(time.monotonic() - t0, 1)
        return out
    finally:
        await asyncio.to_thread(group.stop)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--requests", type=int, default=45, help="per phase")
    p.add_argument("--tools", type=int, default=8)
    p.add_argument("--system-words", type=int, default=600, help="one SmolLM2 token per word")
    p.add_argument("--output-tokens", type=int, default=16)
    p.add_argument("--clients", type=int, default=3)
    p.add_argument("--kv-blocks", type=int, default=16, help="KV blocks (128 tokens) per node")
    p.add_argument("--gossip-interval", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=6)
    p.add_argument("--tiny", action="store_true",
                   help="one node, 3 requests per phase: the code path in seconds after start-up (make test)")
    p.add_argument("--node-info", type=Path, default=None,
                   help="with --tiny: the node.json of a running gt-model serve to use as the group of one")
    args = p.parse_args()
    if args.tiny:
        args.nodes, args.requests, args.tools, args.system_words, args.clients = 1, 3, 2, 60, 1
        args.output_tokens = 4
    print(json.dumps(asyncio.run(run(args))), flush=True)


if __name__ == "__main__":
    main()
