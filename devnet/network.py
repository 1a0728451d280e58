"""`gt-devnet`: a whole GenTorrent network on 127.0.0.1, in one command.

    gt-devnet up     [--root var/devnet] [--users 12] [--verifiers 4] [--honest 2] [--dishonest 1]
    gt-devnet status [--root ...] [--json]
    gt-devnet ask "PROMPT" [--root ...] [--user 0] [--max-tokens 64]
    gt-devnet down   [--root ...]

The devnet runs what a deployment runs, and shares nothing but the committee's genesis file:
`up` makes the committee's homes and genesis (`gt-verifier init`), starts the vLLM engines in
parallel (the verifiers' shared reference engine and the model nodes: honest ones serve
`smollm2-135m`; the dishonest one, `gt-model serve` with the `pruned` cheater plugged in
(testkit/dishonest_model.py), serves half the layers of the same weights while claiming the
same name, as a cheating volunteer would),
starts the verifiers (verification epochs on) once the reference engine serves, and the user
nodes as soon as the committee commits (while the engines still load). Every model and user node gets `--committee GENESIS` and nothing else: it
registers itself with a signed transaction, waits until the committee's light-client-checked
directory lists it, renews its lease, and works from that directory alone (the clove intake's
proxies, the model group it forwards and gossips in, every peer's pinned certificate). `up`
returns when the network is healthy: the committee commits blocks, every node registered
itself, every user node holds its proxy paths. Every node is the process a real deployment
runs (`gt-verifier start`, `gt-model serve`, `gt-user start`), with its own home, keys and
TLS certificate; every link is gRPC over pinned TLS.

Everything lives under one root (default `var/devnet/`, git-ignored): the node homes,
`logs/<node>.log` per node, the supervisor's `processes.json` (what `down` stops, and
nothing else), and `devnet.json` (what `status` and `ask` read).

One single-machine shortcut, said out loud (deploy/devnet/README.md): the verifiers share one
reference vLLM engine instead of running one each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from gentorrent.cli import (EXIT_FAILED, EXIT_NO_NODE, EXIT_USAGE, Parser, UsageError, committee_size_note, float_in,
                            int_in, run)
from gentorrent.config import CLOVES, DEVNET, MODEL_NODE, DevnetParams
from devnet.placement import COMMITTEE_BASE_PORT, DASHBOARD_PORT, Loopback, OnWan
from devnet.wan.emulator import READY_FILE
from devnet.wan.emulator import control as wan_control
from devnet.supervisor import STATE_FILE as PROCESSES_FILE
from devnet.supervisor import (Supervisor, free_port_block, python_module, recorded, running, stop_recorded,
                                   wait_until)
from devnet.wan import namespaces as wan_namespaces
from devnet.wan import profiles as wan_profiles

DEFAULT_ROOT = Path(os.environ.get("GT_DEVNET_ROOT", "var/devnet"))
STATE = "devnet.json"
CHAIN_ID = "gentorrent-devnet"
HOST = "127.0.0.1"

Progress = Callable[[str], None]
Placement = Loopback | OnWan


def say(text: str) -> None:
    """Progress goes out at once, also when stdout is a file or a pipe."""
    print(text, flush=True)


def _throttled(progress: Progress, every_s: float = 15.0) -> Progress:
    """Pass every line on, but "still waiting" notes (every 5 s) only every `every_s`."""
    last = [0.0]

    def note(text: str) -> None:
        if "still waiting" in text:
            if time.monotonic() - last[0] < every_s:
                return
            last[0] = time.monotonic()
        progress(text)

    return note


class DevnetError(RuntimeError):
    """The devnet cannot be brought up, or is not up; `code` is the exit status it means
    (gentorrent.cli: 1 it failed, 2 a bad argument, 3 no devnet there or nothing answers)."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class NodeInfo:
    name: str
    role: str  # verifier | model | user
    home: str
    address: str = ""
    node_id: str = ""
    extra: dict = field(default_factory=dict)


@dataclass
class DevnetState:
    root: str
    chain_id: str
    genesis: str
    nodes: list[NodeInfo]
    started_at: float = 0.0
    ready_s: float = 0.0
    epochs: bool = False  # the verifiers run verification epochs
    wan: dict = field(default_factory=dict)  # on the emulated WAN: profile, namespaces' prefix, operator's

    def of_role(self, role: str) -> list[NodeInfo]:
        return [n for n in self.nodes if n.role == role]

    def name_of(self, node_id: str = "", address: str = "") -> str:
        for n in self.nodes:
            if (node_id and n.node_id == node_id) or (address and n.address == address):
                return n.name
        return (node_id[:12] + "…") if node_id else address

    def save(self) -> None:
        path = Path(self.root) / STATE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, path)

    @classmethod
    def load(cls, root: Path) -> "DevnetState":
        path = Path(root) / STATE
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise DevnetError(f"no devnet at {root} (run `gt-devnet up --root {root}` first)", EXIT_NO_NODE) from exc
        doc["nodes"] = [NodeInfo(**n) for n in doc["nodes"]]
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in doc.items() if k in known})  # (a devnet.json of an older build)


# --------------------------------------------------------------------------- helpers


def _free_ports(count: int) -> int:
    try:
        return free_port_block(count, HOST)
    except RuntimeError as exc:
        raise DevnetError(str(exc)) from exc


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def _http_json(url: str, body: dict | None = None, timeout: float = 10.0) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = str(exc)
        raise DevnetError(f"{url}: HTTP {exc.code}: {message}") from exc
    except (urllib.error.URLError, OSError) as exc:  # the node is down (the devnet was stopped, or crashed)
        raise DevnetError(f"nothing answers at {url} ({getattr(exc, 'reason', exc)}): is the devnet up? "
                          "`gt-devnet status` shows what runs", EXIT_NO_NODE) from None


# --------------------------------------------------------------------------- committee


async def verifier_status(home: Path, address: str, timeout: float = 5.0) -> dict:
    """One verifier's Status (height, app hash, peers, detail), over pinned TLS."""
    from gentorrent.crypto.tls import connect
    from gentorrent.wire import gentorrent_pb2 as pb
    from gentorrent.wire import gentorrent_pb2_grpc as rpc
    from gentorrent.ledger.genesis import Genesis

    genesis = Genesis.load(Path(home) / "genesis.json")
    cert = next(v.tls_cert_pem for v in genesis.validators if v.address == address)
    channel = await connect(address, cert, timeout=timeout)
    try:
        reply = await rpc.VerifierStub(channel).Status(pb.Empty(), timeout=timeout)
    finally:
        await channel.close()
    return {"height": reply.height, "peers": len(reply.peers), "detail": json.loads(reply.json or "{}")}


@dataclass(frozen=True)
class CommitteeView:
    """What the committee certifies about this devnet's own nodes (looked up one by one, with
    proofs, as any node looks up a peer: nobody downloads the whole registry)."""

    height: int
    users: tuple
    models: tuple

    def model(self, node_id: bytes):
        return next((m for m in self.models if m.node_id == node_id), None)

    def user(self, node_id: bytes):
        return next((u for u in self.users if u.node_id == node_id), None)


def node_ids(state: "DevnetState") -> list[bytes]:
    """The node ids of this devnet's user and model nodes, and of the verifiers' probing users."""
    from gentorrent.crypto.keys import NodeKeys
    from verifier.epochs.wiring import PROBE_HOME

    homes = [Path(n.home) for n in state.nodes if n.role in ("user", "model", REFERENCE)]
    homes += [Path(v.home) / PROBE_HOME for v in state.of_role("verifier")]
    return [NodeKeys.load_or_create(h).identity.node_id for h in homes if (h / NodeKeys.IDENTITY_FILE).exists()]


async def committee_directory(genesis_path: Path, ids: list[bytes], timeout: float = 10.0) -> CommitteeView:
    """The light-client-checked records of `ids`; raises DirectoryRejected."""
    from gentorrent.ledger import queries
    from gentorrent.ledger.genesis import Genesis
    from gentorrent.ledger.light_client import committee_reader

    reader = committee_reader(Genesis.load(genesis_path), timeout)
    users, models, height = [], [], 0
    try:
        for node_id in ids:
            for query, out in ((queries.UserLookup(node_id), users), (queries.ModelLookup(node_id), models)):
                answer = await reader.ask(query)
                height = max(height, answer.height)
                if answer.result is not None:
                    out.append(answer.result)
    finally:
        await reader.close()
    return CommitteeView(height, tuple(users), tuple(models))


def _init_committee(root: Path, count: int, place: Placement) -> Path:
    """Homes, keys and one genesis for the committee (`gt-verifier init`); the genesis file."""
    if place.wan is None:
        hosts = ["--host", HOST, "--base-port", str(_free_ports(count))]
    else:  # each member on its own host, as on separate machines; still a devnet: a light proof
        # of work (the production one costs every node minutes of CPU), no prefix rules
        hosts = ["--hosts", ",".join(place.host(f"v{i}") for i in range(count)),
                 "--base-port", str(COMMITTEE_BASE_PORT), "--registry", "devnet"]
    out = subprocess.run(python_module("verifier.cli", "init", "--validators", str(count), "--out",
                                       str(root / "committee"), "--chain-id", CHAIN_ID, *hosts),
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise DevnetError(f"gt-verifier init failed: {out.stderr.strip()}")
    return root / "committee" / "v0" / "genesis.json"


def _audit_rate_args(rate: float | None) -> list[str]:
    """The committee's audit rate, for its members and for the users (one rate for all)."""
    return [] if rate is None else ["--audit-rate", repr(rate)]


def _start_committee(sup: Supervisor, root: Path, shape: DevnetParams, progress: Progress,
                     dashboards: bool, reference: NodeInfo | None, place: Placement) -> list[NodeInfo]:
    from gentorrent.ledger.genesis import Genesis

    genesis = Genesis.load(root / "committee" / "v0" / "genesis.json")
    nodes = []
    count = shape.verifiers
    for i in range(count):
        name = f"v{i}"
        home = root / "committee" / name
        argv = python_module("verifier.cli", "start", "--home", str(home))
        if reference is not None:  # every member scores with the one shared reference engine and
            # probes through a user node of its own, registered with the committee like any other
            argv += ["--epochs", "--reference-model", reference.address, "--probe-listen", f"{place.host(name)}:0",
                     "--reference-cert", reference.extra["cert_file"],
                     "--challenge-spread-s", str(shape.challenge_spread_s),
                     "--challenge-max-tokens", str(shape.challenge_max_tokens),
                     "--epoch-pause-s", str(shape.epoch_pause_s)]
            argv += _audit_rate_args(shape.audit_rate)
        extra = {}
        if dashboards:
            host, port = place.local(name), DASHBOARD_PORT if place.wan else _free_ports(1)
            argv += ["--dashboard", f"{host}:{port}"]
            extra["dashboard"] = f"http://{host}:{port}/"
            extra["metrics"] = f"http://{host}:{port}/metrics"
        sup.spawn(f"verifier-{name}", argv, via=place.via(name))
        nodes.append(NodeInfo(name, "verifier", str(home), genesis.validators[i].address, extra=extra))
    progress(f"committee: {count} verifiers started ({nodes[0].address}..{nodes[-1].address}"
             f"{', verification epochs on' if reference else ', no verification epochs'}), waiting for blocks")

    def committing() -> bool:
        statuses = [asyncio.run(verifier_status(Path(n.home), n.address)) for n in nodes]
        return all(s["height"] >= 2 for s in statuses)

    _wait_alive(sup, [f"verifier-{n.name}" for n in nodes], committing, DEVNET.node_start_timeout_s,
                "the committee to commit its first blocks", progress)
    for n in nodes:
        n.node_id = asyncio.run(verifier_status(Path(n.home), n.address))["detail"].get("node_id", "")
    progress("committee: committing blocks")
    return nodes


def _wait_alive(sup: Supervisor, names: list[str], check: Callable[[], bool], timeout: float, what: str,
                progress: Progress, status: Callable[[], str] | None = None, usual_s: float | None = None) -> None:
    """wait_until, failing at once (with the log's tail) if one of `names` died."""
    dead: list[str] = []

    def guarded() -> bool:
        dead.extend(name for name in names if not sup.alive(name))
        return bool(dead) or check()

    wait_until(guarded, timeout, what, progress, status=status, usual_s=usual_s)
    if dead:
        name = dead[0]
        tail = (sup.logs / f"{name}.log").read_bytes()[-2500:].decode(errors="replace")
        raise DevnetError(f"{name} exited with code {sup.exit_code(name)}; end of its log:\n{tail}")


# --------------------------------------------------------------------------- model nodes


REFERENCE = "reference"  # the verifiers' shared reference engine (its node name and role)


def _engine_plan(shape: DevnetParams, reference: bool) -> list[tuple[str, str | None]]:
    """(name, dishonest kind or None) of every engine to start, the reference engine first:
    the committee starts as soon as it serves."""
    from testkit.cheaters import KINDS

    kinds = [k.strip() for k in shape.dishonest_variant.split(",")]
    unknown = [k for k in kinds if k not in KINDS]
    if shape.dishonest_models and unknown:
        raise DevnetError(f"unknown dishonest kind {unknown[0]!r}; one of {', '.join(KINDS)}", EXIT_USAGE)
    plan: list[tuple[str, str | None]] = [(REFERENCE, None)] if reference else []
    plan += [(f"honest{i}", None) for i in range(shape.honest_models)]
    plan += [(f"dishonest{i}", kinds[i % len(kinds)]) for i in range(shape.dishonest_models)]
    return plan


def _start_network(sup: Supervisor, root: Path, genesis: Path, shape: DevnetParams, progress: Progress,
                   dashboards: bool, reference_at: NodeInfo | None, epochs: bool,
                   place: Placement, on_committee: Callable[[], None] = lambda: None) -> tuple[list, list]:
    """The engines, `shape.parallel_model_starts` at a time, and the committee as soon as the
    reference engine serves; model nodes register themselves once the committee answers.
    `on_committee` runs once the committee commits (the user nodes start then, while the
    engines are still loading). Returns (verifiers, engines)."""
    plan = _engine_plan(shape, reference=epochs and reference_at is None)
    verifiers: list[NodeInfo] = []
    engines: list[NodeInfo] = []

    def committee(reference: NodeInfo | None) -> None:
        verifiers.extend(_start_committee(sup, root, shape, progress, dashboards, reference if epochs else None,
                                          place))
        on_committee()

    if not plan or plan[0][0] != REFERENCE:
        committee(reference_at)  # nothing to wait for: the model nodes register as soon as they serve
    batch = max(1, shape.parallel_model_starts)
    for first in range(0, len(plan), batch):
        part = plan[first:first + batch]
        _spawn_engines(sup, root, part, genesis, progress, shape, place)
        if part[0][0] == REFERENCE:
            engines += _wait_engines(sup, root, part[:1], shape, progress)
            committee(engines[0])
            part = part[1:]
        engines += _wait_engines(sup, root, part, shape, progress)
    return verifiers, engines


def _spawn_engines(sup: Supervisor, root: Path, plan: list, genesis: Path, progress: Progress,
                   shape: DevnetParams, place: Placement) -> None:
    for name, cheat in plan:
        if shape.echo_models and name != REFERENCE:  # the overlay's stand-in: real intake, keys, receipts
            sup.spawn(f"model-{name}", python_module(
                "testkit.echo_model", "--home", str(root / "models" / name), "--committee", str(genesis),
                "--model", MODEL_NODE.default_model, *place.listen(name)),
                via=place.via(name))
            progress(f"model nodes: starting {name} (the echo stand-in: real clove intake, keys and receipts, "
                     "an engine that echoes), then it registers itself")
            continue
        # a cheater: the same `gt-model serve` code with a cheater plugged in (testkit/dishonest_model.py);
        # it claims the default model and serves something cheaper
        node = ("model_node.cli",) if cheat is None else ("testkit.dishonest_model", "--dishonest", cheat)
        argv = python_module(*node, "serve", "--model", MODEL_NODE.default_model,
                             "--home", str(root / "models" / name), *place.listen(name),
                             "--capacity", str(MODEL_NODE.default_capacity), "--metrics", f"{place.local(name)}:0")
        if name != REFERENCE:  # the reference engine is no member of the overlay
            argv += ["--committee", str(genesis)]
        what = ("the verifiers' shared reference engine" if name == REFERENCE
                else f"dishonest: {cheat}" if cheat else "honest")
        progress(f"model nodes: starting {name} ({what} {MODEL_NODE.default_model}; a vLLM engine on CPU "
                 f"takes a while{'' if name == REFERENCE else ', then it registers itself'})")
        env = {"VLLM_CPU_KVCACHE_SPACE": str(MODEL_NODE.cpu_kv_cache_gib)}
        if cheat == "selective":  # the cheater knows what the devnet publishes: its challenges' reply cap
            env["GT_SELECTIVE_CHALLENGE_MAX_TOKENS"] = str(shape.challenge_max_tokens)
        sup.spawn(f"model-{name}", argv, env=env, via=place.via(name))


def _wait_engines(sup: Supervisor, root: Path, plan: list, shape: DevnetParams,
                  progress: Progress) -> list[NodeInfo]:
    """Wait until each engine of `plan` serves (a member of the overlay: and is registered)."""
    if not plan:
        return []
    t0 = time.monotonic()
    homes = {name: root / "models" / name for name, _ in plan}
    _wait_alive(sup, [f"model-{name}" for name in homes],
                lambda: all((h / "node.json").exists() for h in homes.values()),
                shape.model_start_timeout_s, f"model node(s) {', '.join(homes)} to serve", progress,
                status=lambda: _engine_stages(sup, homes), usual_s=_usual_engine_start())
    nodes = []
    for name, cheat in plan:
        info = _read_json(homes[name] / "node.json") or {}
        nodes.append(NodeInfo(name, REFERENCE if name == REFERENCE else "model", str(homes[name]), info["address"],
                              info["node_id"], {"dishonest": cheat is not None, "cheat": cheat or "",
                                                "capacity": info.get("capacity"), "ready_s": info.get("ready_s"),
                                                "metrics": info.get("metrics", ""), "cert_file": info["cert_file"]}))
        progress(f"model nodes: {name} serves on {info['address']} (engine ready in {info.get('ready_s')}s"
                 f"{'' if name == REFERENCE else ', registered itself with the committee'})")
    progress(f"model nodes: {len(plan)} ready after {time.monotonic() - t0:.0f}s")
    return nodes


def verifiers_run_epochs() -> bool:
    """Whether this build's `gt-verifier start` can run verification epochs."""
    out = subprocess.run(python_module("verifier.cli", "start", "--help"), capture_output=True, text=True,
                         timeout=120)
    return "--epochs" in out.stdout


# --------------------------------------------------------------------------- user nodes


def _spawn_users(sup: Supervisor, root: Path, genesis: Path, count: int, progress: Progress,
                 audit_rate: float | None = None, place: Placement = Loopback()) -> list[NodeInfo]:
    """Start `count` user nodes (each registers itself); `_wait_users` waits for them."""
    nodes = []
    for i in range(count):
        name = f"u{i:02d}"
        home = root / "users" / name
        home.mkdir(parents=True, exist_ok=True)
        argv = python_module("user_client.cli", "start", "--home", str(home), "--committee", str(genesis),
                             *place.listen(name), "--api-listen", f"{place.local(name)}:0") \
            + _audit_rate_args(audit_rate)
        sup.spawn(f"user-{name}", argv, via=place.via(name))
        nodes.append(NodeInfo(name, "user", str(home)))
    progress(f"user nodes: {count} started, each registering itself with the committee")
    return nodes


def _wait_users(sup: Supervisor, nodes: list[NodeInfo], progress: Progress) -> list[NodeInfo]:
    count = len(nodes)
    names = [f"user-{n.name}" for n in nodes]
    _wait_alive(sup, names, lambda: all((Path(n.home) / "node.json").exists() for n in nodes),
                DEVNET.node_start_timeout_s, f"{count} user nodes to register and listen", progress,
                status=lambda: f"{sum((Path(n.home) / 'node.json').exists() for n in nodes)} of {count} registered")
    for n in nodes:
        info = _read_json(Path(n.home) / "node.json") or {}
        n.address, n.node_id = info["address"], info["node_id"]
        n.extra["api"] = info["api"]
        n.extra["metrics"] = info["api"] + "/metrics"  # the user API serves Prometheus text too
    return nodes


def user_status(user: NodeInfo, timeout: float = 10.0) -> dict:
    return _http_json(user.extra["api"] + "/gt/status", timeout=timeout)


def _paths_ready(users: list[NodeInfo]) -> bool:
    return _users_with_paths(users) == len(users)


def _users_with_paths(users: list[NodeInfo]) -> int:
    return sum(user_status(u)["paths"].get("usable", 0) >= CLOVES.n for u in users)


def _paths_progress(users: list[NodeInfo]) -> str:
    """How many user nodes are ready, and what holds back the others (their path status)."""
    behind = []
    for u in users:
        try:
            p = user_status(u)["paths"]
        except Exception as exc:  # noqa: BLE001 - a node still starting: say so
            behind.append(f"{u.name}: no status ({type(exc).__name__})")
            continue
        if p.get("usable", 0) < CLOVES.n:
            behind.append(f"{u.name}: {p.get('usable', 0)} usable, {p.get('built', 0)} built, "
                          f"{p.get('build_failures', 0)} failed, {p.get('relays_known', '?')} relays known"
                          + (f", last error {p['last_error']}" if p.get("last_error") else ""))
    return f"{len(users) - len(behind)} of {len(users)} ready" + (f" ({'; '.join(behind)})" if behind else "")


def _engine_stages(sup: Supervisor, homes: dict[str, Path]) -> str:
    """Where each starting model node is, from the stage lines `gt-model serve` writes to its log."""
    parts = []
    for name, home in homes.items():
        if (home / "node.json").exists():
            parts.append(f"{name} serving")
            continue
        try:
            tail = (sup.logs / f"model-{name}.log").read_bytes()[-4000:].decode(errors="replace")
        except OSError:
            tail = ""
        stage = next((line.split("gt-model: ", 1)[1] for line in reversed(tail.splitlines())
                      if line.startswith("gt-model: [")), "starting")
        parts.append(f"{name} {stage}")
    return ", ".join(parts)


def _usual_engine_start() -> float | None:
    """This machine's last engine start-up (written by gt-model), plus the devnet's own set-up."""
    from model_node.cli import last_engine_start

    seconds = last_engine_start(MODEL_NODE.default_model)
    return None if seconds is None else seconds * 1.5 + 10


# --------------------------------------------------------------------------- up / down


def up(root: Path = DEFAULT_ROOT, shape: DevnetParams = DEVNET, progress: Progress = say,
       dashboards: bool = True, reference_at: tuple[str, str] | None = None) -> DevnetState:
    """Start the whole network under `root`; on any failure stop what was started and raise.

    `reference_at` (address, certificate file) names an honest model node already running on
    this machine for the verifiers to score with, instead of starting a reference engine
    (the tests pass their session's model node: one vLLM engine less).

    With `shape.wan` (a profile of devnet.wan.profiles) every node runs in its own network
    namespace on the emulated WAN, and this process moves into the operator's namespace to
    watch them: call it from a process of its own (`gt-devnet up --wan`), never from one that
    has other work on the machine's network."""
    root = Path(root).resolve()
    progress = _throttled(progress)
    _engine_plan(shape, reference=False)  # an unknown cheater kind stops here, before anything starts
    if shape.echo_models and shape.dishonest_models:
        raise DevnetError("echo stand-ins are honest: --echo needs --dishonest 0")
    if shape.wan:
        wan_profiles.profile(shape.wan)  # an unknown profile too
        if reference_at is not None:
            raise DevnetError("a WAN devnet starts its own reference engine in a namespace: no reference_at")
    alive = running(root)
    if alive:
        raise DevnetError(f"a devnet is already running under {root} ({len(alive)} processes); "
                          f"`gt-devnet down --root {root}` first", EXIT_USAGE)
    leftovers = wan_namespaces.tear_down(root)
    if leftovers:
        progress(f"wan: removed {len(leftovers)} network namespaces a stopped devnet left behind")
    _clean(root)
    t0 = time.monotonic()
    sup = Supervisor(root)
    try:
        epochs = shape.epochs and not shape.echo_models and verifiers_run_epochs()
        if shape.epochs and shape.echo_models:
            progress("committee: no verification epochs with echo model nodes (nothing to score)")
        elif shape.epochs and not epochs:
            progress("committee: this build's gt-verifier cannot run verification epochs yet (no --epochs)")
        place = Loopback() if not shape.wan else _start_wan(sup, root, shape, epochs and reference_at is None,
                                                            progress)
        genesis = _init_committee(root, shape.verifiers, place)  # the one file every node is given
        shared = None if reference_at is None else \
            NodeInfo(REFERENCE, REFERENCE, "", reference_at[0], extra={"cert_file": reference_at[1]})
        users: list[NodeInfo] = []

        def start_users() -> None:  # as soon as the committee commits: they need no model node
            users.extend(_spawn_users(sup, root, genesis, shape.users, progress, shape.audit_rate, place))

        verifiers, engines = _start_network(sup, root, genesis, shape, progress, dashboards, shared, epochs, place,
                                            on_committee=start_users)
        models = [n for n in engines if n.role == "model"]
        _wait_users(sup, users, progress)
        state = DevnetState(str(root), CHAIN_ID, str(genesis), verifiers + engines + users, time.time(),
                            epochs=epochs, wan=_wan_summary(place))
        for n in state.nodes:
            if place.wan is not None and place.wan.node(n.name).nat:
                n.extra["nat"] = True
        state.save()
        _wait_alive(sup, recorded(root), lambda: _paths_ready(users), shape.healthy_timeout_s,
                    f"every user node to hold {CLOVES.n} proxy paths", progress,
                    status=lambda: _paths_progress(users))
        _wait_alive(sup, recorded(root), lambda: _committee_lists(state), shape.healthy_timeout_s,
                    "the committee's certified directory to list every node", progress)
        state.ready_s = round(time.monotonic() - t0, 1)
        state.save()
    except BaseException:
        progress(f"devnet: start-up failed, stopping what was started (logs stay in {root / 'logs'})")
        wan_namespaces.leave_netns()  # out of the operator's namespace before it is removed
        stop_recorded(root, shape.stop_grace_s)
        wan_namespaces.tear_down(root)
        raise
    where = "" if place.wan is None else \
        f" on the emulated WAN ({shape.wan}; {sum(bool(n.extra.get('nat')) for n in state.nodes)} behind NAT)"
    progress(f"devnet: healthy after {state.ready_s:.0f}s: {len(verifiers)} verifiers, {len(models)} model nodes "
             f"({shape.dishonest_models} dishonest), {len(users)} user nodes{where}; logs in {root / 'logs'}")
    return state


WAN_EMULATOR = "wan-emulator"  # its process name


def _wan_nodes(shape: DevnetParams, reference: bool) -> list[tuple[str, str]]:
    """(name, role) of every node `up` starts, in the order it names them."""
    nodes = [(f"v{i}", "verifier") for i in range(shape.verifiers)]
    nodes += [(name, REFERENCE if name == REFERENCE else "model") for name, _ in _engine_plan(shape, reference)]
    return nodes + [(f"u{i:02d}", "user") for i in range(shape.users)]


def _start_wan(sup: Supervisor, root: Path, shape: DevnetParams, reference: bool, progress: Progress) -> OnWan:
    """Namespaces, NAT routers and the link emulator for every node; then this process watches
    from the operator's namespace."""
    try:
        wan_namespaces.check_can_build()
    except wan_namespaces.WanError as exc:
        raise DevnetError(str(exc)) from None
    profile = wan_profiles.profile(shape.wan)
    plan = wan_namespaces.make_plan(wan_namespaces.prefix_for(root), _wan_nodes(shape, reference), profile,
                                    shape.wan_seed, local=frozenset({REFERENCE}))
    plan.save(root)
    wan_namespaces.build(plan)
    sup.spawn(WAN_EMULATOR, python_module("devnet.wan.emulator", "--root", str(root)))
    _wait_alive(sup, [WAN_EMULATOR], lambda: (root / READY_FILE).exists(), 60, "the link emulator", progress)
    nat = [n.name for n in plan.nodes if n.nat]
    progress(f"wan: {len(plan.nodes) - 1} nodes in their own network namespaces ({profile.description}); "
             f"behind NAT: {', '.join(nat) or 'none'}")
    wan_namespaces.enter_netns(plan.operator.netns)
    return OnWan(plan)


def _wan_summary(place: Placement) -> dict:
    if place.wan is None:
        return {}
    return {"profile": place.wan.profile["name"], "prefix": place.wan.prefix,
            "operator": place.wan.operator.netns, "seed": place.wan.seed}


def enter_operator(root: Path) -> None:
    """Watch a WAN devnet from its operator's namespace (a no-op for a devnet on loopback).
    Call before this process opens any connection: only threads made afterwards follow."""
    state = DevnetState.load(Path(root).resolve())
    if state.wan:
        wan_namespaces.enter_netns(state.wan["operator"])


def _committee_lists(state: DevnetState) -> bool:
    directory = asyncio.run(committee_directory(Path(state.genesis), node_ids(state)))
    return (len(directory.models) >= len(state.of_role("model"))
            and len(directory.users) >= len(state.of_role("user")))


def _clean(root: Path) -> None:
    """Fresh homes for a fresh network (nothing of ours is running: checked by the caller)."""
    for item in ("committee", "models", "users", "logs", STATE, PROCESSES_FILE, wan_namespaces.STATE_FILE):
        path = root / item
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    root.mkdir(parents=True, exist_ok=True)


def down(root: Path = DEFAULT_ROOT, grace_s: float = DEVNET.stop_grace_s) -> list[str]:
    """Stop exactly the processes `up` started under `root`, and remove the network namespaces
    of its WAN (also what a killed `up` left: found by their name prefix); returns the names of
    the processes stopped."""
    root = Path(root).resolve()
    stopped = stop_recorded(root, grace_s)
    wan_namespaces.tear_down(root)
    return stopped


# --------------------------------------------------------------------------- status / ask


def status(root: Path = DEFAULT_ROOT) -> dict:
    """What runs, what the committee certifies, and each node's own view."""
    state = DevnetState.load(Path(root).resolve())
    alive = set(running(Path(state.root)))
    report = {"root": state.root, "chain_id": state.chain_id, "nodes": []}
    if state.wan:
        report["wan"] = dict(state.wan)
        try:
            report["wan"]["emulator"] = wan_control(Path(state.root), {"stats": True})
        except (OSError, ValueError) as exc:
            report["wan"]["emulator"] = {"error": f"the link emulator does not answer ({exc})"}
    try:
        directory = asyncio.run(committee_directory(Path(state.genesis), node_ids(state)))
        certified = {m.node_id.hex(): m for m in directory.models}
        report["committee_directory"] = {"height": directory.height, "users": len(directory.users),
                                         "models": len(directory.models)}
    except Exception as exc:
        certified, report["committee_directory"] = {}, {"error": str(exc)}
    for n in state.nodes:
        process = {"verifier": "verifier-", "model": "model-", REFERENCE: "model-", "user": "user-"}[n.role] + n.name
        row = {"name": n.name, "role": n.role, "address": n.address, "running": process in alive, **n.extra}
        try:
            row.update(_node_view(n, certified))
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
        report["nodes"].append(row)
    return report


def _node_view(n: NodeInfo, certified: dict) -> dict:
    if n.role == "verifier":
        s = asyncio.run(verifier_status(Path(n.home), n.address))
        c = s["detail"].get("consensus", {})
        return {"height": s["height"], "round": c.get("round"), "peers": s["peers"]}
    if n.role == REFERENCE:
        return {}
    if n.role == "model":
        m = certified.get(n.node_id)
        return {} if m is None else {"reputation": round(m.reputation, 3), "trusted": m.trusted}
    s = user_status(n)
    return {"paths": s["paths"].get("usable", 0), "relayed": s["relay"].get("table", {}).get("forwarded", 0),
            "asked": s["asking"].get("asked", 0), "relaying": s.get("relaying", True),
            "reachability": s.get("reachability", "")}


def ask(prompt: str, root: Path = DEFAULT_ROOT, user: int = 0, max_tokens: int = 64,
        timeout: float = 300.0, temperature: float = 0.0) -> dict:
    """Ask through user node `user`'s overlay (its OpenAI-compatible chat endpoint, so the
    model node applies the chat template); the answer with its route named by node. Greedy by
    default, so that the demo's answer is the same on every run."""
    state = DevnetState.load(Path(root).resolve())
    users = state.of_role("user")
    if not 0 <= user < len(users):
        raise DevnetError(f"--user must be in 0..{len(users) - 1}", EXIT_USAGE)
    t0 = time.monotonic()
    reply = _http_json(users[user].extra["api"] + "/v1/chat/completions",
                       {"model": MODEL_NODE.default_model, "messages": [{"role": "user", "content": prompt}],
                        "max_tokens": max_tokens, "temperature": temperature}, timeout=timeout)
    overlay = reply.get("gentorrent", {})
    answer = {"text": reply["choices"][0]["message"]["content"], "model": reply.get("model"),
              "tokens": reply.get("usage", {}).get("completion_tokens", 0), **overlay}
    answer["wall_ms"] = round((time.monotonic() - t0) * 1000, 1)
    answer["asked_by"] = users[user].name
    answer["served_by_name"] = state.name_of(node_id=answer.get("served_by", ""))
    directory = asyncio.run(committee_directory(Path(state.genesis), node_ids(state)))
    record = directory.model(bytes.fromhex(answer.get("served_by", "") or "00"))
    answer["served_by_registered_height"] = record.registered_height if record else None
    probes = _probe_users(state, directory)
    answer["route"] = [[probes.get(a) or state.name_of(address=a) for a in path] for path in answer.get("paths", [])]
    return answer


def ask_node(prompt: str, node: NodeInfo, root: Path = DEFAULT_ROOT, user: int = 0, max_tokens: int = 16,
             timeout: float = 300.0, temperature: float = 0.0) -> dict:
    """Ask through user node `user`'s overlay, sending the query to the model node `node` (a
    user may pick the node; `gt-user ask` through its API's node_id). The answer names the
    node it was sent to (`sent_to`) and the one that served and signed it (`served_by`)."""
    state = DevnetState.load(Path(root).resolve())
    asker = state.of_role("user")[user]
    answer = _http_json(asker.extra["api"] + "/gt/ask",
                        {"prompt": prompt, "model": MODEL_NODE.default_model, "node_id": node.node_id,
                         "max_tokens": max_tokens, "temperature": temperature}, timeout=timeout)
    answer["sent_to"] = answer["attempts"][-1]["node"] if answer.get("attempts") else node.node_id
    answer["sent_to_name"] = state.name_of(node_id=answer["sent_to"])
    answer["served_by_name"] = state.name_of(node_id=answer.get("served_by", ""))
    return answer


def model_status(node: NodeInfo, timeout: float = 10.0) -> dict:
    """A model node's own status (load, routing: its forwarding decisions), over pinned TLS."""
    from gentorrent.crypto.tls import connect
    from gentorrent.wire import gentorrent_pb2 as pb
    from gentorrent.wire import gentorrent_pb2_grpc as rpc

    async def call() -> dict:
        channel = await connect(node.address, Path(node.extra["cert_file"]).read_bytes(), timeout=timeout)
        try:
            reply = await rpc.ModelNodeStub(channel).Status(pb.Empty(), timeout=timeout)
        finally:
            await channel.close()
        return json.loads(reply.json or "{}")

    return asyncio.run(call())


def _probe_users(state: DevnetState, directory) -> dict[str, str]:
    """address -> name of the user nodes the verifiers run to send challenges (they relay too),
    as the committee's directory lists them."""
    from gentorrent.crypto.keys import NodeKeys
    from verifier.epochs.wiring import PROBE_HOME

    ids = {}
    for v in state.of_role("verifier"):
        probe = Path(v.home) / PROBE_HOME
        if (probe / NodeKeys.IDENTITY_FILE).exists():
            ids[NodeKeys.load_or_create(probe).identity.node_id_hex] = f"{v.name}-probe"
    return {u.address: ids[u.node_id_hex] for u in directory.users if u.node_id_hex in ids}


def describe_answer(answer: dict) -> str:
    lines = [answer["text"].strip(),
             f"[asked by {answer['asked_by']}, served by {answer['served_by_name']} "
             f"({answer.get('served_by', '')[:16]}…, registered itself with the committee at height "
             f"{answer.get('served_by_registered_height')}), {answer['tokens']} tokens; route of each clove:"]
    for i, path in enumerate(answer["route"]):
        lines.append(f"   clove {i}: {answer['asked_by']} -> {' -> '.join(path)} (proxy) -> {answer['served_by_name']}")
    timings = answer.get("timings_ms", {})
    if timings:
        lines.append("   timings: " + ", ".join(f"{k.removesuffix('_ms')} {v:.1f} ms" for k, v in timings.items())
                     + f"; wall {answer['wall_ms']:.0f} ms]")
    return "\n".join(lines)


def describe_status(report: dict) -> str:
    lines = [f"devnet {report['chain_id']} at {report['root']}"]
    cd = report.get("committee_directory", {})
    lines.append("committee directory: " + (cd["error"] if "error" in cd else
                                            f"height {cd['height']}, {cd['models']} model nodes, {cd['users']} users"))
    for row in report["nodes"]:
        state = "up  " if row["running"] else "DOWN"
        hidden = ("name", "role", "address", "running", "api", "metrics", "cert_file")
        detail = {k: v for k, v in row.items() if k not in hidden and v not in ("", None)}
        lines.append(f"  {state} {row['role']:8s} {row['name']:10s} {row['address']:21s} "
                     + " ".join(f"{k}={v}" for k, v in detail.items()))
    return "\n".join(lines)


# --------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="gt-devnet", description="a whole GenTorrent network on 127.0.0.1")
    root_help = f"homes, logs and state (default {DEFAULT_ROOT}, or $GT_DEVNET_ROOT)"
    p.add_argument("--root", type=Path, default=DEFAULT_ROOT, help=root_help)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help_text)
        # --root after the command too (`gt-devnet status --root X`, as the docs and hints write it)
        c.add_argument("--root", type=Path, default=argparse.SUPPRESS, help=root_help)
        return c

    u = command("up", "start verifiers, model nodes and user nodes; wait until healthy")
    u.add_argument("--verifiers", type=int_in(1, 31), default=DEVNET.verifiers,
                   help="committee members (fewer than 4 tolerate no faulty member)")
    u.add_argument("--honest", type=int_in(1, 16), default=DEVNET.honest_models, help="honest model nodes")
    u.add_argument("--dishonest", type=int_in(0, 16), default=DEVNET.dishonest_models, help="dishonest model nodes")
    u.add_argument("--users", type=int_in(CLOVES.n, 256), default=DEVNET.users,
                   help=f"user nodes (at least n = {CLOVES.n}: each ask needs that many relays)")
    u.add_argument("--dishonest-kind", default=DEVNET.dishonest_variant,
                   help="how the dishonest nodes cheat (the kinds of testkit/cheaters.py; several, comma-separated, "
                        "are given out in turn)")
    u.add_argument("--audit-rate", type=float_in(0, 1), default=DEVNET.audit_rate, metavar="R",
                   help="share of users' asks audited, for the committee and the users (default: the project's)")
    u.add_argument("--parallel-models", type=int_in(1, 16), default=DEVNET.parallel_model_starts,
                   help="vLLM engines starting at once (1: one after another)")
    u.add_argument("--no-dashboard", action="store_true", help="do not serve the verifiers' status pages")
    u.add_argument("--no-epochs", action="store_true",
                   help="no verification epochs (and no reference engine: one vLLM engine less)")
    u.add_argument("--wan", metavar="PROFILE", choices=sorted(wan_profiles.PROFILES), default="",
                   help="every node in its own network namespace on an emulated WAN (root): "
                        + "; ".join(f"{p.name}: {p.description}" for p in wan_profiles.PROFILES.values())
                        .replace("%", "%%"))
    u.add_argument("--wan-seed", type=int_in(0), default=DEVNET.wan_seed,
                   help="seed of the WAN's links, NAT placement and per-packet decisions")
    u.add_argument("--echo", action="store_true",
                   help="echo stand-ins for the model nodes (real overlay, keys, receipts; no vLLM, no epochs)")
    s = command("status", "what runs and how each node is doing")
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    a = command("ask", "ask a question through a user node's anonymous overlay")
    a.add_argument("prompt", metavar="QUESTION", help="the question; `-` reads it from stdin")
    a.add_argument("--user", type=int_in(0), default=0, help="which user node asks (0 = u00)")
    a.add_argument("--max-tokens", type=int_in(1, MODEL_NODE.max_new_tokens), default=64,
                   help="longest answer in tokens")
    a.add_argument("--json", action="store_true", help="print the answer as JSON")
    command("down", "stop everything `up` started (nothing else)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run(lambda: _main(args), "gt-devnet")


def _main(args: argparse.Namespace) -> int:
    try:
        if args.cmd == "up":
            note = committee_size_note(args.verifiers)
            if note:
                print(f"gt-devnet: warning: {note}", file=sys.stderr)
            shape = replace(DEVNET, verifiers=args.verifiers, honest_models=args.honest,
                            dishonest_models=args.dishonest, users=args.users,
                            parallel_model_starts=args.parallel_models, dishonest_variant=args.dishonest_kind,
                            audit_rate=args.audit_rate,
                            epochs=not args.no_epochs, wan=args.wan, wan_seed=args.wan_seed,
                            echo_models=args.echo)
            state = up(args.root, shape, dashboards=not args.no_dashboard)
            for v in state.of_role("verifier"):
                if v.extra.get("dashboard"):
                    print(f"dashboard of {v.name}: {v.extra['dashboard']}")
            for u in state.of_role("user")[:1]:
                print(f"OpenAI-compatible API of {u.name}: {u.extra['api']}/v1 (any OpenAI client; "
                      f"`gt-devnet ask` uses it)")
            return 0
        if args.cmd in ("status", "ask"):
            enter_operator(args.root)  # a WAN devnet is watched from its operator's namespace
        if args.cmd == "status":
            report = status(args.root)
            print(json.dumps(report, indent=1) if args.json else describe_status(report))
            return 0 if all(r["running"] for r in report["nodes"]) else 1
        if args.cmd == "ask":
            prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
            answer = ask(prompt, args.root, args.user, args.max_tokens)
            print(json.dumps(answer) if args.json else describe_answer(answer))
            return 0
        stopped = down(args.root)
        print(f"stopped {len(stopped)} processes" + (f": {', '.join(stopped)}" if stopped else ""))
        return 0
    except DevnetError as exc:
        raise UsageError(str(exc), code=exc.code) from None
    except TimeoutError as exc:
        raise UsageError(str(exc), code=EXIT_FAILED) from None


if __name__ == "__main__":
    sys.exit(main())
