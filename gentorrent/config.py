"""Every protocol parameter of GenTorrent, in one place.

Defaults come from the paper and DESIGN.md; every module imports its constants from here so
that a deployment (or a test) changes a number once. The dataclasses are frozen: a running
node never mutates its parameters, it is given new ones. Per-node TOML files (issue 8) load
into these classes; unknown keys are rejected by name there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# --------------------------------------------------------------------------- wire limits


@dataclass(frozen=True)
class WireLimits:
    """Bounds checked *before* allocation (DESIGN.md §5)."""

    max_message_bytes: int = 4 * 1024 * 1024  # gRPC receive/send limit of every channel
    max_clove_bytes: int = 1024 * 1024 + 4096  # one S-IDA clove on the wire
    max_prompt_bytes: int = 512 * 1024  # a prompt or chat transcript, UTF-8
    max_tx_bytes: int = 64 * 1024  # one committee transaction
    rpc_timeout_s: float = 10.0  # default deadline of every unary RPC


WIRE = WireLimits()

# --------------------------------------------------------------------------- S-IDA / onion


@dataclass(frozen=True)
class CloveParams:
    """(n, k) S-IDA of DESIGN.md §3.3 and path length l of §3.2."""

    n: int = 4  # cloves per message = paths used per ask
    k: int = 3  # cloves needed to decode
    path_length: int = 3  # relays per proxy path (l)
    proxies_kept: int = 6  # N >= n proxies a user keeps
    path_renewal_s: float = 15 * 60.0  # renew every path this often
    path_idle_expiry_s: float = 30 * 60.0  # relays forget idle paths after this
    onion_size: int = 2048  # fixed size of an establishment onion at every hop
    link_id_bytes: int = 16


CLOVES = CloveParams()

# --------------------------------------------------------------------------- routing


@dataclass(frozen=True)
class RoutingParams:
    """HR-tree, Sentry, gossip and load balancing (DESIGN.md §3.4, paper §3.3, A2, A3)."""

    hash_bits: int = 8  # bits per chunk hash
    match_depth_threshold: int = 2  # tau_c: minimum matched depth to follow the tree
    load_threshold: float = 1.0  # max relative load (active / capacity) of a forward target
    default_chunk_length: int = 32  # L entries when the Sentry has found no system prompt
    max_tree_depth: int = 256
    gossip_interval_s: float = 5.0
    peer_silence_s: float = 20.0  # a peer silent this long drops out of the group
    sentry_refresh_requests: int = 10_000
    group_split_size: int = 50
    hash_seed: int = 0x67746F72  # seed of the universal hash ("gtor"), same on every node


ROUTING = RoutingParams()

# --------------------------------------------------------------------------- verification


@dataclass(frozen=True)
class ReputationParams:
    """R(T) = alpha R(T-1) + beta C(T), with the sliding-window punishment of DESIGN.md §3.5."""

    alpha: float = 0.4
    beta: float = 0.6
    window: int = 5  # W
    gamma: float = 1 / 5
    abnormal_threshold: float = 0.5  # tau, calibrated on honest sampling noise (issue 7)
    untrusted_below: float = 0.4
    initial_reputation: float = 1.0


REPUTATION = ReputationParams()


@dataclass(frozen=True)
class EpochParams:
    epoch_blocks: int = 20  # committee heights per verification epoch
    score_tolerance: float = 0.02  # ProcessProposal accepts leader scores within this
    challenge_max_tokens: int = 64


EPOCHS = EpochParams()

# --------------------------------------------------------------------------- consensus


@dataclass(frozen=True)
class ConsensusTimeouts:
    """Tendermint timeouts; each grows linearly with the round (timeout + r * delta)."""

    propose_s: float = 3.0
    propose_delta_s: float = 0.5
    prevote_s: float = 1.0
    prevote_delta_s: float = 0.5
    precommit_s: float = 1.0
    precommit_delta_s: float = 0.5
    commit_s: float = 1.0  # wait after a decision before the next height

    def propose(self, round_: int) -> float:
        return self.propose_s + round_ * self.propose_delta_s

    def prevote(self, round_: int) -> float:
        return self.prevote_s + round_ * self.prevote_delta_s

    def precommit(self, round_: int) -> float:
        return self.precommit_s + round_ * self.precommit_delta_s


CONSENSUS = ConsensusTimeouts()
#: short timeouts for tests and the loopback benchmark
CONSENSUS_FAST = ConsensusTimeouts(
    propose_s=0.3, propose_delta_s=0.1, prevote_s=0.1, prevote_delta_s=0.05,
    precommit_s=0.1, precommit_delta_s=0.05, commit_s=0.0,
)

# --------------------------------------------------------------------------- model nodes


@dataclass(frozen=True)
class ModelNodeParams:
    min_capacity: int = 1
    max_capacity: int = 10
    default_model: str = "smollm2-135m"
    max_new_tokens: int = 1024
    cpu_kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE per engine on CPU machines
    max_queued_requests: int = 64  # beyond this a node answers "busy"


MODEL_NODE = ModelNodeParams()


@dataclass(frozen=True)
class Defaults:
    """Everything above, handy to pass around as one object."""

    wire: WireLimits = field(default_factory=WireLimits)
    cloves: CloveParams = field(default_factory=CloveParams)
    routing: RoutingParams = field(default_factory=RoutingParams)
    reputation: ReputationParams = field(default_factory=ReputationParams)
    epochs: EpochParams = field(default_factory=EpochParams)
    consensus: ConsensusTimeouts = field(default_factory=ConsensusTimeouts)
    model_node: ModelNodeParams = field(default_factory=ModelNodeParams)
