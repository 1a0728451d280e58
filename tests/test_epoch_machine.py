"""The verification epoch machine, rule by rule, as tables of steps (pure: no committee, no app).

Each test is a list of `Step`s, as Malachite tests its consensus core (TestStep{input,
expected_outputs, new_state}): an input (an epoch transaction with its signer, or the end of a
block some time later), the machine's answer (0: applied, else the refusal's code, and then the
state must be exactly as before) and the parts of the new state the step is about. The state is
the registry's own StateView in memory; parameters come from its chain parameters, as they do
on chain. The same rules through the whole application (signed transactions, CheckTx, SQLite)
are tests/test_epochs_txs.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gentorrent.config import EPOCHS, REPUTATION
from gentorrent.crypto.keys import Identity
from gentorrent.ledger.chain_params import ChainParams
from gentorrent.ledger.epoch_txs import VERDICT_FORWARDED, VERDICT_LEADER_FAULTY, VERDICT_PROMPT_MISMATCH, Phase
from gentorrent.ledger.sections import ModelRecord
from gentorrent.ledger.txs import CODE_INVALID_FIELD, CODE_UNAUTHORIZED, TxError
from gentorrent.wire import gentorrent_pb2 as pb
from verifier.abci.state import CommittedState, StateView
from verifier.epochs import machine
from verifier.epochs import reputation as rep
from verifier.epochs.machine import CODE_WRONG_PHASE, DEADLINES, TRANSITIONS, Decision

CHAIN = "machine-test"
T0 = 1_700_000_000_000
P = Phase
MODEL_IDS = [Identity.from_seed(bytes([60 + i]) * 32) for i in range(3)]
NODE = [m.node_id for m in MODEL_IDS]  # the model nodes of every World, by index


# --------------------------------------------------------------------------- the world and its inputs


@dataclass(frozen=True)
class Tx:
    """A committed epoch transaction: member `by` (an index, or "leader") signs `message`."""

    by: int | str
    message: Any


@dataclass(frozen=True)
class BlockEnd:
    """The end of a block `dt_ms` after the previous one."""

    dt_ms: int = 1000


class World:
    """A registry state in memory: `n` members of power 1, `models` registered model nodes."""

    def __init__(self, n: int = 4, models: int = 3, params: ChainParams = ChainParams()) -> None:
        self.members = [Identity.from_seed(bytes([200 + i]) * 32) for i in range(n)]
        self.models = MODEL_IDS[:models]
        base = CommittedState(chain_id=CHAIN, time_ms=T0, params=params, initialized=True,
                              validators=tuple(sorted((m.public_key, 1) for m in self.members)))
        for m in self.models:
            base.models[m.node_id] = ModelRecord(m.node_id, m.public_key, "127.0.0.1:1", "smollm2-135m",
                                                 bytes(32))
        self.view = StateView(base)

    # ---------------------------------------------------------------- reading

    @property
    def sec(self) -> pb.EpochsSection:
        return self.view.epochs

    @property
    def leader(self) -> int:
        return next(i for i, m in enumerate(self.members) if m.public_key == self.sec.current.leader)

    def others(self) -> list[int]:
        """Member indices other than the leader."""
        return [i for i in range(len(self.members)) if i != self.leader]

    def node(self, i: int) -> bytes:
        return self.models[i].node_id

    def member(self, i: int) -> pb.MemberKeysEntry:
        return machine.member_keys_of(self.sec)[self.members[i].public_key]

    # ---------------------------------------------------------------- feeding

    def feed(self, item: Tx | BlockEnd) -> int:
        """Apply one input; the refusal's code (and then nothing changed), or 0."""
        if isinstance(item, BlockEnd):
            self.view.height += 1
            self.view.time_ms += item.dt_ms
            machine.end_block(self.view, bytes([self.view.height % 256]) * 32)
            return 0
        by = self.leader if item.by == "leader" else item.by
        before = self.view.epochs.SerializeToString(deterministic=True)
        try:
            self.view.epochs = machine.apply(self.view, self.members[by].public_key, item.message)
        except TxError as exc:
            assert self.view.epochs.SerializeToString(deterministic=True) == before
            return exc.code
        return 0


# --------------------------------------------------------------------------- steps


@dataclass
class Step:
    """One input, the machine's answer and the new state (only the keys given are compared)."""

    desc: str
    input: Callable[[World], Tx | BlockEnd]
    code: int = 0
    new_state: dict[str, Any] = field(default_factory=dict)


#: what a step's new_state may name, read off the world after the step
STATE: dict[str, Callable[[World], Any]] = {
    "epoch": lambda w: w.sec.epoch,
    "phase": lambda w: Phase(w.sec.current.phase),
    "reason": lambda w: w.sec.current.reason,
    "probe_set": lambda w: sorted(w.sec.current.probe_set),
    # the last closed epoch: (epoch, phase, faulty leader), its reason, its scores
    "closed": lambda w: (w.sec.history[-1].epoch, Phase(w.sec.history[-1].phase), w.sec.history[-1].faulty_leader),
    "closed_reason": lambda w: w.sec.history[-1].reason,
    "scores": lambda w: {s.node_id: s.score_micros for s in w.sec.history[-1].result},
    "faults": lambda w: [m.faults for m in w.sec.members],
    "disputes": lambda w: [m.disputes for m in w.sec.members],
    "disagreements": lambda w: [m.disagreements for m in w.sec.members],
    "reputations": lambda w: [round(w.view.models.get(m.node_id).reputation, 9) for m in w.models],
}


def run(world: World, steps: list[Step]) -> World:
    for step in steps:
        code = world.feed(step.input(world))
        assert code == step.code, f"{step.desc}: code {code}, expected {step.code}"
        for key, want in step.new_state.items():
            got = STATE[key](world)
            if callable(want):
                assert want(got), f"{step.desc}: {key} = {got!r}"
            else:
                assert got == want, f"{step.desc}: {key} = {got!r}, expected {want!r}"
    return world


# --------------------------------------------------------------------------- input builders


def keys(i: int) -> Callable[[World], Tx]:
    return lambda w: Tx(i, pb.EpochMemberKeys(vrf_public_key=bytes([i + 1]) * 32, box_public_key=bytes([7]) * 32))


def end(dt_ms: int = 1000) -> Callable[[World], BlockEnd]:
    return lambda w: BlockEnd(dt_ms)


def plan(nodes: Callable[[World], list[bytes]] | None = None, by: int | str = "leader") -> Callable[[World], Tx]:
    def build(w: World) -> Tx:
        chosen = sorted(w.sec.current.probe_set) if nodes is None else sorted(nodes(w))
        entries = [pb.ChallengeCommitment(node_id=n, commitment=bytes([i + 1]) * 32) for i, n in enumerate(chosen)]
        return Tx(by, pb.EpochPlan(epoch=w.sec.epoch, entries=entries))
    return build


def replies(missing: tuple[int, ...] = ()) -> Callable[[World], Tx]:
    """The leader's replies: a digest per planned node, `missing` (model indices) reported missing."""
    def build(w: World) -> Tx:
        gone = {w.node(i) for i in missing}
        items = [pb.ProbeReply(node_id=e.node_id, missing=True, reason="no reply") if e.node_id in gone
                 else pb.ProbeReply(node_id=e.node_id, digest=bytes(32)) for e in w.sec.current.plan]
        return Tx("leader", pb.EpochReplies(epoch=w.sec.epoch, replies=items))
    return build


def attest(by: int | Callable[[World], int], scores: dict[int, tuple] | int = 900_000) -> Callable[[World], Tx]:
    """Member `by` scores every posted reply: `scores` maps a model index to (micros, verdict[,
    server index]); an int scores them all alike."""
    def build(w: World) -> Tx:
        index = {m.node_id: i for i, m in enumerate(w.models)}
        out = []
        for r in (r for r in w.sec.current.replies if not r.missing):
            v = scores if isinstance(scores, int) else scores.get(index[r.node_id], 900_000)
            micros, verdict, *server = (v, 0) if isinstance(v, int) else v
            out.append(pb.NodeScore(node_id=r.node_id, score_micros=micros, verdict=verdict,
                                    served_by=w.node(server[0]) if server else b""))
        return Tx(by(w) if callable(by) else by, pb.EpochAttestation(epoch=w.sec.epoch, scores=out))
    return build


def probe(by: int | Callable[[World], int], node: int, ok: bool) -> Callable[[World], Tx]:
    return lambda w: Tx(by(w) if callable(by) else by,
                        pb.EpochProbeReport(epoch=w.sec.epoch, node_id=w.node(node), ok=ok))


def audit(by: int, scores: dict[int, int]) -> Callable[[World], Tx]:
    return lambda w: Tx(by, pb.EpochAuditReport(
        epoch=w.sec.epoch, receipts_digest=bytes(32),
        scores=[pb.NodeScore(node_id=w.node(i), score_micros=s) for i, s in sorted(scores.items())]))


def other(k: int) -> Callable[[World], int]:
    """The k-th member that does not lead this epoch."""
    return lambda w: w.others()[k]


#: keys of every member, epoch 1 opened, elected at the election deadline (no proofs: the hash ranking)
OPEN_AND_ELECT = [
    *[Step(f"member {i} registers its keys", keys(i), new_state={"epoch": 0, "phase": P.NONE}) for i in range(4)],
    Step("a quorum has keys: epoch 1 opens", end(), new_state={"epoch": 1, "phase": P.ELECTING}),
    Step("election deadline: the leader is elected without proofs", end(EPOCHS.election_timeout_ms),
         new_state={"phase": P.PLANNING}),
]
TO_ATTESTING = [*OPEN_AND_ELECT, Step("the plan covers the probe set", plan(), new_state={"phase": P.PROBING}),
                Step("every node replied", replies(), new_state={"phase": P.ATTESTING})]


def to_resolving(missing: tuple[int, ...]) -> list[Step]:
    """An epoch whose leader reported `missing` missing and whose replies are attested."""
    return [*OPEN_AND_ELECT, Step("plan", plan()), Step("replies, some missing", replies(missing)),
            *[Step(f"attestation {k}", attest(k)) for k in range(3)]]


# --------------------------------------------------------------------------- the table itself


@pytest.mark.parametrize("event", [t for t in TRANSITIONS if t in machine._HANDLERS])
def test_an_epoch_transaction_is_refused_in_every_phase_its_row_does_not_list(event):
    """The table is the rule: outside its listed phases a transaction changes nothing."""
    w = run(World(), OPEN_AND_ELECT)
    for phase in Phase:
        if phase in TRANSITIONS[event] or phase == P.NONE:
            continue
        w.view.epochs.current.phase = phase
        message = event(epoch=1) if event is not pb.EpochMemberKeys else event()
        assert w.feed(Tx(0, message)) == CODE_WRONG_PHASE, (event.__name__, phase)


def test_a_handler_cannot_take_the_epoch_where_the_table_does_not_lead():
    w = run(World(), OPEN_AND_ELECT)
    step = machine._Step(w.view, w.sec, pb.EpochReplies)
    with pytest.raises(AssertionError, match="EpochReplies may not move an epoch from 'planning' to 'done'"):
        step.enter(P.DONE)


def test_every_phase_with_a_deadline_has_one_and_leads_where_the_table_says():
    for phase, deadline in DEADLINES.items():
        assert deadline.then in TRANSITIONS[machine.DeadlinePassed][phase]
        assert hasattr(EPOCHS, deadline.timeout)


# --------------------------------------------------------------------------- opening and electing


def test_epochs_open_only_once_a_quorum_registered_keys():
    run(World(), [
        Step("member 0's keys", keys(0)),
        Step("its keys again: keys are for life", keys(0), code=CODE_INVALID_FIELD),
        Step("one member of four is no quorum", end(), new_state={"epoch": 0}),
        Step("member 1", keys(1)), Step("member 2", keys(2)),
        Step("3 of 4: epoch 1 opens", end(), new_state={"epoch": 1, "phase": P.ELECTING}),
        Step("a late member still registers, in any phase", keys(3), new_state={"phase": P.ELECTING}),
    ])


def test_an_epoch_transaction_for_another_epoch_is_refused():
    run(World(), [*OPEN_AND_ELECT,
                  Step("a plan for epoch 2", lambda w: Tx("leader", pb.EpochPlan(epoch=2)), code=CODE_WRONG_PHASE),
                  Step("a proof for epoch 1, no longer electing", lambda w: Tx(0, pb.EpochVrfProof(epoch=1)),
                       code=CODE_WRONG_PHASE)])


def test_the_probe_set_size_is_the_chains_not_the_members():
    """max_probed_nodes comes from the chain's parameters: 2 here, with 3 nodes registered,
    whatever this process's defaults say (64)."""
    params = ChainParams(epochs=replace(EPOCHS, max_probed_nodes=2))
    w = run(World(params=params), [*OPEN_AND_ELECT[:-1], Step("elect", end(EPOCHS.election_timeout_ms),
                                                              new_state={"probe_set": lambda s: len(s) == 2})])
    run(w, [Step("a plan of all three nodes lists more than the chain allows",
                 plan(lambda w: [m.node_id for m in w.models]), code=CODE_INVALID_FIELD),
            Step("the probe set's two", plan(), new_state={"phase": P.PROBING})])


# --------------------------------------------------------------------------- planning


@pytest.mark.parametrize("nodes", [lambda w: [w.node(0), w.node(2)], lambda w: [],
                                   lambda w: [w.node(0), w.node(1), bytes([9]) * 32]],
                         ids=["one_left_out", "none", "a_stranger_too"])
def test_a_plan_off_the_probe_set_makes_its_leader_faulty(nodes):
    run(World(), [*OPEN_AND_ELECT,
                  Step("the leader plans another set", plan(nodes),
                       new_state={"phase": P.ABORTED, "reason": lambda r: "does not cover the epoch's probe set" in r}),
                  Step("the block ends: the epoch closes, the next opens", end(),
                       new_state={"closed": (1, P.ABORTED, True), "epoch": 2, "phase": P.ELECTING,
                                  "faults": lambda f: sum(f) == 1, "reputations": [1.0, 1.0, 1.0]})])


def test_only_the_leader_plans():
    w = run(World(), OPEN_AND_ELECT)
    run(w, [Step("another member's plan", plan(by=w.others()[0]), code=CODE_UNAUTHORIZED,
                 new_state={"phase": P.PLANNING})])


def test_a_plan_with_nothing_to_probe_is_done():
    run(World(models=0), [*OPEN_AND_ELECT, Step("an empty plan", plan(), new_state={"phase": P.DONE}),
                          Step("close", end(), new_state={"closed": (1, P.DONE, False), "scores": {}})])


# --------------------------------------------------------------------------- replies and attestations


def test_replies_must_cover_the_plan():
    def skip_one(w: World) -> Tx:
        full = replies()(w)
        del full.message.replies[0]
        return full
    run(World(), [*OPEN_AND_ELECT, Step("plan", plan()),
                  Step("a node left out", skip_one, code=CODE_INVALID_FIELD, new_state={"phase": P.PROBING}),
                  Step("all missing: nothing to attest, resolving", replies((0, 1, 2)),
                       new_state={"phase": P.RESOLVING})])


def test_an_attested_epoch_takes_medians_marks_disagreement_and_updates_reputation():
    run(World(), [*TO_ATTESTING,
                  Step("member 0", attest(0, {0: 990_000, 1: 100_000, 2: 600_000}), new_state={"phase": P.ATTESTING}),
                  Step("member 0 again", attest(0), code=CODE_INVALID_FIELD),
                  Step("member 1", attest(1, {0: 995_000, 1: 110_000, 2: 610_000}), new_state={"phase": P.ATTESTING}),
                  Step("member 2 completes the quorum", attest(2, {0: 985_000, 1: 90_000, 2: 900_000}),
                       new_state={"phase": P.DONE}),
                  Step("late attestation", attest(3), code=CODE_WRONG_PHASE),
                  Step("close", end(), new_state={
                      "closed": (1, P.DONE, False), "disagreements": lambda d: sorted(d) == [0, 0, 0, 1],
                      "scores": lambda s: sorted(s.values()) == [100_000, 610_000, 990_000],
                      "reputations": [round(rep.update(rep.initial_state(), c, REPUTATION).reputation, 9)
                                      for c in (0.99, 0.1, 0.61)]})])


def test_the_score_tolerance_is_the_chains():
    """A member 0.29 away from the median is marked (once per reply, three here) under the default
    tolerance (0.05), and not under a chain whose genesis set 0.3."""
    for tolerance, marked in ((EPOCHS.score_tolerance, 3), (0.3, 0)):
        params = ChainParams(epochs=replace(EPOCHS, score_tolerance=tolerance))
        run(World(params=params), [*TO_ATTESTING, Step("0", attest(0, 610_000)), Step("1", attest(1, 600_000)),
                                   Step("2", attest(2, 900_000)),
                                   Step("close", end(), new_state={"disagreements": lambda d: sum(d) == marked})])


@pytest.mark.parametrize("verdict,faulty_reason", [(VERDICT_LEADER_FAULTY, "did not sign"),
                                                   (VERDICT_PROMPT_MISMATCH, "committed")])
def test_more_than_a_third_calling_a_reply_altered_aborts_with_the_leader_faulty(verdict, faulty_reason):
    run(World(), [*TO_ATTESTING,
                  *[Step(f"member {k} calls node 0's reply bad", attest(k, {0: (0, verdict)})) for k in range(2)],
                  Step("member 2 completes the quorum", attest(2),
                       new_state={"phase": P.ABORTED, "reason": lambda r: faulty_reason in r}),
                  Step("close", end(), new_state={"closed": (1, P.ABORTED, True), "reputations": [1.0, 1.0, 1.0],
                                                  "faults": lambda f: sum(f) == 1})])


def test_one_member_in_four_cannot_frame_the_leader():
    run(World(), [*TO_ATTESTING, Step("a lying member", attest(0, {0: (0, VERDICT_LEADER_FAULTY)})),
                  Step("1", attest(1)), Step("2", attest(2), new_state={"phase": P.DONE})])


def test_a_forwarded_challenge_is_scored_for_its_server_named_by_more_than_a_third():
    forwarded = {0: (900_000, VERDICT_FORWARDED, 1)}
    run(World(), [*TO_ATTESTING,
                  Step("a Byzantine member names node 2 and scores it 0", attest(0, {0: (0, VERDICT_FORWARDED, 2)})),
                  Step("1", attest(1, forwarded)), Step("2", attest(2, forwarded)),
                  Step("close", end(), new_state={"scores": {NODE[1]: 900_000, NODE[2]: 900_000},
                                                  "reputations": lambda r: r[0] == 1.0})])


def test_audit_scores_reported_by_a_quorum_fold_into_the_credibility():
    run(World(), [*OPEN_AND_ELECT, Step("plan", plan()),
                  *[Step(f"member {k}'s audits of node 1", audit(k, {1: 50_000})) for k in range(3)],
                  Step("member 0 twice", audit(0, {1: 50_000}), code=CODE_INVALID_FIELD),
                  Step("replies", replies()), *[Step(f"attestation {k}", attest(k)) for k in range(3)],
                  Step("close", end(), new_state={"scores": lambda s: sorted(s.values()) == [50_000, 900_000, 900_000]})])


# --------------------------------------------------------------------------- missing replies


def test_a_contradicted_missing_report_leaves_that_node_unscored_and_scores_the_rest():
    """A leader that drops the honest node's reply, or a node that answered every member but the
    leader: the committee cannot tell which, so it voids that node's score only."""
    run(World(), [*to_resolving(missing=(0,)),
                  Step("the leader cannot probe too", probe("leader", 0, False), code=CODE_UNAUTHORIZED),
                  Step("a node not reported missing", probe(other(0), 1, True), code=CODE_INVALID_FIELD),
                  Step("first other reaches it", probe(other(0), 0, True), new_state={"phase": P.RESOLVING}),
                  Step("the same member again", probe(other(0), 0, False), code=CODE_INVALID_FIELD),
                  Step("second", probe(other(1), 0, True), new_state={"phase": P.RESOLVING}),
                  Step("third: > 2/3 reached it, disputed, settled", probe(other(2), 0, True),
                       new_state={"phase": P.DONE, "reason": machine.dispute_reason(NODE[0].hex()),
                                  "disputes": lambda d: sum(d) == 1}),
                  Step("close", end(), new_state={"closed": (1, P.DONE, False),
                                                  "scores": lambda s: len(s) == 2 and NODE[0] not in s,
                                                  "reputations": lambda r: r[0] == 1.0 and r[1] < 1.0})])


def test_a_node_that_really_does_not_answer_is_punished():
    run(World(), [*to_resolving(missing=(1,)),
                  Step("one failure of the three others is not enough", probe(other(0), 1, False),
                       new_state={"phase": P.RESOLVING}),
                  Step("two of three: punished, settled", probe(other(1), 1, False), new_state={"phase": P.DONE}),
                  Step("a late report", probe(other(2), 1, True), code=CODE_WRONG_PHASE),
                  Step("close", end(), new_state={"scores": lambda s: s[NODE[1]] == 0,
                                                  "reputations": lambda r: r[1] == pytest.approx(REPUTATION.alpha)})])


def test_undecided_at_the_deadline_changes_nothing_for_that_node():
    run(World(), [*to_resolving(missing=(2,)), Step("one success only", probe(other(0), 2, True)),
                  Step("the resolving deadline", end(EPOCHS.attest_timeout_ms),
                       new_state={"closed": (1, P.DONE, False), "scores": lambda s: NODE[2] not in s,
                                  "reputations": lambda r: r[2] == 1.0})])


def test_a_dispute_settled_while_attesting_stays_named_when_the_epoch_aborts():
    run(World(), [*OPEN_AND_ELECT, Step("plan", plan()), Step("node 0 missing", replies((0,))),
                  *[Step(f"other {k} reaches it", probe(other(k), 0, True)) for k in range(3)],
                  Step("still attesting, the dispute noted", end(1),
                       new_state={"phase": P.ATTESTING, "reason": lambda r: "disputed" in r}),
                  Step("no attestation quorum in time", end(EPOCHS.attest_timeout_ms), new_state={
                      "closed": (1, P.ABORTED, False), "disputes": lambda d: sum(d) == 1,
                      "closed_reason": lambda r: r.startswith("no attestation quorum in time") and
                      f"disputed: the leader reported {NODE[0].hex()[:16]} missing" in r})])


def _resolving_world(n: int) -> World:
    """n members, one model node reported missing by the leader, nothing attested (one reply only)."""
    w = World(n=n, models=1)
    for i in range(n):
        w.feed(keys(i)(w))
    w.feed(BlockEnd())
    w.feed(BlockEnd(EPOCHS.election_timeout_ms))
    assert w.feed(plan()(w)) == 0 and w.feed(replies((0,))(w)) == 0
    assert Phase(w.sec.current.phase) == P.RESOLVING
    return w


@settings(max_examples=60, deadline=None)
@given(f=st.integers(min_value=1, max_value=3), data=st.data())
def test_attack_f_members_cannot_zero_a_slow_honest_node_its_honest_leader_missed(f, data):
    """An honest leader's challenge of a slow honest node timed out and it reported the node
    missing (truthfully, as it saw it). The f faulty members vote "failed", the honest ones
    reached it. When the leader's report counted as a failure, 1 + f > N/3 zeroed the node."""
    w = _resolving_world(3 * f + 1)
    others = w.others()
    faulty = set(data.draw(st.permutations(others))[:f])
    for k in data.draw(st.permutations(others)):
        if Phase(w.sec.current.phase) != P.RESOLVING:
            break
        assert w.feed(probe(k, 0, k not in faulty)(w)) == 0
        assert machine.decision(machine._reports(w.sec.current, w.node(0)), len(w.members)) != Decision.PUNISH
    w.feed(BlockEnd(EPOCHS.attest_timeout_ms))
    assert w.node(0) not in STATE["scores"](w)


@settings(max_examples=80, deadline=None)
@given(f=st.integers(min_value=1, max_value=3), data=st.data())
def test_honest_node_never_punished_by_up_to_f_faulty_members(f, data):
    """Leader faulty (drops the honest reply) plus up to f-1 colluding members that report
    failure; honest members' successes arrive in any order, possibly not all before the
    deadline. The honest node never gets credibility 0; with every report in, the leader's
    report is contradicted and the summary says so."""
    w = _resolving_world(3 * f + 1)
    others = w.others()
    colluders = set(others[: data.draw(st.integers(min_value=0, max_value=f - 1))])
    order = data.draw(st.permutations(others))
    delivered = data.draw(st.integers(min_value=0, max_value=len(order)))
    for k in order[:delivered]:
        if Phase(w.sec.current.phase) != P.RESOLVING:
            break
        assert w.feed(probe(k, 0, k not in colluders)(w)) == 0
    w.feed(BlockEnd(EPOCHS.attest_timeout_ms))
    assert STATE["closed"](w)[1] == P.DONE and w.node(0) not in STATE["scores"](w)
    if delivered == len(order):
        assert w.sec.history[-1].reason == machine.dispute_reason(w.node(0).hex())


def test_an_epoch_reason_names_at_most_reasons_listed_disputes():
    """Summaries stay in committed state: a leader disputed on every node of a large probe set
    cannot grow one reason without bound (its disputes counter counts them all)."""
    reason = ""
    for i in range(machine.REASONS_LISTED + 3):
        reason = machine.note_dispute(reason, f"{i:02d}" * 32)
    assert reason.count("disputed:") == machine.REASONS_LISTED
    assert f"{machine.REASONS_LISTED - 1:02d}" * 8 in reason and f"{machine.REASONS_LISTED:02d}" * 8 not in reason
    assert machine.note_dispute("faulty leader: x", "ab" * 32).startswith("faulty leader: x; disputed:")


@pytest.mark.parametrize("committee,reports,expected", [
    (4, [False, False], Decision.PUNISH),  # 2 * 3 > 3
    (4, [False], Decision.UNDECIDED),
    (4, [True, True, True], Decision.REACHED),  # 3 * 3 > 8
    (4, [True, True, False], Decision.UNDECIDED),
    (1, [], Decision.PUNISH),  # a committee of one trusts its leader
    (7, [False, False], Decision.UNDECIDED),  # 6 > 6 is false: f = 2 faulty members cannot punish
    (7, [False, False, False], Decision.PUNISH),
])
def test_decision_thresholds(committee, reports, expected):
    assert machine.decision({bytes([i]): ok for i, ok in enumerate(reports)}, committee) == expected


# --------------------------------------------------------------------------- deadlines


@pytest.mark.parametrize("phase", list(DEADLINES))
def test_each_phase_deadline_is_the_chains_and_does_what_the_table_says(phase):
    """Deadlines are block times under the chain's parameters: 1 s here, where this process's
    defaults would wait minutes."""
    short = replace(EPOCHS, election_timeout_ms=1000, plan_timeout_ms=1000, probe_timeout_ms=1000,
                    attest_timeout_ms=1000)
    w = World(params=ChainParams(epochs=short))
    for i in range(4):
        w.feed(keys(i)(w))
    w.feed(BlockEnd())
    ahead = {P.ELECTING: [], P.PLANNING: [end(1000)], P.PROBING: [end(1000), plan()],
             P.ATTESTING: [end(1000), plan(), replies()], P.RESOLVING: [end(1000), plan(), replies((0, 1, 2))]}
    for make in ahead[phase]:
        assert w.feed(make(w)) == 0
    assert Phase(w.sec.current.phase) == phase
    w.feed(BlockEnd(999))
    assert Phase(w.sec.current.phase) == phase  # not yet
    w.feed(BlockEnd(1))
    then = DEADLINES[phase].then
    if then == P.PLANNING:
        assert Phase(w.sec.current.phase) == P.PLANNING and w.sec.current.leader
    else:
        assert (w.sec.history[-1].phase, w.sec.history[-1].faulty_leader) == (then, DEADLINES[phase].faulty)
        assert w.sec.epoch == 2 and Phase(w.sec.current.phase) == P.ELECTING
