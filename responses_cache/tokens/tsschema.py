"""JSON Schema -> the TypeScript-like text harmony shows the model for function tools.

A line-for-line port of ``json_schema_to_typescript`` and ``template_tools_section`` from
openai-harmony 0.0.8 (``src/encoding.rs``), including its quirks (which keywords become comments,
how defaults print), so that our header tokens equal openai-harmony's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from decimal import Decimal
from typing import Any


def rust_lines(text: str) -> list[str]:
    """``str::lines()`` in Rust: split at ``\\n`` (dropping a ``\\r`` before it), no final empty line."""
    if not text:
        return []
    parts = text.split("\n")
    last = parts.pop()
    lines = [p[:-1] if p.endswith("\r") else p for p in parts]
    if last:
        lines.append(last)
    return lines


def _ryu(x: float) -> str:
    """A float as serde_json prints it (the ``ryu`` crate's shortest round-trip format)."""
    if math.isnan(x) or math.isinf(x):
        return "null"
    if x == 0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    sign, digits_t, exp = Decimal(repr(x)).normalize().as_tuple()
    assert isinstance(exp, int)
    digits = "".join(map(str, digits_t))
    length = len(digits)
    kk = length + exp  # position of the decimal point relative to the digit string
    out = "-" if sign else ""
    if exp >= 0 and kk <= 16:
        return f"{out}{digits}{'0' * exp}.0"
    if 0 < kk <= 16:
        return f"{out}{digits[:kk]}.{digits[kk:]}"
    if -5 < kk <= 0:
        return f"{out}0.{'0' * -kk}{digits}"
    if length == 1:
        return f"{out}{digits}e{kk - 1}"
    return f"{out}{digits[0]}.{digits[1:]}e{kk - 1}"


_U64_MAX = 2**64 - 1
_POW10 = [float(f"1e{i}") for i in range(309)]


def _f64_from_parts(positive: bool, significand: int, exponent: int) -> float:
    """serde_json's ``f64_from_parts`` (without the ``float_roundtrip`` feature)."""
    f = float(significand)
    while True:
        if abs(exponent) < len(_POW10):
            f = f * _POW10[exponent] if exponent >= 0 else f / _POW10[-exponent]
            break
        if f == 0.0:
            break
        if exponent >= 0:
            return math.inf if positive else -math.inf
        f /= 1e308
        exponent += 308
    return f if positive else -f


def serde_number(text: str) -> int | float:
    """The value serde_json (default features) parses from the JSON number ``text``.

    Not always the correctly rounded double: serde multiplies the decimal significand by a power
    of ten, and drops digits beyond 64 bits. openai-harmony parses tool schemas this way.
    """
    positive = not text.startswith("-")
    body = text.lstrip("-")
    mantissa, _, exp_text = body.replace("E", "e").partition("e")
    int_part, dot, frac_part = mantissa.partition(".")
    significand = 0
    exponent = 0
    overflow = False
    for d in int_part:
        if not overflow and significand * 10 + int(d) <= _U64_MAX:
            significand = significand * 10 + int(d)
        else:
            overflow = True
            exponent += 1
    for d in frac_part:
        if not overflow and significand * 10 + int(d) <= _U64_MAX:
            significand = significand * 10 + int(d)
            exponent -= 1
        else:
            overflow = True
    if not dot and not exp_text and not overflow:
        if positive:
            return significand
        if significand <= 2**63:
            return -significand
        return -float(significand)
    if exp_text:
        exponent += int(exp_text)
    return _f64_from_parts(positive, significand, exponent)


def json_display(value: Any) -> str:
    """``serde_json::Value``'s ``Display`` of a value that went through Python's ``json.dumps``.

    Compact JSON, non-ASCII kept, numbers as serde parses and ryu prints them.
    """
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            return "null"
        number = serde_number(json.dumps(value))
        return str(number) if isinstance(number, int) else _ryu(number)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        inner = ",".join(f"{json_display(str(k))}:{json_display(v)}" for k, v in value.items())
        return "{" + inner + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(json_display(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def _get(schema: Any, key: str) -> Any:
    return schema.get(key) if isinstance(schema, dict) else None


def _is_enum(schema: Any) -> bool:
    values = _get(schema, "enum")
    return isinstance(values, list) and len(values) > 0


def _nullable(schema: Any) -> bool:
    return _get(schema, "nullable") is True


def _default_comment(default: Any, schema: Any, *, quote_enum: bool) -> str:
    """``default: ...`` as harmony writes it (strings quoted unless the schema is an enum)."""
    if isinstance(default, str) and not _is_enum(schema):
        return f'default: "{default}"'
    if isinstance(default, str) and not quote_enum:
        return f"default: {default}"
    return f"default: {json_display(default)}"


def to_typescript(schema: Any, indent: str = "") -> str:
    """The TypeScript-like type of ``schema`` (``json_schema_to_typescript`` in harmony)."""
    one_of = _get(schema, "oneOf")
    if isinstance(one_of, list):
        out = ""
        first = True
        for variant in one_of:
            if not first:
                out += f"\n{indent} | "
            else:
                out += f"\n{indent} | "
                first = False
            type_str = to_typescript(variant, f"{indent}   ")
            if _nullable(variant) and "null" not in type_str:
                type_str = f"{type_str} | null"
            out += type_str
            comments: list[str] = []
            desc = _get(variant, "description")
            if isinstance(desc, str):
                comments.append(desc)
            if isinstance(variant, dict) and "default" in variant:
                comments.append(_default_comment(variant["default"], variant, quote_enum=True))
            if comments:
                out += f" // {' '.join(comments)}"
        return out
    types = _get(schema, "type")
    if isinstance(types, list):
        names = ["number" if t == "integer" else t for t in types if isinstance(t, str)]
        if names:
            return " | ".join(names)
    if isinstance(types, str):
        if types == "object":
            return _object(schema, indent)
        if types == "string":
            values = _get(schema, "enum")
            if isinstance(values, list):
                enums = [f'"{v}"' for v in values if isinstance(v, str)]
                if enums:
                    return " | ".join(enums)
            return "string"
        if types in ("number", "integer"):
            return "number"
        if types == "boolean":
            return "boolean"
        if types == "array":
            if isinstance(schema, dict) and "items" in schema:
                return f"{to_typescript(schema['items'], indent)}[]"
            return "Array<any>"
        return "any"
    return "any"


def _object(schema: dict[str, Any], indent: str) -> str:
    out = ""
    desc = schema.get("description")
    if isinstance(desc, str):
        out += f"{indent}// {desc}\n"
    out += "{\n"
    props = schema.get("properties")
    if isinstance(props, dict):
        req = schema.get("required")
        required = {r for r in req if isinstance(r, str)} if isinstance(req, list) else set()
        for key, val in props.items():
            mark = "" if key in required else "?"
            title = _get(val, "title")
            if isinstance(title, str):
                out += f"{indent}// {title}\n{indent}//\n"
            has_one_of = isinstance(val, dict) and "oneOf" in val
            if not has_one_of:
                d = _get(val, "description")
                if isinstance(d, str):
                    out += f"{indent}// {d}\n"
            examples = _get(val, "examples")
            if isinstance(examples, list) and examples:
                out += f"{indent}// Examples:\n"
                for ex in examples:
                    if isinstance(ex, str):
                        out += f'{indent}// - "{ex}"\n'
            one_of = _get(val, "oneOf")
            if isinstance(one_of, list):
                out += _property_one_of(key, mark, val, one_of, indent)
                continue
            out += f"{indent}{key}{mark}: "
            type_str = to_typescript(val, f"{indent}    ")
            if _nullable(val) and "null" not in type_str:
                type_str = f"{type_str} | null"
            out += type_str + ","
            if not has_one_of and isinstance(val, dict) and "default" in val:
                out += " // " + _default_comment(val["default"], val, quote_enum=False)
            out += "\n"
    out += f"{indent}}}"
    return out


def _property_one_of(key: str, mark: str, val: dict[str, Any], variants: list[Any], indent: str) -> str:
    out = ""
    prop_desc = val.get("description")
    prop_desc = prop_desc if isinstance(prop_desc, str) else None
    skip = False
    if prop_desc is not None and variants:
        first_desc = _get(variants[0], "description")
        skip = isinstance(first_desc, str) and first_desc == prop_desc
    above = False
    if not skip and prop_desc is not None:
        out += f"{indent}// {prop_desc}\n"
        above = True
    if "default" in val:
        out += f"{indent}// " + _default_comment(val["default"], val, quote_enum=False) + "\n"
    out += f"{indent}{key}{mark}:\n"
    for i, variant in enumerate(variants):
        out += f"{indent} | "
        type_str = to_typescript(variant, f"{indent}   ")
        if _nullable(variant) and "null" not in type_str:
            type_str = f"{type_str} | null"
        out += type_str
        comments: list[str] = []
        if not (i == 0 and above):
            d = _get(variant, "description")
            if isinstance(d, str) and d != prop_desc:
                comments.append(d)
        if isinstance(variant, dict) and "default" in variant:
            comments.append(_default_comment(variant["default"], variant, quote_enum=False))
        if comments:
            out += f" // {' '.join(comments)}"
        out += "\n"
    out += f"{indent},\n"
    return out


def tools_section(namespaces: Iterable[tuple[str, str | None, list[tuple[str, str, Any]]]]) -> str:
    """The ``# Tools`` section: ``(namespace, description, [(name, description, parameters)])``.

    ``parameters`` is ``None`` for a tool without parameters. Namespaces must already be in
    harmony's order (sorted by name).
    """
    sections = ["# Tools"]
    for ns_name, ns_desc, tools in namespaces:
        content = [f"## {ns_name}\n"]
        if ns_desc is not None:
            for line in rust_lines(ns_desc):
                content.append(f"// {line}" if tools else line)
        if tools:
            content.append(f"namespace {ns_name} {{\n")
            for name, desc, params in tools:
                for line in rust_lines(desc):
                    content.append(f"// {line}")
                if params is not None:
                    content.append(f"type {name} = (_: {to_typescript(params, '')}) => any;\n")
                else:
                    content.append(f"type {name} = () => any;\n")
            content.append(f"}} // namespace {ns_name}")
        sections.append("\n".join(content))
    return "\n\n".join(sections)
