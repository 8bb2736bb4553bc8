"""Tool definitions offered to the model.

Tools arrive as raw JSON (``msgspec.Raw``) on every request; agent clients resend the same tool
list each turn. :func:`parse_tools` decodes a list once per distinct byte string and caches the
result, so a connection that repeats its tools pays for parsing only once.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import msgspec
from cachetools import LRUCache

from .errors import invalid_request


class FunctionTool(msgspec.Struct, tag="function", frozen=True, omit_defaults=True):
    name: str
    parameters: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class NamespaceTool(msgspec.Struct, tag="namespace", frozen=True, omit_defaults=True):
    name: str
    tools: list[FunctionTool] = msgspec.field(default_factory=list)
    description: str | None = None


class TextFormat(msgspec.Struct, tag="text", frozen=True):
    """Unconstrained text input."""


class GrammarFormat(msgspec.Struct, tag="grammar", frozen=True):
    """Input that must match a grammar (``syntax``: ``lark`` or ``regex``)."""

    syntax: Literal["lark", "regex"]
    definition: str


class CustomTool(msgspec.Struct, tag="custom", frozen=True, omit_defaults=True):
    """A custom (freeform) tool: the model calls it with plain text (``custom_tool_call.input``)."""

    name: str
    description: str | None = None
    format: TextFormat | GrammarFormat | None = None


class HostedTool(msgspec.Struct, frozen=True):
    """A tool the server cannot run itself (``web_search``, ``mcp``…); kept for echoing only."""

    type: str
    config: dict[str, Any]


Tool = FunctionTool | NamespaceTool | CustomTool | HostedTool


class ToolSet(msgspec.Struct, frozen=True):
    """A parsed tool list with a content fingerprint (identical bytes, identical fingerprint)."""

    tools: tuple[Tool, ...]
    fingerprint: bytes
    #: The tool list exactly as the client sent it (JSON), for forwarding and echoing.
    raw: bytes = b"[]"

    def functions(self) -> list[tuple[str | None, FunctionTool]]:
        """Every callable function as ``(namespace, tool)``, hosted tools left out."""
        out: list[tuple[str | None, FunctionTool]] = []
        for tool in self.tools:
            if isinstance(tool, FunctionTool):
                out.append((None, tool))
            elif isinstance(tool, NamespaceTool):
                out.extend((tool.name, t) for t in tool.tools)
        return out

    def customs(self) -> list[CustomTool]:
        """Every custom (freeform) tool."""
        return [tool for tool in self.tools if isinstance(tool, CustomTool)]

    def hosted(self) -> list[HostedTool]:
        """Tools of other kinds (``web_search``, ``mcp``…): echoed, never offered to the model."""
        return [tool for tool in self.tools if isinstance(tool, HostedTool)]


EMPTY_TOOLS = ToolSet((), hashlib.blake2b(b"[]", digest_size=16).digest())
_function_decoder = msgspec.json.Decoder(FunctionTool)
_namespace_decoder = msgspec.json.Decoder(NamespaceTool)
_custom_decoder = msgspec.json.Decoder(CustomTool)
_list_decoder = msgspec.json.Decoder(list[msgspec.Raw])
_head_decoder = msgspec.json.Decoder(dict[str, Any])
_cache: LRUCache[bytes, ToolSet] = LRUCache(maxsize=1024)

#: Number of tool lists actually parsed (cache misses); tests count work with it.
parse_count = 0


def parse_tools(raw: msgspec.Raw | bytes) -> ToolSet:
    """Parse and validate a ``tools`` array, memoised on its exact bytes."""
    global parse_count
    data = bytes(raw)
    if not data or data == b"null":
        return EMPTY_TOOLS
    cached = _cache.get(data)
    if cached is not None:
        return cached
    parse_count += 1
    try:
        elements = _list_decoder.decode(data)
    except msgspec.ValidationError:
        raise invalid_request("Invalid type for 'tools': expected an array of tools.", "tools", "invalid_type") from None
    tools: list[Tool] = []
    for i, element in enumerate(elements):
        head = _head_decoder.decode(element)
        kind = head.get("type")
        try:
            if kind == "function":
                tools.append(_function_decoder.decode(element))
            elif kind == "namespace":
                tools.append(_namespace_decoder.decode(element))
            elif kind == "custom":
                tools.append(_custom_decoder.decode(element))
            elif isinstance(kind, str) and kind:
                tools.append(HostedTool(kind, head))
            else:
                raise invalid_request(f"Missing required parameter: 'tools[{i}].type'.", f"tools[{i}].type", "missing_required_parameter")
        except msgspec.ValidationError as exc:
            from .errors import from_validation_error

            raise from_validation_error(exc, f"tools[{i}]") from None
    result = ToolSet(tuple(tools), hashlib.blake2b(data, digest_size=16).digest(), data)
    _cache[data] = result
    return result
