"""The registry's queries with proofs: what a client asks, what the proof reveals, what it reads.

One definition per question (pure), shared by the committee's app, which answers it with a
proof of the registry tree (`prove`), and by the light client, which reads the answer back out
of a verified proof (`read`) and raises `authtree.Incomplete` if the proof leaves out anything
the answer depends on (ARCHITECTURE.md §3.1). No question is "the whole registry":

- `UserLookup` / `ModelLookup`: one record by node id, or a proof that there is none (to pin
  a peer met on a link);
- `RelaySample`: k relays of a region at indices the client drew itself: the client sends
  64-bit random draws, the answer proves the region's range (its first rank and its count) and
  the record at each rank `draw * count >> 64`, so neither the verifier that answers nor a
  registrant that grinds node ids can raise its share of a sample;
- `Roster`: every registered node of a model with its standing, with a proof that none was
  left out; with `since`, records the client holds unchanged since that height come as hashes,
  or as whole subtrees of them the client rebuilds (what changed since h, for the members of a
  model group who follow it: bytes per change, not per member);
- `AccountLookup`: a signer's sequence and lease; `Catalog`: the model names served;
- `Members`: the committee and the cards of members added since genesis (from the meta section,
  which the answer then carries whole).

The answer is a `ProvenAnswer` (height, meta and epochs section hashes, the tree proof) that
the light client hashes into the app hash the committee signed (gentorrent.ledger.light_client).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Mapping, Union

from google.protobuf.message import DecodeError

from gentorrent.crypto.keys import NODE_ID_BYTES
from gentorrent.ledger import authtree
from gentorrent.ledger import sections as sec
from gentorrent.ledger.sections import Account, ModelRecord, UserRecord
from gentorrent.wire import gentorrent_pb2 as pb

PREFIX = "/proof/"
#: the most relays one sample asks for (a user keeps N paths of l relays: 4 x 3, plus spares)
MAX_DRAWS = 64
#: the most model names one catalogue answer lists
MAX_CATALOG = 256
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
#: a roster query's flag after its height: no subtrees of unchanged records, each one by hash
_ENTRIES_ONLY = b"\x00"


class QueryError(ValueError):
    """A query that is malformed (bad path, bad data): refused before any work."""


class AnswerError(ValueError):
    """A verified proof whose content is not a well-formed answer to the query."""


def _record(value: bytes | None, kind: str):
    if value is None:
        raise authtree.Incomplete(f"the proof shows a {kind} record by its hash only")
    try:
        return (sec.decode_user if kind == "user" else sec.decode_model)(value)
    except sec.DirectoryFormatError as exc:
        raise AnswerError(str(exc)) from exc


@dataclass(frozen=True)
class _RecordLookup:
    """One record by node id, or a proof that there is none."""

    node_id: bytes
    kind = ""

    @property
    def path(self) -> str:
        return f"{PREFIX}{self.kind}/{self.node_id.hex()}"

    data = b""

    def key(self) -> bytes:
        return (sec.user_key if self.kind == "user" else sec.model_key)(self.node_id)

    def prove(self, tree: authtree.Tree) -> bytes:
        return tree.prove(keys=[self.key()])

    def read(self, seen: authtree.Verified):
        value = seen.lookup(self.key())
        record = None if value is None else _record(value, self.kind)
        if record is not None and record.node_id != self.node_id:
            raise AnswerError("the record under that key is another node's")
        return record


class UserLookup(_RecordLookup):
    """A user record (a UserRecord or None)."""

    kind = "user"


class ModelLookup(_RecordLookup):
    """A model record (a ModelRecord or None)."""

    kind = "model"


@dataclass(frozen=True)
class AccountLookup:
    public_key: bytes

    @property
    def path(self) -> str:
        return f"{PREFIX}account/{self.public_key.hex()}"

    data = b""

    def prove(self, tree: authtree.Tree) -> bytes:
        return tree.prove(keys=[sec.account_key(self.public_key)])

    def read(self, seen: authtree.Verified) -> Account | None:
        value = seen.lookup(sec.account_key(self.public_key))
        if value is None:
            return None
        try:
            account = Account.from_pb(pb.AccountEntry.FromString(value))
        except (DecodeError, ValueError) as exc:
            raise AnswerError(f"not an account: {exc}") from exc
        if account.public_key != self.public_key:
            raise AnswerError("the account under that key is another signer's")
        return account


@dataclass(frozen=True)
class RelaySample:
    """Relays of `region` at the client's own 64-bit `draws` (one record per draw)."""

    region: str
    draws: tuple[int, ...]

    @property
    def path(self) -> str:
        return f"{PREFIX}relays/{self.region}"

    @property
    def data(self) -> bytes:
        return b"".join(d.to_bytes(8, "big") for d in self.draws)

    def prove(self, tree: authtree.Tree) -> bytes:
        lo, hi = sec.relay_range(self.region)
        start = tree.rank(lo)
        ranks = authtree.sample_ranks(self.draws, start, tree.rank(hi) - start)
        return tree.prove(ranks=ranks, bounds=[lo, hi])

    def read(self, seen: authtree.Verified) -> tuple[int, list[UserRecord]]:
        """(how many relays the region has, the record at each draw's rank)."""
        lo, hi = sec.relay_range(self.region)
        start = seen.rank_of(lo)
        count = seen.rank_of(hi) - start
        records = []
        for rank in authtree.sample_ranks(self.draws, start, count):
            key, value = seen.at(rank)
            record = _record(value, "user")
            if key != sec.relay_key(self.region, record.node_id) or record.region != self.region:
                raise AnswerError("a sampled record is not the relay its key names")
            records.append(record)
        return count, records


@dataclass(frozen=True)
class Roster:
    """Every registered node of `model`; with `since` > 0, the ones unchanged since that height
    as hashes only (the client holds them), whole subtrees of them as one hash unless not
    `subtrees` (what a client asks when one it holds is gone: authtree.NotHeld)."""

    model: str
    since: int = 0
    subtrees: bool = True

    @property
    def path(self) -> str:
        return f"{PREFIX}roster/{self.model}"

    @property
    def data(self) -> bytes:
        if not self.since:
            return b""
        return self.since.to_bytes(8, "big") + (b"" if self.subtrees else _ENTRIES_ONLY)

    def prove(self, tree: authtree.Tree) -> bytes:
        def unchanged(key: bytes, value: bytes) -> bool:
            return self.since > 0 and sec.decode_model(value).updated_height <= self.since

        return tree.prove(ranges=[sec.group_range(self.model)], withhold=unchanged if self.since else None,
                          subtrees=self.subtrees)

    def read(self, seen: authtree.Verified, held: Mapping[bytes, ModelRecord] | None = None) -> list[ModelRecord]:
        """The roster in node-id order; records shown by hash (or in subtrees of them) come
        from `held` (by node id) and must hash to what the proof shows."""
        out = []
        rebuilt = None  # an honest proof prunes subtrees of the range only for a client that holds them
        if self.since and self.subtrees:
            rebuilt = {sec.group_key(self.model, r.node_id): sec.encode(r.to_pb()) for r in (held or {}).values()}
        for e in seen.entries_in(*sec.group_range(self.model), rebuilt):
            node_id = e.key[-NODE_ID_BYTES:]
            if e.value is None:
                record = (held or {}).get(node_id)
                if record is None or authtree.value_hash(sec.encode(record.to_pb())) != e.value_hash:
                    raise authtree.Incomplete("the roster withholds a record this client does not hold as is")
            else:
                record = _record(e.value, "model")
            if record.node_id != node_id or record.model != self.model or \
                    e.key != sec.group_key(self.model, node_id):
                raise AnswerError("a roster record is not the one its key names")
            out.append(record)
        return out


@dataclass(frozen=True)
class Catalog:
    """The model names served (at most MAX_CATALOG), each with (nodes, trusted nodes)."""

    path = f"{PREFIX}catalog"
    data = b""

    def prove(self, tree: authtree.Tree) -> bytes:
        lo, hi = sec.prefix_range(sec.CATALOG)
        first = tree.rank(lo)
        if tree.rank(hi) - first > MAX_CATALOG:
            hi = tree.at(first + MAX_CATALOG)[0]
        return tree.prove(ranges=[(lo, hi)], bounds=[hi])

    def read(self, seen: authtree.Verified) -> dict[str, tuple[int, int]]:
        out = {}
        for e in seen.entries_in(*sec.prefix_range(sec.CATALOG))[:MAX_CATALOG]:
            try:
                entry = pb.CatalogEntry.FromString(e.value or b"")
                name = e.key[1:].decode()
            except (DecodeError, UnicodeDecodeError) as exc:
                raise AnswerError(f"not a catalogue entry: {exc}") from exc
            out[name] = (entry.nodes, entry.trusted)
        return out


@dataclass(frozen=True)
class Members:
    """The committee signing the next block, and the cards (name, address, TLS certificate,
    audit key) of its members added since the genesis: how a node that followed a committee
    change learns whom to ask and seal audits to. The cards live in the meta section, not the
    registry tree, so the answer carries the meta section itself (it must hash to the meta
    hash the app hash covers: `decode_answer`)."""

    path = f"{PREFIX}committee"
    data = b""
    reads_meta = True  # the app puts the meta section in the answer; verify_reply passes it to `read`

    def prove(self, tree: authtree.Tree) -> bytes:
        return tree.prove()  # the tree's root only: the answer is the meta section

    def read(self, seen: authtree.Verified, meta: bytes | None = None) -> "CommitteeMembers":
        if meta is None:
            raise authtree.Incomplete("the answer leaves out the meta section")
        try:
            section = pb.MetaSection.FromString(meta)
        except (DecodeError, ValueError, RuntimeError) as exc:
            raise AnswerError(f"not a meta section: {exc}") from exc
        power = {bytes(v.public_key): int(v.power) for v in section.validators}
        return CommitteeMembers(power, tuple(c for c in section.cards if bytes(c.public_key) in power))


@dataclass(frozen=True)
class CommitteeMembers:
    """A `Members` answer: each member's power by key, and the cards of those added since genesis."""

    power: Mapping[bytes, int]
    cards: tuple[pb.MemberCard, ...]


Query = Union[UserLookup, ModelLookup, AccountLookup, RelaySample, Roster, Catalog, Members]


def _lookup_of(cls, name: str) -> Callable[[str, bytes], Query]:
    def parse_lookup(arg: str, data: bytes) -> Query:
        if not _HEX64.fullmatch(arg):
            raise QueryError(f"{PREFIX}{name}/<id> needs 64 lower-case hex digits")
        return cls(bytes.fromhex(arg))
    return parse_lookup


def _parse_relays(arg: str, data: bytes) -> Query:
    if not _NAME.fullmatch(arg):
        raise QueryError("a region is 1..128 characters of [A-Za-z0-9._:/-]")
    if not data or len(data) % 8 or len(data) // 8 > MAX_DRAWS:
        raise QueryError(f"a relay sample carries 1..{MAX_DRAWS} draws of 8 bytes")
    return RelaySample(arg, tuple(int.from_bytes(data[i:i + 8], "big") for i in range(0, len(data), 8)))


def _parse_roster(arg: str, data: bytes) -> Query:
    if not _NAME.fullmatch(arg):
        raise QueryError("a model name is 1..128 characters of [A-Za-z0-9._:/-]")
    if data and (len(data) not in (8, 9) or data[8:] not in (b"", _ENTRIES_ONLY)):
        raise QueryError("a roster's data is empty, or the 8-byte height it changed since (and a 0 byte: "
                         "unchanged records one by one)")
    return Roster(arg, int.from_bytes(data[:8], "big") if data else 0, subtrees=len(data) != 9)


def _no_argument(cls, name: str) -> Callable[[str, bytes], Query]:
    def parse(arg: str, data: bytes) -> Query:
        if arg or data:
            raise QueryError(f"{PREFIX}{name} takes no argument")
        return cls()
    return parse


#: the first part of a /proof/ path -> how its argument and data are read
_PARSERS: dict[str, Callable[[str, bytes], Query]] = {
    "user": _lookup_of(UserLookup, "user"), "model": _lookup_of(ModelLookup, "model"),
    "account": _lookup_of(AccountLookup, "account"),
    "relays": _parse_relays, "roster": _parse_roster, "catalog": _no_argument(Catalog, "catalog"),
    "committee": _no_argument(Members, "committee"),
}


def parse(path: str, data: bytes) -> Query:
    """The query a /proof/ path and its data ask; QueryError saying what is wrong."""
    if not path.startswith(PREFIX):
        raise QueryError(f"not a proven query: {path[:64]!r}")
    name, _, arg = path[len(PREFIX):].partition("/")
    read = _PARSERS.get(name)
    if read is None:
        raise QueryError(f"unknown proven query {path[:64]!r}; known: {PREFIX}user/<id>, {PREFIX}model/<id>, "
                         f"{PREFIX}account/<key>, {PREFIX}relays/<region>, {PREFIX}roster/<model>, {PREFIX}catalog, "
                         f"{PREFIX}committee")
    return read(arg, data)


# --------------------------------------------------------------------------- the answer


def encode_answer(height: int, meta_hash: bytes, epochs_hash: bytes, proof: bytes, meta: bytes = b"") -> bytes:
    return sec.encode(pb.ProvenAnswer(height=height, meta_hash=meta_hash, epochs_hash=epochs_hash,
                                      registry_proof=proof, meta=meta))


@dataclass(frozen=True)
class Answer:
    """A decoded answer: the app hash it claims (to compare with the signed header's) and what
    its tree proof shows."""

    height: int
    app_hash: bytes
    seen: authtree.Verified
    meta: bytes | None = None  # the meta section, when the answer carries it (checked against its hash)


def decode_answer(value: bytes, max_bytes: int) -> Answer:
    """Decode an answer and verify its tree proof (AnswerError / authtree.ProofError if bad)."""
    if len(value) > max_bytes:
        raise AnswerError(f"the answer is {len(value)} bytes, the limit is {max_bytes}")
    try:
        msg = pb.ProvenAnswer.FromString(value)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise AnswerError(f"not a proven answer: {exc}") from exc
    if len(msg.meta_hash) != sec.HASH_BYTES or len(msg.epochs_hash) != sec.HASH_BYTES or msg.height < 0:
        raise AnswerError("an answer names its height and two 32-byte section hashes")
    if msg.meta and sec.section_hash(msg.meta) != msg.meta_hash:
        raise AnswerError("the meta section in the answer is not the one its hash names")
    seen = authtree.verify(msg.registry_proof, max_bytes)
    app_hash = sec.app_hash_of({"meta": msg.meta_hash, "epochs": msg.epochs_hash, "registry": seen.root_hash})
    return Answer(msg.height, app_hash, seen, msg.meta or None)


