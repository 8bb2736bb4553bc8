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
    parse = arguments or parse_arguments
    out: list[dict[str, Any]] = []
    if instructions:
        out.append({"role": "system", "content": instructions})
    names: dict[str, str] = {}
    current: dict[str, Any] | None = None  # the assistant message being filled
    for i, item in enumerate(items):
        at = i - first_new
        if isinstance(item, (HostedItem, ItemReference)):
            kind = item.type if isinstance(item, HostedItem) else "item_reference"
            raise UnrenderableItemError(item_index=at, item_type=kind, template="hf")
        if isinstance(item, Reasoning):
            text = "\n".join(reasoning_texts(item))
            if not text:
                continue  # nothing to show (encrypted_content only)
            if current is None or "content" in current or "tool_calls" in current:
                current = {"role": "assistant"}
                out.append(current)
            previous = current.get("reasoning_content")
            current["reasoning_content"] = f"{previous}\n{text}" if previous else text
        elif isinstance(item, Message) and item.role == "assistant":
            text = "".join(item_texts(item.content, at, "content"))
            if current is None or "content" in current or "tool_calls" in current:
                current = {"role": "assistant"}
                out.append(current)
            current["content"] = text
        elif isinstance(item, (FunctionCall, CustomToolCall)):
            name = qualified(item.namespace, item.name)
            names[item.call_id] = name
            args = parse(item.arguments) if isinstance(item, FunctionCall) else {"input": item.input}
            if current is None:
                current = {"role": "assistant"}
                out.append(current)
            current.setdefault("tool_calls", []).append(
                {"id": item.call_id, "type": "function", "function": {"name": name, "arguments": args}}
            )
        else:
            current = None
            if isinstance(item, Message):
                role = "user" if item.role == "user" else "system"
                out.append({"role": role, "content": "\n".join(item_texts(item.content, at, "content"))})
            elif isinstance(item, (FunctionCallOutput, CustomToolCallOutput)):
                called = names.get(item.call_id)
                if called is None and calls is not None:
                    called = calls(item.call_id)
                if called is None:
                    raise UnknownCallError(item_index=at, call_id=item.call_id)
                text = "\n".join(item_texts(item.output, at, "output"))
                out.append({"role": "tool", "tool_call_id": item.call_id, "name": called, "content": text})
            else:  # pragma: no cover - every item type is handled above
                raise TypeError(f"cannot render item of type {type(item).__name__}")
    for message in out:
        if message["role"] == "assistant" and "content" not in message:
            message["content"] = ""  # vLLM's chat endpoint: an absent content is the empty text
    return out


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
