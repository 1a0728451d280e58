"""Overlay overhead: an ask through 4 paths of 3 relays vs. a direct call to the same model node.

Starts 12 relays (`gt-user start`, one process each), one model node process, and an asking
user node in this process, all on 127.0.0.1 over pinned TLS. The model node is the echo
stand-in (testkit.echo_model: the real clove intake, keys and receipts; an engine that
answers instantly), so the difference between the two latencies is the overlay's own cost:
sealing, S-IDA, 4 hops each way per clove, reassembly, receipt check. Each pair of
measurements (overlay, direct) uses the same prompt; their order alternates.

    .venv/bin/python bench/overlay.py [--asks 200] [--png bench/overlay_cdf.png]
    .venv/bin/python bench/overlay.py --stream [--answers 3]     # streamed answers (below)
    .venv/bin/python bench/overlay.py --deployment [--stream]    # with a committee, audits, a gossiping group
    .venv/bin/python bench/overlay.py --tiny                     # seconds: what make test runs
    .venv/bin/python bench/overlay.py --pooled-paths             # paths shared by asks (before 2026-12-04)

The asker uses single-use paths, as shipped: every ask's 4 paths are built for it (in the
background, while the previous ask's are in use), so CPU per ask includes 4 establishments.

Prints one JSON line: p50/p99 of overlay, direct and overlay - direct, in ms (goal: <= 12 ms
added at p50, ARCHITECTURE.md §7), and the CPU one ask costs per role (`cpu_ms_per_ask`: the
asker, the 12 relays together, the model node; goal: <= 20 ms summed), measured in a second
phase of `--cpu-asks` overlay asks back to back, from /proc (every thread of every process).
On 2 cores the overlay is CPU-bound, so CPU per ask is the figure that moves least with the
load other programs put on the machine; latency is reported next to it.

`--deployment`: what a deployment runs around the same asks: a committee of 4 `gt-verifier`
processes (shipped timeouts) instead of a static directory, every node registering itself and
reading the light-client-checked directory, users handing audited asks in (sealed to each
member, over their paths, through proxies), and a model group of 2 echo nodes gossiping.
Reported under "deployment": the audit hand-in's CPU per audit and per ask at the audit rate;
the committee's CPU beside (not in) the per-ask figures; gossip, refreshes and renewals show in
`idle_ms_of_cpu_per_s`. Still left out: the members' audit desks (a member takes audits only
with verification epochs on, which need a reference engine) and every epoch's challenges and
scoring, forwarding within the group (echo nodes serve everything themselves), and churn.

`--stream`: the echo engine streams a `--stream-tokens` (500) answer over `--stream-s` (10 s),
one token at a time on a fixed schedule, as a real engine does. Reported under "stream": the
overlay CPU one answer costs over all 14 processes (net of what they burn idle over as long,
less what the echo engine itself spends on the answer, measured alone; goal <= 300 ms), what
the same answer costs by a direct Generate call (500 gRPC stream messages: for comparison),
the reply messages it took, the CPU per reply message ((the answer's overlay CPU - a one-chunk
ask's) / (messages - 1)) beside the floor: the same number of messages of the same size and
spacing carried by a bare chain of gRPC stream hops with TLS (testkit/bare_chain.py: 4 paths
of 3 hop processes that pass frames on, nothing else), measured in the same run (goal <= 1.5x);
time to first token added by the overlay (p50 goal <= 12 ms) and how long any token waited
beyond its schedule (goal: the reply window plus the path's own latency).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gentorrent.config import AUDITS, OVERLAY, CloveParams  # noqa: E402
from gentorrent.crypto import tls  # noqa: E402
from gentorrent.wire import gentorrent_pb2 as pb  # noqa: E402
from gentorrent.wire import gentorrent_pb2_grpc as rpc  # noqa: E402
from gentorrent.ledger.committee import CommitteeDirectory  # noqa: E402
from gentorrent.ledger.directory import StaticDirectory  # noqa: E402
from testkit.committee import free_base_port  # noqa: E402
from gentorrent.generation import make_request  # noqa: E402
from testkit import bare_chain  # noqa: E402
from user_client.asking import Answer  # noqa: E402
from user_client.node import UserNode  # noqa: E402

RELAYS = 12
PATHS, HOPS = 4, 3
MODEL_GROUP = 2  # --deployment: echo model nodes of one model, gossiping


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """CPU seconds of process `pid` so far, all its threads: the scheduler's nanosecond run
    times of its live threads (/proc/PID/task/*/schedstat; /proc/PID/stat counts in 10 ms
    ticks, too coarse for 14 processes and a few milliseconds a message), or, where those are
    missing, user + system ticks (which also keep what threads that ended used)."""
    try:
        return sum(int(Path(t, "schedstat").read_text().split()[0]) for t in Path(f"/proc/{pid}/task").iterdir()) / 1e9
    except (OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * _TICK_S


def _progress(msg: str) -> None:
    print(f"[bench/overlay {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _spawn(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=open(log, "wb"), start_new_session=True)


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()


class CpuMeter:
    """CPU seconds of this process and of a set of child processes, by role."""

    def __init__(self, roles: dict[str, list[int]]) -> None:
        self.roles = roles  # role -> pids; "self" is this process

    def sample(self) -> dict[str, float]:
        return {role: sum(time.process_time() if p == 0 else _cpu_s(p) for p in pids)
                for role, pids in self.roles.items()}

    @staticmethod
    def delta_ms(after: dict[str, float], before: dict[str, float], per: float) -> dict[str, float]:
        out = {role: round((after[role] - before[role]) * 1000 / per, 2) for role in after}
        out["total"] = round(sum(out.values()), 2)
        return out

    async def idle_ms_per_s(self, seconds: float) -> float:
        """What these processes burn doing nothing (timers, gRPC's threads), ms of CPU per second."""
        before = self.sample()
        await asyncio.sleep(seconds)
        return self.delta_ms(self.sample(), before, seconds)["total"]


async def run(args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="gt-bench-overlay-"))
    directory_path = work / "directory.json"
    procs: list[subprocess.Popen] = []
    try:
        committee: list[subprocess.Popen] = []
        if args.deployment:  # what a deployment runs: nodes register, read the committee's directory
            genesis = await _start_committee(work / "committee", committee)
            procs += committee
            where = ["--committee", str(genesis)]
        else:
            where = ["--directory", str(directory_path)]
        echo = ["--stream-tokens", str(args.stream_tokens), "--stream-s", str(args.stream_s)] if args.stream else []
        models = [_spawn(["-m", "testkit.echo_model", "--home", str(work / f"model{m}"), *where, *echo]
                         + (["--gossip"] if args.deployment else []), work / f"model{m}.log")
                  for m in range(MODEL_GROUP if args.deployment else 1)]
        procs += models
        model_info = json.loads(models[0].stdout.readline())
        for m in models[1:]:
            json.loads(m.stdout.readline())
        relays = [_spawn(["-m", "user_client.cli", "start", "--home", str(work / f"relay{i}"), *where],
                         work / f"relay{i}.log") for i in range(RELAYS)]
        procs += relays
        for p in relays:
            json.loads(p.stdout.readline())
        # two asks' worth of ready paths: with single-use paths (shipped) an ask takes 4 and the
        # next finds 4 more ready while the taken ones' replacements build (their CPU counts)
        cloves = CloveParams(n=PATHS, k=3, path_length=HOPS, proxies_kept=2 * PATHS,
                             single_use_paths=not args.pooled_paths)
        directory = (CommitteeDirectory.from_args(str(genesis), work / "asker") if args.deployment
                     else StaticDirectory(directory_path))
        me = UserNode(work / "asker", directory, cloves=cloves)
        await me.start(build_paths=False)
        for _ in range(30):  # relays learn of the asker, and each other, at their next directory refresh
            await asyncio.sleep(2)
            await me.refresh_directory()
            if await me.paths.fill() >= PATHS:
                break
        assert len(me.paths.pool.paths) >= PATHS, "could not build 4 paths"
        cert = Path(work / "model0" / tls.PIN_FILE).read_bytes()
        channel = await tls.connect(model_info["address"], cert)
        stub = rpc.ModelNodeStub(channel)
        roles = {"asker": [0], "relays": [p.pid for p in relays], "model_node": [m.pid for m in models]}
        _progress(f"relay pids {' '.join(str(p.pid) for p in relays)}; model pids {' '.join(str(m.pid) for m in models)}")
        meter = CpuMeter(roles)
        # the committee's CPU is reported beside the overlay's, not in it (consensus runs whether or not anyone asks)
        committee_meter = CpuMeter({"committee": [p.pid for p in committee]}) if committee else None

        stages: dict[str, list[float]] = {}

        async def overlay(prompt: str) -> float:
            t = time.perf_counter()
            answer = await me.ask(prompt, max_tokens=16)
            assert answer.text.endswith(prompt)
            for name, ms in answer.timings_ms.items():
                stages.setdefault(name, []).append(ms)
            return (time.perf_counter() - t) * 1000

        async def direct(prompt: str) -> float:
            t = time.perf_counter()
            chunks = [c async for c in stub.Generate(make_request(prompt, max_tokens=16), timeout=10)]
            assert chunks[-1].final
            return (time.perf_counter() - t) * 1000

        _progress(f"{len(me.paths.pool.paths)} paths; warming up")
        for i in range(args.warm):  # warm channels, TLS sessions, caches
            await overlay(f"warm-up {i}")
            await direct(f"warm-up {i}")
        result: dict = {"bench": "overlay", "paths": PATHS, "hops": HOPS, "n": 4, "k": 3,
                        "model": "echo stand-in (separate process)", "relays": f"{RELAYS} processes",
                        "single_use_paths": cloves.single_use_paths,
                        "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)}
        over, dire, diff = [], [], []
        for i in range(args.asks):
            prompt = f"Question {i}: how far is the moon from the earth, roughly, in kilometres?"
            if i % 2:
                o = await overlay(prompt)
                d = await direct(prompt)
            else:
                d = await direct(prompt)
                o = await overlay(prompt)
            over.append(o)
            dire.append(d)
            diff.append(o - d)
        if over:
            result.update({
                "asks": args.asks,
                "overlay_ms": {"p50": round(_pct(over, .5), 2), "p99": round(_pct(over, .99), 2)},
                "direct_ms": {"p50": round(_pct(dire, .5), 2), "p99": round(_pct(dire, .99), 2)},
                "added_ms": {"p50": round(_pct(diff, .5), 2), "p99": round(_pct(diff, .99), 2),
                             "mean": round(statistics.fmean(diff), 2)},
                "goal_added_p50_ms": 12.0,
            })
        committee_before = committee_meter.sample() if committee_meter else None
        _progress(f"CPU phase: {args.cpu_asks} asks")
        cpu = await _cpu_phase(overlay, args.cpu_asks, meter)
        if committee_meter:
            cpu["committee_beside"] = CpuMeter.delta_ms(committee_meter.sample(), committee_before, args.cpu_asks)["total"]
        idle_ms_per_s = await meter.idle_ms_per_s(args.idle_s)
        result.update({"cpu_ms_per_ask": cpu, "goal_cpu_ms_per_ask": 20.0,
                       "idle_ms_of_cpu_per_s": round(idle_ms_per_s, 2)})
        if args.deployment:
            result["deployment"] = await _deployment_costs(me, meter, committee_meter, args.cpu_asks + args.asks,
                                                           models, idle_ms_per_s)
        if args.stream:
            direct_ask_ms = await _direct_cpu(direct, meter, max(5, args.cpu_asks // 2), idle_ms_per_s)
            result["direct_cpu_ms_per_ask"] = round(direct_ask_ms, 2)
            result["stream"] = await _stream_phase(args, me, stub, meter, cpu["total"], idle_ms_per_s, work)
        await channel.close()
        status = me.status()
        await me.stop()
        result["stages_p50_ms"] = {k[:-3]: round(_pct(v[args.warm:] or v, .5), 2) for k, v in stages.items()}
        result["asker_drops"] = status["asking"]["drops"]
        if args.png and over:
            _plot(over, dire, args.png)
            result["png"] = args.png
        if args.raw:
            Path(args.raw).write_text(json.dumps({"overlay_ms": over, "direct_ms": dire}))
        return result
    finally:
        _stop(procs)


async def _cpu_phase(overlay, asks: int, meter: CpuMeter) -> dict:
    """CPU milliseconds per overlay ask, per role, over `asks` asks back to back."""
    await asyncio.sleep(0.5)  # let the latency phase's last reply cloves settle
    before, t0 = meter.sample(), time.perf_counter()
    for i in range(asks):
        await overlay(f"CPU question {i}: how far is the moon from the earth, roughly, in kilometres?")
    await asyncio.sleep(0.3)  # late reply cloves (k of n answer) still cost the relays CPU
    after, busy_s = meter.sample(), time.perf_counter() - t0
    # what the 14 processes burn doing nothing (timers, gRPC's threads) over as long: included
    # in the figures above, reported so that it can be told apart
    idle_before = meter.sample()
    await asyncio.sleep(busy_s)
    idle = CpuMeter.delta_ms(meter.sample(), idle_before, asks)["total"]
    out = CpuMeter.delta_ms(after, before, asks)
    out.update(asks=asks, idle_equivalent=idle)
    return out


async def _start_committee(home: Path, procs: list[subprocess.Popen]) -> Path:
    """4 gt-verifier processes with the shipped timeouts (what `gt-verifier init` writes); the genesis file."""
    subprocess.run([sys.executable, "-m", "verifier.cli", "--log-level", "WARNING", "init", "--validators", "4",
                    "--out", str(home), "--base-port", str(free_base_port(4)), "--chain-id", "bench-overlay"],
                   cwd=ROOT, check=True, capture_output=True, timeout=120)
    for i in range(4):
        procs.append(_spawn(["-m", "verifier.cli", "--log-level", "WARNING", "start", "--home", str(home / f"v{i}")],
                            home / f"v{i}.log"))
    return home / "v0" / "genesis.json"


async def _deployment_costs(me: UserNode, meter: CpuMeter, committee_meter: CpuMeter, asks: int,
                            models: list[subprocess.Popen], idle_ms_per_s: float) -> dict:
    """What a deployment pays beyond the asks themselves: the audit hand-in of the asks drawn
    for audit (their submissions, sealed to each member, over the user's paths, handed to the
    members by proxies: CPU per ask over every ask this run made), and what gossip, directory
    refreshes and lease renewals cost while idle (in idle_ms_of_cpu_per_s)."""
    waiting = len(me.auditor.outbox)
    before, committee_before, t0 = meter.sample(), committee_meter.sample(), time.perf_counter()
    handed = await me.auditor.flush(me.audit_channel, max_delay_s=0) if waiting else 0
    await asyncio.sleep(0.5)  # the copies cross their paths
    seconds = time.perf_counter() - t0
    cpu = CpuMeter.delta_ms(meter.sample(), before, 1)
    committee = CpuMeter.delta_ms(committee_meter.sample(), committee_before, 1)["total"]
    per_audit = (cpu["total"] - idle_ms_per_s * seconds) / max(1, waiting)
    return {"committee": "4 gt-verifier processes, shipped timeouts; every node registered and reads its "
                         "light-client-checked directory", "model_group": f"{len(models)} echo nodes gossiping",
            "audited_asks": waiting, "audits_accepted": handed, "audit_counts": me.auditor.status(),
            "audit_handin_cpu_ms_per_audit": round(per_audit, 2) if waiting else None,
            "audit_handin_cpu_ms_per_ask": round(per_audit * AUDITS.rate, 3) if waiting else None,
            "audit_rate": AUDITS.rate,
            "audit_handin_committee_cpu_ms": round(committee, 1)}


async def _direct_cpu(direct, meter: CpuMeter, asks: int, idle_ms_per_s: float) -> float:
    """CPU milliseconds of one direct call (model node + this client), net of idle."""
    before, t0 = meter.sample(), time.perf_counter()
    for i in range(asks):
        await direct(f"CPU question {i}: how far is the moon from the earth, roughly, in kilometres?")
    seconds = time.perf_counter() - t0
    return (CpuMeter.delta_ms(meter.sample(), before, 1)["total"] - idle_ms_per_s * seconds) / asks


# --------------------------------------------------------------------------- streamed answers


async def _stream_phase(args, me: UserNode, stub, meter: CpuMeter, ask_cpu_ms: float, idle_ms_per_s: float,
                        work: Path) -> dict:
    """Streamed answers through the overlay, then the same reply messages over a bare chain."""
    sizes: list[int] = []
    own_links = set()

    def tap(event: str, link_id: bytes, payload: bytes) -> None:  # what reaches the asker: reply cloves
        if event == "return_in" and link_id in own_links:
            sizes.append(len(payload))

    own_links.update(p.first_link for p in me.paths.pool.paths.values())
    add = me.paths.pool.add

    def adding(path) -> None:  # single-use paths: every answer's are built after this point
        own_links.add(path.first_link)
        add(path)

    me.paths.pool.add = adding
    me.relay.tap = tap
    interval = args.stream_s / max(1, args.stream_tokens - 1)
    prompt = "Stream me a long answer about the moon, token by token, please."
    ttft_over, ttft_direct, waits, messages, spans = [], [], [], [], []
    cpu_ms, wall = [], []
    direct_ms = []
    for i in range(args.answers):
        _progress(f"streamed answer {i + 1} of {args.answers}: direct, then through the overlay")
        # the same answer by a direct call (the same engine schedule, no overlay): its first
        # token, and what it costs the model node and this client (what no overlay adds)
        await asyncio.sleep(0.3)
        before, t = meter.sample(), time.perf_counter()
        call = stub.Generate(make_request(prompt, max_tokens=args.stream_tokens), timeout=args.stream_s + 30)
        async for chunk in call:
            if len(ttft_direct) == i:
                ttft_direct.append((time.perf_counter() - t) * 1000)
        after, seconds = meter.sample(), time.perf_counter() - t
        direct_ms.append(CpuMeter.delta_ms(after, before, 1)["total"] - idle_ms_per_s * seconds)
        await asyncio.sleep(0.3)
        chunks_before = me.asker.chunks_in
        before, t0 = meter.sample(), time.perf_counter()
        first_at, arrivals, tokens = None, [], 0
        async for item in me.ask_stream(prompt, max_tokens=args.stream_tokens):
            now = time.perf_counter()
            if isinstance(item, Answer):
                assert len(item.token_ids) == args.stream_tokens, len(item.token_ids)
                continue
            if first_at is None:
                first_at = now
                ttft_over.append((now - t0) * 1000)
            for _ in item.token_ids:  # token j was made at (first token) + j * interval
                waits.append((now - first_at - tokens * interval) * 1000)
                tokens += 1
            arrivals.append(now)
        await asyncio.sleep(0.3)  # the last reply cloves (the n-th of each message) come home
        after, seconds = meter.sample(), time.perf_counter() - t0
        messages.append(me.asker.chunks_in - chunks_before)
        spans.append(arrivals[-1] - arrivals[0])
        cpu_ms.append(CpuMeter.delta_ms(after, before, 1))
        wall.append(seconds)
    me.relay.tap = None
    idle_ms = idle_ms_per_s * statistics.fmean(wall)
    net = [c["total"] - idle_ms for c in cpu_ms]
    msgs = statistics.fmean(messages)
    direct = statistics.fmean(direct_ms)
    _progress("the engine alone")
    engine_ms = await _engine_only_ms(args, work, prompt)
    overlay_ms = statistics.fmean(net) - engine_ms  # the answer less what the engine itself did
    # a one-chunk ask is the query and one reply message; each further message costs the rest
    per_message = (overlay_ms - ask_cpu_ms) / max(1.0, msgs - 1)
    clove_bytes = int(statistics.median(sizes)) if sizes else 400
    _progress("the bare chain")
    # the floor carries as many messages, as far apart as the overlay's were
    floor = await _bare_chain(work, round(msgs), clove_bytes, statistics.fmean(spans) / max(1.0, msgs - 1))
    added = [o - d for o, d in zip(ttft_over, ttft_direct)]
    # (code before 2026-12-01 had a 50 ms clock, reply_cadence_s, instead of a window)
    window_ms = getattr(OVERLAY, "reply_window_s", getattr(OVERLAY, "reply_cadence_s", 0.0)) * 1000
    return {
        "answers": args.answers, "tokens": args.stream_tokens, "seconds": args.stream_s,
        "reply_window_ms": window_ms,
        "reply_messages_per_answer": round(msgs, 1),
        "cpu_ms_per_answer": {role: round(statistics.fmean(c[role] for c in cpu_ms), 1) for role in cpu_ms[0]},
        "idle_ms_over_an_answer": round(idle_ms, 1),
        "cpu_ms_per_answer_net_of_idle": round(statistics.fmean(net), 1),
        "engine_cpu_ms_per_answer": round(engine_ms, 1),
        "overlay_cpu_ms_per_answer": round(overlay_ms, 1),
        "overlay_cpu_ms_per_answer_each": [round(x - engine_ms, 1) for x in net],
        "direct_call_cpu_ms_per_answer": round(direct, 1),
        "goal_overlay_cpu_ms_per_answer": 300.0,
        "cpu_ms_per_reply_message": round(per_message, 3),
        "floor_cpu_ms_per_message": floor["cpu_ms_per_message"],
        "ratio_to_floor": round(per_message / floor["cpu_ms_per_message"], 2) if floor["cpu_ms_per_message"] > 0 else None,
        "goal_ratio_to_floor": 1.5,
        "floor": floor,
        "reply_clove_bytes": clove_bytes,
        "ttft_added_ms": {"p50": round(_pct(added, .5), 2), "max": round(max(added), 2)},
        "goal_ttft_added_p50_ms": 12.0,
        "token_wait_ms": {"p50": round(_pct(waits, .5), 1), "p99": round(_pct(waits, .99), 1),
                          "max": round(max(waits), 1)},
        "goal_token_wait_max_ms": round(window_ms + _pct(added, .99), 1),
    }


async def _engine_only_ms(args, work: Path, prompt: str) -> float:
    """CPU milliseconds the echo engine itself spends on one streamed answer (its schedule,
    its chunks, the pacer taking each), run here with nothing sent: what the model node's
    figure holds that is no overlay's doing. A real engine costs its node per token too."""
    from gentorrent.overlay.reply_pacing import ReplyPacer
    from testkit.echo_model import EchoModelNode

    engine = EchoModelNode(work / "engine-only", work / "engine-only.json", stream_tokens=args.stream_tokens,
                           stream_s=args.stream_s)
    request = make_request(prompt, max_tokens=args.stream_tokens)
    own = CpuMeter({"self": [0]})
    idle_ms_per_s = await own.idle_ms_per_s(1.0)
    before, t0 = own.sample(), time.perf_counter()
    pacer = ReplyPacer(1e9)
    async for chunk in engine.generate(request):
        pacer.add(chunk, 0.0)
    seconds = time.perf_counter() - t0
    return CpuMeter.delta_ms(own.sample(), before, 1)["total"] - idle_ms_per_s * seconds


async def _bare_chain(work: Path, messages: int, clove_bytes: int, spacing_s: float) -> dict:
    """`messages` reply messages (one frame of `clove_bytes` per path) every `spacing_s` over
    4 bare paths of 3 hop processes, TLS on every link, flowing against the direction the
    links were dialled, as replies do: CPU per message, net of idle."""
    base = work / "bare"
    sink_tls = bare_chain.make_identity(base / "sink")
    source_tls = bare_chain.make_identity(base / "source")
    for p in range(PATHS):
        for h in range(HOPS):
            bare_chain.make_identity(base / f"p{p}h{h}")
    arrived: list[float] = []
    source = bare_chain.BareSource()
    source.expected = PATHS
    server, port = tls.new_server(source_tls, "127.0.0.1:0", identify_callers=True)  # as a relay's
    rpc.add_RelayServicer_to_server(source, server)
    await server.start()
    sink = bare_chain.BareSink(sink_tls, lambda frame: arrived.append(time.perf_counter()))
    procs = []
    try:
        for p in range(PATHS):
            next_address, next_cert = f"127.0.0.1:{port}", base / "source" / tls.PIN_FILE
            for h in reversed(range(HOPS)):  # from the source's side: each hop dials the one before it
                d = base / f"p{p}h{h}"
                proc = _spawn(["-m", "testkit.bare_chain", "--dir", str(d), "--next-address", next_address,
                               "--next-cert", str(next_cert)], base / f"p{p}h{h}.log")
                procs.append(proc)
                next_address, next_cert = json.loads(proc.stdout.readline())["address"], d / tls.PIN_FILE
            await sink.dial(next_address, next_cert.read_bytes())
        await asyncio.wait_for(source.opened.wait(), 30)

        def frame() -> pb.LinkFrame:
            return pb.LinkFrame(cloves=pb.CloveBatch(forward=False, cloves=[
                pb.Clove(link_id=secrets.token_bytes(16), payload=secrets.token_bytes(clove_bytes))]))

        for _ in range(3):  # warm every link
            for path in range(PATHS):
                source.send(path, frame())
        while len(arrived) < 3 * PATHS:
            await asyncio.sleep(0.01)
        meter = CpuMeter({"source_and_sink": [0], "hops": [p.pid for p in procs]})
        _progress(f"bare chain up: hop pids {' '.join(str(p.pid) for p in procs)}")
        idle_ms_per_s = await meter.idle_ms_per_s(min(2.0, max(0.5, messages * spacing_s / 4)))
        arrived.clear()
        before, t0 = meter.sample(), time.perf_counter()
        sent_at = []
        for m in range(messages):
            await asyncio.sleep(max(0.0, t0 + m * spacing_s - time.perf_counter()))
            sent_at.append(time.perf_counter())
            for path in range(PATHS):
                source.send(path, frame())
        deadline = time.perf_counter() + 10
        while len(arrived) < messages * PATHS and time.perf_counter() < deadline:
            await asyncio.sleep(0.01)
        after, seconds = meter.sample(), time.perf_counter() - t0
        cpu = CpuMeter.delta_ms(after, before, 1)
        net = cpu["total"] - idle_ms_per_s * seconds
        latency = [(arrived[(m + 1) * PATHS - 1] - sent_at[m]) * 1000 for m in range(min(messages, len(arrived) // PATHS))]
        return {"messages": messages, "arrived_frames": len(arrived), "clove_bytes": clove_bytes,
                "processes": len(procs), "cpu_ms": {k: round(v, 1) for k, v in cpu.items()},
                "idle_ms": round(idle_ms_per_s * seconds, 1),
                "cpu_ms_per_message": round(net / max(1, messages), 3),
                "path_latency_ms_p50": round(_pct(latency, .5), 2) if latency else None}
    finally:
        await sink.close()
        _stop(procs)
        await server.stop(None)


def _plot(over: list[float], dire: list[float], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for values, label in ((dire, "direct call"), (over, "through the overlay (4 paths x 3 hops)")):
        xs = sorted(values)
        ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=label)
    ax.set_xlabel("latency of one ask (ms)")
    ax.set_ylabel("CDF")
    ax.set_title("GenTorrent overlay overhead on loopback")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--asks", type=int, default=None, help="latency pairs (default 200; 0 with --stream)")
    ap.add_argument("--png", default=None, help="write a latency CDF here")
    ap.add_argument("--raw", default=None, help="write every latency (JSON) here")
    ap.add_argument("--cpu-asks", type=int, default=100, help="overlay asks of the CPU phase")
    ap.add_argument("--stream", action="store_true", help="also stream answers (see the module doc)")
    ap.add_argument("--answers", type=int, default=3, help="streamed answers measured with --stream")
    ap.add_argument("--stream-tokens", type=int, default=500)
    ap.add_argument("--stream-s", type=float, default=10.0)
    ap.add_argument("--deployment", action="store_true",
                    help="a committee (4 verifiers) instead of a static directory, audits handed in, a model group "
                         "of 2 gossiping")
    ap.add_argument("--tiny", action="store_true", help="a few asks and one short streamed answer: seconds")
    ap.add_argument("--pooled-paths", action="store_true",
                    help="the code before 2026-12-04: every ask over one pool of paths, no path built per ask")
    args = ap.parse_args()
    args.warm, args.idle_s = 10, 3.0
    if args.tiny:
        args.asks, args.cpu_asks, args.stream, args.answers = 4, 4, True, 1
        args.stream_tokens, args.stream_s, args.warm, args.idle_s = 20, 0.5, 2, 0.5
    if args.asks is None:
        args.asks = 0 if args.stream else 200
    print(json.dumps(asyncio.run(run(args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
