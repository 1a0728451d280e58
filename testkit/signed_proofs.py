"""Proofs of a state the way a committee signs them (header H+1 with its commit), for a
registry app driven without consensus: tests/test_registry_queries.py and bench/scale.py."""

from __future__ import annotations

from gentorrent.crypto.keys import Identity
from gentorrent.ledger.chain import (BlockHeader, Commit, CommitSig, DirectoryProofCodec, ValidatorSet, Vote,
                                    VoteType)


def signed_proof(chain_id: str, height: int, app_hash: bytes, time_ms: int, committee: ValidatorSet,
                 signers: list[Identity]) -> bytes:
    """A DirectoryProofCodec proof that the state after `height` hashes to `app_hash`: the
    header of block height+1 (naming `committee` as its signers, as a real header does) and a
    commit of `signers`' precommits for it."""
    header = BlockHeader(chain_id, height + 1, time_ms, signers[0].public_key if signers else bytes(32), b"", b"",
                         bytes(32), bytes(32), committee.hash(), app_hash, committee.hash())
    vote = Vote(VoteType.PRECOMMIT, header.height, 0, header.hash(), 0)
    sigs = tuple(CommitSig(m.public_key, m.sign(vote.sign_bytes(chain_id))) for m in signers)
    return DirectoryProofCodec.encode(height, header.encode(), Commit(header.height, 0, header.hash(), sigs).encode())
