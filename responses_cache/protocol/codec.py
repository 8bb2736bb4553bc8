"""One encoder and the decoders, built once for the whole process, and the one way client JSON
is decoded.

Every decode of client-supplied JSON goes through :func:`decode`, which turns *every* way
decoding can fail into the OpenAI error envelope (a :class:`~.errors.ResponsesError`, 400):
malformed JSON, invalid UTF-8 inside a string, a value of the wrong type, and nesting so deep
that the decoder would exhaust the interpreter's recursion limit. Values the wire types leave
untyped (``dict[str, Any]``) are also held to :data:`MAX_DEPTH` levels by :func:`check_depth`,
so nothing downstream (a renderer walking a tool schema, an encoder echoing ``text``) can
recurse out of the stack later.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from .errors import ResponsesError, from_validation_error, invalid_request
from .items import enc_hook

encoder = msgspec.json.Encoder(enc_hook=enc_hook)

encode = encoder.encode

T = TypeVar("T")

#: How deeply a client's free-form JSON values (``text``, ``reasoning``, tool ``parameters``…)
#: may nest. JSON Schemas used in practice nest well under ten levels.
MAX_DEPTH = 64


def too_deep(param: str | None = None) -> ResponsesError:
    return invalid_request(
        f"The JSON is nested too deeply (the limit is {MAX_DEPTH} levels).", param, "invalid_json"
    )


def not_json(param: str | None = None) -> ResponsesError:
    return invalid_request(
        "We could not parse the JSON body of your request. The body must be valid JSON in UTF-8.",
        param,
        "invalid_json",
    )


def decode(decoder: msgspec.json.Decoder[T], data: bytes | str | msgspec.Raw | memoryview, *, prefix: str = "") -> T:
    """Decode client JSON; any failure becomes a 400 :class:`ResponsesError` naming the field."""
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise from_validation_error(exc, prefix) from None
    except msgspec.DecodeError:
        raise not_json(prefix or None) from None
    except RecursionError:
        raise too_deep(prefix or None) from None


def check_depth(value: Any, param: str | None, limit: int = MAX_DEPTH) -> None:
    """Raise :func:`too_deep` if ``value`` (decoded JSON) nests more than ``limit`` levels.

    Iterative, so it cannot itself run out of stack, and it stops at the first level too deep."""
    if not isinstance(value, (dict, list)):
        return
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            raise too_deep(param)
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
