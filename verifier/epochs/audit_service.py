"""The audit desk's shell on a committee member: takes submissions as they arrive, scores the
each node's sample with the member's reference model, keeps each epoch's audit credibilities.

It holds the clock, the registry view and the reference model; every decision is the pure
desk's (verifier/epochs/audits.py). Receipt freshness is judged by this member's clock: a
receipt is fresh from two epoch spans ago (the current and the previous epoch) to now plus
the allowed skew.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol, Sequence

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from gentorrent import audits, receipts
from gentorrent.config import AUDITS, EPOCHS, AuditParams
from gentorrent.ledger.epoch_txs import SCORE_SCALE
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.ledger.sections import LOCAL_MODELS, decode_models
from verifier.epochs.audits import AuditDesk, AuditRefused, audit_report, audit_score
from verifier.epochs.donations import DonatedPool, donation_of
from verifier.epochs.repeats import CommitteeMemory
from verifier.epochs.scoring import ScoringError, TokenScores

log = logging.getLogger(__name__)

__all__ = ["AuditReportDraft", "AuditService", "service_for"]

# epochs' worth of scored audits (max_per_epoch each) kept for reports the chain keeps refusing
UNREPORTED_KEPT = 2


@dataclass(frozen=True)
class AuditReportDraft:
    """One report as this member would post it, and the audits it covers (their receipt keys)."""

    scores: list[tuple[bytes, int]]
    digest: bytes
    keys: frozenset[bytes]


class Scorer(Protocol):
    """The member's reference model (verifier.epochs.reference.RemoteReference has it)."""

    async def score(self, request: pb.GenerateRequest, token_ids: list[int],
                    served_by: audits.RegisteredModel | None = None) -> TokenScores: ...


class AuditService:
    """One member's audit desk over time: `submit` from the transport, `score_queued` from
    the epoch runner, `credibilities` for the epoch result."""

    def __init__(self, models: Callable[[], Mapping[bytes, audits.RegisteredModel]], reference: Scorer,
                 epoch: Callable[[], int], params: AuditParams = AUDITS, span_ms: int | None = None,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 audit_key: X25519PrivateKey | None = None, outputs: CommitteeMemory | None = None) -> None:
        """`audit_key`: the X25519 key users seal audits to (the member's box key); `outputs`: the
        member's memory of each node's outputs, shared with its epoch runner (repeats.py)."""
        self.models, self.reference, self.epoch, self.params = models, reference, epoch, params
        self.outputs = CommitteeMemory() if outputs is None else outputs
        self.audit_key = audit_key
        self.span_ms = EPOCHS.span_ms if span_ms is None else span_ms
        self.clock_ms = clock_ms
        self.desk = AuditDesk(epoch(), params, salt=secrets.token_bytes(32))
        self._scored: set[bytes] = set()  # receipt keys of the current desk already scored
        self._passes = 0  # reference passes spent on the current desk's epoch
        self.results: dict[int, dict[bytes, dict[bytes, float]]] = {}  # epoch -> node -> receipt key -> score
        self._unreported: dict[bytes, tuple[bytes, float]] = {}  # receipt key -> (node, score), since the last report
        self._backlog: list[audits.CheckedAudit] = []  # sampled by the previous desk, not scored yet
        self.donations = DonatedPool(params)  # reusable audited asks, for this member's challenges

    def _roll(self) -> None:
        current = self.epoch()
        if current > self.desk.epoch:
            self._backlog = [a for a in self.desk.queue if a.key not in self._scored]  # sampled, not scored: keep them
            self.desk = self.desk.next_epoch(current, salt=secrets.token_bytes(32))
            self._scored, self._passes = set(), 0
            for old in [e for e in self.results if e < current - 1]:
                del self.results[old]

    def window(self) -> audits.AuditWindow:
        now = self.clock_ms()
        return audits.AuditWindow(now - 2 * self.span_ms, now + self.params.max_clock_skew_ms)

    def submit_sealed(self, sealed: bytes, channel: str) -> pb.AuditAck:
        """A submission as a proxy hands it on: sealed to this member's audit key;
        `channel` is the connection it came over (the proxy)."""
        if self.audit_key is None:
            return pb.AuditAck(accepted=False, reason="this member has no audit key")
        try:
            data = audits.open_sealed_audit(self.audit_key, sealed, self.params)
        except audits.AuditError as exc:
            return pb.AuditAck(accepted=False, reason=str(exc))
        return self.submit(data, channel)

    def submit(self, data: bytes, channel: str) -> pb.AuditAck:
        """Admit one submission that arrived over `channel` (the overlay link it came in on).
        Accepted says admitted, not sampled: the submitter must not learn its rank."""
        self._roll()
        try:
            desk, checked = self.desk.admit(data, channel, self.models(), self.window())
        except AuditRefused as exc:
            return pb.AuditAck(accepted=False, reason=str(exc))
        donation = donation_of(checked, self.params)
        if donation is not None:
            self.donations.add(donation)
        kept = {a.key for a in desk.sample[checked.node_id]}
        for audit in self.desk.sample.get(checked.node_id, ()):
            if audit.key not in kept:  # ranked out of the sample: its score, if any, no longer counts
                self._forget(audit)
        self.desk = desk
        return pb.AuditAck(accepted=True)

    def _forget(self, audit: audits.CheckedAudit) -> None:
        self._unreported.pop(audit.key, None)
        self.results.get(self.desk.epoch, {}).get(audit.node_id, {}).pop(audit.key, None)

    def _sampled(self, audit: audits.CheckedAudit) -> bool:
        return any(a.key == audit.key for a in self.desk.sample.get(audit.node_id, ()))

    async def score_queued(self) -> int:
        """Score the sampled audits not scored yet, in rank order (over the epoch's pass budget,
        `max_per_epoch`, the rest waits: a random share of every node's, never the last to
        arrive); returns how many were scored. An audit the reference cannot score is dropped
        (logged), never counted against the node."""
        self._roll()
        epoch = self.desk.epoch
        pending = self._backlog + sorted((a for a in self.desk.queue if a.key not in self._scored), key=self.desk.rank)
        self._backlog = []
        done = 0
        for i, audit in enumerate(pending):
            if audit.key in self._scored:
                continue  # another call (the report's, the background loop's) took it meanwhile
            if self._passes >= self.params.max_per_epoch:
                log.info("audit pass budget of epoch %d spent: %d sampled audits wait", epoch, len(pending) - i)
                break
            self._passes += 1
            self._scored.add(audit.key)
            try:
                scores = await self.reference.score(audit.request, list(audit.token_ids),
                                                    self.models().get(audit.node_id))
                report = audit_report(audit, scores)
                value = self.outputs.judge(audit.node_id.hex(), receipts.request_prompt_hash(audit.request),
                                           receipts.output_hash(audit.token_ids), audit.request.sampling.temperature,
                                           report, audited=True)
            except (ScoringError, RuntimeError, ValueError) as exc:
                log.info("audit of %s not scored: %s", audit.node_id.hex()[:16], exc)
                continue
            if self.desk.epoch == epoch and audit.key in self.desk.this_epoch and not self._sampled(audit):
                continue  # ranked out of the sample while it was being scored
            log.info("audit of %s: credibility %.3f%s (%d tokens at T %.2f, log p <= %.0f)", audit.node_id.hex()[:16],
                     value, " (output replayed from another prompt)" if value != report.credibility else "",
                     report.n_tokens, audit.request.sampling.temperature, report.log_prob_bound)
            self.results.setdefault(epoch, {}).setdefault(audit.node_id, {})[audit.key] = value
            self._unreported[audit.key] = (audit.node_id, value)
            while len(self._unreported) > UNREPORTED_KEPT * self.params.max_per_epoch:  # reports refused for long
                del self._unreported[next(iter(self._unreported))]  # the oldest first
            done += 1
        return done

    async def run(self, poll_s: float) -> None:
        """Score what arrives, every `poll_s` seconds, until cancelled."""
        while True:
            await self.score_queued()
            await asyncio.sleep(poll_s)

    def pending_report(self) -> AuditReportDraft:
        """What this member reports on chain: per node, the audit score (micros; audits.
        audit_score) of the audits scored and not yet reported, and a digest of their receipts.
        They stay pending until `reported`: a report the chain refused (the epoch was decided
        before it arrived, as happens to a member slower than the quorum) goes into the next
        one instead of being lost, and with it the node's audits of that epoch."""
        by_node: dict[bytes, list[float]] = {}
        for node, value in self._unreported.values():
            by_node.setdefault(node, []).append(value)
        scores = sorted((node, int(round(audit_score(v, self.params) * SCORE_SCALE))) for node, v in by_node.items())
        digest = hashlib.sha256(b"".join(sorted(self._unreported))).digest()
        return AuditReportDraft(scores, digest, frozenset(self._unreported))

    def reported(self, draft: AuditReportDraft) -> None:
        """The chain took `draft`: its audits are not reported again (those scored since stay)."""
        for key in draft.keys:
            self._unreported.pop(key, None)

    def take_report(self) -> tuple[list[tuple[bytes, int]], bytes]:
        """The pending report, counted as reported at once."""
        draft = self.pending_report()
        self.reported(draft)
        return draft.scores, draft.digest

    def credibilities(self, epoch: int) -> dict[bytes, Sequence[float]]:
        """Each audited node's audit credibilities of `epoch` (node id -> scores)."""
        return {node: tuple(v.values()) for node, v in self.results.get(epoch, {}).items() if v}


def service_for(host, reference: Scorer, params: AuditParams = AUDITS,
                outputs: CommitteeMemory | None = None) -> AuditService:
    """The desk of a verifier node (its RunnerHost): the registry and the epoch number from
    committed state, the member's box key as its audit key, its runner's memory of outputs."""
    def models() -> dict[bytes, pb.ModelEntry]:
        code, value = host.query(LOCAL_MODELS)
        return {bytes(m.node_id): m for m in decode_models(value)} if code == 0 else {}

    def epoch() -> int:
        code, value = host.query("/epochs")
        return pb.EpochsSection.FromString(value).epoch if code == 0 else 0

    return AuditService(models, reference, epoch, params, span_ms=host.params.epochs.span_ms,
                        audit_key=host.box_private, outputs=outputs)
