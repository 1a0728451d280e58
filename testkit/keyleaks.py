"""Finding a node's secret key material in logs (reliability: "no secret key material in logs").

Every node home -- user/relay (gt-user), model node, verifier -- keeps its private keys in
the same files: the Ed25519 identity and X25519 onion key (gentorrent.crypto.keys.NodeKeys)
and the TLS key (gentorrent.crypto.tls). A leak could print a key in whichever encoding the
code at hand uses -- raw hex, base64, the PEM text -- so each key gives one needle per
encoding, and a scan names the file and the needle's label, never the secret itself.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gentorrent.crypto import tls
from gentorrent.crypto.keys import NodeKeys

KEY_FILES = (NodeKeys.IDENTITY_FILE, NodeKeys.ONION_FILE, tls.KEY_FILE)
PEM_MARKER = "PRIVATE KEY-----"  # any PEM private key, whoever's
MIN_PEM_LINE = 24  # shorter PEM body lines (the tail of a key) could match by chance


@dataclass(frozen=True)
class Needle:
    """One encoding of one secret; `label` is what a hit reports (e.g. "relay3 onion hex")."""

    label: str
    text: str
    case_sensitive: bool = True


def raw_private_bytes(pem: bytes) -> bytes:
    """The raw private key inside a PEM file: Ed25519 seed, X25519 scalar, EC private value."""
    key = serialization.load_pem_private_key(pem, password=None)
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return key.private_numbers().private_value.to_bytes((key.curve.key_size + 7) // 8, "big")
    return key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                             serialization.NoEncryption())


def key_needles(pem: bytes, label: str) -> list[Needle]:
    """hex, base64 and url-safe base64 of the raw key, and the PEM body lines."""
    raw = raw_private_bytes(pem)
    out = [Needle(f"{label} hex", raw.hex(), case_sensitive=False),
           Needle(f"{label} base64", base64.b64encode(raw).decode().rstrip("=")),
           Needle(f"{label} base64url", base64.urlsafe_b64encode(raw).decode().rstrip("="))]
    body = [line.strip() for line in pem.decode().splitlines() if line.strip() and "-----" not in line]
    out += [Needle(f"{label} pem line {i}", line) for i, line in enumerate(body) if len(line) >= MIN_PEM_LINE]
    return out


def home_secrets(home: Path, label: str | None = None) -> list[Needle]:
    """Needles for every private key file present in a node home (any role)."""
    home = Path(home)
    label = label or home.name
    out = []
    for name in KEY_FILES:
        path = home / name
        if path.exists():
            out += key_needles(path.read_bytes(), f"{label} {name.split('.')[0]}")
    if not out:
        raise FileNotFoundError(f"no private key file ({', '.join(KEY_FILES)}) in {home}")
    return out


def scan_for_secrets(paths: Iterable[Path], secrets: Iterable[Needle | str]) -> list[str]:
    """"file: label" for every needle found in a file, plus any PEM private key header.
    A plain string counts as a hex needle (matched in any case)."""
    needles = [s if isinstance(s, Needle) else Needle("hex key", s, case_sensitive=False) for s in secrets if s]
    hits = []
    for path in paths:
        text = Path(path).read_text(errors="replace")
        low = text.lower()
        if PEM_MARKER.lower() in low:
            hits.append(f"{path}: PEM private key")
        hits += [f"{path}: {n.label}" for n in needles
                 if (n.text in text if n.case_sensitive else n.text.lower() in low)]
    return hits


def leak_report(logs: Iterable[Path], homes: Iterable[Path]) -> dict:
    """Every log scanned for the keys of every home (run once the processes have stopped):
    what a scenario or benchmark reports, so a clean result also shows how much was read."""
    logs = sorted(Path(p) for p in logs)
    needles = [n for home in homes if Path(home).exists() for n in home_secrets(home)]
    return {"logs": len(logs), "log_bytes": sum(p.stat().st_size for p in logs), "needles": len(needles),
            "hits": scan_for_secrets(logs, needles)}
