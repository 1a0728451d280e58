"""The committee's model catalogue (pure): which weights a model name means, and how to run them.

A model is its name plus the digest of its weights files (`model_node.catalogue.weights_digest`).
The catalogue is part of the replicated state (the meta section, so the app hash covers it):
the genesis may list entries (`app_state.catalogue`), and a committee member adds one with a
`catalogue_add` transaction, naming also the engine options a node and the verifiers'
reference engines run it with (dtype, quantization, KV-cache dtype, context length). So a new
model, a quantized checkpoint included, needs no code change: a member lists it, operators
serve it with `gt-model serve --model NAME --weights DIR`.

The rule it enforces: a model node registering a name the catalogue lists must give the
digest of one of that name's entries (an operator with other weights under the name is told
at once). A name the catalogue does not list is registered as before (networks that keep no
catalogue). A digest is the node's claim, not a proof of what it runs: a cheater claims the
honest digest; catching it is the verification epochs' work.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from gentorrent.ledger.signed_tx import CODE_INVALID_FIELD, CODE_NOT_LISTED, TxError
from gentorrent.wire import gentorrent_pb2 as pb

DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
_MODEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
_QUANT_RE = re.compile(r"[a-z0-9_-]{0,32}")
DTYPES = ("", "auto", "float32", "float16", "bfloat16")
KV_CACHE_DTYPES = ("", "auto", "fp8", "fp8_e4m3", "fp8_e5m2")
MAX_ENTRIES = 256  # a bound on the meta section every light client reads
MAX_MODEL_LEN = 1 << 21
FIELDS = ("model", "weights_digest", "dtype", "quantization", "kv_cache_dtype", "max_model_len")
#: the engine options that change the numbers a reference scores with (a context length does not)
SCORING_OPTIONS = ("dtype", "quantization", "kv_cache_dtype")


def validate_digest(digest: str, what: str = "weights_digest") -> None:
    if not DIGEST_RE.fullmatch(digest):
        raise TxError(CODE_INVALID_FIELD, f"{what} must be 'sha256:' and 64 lower-case hex digits")


def validate_entry(e: pb.CatalogueEntry) -> None:
    """Every field of a catalogue entry within its bounds (TxError otherwise)."""
    if not _MODEL_RE.fullmatch(e.model):
        raise TxError(CODE_INVALID_FIELD, "a catalogue entry's model is 1..128 chars of [A-Za-z0-9._:/-]")
    validate_digest(e.weights_digest)
    if e.dtype not in DTYPES:
        raise TxError(CODE_INVALID_FIELD, f"dtype must be one of {', '.join(d or '(default)' for d in DTYPES)}")
    if not _QUANT_RE.fullmatch(e.quantization):
        raise TxError(CODE_INVALID_FIELD, "quantization is vLLM's method name ([a-z0-9_-], at most 32)")
    if e.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise TxError(CODE_INVALID_FIELD, f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES[1:])}")
    if not 0 <= e.max_model_len <= MAX_MODEL_LEN:
        raise TxError(CODE_INVALID_FIELD, f"max_model_len must be 0 (default) to {MAX_MODEL_LEN}")


def entry_of(fields: dict) -> pb.CatalogueEntry:
    """A catalogue entry from JSON-like fields (a genesis file, a command line)."""
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise TxError(CODE_INVALID_FIELD, f"unknown catalogue fields {sorted(unknown)}; known: {', '.join(FIELDS)}")
    try:
        entry = pb.CatalogueEntry(**{k: v for k, v in fields.items() if v is not None})
    except (TypeError, ValueError) as exc:
        raise TxError(CODE_INVALID_FIELD, f"a catalogue entry: {exc}") from None
    validate_entry(entry)
    return entry


def entries_of_app_state(app_state: Any) -> list[pb.CatalogueEntry]:
    """`app_state.catalogue`: a list of entries (each FIELDS), or none."""
    listed = app_state.get("catalogue", []) if isinstance(app_state, dict) else []
    if not isinstance(listed, list) or len(listed) > MAX_ENTRIES or not all(isinstance(e, dict) for e in listed):
        raise TxError(CODE_INVALID_FIELD, f"app_state.catalogue must be a list of at most {MAX_ENTRIES} objects")
    entries = [entry_of(e) for e in listed]
    if len({(e.model, e.weights_digest) for e in entries}) != len(entries):
        raise TxError(CODE_INVALID_FIELD, "app_state.catalogue lists one model and digest twice")
    return entries


def as_json(e: pb.CatalogueEntry) -> dict:
    return {k: getattr(e, k) for k in FIELDS + ("added_height",)}


def check_addition(catalogue: Iterable[pb.CatalogueEntry], entry: pb.CatalogueEntry) -> None:
    entries = list(catalogue)
    if any(e.model == entry.model and e.weights_digest == entry.weights_digest for e in entries):
        raise TxError(CODE_INVALID_FIELD, f"the catalogue already lists {entry.model} with {entry.weights_digest}")
    if len(entries) >= MAX_ENTRIES:
        raise TxError(CODE_INVALID_FIELD, f"the catalogue holds its {MAX_ENTRIES} entries")


def check_listed(catalogue: Iterable[pb.CatalogueEntry], model: str, digest: str) -> None:
    """A registration of `model` with weights `digest` (TxError CODE_NOT_LISTED when the
    catalogue lists the name with other weights only)."""
    digests = {e.weights_digest for e in catalogue if e.model == model}
    if digests and digest not in digests:
        given = f"weights {digest}" if digest else "no weights digest"
        raise TxError(CODE_NOT_LISTED, f"the committee's catalogue lists {model} with other weights than these "
                                       f"({given}; listed: {', '.join(sorted(digests))}): serve the listed "
                                       "checkpoint, or ask a committee member to add yours (gt-verifier catalogue add)")


def listed_as(catalogue: Iterable[pb.CatalogueEntry], model: str, digest: str) -> pb.CatalogueEntry | None:
    """The catalogue's entry for `model` with weights `digest`, if it lists them."""
    return next((e for e in catalogue if e.model == model and e.weights_digest == digest), None) if digest else None


def reference_mismatch(reference: pb.CatalogueEntry, catalogue: Iterable[pb.CatalogueEntry], model: str,
                       digest: str) -> str | None:
    """Why a reference running `reference` may not score a reply of a node registered as
    `model` with weights `digest` (None: it may).

    A model is its weights: when the catalogue lists the node's model and digest, the
    reference must run those weights, under whatever name, and every scoring option the entry
    names (a member whose reference differs abstains; it never punishes an honest node for
    its own set-up). A claim the catalogue does not list is the node's word only (a cheater
    would claim weights no reference runs, to be never scored), so it is held to its model
    name, as before a catalogue existed.
    """
    entry = listed_as(catalogue, model, digest)
    if entry is None:
        return None if reference.model == model else f"the reference serves {reference.model!r}, not {model!r}"
    if reference.weights_digest != entry.weights_digest:
        return (f"the reference runs weights {reference.weights_digest or '(no digest)'}, the catalogue lists "
                f"{model} as {entry.weights_digest}")
    for option in SCORING_OPTIONS:
        wanted, running = getattr(entry, option), getattr(reference, option)
        if wanted not in ("", "auto") and running != wanted:
            return f"the catalogue runs {model} with {option} {wanted}, the reference with {running or '(default)'}"
    return None
