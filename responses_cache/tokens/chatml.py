"""A ChatML renderer for cl100k_base / o200k_base models (Hermes/Qwen-style tool calls).

=========================  ===============================================================
``instructions`` + tools   ``<|im_start|>system\\n{instructions}\\n\\n# Tools …<tools>…</tools>…<|im_end|>\\n``
message (any role)         ``<|im_start|>{role}\\n{text}<|im_end|>\\n``
reasoning                  ``<|im_start|>assistant\\n<think>\\n{text}\\n</think><|im_end|>\\n``
function_call              ``<|im_start|>assistant\\n<tool_call>\\n{"name": …, "arguments": …}\\n</tool_call><|im_end|>\\n``
function_call_output       ``<|im_start|>tool\\n<tool_response>\\n{output}\\n</tool_response><|im_end|>\\n``
custom tool                ``{"type": "custom", "custom": {"name": …, "description": …}}`` in ``<tools>``
                           (the description ends with the input format, as in harmony)
custom_tool_call           ``<|im_start|>assistant\\n<tool_call>\\n{"name": …, "input": "<text as a JSON string>"}\\n</tool_call><|im_end|>\\n``
custom_tool_call_output    as a function_call_output
generation prompt          ``<|im_start|>assistant\\n``
=========================  ===============================================================

Hosted-tool items (``web_search_call``…) have no ChatML form; they are refused (400).

The role line and the body of a message are encoded separately (so the generation prompt is a
prefix of the rendered reply); every piece of text goes through ``encode_ordinary``. ChatML
never rewrites history.
"""

from __future__ import annotations

import json
from array import array

from ..protocol.items import (
    CustomToolCall,
    CustomToolCallOutput,
    FunctionCall,
    FunctionCallOutput,
    Item,
    Message,
    Reasoning,
)
from ..protocol.tools import CustomTool, FunctionTool, NamespaceTool, ToolSet
from .base import BaseRenderer, Rendered, custom_tool_description, item_texts, reasoning_texts
from .compact import ordinary_encoder
from .log import ANALYSIS, ASSISTANT, FINAL
from .parsing import ChatMLParser, OutputParser, opens_think
from .vocab import CHATML_SPECIALS, load_chatml_encoding

_TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
_TOOLS_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


class ChatMLRenderer(BaseRenderer):
    """Renders Responses conversations as ChatML (``<|im_start|>role\\n…<|im_end|>``)."""

    template = "chatml"

    def __init__(self, encoding: str = "cl100k_base", *, vocab_dir: str | None = None) -> None:
        if encoding not in CHATML_SPECIALS:
            raise ValueError(
                f"the chatml template supports {', '.join(CHATML_SPECIALS)}, not {encoding!r}"
            )
        enc = load_chatml_encoding(encoding, vocab_dir)
        self._im_start = enc._special_tokens["<|im_start|>"]
        self._im_end = enc._special_tokens["<|im_end|>"]
        self._eot = enc._special_tokens["<|endoftext|>"]
        self._enc = ordinary_encoder(enc)
        self._newline = self._enc("\n")
        super().__init__(enc, encoding, "")

    @property
    def stop_tokens(self) -> tuple[int, ...]:
        """``<|im_end|>`` and ``<|endoftext|>``."""
        return (self._im_end, self._eot)

    @property
    def sampling_stop_tokens(self) -> tuple[int, ...]:
        """``<|im_end|>``."""
        return (self._im_end,)

    def output_parser(self, custom_tools: frozenset[str] = frozenset()) -> OutputParser:
        return ChatMLParser(custom_tools, in_think=self._opens_think)

    def end_token(self, tool_call: bool) -> int:
        return self._im_end

    def tool_call_prefix(self, name: str | None) -> str:
        closing = "\n</think>\n\n" if self._opens_think else ""
        return closing + '<tool_call>\n{"name": "' + (f'{name}", "arguments": ' if name else "")

    @property
    def _opens_think(self) -> bool:
        """Whether the generation prompt leaves a ``<think>`` block open (thinking templates)."""
        return opens_think(self.decode(list(self.generation_prompt)))

    @property
    def _message_start(self) -> int:
        return self._im_start

    def _generation_prompt(self) -> array[int]:
        out = array("I", (self._im_start,))
        out.extend(self._enc("assistant\n"))
        return out

    def _message(self, role: str, text: str) -> array[int]:
        # The role line is encoded on its own, so the generation prompt ("assistant\n") is
        # always a prefix of a rendered assistant message, whatever its text starts with.
        out = array("I", (self._im_start,))
        out.extend(self._enc(f"{role}\n"))
        out.extend(self._enc(text))
        out.append(self._im_end)
        out.extend(self._newline)
        return out

    @staticmethod
    def _qualified(namespace: str | None, name: str) -> str:
        return f"{namespace}.{name}" if namespace else name

    def tools_text(self, tools: ToolSet) -> str | None:
        """The ``# Tools`` block (one JSON signature per line), or None without function tools."""
        lines: list[str] = []
        for tool in tools.tools:
            if isinstance(tool, CustomTool):
                custom = {"name": tool.name, "description": custom_tool_description(tool)}
                lines.append(json.dumps({"type": "custom", "custom": custom}, ensure_ascii=False))
                continue
            fns: list[tuple[str | None, FunctionTool]] = []
            if isinstance(tool, FunctionTool):
                fns.append((None, tool))
            elif isinstance(tool, NamespaceTool):
                fns.extend((tool.name, f) for f in tool.tools)
            for ns, fn in fns:
                spec: dict[str, object] = {"name": self._qualified(ns, fn.name)}
                if fn.description is not None:
                    spec["description"] = fn.description
                if fn.parameters is not None:
                    spec["parameters"] = fn.parameters
                lines.append(json.dumps({"type": "function", "function": spec}, ensure_ascii=False))
        if not lines:
            return None
        return _TOOLS_INTRO + "\n".join(lines) + _TOOLS_OUTRO

    def _render_header(self, instructions: str | None, tools: ToolSet) -> array[int]:
        parts = [p for p in (instructions, self.tools_text(tools)) if p]
        if not parts:
            return array("I")
        return self._message("system", "\n\n".join(parts))

    def _call_target(self, item: FunctionCall | CustomToolCall) -> str:
        return self._qualified(item.namespace, item.name)

    def _render_item(self, item: Item, index: int, call_target: str | None) -> Rendered:
        if isinstance(item, Message):
            text = "".join(item_texts(item.content, index, "content"))
            flags = ASSISTANT | FINAL if item.role == "assistant" else 0
            return Rendered(self._message(item.role, text), flags)
        if isinstance(item, FunctionCall):
            body = (
                f'<tool_call>\n{{"name": {json.dumps(self._call_target(item), ensure_ascii=False)}, '
                f'"arguments": {item.arguments or "{}"}}}\n</tool_call>'
            )
            return Rendered(self._message("assistant", body), ASSISTANT)
        if isinstance(item, CustomToolCall):
            body = (
                f'<tool_call>\n{{"name": {json.dumps(self._call_target(item), ensure_ascii=False)}, '
                f'"input": {json.dumps(item.input, ensure_ascii=False)}}}\n</tool_call>'
            )
            return Rendered(self._message("assistant", body), ASSISTANT)
        if isinstance(item, (FunctionCallOutput, CustomToolCallOutput)):
            text = "".join(item_texts(item.output, index, "output"))
            body = f"<tool_response>\n{text}\n</tool_response>"
            return Rendered(self._message("tool", body), 0)
        if isinstance(item, Reasoning):
            text = "".join(reasoning_texts(item))
            if not text:
                return Rendered(array("I"), 0)
            body = f"<think>\n{text}\n</think>"
            return Rendered(self._message("assistant", body), ASSISTANT | ANALYSIS)
        raise TypeError(f"cannot render item of type {type(item).__name__}")

    def _sampled_flags(self, item: Item) -> int:
        if isinstance(item, Reasoning):
            return ASSISTANT | ANALYSIS
        if isinstance(item, Message):
            return ASSISTANT | FINAL
        return ASSISTANT

    def _finish_sampled(self, seg: array[int], item: Item) -> array[int]:
        """Close the last sampled message with ``<|im_end|>`` (if cut off) and the newline."""
        if seg and seg[-1] == self._eot:
            seg[-1] = self._im_end
        elif not seg or seg[-1] != self._im_end:
            seg.append(self._im_end)
        seg.extend(self._newline)
        return seg
