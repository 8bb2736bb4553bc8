"""A prompt refused for its length does not keep its tokens alive: the error's traceback holds
the frames it was raised through, and a megabyte input's token log in one of them would stay as
long as the error does (an error event waiting to be written, a result kept by a caller)."""

from __future__ import annotations

import types

import pytest

from responses_cache.conversation import EMPTY
from responses_cache.pipeline.render import PromptSource, render
from responses_cache.protocol.errors import ResponsesError
from responses_cache.protocol.items import Message
from responses_cache.protocol.tools import EMPTY_TOOLS
from responses_cache.tokens import get_renderer
from responses_cache.tokens.log import TokenLog


def _locals_of(tb: types.TracebackType | None) -> list[object]:
    held: list[object] = []
    while tb is not None:
        held.extend(tb.tb_frame.f_locals.values())
        tb = tb.tb_next
    return held


def test_a_prompt_over_the_window_is_refused_without_its_token_log_in_the_traceback() -> None:
    renderer = get_renderer("harmony")
    # Words, so the floor computed without tokenizing lets it through to the tokenizer.
    items = [Message(role="user", content="hello world, the quick brown fox jumps. " * 100)]
    source = PromptSource(None, EMPTY, list(items), None, EMPTY_TOOLS)
    with pytest.raises(ResponsesError) as raised:
        render(renderer, source, context_window=500)
    assert raised.value.code == "context_length_exceeded"
    assert "resulted in 9" in raised.value.message  # counted exactly: it was tokenized
    assert not [v for v in _locals_of(raised.value.__traceback__) if isinstance(v, TokenLog)]
