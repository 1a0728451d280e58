"""`gt-verifier committee ...`: change the committee through the chain (ARCHITECTURE.md §3.6).

    gt-verifier committee card --home DIR [--power P] [--advertise HOST:PORT]
        this node's member card (JSON): what an `add` or a `rotate` needs from a newcomer
        (make its home with `gt-verifier init --home DIR --join GENESIS --listen HOST:PORT`)
    gt-verifier committee propose --home DIR --out CHANGE.json
                                  (--add CARD.json | --remove KEY | --power KEY=P | --rotate KEY --card CARD.json)
        a change file, approved by this member (KEY: a member's public key, hex)
    gt-verifier committee approve --home DIR CHANGE.json
        add this member's approval to the file (more than 2/3 of the power must approve)
    gt-verifier committee submit --home DIR CHANGE.json
        send the approved change to the committee; it applies two blocks after the one that holds it
    gt-verifier committee show --home DIR
        the committee signing the next block, pending changes, added cards, removals (JSON)

Every command talks to the member's own running node (`--address` for another one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import grpc

from gentorrent.cli import UsageError, host_port, int_in
from gentorrent.crypto.keys import NodeKeys
from gentorrent.crypto.tls import TlsError, TlsIdentity, connect
from gentorrent.ledger import committee_changes as changes
from gentorrent.ledger.genesis import MAX_VALIDATOR_POWER, Genesis, GenesisError, GenesisValidator
from gentorrent.ledger.signed_tx import TxError
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc
from verifier.consensus.home import NodeConfig

RPC_S = 10.0


def add_parser(sub) -> None:
    c = sub.add_parser("committee", help="change the committee through the chain")
    csub = c.add_subparsers(dest="committee_cmd", required=True, metavar="ACTION")
    card = csub.add_parser("card", help="this node's member card (JSON)")
    card.add_argument("--home", required=True, help="the newcomer's home (gt-verifier init --join)")
    card.add_argument("--power", type=int_in(1, MAX_VALIDATOR_POWER), default=1, help="its voting power")
    card.add_argument("--advertise", type=host_port, help="the address members dial (default: the listen address)")
    card.set_defaults(func=cmd_card)
    pr = csub.add_parser("propose", help="write a change file, approved by this member")
    pr.add_argument("--home", required=True, help="this member's home")
    pr.add_argument("--out", required=True, help="the change file to write")
    what = pr.add_mutually_exclusive_group(required=True)
    what.add_argument("--add", metavar="CARD.json", help="add the member of this card")
    what.add_argument("--remove", metavar="KEY", help="remove the member with this public key (hex)")
    what.add_argument("--power", metavar="KEY=P", help="set a member's power")
    what.add_argument("--rotate", metavar="KEY", help="give the member with this key the key of --card")
    pr.add_argument("--card", metavar="CARD.json", help="with --rotate: the member's new card")
    pr.add_argument("--address", type=host_port, help="the verifier to ask (default: this home's)")
    pr.set_defaults(func=cmd_propose)
    ap = csub.add_parser("approve", help="add this member's approval to a change file")
    ap.add_argument("--home", required=True, help="this member's home")
    ap.add_argument("file", help="the change file (approved in place)")
    ap.set_defaults(func=cmd_approve)
    su = csub.add_parser("submit", help="send an approved change to the committee")
    su.add_argument("--home", required=True, help="this member's home (it signs the transaction)")
    su.add_argument("file", help="the approved change file")
    su.add_argument("--address", type=host_port, help="the verifier to send it to (default: this home's)")
    su.set_defaults(func=cmd_submit)
    sh = csub.add_parser("show", help="the committee as the chain has it (JSON)")
    sh.add_argument("--home", required=True, help="a member's home")
    sh.add_argument("--address", type=host_port, help="the verifier to ask (default: this home's)")
    sh.set_defaults(func=cmd_show)


def cmd_card(args: argparse.Namespace) -> int:
    home = Path(args.home)
    cfg, _ = _home(home)
    keys = NodeKeys.load_or_create(home)
    tls = TlsIdentity.load_or_create_self_signed(home, keys.identity)
    card = GenesisValidator(cfg.moniker, keys.identity.public_key, args.power, args.advertise or cfg.listen,
                            tls.cert_pem, keys.onion.public_key)
    try:
        changes.validate_card(changes.card_of(card), with_power=True)
    except TxError as exc:
        raise UsageError(f"this node cannot be a member as it is: {exc}") from None
    print(json.dumps(card.to_json(), indent=2, sort_keys=True))
    return 0


def cmd_propose(args: argparse.Namespace) -> int:
    home = Path(args.home)
    _, genesis = _home(home)
    change = pb.CommitteeChange()
    if args.add:
        change.add.CopyFrom(changes.card_of(_card(args.add)))
    elif args.remove:
        change.remove = _hex_key(args.remove)
    elif args.power:
        key, sep, power = args.power.partition("=")
        if not sep or not (power.isascii() and power.isdigit()):
            raise UsageError("--power wants KEY=POWER (a public key in hex, a positive integer)")
        change.power.CopyFrom(pb.ValidatorEntry(public_key=_hex_key(key), power=int(power)))
    else:
        if not args.card:
            raise UsageError("--rotate needs --card CARD.json (the member's new card)")
        change.rotate.CopyFrom(pb.Rotation(old_key=_hex_key(args.rotate), card=changes.card_of(_card(args.card))))
    committee = _query_json(home, args.address, "/committee")
    change.number = committee["changes"] + 1
    try:
        changes.validate(change)
    except TxError as exc:
        raise UsageError(f"the change is invalid: {exc}") from None
    identity = NodeKeys.load_or_create(home).identity
    change = changes.approve(genesis.chain_id, change, identity)
    Path(args.out).write_text(changes.dumps(genesis.chain_id, change))
    print(json.dumps({"file": args.out, "number": change.number, "summary": changes.describe(change),
                      "approved_by": [identity.public_key.hex()]}, indent=2))
    return 0


def cmd_approve(args: argparse.Namespace) -> int:
    home = Path(args.home)
    _, genesis = _home(home)
    chain_id, change = _load(args.file, genesis)
    change = changes.approve(chain_id, change, NodeKeys.load_or_create(home).identity)
    Path(args.file).write_text(changes.dumps(chain_id, change))
    print(json.dumps({"file": args.file, "summary": changes.describe(change),
                      "approved_by": [bytes(a.public_key).hex() for a in change.approvals]}, indent=2))
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    home = Path(args.home)
    _, genesis = _home(home)
    chain_id, change = _load(args.file, genesis)
    identity = NodeKeys.load_or_create(home).identity
    account = _query_json(home, args.address, f"/account/{identity.public_key.hex()}")
    tx = changes.change_tx(identity, change, account["last_sequence"] + 1, chain_id=chain_id)
    reply = asyncio.run(_call(home, args.address, lambda s: s.SubmitTx(pb.TxRequest(tx=tx), timeout=RPC_S)))
    if reply.code != 0:
        raise UsageError(f"the committee refused the change ({changes.describe(change)}): {reply.log}", code=1)
    print(json.dumps({"submitted": changes.describe(change), "tx_hash": reply.tx_hash.hex(),
                      "note": "it applies two blocks after the block that holds it; "
                              "`gt-verifier committee show` tells when"}, indent=2))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    print(json.dumps(_query_json(Path(args.home), args.address, "/committee"), indent=2, sort_keys=True))
    return 0


# --------------------------------------------------------------------------- helpers


def _home(home: Path) -> tuple[NodeConfig, Genesis]:
    try:
        return NodeConfig.load(home), Genesis.load(home)
    except (GenesisError, OSError, ValueError) as exc:
        raise UsageError(f"--home {home} is not a verifier's home ({exc}); make one with `gt-verifier init`") from None


def _card(path: str) -> GenesisValidator:
    try:
        return GenesisValidator.from_json(json.loads(Path(path).read_text()))
    except (OSError, ValueError, GenesisError) as exc:
        raise UsageError(f"{path}: not a member card ({exc}); make one with `gt-verifier committee card`") from None


def _hex_key(text: str) -> bytes:
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise UsageError(f"{text[:20]!r} is not a public key (64 hex digits; `gt-verifier committee show` lists them)")
    return key


def _load(path: str, genesis: Genesis) -> tuple[str, pb.CommitteeChange]:
    try:
        chain_id, change = changes.loads(Path(path).read_text())
    except (OSError, GenesisError) as exc:
        raise UsageError(f"{path}: {exc}") from None
    if chain_id != genesis.chain_id:
        raise UsageError(f"{path} is a change of chain {chain_id!r}, this member's is {genesis.chain_id!r}")
    return chain_id, change


def _query_json(home: Path, address: str | None, path: str) -> dict:
    reply = asyncio.run(_call(home, address, lambda s: s.Query(pb.QueryRequest(path=path), timeout=RPC_S)))
    if reply.code != 0:
        raise UsageError(f"the verifier answered {path} with code {reply.code}: {reply.log}", code=1)
    return json.loads(reply.value)


async def _call(home: Path, address: str | None, fn):
    cfg = NodeConfig.load(home)
    tls = TlsIdentity.load_or_create_self_signed(home, NodeKeys.load_or_create(home).identity)
    try:
        channel = await connect(address or cfg.listen, tls.cert_pem, timeout=RPC_S)
    except (TlsError, OSError) as exc:
        raise UsageError(f"the verifier does not answer ({exc}); is `gt-verifier start --home {home}` running?",
                         code=1) from None
    try:
        return await fn(rpc.VerifierStub(channel))
    except grpc.aio.AioRpcError as exc:
        raise UsageError(f"the verifier refused: {exc.code().name}: {exc.details()}", code=1) from None
    finally:
        await channel.close()
