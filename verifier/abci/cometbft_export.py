"""Turn a verifier home (our genesis + identity key) into a CometBFT v0.38 home.

    python -m verifier.abci.cometbft_export --home ~/.gentorrent/verifier0 --out ~/.cometbft/v0

writes OUT/config/genesis.json (from `gentorrent.ledger.genesis.Genesis`), OUT/config/priv_validator_key.json
(the verifier's own Ed25519 identity, so the committee keys a light client trusts are the
keys that sign CometBFT's precommits), and, only where they do not exist yet,
OUT/data/priv_validator_state.json (never overwritten: it is what stops CometBFT from
double-signing) and OUT/config/node_key.json (a fresh P2P key, distinct from the validator key).
Run `cometbft init --home OUT` first (or after: it keeps existing files) for config.toml; see
deploy/cometbft/README.md.

JSON shapes are CometBFT's amino-JSON: int64 as strings, keys as base64 with
"tendermint/PubKeyEd25519" / "tendermint/PrivKeyEd25519" types, the private key value being
the 64-byte seed || public key, addresses as upper-case hex of SHA-256(public key)[:20].
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from gentorrent.config import WIRE
from gentorrent.crypto.keys import Identity, KeyFormatError, NodeKeys
from verifier.abci.app import APP_VERSION
from gentorrent.ledger.genesis import Genesis, GenesisError

PUB_TYPE = "tendermint/PubKeyEd25519"
PRIV_TYPE = "tendermint/PrivKeyEd25519"
#: block size limit for the committee's chain: a few MiB of registrations is plenty
MAX_BLOCK_BYTES = WIRE.max_message_bytes


def address_of(public_key: bytes) -> str:
    """CometBFT's address of an Ed25519 key: upper-case hex of SHA-256(key)[:20]."""
    return hashlib.sha256(public_key).digest()[:20].hex().upper()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def rfc3339(time_ms: int) -> str:
    t = dt.datetime.fromtimestamp(time_ms / 1000, tz=dt.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{time_ms % 1000:03d}000Z"


def cometbft_genesis(genesis: Genesis) -> dict[str, Any]:
    return {
        "genesis_time": rfc3339(genesis.genesis_time_ms),
        "chain_id": genesis.chain_id,
        "initial_height": "1",
        "consensus_params": {
            "block": {"max_bytes": str(MAX_BLOCK_BYTES), "max_gas": "-1"},
            "evidence": {"max_age_num_blocks": "100000", "max_age_duration": "172800000000000",
                         "max_bytes": "1048576"},
            "validator": {"pub_key_types": ["ed25519"]},
            "version": {"app": str(APP_VERSION)},
            "abci": {"vote_extensions_enable_height": "0"},
        },
        "validators": [
            {"address": address_of(v.public_key), "pub_key": {"type": PUB_TYPE, "value": _b64(v.public_key)},
             "power": str(v.power), "name": v.name}
            for v in genesis.validators
        ],
        "app_hash": "",
        "app_state": genesis.app_state,
    }


def priv_validator_key(identity: Identity) -> dict[str, Any]:
    public = identity.public_key
    return {
        "address": address_of(public),
        "pub_key": {"type": PUB_TYPE, "value": _b64(public)},
        "priv_key": {"type": PRIV_TYPE, "value": _b64(identity.seed() + public)},
    }


def node_key(identity: Identity) -> dict[str, Any]:
    return {"priv_key": {"type": PRIV_TYPE, "value": _b64(identity.seed() + identity.public_key)}}


def node_id(identity: Identity) -> str:
    """CometBFT's P2P node id (lower-case hex address of the node key), for persistent_peers."""
    return address_of(identity.public_key).lower()


def export(home: Path, out: Path, genesis_path: Path | None = None, key_path: Path | None = None) -> dict[str, str]:
    """Write the CometBFT files; returns {what: path} of what was written or kept."""
    genesis = Genesis.load(genesis_path or home)
    key_file = key_path or home / NodeKeys.IDENTITY_FILE
    try:
        identity = Identity.from_pem(key_file.read_bytes())
    except OSError as exc:
        raise KeyFormatError(f"cannot read identity key {key_file}: {exc}") from exc
    if identity.public_key not in {v.public_key for v in genesis.validators}:
        print(f"warning: {key_file} is not a validator of {genesis.chain_id}; exporting it as a full node key",
              file=sys.stderr)
    config, data = out / "config", out / "data"
    config.mkdir(parents=True, exist_ok=True)
    data.mkdir(parents=True, exist_ok=True)
    written = {}
    written["genesis"] = _write_json(config / "genesis.json", cometbft_genesis(genesis), overwrite=True)
    written["priv_validator_key"] = _write_json(config / "priv_validator_key.json", priv_validator_key(identity),
                                                overwrite=True, secret=True)
    written["priv_validator_state"] = _write_json(data / "priv_validator_state.json",
                                                  {"height": "0", "round": 0, "step": 0}, overwrite=False)
    nk_path = config / "node_key.json"
    if nk_path.exists():
        p2p = _read_node_key(nk_path)
    else:
        p2p = Identity.generate()
        _write_json(nk_path, node_key(p2p), overwrite=False, secret=True)
    written["node_key"] = str(nk_path)
    written["node_id"] = node_id(p2p)
    return written


def _read_node_key(path: Path) -> Identity:
    value = base64.b64decode(json.loads(path.read_text())["priv_key"]["value"])
    return Identity.from_seed(value[:32])


def _write_json(path: Path, obj: Any, overwrite: bool, secret: bool = False) -> str:
    if path.exists() and not overwrite:
        return str(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if secret else 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verifier.abci.cometbft_export", description=__doc__.split("\n")[0])
    parser.add_argument("--home", type=Path, required=True, help="verifier home (genesis.json, identity.key.pem)")
    parser.add_argument("--out", type=Path, required=True, help="CometBFT home to write (config/, data/)")
    parser.add_argument("--genesis", type=Path, help="our genesis.json, if not in --home")
    parser.add_argument("--key", type=Path, help="identity key PEM, if not --home/identity.key.pem")
    args = parser.parse_args(argv)
    try:
        written = export(args.home, args.out, args.genesis, args.key)
    except (GenesisError, KeyFormatError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for what, path in written.items():
        print(f"{what}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
