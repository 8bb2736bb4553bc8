"""Generation straight through vLLM's engine client, inside ``vllm serve``.

vLLM's own routes (``/inference/v1/generate`` and the OpenAI ones) hand a request to the engine
client its server keeps in ``app.state.engine_client`` (``AsyncLLM``), and turn every
``RequestOutput`` it yields into a JSON chunk and an SSE frame; the middleware's backend then
parses them back. :class:`InProcessBackend` calls the engine client itself: the prompt's token ids
go in as the engine input vLLM's renderer makes of a ``TokensPrompt`` (as its routes do), the
sampled ids come back as ``RequestOutput`` deltas (vLLM detokenizes nothing: ``detokenize=False``),
and nothing is encoded, framed or parsed per token on either side. Everything else is :class:`~responses_cache_vllm.backend.EngineBackend`'s: the
prompt, ``tool_choice``, the context window and the tokenizer handshake at start (through vLLM's
HTTP routes, in-process), decoding and parsing, usage, the finish.

The request is the one the generate route would make: the sampling fields set here and vLLM's
defaults for the rest (``SamplingParams``), the prompt's ``cache_salt``, the request's priority,
its trace context. It is added (``AsyncLLM.add_request``) before the response exists, so a
refusal is a plain error, and its outputs are read as vLLM's own ``generate`` reads them; a turn
that ends before the engine finished (a client that left, a stop) aborts it (``abort``), as
vLLM's routes do on a disconnect.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncGenerator, Callable
from typing import Any

from responses_cache import BackendError, BackendEvent
from responses_cache.engines import ACCEPTED, Accepted, batched

from .backend import Decoding, EngineBackend, Generation
from .dialects import DIALECTS, PREFERENCE, Dialect, Params, Step

#: Makes every engine request id unique within the process (vLLM refuses a duplicate in flight).
_attempts = itertools.count()


class InProcessBackend(EngineBackend):
    """:class:`EngineBackend` inside vLLM's process, generating through ``engine_client()``
    (vLLM's ``AsyncLLM``, or ``None`` while it is not known: the generation then goes through
    vLLM's HTTP route in-process, as :class:`EngineBackend` makes it)."""

    def __init__(self, base_urls: str, *, engine_client: Callable[[], Any], **options: Any) -> None:
        super().__init__(base_urls, **options)
        self._engine_client = engine_client

    async def _detect(self) -> Dialect:
        if self._engine_client() is not None:
            # No route is called: nothing to probe, and a stock vLLM (no tokens-in route) is no
            # reason to warn. The dialect stays unused while the engine client is there.
            return DIALECTS[PREFERENCE[self.engine][0]]
        return await super()._detect()

    def _generation(
        self, dialect: Dialect, params: Params, outcome: Generation
    ) -> AsyncGenerator[BackendEvent | Accepted, None]:
        client = self._engine_client()
        if client is None:
            return super()._generation(dialect, params, outcome)
        return self._in_engine(client, params, outcome)

    async def _in_engine(self, client: Any, params: Params, outcome: Generation) -> AsyncGenerator[BackendEvent | Accepted, None]:
        request_id = f"{params.request_id}-{next(_attempts)}"
        try:
            # Added before the response exists, as vLLM's routes add it before their 200: what
            # vLLM refuses (sampling values, a prompt) is a plain error, and the engine has the
            # request by ``response.created``.
            queue = await client.add_request(
                request_id, _engine_input(client, params), _sampling(client, params),
                priority=params.priority or 0,
                trace_headers={k: v for k, v in outcome.headers.items() if k in ("traceparent", "tracestate")} or None,
            )
        except Exception as exc:
            raise BackendError(f"vLLM refused the request: {exc or type(exc).__name__}", "server_error") from exc
        yield ACCEPTED
        outcome.prompt_tokens = len(params.token_ids)  # what the engine was given, as its usage would say
        decoding, sampled, finished = Decoding(outcome), 0, False
        try:
            # What the engine produced while the turn was busy is decoded as one.
            async with contextlib.aclosing(batched(_outputs(queue))) as batches:
                async for batch in batches:
                    steps: list[Step] = []
                    for output in batch:
                        step, sampled = _step(output, sampled)
                        finished = finished or output.finished
                        steps.append(step)
                    for event in decoding.feed(steps):
                        yield event
                    if outcome.truncated:
                        return
        except Exception as exc:  # vLLM's own failures (the engine dead, an error in its output)
            raise BackendError(f"vLLM's engine failed: {exc or type(exc).__name__}", "server_error") from exc
        finally:
            if not finished:  # the client left, a stop or a failure: vLLM frees the request
                with contextlib.suppress(Exception):  # (an engine that died has nothing to free)
                    await client.abort(request_id)
            queue.close()
        for event in decoding.close():
            yield event


def _sampling(client: Any, params: Params) -> Any:
    """The ``SamplingParams`` vLLM's generate route would make of ``params`` (vLLM's defaults for
    the rest), its outputs as deltas of token ids."""
    from vllm import SamplingParams  # vLLM's process: the import is there already
    from vllm.sampling_params import RequestOutputKind

    max_tokens = params.max_tokens
    if max_tokens is None:  # the context window is read at start; this is vLLM's own figure
        max_tokens = max(1, client.vllm_config.model_config.max_model_len - len(params.token_ids))
    return SamplingParams(
        max_tokens=max_tokens,
        stop_token_ids=list(params.stop_token_ids),
        skip_special_tokens=False,
        detokenize=False,  # decoded here with the renderer's encoding
        output_kind=RequestOutputKind.DELTA,
        **({"temperature": params.temperature} if params.temperature is not None else {}),
        **({"top_p": params.top_p} if params.top_p is not None else {}),
        **params.extra,
    )


def _engine_input(client: Any, params: Params) -> Any:
    """The prompt as vLLM's own routes hand it to the engine (``renderer.render_cmpl``; a raw
    ``TokensPrompt`` where vLLM has no such renderer: it is deprecated)."""
    prompt: dict[str, Any] = {"prompt_token_ids": params.token_ids}
    if params.cache_salt is not None:
        prompt["cache_salt"] = params.cache_salt
    render = getattr(getattr(client, "renderer", None), "render_cmpl", None)
    if render is None:
        return prompt
    (engine_input,) = render([prompt])
    return engine_input


async def _outputs(queue: Any) -> AsyncGenerator[Any, None]:
    """A request's ``RequestOutput`` deltas from its vLLM output collector, to the finished one
    (the loop of vLLM's own ``generate``)."""
    while True:
        output = queue.get_nowait() or await queue.get()  # an engine error is raised here
        yield output
        if output.finished:
            return


def _step(output: Any, sampled: int) -> tuple[Step, int]:
    """A ``RequestOutput`` delta as a step, with the running count of sampled ids."""
    completion = output.outputs[0]
    ids = list(completion.token_ids)
    sampled += len(ids)
    stop = completion.stop_reason
    step = Step(
        ids=ids,
        finish=completion.finish_reason if output.finished else None,
        matched_stop=stop if isinstance(stop, int) and not isinstance(stop, bool) else None,
        cached_tokens=output.num_cached_tokens,
        output_tokens=sampled,
    )
    return step, sampled
