"""The overlay on an emulated WAN: asks through 4 paths of 3 relays vs. a direct call over the same links.

    sudo .venv/bin/python bench/wan.py [--profile home] [--users 12] [--asks 20] [--png bench/wan.png]
    sudo .venv/bin/python bench/wan.py --tiny        (make test: the short profile, a few asks)

Brings up `gt-devnet up --wan PROFILE --echo --no-epochs` (every node in its own network
namespace, links with the profile's delay, jitter, loss and rate, a share of the users behind
NAT; model nodes are the echo stand-in: the real clove intake, keys and signed receipts, an
engine that answers at once, so what is measured is the network and the overlay), then from
the operator's namespace:

- overlay: `asks` asks of user u00 through its API (`/gt/ask`, sent to model node honest0),
  time to first token and total as the user node measures them (`timings_ms`);
- direct: the same prompts from u00's namespace straight to honest0's Generate over one warm
  pinned-TLS channel (the connection's own set-up, TCP + TLS, reported apart);
- the floor beside each: the propagation of the links each one crosses, from the plan (no
  jitter, no serialisation, no CPU). A direct ask crosses u00's and honest0's lines once each
  way; an overlay ask waits for k = 3 of n = 4 query cloves, each over u00 -> r1 -> r2 -> r3 ->
  honest0, and for 3 of 4 reply cloves back the same ways, so its floor is twice the third
  fastest path's one-way time. `added_round_trips_ms` is the overlay's floor minus the direct
  one: what the overlay adds by physics; the goal (`goal_met`) is an overlay TTFT within the
  direct TTFT + those round trips + 10 ms;
- the same asks again with every link made perfect for a moment (`zero_links`: the emulator's
  control socket, same devnet, same paths): the overlay's own cost on this machine as loaded
  now (CPU of 8 relay hops, sealing, S-IDA, the emulator's lateness), so that what the links
  cost (`links_cost_ms` = WAN - zero) can be told from what the machine costs; and the bytes
  one ask puts on the asker's line (`bytes_per_ask`: its cloves, TLS and TCP, both ways);
- path build: every user node's path establishments (`build_ms` of `/gt/status`: dial, onion
  out to the proxy, confirmation back), beside the floor of one establishment's propagation;
- loss: asks answered (of `--loss-asks`) with every pair of nodes losing 1 % and 5 % of its
  packets (the emulator's control socket), and TTFT under it: gRPC over TCP retransmits, so
  a lost packet costs a retransmission timeout (200 ms at least on Linux), which is measured
  here and not hidden;
- churn: asks answered right after two relays (public user nodes other than u00) are killed
  with SIGKILL: paths through them break and are repaired while asks go on;
- the emulator's own cost: how late it delivered (mean, max) and its CPU seconds.

The verification epoch's length on the WAN needs engines (a reference model scores every
reply): `--epochs` starts the real vLLM model nodes instead of echo stand-ins, under
`flock /tmp/gt-heavy.lock`, and reports the length of the first epochs; without it
`epoch_s` is null and says why.

Prints one JSON line. Needs root (network namespaces), like `gt-devnet up --wan`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gentorrent.config import CLOVES, MODEL_NODE  # noqa: E402
from devnet import network as devnet  # noqa: E402
from devnet.supervisor import STATE_FILE as PROCESSES_FILE  # noqa: E402
from devnet.wan import namespaces  # noqa: E402
from devnet.wan.emulator import control  # noqa: E402

GOAL_SLACK_MS = 10.0  # the goal: overlay TTFT within the added round trips + 10 ms
LOSS_LEVELS = (0.01, 0.05)
RELAYS_KILLED = 2
EPOCHS_WATCHED = 2  # --epochs: the lengths of this many epochs (after the first close)
EPOCH_TIMEOUT_S = 1200.0


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))], 2)


def _cli(root: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "devnet.network", "--root", str(root), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


# --------------------------------------------------------------------------- floors from the plan


class Floors:
    """Propagation delays of the planned links (the physical floor: no jitter, no queues)."""

    def __init__(self, plan: namespaces.WanPlan) -> None:
        self.delay = {n.address: n.link_params().delay_s for n in plan.nodes}

    def d(self, address: str) -> float:
        return self.delay[address.rpartition(":")[0] or address]

    def one_way(self, hops: list[str]) -> float:
        """Seconds from the first address to the last, through the others: every link between
        two nodes is the sender's line plus the receiver's."""
        return sum(self.d(a) + self.d(b) for a, b in zip(hops, hops[1:]))

    def direct_ms(self, user: str, model: str) -> float:
        return 2 * self.one_way([user, model]) * 1000

    def overlay_ms(self, user: str, model: str, paths: list[list[str]], k: int = CLOVES.k) -> float:
        """Twice the k-th fastest path: k query cloves must reach the model, k reply cloves the user."""
        ways = sorted(self.one_way([user, *path, model]) for path in paths)
        return 2 * ways[min(k, len(ways)) - 1] * 1000

    def build_ms(self, user: str, relays: list[str]) -> float:
        """An establishment: the onion out to the proxy, the confirmation back."""
        return 2 * self.one_way([user, *relays]) * 1000


# --------------------------------------------------------------------------- measurements


def ask(user: devnet.NodeInfo, model: devnet.NodeInfo, prompt: str, timeout: float = 60.0) -> dict:
    return devnet._http_json(user.extra["api"] + "/gt/ask",
                             {"prompt": prompt, "model": MODEL_NODE.default_model, "node_id": model.node_id,
                              "max_tokens": 16, "temperature": 0.0}, timeout=timeout)


def overlay_asks(user: devnet.NodeInfo, model: devnet.NodeInfo, prompts: list[str], timeout: float = 60.0) -> dict:
    """TTFT, total and paths of each ask that was answered; how many were."""
    answered, ttft, total, paths, errors = 0, [], [], [], []
    for prompt in prompts:
        try:
            answer = ask(user, model, prompt, timeout)
        except (devnet.DevnetError, OSError) as exc:
            errors.append(str(exc)[:160])
            continue
        if not answer.get("text", "").endswith(prompt):
            errors.append("wrong answer")
            continue
        answered += 1
        ttft.append(answer["timings_ms"]["first_chunk_ms"])
        total.append(answer["timings_ms"]["total_ms"])
        paths.append(answer["paths"])
    return {"answered": answered, "asked": len(prompts), "ttft_ms": ttft, "total_ms": total, "paths": paths,
            "errors": errors[:5]}


def direct_asks(plan: namespaces.WanPlan, user: str, model: devnet.NodeInfo, prompts: list[str]) -> dict:
    """The same prompts from the user's namespace straight to the model node (this file, --direct)."""
    argv = [sys.executable, __file__, "--direct", model.address, model.extra["cert_file"], json.dumps(prompts)]
    out = subprocess.run(namespaces.ns_argv(plan.node(user).netns, argv), capture_output=True, text=True,
                         timeout=60 + 30 * len(prompts), cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"the direct probe failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.splitlines()[-1])


async def _direct(address: str, cert_file: str, prompts: list[str]) -> dict:
    """Runs inside the user's namespace: one pinned channel, then one Generate per prompt."""
    from gentorrent.crypto import tls
    from gentorrent.generation import make_request
    from gentorrent.wire import gentorrent_pb2_grpc as rpc

    t0 = time.perf_counter()
    channel = await tls.connect(address, Path(cert_file).read_bytes(), timeout=30)
    connect_ms = (time.perf_counter() - t0) * 1000
    stub = rpc.ModelNodeStub(channel)
    ttft, total = [], []
    try:
        for prompt in prompts:
            t = time.perf_counter()
            first = None
            async for chunk in stub.Generate(make_request(prompt, max_tokens=16), timeout=60):
                if first is None and chunk.text:
                    first = (time.perf_counter() - t) * 1000
            total.append((time.perf_counter() - t) * 1000)
            ttft.append(first if first is not None else total[-1])
    finally:
        await channel.close()
    return {"connect_ms": round(connect_ms, 2), "ttft_ms": ttft, "total_ms": total}


def kill_relays(root: Path, names: list[str]) -> None:
    """SIGKILL the process groups of these user nodes, as a crash or a pulled cable would."""
    recorded = json.loads((root / PROCESSES_FILE).read_text())
    for name in names:
        try:
            os.killpg(recorded[f"user-{name}"]["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass


def epoch_lengths(state: devnet.DevnetState, closes: int = EPOCHS_WATCHED,
                  timeout_s: float = EPOCH_TIMEOUT_S) -> tuple[list[float], str]:
    """Seconds between consecutive epoch closes, as the committed epochs section shows them
    (polled every second: each figure is good to about a second)."""
    from devnet.demo import epochs_section

    seen: dict[int, float] = {}
    before: set[int] | None = None  # epochs closed before watching: their close times are unknown
    deadline = time.monotonic() + timeout_s
    while len(seen) < closes + 1 and time.monotonic() < deadline:
        try:
            section = epochs_section(state)
        except Exception:  # a verifier between blocks: the next poll
            section = None
        if section is not None:
            history = {summary.epoch for summary in section.history}
            before = history if before is None else before
            for epoch in history - before:
                seen.setdefault(epoch, time.monotonic())
        time.sleep(1.0)
    closed = [seen[e] for e in sorted(seen)]
    lengths = [round(b - a, 1) for a, b in zip(closed, closed[1:])]
    note = "" if len(lengths) >= closes else f"only {len(closed)} epochs closed within {timeout_s:.0f} s"
    return lengths, note


def path_builds(state: devnet.DevnetState, floors: Floors) -> dict:
    measured, floor = [], []
    for user in state.of_role("user"):
        try:
            paths = devnet.user_status(user)["paths"]
        except devnet.DevnetError:
            continue
        measured += paths.get("build_ms", [])
        floor += [floors.build_ms(user.address, p["relays"]) for p in paths.get("paths", [])]
    return {"p50_ms": _pct(measured, .5), "p90_ms": _pct(measured, .9), "count": len(measured),
            "floor_p50_ms": _pct(floor, .5)}


def _summary(values: list[float]) -> dict:
    return {"p50": _pct(values, .5), "p90": _pct(values, .9)}


# --------------------------------------------------------------------------- the run


def run(profile: str, users: int, asks: int, loss_asks: int, epochs: bool, png: str | None) -> dict:
    root = Path(tempfile.mkdtemp(prefix="gt-bench-wan-"))
    args = ["up", "--wan", profile, "--users", str(users), "--honest", "2", "--dishonest", "0", "--no-dashboard"]
    args += [] if epochs else ["--echo", "--no-epochs"]
    t0 = time.monotonic()
    up = _cli(root, *args)
    ready_s = time.monotonic() - t0
    if up.returncode != 0:
        _cli(root, "down")
        raise RuntimeError(f"gt-devnet up --wan {profile} failed:\n{up.stdout[-3000:]}\n{up.stderr[-3000:]}")
    try:
        devnet.enter_operator(root)  # before any connection: the nodes' APIs are on the management network
        return _measure(root, profile, ready_s, asks, loss_asks, epochs, png)
    finally:
        namespaces.leave_netns()  # out of the operator's namespace before `down` removes it
        down = _cli(root, "down", timeout=120)
        left = namespaces.existing(namespaces.prefix_for(root))
        if down.returncode != 0 or left:
            print(f"bench/wan.py: down left {left}: {down.stderr[-500:]}", file=sys.stderr)


def _measure(root: Path, profile: str, ready_s: float, asks: int, loss_asks: int, epochs: bool,
             png: str | None) -> dict:
    state = devnet.DevnetState.load(root)
    plan = namespaces.WanPlan.load(root)
    floors = Floors(plan)
    user = state.of_role("user")[0]
    model = next(m for m in state.of_role("model") if not m.extra.get("nat"))
    for i in range(2):  # warm the links of u00's paths and the model node's links to its proxies
        ask(user, model, f"warm-up {i}")
    prompts = [f"Question {i}: how far is the moon from the earth, roughly, in kilometres?" for i in range(asks)]
    line = control(root, {"stats": True})["nodes"][user.name]
    over = overlay_asks(user, model, prompts)
    after = control(root, {"stats": True})["nodes"][user.name]
    direct = direct_asks(plan, user.name, model, prompts)
    control(root, {"perfect": True})
    zero = overlay_asks(user, model, [f"Zero {p}" for p in prompts])
    zero_direct = direct_asks(plan, user.name, model, [f"Zero {p}" for p in prompts])
    control(root, {"perfect": False})
    direct_floor = floors.direct_ms(user.address, model.address)
    overlay_floor = [floors.overlay_ms(user.address, model.address, paths) for paths in over["paths"]]
    added = [f - direct_floor for f in overlay_floor]
    over_p50, floor_p50 = _pct(over["ttft_ms"], .5), _pct(overlay_floor, .5)
    direct_p50, added_p50 = _pct(direct["ttft_ms"], .5), _pct(added, .5)
    zero_p50, zero_direct_p50 = _pct(zero["ttft_ms"], .5), _pct(zero_direct["ttft_ms"], .5)
    answered = max(1, over["answered"])
    result = {
        "bench": "wan", "profile": profile, "users": len(state.of_role("user")),
        "behind_nat": sorted(n.name for n in state.nodes if n.extra.get("nat")),
        "model": "real vLLM engines" if epochs else "echo stand-in (the network and the overlay alone)",
        "devnet_ready_s": round(ready_s, 1),
        "overlay": {"answered": over["answered"], "asked": over["asked"], "ttft_ms": _summary(over["ttft_ms"]),
                    "total_ms": _summary(over["total_ms"]), "floor_ms": _summary(overlay_floor)},
        "direct": {"ttft_ms": _summary(direct["ttft_ms"]), "total_ms": _summary(direct["total_ms"]),
                   "connect_ms": direct["connect_ms"], "floor_ms": round(direct_floor, 2)},
        "added_round_trips_ms": _summary(added),
        "overlay_minus_direct_ttft_ms": None if over_p50 is None else round(over_p50 - direct_p50, 2),
        "goal_overlay_minus_direct_ms": None if added_p50 is None else round(added_p50 + GOAL_SLACK_MS, 2),
        "goal_met": None if over_p50 is None else over_p50 - direct_p50 <= added_p50 + GOAL_SLACK_MS,
        "zero_links": {"overlay_ttft_ms": _summary(zero["ttft_ms"]), "direct_ttft_ms": _summary(zero_direct["ttft_ms"]),
                       "answered": zero["answered"]},
        "links_cost_ms": {"overlay": None if over_p50 is None or zero_p50 is None else round(over_p50 - zero_p50, 2),
                          "direct": round(direct_p50 - zero_direct_p50, 2),
                          "overlay_floor": floor_p50, "direct_floor": round(direct_floor, 2)},
        "bytes_per_ask": {"up": round((after["up_bytes"] - line["up_bytes"]) / answered),
                          "down": round((after["down_bytes"] - line["down_bytes"]) / answered)},
        "path_build": path_builds(state, floors),
    }
    result["loss"] = {}
    for loss in LOSS_LEVELS:
        control(root, {"loss": loss})
        under = overlay_asks(user, model, [f"Lossy {loss} question {i}: name a river." for i in range(loss_asks)])
        result["loss"][f"{loss:.0%}"] = {"answered": under["answered"], "asked": under["asked"],
                                         "ttft_ms": _summary(under["ttft_ms"]), "errors": under["errors"]}
    control(root, {"loss": None})
    public = [u.name for u in state.of_role("user")[1:] if not u.extra.get("nat")]
    killed = public[:min(RELAYS_KILLED, max(0, len(public) - CLOVES.path_length))]
    kill_relays(root, killed)
    churn = overlay_asks(user, model, [f"Churn question {i}: name a mountain." for i in range(loss_asks)])
    result["churn"] = {"relays_killed": killed, "answered": churn["answered"], "asked": churn["asked"],
                       "ttft_ms": _summary(churn["ttft_ms"]), "errors": churn["errors"]}
    if epochs:
        result["epoch_s"], result["epoch_note"] = epoch_lengths(state)
    else:
        result["epoch_s"], result["epoch_note"] = None, ("the echo stand-ins have nothing to score: "
                                                         "bench/wan.py --epochs runs real engines")
    stats = control(root, {"stats": True})
    result["emulator"] = {"lateness_ms": stats["lateness_ms"], "cpu_s": stats["cpu_s"],
                          "delivered": stats["delivered"], "dropped": stats["dropped"]}
    if png:
        _plot(over["ttft_ms"], direct["ttft_ms"], overlay_floor, direct_floor, profile, png)
        result["png"] = png
    _check(result)
    return result


def _check(result: dict) -> None:
    """Figures that contradict each other fail the run (and make test's tiny run with it): no
    answer, a time below its physical floor (the emulator never delivers early, so the floor or
    the plan would be wrong), or a phase that measured nothing."""
    problems = []
    if not result["overlay"]["answered"] or not result["zero_links"]["answered"]:
        problems.append("no overlay ask was answered")
    elif result["overlay"]["ttft_ms"]["p50"] < result["overlay"]["floor_ms"]["p50"]:
        problems.append("overlay TTFT below its floor")
    if result["direct"]["ttft_ms"]["p50"] < result["direct"]["floor_ms"]:
        problems.append("direct TTFT below its floor")
    if not result["path_build"]["count"]:
        problems.append("no path build was timed")
    if problems:
        raise RuntimeError(f"bench/wan.py: inconsistent figures ({'; '.join(problems)}): {json.dumps(result)}")


def _plot(over: list[float], direct: list[float], floor: list[float], direct_floor: float, profile: str,
          path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for values, label in ((direct, "direct call"), (over, "through the overlay (4 paths x 3 relays)"),
                          (floor, "overlay floor (propagation of its paths)")):
        xs = sorted(values)
        ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=label)
    ax.axvline(direct_floor, color="grey", linestyle=":", label="direct floor")
    ax.set_xlabel("time to first token (ms)")
    ax.set_ylabel("CDF")
    ax.set_title(f"GenTorrent on the emulated WAN ({profile})")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="home", help="a WAN profile (devnet/wan/profiles.py)")
    ap.add_argument("--users", type=int, default=12)
    ap.add_argument("--asks", type=int, default=20, help="overlay and direct asks, each")
    ap.add_argument("--loss-asks", type=int, default=10, help="asks at each loss level and after the churn")
    ap.add_argument("--epochs", action="store_true", help="real engines and verification epochs (heavy)")
    ap.add_argument("--png", default=None, help="write a TTFT CDF here")
    ap.add_argument("--tiny", action="store_true", help="make test's run: the short profile, 6 users, 3 asks")
    ap.add_argument("--direct", nargs=3, metavar=("ADDRESS", "CERT", "PROMPTS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.direct:  # the probe, inside a user's namespace
        address, cert, prompts = args.direct
        print(json.dumps(asyncio.run(_direct(address, cert, json.loads(prompts)))))
        return 0
    reason = namespaces.can_build_reason()
    if reason:
        print(f"bench/wan.py: {reason}", file=sys.stderr)
        return 2
    if args.tiny:
        args.profile, args.users, args.asks, args.loss_asks = "short", 6, 3, 3
    print(json.dumps(run(args.profile, args.users, args.asks, args.loss_asks, args.epochs, args.png)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
