"""Responses items as chat-completions messages, byte-stable across turns.

An agent loop resends the whole conversation every turn; the engine's prefix cache only helps if
the earlier turns serialize to the same bytes each time. So the conversion is a pure function of
the items: call ids and argument JSON are passed through verbatim, an assistant turn's reasoning
goes back in the message's ``reasoning`` field (with ``clear_thinking: false`` the engine keeps
it), and nothing depends on the turn being rendered.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

#: Chat function names cannot contain dots: a namespaced tool ``ns``/``name`` is ``ns__name``.
NAMESPACE_SEPARATOR = "__"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = content or []
    return "".join(str(p.get("text", "")) for p in parts if isinstance(p, Mapping) and "text" in p)


def to_messages(instructions: str | None, items: Iterable[Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    assistant: dict[str, Any] | None = None

    def open_assistant() -> dict[str, Any]:
        nonlocal assistant
        if assistant is None:
            assistant = {"role": "assistant", "content": ""}
            messages.append(assistant)
        return assistant

    for item in items:
        data = msgspec.to_builtins(item)
        kind = data.get("type")
        if kind == "reasoning":
            text = "".join(str(p.get("text", "")) for p in data.get("content") or [])
            if text:
                message = open_assistant()
                message["reasoning"] = message.get("reasoning", "") + text
        elif kind == "function_call":
            name = data["name"] if not data.get("namespace") else f"{data['namespace']}{NAMESPACE_SEPARATOR}{data['name']}"
            call = {"id": data["call_id"], "type": "function", "function": {"name": name, "arguments": data["arguments"]}}
            open_assistant().setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            assistant = None
            messages.append({"role": "tool", "tool_call_id": data["call_id"], "content": _text(data.get("output"))})
        elif kind == "message" and data.get("role") == "assistant":
            message = open_assistant()
            message["content"] = message["content"] + _text(data.get("content"))
        elif kind == "message":
            assistant = None
            role = "system" if data.get("role") == "developer" else data.get("role", "user")
            messages.append({"role": role, "content": _text(data.get("content"))})
    return messages


def to_tools(tools: Any) -> list[dict[str, Any]]:
    """``request.tools`` (its functions, namespaced ones joined with ``__``) as chat tools."""
    out: list[dict[str, Any]] = []
    for namespace, tool in tools.functions():
        function: dict[str, Any] = {
            "name": tool.name if namespace is None else f"{namespace}{NAMESPACE_SEPARATOR}{tool.name}"
        }
        if tool.description:
            function["description"] = tool.description
        function["parameters"] = tool.parameters or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": function})
    return out


def split_name(name: str) -> tuple[str | None, str]:
    namespace, sep, rest = name.partition(NAMESPACE_SEPARATOR)
    return (namespace, rest) if sep and rest else (None, name)


def to_tool_choice(choice: Any) -> Any:
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice
