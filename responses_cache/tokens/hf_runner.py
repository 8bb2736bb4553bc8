"""Runs a model's chat template over chat messages, for the ``hf`` renderer.

:class:`TemplateRunner` turns Responses items into the chat messages the template reads
(:mod:`.hf_messages`), gives the template its variables (the tokenizer's special-token strings, the
renderer's ``template_kwargs``, the messages and tools) and runs it (:class:`~.hf_files.ChatTemplate`),
counting each run. A template that refuses a conversation raises :class:`TemplateRenderError`, a 400,
as ``apply_chat_template`` would make an engine answer.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..protocol.items import Item
from .base import RenderStats
from .errors import RenderError
from .hf_files import ChatTemplate
from .hf_messages import chat_messages, parse_arguments, template_view

#: Parsed call arguments kept per renderer (by their text).
_PARSED = 4096


class TemplateRenderError(RenderError):
    """The chat template refused the conversation (``raise_exception`` or a template error)."""


def _refused(exc: Exception, at: int) -> TemplateRenderError:
    """What a template run raised, as a 400: ``raise_exception``, an undefined value, or a Python
    error inside the template (a string plus a mapping, say), as ``apply_chat_template`` would
    raise it to an engine, which answers the same conversation with a 400."""
    import jinja2

    detail = str(exc) if isinstance(exc, jinja2.exceptions.TemplateError) else f"{type(exc).__name__}: {exc}"
    return TemplateRenderError(f"the model's chat template refused the conversation: {detail}", item_index=at, param="type")


class TemplateRunner:
    """The compiled ``template`` with its fixed variables (``template_tokens``: ``bos_token``,
    ``eos_token``…; ``template_kwargs``: the renderer's extra variables); counts in ``stats``."""

    def __init__(
        self, template: ChatTemplate, template_tokens: Mapping[str, Any], template_kwargs: Mapping[str, Any], stats: RenderStats
    ) -> None:
        self.template = template
        self._fixed = {**template_tokens, **template_kwargs}
        self._stats = stats
        self._parsed: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def messages(
        self, instructions: str | None, items: Sequence[Item], *, first_new: int = 0, calls: Callable[[str], str | None] | None = None
    ) -> list[dict[str, Any]]:
        """The chat messages for ``items`` (counted in ``stats.items_converted``)."""
        self._stats.items_converted += len(items)
        return chat_messages(instructions, items, first_new=first_new, calls=calls, arguments=self._arguments)

    def _arguments(self, text: str) -> dict[str, Any]:
        """A function call's arguments as the template sees them, parsed once per text and frozen
        for the template's ``tojson`` (:class:`~.hf_files.FrozenJSON`): nothing changes them."""
        found = self._parsed.get(text)
        if found is None:
            found = self._parsed[text] = parse_arguments(text)
            if len(self._parsed) > _PARSED:
                self._parsed.popitem(last=False)
        self.template.json.freeze(found)
        return found

    def variables(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> dict[str, Any]:
        """What the template reads for ``messages`` and ``tools``."""
        if tools:  # the header's tool definitions: built once, never changed
            self.template.json.freeze(tools, deep=True)
        return {**self._fixed, "messages": template_view(messages), "tools": tools, "documents": None}

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, gen: bool, at: int = 0) -> str:
        """The template's whole text (``gen``), or the text the token log holds (without the
        generation prompt or a constant tail, :meth:`~.hf_files.ChatTemplate.text`). ``at``: the
        item a refusal names."""
        self._stats.template_runs += 1
        try:
            variables = self.variables(messages, tools)
            return self.template.render(True, variables) if gen else self.template.text(variables)
        except Exception as exc:
            raise _refused(exc, at) from None

    def render_pair(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> tuple[str, str]:
        """The template's text without and with the generation prompt (one run of the template
        when its structure allows, see :class:`~.hf_files.ChatTemplate`)."""
        self._stats.template_runs += 1 if self.template.one_run else 2
        try:
            return self.template.render_pair(self.variables(messages, tools))
        except Exception as exc:
            raise _refused(exc, 0) from None
