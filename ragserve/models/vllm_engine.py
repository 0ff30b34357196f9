"""vLLM's async engine in this process (the GPU engine).

vLLM is imported inside ``start()``, so this module imports (and its tests run) where vLLM cannot
be installed. The adapter targets vLLM's public ``AsyncLLMEngine`` (an alias of the V1 ``AsyncLLM``
in current releases) and tolerates the API differences between releases:

* ``get_tokenizer()`` is a coroutine in older releases and a plain method in newer ones;
* the model config is the ``model_config`` attribute (newer) or ``await get_model_config()`` (older);
* ``generate(prompt, sampling_params, request_id)`` yields ``RequestOutput`` objects. Releases with
  ``vllm.sampling_params.RequestOutputKind`` are asked for ``DELTA`` outputs (each holds only the
  new text and token ids, as vLLM's own OpenAI server streams them: no whole text rebuilt and
  sliced each step); in older ones ``outputs[0].text`` and ``outputs[0].token_ids`` are cumulative
  and the deltas are computed here.

Prompts are rendered with the tokenizer's chat template (Gemma's turn format for a Gemma model
without one) and tokenized here, then passed as token ids: the ids the budget counted are exactly
the ids vLLM runs, with no second ``<bos>`` added by a re-tokenization.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import uuid
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from ragserve.api.generation import GenerationDelta
from ragserve.api.messages import Message
from ragserve.api.sampling import SamplingParams
from ragserve.errors import BadRequestError, EngineError
from ragserve.models.engine import GenerationEngine
from ragserve.models.gemma import render_gemma
from ragserve.models.tokenizers import HFTokenCounter
from ragserve.ports import ChatRenderer

log = logging.getLogger(__name__)


async def _resolve(value: Any) -> Any:
    """``value``, awaited if it is awaitable (for methods that are sync in one vLLM release, async in another)."""
    return await value if inspect.isawaitable(value) else value


class VLLMEngine(GenerationEngine):
    """``AsyncLLMEngine.from_engine_args(AsyncEngineArgs(model=model, **engine_args))``.

    ``context_window=None`` takes vLLM's ``max_model_len`` (a configured window is capped by it).
    Sampling defaults are the model's own generation config (as vLLM's OpenAI server applies them);
    a request's temperature, top_p, stop and seed override them.
    """

    engine_name = "vLLM"

    def __init__(self, model: str, engine_args: dict[str, Any] | None = None, context_window: int | None = None):
        if not model:
            raise ValueError("the vllm engine needs a model (llm_model)")
        self.model_id = model
        self._engine_args = dict(engine_args or {})
        self._configured_window = context_window
        self._window = context_window
        self._engine: Any = None
        self._sampling_params_cls: Any = None
        self._tokenizer: Any = None
        self._counter: HFTokenCounter | None = None
        self._defaults: dict[str, Any] = {}
        self._delta_kind: Any = None  # RequestOutputKind.DELTA where vLLM has it

    async def start(self) -> None:
        from vllm import AsyncEngineArgs, AsyncLLMEngine
        from vllm import SamplingParams as VLLMSamplingParams

        try:
            from vllm.sampling_params import RequestOutputKind
        except ImportError:  # before vLLM 0.6.1: cumulative outputs only
            self._delta_kind = None
        else:
            self._delta_kind = RequestOutputKind.DELTA
        self._sampling_params_cls = VLLMSamplingParams
        args = AsyncEngineArgs(model=self.model_id, **self._engine_args)
        self._engine = AsyncLLMEngine.from_engine_args(args)
        engine = self._engine
        if hasattr(engine, "get_tokenizer"):
            self._tokenizer = await _resolve(engine.get_tokenizer())
        else:
            self._tokenizer = engine.tokenizer
        model_config = getattr(engine, "model_config", None)
        if model_config is None and hasattr(engine, "get_model_config"):
            model_config = await _resolve(engine.get_model_config())
        self.set_window(self._configured_window, getattr(model_config, "max_model_len", None))
        get_defaults = getattr(model_config, "get_diff_sampling_param", None)
        if callable(get_defaults):
            try:
                self._defaults = dict(get_defaults() or {})
            except Exception:  # a config without a generation config: vLLM's own defaults apply
                self._defaults = {}
        render: ChatRenderer | None = None
        if not getattr(self._tokenizer, "chat_template", None):
            hf_config = getattr(model_config, "hf_config", None)
            if str(getattr(hf_config, "model_type", "")).startswith("gemma") or "gemma" in self.model_id.lower():
                render = render_gemma
            else:
                log.warning("model %s has no chat template; prompts use a plain 'role: content' layout", self.model_id)
        self._counter = HFTokenCounter(self._tokenizer, render=render, name=f"hf:{self.model_id}")
        log.info("vllm engine: %s ready (window %s, sampling defaults %s)", self.model_id, self._window, self._defaults)

    @property
    def delta_outputs(self) -> bool:
        """Whether ``sampling_params`` asks vLLM for delta outputs (else they are cumulative)."""
        return self._delta_kind is not None

    async def stop(self) -> None:
        engine, self._engine = self._engine, None
        if engine is None:
            return
        for name in ("shutdown", "shutdown_background_loop"):
            method = getattr(engine, name, None)
            if callable(method):
                await _resolve(method())
                return

    async def check_health(self) -> None:
        """vLLM's own health check: a dead engine loop fails it and Serve restarts the replica."""
        if self._engine is not None and hasattr(self._engine, "check_health"):
            await _resolve(self._engine.check_health())

    def token_counter(self) -> HFTokenCounter:
        if self._counter is None:
            raise EngineError(
                503, f"model {self.model_id} is not loaded (start() has not completed)", type_="server_error"
            )
        return self._counter

    def sampling_params(self, params: SamplingParams) -> Any:
        """The vLLM ``SamplingParams`` for a request: the model's defaults, then what the request set."""
        kwargs: dict[str, Any] = dict(self._defaults)
        kwargs.update(n=1, max_tokens=params.max_tokens, **params.set_fields())
        if self._delta_kind is not None:
            kwargs["output_kind"] = self._delta_kind
        return self._sampling_params_cls(**kwargs)

    async def chat_stream(
        self, messages: Sequence[Message], params: SamplingParams
    ) -> AsyncGenerator[GenerationDelta, None]:
        """vLLM's outputs as deltas (asked for as such, or computed from cumulative ones); leaving
        early aborts the request in vLLM."""
        self.check_sampling(params)
        counter = self.token_counter()
        engine = self._engine
        prompt = counter.render(messages, grounded=params.grounded)
        tokenizer = self._tokenizer
        prompt_ids = list(await asyncio.to_thread(tokenizer.encode, prompt, add_special_tokens=False))
        self.check_prompt_fits(len(prompt_ids))
        try:
            sampling = self.sampling_params(params)
        except (ValueError, TypeError) as exc:
            raise BadRequestError(f"invalid sampling parameters: {exc}") from exc
        request_id = f"ragserve-{uuid.uuid4().hex}"
        delta = self.delta_outputs
        outputs = engine.generate({"prompt_token_ids": prompt_ids}, sampling, request_id)
        sent = ""  # cumulative outputs: the text already yielded
        generated = 0  # delta outputs: the token ids seen
        final: Any = None
        finished = False
        try:
            async for output in outputs:
                completion = output.outputs[0]
                text = completion.text or ""
                if delta:
                    generated += len(completion.token_ids or ())
                    if text:
                        yield GenerationDelta(text=text)
                elif len(text) > len(sent):
                    yield GenerationDelta(text=text[len(sent) :])
                    sent = text
                final = output
            finished = True
        except EngineError:
            raise
        except (ValueError, TypeError) as exc:  # vLLM's request validation errors
            raise BadRequestError(str(exc)) from exc
        except Exception as exc:
            dead = "dead" in type(exc).__name__.lower()
            raise EngineError(
                503 if dead else 500, f"vLLM generation failed: {type(exc).__name__}: {exc}", type_="server_error"
            ) from exc
        finally:
            with contextlib.suppress(Exception):
                await outputs.aclose()
            if not finished:
                # The consumer left (or generation failed): free the sequence's GPU slots now.
                with contextlib.suppress(Exception):
                    await _resolve(engine.abort(request_id))
        if final is None:
            raise EngineError(500, "vLLM returned no output", type_="server_error")
        completion = final.outputs[0]
        reason = completion.finish_reason
        finish = "length" if reason == "length" else "stop"
        prompt_tokens = len(final.prompt_token_ids) if final.prompt_token_ids is not None else len(prompt_ids)
        yield GenerationDelta(
            text="",
            finish_reason=finish,
            prompt_tokens=prompt_tokens,
            completion_tokens=generated if delta else len(completion.token_ids or ()),
        )
