"""A light client that follows a changing committee (gentorrent/ledger/light_verify.py): from a
trusted height it verifies later headers by skipping (more than 1/3 of the power it trusts
signed) or, when the committee moved on, by bisection; within a trusting period only. Attack
tests: an old key of a member that left certifies nothing; a fork signed by a Byzantine third
passes a skip alone and is caught by a second verifier, with evidence.

The chain is a real one: four validators and four nodes outside the first committee, real
drivers, signers and WALs (testkit/simnet.py); the committee is replaced one member at a time
through the chain until none of the first four is left."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from gentorrent.ledger.chain import (Commit, CommitSig, DirectoryProofCodec, Validator, ValidatorSet, Vote, VoteType,
                                    make_block)
from gentorrent.ledger.genesis import Genesis, GenesisValidator
from gentorrent.ledger import queries
from gentorrent.ledger.light_client import (LIGHT_BLOCK_PATH, Committee, CommitteeChanged, DirectoryRejected, NotFollowed,
                                            TooFewSignatures, TrustAnchor, TrustExpired, TrustFileError, UnknownKey,
                                            certify, committee_reader)
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.ledger.light_verify import (Expired, ForkDetected, InvalidHeader, LightBlock, LightBlockCodec,
                                            NotEnoughTrust, bisect, conflict, genesis_block, verify)
from testkit.simnet import CHAIN, FixedDelay, Network, val_tx

DAY_MS = 24 * 3600 * 1000
WEEK_MS = 7 * DAY_MS
PERIOD_MS = 14 * DAY_MS
DRIFT_MS = 10_000


@pytest.fixture(scope="module")
def chain():
    """Blocks 1..N with commits; members 0..3 rotated out for joiners 4..7, one every few heights."""
    logging.disable(logging.WARNING)
    with Network(4, seed=8, policy=FixedDelay(0.01), joiners=4) as net:
        for k in range(4):
            old, new = net.identities[k].public_key, net.identities[4 + k].public_key
            net.submit_at(0.3 + 0.6 * k, val_tx([(old, 0), (new, 1)], k))
        net.run(4.0)
        ref = max(net.instances, key=lambda i: i.host.height)
        blocks = {h: LightBlock(b.header, c, net.history.at(h)) for h, (b, c) in ref.store.items()}
        identities = net.identities
        history = net.history
    logging.disable(logging.NOTSET)
    top = max(blocks)
    assert set(history.at(top)) and not {v.public_key for v in history.at(top)} & \
        {i.public_key for i in identities[:4]}, "the first committee was not fully replaced"
    return blocks, identities, history


def now_after(block: LightBlock, ms: int) -> int:
    return block.time_ms + ms


def test_skipping_verification_and_bisection_follow_a_committee_replaced_entirely(chain):
    blocks, ids, history = chain
    top = max(blocks)
    root = genesis_block(CHAIN, 0, history.at(1))
    target = blocks[top]
    now = now_after(target, WEEK_MS)  # a user node offline for a week
    verify(blocks[2], blocks[3], CHAIN, now, PERIOD_MS, DRIFT_MS)  # adjacent
    verify(blocks[3], blocks[6], CHAIN, now, PERIOD_MS, DRIFT_MS)  # a small skip: the committee overlaps
    with pytest.raises(NotEnoughTrust):  # none of the genesis committee signs the top header
        verify(root, target, CHAIN, now, PERIOD_MS, DRIFT_MS)
    fetched = []

    def fetch(height: int) -> LightBlock:
        fetched.append(height)
        return blocks[height]
    path = bisect(root, target, fetch, CHAIN, now, PERIOD_MS, DRIFT_MS)
    assert path[-1] == target and all(a.height < b.height for a, b in zip(path, path[1:]))
    assert len(fetched) < top // 2  # far fewer headers than the chain has


def test_a_trusted_header_beyond_the_trusting_period_vouches_for_nothing(chain):
    blocks, _, _ = chain
    with pytest.raises(Expired, match="trusting period"):
        verify(blocks[2], blocks[3], CHAIN, now_after(blocks[2], PERIOD_MS + 1), PERIOD_MS, DRIFT_MS)


def test_a_header_with_a_committee_it_does_not_name_or_too_few_signatures_is_refused(chain):
    blocks, _, history = chain
    b = blocks[5]
    wrong_set = LightBlock(b.header, b.commit, history.at(1) if history.at(5) != history.at(1) else history.at(max(blocks)))
    with pytest.raises(InvalidHeader, match="not the one it names"):
        verify(blocks[4], wrong_set, CHAIN, now_after(b, DAY_MS), PERIOD_MS, DRIFT_MS)
    thin = LightBlock(b.header, replace(b.commit, signatures=b.commit.signatures[:1]), b.validators)
    with pytest.raises((InvalidHeader, NotEnoughTrust)):
        verify(blocks[4], thin, CHAIN, now_after(b, DAY_MS), PERIOD_MS, DRIFT_MS)


def _forged(blocks, height: int, signers, chain_id: str = CHAIN) -> LightBlock:
    """A header of `height` for another block, with a committee made of `signers` (identities)
    that signs it: what members who left, or a Byzantine third, can build on their own."""
    real = blocks[height].header
    fake_set = ValidatorSet([Validator(i.public_key, 1) for i in signers])
    block = make_block(chain_id, height, real.time_ms + 1, signers[0].public_key, real.last_block_hash,
                       blocks[height - 1].commit if height - 1 in blocks else None, (b"evil=1",), fake_set,
                       real.last_app_hash, (), fake_set)
    precommit = Vote(VoteType.PRECOMMIT, height, 0, block.hash(), 0)
    sigs = tuple(CommitSig(i.public_key, i.sign(precommit.sign_bytes(chain_id))) for i in signers)
    return LightBlock(block.header, Commit(height, 0, block.hash(), sigs), fake_set)


def test_old_keys_of_members_who_left_cannot_certify_a_header(chain):
    """The first four members all left; their keys sign a header of their own committee. A
    client that trusts a header made after they left is not moved, adjacent or skipping."""
    blocks, ids, history = chain
    top = max(blocks)
    trusted = next(b for h, b in sorted(blocks.items()) if not {v.public_key for v in b.validators}
                   & {i.public_key for i in ids[:4]})
    forged = _forged(blocks, top, ids[:4])
    with pytest.raises(NotEnoughTrust):
        verify(trusted, forged, CHAIN, now_after(forged, DAY_MS), PERIOD_MS, DRIFT_MS)
    adjacent = _forged(blocks, trusted.height + 1, ids[:4])
    with pytest.raises(InvalidHeader, match="another committee"):
        verify(trusted, adjacent, CHAIN, now_after(adjacent, DAY_MS), PERIOD_MS, DRIFT_MS)


def test_a_fork_signed_by_a_byzantine_third_passes_one_verifier_and_a_second_one_catches_it(chain):
    """Two of the four members of a committee the client trusts (more than 1/3 of its power)
    sign a later header of a committee of their own: a skip alone accepts it (that is what 1/3
    trust means). A second verifier serves the real header of that height; the two conflict,
    and the client stops with evidence naming the members who signed both."""
    blocks, ids, history = chain
    trusted = blocks[2]
    members = [i for i in ids if trusted.validators.index_of(i.public_key) is not None]
    byzantine = members[:2]
    target = 9
    fake = _forged(blocks, target, byzantine)
    verify(trusted, fake, CHAIN, now_after(fake, DAY_MS), PERIOD_MS, DRIFT_MS)  # alone: accepted
    real = blocks[target]
    verify(trusted, real, CHAIN, now_after(real, DAY_MS), PERIOD_MS, DRIFT_MS)
    evidence = conflict(fake, real)
    assert evidence is not None and evidence.height == target
    in_real = {s.public_key for s in real.commit.signatures}
    assert set(evidence.double_signers) == {i.public_key for i in byzantine} & in_real
    assert conflict(real, blocks[target]) is None  # the same header twice is no fork
    err = ForkDetected(f"verifiers disagree at height {target}", evidence)
    assert err.evidence is evidence


# --------------------------------------------------------------------------- the light client follows


def _proof(block: LightBlock) -> bytes:
    """What a verifier sends with an answer about the state after block H: header and commit of H+1."""
    return DirectoryProofCodec.encode(block.height - 1, block.header.encode(), block.commit.encode())


def _follow(committee: Committee, target: LightBlock, blocks, now_ms: int) -> list[int]:
    """Drive Committee.follow as CommitteeReader.follow does, the light blocks from `blocks`."""
    asked: list[int] = []
    steps = committee.follow(target, now_ms)
    try:
        wanted = next(steps)
        while True:
            asked.append(wanted)
            wanted = steps.send(blocks[wanted])
    except StopIteration:
        return asked


def test_an_answer_signed_by_a_committee_that_replaced_the_genesis_one_is_believed_once_followed(chain):
    """What a node holding the genesis file meets once every genesis member has left: the
    proof of an answer is signed by members it never heard of. On the genesis committee alone
    (the code before the light client followed) that is "unknown key", for good; here the
    client follows the chain to that committee (a few light blocks) and then believes it."""
    blocks, _, history = chain
    top = max(blocks)
    committee = Committee(CHAIN, history.at(1), 0)
    with pytest.raises(CommitteeChanged) as raised:
        certify(top - 1, _proof(blocks[top]), committee)
    assert raised.value.height == top
    asked = _follow(committee, blocks[top], blocks, now_after(blocks[top], DAY_MS))
    assert 0 < len(asked) < top // 2
    assert certify(top - 1, _proof(blocks[top]), committee).app_hash == blocks[top].header.last_app_hash
    assert certify(1, _proof(blocks[2]), committee).height == 1  # an older answer: the committee of its height
    genesis_only = Committee(CHAIN, history.at(1), 0)
    genesis_only.validators_for = lambda header: genesis_only.validators  # what the client checked before
    with pytest.raises((UnknownKey, TooFewSignatures)):
        certify(top - 1, _proof(blocks[top]), genesis_only)


def test_once_followed_members_who_left_certify_nothing_and_a_fork_is_refused(chain):
    """Attack: the four genesis members all left; they sign a header of their own committee at
    the top height. A client that followed the change refuses it (their keys carry no trust
    after it), and a second certified header of a height it holds is a fork."""
    blocks, ids, history = chain
    top = max(blocks)
    committee = Committee(CHAIN, history.at(1), 0)
    now = now_after(blocks[top], DAY_MS)
    _follow(committee, blocks[top - 1], blocks, now)
    forged = _forged(blocks, top, ids[:4])
    with pytest.raises(CommitteeChanged):
        certify(top - 1, _proof(forged), committee)
    with pytest.raises(NotFollowed):
        _follow(committee, forged, {**blocks, top: forged}, now)
    members = [i for i in ids if blocks[top - 1].validators.index_of(i.public_key) is not None]
    fork = _forged(blocks, top - 1, members)  # the whole committee of top - 1 signs a second history
    with pytest.raises(NotFollowed, match="fork"):
        committee._keep(fork)


def test_a_trusted_header_older_than_the_trusting_period_follows_no_change(chain):
    """A node whose newest verified header is older than the trusting period does not follow
    a change on it: members who left since may sign anything by then."""
    blocks, _, history = chain
    top = max(blocks)
    committee = Committee(CHAIN, history.at(1), 0, trusting_period_ms=PERIOD_MS)
    with pytest.raises(NotFollowed, match="trusting period"):
        _follow(committee, blocks[top], blocks, PERIOD_MS + 1)


def test_light_blocks_round_trip_and_bad_bytes_are_refused(chain):
    blocks, _, _ = chain
    b = blocks[5]
    back = LightBlockCodec.decode(LightBlockCodec.encode(b))
    assert back.header == b.header and back.commit == b.commit and back.validators.hash() == b.validators.hash()
    data = LightBlockCodec.encode(b)
    for bad in (data[:-1], data + b"\0", b"junk", data[:20]):
        with pytest.raises(ValueError):
            LightBlockCodec.decode(bad)


def test_what_a_node_followed_survives_its_restart_and_keeps_refusing_members_who_left(chain, tmp_path):
    """Attack on a restarted node: the genesis members, all gone, sign a header of their own
    committee. A node restarted with only its genesis file believes it (it names the genesis
    committee); one that kept what it verified (its home's trust file) refuses it."""
    blocks, ids, history = chain
    top = max(blocks)
    forged = _forged(blocks, top, ids[:4])
    before = Committee(CHAIN, history.at(1), 0)
    _follow(before, blocks[top - 1], blocks, now_after(blocks[top], DAY_MS))
    newcomer = pb.MemberCard(name="v9", public_key=ids[7].public_key, power=1, address="127.0.0.1:9")
    assert before.learn([newcomer]) == [newcomer] and before.learn([newcomer]) == []
    trust = tmp_path / "light_client.trust"
    trust.write_bytes(before.encode_trust())
    reader = committee_reader(_genesis_of(history), trust_file=trust)
    restarted = reader.committee
    assert [b.height for b in restarted.followed] == [b.height for b in before.followed]
    assert "127.0.0.1:9" in {v.address for v in reader.validators}  # whom it asks: the learned member too
    with pytest.raises(CommitteeChanged):
        certify(top - 1, _proof(forged), restarted)
    genesis_only = Committee(CHAIN, history.at(1), 0)  # a node that kept nothing
    assert certify(top - 1, _proof(forged), genesis_only).height == top - 1


def test_a_damaged_or_foreign_trust_file_is_refused_saying_what_to_do(chain, tmp_path):
    blocks, _, history = chain
    committee = Committee(CHAIN, history.at(1), 0)
    _follow(committee, blocks[max(blocks)], blocks, now_after(blocks[max(blocks)], DAY_MS))
    good = committee.encode_trust()
    trust = tmp_path / "light_client.trust"
    for bad in (good[:-3], b"junk", Committee("another-chain", history.at(1), 0).encode_trust()):
        trust.write_bytes(bad)
        with pytest.raises(TrustFileError, match="remove it"):
            committee_reader(_genesis_of(history), trust_file=trust)
    fresh = Committee(CHAIN, history.at(1), 0)
    with pytest.raises(TrustFileError):
        fresh.restore_trust(good[:-3])
    assert fresh.followed == [] and fresh.latest is None  # nothing changed


async def test_the_reader_keeps_a_followed_change_in_the_trust_file(chain, tmp_path):
    """CommitteeReader.follow over a verifier's light blocks (`/light_block/<h>`), then the
    trust file holds what it verified."""
    blocks, _, history = chain
    top = max(blocks)
    asked: list[str] = []

    async def send(v, path, data):
        asked.append(path)
        height = int(path[len(LIGHT_BLOCK_PATH):])
        return pb.QueryReply(code=0, value=LightBlockCodec.encode(blocks[height]), height=height)

    trust = tmp_path / "light_client.trust"
    reader = committee_reader(_genesis_of(history), trust_file=trust)
    reader.send, reader.now_ms = send, lambda: now_after(blocks[top], DAY_MS)
    await reader.follow(None, top)
    reader._keep_trust()
    assert asked[0] == f"{LIGHT_BLOCK_PATH}{top}" and trust.stat().st_mode & 0o077 == 0
    again = Committee(CHAIN, history.at(1), 0)
    again.restore_trust(trust.read_bytes())
    assert again.trusted_below(top + 1).header == blocks[top].header


def _light_blocks_of(blocks, asked: list[str]):
    """A verifier that serves the chain's light blocks and answers nothing else."""
    async def send(v, path, data):
        asked.append(path)
        if not path.startswith(LIGHT_BLOCK_PATH):
            return pb.QueryReply(code=1, log="this verifier serves light blocks only")
        height = int(path[len(LIGHT_BLOCK_PATH):])
        return pb.QueryReply(code=0, value=LightBlockCodec.encode(blocks[height]), height=height)
    return send


async def test_a_new_node_with_an_old_genesis_believes_nothing_until_given_a_recent_trust_anchor(chain):
    """Attack (long-range): the genesis members all left long ago, and their old keys sign a
    header of their own committee. A new node holding only the genesis file, older than the
    trusting period, would believe it: it names the genesis committee (the restart test above,
    `genesis_only`). Now it believes nothing from anyone, saying what to do; given a trust
    anchor (a recent height and header hash from a source it trusts) it follows from there:
    the real answer is believed, the forged one is not, and a wrong anchor is refused."""
    blocks, ids, history = chain
    top = max(blocks)
    forged, anchored = _forged(blocks, top, ids[:4]), blocks[top - 1]
    now = anchored.time_ms + 1000
    period = now - anchored.time_ms + 1  # the anchor is just recent enough, the genesis (time 0) is not
    asked: list[str] = []

    def reader(anchor: TrustAnchor | None):
        r = committee_reader(_genesis_of(history), anchor=anchor)
        r.send, r.now_ms, r.committee.trusting_period_ms = _light_blocks_of(blocks, asked), lambda: now, period
        return r

    bare = reader(None)
    assert certify(top - 1, _proof(forged), Committee(CHAIN, history.at(1), 0)).height == top - 1  # the hole
    with pytest.raises(TrustExpired, match="--trust-anchor"):
        await bare.ask(queries.Members())
    assert asked == []  # refused before asking anyone
    wrong = reader(TrustAnchor(anchored.height, bytes(32)))
    with pytest.raises(DirectoryRejected, match="trust anchor"):
        await wrong.ask(queries.Members())
    assert wrong.committee.followed == [] and wrong.committee.latest is None  # nothing trusted
    good = reader(TrustAnchor.parse(f"{anchored.height}:{anchored.header.hash().hex()}"))
    await good.take_anchor()
    good.committee.check_fresh(now)  # (fresh now: what it follows from is the anchor)
    assert certify(top - 1, _proof(blocks[top]), good.committee).app_hash == blocks[top].header.last_app_hash
    with pytest.raises(CommitteeChanged):  # the forged header names the genesis committee: not the anchor's
        certify(top - 1, _proof(forged), good.committee)
    with pytest.raises(NotFollowed):
        _follow(good.committee, forged, {**blocks, top: forged}, now)
    member = reader(None)  # a committee member's own user node: it anchors at the member's newest block
    member.anchor_source = lambda: TrustAnchor(anchored.height, anchored.header.hash())
    with pytest.raises(DirectoryRejected, match="light blocks only"):  # past the trust check: a verifier is asked
        await member.ask(queries.Members())
    assert member.committee.newest().header == anchored.header


def test_a_trust_anchor_is_height_colon_hash_and_anything_else_is_refused_clearly():
    digest = "ab" * 32
    anchor = TrustAnchor.parse(f"120:{digest}")
    assert (anchor.height, anchor.header_hash) == (120, bytes.fromhex(digest)) and str(anchor) == f"120:{digest}"
    for bad in ("", "120", f"0:{digest}", f"-1:{digest}", f"x:{digest}", "120:abc", f"120:{'zz' * 32}",
                f"120:{digest}00", f"{'9' * 20}:{digest}"):
        with pytest.raises(ValueError, match="HEIGHT:HASH"):
            TrustAnchor.parse(bad)


def _genesis_of(history) -> Genesis:
    """A genesis file's contents for the simnet chain's first committee (addresses never dialled)."""
    return Genesis(CHAIN, 0, tuple(GenesisValidator(f"v{i}", v.public_key, v.power, f"127.0.0.1:{1 + i}", b"")
                                   for i, v in enumerate(history.at(1))))
