"""Output parsers for the ``hf`` renderer's model families.

The engine streams the sampled text with special tokens visible; a family's parser turns it into
reasoning deltas, message text deltas and tool calls (``ToolCallStart`` then the arguments):

==========  ==========================================================================
``hermes``  Qwen / Hermes: ``<tool_call>{"name": …, "arguments": {…}}</tool_call>``
``llama3``  Llama 3.x JSON tools: the reply is ``{"name": …, "parameters": {…}}`` (several
            joined by ``;``), optionally after ``<|python_tag|>``
``deepseek`` ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{…}\\n```<｜tool▁call▁end｜>``
            inside ``<｜tool▁calls▁begin｜>…<｜tool▁calls▁end｜>``
``mistral`` ``[TOOL_CALLS][{"name": …, "arguments": {…}}, …]``
``plain``   no tool calls
==========  ==========================================================================

Every family reads ``<think>…</think>`` as reasoning (``in_think``: the generation prompt opened
it already). A call's arguments stream as deltas once its name is known (the name first, then a
JSON object: each format's usual order); a call in another order, or to a custom tool, is parsed
whole when its block ends, and one that does not parse is text. Other added tokens (end of turn, role markers) are dropped from the text. A call to
one of the request's custom tools (declared with one ``input`` parameter) becomes a custom tool
call carrying that text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from ..engine_events import BackendEvent, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallStart
from ..protocol.ids import short_call_id

FORMATS = ("hermes", "llama3", "deepseek", "mistral", "plain")

_DS_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
_DS_CALLS_END = "<｜tool▁calls▁end｜>"
_DS_CALL_BEGIN = "<｜tool▁call▁begin｜>"
_DS_CALL_END = "<｜tool▁call▁end｜>"
_DS_SEP = "<｜tool▁sep｜>"
_DS_BODY = re.compile(r"^\s*(?:function)?\s*" + re.escape(_DS_SEP) + r"(?P<name>[^\n]*)\n```(?:json)?\n(?P<args>.*)\n```\s*$", re.S)


_NAME = r'"(?P<name>(?:[^"\\]|\\.)*)"'
#: Per format: what precedes a call's arguments (its name inside); the arguments, a JSON object,
#: then stream as they come. ``search``: several calls may follow in one block.
_CALL_PREFIX = {
    "hermes": re.compile(r'\s*\{\s*"name"\s*:\s*' + _NAME + r'\s*,\s*"arguments"\s*:\s*'),
    "llama3": re.compile(r'[\s;]*\{\s*"name"\s*:\s*' + _NAME + r'\s*,\s*"(?:parameters|arguments)"\s*:\s*'),
    "mistral": re.compile(r'[\s\[,]*\{\s*"name"\s*:\s*' + _NAME + r'\s*,\s*"arguments"\s*:\s*'),
    "deepseek": re.compile(r"\s*(?:function)?\s*" + re.escape(_DS_SEP) + r"(?P<name>[^\n]*)\n```(?:json)?\n"),
}


class _JsonValue:
    """Finds where a JSON object or array ends in text fed piece by piece."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False

    def feed(self, text: str) -> tuple[int, bool]:
        """(how many characters of ``text`` belong to the value, whether it ended)."""
        for i, ch in enumerate(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return i + 1, True
        return len(text), False


def detect_format(template: str) -> str:
    """The output format a chat template's tool calls use."""
    if _DS_CALL_BEGIN in template or "tool▁call▁begin" in template:
        return "deepseek"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<tool_call>" in template:
        return "hermes"
    if "<|start_header_id|>" in template:
        return "llama3"
    return "plain"


def tool_call_prefix(fmt: str, name: str | None, *, in_think: bool) -> str:
    """Text that, after the generation prompt, starts a call (to ``name``, or to any function)."""
    closing = "\n</think>\n\n" if in_think else ""
    if fmt == "hermes":
        return closing + '<tool_call>\n{"name": "' + (f'{name}", "arguments": ' if name else "")
    if fmt == "llama3":
        return closing + '{"name": "' + (f'{name}", "parameters": ' if name else "")
    if fmt == "deepseek":
        return closing + _DS_CALLS_BEGIN + _DS_CALL_BEGIN + "function" + _DS_SEP + (f"{name}\n```json\n" if name else "")
    if fmt == "mistral":
        return closing + '[TOOL_CALLS][{"name": "' + (f'{name}", "arguments": ' if name else "")
    raise ValueError(f"the {fmt} output format has no tool calls")


def family_parser(fmt: str, custom_tools: frozenset[str], *, in_think: bool, specials: frozenset[str]) -> FamilyParser:
    if fmt not in FORMATS:
        raise ValueError(f"unknown output format {fmt!r}; expected one of {', '.join(FORMATS)}")
    return FamilyParser(fmt, custom_tools, in_think=in_think, specials=specials)


class FamilyParser:
    """Incremental parser of one family's sampled text (see the module docstring)."""

    def __init__(self, fmt: str, custom_tools: frozenset[str], *, in_think: bool, specials: frozenset[str]) -> None:
        self._fmt = fmt
        self._custom = custom_tools
        opens = {"hermes": ("<tool_call>",), "deepseek": (_DS_CALL_BEGIN,), "mistral": ("[TOOL_CALLS]",)}.get(fmt, ())
        closes = {"hermes": ("</tool_call>",), "deepseek": (_DS_CALL_END,)}.get(fmt, ())
        self._open = opens
        self._close = closes
        self._tags = ("<think>", "</think>", *opens, *closes)
        ignored = {_DS_CALLS_BEGIN, _DS_CALLS_END} if fmt == "deepseek" else set()
        if fmt == "llama3":
            ignored.add("<|python_tag|>")
        #: Added tokens that are not tags: dropped from the text.
        self._drop = tuple(sorted((specials - set(self._tags)) | ignored, key=len, reverse=True))
        self._all = self._tags + self._drop
        #: Any character a tag starts with: a tail without one cannot be the start of a tag.
        firsts = "".join(sorted({t[0] for t in self._all if t}))
        self._firsts = re.compile(f"[{re.escape(firsts)}]") if firsts else None
        self._pending = ""
        self._mode = "think" if in_think else "text"  # "text" | "think" | "call"
        self._call = ""
        self._started = False  # llama3: whether the reply's first character was seen
        self._prefix = _CALL_PREFIX.get(fmt)
        self._args: _JsonValue | None = None  # the arguments being streamed
        self._streamed = False  # this block's calls were streamed (no parsing at its end)
        self._buffered = False  # a call this parser cannot stream (a custom tool's input)

    def feed(self, text: str) -> Iterator[BackendEvent]:
        buffer = self._pending + text
        self._pending = ""
        while buffer:
            found = [(buffer.find(t), -len(t), t) for t in self._all if t in buffer]
            if not found:
                hold = 0
                if self._firsts is not None and self._firsts.search(buffer, max(len(buffer) - 24, 0)):
                    hold = max((k for k in range(1, min(len(buffer), 24) + 1) if any(t.startswith(buffer[-k:]) for t in self._all)), default=0)
                emit, self._pending = (buffer[:-hold], buffer[-hold:]) if hold else (buffer, "")
                yield from self._emit(emit)
                return
            index, _, tag = min(found)
            yield from self._emit(buffer[:index])
            buffer = buffer[index + len(tag) :]
            if tag in self._tags:
                yield from self._switch(tag)
            elif self._mode == "call" and tag == _DS_SEP:
                yield from self._call_text(tag)  # the separator inside a DeepSeek call

    def close(self) -> Iterator[BackendEvent]:
        pending, self._pending = self._pending, ""
        yield from self._emit(pending)
        if self._mode == "call":
            yield from self._finish_call()
        elif self._call:  # llama3: only whitespace came
            text, self._call = self._call, ""
            yield TextDelta(text)

    # -- internals ----------------------------------------------------------------------------

    def _emit(self, text: str) -> Iterator[BackendEvent]:
        if not text:
            return
        if self._mode == "think":
            yield ReasoningDelta(text)
            return
        if self._mode == "text" and self._fmt == "llama3" and not self._started:
            stripped = text.lstrip()
            if not stripped:
                self._call += text  # leading whitespace: wait for the first character
                return
            self._started = True
            if stripped.startswith("{"):
                self._mode, self._call = "call", ""
                yield from self._call_text(stripped)
                return
            text, self._call = self._call + text, ""
        if self._mode == "call":
            yield from self._call_text(text)
        else:
            yield TextDelta(text)

    def _call_text(self, text: str) -> Iterator[BackendEvent]:
        """Text inside a call block: once the name is known, the arguments stream as deltas."""
        self._call += text
        while self._prefix is not None and not self._buffered:
            if self._args is None:
                match = (self._prefix.search if self._streamed else self._prefix.match)(self._call)
                rest = self._call[match.end() :] if match is not None else ""
                if match is None or not rest.lstrip():
                    return  # wait for the name and the first character of the arguments
                if rest.lstrip()[0] not in "{[" or self._unescape(match.group("name")) in self._custom:
                    self._buffered = not self._streamed  # parsed whole when the block ends
                    return
                yield self._start(self._unescape(match.group("name")).strip())
                self._args, self._streamed, self._call = _JsonValue(), True, rest.lstrip()
            used, done = self._args.feed(self._call)
            if used:
                yield ToolCallDelta(self._call[:used])
            self._call = self._call[used:]
            if not done:
                return
            self._args = None

    def _start(self, name: str, *, custom: bool = False) -> ToolCallStart:
        """A call's start (``ns.name`` is a call in namespace ``ns``). Mistral's templates take
        only call ids of nine letters and digits (``raise_exception`` otherwise), the ids its
        serving stacks make: a call parsed in that format gets one."""
        call_id = short_call_id() if self._fmt == "mistral" else None
        if custom:
            return ToolCallStart(name=name, call_id=call_id, custom=True)
        namespace, _, short = name.rpartition(".")
        return ToolCallStart(name=short or name, call_id=call_id, namespace=namespace or None)

    @staticmethod
    def _unescape(name: str) -> str:
        try:
            return str(json.loads(f'"{name}"'))
        except ValueError:
            return name

    def _switch(self, tag: str) -> Iterator[BackendEvent]:
        if tag == "<think>":
            self._mode = "think"
        elif tag == "</think>":
            self._mode = "text"
            self._started = False
            self._call = ""
        elif tag in self._open:
            if self._mode == "call":
                yield from self._finish_call()
            self._mode, self._call = "call", ""
        elif tag in self._close and self._mode == "call":
            yield from self._finish_call()

    def _finish_call(self) -> Iterator[BackendEvent]:
        body, self._call = self._call, ""
        self._mode = "text"
        streamed, self._streamed, self._buffered, self._args = self._streamed, False, False, None
        if streamed:
            return  # the calls went out as they came; the rest is the block's closing syntax
        calls = self._calls(body)
        if calls is None:
            opener = self._open[0] if self._open else ""
            closer = self._close[0] if self._close else ""
            yield TextDelta(f"{opener}{body}{closer}")  # not a call after all
            return
        for name, arguments in calls:
            yield from self._call_events(name, arguments)

    def _calls(self, body: str) -> list[tuple[str, Any]] | None:
        try:
            if self._fmt == "hermes":
                call = json.loads(body)
                return [(str(call["name"]), call.get("arguments", {}))]
            if self._fmt == "deepseek":
                match = _DS_BODY.match(body)
                if match is None:
                    return None
                return [(match.group("name").strip(), json.loads(match.group("args")))]
            if self._fmt == "mistral":
                calls = json.loads(body)
                calls = calls if isinstance(calls, list) else [calls]
                return [(str(c["name"]), c.get("arguments", {})) for c in calls]
            if self._fmt == "llama3":
                decoder = json.JSONDecoder()
                out: list[tuple[str, Any]] = []
                rest = body.strip()
                while rest:
                    call, end = decoder.raw_decode(rest)
                    out.append((str(call["name"]), call.get("parameters", call.get("arguments", {}))))
                    rest = rest[end:].lstrip().removeprefix(";").lstrip()
                return out or None
        except (ValueError, KeyError, TypeError):
            return None
        return None

    def _call_events(self, name: str, arguments: Any) -> Iterator[BackendEvent]:
        if name in self._custom and isinstance(arguments, dict) and isinstance(arguments.get("input"), str):
            yield self._start(name, custom=True)
            yield ToolCallDelta(arguments["input"])
            return
        yield self._start(name)
        yield ToolCallDelta(arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False))
