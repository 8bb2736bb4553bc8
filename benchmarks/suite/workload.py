"""Deterministic, realistic payloads: a Codex-like tool set, a system prompt, and code-like tool
outputs of a chosen size (about four characters per token, like source code under o200k)."""

from __future__ import annotations

import random
from typing import Any

#: Characters per token assumed when sizing text before the server reports real token counts
#: (code-like text under o200k/harmony: about 3.6; English prose: about 4.5).
CHARS_PER_TOKEN = 3.6

_NAMES = (
    "parser",
    "tokens",
    "session",
    "cache",
    "render",
    "buffer",
    "lane",
    "state",
    "request",
    "payload",
    "offset",
    "segment",
    "window",
    "budget",
    "record",
    "stream",
    "handler",
    "config",
)
_TYPES = ("int", "str", "bytes", "list[int]", "dict[str, Any]", "float", "bool", "Node | None")


def _identifier(rng: random.Random) -> str:
    return f"{rng.choice(_NAMES)}_{rng.choice(_NAMES)}{rng.randrange(100)}"


def _function(rng: random.Random) -> list[str]:
    name = _identifier(rng)
    args = ", ".join(
        f"{_identifier(rng)}: {rng.choice(_TYPES)}" for _ in range(rng.randrange(1, 4))
    )
    lines = [
        f"def {name}({args}) -> {rng.choice(_TYPES)}:",
        f'    """Return the {rng.choice(_NAMES)} for this {rng.choice(_NAMES)}."""',
    ]
    for _ in range(rng.randrange(3, 9)):
        target, source = _identifier(rng), _identifier(rng)
        kind = rng.randrange(4)
        if kind == 0:
            lines.append(f"    {target} = {source}[{rng.randrange(64)}:{rng.randrange(64, 4096)}]")
        elif kind == 1:
            lines.append(f"    if {source} is None or len({source}) > {rng.randrange(1, 1 << 16)}:")
            lines.append(f'        raise ValueError(f"bad {rng.choice(_NAMES)}: {{{source}!r}}")')
        elif kind == 2:
            lines.append(f"    for {target} in self.{source}.items():")
            lines.append(f"        total += len({target}) * {rng.randrange(2, 17)}")
        else:
            lines.append(
                f"    {target} = self._{rng.choice(_NAMES)}.get({source}, {rng.randrange(1000)})"
            )
    lines.append(f"    return {_identifier(rng)}")
    return lines


def code_text(tokens: int, seed: int) -> str:
    """About ``tokens`` tokens of Python-like source, different for each ``seed``."""
    rng = random.Random(seed)
    target = int(tokens * CHARS_PER_TOKEN)
    out: list[str] = [
        f"$ sed -n '1,{rng.randrange(200, 900)}p' src/{rng.choice(_NAMES)}/{rng.choice(_NAMES)}.py"
    ]
    size = len(out[0])
    line_no = 1
    while size < target:
        for line in _function(rng):
            numbered = f"{line_no:>5}  {line}"
            out.append(numbered)
            size += len(numbered) + 1
            line_no += 1
        out.append("")
    return "\n".join(out)[:target]


def prose_text(tokens: int, seed: int) -> str:
    """About ``tokens`` tokens of plain instructions-like prose."""
    rng = random.Random(seed)
    words = (
        "the",
        "agent",
        "must",
        "run",
        "tests",
        "before",
        "editing",
        "files",
        "and",
        "explain",
        "each",
        "change",
        "briefly",
        "keep",
        "diffs",
        "small",
        "use",
        "tools",
        "carefully",
        "when",
    )
    target = int(tokens * 4.5)
    parts: list[str] = []
    size = 0
    while size < target:
        sentence = (
            " ".join(rng.choice(words) for _ in range(rng.randrange(8, 20))).capitalize() + ". "
        )
        parts.append(sentence)
        size += len(sentence)
    return "".join(parts)[:target]


def tools() -> list[dict[str, Any]]:
    """A Codex-like tool list: a shell tool first (the simulated scenario calls the first one)."""
    return [
        {
            "type": "function",
            "name": "exec_command",
            "description": "Run a shell command and return its output.",
            "strict": False,
            "parameters": {
                "type": "object",
                "properties": {
                    "cmd": {"type": "string", "description": "The command to run."},
                    "workdir": {"type": "string"},
                    "timeout_ms": {"type": "integer"},
                },
                "required": ["cmd"],
            },
        },
        {
            "type": "function",
            "name": "write_stdin",
            "description": "Write to the stdin of a running command.",
            "strict": False,
            "parameters": {
                "type": "object",
                "properties": {"session_id": {"type": "integer"}, "chars": {"type": "string"}},
                "required": ["session_id", "chars"],
            },
        },
        {
            "type": "function",
            "name": "apply_patch",
            "description": "Apply a unified diff to the workspace.",
            "strict": False,
            "parameters": {
                "type": "object",
                "properties": {"patch": {"type": "string"}},
                "required": ["patch"],
            },
        },
    ]


def user_message(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def tool_output(call_id: str, text: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": text}
