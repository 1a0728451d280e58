"""Dishonest model nodes, for the verification tests, the devnet and the detection benchmark.

`python -m testkit.dishonest_model --dishonest KIND serve --model smollm2-135m ...` runs the real
`gt-model serve` with one of these plugged in (model_node.cli.Serving, testkit/dishonest_model.py):
it serves something cheaper than what it claims while signing every reply as the claimed model,
as a cheating volunteer would:

    pruned       half the decoder layers of the claimed model (variants.prune_layers)
    noisy        the claimed model with Gaussian noise on its weights (variants.add_noise)
    other-model  a different real model (gemma3-270m) whose text is re-tokenised with the claimed
                 model's tokenizer, so the signed token ids look like the claimed model's
    random       random tokens of the claimed vocabulary (no model run at all: it loads the
                 claimed model's tokenizer and no vLLM engine, as a cheater would)
    replay       the answer it gave to an earlier, different prompt (the first one is honest)
    selective    honest on what it guesses are challenges, random tokens on everything else; the
                 guess (testkit/selective.py) sums the log-odds of the request's shape against
                 the public challenge shape, of a text classifier trained on challenges it
                 generated itself from the public code (testkit/cheater_training.py writes it to
                 GT_SELECTIVE_TEXT_MODEL), of a lookup of the asked message in the public corpus
                 (GT_SELECTIVE_LOOKUP_THRESHOLD), and of the public epoch phase

Weight cheats need only other weights (`prepare`); behavioural cheats wrap the node's
LocalGenerator (`make_generator`), so the rest of the node (overlay intake, status) is unchanged.
`Cheat` is both, as the hook `gt-model serve` takes (model_node.cli.Serving).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import AsyncIterator

from gentorrent import receipts
from gentorrent.config import EPOCH_RUN
from testkit.selective import ChallengeDetector, CorpusLookup, NoLookup, PublicChallengeShape, TextModel
from model_node.cli import Serving
from model_node.engine import Engine, LoadStats, context_length
from model_node.service import LocalGenerator, PreparedJob
from gentorrent.wire import gentorrent_pb2 as pb

KINDS = ("pruned", "noisy", "other-model", "random", "replay", "selective")
OTHER_MODEL = "gemma3-270m"
NOISE_SIGMA = 0.5  # relative to each tensor's spread (as the devnet's noisy variant)


@dataclass(frozen=True)
class Plan:
    """What to load for a dishonest node: catalogue name and weights folder (None: default)."""

    load_model: str
    weights: Path | None


def prepare(kind: str, claimed: str, weights: Path | None = None) -> Plan:
    """Build the cheaper weights once (into the model cache) and say what to load."""
    from model_node import catalogue
    from testkit import variants

    if kind not in KINDS:
        raise ValueError(f"unknown dishonest kind {kind!r}; one of {', '.join(KINDS)}")
    if kind == "other-model":
        return Plan(OTHER_MODEL, None)
    if kind in ("pruned", "noisy"):
        target = catalogue.cache_root() / "variants" / f"{claimed}-{kind}"
        if not (target / "config.json").exists():
            honest = Path(weights) if weights else catalogue.resolve(claimed).path
            if kind == "pruned":
                variants.prune_layers(honest, target)
            else:
                variants.add_noise(honest, target, relative_sigma=NOISE_SIGMA, seed=1)
        return Plan(claimed, target)
    return Plan(claimed, weights)


def make_generator(kind: str, honest: LocalGenerator, claimed: str) -> LocalGenerator:
    """The node's generator for `kind` (weight cheats: the honest code path on cheap weights)."""
    if kind == "other-model":
        return RetokenisingGenerator(honest.engine, honest.identity, honest.params, claimed=claimed)
    if kind in ("random", "replay", "selective"):
        return BehaviourGenerator(honest.engine, honest.identity, honest.params, kind=kind,
                                  detector=selective_detector() if kind == "selective" else None)
    return honest


class Cheat(Serving):
    """A dishonest `gt-model serve`: loads what `prepare` says, answers with `make_generator`'s
    generator, and claims the model it was asked to serve."""

    honest = False

    def __init__(self, kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown dishonest kind {kind!r}; one of {', '.join(KINDS)}")
        self.kind = kind

    def weights(self, model: str, weights: Path | None) -> tuple[str, Path | None]:
        plan = prepare(self.kind, model, weights)
        return plan.load_model, plan.weights

    async def start_engine(self, model, params) -> Engine:
        if self.kind != "random":
            return await super().start_engine(model, params)
        t0 = time.monotonic()
        engine = Engine(await asyncio.to_thread(TokenizerOnly, model.path), model.name,
                        context_length(model, params.max_model_len), LoadStats(), params)
        engine.startup_s = time.monotonic() - t0
        return engine

    def generator(self, honest: LocalGenerator, claimed: str) -> LocalGenerator:
        loaded = honest.engine.model
        honest.engine.model = claimed  # it claims the model whatever it really runs
        logging.getLogger("gt-model").warning("DISHONEST node (%s): serving %s as %s", self.kind, loaded, claimed)
        return make_generator(self.kind, honest, claimed)


def selective_detector() -> ChallengeDetector:
    """The selective cheater's detector, from what a cheater can build out of public data.

    GT_SELECTIVE_TEXT_MODEL: its trained text model (none: the text tells it nothing);
    GT_SELECTIVE_CHALLENGE_MAX_TOKENS: the reply cap a committee publishes for its challenges
    (gt-verifier start --challenge-max-tokens; the devnet's), which gives them away;
    GT_SELECTIVE_SHAPE=none: challenges are drawn from the same shapes as user asks (a public
    traffic model), so the shape tells it nothing (the detection bench's challenges are);
    GT_SELECTIVE_LOOKUP_THRESHOLD: store the public challenge pool and take a prompt whose
    similarity to a message of it exceeds this, short of a verbatim copy, for a challenge
    (`corpus_lookup`);
    GT_SELECTIVE_THRESHOLD: the summed log-odds above which it answers honestly (default 0),
    which the cheater sets at the share of its users' asks it is willing to serve honestly.
    """
    text_path = os.environ.get("GT_SELECTIVE_TEXT_MODEL")
    text = TextModel.load(Path(text_path)) if text_path else TextModel()
    cap = os.environ.get("GT_SELECTIVE_CHALLENGE_MAX_TOKENS")  # the committee's published reply cap
    params = EPOCH_RUN if not cap else replace(EPOCH_RUN, challenge_max_tokens=int(cap))
    shape = NoShape() if os.environ.get("GT_SELECTIVE_SHAPE") == "none" else PublicChallengeShape(params)
    similar = os.environ.get("GT_SELECTIVE_LOOKUP_THRESHOLD")
    lookup = corpus_lookup(float(similar)) if similar else NoLookup()
    return ChallengeDetector(shape=shape, text=text, lookup=lookup,
                             threshold=float(os.environ.get("GT_SELECTIVE_THRESHOLD", "0")))


def corpus_lookup(threshold: float) -> CorpusLookup:
    """The public challenge pool (the corpus split is public code), stored for lookups: every
    user message a challenge may ask. Seconds to build; the index holds about 110 MB."""
    from gentorrent.traffic.corpus import load_corpus
    from gentorrent.traffic.model import TrafficPool

    return CorpusLookup(TrafficPool.build(load_corpus().challenge).user_messages(), threshold)


class TokenizerOnly:
    """The random cheater's "model": the claimed model's tokenizer, and nothing to run (an
    Engine over it encodes, decodes and reports load; it never generates)."""

    errored = False

    def __init__(self, path: Path) -> None:
        from transformers import AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(str(path))

    def get_tokenizer(self):
        return self._tokenizer

    async def check_health(self) -> None:
        return None

    def shutdown(self) -> None:
        return None


class NoShape:
    """Challenges shaped like user asks: the shape's log-odds are 0."""

    def log_odds(self, request: pb.GenerateRequest) -> float:
        return 0.0


@dataclass
class BehaviourGenerator(LocalGenerator):
    """random / replay / selective: replies it did not compute honestly, signed all the same."""

    kind: str = "random"
    seed: int = 0
    _rng: random.Random = field(default_factory=lambda: random.Random(0), init=False)
    _last: tuple[str, list[int]] | None = field(default=None, init=False)
    detector: ChallengeDetector | None = None

    async def serve(self, prepared: PreparedJob) -> AsyncIterator[pb.GenerateChunk]:
        request = prepared.request
        if self.kind == "selective" and self.detector is not None and self.detector.is_challenge(request):
            async for chunk in super().serve(prepared):
                yield chunk
            return
        n = max(1, prepared.job.sampling.max_tokens)
        key = receipts.request_prompt_hash(request).hex()
        if self.kind == "replay":
            if self._last is None or self._last[0] == key:  # nothing to replay yet: be honest once
                out: list[int] = []
                async for chunk in super().serve(prepared):
                    out.extend(chunk.token_ids)
                    if chunk.final:  # kept before it leaves: the overlay intake stops at the final
                        self._last = (key, out)  # chunk and closes this generator there
                    yield chunk
                return
            tokens = list(self._last[1])
        else:
            vocab = len(self.engine.tokenizer)
            tokens = [self._rng.randrange(vocab) for _ in range(n)]
        yield self._signed(request, tokens)

    def _signed(self, request: pb.GenerateRequest, tokens: list[int]) -> pb.GenerateChunk:
        chunk = pb.GenerateChunk(text=self.engine.decode(tokens), token_ids=tokens, served_by=self.identity.node_id_hex,
                                 final=True, finish_reason="length")
        chunk.receipt.CopyFrom(receipts.make_receipt(self.identity, self.model, request, tokens, self.clock_ms()))
        self.served += 1
        return chunk


@dataclass
class RetokenisingGenerator(LocalGenerator):
    """Another model's text, re-tokenised as the claimed model (engine.model is the claimed name)."""

    claimed: str = ""
    _tokenizer: object = field(default=None, init=False)

    def claimed_tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            from model_node import catalogue

            self._tokenizer = AutoTokenizer.from_pretrained(str(catalogue.resolve(self.claimed).path))
        return self._tokenizer

    def _flattened(self, request: pb.GenerateRequest) -> pb.GenerateRequest:
        """A base model (gemma3-270m here) has no chat template: the cheater flattens the chat."""
        inner = pb.GenerateRequest()
        inner.CopyFrom(request)
        if inner.messages and not getattr(self.engine.tokenizer, "chat_template", None):
            inner.prompt = "".join(f"{m.role}: {m.content}\n" for m in inner.messages) + "assistant:"
            del inner.messages[:]
        return inner

    def prepare(self, request: pb.GenerateRequest) -> PreparedJob:
        """Checked and tokenized as the flattened chat; the job keeps the request it answers."""
        prepared = super().prepare(self._flattened(request))
        return PreparedJob(request, prepared.job, prepared.prompt_ids)

    async def serve(self, prepared: PreparedJob) -> AsyncIterator[pb.GenerateChunk]:
        request = prepared.request
        text = []
        async for chunk in super().serve(self.prepare(request)):  # signed by the honest path; re-signed below
            text.append(chunk.text)
        tokens = list(self.claimed_tokenizer().encode("".join(text), add_special_tokens=False))[
            : max(1, request.sampling.max_tokens or self.params.default_max_tokens)] or [0]
        out = pb.GenerateChunk(text=self.claimed_tokenizer().decode(tokens, skip_special_tokens=True),
                               token_ids=tokens, served_by=self.identity.node_id_hex, final=True,
                               finish_reason="stop")
        out.receipt.CopyFrom(receipts.make_receipt(self.identity, self.claimed, request, tokens,
                                                   int(time.time() * 1000)))
        yield out
