"""The vLLM engine of a model node (and of a verifier's reference model).

A thin shell around vLLM's `AsyncLLM`: it owns tokenisation (so the node knows the exact
prompt and output token ids it signs), streams generation as deltas, scores a given
continuation in one teacher-forced pass (`prompt_logprobs`), and reports load from vLLM's
own scheduler statistics. vLLM runs its engine core in a child process; whoever starts an
Engine must do so under an `if __name__ == "__main__"` guard (console scripts have one).

Nothing here downloads anything: the Hugging Face libraries are put offline before vLLM is
imported, and the model folder comes from `catalogue.resolve`.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable, Sequence

from gentorrent.config import MODEL_NODE, ModelNodeParams
from model_node.catalogue import ResolvedModel
from gentorrent.generation import BadRequestError, ContextLengthError, Prompt, Sampling


class PromptTooLongError(ContextLengthError):
    """The prompt (plus what must follow it) does not fit the model's context."""


class EngineError(RuntimeError):
    """The engine failed or is gone (gRPC UNAVAILABLE / INTERNAL)."""


def _offline_environment(params: ModelNodeParams) -> None:
    """Environment vLLM and the HF libraries read at import / engine-process start."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(params.cpu_kv_cache_gib))
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")


# --------------------------------------------------------------------------- load


@dataclass
class LoadStats:
    """Latest scheduler view (vLLM SchedulerStats) plus cumulative prefix-cache counters.

    vLLM reports per engine step; `queries`/`hits` are prompt tokens looked up in / found in
    the prefix cache during that step, so they are summed here.
    """

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    prefix_queries: int = 0
    prefix_hits: int = 0
    updated: float = 0.0

    def record(self, s) -> None:
        self.running = s.num_running_reqs
        self.waiting = s.num_waiting_reqs + getattr(s, "num_skipped_waiting_reqs", 0)
        self.kv_cache_usage = float(s.kv_cache_usage)
        pc = s.prefix_cache_stats
        if pc is not None:
            self.prefix_queries += pc.queries
            self.prefix_hits += pc.hits
        self.updated = time.monotonic()


@dataclass(frozen=True)
class Load:
    active: int
    queued: int
    kv_cache_usage: float
    prefix_queries: int
    prefix_hits: int


def _stat_logger_factory(sink: LoadStats):
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _LoadLogger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            self.engine_index = engine_index

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            if scheduler_stats is not None:
                sink.record(scheduler_stats)

        def log_engine_initialized(self):
            pass

    return _LoadLogger


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class EngineDelta:
    """New output of one generation step (streamed)."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] = ()  # of token_ids, when asked for
    finished: bool = False
    finish_reason: str = ""
    top: tuple[tuple[tuple[int, float], ...], ...] = ()  # per token: (id, logprob) best first, when asked


@dataclass(frozen=True)
class TokenScore:
    token_id: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), best first


@dataclass(frozen=True)
class ScoreResult:
    prompt_tokens: int
    tokens: tuple[TokenScore, ...]

    @property
    def logprobs(self) -> list[float]:
        return [t.logprob for t in self.tokens]


class SharedPasses:
    """Identical teacher-forced passes computed once: concurrent callers await the same pass,
    later ones get its kept result.

    Why: the members of a committee that share one reference engine (one machine: devnet,
    tests; ARCHITECTURE.md §4) each score every challenge reply and every audit with the very
    same request, and a pass of a 1,500-token prompt costs seconds of CPU. A pass is a function
    of its tokens and k, so one is as good as four, and every member gets the same numbers.
    A failed pass is not kept. Kept results are bounded by their scored tokens.
    """

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.requests = 0  # scoring calls
        self.passes = 0  # of them, passes the engine ran
        self._kept: OrderedDict[bytes, asyncio.Future] = OrderedDict()
        self._sizes: dict[bytes, int] = {}
        self._tokens = 0

    @staticmethod
    def key(prompt_ids: Sequence[int], token_ids: Sequence[int], top_k: int) -> bytes:
        h = hashlib.sha256(f"{top_k}:{len(prompt_ids)}:".encode())
        h.update(b",".join(str(t).encode() for t in (*prompt_ids, *token_ids)))
        return h.digest()

    async def get(self, key: bytes, size: int, compute: Callable[[], Awaitable["ScoreResult"]]) -> "ScoreResult":
        """The pass for `key` (`size` scored tokens), computed by `compute` unless one is kept or running."""
        self.requests += 1
        future = self._kept.get(key)
        if future is None:
            self.passes += 1
            future = asyncio.ensure_future(compute())
            future.add_done_callback(lambda f: self._forget_failed(key, f))
            self._keep(key, future, size)
        else:
            self._kept.move_to_end(key)
        return await asyncio.shield(future)  # a caller that gives up leaves the pass to the others

    def _keep(self, key: bytes, future: asyncio.Future, size: int) -> None:
        self._kept[key], self._sizes[key] = future, size
        self._tokens += size
        while self._tokens > self.max_tokens and len(self._kept) > 1:
            self._drop(next(iter(self._kept)))

    def _forget_failed(self, key: bytes, future: asyncio.Future) -> None:
        if (future.cancelled() or future.exception() is not None) and self._kept.get(key) is future:
            self._drop(key)

    def _drop(self, key: bytes) -> None:
        if self._kept.pop(key, None) is not None:
            self._tokens -= self._sizes.pop(key)


# --------------------------------------------------------------------------- engine


@dataclass
class Engine:
    """One vLLM engine serving one model. Create with `await Engine.start(...)`."""

    llm: object
    model: str
    max_model_len: int
    load_stats: LoadStats
    params: ModelNodeParams = MODEL_NODE
    startup_s: float = 0.0
    _inflight: int = field(default=0, init=False)
    shared_passes: SharedPasses = field(init=False)

    def __post_init__(self) -> None:
        self.shared_passes = SharedPasses(self.params.shared_pass_tokens)

    @classmethod
    async def start(cls, model: ResolvedModel, params: ModelNodeParams = MODEL_NODE,
                    max_model_len: int | None = None) -> "Engine":
        """Start vLLM on `model` (tens of seconds on CPU); blocks no event loop while loading."""
        _offline_environment(params)
        t0 = time.monotonic()
        stats = LoadStats()
        llm = await asyncio.wait_for(
            asyncio.to_thread(_build_llm, model, params, stats, max_model_len),
            params.engine_start_timeout_s,
        )
        limit = llm.model_config.max_model_len
        engine = cls(llm, model.name, limit, stats, params)
        await engine._warm_up()
        engine.startup_s = time.monotonic() - t0
        return engine

    def scoring_options(self) -> dict[str, str]:
        """The engine options a catalogue entry names, as vLLM resolved them ("auto" becomes the
        checkpoint's dtype): what a verifier compares its reference engine with
        (gentorrent.ledger.catalogue.reference_mismatch)."""
        config = getattr(self.llm, "vllm_config", None)
        if config is None:  # no vLLM engine behind it (a tokenizer-only stand-in): what it was asked for
            return {"dtype": self.params.dtype, "quantization": self.params.quantization,
                    "kv_cache_dtype": self.params.kv_cache_dtype}
        return {"dtype": str(config.model_config.dtype).removeprefix("torch."),
                "quantization": config.model_config.quantization or "",
                "kv_cache_dtype": str(config.cache_config.cache_dtype)}

    async def _warm_up(self) -> None:
        """One tiny generation and one tiny scoring pass before the node says it is ready.

        The first request on a fresh CPU engine pays one-off kernel set-up (~9 s on 2 idle
        cores, minutes when the machine is loaded: measured); a user's request must not.
        """
        ids = self.tokenizer.encode("Hello, world.")
        async for _ in self.generate(ids, Sampling(temperature=0.0, max_tokens=2), "warmup", logprobs=0):
            pass
        await self.score(ids[:-1], token_ids=ids[-1:], top_k=1)
        self.load_stats.prefix_queries = self.load_stats.prefix_hits = 0
        self.shared_passes = SharedPasses(self.params.shared_pass_tokens)

    # ------------------------------------------------------------------ tokens

    @property
    def tokenizer(self):
        return self.llm.get_tokenizer()

    def encode(self, prompt: Prompt) -> list[int]:
        """Prompt token ids; chat transcripts go through the model's chat template."""
        tok = self.tokenizer
        if prompt.is_chat:
            if not getattr(tok, "chat_template", None):
                raise BadRequestError(f"{self.model} has no chat template (a base model): send a raw prompt")
            try:  # the tools go to the template, as vLLM passes them (a template without tools ignores them)
                ids = tok.apply_chat_template(prompt.template_messages(), tools=prompt.template_tools(),
                                              add_generation_prompt=True, tokenize=True)
            except Exception as exc:  # templates raise on orders they do not support
                raise BadRequestError(f"chat template refused the messages: {exc}") from exc
            if hasattr(ids, "keys"):
                ids = ids["input_ids"]
            return list(ids)
        return list(tok.encode(prompt.text))

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        """One token's text, as vLLM's logprobs show it."""
        return self.tokenizer.decode([token_id])

    def check_fits(self, prompt_ids: Sequence[int], reserve: int = 1) -> None:
        room = self.max_model_len - reserve
        if len(prompt_ids) > room:
            raise PromptTooLongError(
                f"prompt is {len(prompt_ids)} tokens; the context of {self.model} holds "
                f"{self.max_model_len} including at least {reserve} new token(s)")

    # ------------------------------------------------------------------ generation

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling,
                       request_id: str | None = None, logprobs: int | None = None
                       ) -> AsyncIterator[EngineDelta]:
        """Stream a completion of `prompt_ids` as deltas; the last one has finished=True.

        The caller has checked the prompt once (`check_fits`, done by LocalGenerator.prepare);
        it is not checked again here. max_tokens is clipped to what the context leaves after the
        prompt (unset: all of it, as vLLM). `logprobs`: None, or how many alternatives to report
        per token besides the sampled one's logprob (0: only that). Leaving the iterator early (or
        cancelling) aborts the request inside vLLM.
        """
        from vllm.sampling_params import RequestOutputKind

        ids = list(prompt_ids)
        room = self.max_model_len - len(ids)
        sp = vllm_sampling(sampling, room if sampling.max_tokens is None else min(sampling.max_tokens, room),
                           logprobs, RequestOutputKind.DELTA)
        async for out in self._run(ids, sp, request_id):
            o = out.outputs[0]
            lps: tuple[float, ...] = ()
            top: tuple = ()
            if logprobs is not None and o.logprobs:
                lps = tuple(pos[t].logprob for pos, t in zip(o.logprobs, o.token_ids))
                top = tuple(tuple(sorted(((i, lp.logprob) for i, lp in pos.items()
                                          if lp.rank is not None and lp.rank <= logprobs),
                                         key=lambda x: -x[1])[:logprobs]) for pos in o.logprobs)
            yield EngineDelta(o.text, tuple(o.token_ids), lps, out.finished,
                              (o.finish_reason or "") if out.finished else "", top)

    async def _run(self, ids: list[int], sp, request_id: str | None):
        from vllm.exceptions import VLLMClientError

        rid = request_id or uuid.uuid4().hex
        self._inflight += 1
        try:
            async for out in self.llm.generate({"prompt_token_ids": ids}, sp, f"{rid}-{uuid.uuid4().hex[:8]}"):
                yield out
        except VLLMClientError as exc:
            raise BadRequestError(str(exc)) from exc
        except (asyncio.CancelledError, GeneratorExit, BadRequestError):
            raise
        except Exception as exc:
            raise EngineError(f"engine failed: {type(exc).__name__}: {exc}") from exc
        finally:
            self._inflight -= 1

    # ------------------------------------------------------------------ scoring

    async def score(self, prompt: Prompt | Sequence[int], text: str | None = None,
                    token_ids: Sequence[int] | None = None, top_k: int = 0) -> ScoreResult:
        """Log-probability (and rank, top-k) of every token of a continuation, one pass.

        The continuation is `token_ids`, or `text` tokenised on its own (no special tokens)
        and appended to the prompt's tokens — give token ids when the exact split matters
        (e.g. re-scoring a generated reply). Identical calls share one pass (SharedPasses).
        """
        p_ids = self.encode(prompt) if isinstance(prompt, Prompt) else list(prompt)
        if token_ids is None:
            token_ids = self.tokenizer.encode(text or "", add_special_tokens=False)
        cont = list(token_ids)
        if not cont:
            raise BadRequestError("nothing to score")
        vocab = len(self.tokenizer)
        if any(not 0 <= t < vocab for t in cont):
            raise BadRequestError(f"token ids must be in [0, {vocab})")
        self.check_fits(p_ids + cont, reserve=1)
        return await self.shared_passes.get(SharedPasses.key(p_ids, cont, top_k), len(cont),
                                            lambda: self._score_pass(p_ids, cont, top_k))

    async def _score_pass(self, p_ids: list[int], cont: list[int], top_k: int) -> ScoreResult:
        from vllm import SamplingParams

        sp = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=top_k, detokenize=False)
        final = None
        async for out in self._run(p_ids + cont, sp, None):
            final = out
        if final is None or final.prompt_logprobs is None:
            raise EngineError("engine returned no prompt logprobs")
        rows = final.prompt_logprobs[len(p_ids):]
        tokens = []
        for tid, row in zip(cont, rows):
            chosen = row[tid]
            top = sorted(((t, lp.logprob) for t, lp in row.items() if lp.rank is not None and lp.rank <= top_k),
                         key=lambda x: -x[1])[:top_k]
            tokens.append(TokenScore(tid, float(chosen.logprob), int(chosen.rank or 0), tuple(top)))
        return ScoreResult(len(p_ids), tuple(tokens))

    # ------------------------------------------------------------------ load & life

    def load(self) -> Load:
        """Active and queued requests, KV usage, prefix-cache counters.

        vLLM's scheduler stats arrive with engine steps, so an idle engine's last report
        would still show its last batch; our own in-flight count settles that.
        """
        s = self.load_stats
        inflight = self._inflight
        if inflight == 0:
            return Load(0, 0, 0.0 if s.running == 0 else s.kv_cache_usage, s.prefix_queries, s.prefix_hits)
        active = min(s.running, inflight) if s.running else min(inflight, self.params.max_running_requests)
        return Load(active, max(inflight - active, 0), s.kv_cache_usage, s.prefix_queries, s.prefix_hits)

    @property
    def inflight(self) -> int:
        return self._inflight

    async def check_health(self) -> bool:
        try:
            await self.llm.check_health()
        except Exception:
            return False
        return not self.llm.errored

    def shutdown(self) -> None:
        llm, self.llm = self.llm, None
        if llm is not None:
            llm.shutdown()
            # AsyncLLM.__del__ shuts down again, at interpreter exit when vLLM's module
            # globals are already None (a noisy TypeError); it has nothing left to do
            llm.__dict__["shutdown"] = lambda *a, **k: None


def vllm_sampling(sampling: Sampling, max_tokens: int, logprobs: int | None, output_kind):
    """vLLM's SamplingParams for a checked Sampling (every field vLLM's OpenAI server maps)."""
    from vllm import SamplingParams

    return SamplingParams(
        temperature=sampling.temperature, top_p=sampling.top_p,
        top_k=sampling.top_k if sampling.top_k > 0 else 0, seed=sampling.seed,
        stop=list(sampling.stop) or None, max_tokens=max_tokens, logprobs=logprobs, output_kind=output_kind,
        presence_penalty=sampling.presence_penalty, frequency_penalty=sampling.frequency_penalty,
        repetition_penalty=sampling.repetition_penalty, min_p=sampling.min_p,
        min_tokens=min(sampling.min_tokens, max_tokens), stop_token_ids=list(sampling.stop_token_ids) or None,
        ignore_eos=sampling.ignore_eos, logit_bias=dict(sampling.logit_bias) or None,
        structured_outputs=structured_outputs(sampling.structured),
    )


def structured_outputs(structured: tuple[int, str] | None):
    """vLLM's StructuredOutputsParams of a (StructuredOutput.Kind, spec), or None."""
    if structured is None:
        return None
    import json

    from vllm.sampling_params import StructuredOutputsParams

    from gentorrent.generation import Structured

    kind, spec = structured
    if kind == Structured.JSON_SCHEMA:
        return StructuredOutputsParams(json=json.loads(spec))
    if kind == Structured.JSON_OBJECT:
        return StructuredOutputsParams(json_object=True)
    if kind == Structured.REGEX:
        return StructuredOutputsParams(regex=spec)
    if kind == Structured.CHOICE:
        return StructuredOutputsParams(choice=json.loads(spec))
    return StructuredOutputsParams(grammar=spec)


def _build_llm(model: ResolvedModel, params: ModelNodeParams, stats: LoadStats, max_model_len: int | None):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.platforms import current_platform
    from vllm.v1.engine.async_llm import AsyncLLM

    args = AsyncEngineArgs(**engine_arguments(model, params, max_model_len, on_cpu=current_platform.is_cpu()))
    # A terminal's Ctrl-C reaches the whole process group: an engine process spawned from here
    # inherits this thread's signal mask, so it does not die mid-import printing a traceback of
    # its own; gt-model stops it (`cli._abandon_start`, `Engine.shutdown`). multiprocessing's
    # resource tracker starts first: starting it unblocks SIGINT in the calling thread
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return AsyncLLM.from_engine_args(args, stat_loggers=[_stat_logger_factory(stats)])
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def engine_arguments(model: ResolvedModel, params: ModelNodeParams, max_model_len: int | None,
                     on_cpu: bool) -> dict:
    """vLLM's AsyncEngineArgs for this node (ARCHITECTURE.md §4).

    On a CPU the engine runs eager: CUDA graphs do not exist there, and capturing nothing
    costs start-up time (~18 s instead of ~70 s on 2 cores). On a GPU, CUDA graphs stay on
    (they cut per-token latency of small batches several-fold), and the GPU-only knobs are
    passed through: tensor parallelism across `tensor_parallel_size` GPUs and the share of
    each GPU's memory the engine may take.
    """
    args = dict(
        model=str(model.path), served_model_name=model.name, tokenizer=str(model.path),
        dtype=params.dtype or (params.cpu_dtype if on_cpu else params.gpu_dtype), enforce_eager=on_cpu,
        enable_prefix_caching=True, quantization=params.quantization or None, kv_cache_dtype=params.kv_cache_dtype,
        max_model_len=context_length(model, max_model_len or params.max_model_len),
        max_num_seqs=params.max_running_requests, disable_log_stats=True,
        num_gpu_blocks_override=params.kv_cache_blocks or None,  # routing bench: small KV
        seed=0,
    )
    if on_cpu:  # a user's seed must not be able to kill the engine (model_node/vllm_cpu_seeds.py)
        args.update(worker_extension_cls="model_node.vllm_cpu_worker.SeededRequestsOnCpu")
    if not on_cpu:
        args.update(tensor_parallel_size=params.tensor_parallel_size,
                    gpu_memory_utilization=params.gpu_memory_utilization)
    return args


def local_gpus_gib() -> list[float]:
    """Memory (GiB) of each CUDA GPU on this machine; empty on a CPU machine."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch comes with vLLM
        return []
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_properties(i).total_memory / 2 ** 30 for i in range(torch.cuda.device_count())]


def context_length(model: ResolvedModel, cap: int) -> int:
    """min(cap, the model's own context), read from its config.json."""
    import json

    try:
        cfg = json.loads((model.path / "config.json").read_text())
    except (OSError, ValueError):
        return cap
    own = cfg.get("max_position_embeddings") or cfg.get("text_config", {}).get("max_position_embeddings")
    return min(cap, int(own)) if own else cap
