"""The sandbox a chat template runs in, equivalent to ``transformers.apply_chat_template``'s (with
the fast paths :class:`SandboxEnvironment` describes). Imported only where a template is compiled:
jinja2 comes with the ``hf`` extra."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from types import BuiltinMethodType
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationTag(jinja2.ext.Extension):
    """``{% generation %}…{% endgeneration %}`` renders its body (transformers uses it to mark
    assistant tokens; rendering is unchanged)."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


class Namespace(jinja2.utils.Namespace):
    """jinja's ``namespace()``, refusing attribute names that start with an underscore."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set the attribute {name!r}")


class Dict:
    """The template global ``dict``: ``dict(...)`` and ``dict.fromkeys(...)``, nothing else of the type."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


def raise_exception(message: str) -> None:
    """The template global ``raise_exception``: the template refuses the conversation."""
    raise jinja2.exceptions.TemplateError(message)


_DICT_ATTRIBUTES = frozenset(dir(dict))
_STR_METHODS = frozenset(name for name in dir(str) if not name.startswith("_")) - {"format", "format_map"}
_LOOP_ATTRIBUTES = frozenset(
    ("index", "index0", "revindex", "revindex0", "first", "last", "length", "depth", "depth0", "previtem", "nextitem")
)


class SandboxEnvironment(ImmutableSandboxedEnvironment):  # type: ignore[misc]
    """The sandbox with fast paths that give the same results: a message's key (``m.role``:
    no ``dict`` attribute has that name, so jinja would fall back to ``m["role"]``), a loop
    variable, a namespace's own value (public names only), and a string's public methods but
    ``format``/``format_map`` (the sandbox wraps those) -- fetched (the sandbox finds a
    ``str`` attribute safe: nothing internal, nothing mutable) and called (a builtin method
    takes no context, so jinja's call reduces to calling it) without the sandbox's checks,
    which cost several microseconds each (Qwen3's template calls a dozen per run)."""

    def getattr(self, obj: Any, attribute: str) -> Any:
        kind = type(obj)
        if kind is dict and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except KeyError:
                return self.undefined(obj=obj, name=attribute)
        if (
            (kind is LoopContext and attribute in _LOOP_ATTRIBUTES)
            or (kind is str and attribute in _STR_METHODS)
            or (kind is Namespace and not attribute.startswith("_") and attribute in obj._Namespace__attrs)  # type: ignore[attr-defined]
        ):
            return getattr(obj, attribute)
        return super().getattr(obj, attribute)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        if type(__obj) is BuiltinMethodType and type(__obj.__self__) is str and __obj.__name__ in _STR_METHODS:
            kwargs.pop("_loop_vars", None)
            kwargs.pop("_block_vars", None)
            return __obj(*args, **kwargs)
        return super().call(__context, __obj, *args, **kwargs)


def strftime_now(fmt: str) -> str:
    """The template global ``strftime_now``: the local time, formatted."""
    return datetime.now().strftime(fmt)


def environment(tojson: Callable[..., str]) -> SandboxEnvironment:
    """A sandbox with ``trim_blocks``/``lstrip_blocks``, the loop controls and ``{% generation %}``,
    ``tojson`` as its filter, and the globals ``raise_exception``, ``strftime_now``, ``dict`` and
    ``namespace``."""
    env = SandboxEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = Dict()
    env.globals["namespace"] = Namespace
    return env
