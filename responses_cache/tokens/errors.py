"""Exceptions raised while loading vocabularies and rendering conversations.

Rendering errors subclass :class:`ValueError` and carry where the problem is (``item_index`` is
the position in the ``items`` sequence passed to ``extend``/``render_full``), so the pipeline can
turn them into a 400 ``invalid_request_error`` with a precise ``param``.
"""

from __future__ import annotations


class VocabularyError(RuntimeError):
    """A tokenizer vocabulary file is missing, unreadable or fails its sha256 check."""


class RenderError(ValueError):
    """A conversation item cannot be rendered into tokens (a client error, map it to a 400)."""

    def __init__(self, message: str, *, item_index: int, param: str) -> None:
        super().__init__(message)
        self.message = message
        #: Index of the offending item in the ``items`` sequence that was being rendered.
        self.item_index = item_index
        #: Path inside that item, e.g. ``"content[1]"`` or ``"call_id"``.
        self.param = param


class UnsupportedContentError(RenderError):
    """An item carries an image or file part, which text-only renderers cannot tokenize."""

    def __init__(self, *, item_index: int, part_index: int, part_type: str, param: str) -> None:
        super().__init__(
            f"Content of type '{part_type}' is not supported by this model; "
            "only text content can be used.",
            item_index=item_index,
            param=param,
        )
        self.part_index = part_index
        self.part_type = part_type


class UnknownCallError(RenderError):
    """A ``function_call_output`` refers to a ``call_id`` with no earlier ``function_call``."""

    def __init__(self, *, item_index: int, call_id: str) -> None:
        super().__init__(
            f"No tool call found for function call output with call_id {call_id}.",
            item_index=item_index,
            param="call_id",
        )
        self.call_id = call_id


class UnrenderableItemError(RenderError):
    """An input item the template has no representation for (a hosted tool's item, say)."""

    def __init__(self, *, item_index: int, item_type: str, template: str) -> None:
        super().__init__(
            f"Input items of type '{item_type}' cannot be used with this model: the {template} "
            "template has no representation for them, and this server does not run that tool.",
            item_index=item_index,
            param="type",
        )
        self.item_type = item_type
