"""Sustained load on a loopback overlay: N concurrent users ask for a fixed time.

    .venv/bin/python bench/load.py                       # 8 users, 30 s, 8 relay processes
    .venv/bin/python bench/load.py --users 4 --seconds 10 --relays 6
    .venv/bin/python bench/load.py --tiny                # seconds: what make test runs

Phase 1 (sustained): relays are real `gt-user start` processes and the model node a real
`python -m testkit.echo_model` process (the echo engine: this measures the
overlay, not vLLM), all sharing one static directory on 127.0.0.1. `--askers` in-process user
nodes run `--users` concurrent ask loops for `--seconds`. Reported: success rate, latency
p50/p99, and the RSS of every relay and of the model node before and after (a leak or an
unbounded queue shows as growth). Afterwards every relay's and the model node's log (relays
log at INFO) is scanned for the private keys of all of them: `secrets_in_logs.hits` must be [].

Phase 2 (overload): an in-process echo model node admits at most `--admit` requests at a time
and each takes `--hold-s`; `--burst` asks arrive at once. Backpressure must show as a clear
"busy" refusal (counted in the model node's intake drops) and every ask ends (answered or a
clear AskError) instead of hanging.

Prints ONE JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gentorrent.config import CloveParams, OverlayParams  # noqa: E402
from devnet.supervisor import Supervisor, python_module, wait_until  # noqa: E402
from testkit.keyleaks import leak_report  # noqa: E402
from user_client.asking import AskError  # noqa: E402
from testkit.echo_model import ECHO_PREFIX, EchoModelNode  # noqa: E402
from testkit.localnet import start_user_nodes  # noqa: E402

PARAMS = OverlayParams(first_reply_timeout_s=20.0, reply_idle_timeout_s=30.0, forward_timeout_s=8.0,
                       establish_timeout_s=8.0, maintenance_interval_s=2.0, build_attempts=12)


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 1)


async def ask_loop(node, end: float, tag: str, lat: list[float], errors: dict) -> int:
    sent = 0
    while time.monotonic() < end:
        prompt = f"{tag} #{sent}"
        sent += 1
        t0 = time.monotonic()
        try:
            answer = await asyncio.wait_for(node.ask(prompt), 120)
            if answer.text == ECHO_PREFIX + prompt:
                lat.append((time.monotonic() - t0) * 1000)
            else:
                errors["wrong_answer"] = errors.get("wrong_answer", 0) + 1
        except AskError as exc:
            key = "busy" if "busy" in str(exc) else "ask_error"
            errors[key] = errors.get(key, 0) + 1
        except asyncio.TimeoutError:
            errors["hang"] = errors.get("hang", 0) + 1
    return sent


def _spawn_and_wait(sup: Supervisor, name: str, argv: list[str], ready: Path | None = None) -> int:
    managed = sup.spawn(name, argv, cwd=ROOT)
    log = Path(managed.log)
    wait_until(lambda: (ready.exists() if ready else '"address"' in log.read_text()), 120, f"{name} to start")
    return managed.pid


async def sustained(tmp: Path, relays: int, askers: int, users: int, seconds: float) -> dict:
    directory = tmp / "directory.json"
    sup = Supervisor(tmp / "procs")
    nodes = []
    try:
        model_pid = await asyncio.to_thread(_spawn_and_wait, sup, "echo-model", python_module(
            "testkit.echo_model", "--home", str(tmp / "model"), "--directory", str(directory)))
        relay_pids = []
        for i in range(relays):  # one at a time: they all write the one static directory file
            home = tmp / f"relay{i}"
            relay_pids.append(await asyncio.to_thread(_spawn_and_wait, sup, f"relay{i}", python_module(
                "user_client.cli", "--log-level", "INFO", "start", "--home", str(home), "--directory", str(directory)),
                home / "node.json"))
        # askers relay too (they are user nodes); their paths go through the relay processes
        nodes = await start_user_nodes(askers, directory, tmp / "askers", params=PARAMS, maintain=True)
        await asyncio.gather(*(n.paths.fill() for n in nodes))
        warmup_failures = 0
        for n in nodes:  # warm up channels and paths (a first ask may race a directory refresh)
            for _ in range(3):
                try:
                    await n.ask("warm up")
                    break
                except AskError:
                    warmup_failures += 1
        before = {"model": rss_mib(model_pid), "relays": [rss_mib(p) for p in relay_pids]}
        lat: list[float] = []
        errors: dict[str, int] = {}
        end = time.monotonic() + seconds
        t0 = time.monotonic()
        sent = sum(await asyncio.gather(*(ask_loop(nodes[u % len(nodes)], end, f"user {u}", lat, errors)
                                          for u in range(users))))
        took = time.monotonic() - t0
        await asyncio.sleep(1.0)
        after = {"model": rss_mib(model_pid), "relays": [rss_mib(p) for p in relay_pids]}
        relay_tables = [n.relay.status()["table"] for n in nodes]
    finally:
        for n in nodes:
            await n.stop()
        await asyncio.to_thread(sup.stop_all, 15.0)
    secrets = leak_report(sup.logs.glob("*.log"), [tmp / "model", *(tmp / f"relay{i}" for i in range(relays))])
    ok = len(lat)
    return {"users": users, "seconds": round(took, 1), "sent": sent, "answered": ok,
            "success_rate": round(ok / sent, 4) if sent else None, "asks_per_s": round(ok / took, 2),
            "latency_ms_p50": pct(lat, 0.5), "latency_ms_p99": pct(lat, 0.99),
            "latency_ms_mean": round(statistics.fmean(lat), 1) if lat else None, "errors": errors,
            "rss_mib_before": before, "rss_mib_after": after,
            "relay_rss_growth_mib_max": max((a - b for a, b in zip(after["relays"], before["relays"])
                                             if a is not None and b is not None), default=None),
            "model_rss_growth_mib": (after["model"] - before["model"]) if after["model"] and before["model"] else None,
            "asker_relay_tables": relay_tables, "warmup_failures": warmup_failures, "secrets_in_logs": secrets}


async def overload(tmp: Path, admit: int, hold_s: float, burst: int) -> dict:
    cloves = CloveParams(n=2, k=1, path_length=2, proxies_kept=2)
    directory = tmp / "directory.json"
    model = EchoModelNode(tmp / "model", directory, cloves=cloves, params=PARAMS)
    model.intake.max_active = admit

    original = model.generate

    async def slow(request):
        await asyncio.sleep(hold_s)
        async for chunk in original(request):
            yield chunk
    model.intake.generate = slow  # the intake calls this per decoded query: a slow engine
    await model.start()
    nodes = await start_user_nodes(4, directory, tmp / "users", cloves=cloves, params=PARAMS, maintain=False)
    try:
        await nodes[0].paths.fill()
        results: dict[str, int] = {}
        t0 = time.monotonic()

        async def one(i: int) -> None:
            try:
                await asyncio.wait_for(nodes[0].ask(f"burst {i}"), 120)
                key = "answered"
            except AskError as exc:
                key = "busy" if "busy" in str(exc) else "other_error"
            except asyncio.TimeoutError:
                key = "hang"
            results[key] = results.get(key, 0) + 1
        await asyncio.gather(*(one(i) for i in range(burst)))
        took = time.monotonic() - t0
        drops = model.intake.drops.as_dict()
        asker = nodes[0].asker.status()["drops"]
    finally:
        for n in nodes:
            await n.stop()
        await model.stop()
    return {"admit": admit, "hold_s": hold_s, "burst": burst, "outcomes": results, "seconds": round(took, 1),
            "model_intake_drops": drops, "asker_drops": asker,
            "busy_visible_to_user": results.get("busy", 0) > 0,
            "busy_counted_at_model": drops.get("busy", 0) > 0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--askers", type=int, default=2, help="in-process user nodes the users ask from")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--relays", type=int, default=8)
    ap.add_argument("--admit", type=int, default=2)
    ap.add_argument("--hold-s", type=float, default=2.0)
    ap.add_argument("--burst", type=int, default=8)
    ap.add_argument("--skip-overload", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="seconds, what make test runs: 2 users, 2 s, 4 relays")
    args = ap.parse_args(argv)
    if args.tiny:
        args.users, args.askers, args.seconds, args.relays = 2, 1, 2.0, 4
        args.admit, args.hold_s, args.burst = 1, 0.5, 3
    with tempfile.TemporaryDirectory(prefix="gt-load-") as tmp:
        tmp = Path(tmp)
        print(f"[load] sustained: {args.users} users for {args.seconds:.0f} s through {args.relays} relay processes",
              file=sys.stderr, flush=True)
        result = {"bench": "load", "cpus": os.cpu_count(), "loadavg_1m": os.getloadavg()[0],
                  "sustained": asyncio.run(sustained(tmp / "a", args.relays, args.askers, args.users, args.seconds))}
        if not args.skip_overload:
            print(f"[load] overload: {args.burst} asks at once, admit {args.admit}", file=sys.stderr, flush=True)
            result["overload"] = asyncio.run(overload(tmp / "b", args.admit, args.hold_s, args.burst))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
