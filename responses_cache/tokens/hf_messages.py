"""Responses items as chat-completions messages, the input of a Hugging Face chat template.

=========================  ===============================================================
``instructions``           ``{"role": "system", "content": instructions}`` (first message)
user message               ``{"role": "user", "content": text}`` (text parts joined by ``\\n``)
system/developer message   ``{"role": "system", "content": text}``
assistant items            one ``{"role": "assistant"}`` message per run of reasoning, assistant
                           message and tool-call items: ``reasoning_content`` (reasoning text),
                           ``content`` (message text; ``""`` when the turn only calls tools or
                           only reasons, as vLLM's chat endpoint hands it to the template: real
                           templates such as Qwen3's and DeepSeek-V3's concatenate it),
                           ``tool_calls`` (``{"id", "type": "function", "function": {"name",
                           "arguments"}}``, arguments parsed from JSON; anything but a JSON
                           object is ``{}``, as vLLM's chat endpoint makes it).
                           Reasoning after content or calls, or a message after calls, starts a
                           new assistant message.
function_call_output       ``{"role": "tool", "tool_call_id", "name", "content"}``
custom tool                a function with one string parameter ``input``; its calls carry
                           ``{"input": text}`` and its outputs are tool messages
tools                      ``{"type": "function", "function": {"name", "description",
                           "parameters"}}`` (a namespace's functions as ``namespace.name``;
                           ``description`` is ``None`` when the tool has none, as vLLM's chat
                           endpoint hands it to the template)
=========================  ===============================================================

Hosted-tool items have no chat form (refused with a 400). The same messages go to an engine's own
chat endpoint (``POST /tokenize`` with ``messages``), whose template gives the same text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from ..protocol.items import (
    CustomToolCall,
    CustomToolCallOutput,
    FunctionCall,
    FunctionCallOutput,
    HostedItem,
    Item,
    ItemReference,
    Message,
    Reasoning,
)
from ..protocol.tools import CustomTool, FunctionTool, NamespaceTool, ToolSet
from .base import custom_tool_description, item_texts, reasoning_texts
from .errors import UnknownCallError, UnrenderableItemError

#: The parameters a custom tool is declared with (its calls carry ``{"input": text}``).
CUSTOM_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"input": {"type": "string"}},
    "required": ["input"],
}
_NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def qualified(namespace: str | None, name: str) -> str:
    return f"{namespace}.{name}" if namespace else name


def chat_tools(tools: ToolSet) -> list[dict[str, Any]] | None:
    """The request's function and custom tools as chat-completions tools (None without any)."""
    out: list[dict[str, Any]] = []

    def add(name: str, description: str | None, parameters: dict[str, Any] | None) -> None:
        # vLLM validates tools into its own model and dumps them: ``description`` is always there.
        fn: dict[str, Any] = {"name": name, "description": description}
        fn["parameters"] = parameters if parameters is not None else _NO_PARAMETERS
        out.append({"type": "function", "function": fn})

    for tool in tools.tools:
        if isinstance(tool, FunctionTool):
            add(tool.name, tool.description, tool.parameters)
        elif isinstance(tool, NamespaceTool):
            for fn in tool.tools:
                add(qualified(tool.name, fn.name), fn.description, fn.parameters)
        elif isinstance(tool, CustomTool):
            add(tool.name, custom_tool_description(tool), CUSTOM_PARAMETERS)
    return out or None


def parse_arguments(text: str) -> dict[str, Any]:
    """Call arguments as the template sees them: the JSON object, else ``{}`` (vLLM's chat
    endpoint replaces arguments that are not a JSON object with ``{}``; templates take a mapping)."""
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def chat_messages(
    instructions: str | None,
    items: Sequence[Item],
    *,
    first_new: int = 0,
    calls: Callable[[str], str | None] | None = None,
    arguments: Callable[[str], dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The conversation as chat messages. Errors name the item's index minus ``first_new`` (the
    position in the items of the current call). ``calls``: the function name of a ``call_id``
    made before ``items`` (for a window of a longer conversation). ``arguments``: parses a function
    call's arguments (default :func:`parse_arguments`; the objects are put in the messages as they
    are, and nothing here changes them)."""
    builder = _MessageBuilder(instructions, calls, arguments or parse_arguments)
    for i, item in enumerate(items):
        builder.add(item, i - first_new)
    return builder.finish()


class _MessageBuilder:
    """Chat messages built item by item (:func:`chat_messages`): the assistant message being
    filled by a run of assistant items, and the function name of each call made so far."""

    __slots__ = ("_calls", "_current", "_names", "_out", "_parse")

    def __init__(
        self,
        instructions: str | None,
        calls: Callable[[str], str | None] | None,
        parse: Callable[[str], dict[str, Any]],
    ) -> None:
        self._calls = calls
        self._parse = parse
        self._out: list[dict[str, Any]] = []
        if instructions:
            self._out.append({"role": "system", "content": instructions})
        self._names: dict[str, str] = {}
        self._current: dict[str, Any] | None = None  # the assistant message being filled

    def add(self, item: Item, at: int) -> None:
        """Add ``item``, the ``at``-th of the current call (for errors)."""
        if isinstance(item, (HostedItem, ItemReference)):
            kind = item.type if isinstance(item, HostedItem) else "item_reference"
            raise UnrenderableItemError(item_index=at, item_type=kind, template="hf")
        if isinstance(item, Reasoning):
            self._reasoning(item)
        elif isinstance(item, Message) and item.role == "assistant":
            self._answer(item, at)
        elif isinstance(item, (FunctionCall, CustomToolCall)):
            self._call(item)
        else:
            self._current = None
            if isinstance(item, Message):
                role = "user" if item.role == "user" else "system"
                self._out.append({"role": role, "content": "\n".join(item_texts(item.content, at, "content"))})
            elif isinstance(item, (FunctionCallOutput, CustomToolCallOutput)):
                self._output(item, at)
            else:  # pragma: no cover - every item type is handled above
                raise TypeError(f"cannot render item of type {type(item).__name__}")

    def finish(self) -> list[dict[str, Any]]:
        """The messages, every assistant one with a ``content``."""
        for message in self._out:
            if message["role"] == "assistant" and "content" not in message:
                message["content"] = ""  # vLLM's chat endpoint: an absent content is the empty text
        return self._out

    def _assistant(self, *, after: tuple[str, ...]) -> dict[str, Any]:
        """The assistant message to fill: the current one, unless there is none or it already
        holds one of the fields ``after`` (then a new one)."""
        current = self._current
        if current is None or any(field in current for field in after):
            current = self._current = {"role": "assistant"}
            self._out.append(current)
        return current

    def _reasoning(self, item: Reasoning) -> None:
        text = "\n".join(reasoning_texts(item))
        if not text:
            return  # nothing to show (encrypted_content only)
        current = self._assistant(after=("content", "tool_calls"))
        previous = current.get("reasoning_content")
        current["reasoning_content"] = f"{previous}\n{text}" if previous else text

    def _answer(self, item: Message, at: int) -> None:
        text = "".join(item_texts(item.content, at, "content"))
        self._assistant(after=("content", "tool_calls"))["content"] = text

    def _call(self, item: FunctionCall | CustomToolCall) -> None:
        name = qualified(item.namespace, item.name)
        self._names[item.call_id] = name
        args = self._parse(item.arguments) if isinstance(item, FunctionCall) else {"input": item.input}
        self._assistant(after=()).setdefault("tool_calls", []).append(
            {"id": item.call_id, "type": "function", "function": {"name": name, "arguments": args}}
        )

    def _output(self, item: FunctionCallOutput | CustomToolCallOutput, at: int) -> None:
        called = self._names.get(item.call_id)
        if called is None and self._calls is not None:
            called = self._calls(item.call_id)
        if called is None:
            raise UnknownCallError(item_index=at, call_id=item.call_id)
        text = "\n".join(item_texts(item.output, at, "output"))
        self._out.append({"role": "tool", "tool_call_id": item.call_id, "name": called, "content": text})


def engine_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` in the chat-completions wire format an engine's ``/tokenize`` or chat endpoint
    takes: call arguments as JSON text (vLLM parses them back into the object the template sees);
    reasoning also as ``reasoning``, the field vLLM reads (it hands the template both names;
    SGLang reads ``reasoning_content``)."""
    out = []
    for message in messages:
        reasoning = message.get("reasoning_content")
        if reasoning is not None:
            message = {**message, "reasoning": reasoning}
        calls = message.get("tool_calls")
        if calls:
            message = {**message, "tool_calls": [
                {**call, "function": {**call["function"], "arguments": _argument_text(call["function"]["arguments"])}}
                for call in calls
            ]}
        out.append(message)
    return out


def _argument_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def template_view(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as ``apply_chat_template`` hands them to the template: reasoning also under
    ``thinking`` (the name gpt-oss-style templates read) and ``reasoning`` (vLLM's chat path gives
    the template ``reasoning`` and ``reasoning_content``)."""
    out = []
    for message in messages:
        reasoning = message.get("reasoning_content")
        if reasoning is not None:
            message = {"thinking": reasoning, "reasoning": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out
