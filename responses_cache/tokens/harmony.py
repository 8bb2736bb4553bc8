"""The harmony renderer (gpt-oss), token-for-token compatible with openai-harmony 0.0.8.

Mapping of Responses items to harmony messages:

=========================  ===============================================================
``instructions`` + tools   developer message: ``# Instructions`` and ``# Tools`` sections
(always)                   system message (model identity, cutoff, reasoning, channels)
user/system/developer msg  ``<|start|>{role}<|message|>{text}<|end|>``
assistant message          ``<|start|>assistant<|channel|>final<|message|>…<|end|>``
                           (``phase="commentary"``: the ``commentary`` channel)
reasoning                  ``<|start|>assistant<|channel|>analysis<|message|>…<|end|>``
function_call              ``<|start|>assistant to={ns}.{name}<|channel|>commentary
                           <|constrain|>json<|message|>{arguments}<|call|>`` (ns: the call's
                           ``namespace``, else ``functions``)
function_call_output       ``<|start|>{ns}.{name} to=assistant<|channel|>commentary<|message|>
                           {output}<|end|>`` (name from the matching call)
custom tool                declared in ``functions`` as ``type {name} = (_: string) => any;``,
                           its description followed by the input format (``custom_tool_description``)
custom_tool_call           ``<|start|>assistant to=functions.{name}<|channel|>commentary<|message|>
                           {input}<|call|>`` (no ``<|constrain|>``: the input is plain text)
custom_tool_call_output    as a function_call_output
=========================  ===============================================================

Hosted-tool items (``web_search_call``…) have no harmony form; they are refused (400).

With ``auto_drop_analysis`` (the default, like openai-harmony), analysis messages before the first
``final`` message are hidden whenever the last assistant message is ``final``.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any, Literal

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
from .log import ANALYSIS, ASSISTANT, FINAL, Facts
from .parsing import HarmonyParser, OutputParser
from .tsschema import tools_section
from .vocab import load_encoding

DEFAULT_MODEL_IDENTITY = "You are ChatGPT, a large language model trained by OpenAI."
ReasoningEffort = Literal["low", "medium", "high"]


class HarmonyRenderer(BaseRenderer):
    """Renders Responses conversations in OpenAI's harmony format (gpt-oss).

    Options mirror openai-harmony's ``SystemContent`` defaults; they are part of the fingerprint.
    """

    template = "harmony"

    def __init__(
        self,
        encoding: str = "o200k_harmony",
        *,
        model_identity: str | None = DEFAULT_MODEL_IDENTITY,
        reasoning_effort: ReasoningEffort | None = "medium",
        knowledge_cutoff: str | None = "2024-06",
        conversation_start_date: str | None = None,
        auto_drop_analysis: bool = True,
        vocab_dir: str | None = None,
    ) -> None:
        if encoding != "o200k_harmony":
            raise ValueError(f"the harmony template needs the o200k_harmony encoding, not {encoding!r}")
        if reasoning_effort not in (None, "low", "medium", "high"):
            raise ValueError(f"invalid reasoning_effort {reasoning_effort!r}")
        enc = load_encoding(encoding, vocab_dir)
        specials = enc._special_tokens
        self._start = specials["<|start|>"]
        self._end = specials["<|end|>"]
        self._message = specials["<|message|>"]
        self._channel = specials["<|channel|>"]
        self._constrain = specials["<|constrain|>"]
        self._call = specials["<|call|>"]
        self._return = specials["<|return|>"]
        self.model_identity = model_identity
        self.reasoning_effort = reasoning_effort
        self.knowledge_cutoff = knowledge_cutoff
        self.conversation_start_date = conversation_start_date
        self.auto_drop_analysis = auto_drop_analysis
        options = repr(
            (model_identity, reasoning_effort, knowledge_cutoff, conversation_start_date, auto_drop_analysis)
        )
        self._enc = ordinary_encoder(enc)
        self._pieces: dict[str, array[int]] = {}
        super().__init__(enc, encoding, options)

    # -- helpers ---------------------------------------------------------------------------

    def _piece(self, text: str) -> array[int]:
        """Tokens of a fixed header word (cached; roles, channels, ``json``…)."""
        ids = self._pieces.get(text)
        if ids is None:
            ids = self._pieces[text] = self._enc(text)
        return ids

    def _message_tokens(
        self,
        author: array[int],
        texts: list[str],
        *,
        recipient: str | None = None,
        channel: str | None = None,
        constrain: str | None = None,
        end: int | None = None,
    ) -> array[int]:
        out = array("I", (self._start,))
        out.extend(author)
        if recipient is not None:
            out.extend(self._enc(f" to={recipient}"))
        if channel is not None:
            out.append(self._channel)
            out.extend(self._piece(channel))
        if constrain is not None:
            out.extend(self._piece(" "))
            out.append(self._constrain)
            out.extend(self._piece(constrain))
        out.append(self._message)
        for text in texts:
            out.extend(self._enc(text))
        out.append(self._end if end is None else end)
        return out

    # -- template ----------------------------------------------------------------------------

    @property
    def stop_tokens(self) -> tuple[int, ...]:
        """``<|return|>``, ``<|call|>`` and ``<|end|>`` (openai-harmony's ``stop_tokens()``)."""
        return (self._return, self._call, self._end)

    @property
    def sampling_stop_tokens(self) -> tuple[int, ...]:
        """``<|return|>`` and ``<|call|>``: a turn's analysis ends in ``<|end|>`` and goes on."""
        return (self._return, self._call)

    def output_parser(self, custom_tools: frozenset[str] = frozenset()) -> OutputParser:
        return HarmonyParser(custom_tools)

    def end_token(self, tool_call: bool) -> int:
        return self._call if tool_call else self._return

    def tool_call_prefix(self, name: str | None) -> str:
        return "<|channel|>commentary to=functions." + (f"{name} <|constrain|>json<|message|>" if name else "")

    @property
    def _message_start(self) -> int:
        return self._start

    def _generation_prompt(self) -> array[int]:
        out = array("I", (self._start,))
        out.extend(self._piece("assistant"))
        return out

    def hidden_before(self, facts: Facts) -> int:
        """openai-harmony's ``auto_drop_analysis``: hide analysis before the first final
        message when the last assistant message is final."""
        if self.auto_drop_analysis and facts.last_assistant_final and facts.first_final >= 0:
            return facts.first_final
        return 0

    def system_text(self, has_function_tools: bool) -> str:
        """The system message text (``SystemContent`` as openai-harmony renders it)."""
        sections: list[str] = []
        top: list[str] = []
        if self.model_identity is not None:
            top.append(self.model_identity)
        if self.knowledge_cutoff is not None:
            top.append(f"Knowledge cutoff: {self.knowledge_cutoff}")
        if self.conversation_start_date is not None:
            top.append(f"Current date: {self.conversation_start_date}")
        if top:
            sections.append("\n".join(top))
        if self.reasoning_effort is not None:
            sections.append(f"Reasoning: {self.reasoning_effort}")
        channels = "# Valid channels: analysis, commentary, final. Channel must be included for every message."
        if has_function_tools:
            channels += "\nCalls to these tools must go to the commentary channel: 'functions'."
        sections.append(channels)
        return "\n\n".join(sections)

    @staticmethod
    def tool_namespaces(
        tools: ToolSet,
    ) -> list[tuple[str, str | None, list[tuple[str, str, Any]]]]:
        """Function tools grouped by harmony namespace, sorted by name (hosted tools left out).

        Top-level functions go to ``functions``; a ``namespace`` tool becomes its own namespace
        (one named ``functions`` merges with the top-level functions).
        """
        spaces: dict[str, tuple[list[str | None], list[tuple[str, str, Any]]]] = {}

        def add(ns: str, desc: str | None, fns: list[FunctionTool]) -> None:
            descs, entries = spaces.setdefault(ns, ([None], []))
            if descs[0] is None:
                descs[0] = desc
            entries.extend((f.name, f.description or "", f.parameters) for f in fns)

        for tool in tools.tools:
            if isinstance(tool, FunctionTool):
                add("functions", None, [tool])
            elif isinstance(tool, NamespaceTool):
                add(tool.name, tool.description, list(tool.tools))
            elif isinstance(tool, CustomTool):
                add("functions", None, [FunctionTool(tool.name, _FREEFORM, custom_tool_description(tool))])
        return [(name, spaces[name][0][0], spaces[name][1]) for name in sorted(spaces)]

    def developer_text(self, instructions: str | None, tools: ToolSet) -> str | None:
        """The developer message text, or None when there is neither instructions nor tools."""
        sections: list[str] = []
        if instructions:
            sections += ["# Instructions", instructions]
        namespaces = self.tool_namespaces(tools)
        if namespaces:
            sections.append(tools_section(namespaces))
        return "\n\n".join(sections) if sections else None

    def _render_header(self, instructions: str | None, tools: ToolSet) -> array[int]:
        namespaces = self.tool_namespaces(tools)
        has_functions = any(name == "functions" and fns for name, _, fns in namespaces)
        out = self._message_tokens(self._piece("system"), [self.system_text(has_functions)])
        developer = self.developer_text(instructions, tools)
        if developer is not None:
            out.extend(self._message_tokens(self._piece("developer"), [developer]))
        return out

    def _call_target(self, item: FunctionCall | CustomToolCall) -> str:
        return f"{item.namespace or 'functions'}.{item.name}"

    def _render_item(self, item: Item, index: int, call_target: str | None) -> Rendered:
        if isinstance(item, Message):
            texts = item_texts(item.content, index, "content")
            if item.role == "assistant":
                channel = "commentary" if item.phase == "commentary" else "final"
                flags = ASSISTANT | (FINAL if channel == "final" else 0)
                seg = self._message_tokens(self._piece("assistant"), texts, channel=channel)
                return Rendered(seg, flags)
            return Rendered(self._message_tokens(self._piece(item.role), texts), 0)
        if isinstance(item, FunctionCall):
            seg = self._message_tokens(
                self._piece("assistant"),
                [item.arguments],
                recipient=self._call_target(item),
                channel="commentary",
                constrain="json",
                end=self._call,
            )
            return Rendered(seg, ASSISTANT)
        if isinstance(item, CustomToolCall):
            seg = self._message_tokens(
                self._piece("assistant"),
                [item.input],
                recipient=self._call_target(item),
                channel="commentary",
                end=self._call,
            )
            return Rendered(seg, ASSISTANT)
        if isinstance(item, (FunctionCallOutput, CustomToolCallOutput)):
            assert call_target is not None
            texts = item_texts(item.output, index, "output")
            seg = self._message_tokens(
                self._enc(call_target), texts, recipient="assistant", channel="commentary"
            )
            return Rendered(seg, 0)
        if isinstance(item, Reasoning):
            texts = reasoning_texts(item)
            if not texts:
                return Rendered(array("I"), 0)  # nothing to show (e.g. encrypted_content only)
            seg = self._message_tokens(self._piece("assistant"), texts, channel="analysis")
            return Rendered(seg, ASSISTANT | ANALYSIS)
        raise TypeError(f"cannot render item of type {type(item).__name__}")

    def _sampled_flags(self, item: Item) -> int:
        if isinstance(item, Reasoning):
            return ASSISTANT | ANALYSIS
        if isinstance(item, Message) and item.phase != "commentary":
            return ASSISTANT | FINAL
        return ASSISTANT

    def _sampled_is_transcript(self, pieces: Sequence[array[int]]) -> bool:
        """Every sampled message must have a header ending in ``<|message|>``."""
        return all(self._message in piece for piece in pieces)

    def _finish_sampled(self, seg: array[int], item: Item) -> array[int]:
        """A trailing ``<|return|>`` becomes ``<|end|>`` (as harmony re-renders it); a message
        cut off without an end token gets the one the template would render."""
        if seg and seg[-1] == self._return:
            seg[-1] = self._end
        elif not seg or seg[-1] not in (self._end, self._call):
            seg.append(self._call if isinstance(item, (FunctionCall, CustomToolCall)) else self._end)
        return seg


#: The parameter schema a custom tool is declared with: one string, ``(_: string) => any``.
_FREEFORM: dict[str, Any] = {"type": "string"}

