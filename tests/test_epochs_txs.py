"""Epoch transactions in the registry app (pure): election, plan, replies, attestations,
missing-reply resolution, faulty leaders, and the reputation update in FinalizeBlock."""

from __future__ import annotations

import pytest

from gentorrent.config import EPOCHS, REPUTATION
from gentorrent.crypto.keys import Identity
from gentorrent import receipts
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.ledger.epoch_txs import Phase
from verifier.epochs import machine
from gentorrent.ledger import epoch_txs, txs
from verifier.abci.app import RegistryApp
from verifier.abci.interface import BlockContext, ValidatorInfo
from gentorrent.ledger.sections import decode_model
from verifier.epochs import reputation as rep
from verifier.epochs import vrf
from verifier.epochs.challenges import commit_request, epoch_probe_seed, select_probe_set
from gentorrent.traffic.model import ChatRequest
from verifier.epochs.probe_format import challenge_request, vrf_public_of, vrf_secret_of
from verifier.epochs.reply_commitments import is_forwarded, private_reply_problem, public_reply, reply_digest
from testkit.leader_faults import FORGED_TOKENS, forged_receipt

MEMBERS = [Identity.from_seed(bytes([200 + i]) * 32) for i in range(4)]
MODELS = [Identity.from_seed(bytes([60 + i]) * 32) for i in range(3)]
T0 = 1_700_000_000_000
MODEL = "smollm2-135m"
CHAIN = "gt-epochs"


class Chain:
    """A RegistryApp driven block by block, with per-signer sequences."""

    def __init__(self, path):
        self.app = RegistryApp(path)
        self.app.init_chain(CHAIN, [ValidatorInfo(m.public_key, 1) for m in MEMBERS], b"", T0)
        self.height = 0
        self.time_ms = T0
        self.seq: dict[bytes, int] = {}

    def next_seq(self, ident: Identity) -> int:
        self.seq[ident.public_key] = self.seq.get(ident.public_key, 0) + 1
        return self.seq[ident.public_key]

    def block(self, block_txs: list[bytes], dt_ms: int = 1000) -> list[int]:
        self.height += 1
        self.time_ms += dt_ms
        ctx = BlockContext(self.height, self.time_ms, MEMBERS[0].public_key, hash=bytes([self.height]) * 32)
        assert self.app.process_proposal(block_txs, ctx)
        res = self.app.finalize_block(block_txs, ctx)
        self.app.commit()
        return [r.code for r in res.tx_results]

    @property
    def section(self) -> pb.EpochsSection:
        return pb.EpochsSection.FromString(self.app.query("/epochs").value)

    def model(self, ident: Identity):
        return decode_model(self.app.query(f"/model/{ident.node_id_hex}").value)

    def lookup(self, node_id: bytes):
        """reply_commitments.NodeLookup over the committed registry."""
        res = self.app.query(f"/model/{node_id.hex()}")
        return decode_model(res.value) if res.code == 0 and res.value else None

    def close(self):
        self.app.close()


@pytest.fixture
def chain(tmp_path):
    c = Chain(tmp_path / "app.db")
    c.block([txs.register_model(m, f"127.0.0.1:{9000 + i}", MODEL, 5, 1, chain_id=CHAIN)
             for i, m in enumerate(MODELS)])
    yield c
    c.close()


def register_keys(chain: Chain) -> None:
    codes = chain.block([epoch_txs.member_keys(m, vrf_public_of(m), bytes([7]) * 32, chain.next_seq(m), chain_id=CHAIN)
                         for m in MEMBERS])
    assert codes == [0, 0, 0, 0]


def elect(chain: Chain) -> Identity:
    sec = chain.section
    epoch, seed = sec.current.epoch, sec.current.seed
    proofs = [epoch_txs.vrf_proof(m, epoch, vrf.prove_leadership(vrf_secret_of(m), "gt-epochs", epoch, seed),
                                  chain.next_seq(m), chain_id=CHAIN) for m in MEMBERS]
    assert chain.block(proofs) == [0, 0, 0, 0]
    sec = chain.section
    assert sec.current.phase == Phase.PLANNING
    members = [(m.public_key.hex(), vrf_public_of(m)) for m in MEMBERS]
    expected = vrf.elect_leader("gt-epochs", epoch, seed, members,
                                {m.public_key.hex(): vrf.prove_leadership(vrf_secret_of(m), "gt-epochs", epoch, seed)
                                 for m in MEMBERS})
    assert sec.current.leader.hex() == expected
    return next(m for m in MEMBERS if m.public_key == sec.current.leader)


def prompts_for(epoch: int) -> dict[bytes, tuple[bytes, str]]:
    return {m.node_id: (bytes([epoch, i]) * 16, f"Question {i} of epoch {epoch}: why is the sky blue?")
            for i, m in enumerate(MODELS)}


def signed_reply(model: Identity, prompt: str, tokens: list[int], name: str = MODEL) -> pb.ProbeReply:
    request = challenge_request(ChatRequest.question(prompt), MODEL)
    receipt = receipts.make_receipt(model, name, request, tokens, T0)
    return pb.ProbeReply(node_id=model.node_id, token_ids=tokens, receipt=receipt)


def run_to_replies(chain: Chain, replies_for=None, models: list[Identity] = MODELS) -> tuple[Identity, int, dict]:
    leader = elect(chain)
    epoch = chain.section.current.epoch
    prompts = {n: p for n, p in prompts_for(epoch).items() if n in {m.node_id for m in models}}
    plan = [(n, commit_request(nonce, ChatRequest.question(p))) for n, (nonce, p) in prompts.items()]
    assert chain.block([epoch_txs.plan(leader, epoch, plan, chain.next_seq(leader), chain_id=CHAIN)]) == [0]
    assert chain.section.current.phase == Phase.PROBING
    items = (replies_for or (lambda p: [signed_reply(m, p[m.node_id][1], [1, 2, 3]) for m in models]))(prompts)
    chain.private = {r.node_id: r for r in items}  # what the leader sends the members privately
    public = [public_reply(r) for r in items]
    assert chain.block([epoch_txs.replies(leader, epoch, public, chain.next_seq(leader), chain_id=CHAIN)]) == [0]
    return leader, epoch, prompts


def private_verdicts(chain: Chain, score: int = 900_000, served: dict[bytes, int] | None = None) -> dict[bytes, tuple]:
    """What an honest member attests after checking the leader's private replies (runner._attest):
    (score, verdict[, server]); `served`: the score of each server's reply (else `score`)."""
    out = {}
    for r in chain.section.current.replies:
        if not r.missing:
            full = chain.private[r.node_id]
            server = full.receipt.node_id
            problem = private_reply_problem(r, full, chain.lookup)
            mine = (served or {}).get(server, score)
            out[r.node_id] = ((0, epoch_txs.VERDICT_LEADER_FAULTY) if problem is not None else
                              (mine, epoch_txs.VERDICT_FORWARDED, server) if is_forwarded(full) else (mine, 0))
    return out


def attest(chain: Chain, members, epoch: int, scores: dict[bytes, tuple]) -> list[int]:
    return chain.block([epoch_txs.attestation(m, epoch, [(n, *v) for n, v in scores.items()],
                                              chain.next_seq(m), chain_id=CHAIN) for m in members])


def test_epochs_open_only_once_a_quorum_registered_keys(chain):
    assert chain.section.epoch == 0
    m0 = MEMBERS[0]
    bad = epoch_txs.member_keys(MODELS[0], bytes(32), bytes([1]) * 32, 5, chain_id=CHAIN)
    assert chain.app.check_tx(bad).code == txs.CODE_UNAUTHORIZED  # a model node is no member
    assert chain.block([epoch_txs.member_keys(m0, vrf_public_of(m0), bytes([7]) * 32, chain.next_seq(m0),
                                              chain_id=CHAIN)]) == [0]
    assert chain.section.epoch == 0
    again = epoch_txs.member_keys(m0, vrf_public_of(m0), bytes([7]) * 32, chain.next_seq(m0), chain_id=CHAIN)
    assert chain.app.check_tx(again).code == txs.CODE_INVALID_FIELD  # keys are for life
    chain.block([epoch_txs.member_keys(m, vrf_public_of(m), bytes([7]) * 32, chain.next_seq(m), chain_id=CHAIN)
                 for m in MEMBERS[1:]])
    sec = chain.section
    assert sec.epoch == 1 and sec.current.phase == Phase.ELECTING and sec.current.seed == bytes([chain.height]) * 32


def test_a_wrong_vrf_proof_or_a_non_leader_plan_is_refused_and_changes_nothing(chain):
    register_keys(chain)
    sec = chain.section
    m = MEMBERS[1]
    wrong = vrf.prove_leadership(vrf_secret_of(m), "gt-epochs", 1, bytes(32))  # over another seed
    before = chain.app.query("/epochs").value
    assert chain.app.check_tx(epoch_txs.vrf_proof(m, 1, wrong, 99, chain_id=CHAIN)).code == txs.CODE_INVALID_FIELD
    assert chain.app.query("/epochs").value == before
    leader = elect(chain)
    other = next(x for x in MEMBERS if x != leader)
    plan = [(MODELS[0].node_id, bytes(32))]
    assert chain.app.check_tx(epoch_txs.plan(other, 1, plan, 1000, chain_id=CHAIN)).code == txs.CODE_UNAUTHORIZED
    assert chain.app.check_tx(epoch_txs.plan(leader, 2, plan, 1000, chain_id=CHAIN)).code == machine.CODE_WRONG_PHASE
    same_prompt = [(m.node_id, bytes(32)) for m in MODELS]  # covers the probe set, one commitment twice
    assert chain.app.check_tx(epoch_txs.plan(leader, 1, same_prompt, 1000, chain_id=CHAIN)).code == \
        txs.CODE_INVALID_FIELD
    assert sec.epoch == chain.section.epoch


def test_the_probe_set_is_fixed_at_the_election_from_committed_state(chain):
    """Every registered model node (there are fewer than max_probed_nodes), stored on chain
    before the leader plans; its seed mixes the block hash with every member's VRF output."""
    register_keys(chain)
    elect(chain)
    cur = chain.section.current
    assert sorted(cur.probe_set) == sorted(m.node_id for m in MODELS)
    outputs = [vrf.proof_to_hash(p.proof) for p in sorted(cur.proofs, key=lambda p: p.public_key)]
    seed = epoch_probe_seed(cur.seed, outputs)
    assert seed != epoch_probe_seed(cur.seed, outputs[:-1])  # the last member's output counts too
    many = [bytes([i]) * 32 for i in range(10)]
    sample = select_probe_set([n.hex() for n in many], seed, 4)
    assert len(sample) == 4 and sample == select_probe_set([n.hex() for n in reversed(many)], seed, 4)


@pytest.mark.parametrize("plan_nodes", ["one_left_out", "none", "a_stranger_instead"])
def test_a_leader_that_leaves_a_node_out_of_its_plan_is_faulty(chain, plan_nodes):
    """The attack: the leader plans 2 of 3 registered nodes (or none, or swaps one for a node
    the probe set does not hold), epoch after epoch, so a cheater is never probed. The old
    rule accepted every such plan and the left-out cheater stayed trusted; now each such plan
    aborts its epoch with the leader faulty, and the left-out node is never silently skipped."""
    register_keys(chain)
    faults: dict[bytes, int] = {}
    for _ in range(6):
        leader = elect(chain)
        epoch = chain.section.current.epoch
        prompts = prompts_for(epoch)
        plan = [(n, commit_request(nonce, ChatRequest.question(p))) for n, (nonce, p) in prompts.items() if n != MODELS[1].node_id]
        if plan_nodes == "none":
            plan = []
        elif plan_nodes == "a_stranger_instead":
            plan.append((bytes([9]) * 32, commit_request(bytes(32), ChatRequest.question("Who are you?"))))
        assert chain.block([epoch_txs.plan(leader, epoch, plan, chain.next_seq(leader), chain_id=CHAIN)]) == [0]
        summary = chain.section.history[-1]
        assert summary.epoch == epoch and summary.phase == Phase.ABORTED and summary.faulty_leader
        assert "does not cover the epoch's probe set" in summary.reason
        faults[leader.public_key] = faults.get(leader.public_key, 0) + 1
        assert {m.public_key: m.faults for m in chain.section.members}[leader.public_key] == faults[leader.public_key]
    assert all(chain.model(m).reputation == 1.0 for m in MODELS)  # no aborted epoch touches anyone


def test_an_honest_epoch_applies_median_scores_and_reputation(chain):
    register_keys(chain)
    leader, epoch, _ = run_to_replies(chain)
    assert chain.section.current.phase == Phase.ATTESTING
    good, bad, mid = (m.node_id for m in MODELS)
    # three attestations reach the quorum; one member is far off on `mid` and gets a mark
    per_member = [{good: (990_000, 0), bad: (100_000, 0), mid: (600_000, 0)},
                  {good: (995_000, 0), bad: (110_000, 0), mid: (610_000, 0)},
                  {good: (985_000, 0), bad: (90_000, 0), mid: (900_000, 0)}]
    for member, scores in zip(MEMBERS[:2], per_member[:2]):
        assert attest(chain, [member], epoch, scores) == [0]
        assert chain.section.current.phase == Phase.ATTESTING
    assert attest(chain, [MEMBERS[2]], epoch, per_member[2]) == [0]
    sec = chain.section
    assert sec.epoch == epoch + 1 and sec.current.phase == Phase.ELECTING
    summary = sec.history[-1]
    assert summary.phase == Phase.DONE and not summary.faulty_leader
    agreed = {s.node_id: s.score_micros for s in summary.result}
    assert agreed == {good: 990_000, bad: 100_000, mid: 610_000}  # medians
    marks = {m.public_key: m.disagreements for m in sec.members}
    assert marks[MEMBERS[2].public_key] == 1 and marks[MEMBERS[0].public_key] == 0
    for ident, cred in zip(MODELS, (0.99, 0.1, 0.61)):
        expected = rep.update(rep.initial_state(REPUTATION), cred, REPUTATION)
        assert chain.model(ident).reputation == pytest.approx(expected.reputation, abs=1e-12)
    # late attestation of a closed epoch: refused
    late = epoch_txs.attestation(MEMBERS[3], epoch, [], 1000, chain_id=CHAIN)
    assert chain.app.check_tx(late).code == machine.CODE_WRONG_PHASE


def test_a_cheater_becomes_untrusted_over_epochs_and_honest_stays_trusted(chain):
    register_keys(chain)
    for _ in range(4):
        _, epoch, _ = run_to_replies(chain)
        scores = {MODELS[0].node_id: (980_000, 0), MODELS[1].node_id: (50_000, 0), MODELS[2].node_id: (900_000, 0)}
        attest(chain, MEMBERS[:3], epoch, scores)
    assert not chain.model(MODELS[1]).trusted and chain.model(MODELS[1]).reputation < REPUTATION.untrusted_below
    assert chain.model(MODELS[0]).trusted and chain.model(MODELS[2]).trusted
    assert len(chain.section.history) == 4


def test_attack_an_untrusted_node_that_leaves_and_registers_again_stays_untrusted(chain):
    """The attack: a model node the committee untrusted deregisters (or lets its lease lapse)
    and registers again under the same key. The registry used to make it a new node, trusted at
    the initial reputation 1.0, at the cost of one transaction. Now the committee's memory of a
    key outlives its registration: the node resumes its reputation, its trust and its probation.
    Nodes in good standing are forgotten when they leave, so the memory holds only the suspect."""
    register_keys(chain)
    cheater, honest = MODELS[1], MODELS[0]
    for _ in range(4):
        _, epoch, _ = run_to_replies(chain)
        attest(chain, MEMBERS[:3], epoch, {m.node_id: (50_000 if m == cheater else 980_000, 0) for m in MODELS})
    before = chain.model(cheater)
    assert not before.trusted
    leave = [txs.deregister_model(m, 2, chain_id=CHAIN) for m in (cheater, honest)]  # registered with 1
    assert chain.block(leave) == [0, 0]
    _, epoch, _ = run_to_replies(chain, models=[MODELS[2]])  # an epoch closes while both are away
    attest(chain, MEMBERS[:3], epoch, {MODELS[2].node_id: (980_000, 0)})
    kept = {w.node_id: w for w in chain.section.windows}
    assert cheater.node_id in kept and kept[cheater.node_id].untrusted and kept[cheater.node_id].offences == 1
    assert honest.node_id not in kept  # in good standing: nothing to remember
    back = [txs.register_model(m, f"127.0.0.1:{9100 + i}", MODEL, 5,
                               3, chain_id=CHAIN) for i, m in enumerate((cheater, honest))]
    assert chain.block(back) == [0, 0]
    again = chain.model(cheater)
    assert not again.trusted and again.reputation == pytest.approx(before.reputation, abs=1e-12)
    assert chain.model(honest).trusted and chain.model(honest).reputation == REPUTATION.initial_reputation
    # its probation still holds: trust returns only after clean epochs, as for a node that stayed
    _, epoch, _ = run_to_replies(chain)
    attest(chain, MEMBERS[:3], epoch, {m.node_id: (990_000, 0) for m in MODELS})
    window = {w.node_id: w for w in chain.section.windows}[cheater.node_id]
    assert (window.epochs, window.clean, window.offences) == (5, 1, 1) and not chain.model(cheater).trusted


def test_the_public_state_holds_no_receipt_and_no_prompt_hash(chain):
    """The attack: the old leader posted each probed node's signed receipt (with the prompt
    hash) and its tokens in committed state, so the node found the exact challenge in its own
    request log. Now a replies tx that carries a receipt or tokens is refused, and nothing of
    the receipt reaches the public state: only its digest."""
    register_keys(chain)
    leader = elect(chain)
    epoch = chain.section.current.epoch
    prompts = prompts_for(epoch)
    plan = [(n, commit_request(nonce, ChatRequest.question(p))) for n, (nonce, p) in prompts.items()]
    assert chain.block([epoch_txs.plan(leader, epoch, plan, chain.next_seq(leader), chain_id=CHAIN)]) == [0]
    full = [signed_reply(m, prompts[m.node_id][1], [1, 2, 3]) for m in MODELS]
    with pytest.raises(txs.TxError, match="no receipt"):
        epoch_txs.replies(leader, epoch, full, chain.next_seq(leader), chain_id=CHAIN)
    public = [public_reply(r) for r in full]
    assert chain.block([epoch_txs.replies(leader, epoch, public, chain.next_seq(leader), chain_id=CHAIN)]) == [0]
    state = chain.app.query("/epochs").value
    assert chain.section.current.phase == Phase.ATTESTING
    for r in full:
        assert r.receipt.prompt_hash not in state and r.receipt.signature not in state
    assert [p.digest for p in chain.section.current.replies] == [reply_digest(r.node_id, r.receipt, [1, 2, 3])
                                                                  for r in sorted(full, key=lambda r: r.node_id)]


def test_an_altered_reply_marks_the_leader_faulty_and_aborts(chain):
    register_keys(chain)

    def altered(prompts):
        items = [signed_reply(m, prompts[m.node_id][1], [1, 2, 3]) for m in MODELS]
        del items[0].token_ids[:]
        items[0].token_ids.extend([4, 5, 6])  # not what the node signed
        return items

    leader, epoch, _ = run_to_replies(chain, altered)
    assert attest(chain, MEMBERS[:3], epoch, private_verdicts(chain)) == [0, 0, 0]
    sec = chain.section
    summary = sec.history[-1]
    assert summary.phase == Phase.ABORTED and summary.faulty_leader and "did not sign" in summary.reason
    assert MODELS[0].node_id.hex()[:16] in summary.reason
    assert {m.public_key: m.faults for m in sec.members}[leader.public_key] == 1
    assert all(chain.model(m).reputation == 1.0 for m in MODELS)  # nobody is touched by an aborted epoch


def test_a_forged_reply_marks_the_leader_faulty_and_aborts(chain):
    """The leader commits to text of its own for a node, with a receipt that covers the
    committed request and that text and names the node, but that the leader signed itself (and
    privately sends a second node's reply other than the one it committed to): the members'
    private checks say "leader faulty" for both, and the abort reason names both."""
    register_keys(chain)
    forged = {}

    def forge_first(prompts):
        items = [signed_reply(m, prompts[m.node_id][1], [1, 2, 3]) for m in MODELS]
        leader = next(m for m in MEMBERS if m.public_key == chain.section.current.leader)
        request = challenge_request(ChatRequest.question(prompts[MODELS[0].node_id][1]), MODEL)
        receipt = forged_receipt(leader, MODELS[0].node_id, request, list(FORGED_TOKENS))
        forged["receipt"] = receipt
        items[0] = pb.ProbeReply(node_id=MODELS[0].node_id, token_ids=list(FORGED_TOKENS), receipt=receipt)
        return items

    leader, epoch, prompts = run_to_replies(chain, forge_first)
    chain.private[MODELS[1].node_id].token_ids[-1] += 1  # the private copy is not the committed one
    # well formed: names the node and covers the committed request and the committed tokens
    receipt = forged["receipt"]
    assert receipt.node_id == MODELS[0].node_id and receipt.model == MODEL
    assert receipt.prompt_hash == receipts.request_prompt_hash(challenge_request(ChatRequest.question(prompts[MODELS[0].node_id][1]), MODEL))
    assert receipt.output_hash == receipts.output_hash(list(FORGED_TOKENS))
    public = {r.node_id: r for r in chain.section.current.replies}
    assert private_reply_problem(public[MODELS[0].node_id], chain.private[MODELS[0].node_id], chain.lookup) == \
        "receipt signature does not verify"
    assert "public commitment" in private_reply_problem(public[MODELS[1].node_id], chain.private[MODELS[1].node_id],
                                                        chain.lookup)
    assert attest(chain, MEMBERS[:3], epoch, private_verdicts(chain)) == [0, 0, 0]
    sec = chain.section
    summary = sec.history[-1]
    assert summary.epoch == epoch and summary.phase == Phase.ABORTED and summary.faulty_leader
    assert "did not sign" in summary.reason
    assert MODELS[0].node_id.hex()[:16] in summary.reason and MODELS[1].node_id.hex()[:16] in summary.reason
    assert {m.public_key: m.faults for m in sec.members}[leader.public_key] == 1
    assert all(chain.model(m).reputation == 1.0 and chain.model(m).trusted for m in MODELS)
    assert not summary.result


def test_one_byzantine_member_cannot_frame_the_leader(chain):
    """One member in four (f = 1) calls a genuine reply "leader faulty": not > N/3, so the
    epoch goes on with the other members' scores."""
    register_keys(chain)
    leader, epoch, _ = run_to_replies(chain)
    honest = private_verdicts(chain)
    lying = {**honest, MODELS[0].node_id: (0, epoch_txs.VERDICT_LEADER_FAULTY)}
    assert attest(chain, MEMBERS[:1], epoch, lying) == [0]
    assert attest(chain, MEMBERS[1:3], epoch, honest) == [0, 0]
    summary = chain.section.history[-1]
    assert summary.phase == Phase.DONE and not summary.faulty_leader


def forwarded_reply(probed: Identity, server: Identity, prompt: str) -> pb.ProbeReply:
    """The probed node forwarded its challenge; `server` answered and signed in its own name."""
    reply = signed_reply(server, prompt, [1, 2, 3])
    reply.node_id = probed.node_id
    return reply


def forwarding(to: dict[int, int]):
    """Replies where MODELS[i]'s challenge was served by MODELS[to[i]] (the rest answer their own)."""
    def replies_for(prompts):
        items = [signed_reply(m, prompts[m.node_id][1], [1, 2, 3]) for m in MODELS]
        for probed, server in to.items():
            items[probed] = forwarded_reply(MODELS[probed], MODELS[server], prompts[MODELS[probed].node_id][1])
        return items
    return replies_for


def test_a_forwarded_challenge_is_scored_for_its_server_and_f_members_cannot_frame_anyone(chain):
    """MODELS[0] forwarded its challenge to MODELS[1], a member of its model group: the reply is
    genuine (the leader is not faulty) and a sample of MODELS[1]'s serving, not of MODELS[0]'s.
    Every honest member attests "forwarded, served by MODELS[1]"; one Byzantine member scoring it
    0 for MODELS[0], or naming MODELS[2] as its server, frames neither."""
    register_keys(chain)

    leader, epoch, _ = run_to_replies(chain, forwarding({0: 1}))
    honest = private_verdicts(chain)
    assert honest[MODELS[0].node_id] == (900_000, epoch_txs.VERDICT_FORWARDED, MODELS[1].node_id)
    assert honest[MODELS[1].node_id] == (900_000, 0)
    framing = {**honest, MODELS[0].node_id: (0, epoch_txs.VERDICT_FORWARDED, MODELS[2].node_id)}
    assert attest(chain, MEMBERS[:1], epoch, framing) == [0]
    assert attest(chain, MEMBERS[1:3], epoch, honest) == [0, 0]
    summary = chain.section.history[-1]
    assert summary.phase == Phase.DONE and not summary.faulty_leader
    assert {s.node_id: s.score_micros for s in summary.result} == {MODELS[1].node_id: 900_000,
                                                                    MODELS[2].node_id: 900_000}
    assert chain.model(MODELS[0]).reputation == 1.0 and chain.model(MODELS[0]).trusted


def test_attack_a_cheater_that_serves_forwarded_challenges_is_scored_on_them(chain):
    """The attack: with rendezvous homes a model group routes a challenge to its prefix's home,
    so a node's own challenge is mostly served by a peer (2 of 3 in a group of 3, seen in 5 of 8
    epochs of one `make demo`) and a cheater went unscored in those epochs, while the challenges
    it served for its peers counted for nobody. Here MODELS[1] (the cheater) has its own challenge
    forwarded to MODELS[0] and serves MODELS[0]'s badly: it is scored on the reply it signed;
    MODELS[0] is scored on the one it served; neither is scored for forwarding."""
    register_keys(chain)

    leader, epoch, _ = run_to_replies(chain, forwarding({0: 1, 1: 0}))
    honest = private_verdicts(chain, served={MODELS[1].node_id: 20_000})
    assert attest(chain, MEMBERS[:3], epoch, honest) == [0, 0, 0]
    summary = chain.section.history[-1]
    assert summary.phase == Phase.DONE and not summary.faulty_leader
    assert {s.node_id: s.score_micros for s in summary.result} == {
        MODELS[0].node_id: 900_000, MODELS[1].node_id: 20_000, MODELS[2].node_id: 900_000}
    assert chain.model(MODELS[1]).reputation < chain.model(MODELS[0]).reputation


def test_a_node_serving_its_own_and_a_forwarded_challenge_gets_the_lower_score(chain):
    register_keys(chain)

    leader, epoch, _ = run_to_replies(chain, forwarding({0: 1}))
    verdicts = private_verdicts(chain)
    verdicts[MODELS[0].node_id] = (100_000, epoch_txs.VERDICT_FORWARDED, MODELS[1].node_id)
    assert attest(chain, MEMBERS[:3], epoch, verdicts) == [0, 0, 0]
    summary = chain.section.history[-1]
    assert {s.node_id: s.score_micros for s in summary.result}[MODELS[1].node_id] == 100_000


@pytest.mark.parametrize("score", [
    (500_000, epoch_txs.VERDICT_FORWARDED, b""),  # no server named
    (500_000, epoch_txs.VERDICT_FORWARDED, b"x" * 31),
    (500_000, epoch_txs.VERDICT_SCORED, bytes(32)),  # a server named on a reply the node served itself
])
def test_a_forwarded_verdict_must_name_its_server_and_only_it_may(chain, score):
    register_keys(chain)
    leader, epoch, _ = run_to_replies(chain)
    verdicts = private_verdicts(chain)
    verdicts[MODELS[0].node_id] = score
    before = chain.app.query("/epochs").value
    with pytest.raises(txs.TxError):
        epoch_txs.attestation(MEMBERS[0], epoch, [(n, *v) for n, v in verdicts.items()], 1, chain_id=CHAIN)
    body = epoch_txs.body(MEMBERS[0], chain.next_seq(MEMBERS[0]), "epoch_attestation", pb.EpochAttestation(
        epoch=epoch, scores=[pb.NodeScore(node_id=n, score_micros=v[0], verdict=v[1], served_by=(v[2:] or [b""])[0])
                             for n, v in sorted(verdicts.items())]), CHAIN)
    assert chain.app.check_tx(epoch_txs.sign(MEMBERS[0], body)).code == txs.CODE_INVALID_FIELD
    assert chain.app.query("/epochs").value == before


@pytest.mark.parametrize("signer", ["unregistered", "other model"])
def test_a_reply_signed_outside_the_model_group_marks_the_leader_faulty(chain, signer):
    """Only a registered node of the probed node's model may answer for it: anything else the
    leader committed to is the leader's fault, exactly as a forged receipt is."""
    outsider = Identity.from_seed(bytes([99]) * 32)
    register_keys(chain)

    def forward_first(prompts):
        if signer == "other model":  # (registered after the election: not in this epoch's probe set)
            assert chain.block([txs.register_model(outsider, "127.0.0.1:9100", "another-model", 5,
                                                   1, chain_id=CHAIN)]) == [0]
        items = [signed_reply(m, prompts[m.node_id][1], [1, 2, 3]) for m in MODELS]
        items[0] = forwarded_reply(MODELS[0], outsider, prompts[MODELS[0].node_id][1])
        return items

    leader, epoch, _ = run_to_replies(chain, forward_first)
    public = next(r for r in chain.section.current.replies if r.node_id == MODELS[0].node_id)
    assert "neither the probed node nor a registered node of its model" in \
        private_reply_problem(public, chain.private[MODELS[0].node_id], chain.lookup)
    assert attest(chain, MEMBERS[:3], epoch, private_verdicts(chain)) == [0, 0, 0]
    summary = chain.section.history[-1]
    assert summary.phase == Phase.ABORTED and summary.faulty_leader


def test_a_reply_to_another_prompt_is_caught_by_the_attestors(chain):
    register_keys(chain)
    leader, epoch, _ = run_to_replies(chain)
    ids = [m.node_id for m in MODELS]
    mismatch = {ids[0]: (0, epoch_txs.VERDICT_PROMPT_MISMATCH), ids[1]: (900_000, 0), ids[2]: (900_000, 0)}
    attest(chain, MEMBERS[:3], epoch, mismatch)
    summary = chain.section.history[-1]
    assert summary.phase == Phase.ABORTED and summary.faulty_leader and "committed" in summary.reason


def _first_missing(prompts):
    """The leader's replies with the first model node reported missing."""
    items = [signed_reply(m, prompts[m.node_id][1], [1, 2, 3]) for m in MODELS]
    items[0] = pb.ProbeReply(node_id=MODELS[0].node_id, missing=True, reason="no reply")
    return items


def test_attack_a_node_that_answers_everyone_but_the_leader_cannot_void_the_epoch(chain):
    """The probing phase is public, and the members probe a node reported missing only after it:
    a node that stalls during the phase and answers at once after it is missing for the leader
    and reached by every other member. When that aborted the epoch (leader "faulty"), one such
    node voided every epoch and every other node's score: here the cheater scored 0 would have
    stayed at 1.0. Now only the stalling node goes unscored, and the leader's dispute shows
    (the same ending as a leader that drops the node's reply: the committee cannot tell them
    apart)."""
    register_keys(chain)

    leader, epoch, _ = run_to_replies(chain, _first_missing)
    others = [m for m in MEMBERS if m != leader]
    stalling, cheater = MODELS[0].node_id, MODELS[1].node_id
    report = epoch_txs.probe_report(leader, epoch, stalling, False, chain.next_seq(leader), chain_id=CHAIN)
    assert chain.app.check_tx(report).code == txs.CODE_UNAUTHORIZED  # the leader cannot probe too
    attest(chain, MEMBERS[:3], epoch, {cheater: (0, 0), MODELS[2].node_id: (900_000, 0)})
    assert chain.section.current.phase == Phase.RESOLVING
    for i, m in enumerate(others):
        chain.block([epoch_txs.probe_report(m, epoch, stalling, True, chain.next_seq(m), chain_id=CHAIN)])
        if i < 2:
            assert chain.section.current.epoch == epoch
    summary = chain.section.history[-1]
    assert summary.epoch == epoch and summary.phase == Phase.DONE and not summary.faulty_leader
    assert "disputed" in summary.reason and stalling.hex()[:16] in summary.reason
    assert {s.node_id: s.score_micros for s in summary.result} == {cheater: 0, MODELS[2].node_id: 900_000}
    assert chain.model(MODELS[0]).reputation == 1.0  # unscored, not punished
    assert chain.model(MODELS[1]).reputation == pytest.approx(REPUTATION.alpha * 1.0)  # judged all the same
    members = {m.public_key: m for m in chain.section.members}
    assert members[leader.public_key].disputes == 1 and members[leader.public_key].faults == 0
    assert sum(m.disputes for m in members.values()) == 1


def test_a_dispute_settled_while_attesting_stays_named_when_the_epoch_aborts(chain):
    """The members' probe reports can settle a dispute before the attestations are in; when the
    epoch then aborts for another reason (here no attestation quorum in time), the abort used to
    overwrite the reason, and the leader's disputes counter counted a dispute no summary named."""
    register_keys(chain)
    leader, epoch, _ = run_to_replies(chain, _first_missing)
    disputed = MODELS[0].node_id
    for m in (m for m in MEMBERS if m != leader):
        chain.block([epoch_txs.probe_report(m, epoch, disputed, True, chain.next_seq(m), chain_id=CHAIN)])
    assert chain.section.current.phase == Phase.ATTESTING and "disputed" in chain.section.current.reason
    chain.block([], dt_ms=EPOCHS.attest_timeout_ms)
    summary = chain.section.history[-1]
    assert summary.epoch == epoch and summary.phase == Phase.ABORTED and not summary.faulty_leader
    assert summary.reason.startswith("no attestation quorum in time"), summary.reason
    assert f"disputed: the leader reported {disputed.hex()[:16]} missing" in summary.reason, summary.reason
    assert {m.public_key: m.disputes for m in chain.section.members}[leader.public_key] == 1


def test_a_node_that_fails_other_members_probes_is_punished(chain):
    register_keys(chain)
    leader, epoch, _ = run_to_replies(chain, _first_missing)
    others = [m for m in MEMBERS if m != leader]
    attest(chain, MEMBERS[:3], epoch, {MODELS[1].node_id: (900_000, 0), MODELS[2].node_id: (900_000, 0)})
    for m in others[:2]:
        chain.block([epoch_txs.probe_report(m, epoch, MODELS[0].node_id, False, chain.next_seq(m), chain_id=CHAIN)])
        if m is others[0]:  # one other member's failure is not enough (the leader's report does not count)
            assert chain.section.current.epoch == epoch and chain.section.current.phase == Phase.RESOLVING
    summary = chain.section.history[-1]  # 2 of the 3 others failed: 2 * 3 > 3 -> punished, epoch done
    assert summary.epoch == epoch and summary.phase == Phase.DONE and not summary.faulty_leader
    assert {s.node_id: s.score_micros for s in summary.result}[MODELS[0].node_id] == 0
    assert chain.model(MODELS[0]).reputation == pytest.approx(REPUTATION.alpha * 1.0)


def test_deadlines_abort_a_silent_leader_and_elect_again(chain):
    register_keys(chain)
    leader = elect(chain)
    chain.block([], dt_ms=EPOCHS.plan_timeout_ms)
    sec = chain.section
    assert sec.history[-1].phase == Phase.ABORTED and sec.history[-1].faulty_leader
    assert sec.current.epoch == 2 and sec.current.phase == Phase.ELECTING
    chain.block([], dt_ms=EPOCHS.election_timeout_ms)  # nobody sends proofs: fallback ranking
    assert chain.section.current.phase == Phase.PLANNING and chain.section.current.leader
    assert {m.public_key: m.faults for m in sec.members}[leader.public_key] == 1


def test_epoch_state_is_identical_after_restart(chain, tmp_path):
    register_keys(chain)
    run_to_replies(chain)
    value, info = chain.app.query("/epochs").value, chain.app.info()
    chain.app.close()
    chain.app = RegistryApp(tmp_path / "app.db")
    assert chain.app.query("/epochs").value == value and chain.app.info() == info
