"""The epoch driver inside a verifier process (the async shell of ARCHITECTURE.md §3.5).

It watches the committed epochs section (verifier.epochs.machine) and does this member's part
of each phase, once, by submitting signed epoch transactions to its own node:

    no keys yet    register the VRF and X25519 keys (epoch_member_keys)
    electing       post this member's ECVRF proof for the epoch
    planning       (leader) one request per model node: a user's donated audited ask where its
                   audit desk holds one the node may get (verifier/epochs/donations.py), else a
                   draw from the traffic model (real user conversations, shaped and sampled as
                   clients send them); rewritten either way. Send the plain requests privately
                   to every other member (Private RPC), then commit to them (epoch_plan)
    probing        (leader) ask every node its question through the anonymous overlay as an
                   ordinary user node, send the signed replies privately to every other member
                   and post only their digests (or missing reports)
    attesting      first, when this member runs an audit desk, post the audit score per node
                   of the users' audits it scored since its last report (epoch_audit_report);
                   then check the leader's private copy of every reply against its public digest
                   and the signer's key (the node, or the group member it forwarded the
                   challenge to: such a reply is attested "forwarded" and scored for that
                   member, never for the probed node), re-score it
                   with this member's reference model (with the request's own sampling
                   parameters) after checking that the signed receipt covers the committed
                   request (epoch_attestation)
    attesting /    (not the leader) probe each node the leader reported missing with a prompt of
    resolving      this member's own, and report whether a valid signed reply came (epoch_probe_report)

The challenge pool (gentorrent.traffic) is loaded once per process, off the event loop.

Everything it decides on comes from committed state, so a restarted runner simply picks up where
the chain is. Transactions it may have sent twice are refused by the app and ignored here.
How this member leads is one hook, `LeaderConduct` (honest here); the tests of faulty-leader
detection plug a misbehaving one in (testkit/leader_faults.py), which no product code can reach.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import secrets
import threading
from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol

from gentorrent.config import EPOCH_RUN, EpochRunParams
from gentorrent.crypto.keys import Identity
from gentorrent.traffic.corpus import load_corpus
from gentorrent.traffic.model import ChatRequest, TrafficPool
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.ledger import epoch_txs
from gentorrent.ledger.chain_params import ChainParams
from gentorrent.ledger.epoch_txs import SCORE_SCALE, Phase
from verifier.epochs import machine
from gentorrent.ledger.sections import LOCAL_MODELS, decode_models
from verifier.epochs import vrf
from verifier.epochs.challenges import (NONCE_BYTES, ChallengeError, Reveal, commit_request, donated_challenge,
                                        draw_challenge, prompt_key, select_probe_set, verify_reveal)
from verifier.epochs.private import PrivateError, RevealBundle, open_private, seal_replies, seal_reveals
from verifier.epochs.reply_commitments import (is_forwarded, node_lookup, private_reply_problem, public_reply,
                                               signature_problem)
from verifier.epochs.probe_format import challenge_request, receipt_matches_request, vrf_public_of, vrf_secret_of
from verifier.epochs.repeats import CommitteeMemory
from verifier.epochs.scoring import SamplingSpec, ScoringError, score_reply

log = logging.getLogger(__name__)

__all__ = ["EpochRunner", "LeaderConduct", "Prober", "Reference", "ProbeAnswer", "ProbeFailed"]


class ProbeFailed(RuntimeError):
    """No valid signed reply from the node (timeout, bad signature, refused)."""


@dataclass(frozen=True)
class ProbeAnswer:
    token_ids: list[int]
    receipt: pb.ReplyReceipt


class Prober(Protocol):
    async def ask(self, request: pb.GenerateRequest, node_id_hex: str) -> ProbeAnswer: ...


class Reference(Protocol):
    """The member's reference model (verifier.epochs.reference.RemoteReference): `served_by` is
    the registered record of the node whose reply it scores."""

    async def score(self, request: pb.GenerateRequest, token_ids: list[int], served_by=None): ...


_POOL_LOCK = threading.Lock()


def challenge_pool() -> TrafficPool:
    """The corpus's challenge pool, indexed (seconds: once per process, shared by its runners,
    which may ask for it from several threads at once)."""
    with _POOL_LOCK:
        return _load_pool()


@functools.lru_cache(maxsize=1)
def _load_pool() -> TrafficPool:
    return TrafficPool.build(load_corpus().challenge)


class LeaderConduct:
    """How this member leads an epoch: honestly. The one seam a test double of a faulty leader
    plugs into (testkit/leader_faults.py); the product only ever runs this one."""

    def plans(self, node_id_hex: str) -> bool:
        """Whether the plan gives this probed node a challenge (an honest leader: every one)."""
        return True

    async def challenge(self, node_id_hex: str, request: pb.GenerateRequest, leader: Identity,
                        ask: Callable[[], Awaitable[pb.ProbeReply]]) -> pb.ProbeReply:
        """The reply this leader reports for `request`; `ask` challenges the node honestly."""
        return await ask()


@dataclass
class RunnerHost:
    """What the runner needs from its verifier node (VerifierNode.epoch_host() builds one)."""

    identity: Identity
    box_private: object  # X25519PrivateKey
    box_public: bytes
    chain_id: str
    members: set[bytes]
    query: Callable[[str], tuple[int, bytes]]  # committed-state query: (code, value)
    submit: Callable[[bytes], Awaitable[tuple[int, str]]]
    send_private: Callable[[bytes, bytes], Awaitable[bool]]  # (member public key, payload)
    params: ChainParams  # the chain's: its deadlines and probe-set size (committed state, /params)



def _claim(taken: set[str], questions: dict[str, ChatRequest], node: str, request: ChatRequest) -> bool:
    """Give `node` this question unless another node's has the same text; True if given."""
    key = prompt_key(request.text)
    if key in taken:
        return False
    taken.add(key)
    questions[node] = request
    return True


class EpochRunner:
    def __init__(self, host: RunnerHost, reference: Reference, prober: Prober | None,
                 params: EpochRunParams = EPOCH_RUN, conduct: LeaderConduct | None = None,
                 pool: TrafficPool | None = None) -> None:
        params.fits(host.params.epochs)  # a challenge sent last must be answered before the chain's deadline
        self.host, self.reference, self.prober, self.params = host, reference, prober, params
        self.pool = pool  # None: the corpus's challenge pool, loaded on first use
        self.conduct = conduct or LeaderConduct()
        self.me = host.identity.public_key
        self._seq = 0
        self._done: set[tuple] = set()  # (epoch, action[, node]) this runner has completed
        self._busy: dict[tuple, asyncio.Task] = {}
        self._reveals: dict[int, dict[str, Reveal]] = {}  # epoch -> node id hex -> reveal
        self._replies: dict[int, dict[str, pb.ProbeReply]] = {}  # epoch -> node id hex -> full reply (private)
        self._prepared: dict[int, tuple[bytes, dict[str, ChatRequest]]] = {}  # epoch -> (seed, node -> request)
        self.outputs = CommitteeMemory()  # outputs of attested replies, per node (repeats.py)
        self._task: asyncio.Task | None = None
        self.log: list[str] = []  # what it did, for status and tests
        self.on_stop: list[Callable[[], Awaitable[None]]] = []  # closes what was started for it
        self.audits = None  # this member's audit desk (verifier.epochs.audit_service), when it runs one
        self._audit_reports: dict[int, asyncio.Task] = {}  # epoch -> this member's one try at its audit report

    # ------------------------------------------------------------------ life

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        tasks = [t for t in [self._task, *self._busy.values()] if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for close in self.on_stop:
            try:
                await close()
            except Exception:  # noqa: BLE001 - stopping must go on
                log.exception("epochs: closing failed")

    def status(self) -> dict:
        return {"recent": self.log[-20:], "busy": sorted(str(k) for k in self._busy)}

    def _note(self, text: str) -> None:
        log.info("epochs: %s", text)
        self.log.append(text)

    async def _loop(self) -> None:
        while True:
            try:
                self._step()
            except Exception:  # noqa: BLE001 - keep driving epochs; the chain is the source of truth
                log.exception("epoch runner step failed")
            await asyncio.sleep(self.params.poll_s)

    # ------------------------------------------------------------------ private reveals

    def on_private(self, payload: bytes) -> pb.Ack:
        try:
            bundle = open_private(payload, self.host.box_private, self.host.box_public, self.host.members)
        except PrivateError as exc:
            return pb.Ack(ok=False, reason=str(exc)[:120])
        sec = self._section()
        if sec.current.leader and bundle.sender != sec.current.leader:
            return pb.Ack(ok=False, reason="a private message from a member that does not lead this epoch")
        if isinstance(bundle, RevealBundle):
            self._reveals.setdefault(bundle.epoch, {}).update({r.node_id: r for r in bundle.reveals})
        else:
            self._replies.setdefault(bundle.epoch, {}).update({r.node_id.hex(): r for r in bundle.replies})
        return pb.Ack(ok=True)

    # ------------------------------------------------------------------ one look at the chain

    def _section(self) -> pb.EpochsSection:
        code, value = self.host.query("/epochs")
        return pb.EpochsSection.FromString(value) if code == 0 else pb.EpochsSection()

    def _spawn(self, key: tuple, coro) -> None:
        if key in self._done or key in self._busy:
            coro.close()
            return
        task = asyncio.ensure_future(coro)
        self._busy[key] = task

        def finished(t: asyncio.Task) -> None:
            self._busy.pop(key, None)
            if not t.cancelled() and t.exception() is None and t.result():
                self._done.add(key)
            elif not t.cancelled() and t.exception() is not None:
                log.warning("epochs: %s failed: %r", key, t.exception())

        task.add_done_callback(finished)

    def _step(self) -> None:
        sec = self._section()
        if not any(m.public_key == self.me for m in sec.members):
            self._spawn((0, "keys"), self._register_keys())
            return
        cur = sec.current
        if sec.epoch == 0:
            return
        e, phase, leader = cur.epoch, cur.phase, cur.leader == self.me
        for kept in (self._reveals, self._replies):
            for old in [k for k in kept if k < e - 2]:
                del kept[old]
        for old in [k for k in self._prepared if k < e]:
            del self._prepared[old]
        self._audit_reports = {k: t for k, t in self._audit_reports.items() if k >= e - 1}
        if phase == Phase.ELECTING:
            # every member writes its questions while the election runs: whoever leads plans at once
            self._spawn((e, "prepare"), self._prepare(e))
        if phase == Phase.ELECTING and not any(p.public_key == self.me for p in cur.proofs):
            self._spawn((e, "proof"), self._prove(e, cur.seed))
        elif phase == Phase.PLANNING and leader:
            self._spawn((e, "lead"), self._lead(e))
        elif phase == Phase.ATTESTING and not any(a.public_key == self.me for a in cur.attestations):
            self._spawn((e, "attest"), self._report_and_attest(e, cur))
        if phase in (Phase.PROBING, Phase.ATTESTING, Phase.RESOLVING) and self.audits is not None:
            # as early as the chain takes it: an epoch with no reply to attest (every challenged
            # node missing, a leader's report or an outage) skips attesting, and one whose
            # missing nodes two members' probes settle may close before a slower member attests
            self._spawn((e, "audits"), self._report_once(e))
        if phase in (Phase.ATTESTING, Phase.RESOLVING) and not leader:
            for r in cur.replies:
                reported = any(p.node_id == r.node_id and p.public_key == self.me for p in cur.probes)
                if r.missing and not reported:
                    self._spawn((e, "probe", r.node_id), self._probe_missing(e, r.node_id))

    # ------------------------------------------------------------------ transactions

    async def _submit(self, build: Callable[[int, str], bytes], what: str) -> bool:
        """Sign with the next sequence for this chain and submit; True when there is nothing
        left to do (taken, or refused because the chain moved on)."""
        return await self._send(build, what) in (0, machine.CODE_WRONG_PHASE)

    async def _send(self, build: Callable[[int, str], bytes], what: str) -> int:
        """Sign with the next sequence for this chain and submit; the chain's code, noted."""
        code, value = self.host.query(f"/account/{self.me.hex()}")
        last = json.loads(value or b"{}").get("last_sequence", 0) if code == 0 else 0
        self._seq = max(self._seq, last) + 1
        code, text = await self.host.submit(build(self._seq, self.host.chain_id))
        self._note(f"{what}: refused ({code}: {text})" if code != 0 else f"{what}: submitted")
        return code

    async def _register_keys(self) -> bool:
        ident = self.host.identity
        return await self._submit(lambda s, c: epoch_txs.member_keys(ident, vrf_public_of(ident), self.host.box_public,
                                                                     s, chain_id=c),
                                  "epoch keys")

    async def _prove(self, epoch: int, seed: bytes) -> bool:
        if epoch > 1:  # pacing between epochs (the first one starts at once)
            await asyncio.sleep(self.params.epoch_pause_s)
        ident = self.host.identity
        proof = vrf.prove_leadership(vrf_secret_of(ident), self.host.chain_id, epoch, seed)
        return await self._submit(lambda s, c: epoch_txs.vrf_proof(ident, epoch, proof, s, chain_id=c),
                                  f"epoch {epoch} VRF proof")

    # ------------------------------------------------------------------ leading

    def _models(self) -> dict[str, pb.ModelEntry]:
        code, value = self.host.query(LOCAL_MODELS)
        if code != 0:
            return {}
        return {m.node_id.hex(): m for m in decode_models(value)}

    async def _questions(self, seed: bytes, node_ids: list[str],
                         taken: set[str] | None = None) -> dict[str, ChatRequest]:
        """One challenge per node, no two with the same text (a collision is redrawn)."""
        if not node_ids:
            return {}
        if self.pool is None:
            self.pool = await asyncio.to_thread(challenge_pool)
        taken = set() if taken is None else taken
        out: dict[str, ChatRequest] = {}
        for node_id in node_ids:
            for attempt in range(self.params.question_attempts):
                try:
                    request = draw_challenge(self.pool, seed, node_id, attempt, self.params.challenge_temperature,
                                             self.params.challenge_max_tokens)
                except ChallengeError:
                    continue
                if _claim(taken, out, node_id, request):
                    break
        return out

    def _donated(self, epoch: int, seed: bytes, questions: dict[str, ChatRequest]) -> dict[str, ChatRequest]:
        """Each node's challenge made of a user's donated audited ask where this member's desk
        holds one it may use (verifier/epochs/donations.py), else the corpus draw. Only the leader
        takes them (every member prepares corpus draws; a donation is used once)."""
        if self.audits is None or not len(self.audits.donations):
            return questions
        models = self._models()
        out = dict(questions)
        taken = {prompt_key(q.text) for q in out.values()}
        for node in sorted(out):
            entry = models.get(node)
            pick = int.from_bytes(hashlib.sha256(b"gentorrent/donation-pick" + seed + node.encode()).digest()[:8],
                                  "big")
            donation = None if entry is None else self.audits.donations.take(bytes.fromhex(node), entry.model, pick)
            if donation is None:
                continue
            try:
                request = donated_challenge(donation.request, seed, node, 0, self.params.challenge_temperature,
                                            self.params.challenge_max_tokens)
            except ChallengeError:
                continue
            _claim(taken, out, node, request)
        used = sum(1 for n in out if out[n] is not questions.get(n))
        self._note(f"epoch {epoch}: {used} of {len(out)} challenges made of users' donated asks")
        return out

    async def _prepare(self, epoch: int) -> bool:
        seed = secrets.token_bytes(32)  # private: nobody can predict topics or the probe set
        chosen = select_probe_set(self._models(), seed, self.host.params.epochs.max_probed_nodes)
        self._prepared[epoch] = (seed, await self._questions(seed, chosen))
        return True

    async def _lead(self, epoch: int) -> bool:
        models = self._models()
        task = self._busy.get((epoch, "prepare"))
        if task is not None:
            await asyncio.wait({task})
        seed, questions = self._prepared.get(epoch) or (secrets.token_bytes(32), {})
        cur = self._section().current
        if cur.epoch != epoch:
            return True
        chosen = sorted(n.hex() for n in cur.probe_set)  # fixed by the chain: the plan must cover it all
        questions = {n: q for n, q in questions.items() if n in chosen}
        for round_ in range(self.params.question_rounds):  # a node left without a challenge makes us faulty
            missing = [n for n in chosen if n not in questions]
            if not missing:
                break
            taken = {prompt_key(q.text) for q in questions.values()}
            questions.update(await self._questions(seed + b"late" + bytes([round_]), missing, taken))
        questions = self._donated(epoch, seed, questions)
        reveals = [Reveal(n, secrets.token_bytes(NONCE_BYTES), questions[n])
                   for n in chosen if n in questions and self.conduct.plans(n)]
        self._reveals[epoch] = {r.node_id: r for r in reveals}
        await self._send_private(epoch, "reveals", lambda key: seal_reveals(self.host.identity, key, epoch, reveals))
        entries = [(bytes.fromhex(r.node_id), commit_request(r.nonce, r.request)) for r in reveals]
        ident = self.host.identity
        if not await self._submit(lambda s, c: epoch_txs.plan(ident, epoch, entries, s, chain_id=c),
                                  f"epoch {epoch} plan"):
            return False
        if not await self._wait_phase(epoch, Phase.PROBING):
            return True  # the plan did not commit in time (or was refused): the epoch is lost
        self._note(f"epoch {epoch}: leading, probing {len(reveals)} model nodes")
        items = await asyncio.gather(*(self._challenge(epoch, r, models.get(r.node_id)) for r in reveals))
        self._replies[epoch] = {r.node_id.hex(): r for r in items}
        await self._send_private(epoch, "replies", lambda key: seal_replies(ident, key, epoch, list(items)))
        public = [public_reply(r) for r in items]  # the chain never sees a receipt or a prompt hash
        return await self._submit(lambda s, c: epoch_txs.replies(ident, epoch, public, s, chain_id=c),
                                  f"epoch {epoch} replies")

    async def _wait_phase(self, epoch: int, phase: str, timeout_s: float = 120.0) -> bool:
        for _ in range(int(timeout_s / self.params.poll_s)):
            cur = self._section().current
            if cur.epoch != epoch:
                return False
            if cur.phase == phase:
                return True
            await asyncio.sleep(self.params.poll_s)
        return False

    async def _send_private(self, epoch: int, what: str, seal: Callable[[bytes], bytes]) -> None:
        """Seal (to each other member's registered box key) and send; `seal` builds the payload."""
        keys = machine.member_keys_of(self._section())
        for member in sorted(self.host.members - {self.me}):
            entry = keys.get(member)
            if entry is None:
                continue
            if not await self.host.send_private(member, seal(entry.box_public_key)):
                self._note(f"epoch {epoch}: {what} not delivered to {member.hex()[:12]}")

    async def _challenge(self, epoch: int, reveal: Reveal, entry: pb.ModelEntry | None) -> pb.ProbeReply:
        node = bytes.fromhex(reveal.node_id)
        if entry is None:  # deregistered since the election
            return pb.ProbeReply(node_id=node, missing=True, reason="no reply")
        request = challenge_request(reveal.request, entry.model)

        async def ask() -> pb.ProbeReply:
            try:
                answer = await self._ask(request, reveal.node_id)
            except ProbeFailed as exc:
                self._note(f"epoch {epoch}: challenge of {reveal.node_id[:12]} failed: {exc}")
                return pb.ProbeReply(node_id=node, missing=True, reason=str(exc)[:200])
            tokens = list(answer.token_ids)[: self.params.max_reply_tokens]
            return pb.ProbeReply(node_id=node, token_ids=tokens, receipt=answer.receipt)

        return await self.conduct.challenge(reveal.node_id, request, self.host.identity, ask)

    async def _ask(self, request: pb.GenerateRequest, node_id: str) -> ProbeAnswer:
        if self.prober is None:
            raise ProbeFailed("this member has no overlay prober")
        # independent of every other challenge, unpredictable (OS CSPRNG), anywhere in the
        # probing window: see EpochRunParams.challenge_spread_s
        await asyncio.sleep(secrets.SystemRandom().uniform(0.0, self.params.spread_s(self.host.params.epochs)))
        try:
            answer = await asyncio.wait_for(self.prober.ask(request, node_id), self.params.probe_timeout_s)
        except asyncio.TimeoutError:
            raise ProbeFailed("no reply in time") from None
        if len(answer.token_ids) > self.params.max_reply_tokens:
            raise ProbeFailed("reply longer than a challenge allows")
        if answer.receipt.model != request.model:
            raise ProbeFailed(f"reply signed for model {answer.receipt.model!r}, asked {request.model!r}")
        problem = signature_problem(answer.receipt, answer.token_ids, bytes.fromhex(node_id),
                                    node_lookup(self._models()))
        if problem is not None:
            raise ProbeFailed(problem)
        if not receipt_matches_request(answer.receipt, request):  # else the members find the mismatch
            # and blame the leader that posted it: a node could have every leader that probes it blamed
            raise ProbeFailed("the signed receipt is for another prompt or other sampling parameters")
        return answer

    # ------------------------------------------------------------------ attesting

    async def _report_and_attest(self, epoch: int, cur: pb.EpochStateEntry) -> bool:
        """The audit report goes first: the attestation that completes the quorum settles the
        epoch, and a report after that would be too late."""
        await self._report_once(epoch)
        return await self._attest(epoch, cur)

    async def _report_once(self, epoch: int) -> bool:
        """This member's audit report of `epoch`, one try per epoch (a refused one stays
        pending for the next epoch's: `_report_audits`), which its attestation and its probe
        reports wait for: the transactions that can decide the epoch never pass it."""
        if self.audits is None:
            return True
        task = self._audit_reports.get(epoch)
        if task is None:
            task = self._audit_reports[epoch] = asyncio.ensure_future(self._report_audits(epoch))
        try:
            await task
        except Exception as exc:  # noqa: BLE001 - a failed report must not hold the attestation
            self._note(f"epoch {epoch} audit report failed: {exc!r}")
        return True

    async def _report_audits(self, epoch: int) -> bool:
        """Post the scores of the users' audits this member received (nothing if none); a report
        the chain refused stays pending for the next epoch's."""
        await self.audits.score_queued()
        draft = self.audits.pending_report()
        if not draft.scores:
            return True
        ident = self.host.identity
        listed = ", ".join(f"{node.hex()[:12]} {micros / SCORE_SCALE:.3f}" for node, micros in draft.scores)
        code = await self._send(lambda s, c: epoch_txs.audit_report(ident, epoch, draft.scores, draft.digest, s,
                                                                     chain_id=c),
                                f"epoch {epoch} audit report ({len(draft.scores)} nodes: {listed})")
        if code == 0:
            self.audits.reported(draft)
        return code in (0, machine.CODE_WRONG_PHASE)

    async def _attest(self, epoch: int, cur: pb.EpochStateEntry) -> bool:
        reveals, private = await self._await_private(epoch, cur)
        models = self._models()
        commitments = {e.node_id.hex(): e.commitment for e in cur.plan}
        scores = []
        for r in (x for x in cur.replies if not x.missing):
            node = r.node_id.hex()
            reveal, entry, full = reveals.get(node), models.get(node), private.get(node)
            if reveal is None or entry is None or full is None:
                scores.append((r.node_id, 0, epoch_txs.VERDICT_UNSCORABLE))
                continue
            problem = private_reply_problem(r, full, node_lookup(models))
            if problem is not None:
                self._note(f"epoch {epoch}: the leader's reply of {node[:12]}: {problem}")
                scores.append((r.node_id, 0, epoch_txs.VERDICT_LEADER_FAULTY))
                continue
            request = challenge_request(reveal.request, entry.model)
            if not verify_reveal(commitments.get(node, b""), reveal.nonce, reveal.request) or \
                    not receipt_matches_request(full.receipt, request):
                scores.append((r.node_id, 0, epoch_txs.VERDICT_PROMPT_MISMATCH))
                continue
            server = full.receipt.node_id.hex()
            forwarded = is_forwarded(full)
            sampling = SamplingSpec(reveal.request.temperature, reveal.request.top_p)
            try:
                token_scores = await self.reference.score(request, list(full.token_ids), models.get(server, entry))
                report = score_reply(token_scores, sampling)
            except (ScoringError, RuntimeError) as exc:
                self._note(f"epoch {epoch}: cannot score {server[:12]}: {exc}")
                scores.append((r.node_id, 0, epoch_txs.VERDICT_UNSCORABLE))
                continue
            cred = self.outputs.judge(server, full.receipt.prompt_hash, full.receipt.output_hash, sampling.temperature,
                                      report)
            # a forwarded reply is the server's sample, not the probed node's (machine._agree)
            scores.append(epoch_txs.Verdict(r.node_id, epoch_txs.to_micros(cred),
                                            epoch_txs.VERDICT_FORWARDED if forwarded else epoch_txs.VERDICT_SCORED,
                                            full.receipt.node_id if forwarded else b""))
            replayed = " (output replayed from another prompt)" if cred != report.credibility else ""
            via = f" (serving {node[:12]}'s challenge, forwarded to it)" if forwarded else ""
            self._note(f"epoch {epoch}: {server[:12]} credibility {cred:.3f}{replayed}{via} "
                       f"(1/ppl {report.inv_ppl:.3f}, log p <= {report.log_prob_bound:.0f}, "
                       f"z {dict((k, round(v, 1)) for k, v in report.z.items())})")
        ident = self.host.identity
        return await self._submit(lambda s, c: epoch_txs.attestation(ident, epoch, scores, s, chain_id=c),
                                  f"epoch {epoch} attestation")

    async def _await_private(self, epoch: int, cur: pb.EpochStateEntry,
                             wait_s: float = 30.0) -> tuple[dict[str, Reveal], dict[str, pb.ProbeReply]]:
        """The leader sends reveals before its plan commits and replies before its replies tx
        commits; allow the RPCs a moment to land."""
        wanted = {e.node_id.hex() for e in cur.plan}
        answered = {r.node_id.hex() for r in cur.replies if not r.missing}
        for _ in range(int(wait_s / 0.25)):
            if wanted <= set(self._reveals.get(epoch, {})) and answered <= set(self._replies.get(epoch, {})):
                break
            await asyncio.sleep(0.25)
        return dict(self._reveals.get(epoch, {})), dict(self._replies.get(epoch, {}))

    # ------------------------------------------------------------------ missing replies

    async def _probe_missing(self, epoch: int, node_id: bytes) -> bool:
        node = node_id.hex()
        if self.prober is None:
            return True  # a member that cannot probe casts no vote on a missing reply
        entry = self._models().get(node)
        ok = False
        if entry is not None:
            question = (await self._questions(secrets.token_bytes(32), [node])).get(node)
            if question is not None:
                try:
                    await self._ask(challenge_request(question, entry.model), node)  # checks the signer
                    ok = True
                except ProbeFailed as exc:
                    self._note(f"epoch {epoch}: own probe of {node[:12]} failed: {exc}")
        ident = self.host.identity
        await self._report_once(epoch)
        return await self._submit(lambda s, c: epoch_txs.probe_report(ident, epoch, node_id, ok, s, chain_id=c),
                                  f"epoch {epoch} probe report on {node[:12]}: {'ok' if ok else 'failed'}")
