"""Users' donated audited asks: the member's private pool of challenge prompts (pure).

Challenges drawn from the public corpus can be looked up by a node that stores the corpus
(`bench/challenge_realism.py`: AUC 0.92 for a char-5-gram lookup). An audited ask whose asker
let the committee reuse it (`AuditSubmission.reusable`) is a real user's prompt that no public
corpus holds, with a real client's sampling: made into a challenge (rewritten, fresh session id:
`gentorrent.traffic.challenge.donated_challenge`) it is exactly what a node cannot look up.

Only chat asks for at least `AuditParams.donated_min_tokens` tokens are kept (`donation_of`): the
challenge keeps its asker's max_tokens, and a short reply gives the scoring tests nothing to
go on. Rules, each against a way a node could still recognise one:
- never to the node that served the original ask (it saw the prompt), and preferably to a node
  of another model (the original server's group peers may share its logs);
- used once, then gone (a repeat would tell a node "seen before: a challenge");
- kept in memory only, at most `AuditParams.donated_kept`, oldest out first (a restart forgets
  them: the committee does not archive users' prompts).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from gentorrent.audits import CheckedAudit
from gentorrent.config import AUDITS, AuditParams
from gentorrent.traffic.model import ChatRequest, TrafficError

__all__ = ["Donation", "DonatedPool", "donation_of"]


@dataclass(frozen=True)
class Donation:
    """One reusable audited ask: who served it, for which model, and the request (no ids)."""

    key: bytes  # the audit's receipt key (one donation per receipt)
    served_by: bytes
    model: str
    request: ChatRequest


def donation_of(audit: CheckedAudit, params: AuditParams = AUDITS) -> Donation | None:
    """The donation an admitted audit makes, or None: not reusable, a raw prompt, out of a
    challenge's bounds, or too short a reply to challenge with (it is scored, never reused)."""
    if not audit.reusable:
        return None
    try:
        request = ChatRequest.from_wire(audit.request)
    except TrafficError:
        return None
    if request.max_tokens < params.donated_min_tokens:
        return None
    return Donation(audit.key, audit.node_id, audit.request.model, request)


class DonatedPool:
    """A bounded, use-once pool of donations."""

    def __init__(self, params: AuditParams = AUDITS) -> None:
        self.limit = params.donated_kept
        self._items: OrderedDict[bytes, Donation] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def add(self, donation: Donation) -> None:
        if self.limit <= 0 or donation.key in self._items:
            return
        self._items[donation.key] = donation
        while len(self._items) > self.limit:
            self._items.popitem(last=False)

    def candidates(self, node_id: bytes, model: str) -> list[Donation]:
        """What may challenge `node_id` (serving `model`): never its own, another model's first."""
        others = [d for d in self._items.values() if d.served_by != node_id]
        elsewhere = [d for d in others if d.model != model]
        return elsewhere or others

    def take(self, node_id: bytes, model: str, pick: int) -> Donation | None:
        """Remove and return the candidate `pick` (mod their number) for `node_id`, or None.
        `pick` comes from the leader's private seed: which donation is used is unpredictable."""
        candidates = self.candidates(node_id, model)
        if not candidates:
            return None
        chosen = candidates[pick % len(candidates)]
        del self._items[chosen.key]
        return chosen
