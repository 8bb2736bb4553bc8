"""Plain-text tokens straight into a compact ``array('I')``.

``tiktoken.Encoding.encode_ordinary`` hands back a Python ``list[int]``: 8 bytes of pointer plus
a 32-byte ``int`` object per token id above 256, ten times the 4 bytes the token log keeps. For a
megabyte input that list is the largest thing a turn ever holds (a 8 MB prompt: 1.6 million
tokens, 64 MB of list, for a 6.5 MB array). tiktoken's core can also write the ids into a
native buffer of ``uint32`` (what its ``encode_to_numpy`` reads); :func:`ordinary_encoder` copies
that buffer into the array, so the ids never exist as Python objects. Short texts (under
:data:`SHORT` characters: roles, names, most messages) take the list, which is faster there and
small.

The buffer route is tiktoken's own, but not its documented API: it is used only when the
installed tiktoken has it and it gives exactly ``encode_ordinary``'s ids for a probe text
(special-token look-alikes, non-ASCII, whitespace runs) the first time an encoding is used;
otherwise the encoder falls back to the list, with the same ids.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Callable

import tiktoken

Encoder = Callable[[str], "array[int]"]

#: Compared against ``encode_ordinary`` before the buffer route is trusted: special-token
#: look-alikes must stay plain text, and the pre-tokenizer's cases (contractions, numbers,
#: whitespace runs, non-ASCII letters) must split the same.
_PROBE = "Hello <|end|> <|im_start|>world's 12345\n\n  \t naïve 東京 🙂 <|endoftext|>!!"

#: Texts shorter than this are encoded through the list (a couple of microseconds less per call).
SHORT = 2048

_encoders: dict[int, tuple[tiktoken.Encoding, Encoder]] = {}
_lock = threading.Lock()


def ordinary_encoder(encoding: tiktoken.Encoding) -> Encoder:
    """A function giving ``array('I', encoding.encode_ordinary(text))`` without the list (one
    per encoding, made on first use)."""
    found = _encoders.get(id(encoding))
    if found is not None and found[0] is encoding:
        return found[1]
    with _lock:
        encoder = _buffer_encoder(encoding) or _list_encoder(encoding)
        _encoders[id(encoding)] = (encoding, encoder)  # the encoding kept alive: the id stays its own
    return encoder


def _list_encoder(encoding: tiktoken.Encoding) -> Encoder:
    ordinary = encoding.encode_ordinary

    def encode(text: str) -> array[int]:
        return array("I", ordinary(text))

    return encode


def _buffer_encoder(encoding: tiktoken.Encoding) -> Encoder | None:
    """The buffer route, or ``None`` when this tiktoken lacks it or it disagrees on the probe."""
    core = getattr(encoding, "_core_bpe", None)
    to_buffer = getattr(core, "encode_to_tiktoken_buffer", None)
    if to_buffer is None or array("I").itemsize != 4:
        return None
    no_specials: frozenset[str] = frozenset()  # every special-token look-alike is plain text
    ordinary = encoding.encode_ordinary

    def encode(text: str) -> array[int]:
        if len(text) < SHORT:
            return array("I", ordinary(text))
        out = array("I")
        # ``cast("B")``: the buffer's shape is reported in bytes; as bytes it is read whole.
        out.frombytes(memoryview(to_buffer(text, no_specials)).cast("B"))
        return out

    try:
        probe = _PROBE * (SHORT // len(_PROBE) + 1)  # long enough to take the buffer
        if encode(probe).tolist() != ordinary(probe):
            return None
    except Exception:  # a changed private signature: the list route is always right
        return None
    return encode
