"""Epoch result logic: ProcessProposal checks, missing replies, faulty leaders (pure)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from gentorrent.traffic.model import ChatRequest
from verifier.epochs import challenges as ch
from verifier.epochs import epoch as ep
from verifier.epochs import reputation as rep

NODES = ["m-honest", "m-pruned", "m-other"]
KEYS = {n: Ed25519PrivateKey.from_private_bytes(bytes([i + 1]) * 32) for i, n in enumerate(NODES)}
MODELS = {n: "smollm2-135m" for n in NODES}
Q = ChatRequest.question


def _payload(r: ep.SignedReply) -> bytes:
    return json.dumps([r.node_id, r.prompt, r.model, r.reply]).encode()


def signed(node_id: str, prompt: str, reply: str, model: str = "smollm2-135m") -> ep.SignedReply:
    unsigned = ep.SignedReply(node_id, prompt, model, reply, b"")
    return replace(unsigned, signature=KEYS[node_id].sign(_payload(unsigned)))


def check_signature(r: ep.SignedReply) -> bool:
    try:
        KEYS[r.node_id].public_key().verify(r.signature, _payload(r))
        return True
    except (InvalidSignature, KeyError):
        return False


def setup_epoch():
    reveals = [ch.Reveal(n, bytes([i]) * 32, Q(f"Question number {i} about topic {n}?")) for i, n in enumerate(NODES)]
    plan = ch.make_plan(9, reveals)
    prompts = {n: r.text for n, r in ch.check_reveals(plan, reveals).items()}
    replies = {n: signed(n, prompts[n], f"answer of {n}") for n in NODES}
    scores = {"m-honest": 0.93, "m-pruned": 0.12, "m-other": 0.31}
    proposal = ep.EpochProposal(9, "v0", {n: ep.ReplyOutcome(replies[n], scores[n]) for n in NODES})
    return plan, prompts, proposal, scores


def judge(plan, prompts, proposal, my_scores):
    return ep.judge_proposal(plan, prompts, proposal, MODELS, check_signature, my_scores)


def test_intact_proposal_with_matching_scores_is_accepted():
    plan, prompts, proposal, scores = setup_epoch()
    assert judge(plan, prompts, proposal, scores).accept
    nudged = {n: s + 0.04 for n, s in scores.items()}  # within EPOCHS.score_tolerance = 0.05
    assert judge(plan, prompts, proposal, nudged).accept
    assert set(ep.replies_to_score(proposal)) == set(NODES)


def test_faulty_leader_proposals_are_rejected():
    plan, prompts, proposal, scores = setup_epoch()
    out = dict(proposal.outcomes)
    cases = {}
    # skips a node
    cases["skip"] = replace(proposal, outcomes={n: o for n, o in out.items() if n != "m-pruned"})
    # alters a reply (the node's signature no longer matches)
    r = out["m-honest"].reply
    cases["alter reply"] = replace(proposal, outcomes={**out, "m-honest": ep.ReplyOutcome(replace(r, reply="garbage"), 0.93)})
    # sent an altered prompt (the node honestly signed what it got)
    bad_prompt = signed("m-honest", "A different question?", "answer")
    cases["alter prompt"] = replace(proposal, outcomes={**out, "m-honest": ep.ReplyOutcome(bad_prompt, 0.93)})
    # a reply from a node claiming another model
    other_model = signed("m-other", prompts["m-other"], "answer", model="gemma3-270m")
    cases["model"] = replace(proposal, outcomes={**out, "m-other": ep.ReplyOutcome(other_model, 0.31)})
    # forges a reply: text of its own for the committed prompt, signed with a key other than the node's
    fake = ep.SignedReply("m-honest", prompts["m-honest"], "smollm2-135m", "a reply the leader wrote", b"")
    forged = replace(fake, signature=Ed25519PrivateKey.from_private_bytes(b"\x09" * 32).sign(_payload(fake)))
    cases["forge"] = replace(proposal, outcomes={**out, "m-honest": ep.ReplyOutcome(forged, 0.93)})
    # lowers an honest node's score
    cases["score"] = replace(proposal, outcomes={**out, "m-honest": ep.ReplyOutcome(r, 0.5)})
    # attributes one node's reply to another
    cases["swap"] = replace(proposal, outcomes={**out, "m-other": out["m-honest"]})
    cases["epoch"] = replace(proposal, epoch=10)
    cases["extra"] = replace(proposal, outcomes={**out, "m-ghost": ep.MissingOutcome("m-ghost")})
    for name, bad in cases.items():
        verdict = judge(plan, prompts, bad, scores)
        assert not verdict.accept and verdict.reasons, name
    assert not judge(plan, prompts, proposal, {"m-honest": 0.93}).accept  # could not score


def test_missing_reply_reported_without_penalty_is_accepted():
    plan, prompts, proposal, scores = setup_epoch()
    out = {**proposal.outcomes, "m-honest": ep.MissingOutcome("m-honest", "no reply")}
    assert judge(plan, prompts, replace(proposal, outcomes=out), scores).accept


COMMITTEE = ["v0", "v1", "v2", "v3"]


def record_with(proposal, plan):
    return ep.apply_result(ep.start_epoch(9, "v0", COMMITTEE, plan), proposal)


def test_all_replies_done_and_reputation_applied():
    plan, _, proposal, scores = setup_epoch()
    rec = record_with(proposal, plan)
    assert rec.phase == ep.Phase.DONE
    assert ep.epoch_credibilities(rec) == scores
    states = ep.finalize_reputations({n: rep.initial_state() for n in NODES}, rec)
    assert states["m-pruned"].reputation == pytest.approx(0.4 + 0.6 * 0.12)


def test_a_contradicted_missing_report_leaves_that_node_unscored_and_scores_the_rest():
    """A leader that drops the honest node's reply, or a node that answered every member but the
    leader: the committee cannot tell which, so it voids that node's score only."""
    plan, _, proposal, scores = setup_epoch()
    out = {**proposal.outcomes, "m-honest": ep.MissingOutcome("m-honest")}
    rec = record_with(replace(proposal, outcomes=out), plan)
    assert rec.phase == ep.Phase.RESOLVING and rec.missing == ("m-honest",)
    for v in ("v1", "v2"):
        rec = ep.apply_probe_report(rec, ep.ProbeReport(v, "m-honest", True))
        assert rec.phase == ep.Phase.RESOLVING
    rec = ep.apply_probe_report(rec, ep.ProbeReport("v3", "m-honest", True))
    assert ep.node_decision(rec, "m-honest") == ep.REACHED
    assert rec.phase == ep.Phase.DONE and not rec.faulty_leader and rec.reason == ep.dispute_reason("m-honest")
    creds = ep.epoch_credibilities(rec)
    assert "m-honest" not in creds and creds == {n: v for n, v in scores.items() if n != "m-honest"}
    after = ep.finalize_reputations({n: rep.initial_state() for n in NODES}, rec)
    assert after["m-honest"] == rep.initial_state()  # untouched
    assert after["m-pruned"].reputation == pytest.approx(0.4 + 0.6 * scores["m-pruned"])  # still judged


def test_node_that_really_does_not_answer_is_punished():
    plan, _, proposal, scores = setup_epoch()
    out = {**proposal.outcomes, "m-pruned": ep.MissingOutcome("m-pruned")}
    rec = record_with(replace(proposal, outcomes=out), plan)
    rec = ep.apply_probe_report(rec, ep.ProbeReport("v2", "m-pruned", False))
    assert rec.phase == ep.Phase.RESOLVING  # one failure of the 3 others: the leader's report does not count
    rec = ep.apply_probe_report(rec, ep.ProbeReport("v3", "m-pruned", False))
    assert rec.phase == ep.Phase.DONE  # 2 of the 3 others: 2 * 3 > 3, decided
    creds = ep.epoch_credibilities(rec)
    assert creds["m-pruned"] == 0.0 and creds["m-honest"] == scores["m-honest"]
    with pytest.raises(ep.EpochError):  # late reports change nothing
        ep.apply_probe_report(rec, ep.ProbeReport("v1", "m-pruned", True))


@settings(max_examples=60, deadline=None)
@given(f=st.integers(min_value=1, max_value=3), data=st.data())
def test_attack_f_members_cannot_zero_a_slow_honest_node_its_honest_leader_missed(f, data):
    """An honest leader's challenge of a slow honest node timed out, and it reported the node
    missing (truthfully, as it saw it). The f faulty members vote "failed", the honest ones
    reached it. When the leader's report counted as a failure, 1 + f > N/3 zeroed the node."""
    n = 3 * f + 1
    committee = [f"v{i}" for i in range(n)]
    faulty = committee[1 : 1 + f]
    reports = [ep.ProbeReport(v, "m-honest", v not in faulty) for v in committee[1:]]
    order = data.draw(st.permutations(reports))
    plan = ch.make_plan(1, [ch.Reveal("m-honest", b"\x01" * 32, Q("How do tides work?"))])
    rec = ep.start_epoch(1, committee[0], committee, plan)
    rec = ep.apply_result(rec, ep.EpochProposal(1, committee[0], {"m-honest": ep.MissingOutcome("m-honest")}))
    for report in order:
        if rec.phase != ep.Phase.RESOLVING:
            break
        rec = ep.apply_probe_report(rec, report)
        assert ep.node_decision(rec, "m-honest") != ep.PUNISH
    assert "m-honest" not in ep.epoch_credibilities(ep.close_epoch(rec))


def test_undecided_at_deadline_changes_nothing_for_that_node():
    plan, _, proposal, scores = setup_epoch()
    out = {**proposal.outcomes, "m-other": ep.MissingOutcome("m-other")}
    rec = record_with(replace(proposal, outcomes=out), plan)
    rec = ep.apply_probe_report(rec, ep.ProbeReport("v1", "m-other", True))
    rec = ep.close_epoch(rec)
    assert rec.phase == ep.Phase.DONE
    assert "m-other" not in ep.epoch_credibilities(rec)


def test_no_result_by_deadline_aborts_and_bad_transactions_raise():
    plan, _, proposal, _ = setup_epoch()
    rec = ep.start_epoch(9, "v0", COMMITTEE, plan)
    assert ep.close_epoch(rec).phase == ep.Phase.ABORTED
    with pytest.raises(ep.EpochError):
        ep.apply_result(rec, replace(proposal, leader="v1"))
    with pytest.raises(ep.EpochError):
        ep.start_epoch(9, "v9", COMMITTEE, plan)
    out = {**proposal.outcomes, "m-other": ep.MissingOutcome("m-other")}
    rec = ep.apply_result(rec, replace(proposal, outcomes=out))
    for bad in (
        ep.ProbeReport("v0", "m-other", False),  # the leader
        ep.ProbeReport("v7", "m-other", False),  # not a member
        ep.ProbeReport("v1", "m-honest", False),  # not reported missing
    ):
        with pytest.raises(ep.EpochError):
            ep.apply_probe_report(rec, bad)
    rec = ep.apply_probe_report(rec, ep.ProbeReport("v1", "m-other", True))
    with pytest.raises(ep.EpochError):
        ep.apply_probe_report(rec, ep.ProbeReport("v1", "m-other", False))  # twice
    with pytest.raises(ep.EpochError):
        ep.apply_result(rec, proposal)


@settings(max_examples=80, deadline=None)
@given(
    f=st.integers(min_value=1, max_value=3),
    data=st.data(),
)
def test_honest_node_never_punished_by_up_to_f_faulty_members(f, data):
    """Leader faulty (drops the honest reply) plus up to f-1 colluding verifiers that report
    failure; honest verifiers' successes arrive in any order, possibly not all before the
    deadline. The honest node never gets credibility 0; with all honest reports in, the
    leader's report is contradicted."""
    n = 3 * f + 1
    committee = [f"v{i}" for i in range(n)]
    leader = committee[0]
    colluders = committee[1 : 1 + data.draw(st.integers(min_value=0, max_value=f - 1))]
    honest = [v for v in committee[1:] if v not in colluders]
    reports = [ep.ProbeReport(v, "m-honest", False) for v in colluders]
    reports += [ep.ProbeReport(v, "m-honest", True) for v in honest]
    order = data.draw(st.permutations(reports))
    delivered = data.draw(st.integers(min_value=0, max_value=len(order)))
    plan = ch.make_plan(1, [ch.Reveal("m-honest", b"\x01" * 32, Q("How do tides work?"))])
    rec = ep.start_epoch(1, leader, committee, plan)
    rec = ep.apply_result(rec, ep.EpochProposal(1, leader, {"m-honest": ep.MissingOutcome("m-honest")}))
    for report in order[:delivered]:
        if rec.phase != ep.Phase.RESOLVING:
            break
        rec = ep.apply_probe_report(rec, report)
    rec = ep.close_epoch(rec)
    assert ep.epoch_credibilities(rec).get("m-honest") is None
    if delivered == len(order):  # the leader's report is contradicted, and the summary says so
        assert rec.phase == ep.Phase.DONE and ep.node_decision(rec, "m-honest") == ep.REACHED
        assert rec.reason == ep.dispute_reason("m-honest")


def test_an_epoch_reason_names_at_most_reasons_listed_disputes():
    """Summaries stay in committed state: a leader disputed on every node of a large probe set
    cannot grow one reason without bound (its disputes counter counts them all)."""
    reason = ""
    for i in range(ep.REASONS_LISTED + 3):
        reason = ep.note_dispute(reason, f"{i:02d}" * 32)
    assert reason.count("disputed:") == ep.REASONS_LISTED
    assert f"{ep.REASONS_LISTED - 1:02d}" * 8 in reason and f"{ep.REASONS_LISTED:02d}" * 8 not in reason
    assert ep.note_dispute("faulty leader: x", "ab" * 32).startswith("faulty leader: x; disputed:")
