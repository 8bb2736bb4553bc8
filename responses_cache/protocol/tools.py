"""Tool definitions offered to the model.

Tools arrive as raw JSON (``msgspec.Raw``) on every request; agent clients resend the same tool
list each turn. :func:`parse_tools` looks a list up by its exact bytes in the process-wide :class:`ToolCache`
(bounded in bytes, filled only by turns that succeeded), so a connection that repeats its tools
pays for parsing only once, and a flood of distinct rejected lists pins nothing.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import msgspec
from cachetools import LRUCache

from .codec import check_depth, decode
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


class _Kind(msgspec.Struct):
    type: Any = None


#: Reads only an entry's ``type`` (the rest is skipped, not built).
_kind_decoder = msgspec.json.Decoder(_Kind)

#: What one cached byte of a tool list's JSON is taken to cost once parsed (the bytes themselves
#: plus the decoded dicts and strings): the cache's byte budget is charged this much per byte.
PARSED_BYTES_PER_RAW_BYTE = 4


#: The tool cache's default budget.
DEFAULT_TOOL_CACHE_BYTES = 64 * 1024 * 1024


class ToolCache:
    """The process-wide parsed-tool-list cache, bounded in bytes (least recently used go first).

    It is filled only through :meth:`remember`, which the pipeline calls once a turn has
    succeeded: a request that is rejected leaves nothing behind, however large its tools."""

    def __init__(self, max_bytes: int = DEFAULT_TOOL_CACHE_BYTES) -> None:
        #: Keyed by the list's fingerprint (a 128-bit BLAKE2b digest of its bytes, computed anyway):
        #: hashing a 16-byte key is free, hashing a megabytes-long one is not.
        self._entries: LRUCache[bytes, ToolSet] = LRUCache(maxsize=max(1, max_bytes), getsizeof=_cost)
        #: Tool lists actually parsed (cache misses); tests count work with it.
        self.parses = 0

    @property
    def max_bytes(self) -> int:
        return int(self._entries.maxsize)

    @property
    def bytes_held(self) -> int:
        return int(self._entries.currsize)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, fingerprint: bytes) -> ToolSet | None:
        return self._entries.get(fingerprint)

    def remember(self, tools: ToolSet) -> None:
        """Keep a successfully used tool list (one larger than the whole budget is not kept)."""
        if tools.tools and tools.fingerprint not in self._entries and _cost(tools) <= self._entries.maxsize:
            self._entries[tools.fingerprint] = tools

    def resize(self, max_bytes: int) -> None:
        """Change the budget (drops every entry)."""
        self._entries = LRUCache(maxsize=max(1, max_bytes), getsizeof=_cost)

    def clear(self) -> None:
        self._entries.clear()


def _cost(tools: ToolSet) -> int:
    return PARSED_BYTES_PER_RAW_BYTE * len(tools.raw) + 256


#: The process's tool cache (``ServerConfig.tool_cache_bytes`` resizes it).
tool_cache = ToolCache()


def parse_tools(raw: msgspec.Raw | bytes) -> ToolSet:
    """Parse and validate a ``tools`` array (a cache hit when the same bytes were used before)."""
    data = bytes(raw)
    if not data or data == b"null":
        return EMPTY_TOOLS
    fingerprint = hashlib.blake2b(data, digest_size=16).digest()
    cached = tool_cache.get(fingerprint)
    if cached is not None:
        return cached
    tool_cache.parses += 1
    try:
        elements = _list_decoder.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        raise invalid_request("Invalid type for 'tools': expected an array of tools.", "tools", "invalid_type") from None
    tools: list[Tool] = []
    for i, element in enumerate(elements):
        kind = decode(_kind_decoder, element, prefix=f"tools[{i}]").type
        if kind == "function":
            function = decode(_function_decoder, element, prefix=f"tools[{i}]")
            check_depth(function.parameters, f"tools[{i}].parameters")
            tools.append(function)
        elif kind == "namespace":
            namespace = decode(_namespace_decoder, element, prefix=f"tools[{i}]")
            for j, member in enumerate(namespace.tools):
                check_depth(member.parameters, f"tools[{i}].tools[{j}].parameters")
            tools.append(namespace)
        elif kind == "custom":
            tools.append(decode(_custom_decoder, element, prefix=f"tools[{i}]"))
        elif isinstance(kind, str) and kind:
            head = decode(_head_decoder, element, prefix=f"tools[{i}]")
            check_depth(head, f"tools[{i}]")
            tools.append(HostedTool(kind, head))
        else:
            raise invalid_request(f"Missing required parameter: 'tools[{i}].type'.", f"tools[{i}].type", "missing_required_parameter")
    return ToolSet(tuple(tools), fingerprint, data)
