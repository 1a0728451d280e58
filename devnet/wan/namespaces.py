"""Network namespaces of the WAN in a box: the plan (pure), building it, and removing it.

Layout (all of it inside namespaces this module made; the machine's own namespace gets
nothing: no interface, route, rule or address):

- every node runs in its own namespace `<prefix>-<node>`. A node with a public address holds
  one TUN device, `wan0`, with its address 10.K.0.1/32 (one /16 per node, so that prefix
  diversity rules between relays can be met) and a default route through it; the emulator
  (`devnet.wan.emulator`) holds the device's other end.
- a node behind NAT runs in its namespace on a private LAN (192.168.1.2/24, the same at every
  home) whose only way out is its router's namespace `<prefix>-<node>-nat`: the TUN device
  with the public address, masquerade out of it, and nothing in: connections from outside are
  dropped silently, as a home router without port forwarding does.
- the operator's namespace `<prefix>-operator` (where `gt-devnet status`, `ask` and the health
  checks of `up` run) is on the WAN with a perfect link, and holds the management bridge: one
  veth per node (`mgmt0` in the node, 100.64.0.N/24) for the node's local API, metrics and
  status page, which a real operator reaches on localhost. Bridge ports are isolated: nodes
  cannot reach each other through it.

`leftovers` and `remove` find namespaces by name prefix, so what a killed `up` left behind is
found without its state file too; the state file (`wan.json` in the devnet's root) records
the plan for `down`, `status` and the tests.
"""

from __future__ import annotations

import ctypes
import hashlib
import ipaddress
import json
import os
import random
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from devnet.wan.profiles import PERFECT, LinkParams, WanProfile

STATE_FILE = "wan.json"
NETNS_DIR = Path("/run/netns")
PREFIX_ROOT = "gtw"  # every namespace this module makes starts with it
OPERATOR = "operator"
TUN = "wan0"
MGMT = "mgmt0"
LAN = "lan0"
BRIDGE = "mgmt"
MGMT_NET = ipaddress.IPv4Network("100.64.0.0/24")
LAN_ROUTER, LAN_HOST = "192.168.1.1", "192.168.1.2"
MAX_NODES = MGMT_NET.num_addresses - 3  # the bridge's address, network and broadcast


class WanError(RuntimeError):
    """The WAN cannot be built here (not root, no nft), or its plan is wrong."""


@dataclass
class PlacedNode:
    """Where one node of the devnet runs on the WAN."""

    name: str
    role: str
    netns: str  # where the node's processes run
    address: str  # its public IPv4 address (on the TUN device, at its router when behind NAT)
    mgmt: str  # its management address (local API, metrics, status page)
    link: dict  # LinkParams, as a dict
    nat: bool = False

    @property
    def wan_netns(self) -> str:
        """The namespace holding the TUN device: the node's own, or its NAT router's."""
        return f"{self.netns}-nat" if self.nat else self.netns

    @property
    def listen_host(self) -> str:
        """The address the node listens on: its public one, or its LAN address behind NAT."""
        return LAN_HOST if self.nat else self.address

    def link_params(self) -> LinkParams:
        return LinkParams(**self.link)


@dataclass
class WanPlan:
    prefix: str
    profile: dict
    seed: int
    nodes: list[PlacedNode] = field(default_factory=list)

    def node(self, name: str) -> PlacedNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    @property
    def operator(self) -> PlacedNode:
        return self.node(OPERATOR)

    def namespaces(self) -> list[str]:
        names = []
        for n in self.nodes:
            names += [n.netns] + ([n.wan_netns] if n.nat else [])
        return names

    def save(self, root: Path) -> None:
        path = Path(root) / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, path)

    @classmethod
    def load(cls, root: Path) -> "WanPlan | None":
        try:
            doc = json.loads((Path(root) / STATE_FILE).read_text())
        except (OSError, ValueError):
            return None
        doc["nodes"] = [PlacedNode(**n) for n in doc["nodes"]]
        return cls(**doc)


def prefix_for(root: Path) -> str:
    """The namespace prefix of the devnet under `root` (short: interface-free, but readable)."""
    return f"{PREFIX_ROOT}{hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest()[:6]}"


def make_plan(prefix: str, nodes: list[tuple[str, str]], profile: WanProfile, seed: int = 1,
              local: frozenset[str] = frozenset()) -> WanPlan:
    """Addresses, links and NAT for `nodes` ((name, role) in order), pure and seeded.

    The K-th node (1-based) gets 10.K.0.1; the operator 10.0.0.1. NAT goes to the last users
    and models of their roles (so the first user, the one `gt-devnet ask` uses by default, and
    the first model node have public addresses). `local` nodes get perfect links."""
    if len(nodes) + 1 > MAX_NODES:
        raise WanError(f"a WAN devnet holds at most {MAX_NODES - 1} nodes ({len(nodes)} asked)")
    rng = random.Random(seed)
    by_role: dict[str, list[str]] = {}
    for name, role in nodes:
        by_role.setdefault(role, []).append(name)
    natted = {name for role, names in by_role.items()
              for name in names[len(names) - profile.behind_nat(role, len(names)):]}
    hosts = list(MGMT_NET.hosts())
    plan = WanPlan(prefix, profile.describe(), seed)
    plan.nodes.append(PlacedNode(OPERATOR, OPERATOR, f"{prefix}-{OPERATOR}", "10.0.0.1", str(hosts[0]),
                                 asdict(PERFECT)))
    for k, (name, role) in enumerate(nodes, start=1):
        link = PERFECT if name in local else profile.draw(rng)
        plan.nodes.append(PlacedNode(name, role, f"{prefix}-{name}", f"10.{k}.0.1", str(hosts[k]), asdict(link),
                                     nat=name in natted))
    return plan


# --------------------------------------------------------------------------- running commands


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and out.returncode != 0:
        raise WanError(f"`{' '.join(argv)}` failed: {out.stderr.strip() or out.stdout.strip()}")
    return out


def ns_argv(netns: str, argv: list[str]) -> list[str]:
    """`argv` run inside `netns` (nsenter execs it: the process keeps its pid and command line)."""
    return ["nsenter", f"--net={NETNS_DIR / netns}", "--", *argv]


CLONE_NEWNET = 0x40000000


_home_netns: int | None = None  # the namespace this process started in, once it left it


def _setns(fd: int, what: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise WanError(f"cannot enter {what}: {os.strerror(err)}")


def enter_netns(netns: str) -> None:
    """Move the calling thread into `netns` (Python 3.11 has no os.setns). Threads and sockets
    made by this thread afterwards are in it too; those made before stay where they were."""
    global _home_netns
    if _home_netns is None:
        _home_netns = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    fd = os.open(NETNS_DIR / netns, os.O_RDONLY)
    try:
        _setns(fd, f"network namespace {netns}")
    finally:
        os.close(fd)


def leave_netns() -> None:
    """Back to the namespace this process started in (before removing the one it watched from)."""
    if _home_netns is not None:
        _setns(_home_netns, "this process's own network namespace")


def can_build_reason() -> str:
    """Why no WAN can be built on this machine ("" when it can): root, the tools, the TUN driver."""
    if os.geteuid() != 0:
        return "--wan needs root (network namespaces); run it as root, or without --wan on loopback"
    for tool, package in (("ip", "iproute2"), ("nsenter", "util-linux"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"--wan needs `{tool}` (Debian package {package}; deploy/install_system.sh installs it)"
    if not Path("/dev/net/tun").exists():
        return "--wan needs /dev/net/tun (the kernel's TUN driver)"
    return ""


def check_can_build() -> None:
    """Refuse, before anything is made, where no WAN can be built."""
    reason = can_build_reason()
    if reason:
        raise WanError(reason)


# --------------------------------------------------------------------------- building


def build(plan: WanPlan) -> None:
    """Make every namespace, the management bridge and the NAT routers (not the TUN devices:
    the emulator makes those, so that they vanish with it)."""
    made = set(existing(plan.prefix))
    for ns in plan.namespaces():
        if ns in made:
            raise WanError(f"network namespace {ns} exists already (`gt-devnet down` removes leftovers)")
        _run("ip", "netns", "add", ns)
        _run("ip", "-n", ns, "link", "set", "lo", "up")
    op = plan.operator
    _run("ip", "-n", op.netns, "link", "add", BRIDGE, "type", "bridge")
    _run("ip", "-n", op.netns, "addr", "add", f"{op.mgmt}/{MGMT_NET.prefixlen}", "dev", BRIDGE)
    _run("ip", "-n", op.netns, "link", "set", BRIDGE, "up")
    for i, node in enumerate(plan.nodes):
        if node.role == OPERATOR:
            continue
        port = f"m{i}"
        _run("ip", "-n", op.netns, "link", "add", port, "type", "veth", "peer", "name", MGMT, "netns", node.netns)
        _run("ip", "-n", op.netns, "link", "set", port, "master", BRIDGE)
        _run("ip", "-n", op.netns, "link", "set", port, "type", "bridge_slave", "isolated", "on")
        _run("ip", "-n", op.netns, "link", "set", port, "up")
        _run("ip", "-n", node.netns, "addr", "add", f"{node.mgmt}/{MGMT_NET.prefixlen}", "dev", MGMT)
        _run("ip", "-n", node.netns, "link", "set", MGMT, "up")
        if node.nat:
            _build_nat(node)


NAT_RULES = """
table ip gentorrent_nat {
    chain postrouting {
        type nat hook postrouting priority srcnat; policy accept;
        oifname "%(tun)s" masquerade
    }
    chain forward {
        type filter hook forward priority filter; policy drop;
        ct state established,related accept
        iifname "%(lan)s" oifname "%(tun)s" accept
    }
    chain input {
        type filter hook input priority filter; policy accept;
        iifname "%(tun)s" ct state established,related accept
        iifname "%(tun)s" drop
    }
}
""" % {"tun": TUN, "lan": LAN}


def _build_nat(node: PlacedNode) -> None:
    """The home router: a LAN to the node, masquerade out, nothing in."""
    router = node.wan_netns
    _run("ip", "-n", router, "link", "add", LAN, "type", "veth", "peer", "name", LAN, "netns", node.netns)
    _run("ip", "-n", router, "addr", "add", f"{LAN_ROUTER}/24", "dev", LAN)
    _run("ip", "-n", router, "link", "set", LAN, "up")
    _run("ip", "-n", node.netns, "addr", "add", f"{LAN_HOST}/24", "dev", LAN)
    _run("ip", "-n", node.netns, "link", "set", LAN, "up")
    _run("ip", "-n", node.netns, "route", "add", "default", "via", LAN_ROUTER)
    _run(*ns_argv(router, ["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"]))
    subprocess.run(ns_argv(router, ["nft", "-f", "-"]), input=NAT_RULES, text=True, check=True,
                   capture_output=True, timeout=30)


def configure_tun(node: PlacedNode) -> None:
    """Address and default route on a node's TUN device (once the emulator made it)."""
    ns = node.wan_netns
    _run("ip", "-n", ns, "addr", "add", f"{node.address}/32", "dev", TUN)
    _run("ip", "-n", ns, "link", "set", TUN, "up")
    _run("ip", "-n", ns, "route", "add", "default", "dev", TUN)


# --------------------------------------------------------------------------- removing


def existing(prefix: str = PREFIX_ROOT) -> list[str]:
    """Namespaces whose name starts with `prefix` (all of this module's, by default)."""
    out = _run("ip", "netns", "list", check=False)
    names = [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
    mine = prefix if prefix == PREFIX_ROOT else prefix + "-"
    return sorted(n for n in names if n.startswith(mine))


def pids_in(netns: str) -> list[int]:
    out = _run("ip", "netns", "pids", netns, check=False)
    return [int(p) for p in out.stdout.split() if p.isdigit()]


def _ancestry() -> set[int]:
    """This process and its ancestors: never signalled by `remove`, wherever they run."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def remove(prefix: str, grace_s: float = 5.0) -> list[str]:
    """Stop every process still inside a namespace of `prefix`, then delete the namespaces
    (their interfaces, routes and NAT rules go with them). Returns the namespaces removed.
    The calling process and its ancestors are spared even if they watch from one of them (the
    namespace then lives on, nameless, until they leave or exit)."""
    if not prefix.startswith(PREFIX_ROOT) or len(prefix) <= len(PREFIX_ROOT):
        raise WanError(f"refusing to remove namespaces by the prefix {prefix!r}")
    names = existing(prefix)
    spared = _ancestry()
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        pids = {p for ns in names for p in pids_in(ns)} - spared
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while pids and time.monotonic() < deadline:
            pids = {p for ns in names for p in pids_in(ns)} - spared
            time.sleep(0.1)
    for ns in names:
        _run("ip", "netns", "del", ns, check=False)
    return names


def tear_down(root: Path, grace_s: float = 5.0) -> list[str]:
    """Remove what the WAN of the devnet under `root` left: its namespaces, and its state file."""
    removed = remove(prefix_for(root), grace_s)
    (Path(root) / STATE_FILE).unlink(missing_ok=True)
    return removed
