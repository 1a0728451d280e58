"""Attach verification epochs to a running verifier node (`gt-verifier start --epochs`).

The runner gets: the node (committed state, its mempool, the Private RPC to its peers), a
reference model (`--reference-model HOST:PORT --reference-cert FILE`: a `gt-model serve` with
the honest weights; on one machine every member may point at the same one), and a user node
of its own in the overlay, through which it probes model nodes exactly as a user asks. That
user node registers itself with the committee and reads its checked directory like every
other user node (`probe="committee"`); tests of the epochs alone may hand it a static
directory file instead. The member's audit desk (verifier/epochs/audit_service.py) runs
beside the runner and scores the audits users hand in with the same reference model.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from gentorrent.config import AUDITS, CLOVES, EPOCH_RUN, OVERLAY, AuditParams, EpochRunParams, OverlayParams
from gentorrent.crypto.keys import NodeKeys
from gentorrent.ledger.committee import CommitteeDirectory
from gentorrent.ledger.directory import StaticDirectory
from user_client.node import UserNode
from verifier.epochs.audit_service import AuditService, Scorer, service_for
from verifier.epochs.overlay_prober import OverlayProber
from verifier.epochs.reference import RemoteReference, committed_catalogue
from verifier.epochs.runner import EpochRunner, LeaderConduct

__all__ = ["attach_audit_desk", "attach_epochs", "probe_user_params"]

PROBE_HOME = "epoch-user"


async def attach_epochs(node, reference: RemoteReference, probe: Path | str | None,
                        params: EpochRunParams = EPOCH_RUN, conduct: LeaderConduct | None = None,
                        user_listen: str = "127.0.0.1:0", user_kwargs: dict | None = None,
                        audits: AuditParams = AUDITS) -> EpochRunner:
    """`probe`: "committee" (the probing user node registers with this node's committee), a
    static directory file (tests), or None (no probing user node)."""
    prober = None
    user = None
    if probe is not None:
        home = Path(node.home) / PROBE_HOME
        kwargs = dict(user_kwargs or {})
        # a fresh path set for every challenge: no two challenges (or own probes) share a path
        kwargs["cloves"] = replace(kwargs.get("cloves", CLOVES), single_use_paths=True)
        kwargs["params"] = probe_user_params(params, kwargs.get("params", OVERLAY))
        user = UserNode(home, _probe_directory(probe, node, home), listen=user_listen, **kwargs)
        await user.start()
        prober = OverlayProber(user, patience_s=params.probe_timeout_s / 2)
    host = node.epoch_host()
    reference.catalogue_of = lambda: committed_catalogue(host.query)  # what it may score: the member's own state
    runner = EpochRunner(host, reference, prober, params, conduct)
    if user is not None:
        runner.on_stop.append(user.stop)
    attach_audit_desk(node, runner, reference, audits)
    runner.on_stop.append(reference.close)
    node.epochs = runner
    runner.start()
    return runner


def attach_audit_desk(node, runner: EpochRunner, reference: Scorer, audits: AuditParams = AUDITS) -> AuditService:
    """The member's audit desk beside its runner, scoring what users hand in as it arrives
    (every 10 polls): a report then only collects scores, and a member busy scoring when the
    epoch reaches attesting is not the one whose report comes too late. One memory of each
    node's outputs serves challenges and audits, so a replay is caught in either."""
    node.audits = runner.audits = service_for(runner.host, reference, audits, outputs=runner.outputs)
    scoring = asyncio.ensure_future(node.audits.run(runner.params.poll_s * 10))
    runner.on_stop.append(lambda: _cancel(scoring))
    return node.audits


def probe_user_params(params: EpochRunParams, overlay: OverlayParams) -> OverlayParams:
    """The probing user node's overlay settings: a user's, waiting `params.probe_reply_wait_s`
    for a first reply when that is longer (a more patient setting is kept; the runner gives up
    on a probe after `params.probe_timeout_s` whatever the node waits)."""
    wait = min(params.probe_reply_wait_s, params.probe_timeout_s)
    return replace(overlay, first_reply_timeout_s=max(overlay.first_reply_timeout_s, wait))


async def _cancel(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def _probe_directory(probe: Path | str, node, home: Path):
    if probe == "committee":  # (the member trusts its own chain: its newest block anchors its user node)
        return CommitteeDirectory(node.genesis, NodeKeys.load_or_create(home).identity,
                                  anchor_source=node.consensus.trust_anchor)
    return StaticDirectory(Path(probe))
