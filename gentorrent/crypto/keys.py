"""Node keys: the Ed25519 identity, the X25519 onion key, and how they live on disk.

A node *is* its Ed25519 key: the node id is SHA-256 of the raw public key, so it can be
checked by anyone holding the key and cannot be chosen freely. The X25519 onion key is a
separate key (never derive one from the other: the two are used by different protocols and
a compromise of the onion key must not let anyone sign as the node). The committee's registry
binds both keys and the TLS certificate to the node id.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

NODE_ID_BYTES = 32
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64

_RAW = serialization.Encoding.Raw
_RAW_PUB = serialization.PublicFormat.Raw
_PEM = serialization.Encoding.PEM
_PKCS8 = serialization.PrivateFormat.PKCS8
_NOENC = serialization.NoEncryption()


class KeyFormatError(ValueError):
    """A key file or key encoding is malformed."""


class SignatureError(ValueError):
    """A signature does not verify under the claimed key."""


class KeyFilePermissionError(KeyFormatError):
    """A private key file that group or others may read: refused, never loaded silently.

    Refused rather than repaired: a key that was readable by others may have been read, and
    only its operator can judge that (chmod if nobody else could, a new node home if someone
    could). Repairing it quietly would hide exactly the event worth knowing about.
    """


def node_id_of(public_key: bytes) -> bytes:
    """The node id bound to an Ed25519 public key (raw 32 bytes)."""
    if len(public_key) != PUBLIC_KEY_BYTES:
        raise KeyFormatError(f"an Ed25519 public key is {PUBLIC_KEY_BYTES} bytes, got {len(public_key)}")
    return hashlib.sha256(public_key).digest()


def verify_signature(public_key: bytes, signature: bytes, message: bytes) -> None:
    """Raise SignatureError unless `signature` is a valid Ed25519 signature of `message`."""
    if len(signature) != SIGNATURE_BYTES:
        raise SignatureError(f"an Ed25519 signature is {SIGNATURE_BYTES} bytes, got {len(signature)}")
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError) as exc:
        raise SignatureError("signature does not verify") from exc


def is_valid_signature(public_key: bytes, signature: bytes, message: bytes) -> bool:
    try:
        verify_signature(public_key, signature, message)
    except (SignatureError, KeyFormatError):
        return False
    return True


@dataclass(frozen=True)
class Identity:
    """An Ed25519 signing identity."""

    private_key: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> "Identity":
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> "Identity":
        """Deterministic identity, for seeded simulations and golden test vectors only."""
        if len(seed) != 32:
            raise KeyFormatError("an Ed25519 seed is 32 bytes")
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    # derived once per identity: a model node names itself in every chunk it streams, and each
    # derivation was a public-key computation and a hash (45 us a token)
    @cached_property
    def public_key(self) -> bytes:
        return self.private_key.public_key().public_bytes(_RAW, _RAW_PUB)

    @cached_property
    def node_id(self) -> bytes:
        return node_id_of(self.public_key)

    @cached_property
    def node_id_hex(self) -> str:
        return self.node_id.hex()

    def sign(self, message: bytes) -> bytes:
        return self.private_key.sign(message)

    def seed(self) -> bytes:
        """Raw private seed; only for writing key files and exporting to CometBFT."""
        return self.private_key.private_bytes(_RAW, serialization.PrivateFormat.Raw, _NOENC)

    def to_pem(self) -> bytes:
        return self.private_key.private_bytes(_PEM, _PKCS8, _NOENC)

    @classmethod
    def from_pem(cls, data: bytes) -> "Identity":
        key = _load_private_pem(data)
        if not isinstance(key, Ed25519PrivateKey):
            raise KeyFormatError("not an Ed25519 private key")
        return cls(key)

    def __repr__(self) -> str:  # never print key material
        return f"Identity(node_id={self.node_id_hex[:16]}…)"


@dataclass(frozen=True)
class OnionKey:
    """An X25519 key for onion establishment (ARCHITECTURE.md §3.2)."""

    private_key: X25519PrivateKey

    @classmethod
    def generate(cls) -> "OnionKey":
        return cls(X25519PrivateKey.generate())

    @property
    def public_key(self) -> bytes:
        return self.private_key.public_key().public_bytes(_RAW, _RAW_PUB)

    def to_pem(self) -> bytes:
        return self.private_key.private_bytes(_PEM, _PKCS8, _NOENC)

    @classmethod
    def from_pem(cls, data: bytes) -> "OnionKey":
        key = _load_private_pem(data)
        if not isinstance(key, X25519PrivateKey):
            raise KeyFormatError("not an X25519 private key")
        return cls(key)

    def __repr__(self) -> str:
        return f"OnionKey(public={self.public_key.hex()[:16]}…)"


def x25519_public(raw: bytes) -> X25519PublicKey:
    if len(raw) != PUBLIC_KEY_BYTES:
        raise KeyFormatError(f"an X25519 public key is {PUBLIC_KEY_BYTES} bytes, got {len(raw)}")
    return X25519PublicKey.from_public_bytes(raw)


def _load_private_pem(data: bytes):
    try:
        return serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFormatError(f"cannot read private key: {exc}") from exc


# --------------------------------------------------------------------------- on disk


@dataclass(frozen=True)
class NodeKeys:
    """The key material of one node home directory."""

    identity: Identity
    onion: OnionKey

    IDENTITY_FILE = "identity.key.pem"
    ONION_FILE = "onion.key.pem"

    @classmethod
    def load_or_create(cls, home: Path) -> "NodeKeys":
        """Keys of the node at `home`, created on first use (0600 from the first byte on)."""
        home = Path(home)
        home.mkdir(parents=True, exist_ok=True)
        identity = Identity.from_pem(read_or_create_private(home / cls.IDENTITY_FILE,
                                                            lambda: Identity.generate().to_pem()))
        onion = OnionKey.from_pem(read_or_create_private(home / cls.ONION_FILE, lambda: OnionKey.generate().to_pem()))
        return cls(identity, onion)


def read_private(path: Path) -> bytes:
    """A private key file's bytes; KeyFilePermissionError if group or others may read it."""
    path = Path(path)
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise KeyFilePermissionError(
            f"private key file {path} has mode {mode:o}: group or others may read it, so it is not "
            f"loaded. If nobody else can have read it, run `chmod 600 {path}` and start again; "
            "otherwise treat the key as leaked and start from a new node home")
    return path.read_bytes()


def write_private(path: Path, data: bytes) -> bool:
    """Create `path` holding `data`, mode 0600 from its first byte, atomically: other readers
    see no file or the whole file, never a partial key. False if `path` already existed
    (another process made it first: its key wins and must be read back)."""
    path = Path(path)
    tmp = _synced_private_tmp(path, data)
    try:
        try:
            os.link(tmp, path)  # atomic, and never replaces an existing key
        except FileExistsError:
            return False
        return True
    finally:
        tmp.unlink(missing_ok=True)


def replace_private(path: Path, data: bytes) -> None:
    """Write `path` (mode 0600 from its first byte), replacing what it held atomically: a crash
    leaves the old file or the new one, never a part (a node's own state that others must not
    read, such as its entry guards)."""
    path = Path(path)
    tmp = _synced_private_tmp(path, data)
    try:
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _synced_private_tmp(path: Path, data: bytes) -> Path:
    """`data` in a temporary file beside `path`, mode 0600 from its first byte, on disk (fsync):
    what both writers above then move into place."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def read_or_create_private(path: Path, make) -> bytes:
    """The private key at `path`, made by `make()` and written 0600 on first use."""
    path = Path(path)
    if not path.exists():
        write_private(path, make())  # False: another process was first; read its key back
    return read_private(path)
