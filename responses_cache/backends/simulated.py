"""The embedded simulated engine: deterministic, and honest about time.

Timing model (all rates configurable; ``instant=True`` makes every delay zero):

* **prefill** — time to first token = ``uncached prompt tokens / prefill_tokens_per_s``. The
  engine is one replica with a block-level prefix cache (:class:`PrefixCache`, 128-token blocks,
  2M tokens by default): the leading whole blocks it has seen before count as cached, whoever sent
  them, as in vLLM's automatic prefix caching, within one ``cache_salt`` (the pipeline gives each
  tenant its own by default).
* **decode** — output streams at ``output_tokens_per_s``, one delta per output token as it comes
  due; tokens already due when the server comes back for more (an engine faster than the server
  takes its tokens) come as one delta, as the adapters' read of a real engine hands them over.
  ``instant=True``: one delta per token, with no clock.

Default policy, enough to drive a real agent client end to end:

1. The request offers a shell tool (``exec_command`` with a ``cmd`` string, ``shell`` with a
   ``command`` array, or any function with such a parameter) and the latest user message contains a
   command in backticks → call that tool with that command.
2. The request offers a custom (freeform) tool and the latest user message contains a fenced
   block (three backticks) → call the first custom tool with the block's text as its ``input``
   (checked before rule 1).
3. The last item is a ``function_call_output`` or ``custom_tool_call_output`` → a short message
   quoting the last non-empty line of the output.
4. Otherwise → a text answer.

With a route whose renderer is a model's own template (``hf:<model dir>``), the reply is sampled
in that model's format -- reasoning, then the call or the answer, the template's text up to its
first stop token -- and parsed back with the renderer's output parser, so the server's parsing,
sampled-id and rendering paths run as they would against a real engine.

Scenario mode (``scenario=Scenario(...)``) replays a scripted coding-agent rollout instead: the
first ``tool_calls`` turns after a user message each call the first function tool with arguments of
``argument_tokens`` tokens, then one final answer of ``answer_tokens`` tokens.

In both modes, a last user message that is the compaction summary prompt
(:data:`~responses_cache.conversation.compaction.SUMMARY_PROMPT`) gets a deterministic summary: the number of
items, the latest user requests (shortened), the start of the previous summary.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import hashlib
import json
import re
import time
from array import array
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass

from cachetools import LRUCache

from ..conversation import Conversation
from ..conversation.compaction import SUMMARY_PROMPT, Compaction
from ..protocol.items import (
    CustomToolCall,
    CustomToolCallOutput,
    FunctionCall,
    FunctionCallOutput,
    Item,
    Message,
    Reasoning,
    ReasoningText,
    text_of,
)
from ..protocol.tools import FunctionTool
from ..tokens.hf import HFRenderer
from ..tokens.log import TokenLog
from ..tokens.parsing import OutputParser
from .base import (
    BackendEvent,
    EngineUsage,
    Finish,
    GenerationRequest,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
)
from .engines import BATCH_LIMIT

_BACKTICKS = re.compile(r"`([^`\n]+)`")
_FENCED = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)
_FILLER = (
    "The change compiles cleanly and the tests pass; next I will look at the remaining edge cases "
    "in the parser and tidy the error messages before opening the pull request. "
)


@dataclass(frozen=True, slots=True)
class Scenario:
    """A scripted rollout: ``tool_calls`` calls, then one answer."""

    tool_calls: int = 30
    argument_tokens: int = 40
    answer_tokens: int = 200


@dataclass(frozen=True, slots=True)
class SimulatedConfig:
    prefill_tokens_per_s: float = 20_000.0
    output_tokens_per_s: float = 1_000.0
    answer_tokens: int = 24
    instant: bool = False
    scenario: Scenario | None = None
    model_names: tuple[str, ...] = ("sim-1",)
    #: Prefix-cache capacity in tokens and its block size (whole blocks only, as real engines).
    kv_cache_tokens: int = 2_000_000
    kv_block_tokens: int = 128


class SimulatedEngine:
    """The default :class:`~responses_cache.backends.base.Backend`."""

    accepts_media = True

    def __init__(
        self,
        config: SimulatedConfig | None = None,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.config = config or SimulatedConfig()
        self._clock = clock
        self._kv = PrefixCache(self.config.kv_cache_tokens, self.config.kv_block_tokens)
        self._resume: LRUCache[str, tuple[TokenLog, tuple[int, bytes]]] = LRUCache(maxsize=4096)
        #: Per conversation (``affinity_key``), the last context a scenario counted its tool
        #: outputs in, and the count (see :meth:`_calls_since_user`).
        self._tallies: LRUCache[str, tuple[Conversation, int]] = LRUCache(maxsize=256)
        self.prefilled_tokens = 0
        self.requests = 0

    def models(self) -> Sequence[str]:
        return self.config.model_names

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
        self.requests += 1
        cfg = self.config
        # A real engine works in a process of its own: what the server queued before calling it
        # (``response.created`` on an SSE stream) goes out before this engine's own work.
        await asyncio.sleep(0)
        prompt_tokens, cached = self._prefill_accounting(request)
        self.prefilled_tokens += prompt_tokens - cached
        if not cfg.instant and prompt_tokens > cached:
            await asyncio.sleep((prompt_tokens - cached) / cfg.prefill_tokens_per_s)
        plan = self._plan(request)
        calls = plan.call is not None or plan.custom is not None
        spoken = self._speak(request, plan)
        if spoken is not None:
            # The route renders with a model's own template: sample the reply in its format and
            # parse it back with the renderer's parser, as a real engine's output would be.
            ids, parser = spoken
            assert request.prompt is not None
            started = False
            utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
            async with contextlib.aclosing(self._decode(len(ids))) as groups:
                async for due in groups:
                    for event in parser.feed(utf8.decode(request.prompt.renderer.encoding.decode_bytes(ids[due]))):
                        started = started or isinstance(event, ToolCallStart)
                        yield event
            for event in parser.close():
                started = started or isinstance(event, ToolCallStart)
                yield event
            usage = EngineUsage(prompt_tokens=prompt_tokens, cached_tokens=cached, output_tokens=len(ids))
            yield Finish(reason="tool_calls" if started else "stop", usage=usage, token_ids=ids)
            return
        pieces = self._tokenize(request, plan.arguments if calls else plan.text)
        if plan.custom is not None:
            yield ToolCallStart(name=plan.custom, custom=True)
        elif plan.call is not None:
            yield ToolCallStart(name=plan.call.name, namespace=plan.namespace)
        async with contextlib.aclosing(self._decode(len(pieces))) as groups:
            async for due in groups:
                piece = "".join(pieces[due])
                yield ToolCallDelta(piece) if calls else TextDelta(piece)
        yield Finish(
            reason="tool_calls" if calls else "stop",
            usage=EngineUsage(prompt_tokens=prompt_tokens, cached_tokens=cached, output_tokens=len(pieces)),
        )

    # -- internals -------------------------------------------------------------------------------

    async def _decode(self, n: int) -> AsyncGenerator[slice, None]:
        """The ``n`` output tokens' positions, in the groups the server takes them in.

        Token ``i`` is due ``(i + 1) / output_tokens_per_s`` after decoding starts; the engine
        waits for each group's first token, then hands over with it every later token already due
        (at most :data:`~responses_cache.backends.engines.BATCH_LIMIT`), as the adapters' read of a
        real engine's stream does (:func:`~responses_cache.backends.engines.batched`): an engine
        faster than the server takes its tokens sends what queued up as one delta. An instant
        engine has no clock: one token per group."""
        cfg, clock = self.config, self._clock
        start, rate = clock(), cfg.output_tokens_per_s
        i = 0
        while i < n:
            end = i + 1
            if not cfg.instant:
                delay = start + end / rate - clock()
                if delay > 0.001:
                    await asyncio.sleep(delay)
                now = clock()
                while end < n and end - i < BATCH_LIMIT and start + (end + 1) / rate <= now:
                    end += 1
            yield slice(i, end)
            i = end

    def _prefill_accounting(self, request: GenerationRequest) -> tuple[int, int]:
        """(prompt tokens, tokens found in the prefix cache). An instant engine skips the lookup.

        The engine remembers, per conversation (``affinity_key``), where its previous prompt's
        whole blocks ended, so a continuation hashes only its new blocks (O(new input))."""
        if request.prompt is None:
            return 0, 0
        if self.config.instant:
            return request.prompt.num_tokens, 0
        log = request.prompt.log
        tokens = request.prompt.tokens()
        resume = None
        previous = self._resume.get(request.affinity_key)
        if previous is not None and log.common_prefix(previous[0]) >= previous[1][0]:
            resume = previous[1]
        cached = self._kv.lookup_and_insert(tokens, resume=resume, salt=request.cache_salt)
        self._resume[request.affinity_key] = (log, self._kv.last_boundary)
        return len(tokens), cached

    def _speak(self, request: GenerationRequest, plan: _Plan) -> tuple[list[int], OutputParser] | None:
        """With an ``hf`` renderer: the reply's ids in the model's format (reasoning, then the call
        or the answer, up to the first stop token) and the renderer's parser; else None."""
        renderer = request.prompt.renderer if request.prompt is not None else None
        if not isinstance(renderer, HFRenderer):
            return None
        reply: list[Item] = [Reasoning(summary=[], content=[ReasoningText("Planning the next step.")])]
        call_id = "callsim00"  # nine letters and digits: the only call ids Mistral's templates take
        if plan.custom is not None:
            reply.append(CustomToolCall(call_id=call_id, name=plan.custom, input=plan.arguments))
        elif plan.call is not None:
            reply.append(FunctionCall(call_id=call_id, name=plan.call.name, arguments=plan.arguments, namespace=plan.namespace))
        else:
            reply.append(Message(role="assistant", content=plan.text))
        items = request.conversation.items()
        prompt = renderer.render_text(request.instructions, request.tools, items, add_generation_prompt=True)
        full = renderer.render_text(request.instructions, request.tools, [*items, *reply])
        text = full[len(prompt) :] if full.startswith(prompt) else full[len(renderer.render_text(request.instructions, request.tools, items)) :]
        ids = renderer.encode_with_specials(text)
        stops = set(renderer.sampling_stop_tokens)
        end = next((i for i, t in enumerate(ids) if t in stops), None)
        ids = ids[: end + 1] if end is not None else [*ids, renderer.end_token(bool(plan.call or plan.custom))]
        return ids, renderer.output_parser(frozenset(c.name for c in request.tools.customs()))

    def _tokenize(self, request: GenerationRequest, text: str) -> list[str]:
        if request.prompt is not None:
            renderer = request.prompt.renderer
            return [renderer.decode([t]) for t in renderer.encode_text(text)]
        return re.findall(r"\S*\s*", text)[:-1] or [text]

    def _plan(self, request: GenerationRequest) -> _Plan:
        items = request.conversation.reversed_items()
        last = next(items, None)
        functions = request.tools.functions()
        scenario = self.config.scenario
        if isinstance(last, Message) and last.role == "user" and text_of(last.content) == SUMMARY_PROMPT:
            return _Plan(text=_summary(request.conversation))  # a compaction, in scenario mode too
        if scenario is not None:
            return self._scenario_plan(request, scenario, functions)
        if isinstance(last, (FunctionCallOutput, CustomToolCallOutput)):
            output = last.output if isinstance(last.output, str) else text_of(last.output)
            lines = [line.strip() for line in output.splitlines() if line.strip()]
            quoted = lines[-1] if lines else "(no output)"
            return _Plan(text=f"The command finished. Last line of its output: {quoted}")
        if isinstance(last, Message) and last.role == "user":
            text = text_of(last.content)
            customs = request.tools.customs()
            fenced = _FENCED.search(text)
            if fenced and customs:
                return _Plan(custom=customs[0].name, arguments=fenced.group(1))
            match = _BACKTICKS.search(text)
            tool = _shell_tool(functions)
            if match and tool is not None:
                namespace, function, argument, as_list = tool
                command = match.group(1).strip()
                value: object = ["bash", "-lc", command] if as_list else command
                return _Plan(call=function, namespace=namespace, arguments=json.dumps({argument: value}))
            return _Plan(text=_answer(text, self.config.answer_tokens))
        return _Plan(text=_answer("", self.config.answer_tokens))

    def _scenario_plan(
        self, request: GenerationRequest, scenario: Scenario, functions: list[tuple[str | None, FunctionTool]]
    ) -> _Plan:
        calls_done = self._calls_since_user(request)
        if calls_done < scenario.tool_calls and functions:
            namespace, function = functions[0]
            payload = (_FILLER * (1 + scenario.argument_tokens // 20))[: scenario.argument_tokens * 4]
            return _Plan(call=function, namespace=namespace, arguments=json.dumps({"step": calls_done + 1, "note": payload}))
        return _Plan(text=(_FILLER * (1 + scenario.answer_tokens // 20))[: scenario.answer_tokens * 4])


    def _calls_since_user(self, request: GenerationRequest) -> int:
        """Tool outputs in the conversation since its last user message: counted back from the
        newest item, down to the context this conversation's previous request counted (kept per
        ``affinity_key``), so a long tool loop reads only its new items, and never the packed
        history behind them (:mod:`~responses_cache.conversation.packing`)."""
        calls = 0
        known = self._tallies.get(request.affinity_key)
        node: Conversation | None = request.conversation
        while node is not None:
            if known is not None and node is known[0]:
                calls += known[1]
                break
            for item in reversed(node.own_items):
                if isinstance(item, Message) and item.role == "user":
                    node = None
                    break
                if isinstance(item, FunctionCallOutput):
                    calls += 1
            else:
                node = node.parent
        self._tallies[request.affinity_key] = (request.conversation, calls)
        return calls


class PrefixCache:
    """A block-level prefix cache, as engines keep one (vLLM's automatic prefix caching, Cerebras'
    prompt caching): the prompt is cut into whole blocks, each identified by a hash chained over
    every block before it, and a request reuses its longest run of leading blocks already seen.
    Least recently used blocks are dropped beyond ``capacity_tokens``. Content and ``cache_salt``
    decide, not which client or connection sent the prompt."""

    def __init__(self, capacity_tokens: int, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self._blocks: LRUCache[bytes, None] = LRUCache(maxsize=max(1, capacity_tokens // block_tokens))
        #: ``(tokens, chained hash)`` at the last whole block of the latest prompt.
        self.last_boundary: tuple[int, bytes] = (0, b"")

    def lookup_and_insert(
        self, tokens: Sequence[int], *, resume: tuple[int, bytes] | None = None, salt: str | None = None
    ) -> int:
        """Tokens of ``tokens``' prefix found in the cache; its whole blocks are then cached.

        ``resume`` — ``(tokens, chained hash)`` at a block boundary of an earlier prompt that this
        one extends — skips re-hashing that prefix when its last block is still cached. ``salt``
        (a request's ``cache_salt``) seeds the hash chain, as vLLM does: prompts with different
        salts never share blocks."""
        start, digest = 0, (hashlib.blake2b(salt.encode(), digest_size=16).digest() if salt else b"")
        if resume is not None and resume[0] <= len(tokens) and resume[1] in self._blocks:
            start, digest = resume
            self._blocks[digest] = None  # touch
        data = memoryview(array("I", tokens[start:])).cast("B")
        step = self.block_tokens * 4
        cached, hit = start, True
        for offset in range(0, len(data) - len(data) % step, step):
            digest = hashlib.blake2b(digest + data[offset : offset + step], digest_size=16).digest()
            if hit and digest in self._blocks:
                self._blocks[digest] = None  # touch
                cached += self.block_tokens
            else:
                hit = False
                self._blocks[digest] = None
        self.last_boundary = (start + len(data) // step * self.block_tokens, digest)
        return cached


@dataclass(frozen=True, slots=True)
class _Plan:
    text: str = ""
    call: FunctionTool | None = None
    namespace: str | None = None
    arguments: str = ""
    #: The custom tool to call (``arguments`` is then its input text).
    custom: str | None = None


def _shell_tool(
    functions: list[tuple[str | None, FunctionTool]],
) -> tuple[str | None, FunctionTool, str, bool] | None:
    """Find a tool that runs shell commands: (namespace, tool, argument name, takes a list)."""
    best: tuple[str | None, FunctionTool, str, bool] | None = None
    for namespace, tool in functions:
        props = (tool.parameters or {}).get("properties", {})
        if not isinstance(props, dict):
            continue
        for argument in ("cmd", "command"):
            spec = props.get(argument)
            if not isinstance(spec, dict):
                continue
            as_list = spec.get("type") == "array"
            if spec.get("type") in ("string", "array"):
                candidate = (namespace, tool, argument, as_list)
                if tool.name in ("exec_command", "shell"):
                    return candidate
                best = best or candidate
    return best


def _summary(conversation: Conversation, keep: int = 8) -> str:
    """A compaction's deterministic summary: how many items there were, the latest ``keep`` user
    requests (shortened) and the start of the previous summary, if any."""
    items = conversation.items()[:-1]  # the summary prompt aside
    asked: list[str] = []
    earlier = ""
    for item in reversed(items):
        if isinstance(item, Message) and item.role == "user" and len(asked) < keep:
            asked.append(" ".join(text_of(item.content).split())[:60])
        elif isinstance(item, Compaction) and not earlier:
            earlier = " ".join(item.summary.split())[:120]
    lines = [f"Simulated summary of {len(items)} items."]
    lines += [f"The user asked: {text}" for text in reversed(asked)]
    if earlier:
        lines.append(f"Before that: {earlier}")
    return "\n".join(lines)


def _answer(prompt_text: str, tokens: int) -> str:
    snippet = " ".join(prompt_text.split())[:80]
    head = f"Simulated answer to: {snippet}. " if snippet else "Simulated answer. "
    body = (_FILLER * (1 + tokens // 20))[: max(0, tokens * 4 - len(head))]
    return (head + body).strip()
