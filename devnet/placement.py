"""Where each node of a devnet runs: all on 127.0.0.1 (`Loopback`), or each in its own network
namespace on the emulated WAN (`OnWan`, devnet.wan). `gt-devnet up` asks its placement for
every address and launcher, so the two devnets start the same commands.
"""

from __future__ import annotations

from devnet.wan.namespaces import WanPlan, ns_argv

LOOPBACK = "127.0.0.1"
NAT_PORT = 7000  # the overlay port of a node behind NAT (its own namespace: every node may use it)
COMMITTEE_BASE_PORT = 26650  # on the WAN every member has its own host: the default ports are free
DASHBOARD_PORT = 8080


class Loopback:
    """Every node on 127.0.0.1, ports chosen by the OS."""

    wan = None

    def via(self, name: str) -> list[str]:
        return []

    def host(self, name: str) -> str:
        """The host the node listens on for the overlay (and registers, when public)."""
        return LOOPBACK

    def listen(self, name: str) -> list[str]:
        """The node's overlay listen arguments (`--listen H:P` and, behind NAT, `--advertise`)."""
        return ["--listen", f"{LOOPBACK}:0"]

    def local(self, name: str) -> str:
        """The host of the node's local API, metrics and status page."""
        return LOOPBACK


class OnWan:
    """Each node in its own namespace of `plan`; local APIs on the management network."""

    def __init__(self, plan: WanPlan) -> None:
        self.wan = plan

    def via(self, name: str) -> list[str]:
        return ns_argv(self.wan.node(name).netns, [])

    def host(self, name: str) -> str:
        return self.wan.node(name).address

    def listen(self, name: str) -> list[str]:
        node = self.wan.node(name)
        if not node.nat:
            return ["--listen", f"{node.address}:0"]
        # not reachable yet (README "Across real networks"): it registers its router's public
        # address, where nothing is forwarded to it, so nobody can dial it
        return ["--listen", f"{node.listen_host}:{NAT_PORT}", "--advertise", f"{node.address}:{NAT_PORT}"]

    def local(self, name: str) -> str:
        return self.wan.node(name).mgmt
