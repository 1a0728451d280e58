"""The CometBFT export: our genesis and identity key become CometBFT v0.38 JSON files."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import re

import pytest

from gentorrent.crypto.keys import Identity, NodeKeys
from gentorrent.crypto.tls import make_self_signed
from verifier.abci import cometbft_export as export
from gentorrent.ledger.genesis import Genesis, GenesisError, GenesisValidator

MEMBERS = [Identity.from_seed(bytes([40 + i]) * 32) for i in range(4)]


def make_home(tmp_path, index: int = 0):
    genesis = Genesis(
        chain_id="gt-devnet", genesis_time_ms=1_764_000_000_123,
        validators=tuple(GenesisValidator(f"v{i}", m.public_key, 10, f"127.0.0.1:{7000 + i}",
                                          make_self_signed(m).cert_pem) for i, m in enumerate(MEMBERS)),
    )
    home = tmp_path / f"v{index}"
    home.mkdir()
    genesis.save(home)
    (home / NodeKeys.IDENTITY_FILE).write_bytes(MEMBERS[index].to_pem())
    return home, genesis


def test_genesis_round_trips_and_rejects_bad_files(tmp_path):
    home, genesis = make_home(tmp_path)
    assert Genesis.load(home) == genesis
    bad = json.loads(genesis.dumps())
    bad["validators"][1]["public_key"] = base64.b64encode(b"short").decode()
    with pytest.raises(GenesisError):
        Genesis.loads(json.dumps(bad))
    bad = json.loads(genesis.dumps())
    bad["validators"].append(bad["validators"][0])
    with pytest.raises(GenesisError, match="duplicate"):
        Genesis.loads(json.dumps(bad))
    with pytest.raises(GenesisError, match="unknown"):
        Genesis.loads(json.dumps({**json.loads(genesis.dumps()), "extra": 1}))
    assert json.loads(genesis.app_state_bytes()) == {}


def test_export_writes_cometbft_shapes(tmp_path):
    home, genesis = make_home(tmp_path, index=2)
    out = tmp_path / "cmt"
    assert export.main(["--home", str(home), "--out", str(out)]) == 0

    g = json.loads((out / "config" / "genesis.json").read_text())
    assert g["chain_id"] == "gt-devnet" and g["initial_height"] == "1" and g["app_hash"] == ""
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", g["genesis_time"])
    parsed = dt.datetime.strptime(g["genesis_time"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.timezone.utc)
    assert int(parsed.timestamp() * 1000) == genesis.genesis_time_ms
    cp = g["consensus_params"]
    assert cp["validator"]["pub_key_types"] == ["ed25519"]
    assert all(isinstance(v, str) for v in (cp["block"]["max_bytes"], cp["block"]["max_gas"],
                                            cp["evidence"]["max_age_num_blocks"], cp["version"]["app"]))
    assert len(g["validators"]) == 4
    for v, member in zip(g["validators"], MEMBERS):
        assert v["pub_key"] == {"type": "tendermint/PubKeyEd25519",
                                "value": base64.b64encode(member.public_key).decode()}
        assert v["address"] == hashlib.sha256(member.public_key).digest()[:20].hex().upper()
        assert v["power"] == "10"

    pv = json.loads((out / "config" / "priv_validator_key.json").read_text())
    me = MEMBERS[2]
    assert pv["address"] == g["validators"][2]["address"]
    assert pv["pub_key"] == g["validators"][2]["pub_key"]
    assert pv["priv_key"]["type"] == "tendermint/PrivKeyEd25519"
    priv = base64.b64decode(pv["priv_key"]["value"])
    assert len(priv) == 64 and priv[32:] == me.public_key
    assert Identity.from_seed(priv[:32]).public_key == me.public_key  # the seed really is the key
    assert (out / "config" / "priv_validator_key.json").stat().st_mode & 0o077 == 0

    state = json.loads((out / "data" / "priv_validator_state.json").read_text())
    assert state == {"height": "0", "round": 0, "step": 0}
    nk = json.loads((out / "config" / "node_key.json").read_text())
    assert len(base64.b64decode(nk["priv_key"]["value"])) == 64
    assert base64.b64decode(nk["priv_key"]["value"])[32:] != me.public_key  # P2P key is not the validator key


def test_export_never_resets_the_signing_state(tmp_path):
    home, _ = make_home(tmp_path)
    out = tmp_path / "cmt"
    first = export.export(home, out)
    state_path = out / "data" / "priv_validator_state.json"
    state_path.write_text(json.dumps({"height": "57", "round": 0, "step": 3}))
    second = export.export(home, out)
    assert json.loads(state_path.read_text())["height"] == "57"
    assert first["node_id"] == second["node_id"]  # node key kept too


def test_export_fails_clearly_without_a_key(tmp_path, capsys):
    home, _ = make_home(tmp_path)
    (home / NodeKeys.IDENTITY_FILE).unlink()
    assert export.main(["--home", str(home), "--out", str(tmp_path / "o")]) == 2
    assert "identity key" in capsys.readouterr().err
