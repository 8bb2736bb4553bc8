"""Turning an engine's sampled text (special tokens kept) back into backend events.

The server renders the prompt (harmony or ChatML) and sends token ids; the engine streams text
with its special tokens visible (``skip_special_tokens: false``). These parsers follow that text
incrementally and emit reasoning, message text, function calls and custom tool calls as they
arrive. A backend gets the parser of its route's template from the renderer
(:meth:`~responses_cache.tokens.base.BaseRenderer.output_parser`), never by guessing from names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Protocol

from ..engine_events import (
    BackendEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
)

_SPECIAL = re.compile(r"<\|[a-z_]+\|>")
_PARTIAL = re.compile(r"<(\|[a-z_]*\|?)?$")  # a special token cut off at the end of a chunk
_RECIPIENT = re.compile(r"to=([^\s<]+)")


class OutputParser(Protocol):
    def feed(self, text: str) -> Iterator[BackendEvent]: ...

    def close(self) -> Iterator[BackendEvent]: ...


def _split_specials(buffer: str) -> tuple[list[str], str]:
    """Split into plain text and special-token pieces; keep a trailing partial ``<|…`` back."""
    keep = ""
    partial = _PARTIAL.search(buffer)
    if partial is not None:
        buffer, keep = buffer[: partial.start()], buffer[partial.start() :]
    pieces: list[str] = []
    last = 0
    for match in _SPECIAL.finditer(buffer):
        if match.start() > last:
            pieces.append(buffer[last : match.start()])
        pieces.append(match.group())
        last = match.end()
    if last < len(buffer):
        pieces.append(buffer[last:])
    return pieces, keep


class HarmonyParser:
    """gpt-oss harmony: ``<|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>
    commentary to=functions.f <|constrain|>json<|message|>{…}<|call|>`` or ``…final<|message|>…``.

    ``analysis`` → reasoning; ``final`` (and commentary without a recipient) → message text;
    a recipient ``to=NS.NAME`` → a function call (namespace ``NS`` unless it is ``functions``), or
    a custom tool call when ``functions.NAME`` names one of ``custom_tools`` (its text is the input).
    """

    def __init__(self, custom_tools: frozenset[str] = frozenset()) -> None:
        self._custom = custom_tools
        self._pending = ""
        self._header = ""
        self._in_content = False
        self._kind: str | None = None  # "reasoning" | "text" | "call"

    def feed(self, text: str) -> Iterator[BackendEvent]:
        pieces, self._pending = _split_specials(self._pending + text)
        for piece in pieces:
            yield from self._piece(piece)

    def close(self) -> Iterator[BackendEvent]:
        if self._pending:
            pending, self._pending = self._pending, ""
            if self._in_content:
                yield from self._content(pending)

    def _piece(self, piece: str) -> Iterator[BackendEvent]:
        if piece == "<|message|>" and not self._in_content:
            yield from self._start_content()
        elif piece in ("<|end|>", "<|call|>", "<|return|>"):
            self._in_content, self._header, self._kind = False, "", None
        elif piece == "<|start|>":
            self._in_content, self._header = False, ""
        elif self._in_content:
            yield from self._content(piece)
        else:
            self._header += piece

    def _start_content(self) -> Iterator[BackendEvent]:
        header = self._header
        channel_match = re.search(r"<\|channel\|>\s*([A-Za-z_]+)", header)
        channel = channel_match.group(1) if channel_match else "final"
        recipient = _RECIPIENT.search(header)
        self._in_content = True
        if recipient is not None:
            namespace, _, name = recipient.group(1).rpartition(".")
            self._kind = "call"
            name = name or namespace
            plain = namespace in ("", "functions")
            yield ToolCallStart(name=name, namespace=None if plain else namespace, custom=plain and name in self._custom)
        elif channel == "analysis":
            self._kind = "reasoning"
        else:
            self._kind = "text"

    def _content(self, text: str) -> Iterator[BackendEvent]:
        if not text:
            return
        if self._kind == "reasoning":
            yield ReasoningDelta(text)
        elif self._kind == "call":
            yield ToolCallDelta(text)
        else:
            yield TextDelta(text)


class ChatMLParser:
    """ChatML (Hermes/Qwen style): ``<think>…</think>`` → reasoning, ``<tool_call>{"name": …,
    "arguments": …}</tool_call>`` → a function call (``{"name": …, "input": "…"}`` naming one of
    ``custom_tools`` → a custom tool call), the rest → message text."""

    _TAGS = ("<think>", "</think>", "<tool_call>", "</tool_call>")

    def __init__(self, custom_tools: frozenset[str] = frozenset(), *, in_think: bool = False) -> None:
        """``custom_tools``: the request's custom tools, whose calls carry plain-text input.
        ``in_think``: the generation prompt already opened ``<think>`` (Qwen3-style thinking
        templates), so the sampled text starts inside the reasoning and closes it with
        ``</think>``."""
        self._custom = custom_tools
        self._specials_pending = ""
        self._pending = ""
        self._mode = "think" if in_think else "text"  # "text" | "think" | "call"
        self._call = ""

    def feed(self, text: str) -> Iterator[BackendEvent]:
        pieces, self._specials_pending = _split_specials(self._specials_pending + text)
        plain = "".join(p for p in pieces if not _SPECIAL.fullmatch(p))  # <|im_end|> and the like
        buffer = self._pending + plain
        self._pending = ""
        while buffer:
            positions = [(buffer.find(tag), tag) for tag in self._TAGS if buffer.find(tag) != -1]
            if not positions:
                # Hold back a tail that could be the start of a tag.
                hold = 0
                if "<" in buffer[-12:]:  # every tag starts with "<": no tail can begin one otherwise
                    hold = max((k for k in range(1, 13) if any(t.startswith(buffer[-k:]) for t in self._TAGS)), default=0)
                emit, self._pending = (buffer[:-hold], buffer[-hold:]) if hold else (buffer, "")
                yield from self._emit(emit)
                return
            index, tag = min(positions)
            yield from self._emit(buffer[:index])
            buffer = buffer[index + len(tag) :]
            yield from self._switch(tag)

    def close(self) -> Iterator[BackendEvent]:
        pending, self._pending = self._pending, ""
        yield from self._emit(pending)
        if self._mode == "call":
            yield from self._switch("</tool_call>")

    def _emit(self, text: str) -> Iterator[BackendEvent]:
        if not text:
            return
        if self._mode == "think":
            yield ReasoningDelta(text)
        elif self._mode == "call":
            self._call += text
        else:
            yield TextDelta(text)

    def _switch(self, tag: str) -> Iterator[BackendEvent]:
        if tag == "<think>":
            self._mode = "think"
        elif tag == "<tool_call>":
            self._mode, self._call = "call", ""
        elif tag in ("</think>", "</tool_call>"):
            if self._mode == "call":
                try:
                    call = json.loads(self._call)
                    name, arguments = str(call["name"]), call.get("arguments", {})
                except (ValueError, KeyError, TypeError):
                    yield TextDelta(f"<tool_call>{self._call}</tool_call>")  # not a call after all
                else:
                    if name in self._custom and isinstance(call.get("input"), str):
                        yield ToolCallStart(name=name, custom=True)
                        yield ToolCallDelta(call["input"])
                    else:
                        yield ToolCallStart(name=name)
                        yield ToolCallDelta(arguments if isinstance(arguments, str) else json.dumps(arguments))
            self._mode = "text"


def opens_think(generation_prompt: str) -> bool:
    """Whether a generation prompt leaves a ``<think>`` block open."""
    return generation_prompt.rfind("<think>") > generation_prompt.rfind("</think>")
