"""A member's reference model scores a reply only when it runs the weights the committee's
catalogue lists for the node that generated it (verifier/epochs/reference.py, with the rule in
gentorrent.ledger.catalogue.reference_mismatch): the real RemoteReference over pinned TLS
against a stand-in model node that answers Status and Score as `gt-model serve` does.

The attacks: a member whose reference runs other weights (an old checkpoint, another dtype)
must not condemn an honest node; a cheater must not dodge scoring by claiming weights no
reference runs. And a catalogue name that shares the reference's weights is scored by it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import pytest

from gentorrent.crypto import tls
from gentorrent.crypto.keys import Identity
from gentorrent.ledger import catalogue
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc
from verifier.epochs.reference import ReferenceModelError, RemoteReference, committed_catalogue

MODEL, ALIAS = "smollm2-135m", "smollm2-alias"
HONEST, OTHER = "sha256:" + "a" * 64, "sha256:" + "b" * 64


@dataclass
class Record:
    """What a node registered (pb.ModelEntry and sections.ModelRecord have these fields)."""

    model: str
    weights_digest: str
    public_key: bytes = b""


def entry(model: str, digest: str = HONEST, **options) -> pb.CatalogueEntry:
    return catalogue.entry_of({"model": model, "weights_digest": digest, **options})


RUNS_HONEST_FP32 = pb.CatalogueEntry(model=MODEL, weights_digest=HONEST, dtype="float32", kv_cache_dtype="auto")


@pytest.mark.parametrize("listed, record, problem", [
    ([entry(MODEL)], Record(MODEL, HONEST), None),  # the listed weights: scored
    ([entry(MODEL), entry(ALIAS)], Record(ALIAS, HONEST), None),  # another name, the same weights: scored
    ([entry(MODEL, OTHER)], Record(MODEL, OTHER), "the reference runs weights"),  # listed, but not these
    ([entry(MODEL, dtype="bfloat16")], Record(MODEL, HONEST), "dtype bfloat16"),  # the entry's dtype, not ours
    ([entry(MODEL, dtype="auto", kv_cache_dtype="auto")], Record(MODEL, HONEST), None),  # "auto" binds nothing
    ([entry(MODEL, kv_cache_dtype="fp8")], Record(MODEL, HONEST), "kv_cache_dtype fp8"),
    ([], Record(MODEL, HONEST), None),  # no catalogue: the model's name decides, as before
    ([], Record(ALIAS, HONEST), "serves 'smollm2-135m', not 'smollm2-alias'"),  # an unlisted alias is a name only
])
def test_the_reference_scores_only_the_weights_the_catalogue_lists(listed, record, problem):
    found = catalogue.reference_mismatch(RUNS_HONEST_FP32, listed, record.model, record.weights_digest)
    assert (found is None) if problem is None else (problem in (found or "")), found


def test_a_cheater_claiming_weights_nobody_lists_is_still_scored_under_its_models_name():
    """The dodge the check must not open: a digest is the node's own claim, so claiming weights
    no member's reference runs must not make a node unscorable (never punished)."""
    assert catalogue.reference_mismatch(RUNS_HONEST_FP32, [entry(MODEL)], MODEL, OTHER) is None
    assert catalogue.reference_mismatch(RUNS_HONEST_FP32, [], MODEL, OTHER) is None
    assert catalogue.reference_mismatch(RUNS_HONEST_FP32, [], MODEL, "") is None


class StandInReference(rpc.ModelNodeServicer):
    """Status says what it runs; Score answers every token as the greedy choice, recording the
    model name each call named."""

    def __init__(self, serving: pb.CatalogueEntry) -> None:
        self.serving, self.scored = serving, []

    async def Status(self, request, context):
        return pb.StatusReply(model=self.serving.model, serving=self.serving)

    async def Score(self, request, context):
        self.scored.append(request.model)
        return pb.ScoreReply(tokens=[pb.TokenScore(token_id=t, logprob=-0.1, rank=1) for t in request.token_ids])


@pytest.fixture
async def reference_at():
    servers = []

    async def start(serving: pb.CatalogueEntry) -> tuple[StandInReference, str, bytes]:
        tls_id = tls.make_self_signed(Identity.generate())
        server, port = tls.new_server(tls_id, "127.0.0.1:0")
        servicer = StandInReference(serving)
        rpc.add_ModelNodeServicer_to_server(servicer, server)
        await server.start()
        servers.append(server)
        return servicer, f"127.0.0.1:{port}", tls_id.cert_pem

    yield start
    for server in servers:
        await server.stop(None)


REQUEST = pb.GenerateRequest(model=ALIAS, prompt="Why is the sky blue?")


async def test_a_member_whose_reference_runs_other_weights_abstains_instead_of_condemning(reference_at, caplog):
    """An honest node registered the listed weights; this member's reference runs other ones (the
    numbers it would give are another model's): the score call fails, the reference is never
    asked, and the runner records no vote on the node (VERDICT_UNSCORABLE). The operator is
    warned when the reference is first reached."""
    servicer, address, cert = await reference_at(pb.CatalogueEntry(model=MODEL, weights_digest=OTHER))
    reference = RemoteReference(address, cert, catalogue_of=lambda: [entry(MODEL), entry(ALIAS)])
    try:
        with caplog.at_level(logging.INFO, logger="verifier.epochs.reference"), \
                pytest.raises(ReferenceModelError, match="runs weights sha256:bbbb"):
            await reference.score(REQUEST, [1, 2, 3], Record(ALIAS, HONEST))
        assert servicer.scored == []
        assert any(r.levelno == logging.WARNING and "which the catalogue does not list" in r.getMessage()
                   for r in caplog.records), caplog.text
    finally:
        await reference.close()


async def test_a_catalogue_name_that_shares_the_reference_weights_is_scored_under_the_references_name(
        reference_at, caplog):
    servicer, address, cert = await reference_at(RUNS_HONEST_FP32)
    reference = RemoteReference(address, cert, catalogue_of=lambda: [entry(MODEL), entry(ALIAS)])
    try:
        with caplog.at_level(logging.INFO, logger="verifier.epochs.reference"):
            scores = await reference.score(REQUEST, [1, 2, 3], Record(ALIAS, HONEST))
        assert scores.rank == [1, 1, 1] and servicer.scored == [MODEL]
        assert f"it scores the catalogue's {MODEL}, {ALIAS}" in caplog.text
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        # without a catalogue the alias is a name only, and the reference serves another name
        reference.catalogue_of = tuple
        with pytest.raises(ReferenceModelError, match="not 'smollm2-alias'"):
            await reference.score(REQUEST, [1, 2, 3], Record(ALIAS, HONEST))
        assert servicer.scored == [MODEL]
    finally:
        await reference.close()


def test_the_committed_catalogue_is_read_from_the_members_state():
    listed = [catalogue.as_json(entry(ALIAS, dtype="float32"))]
    assert committed_catalogue(lambda path: (0, json.dumps(listed).encode())) == [entry(ALIAS, dtype="float32")]
    assert committed_catalogue(lambda path: (6, b"")) == []
