"""GPU smoke client: an SDK tool loop over WebSocket mode, checking that cached tokens grow.

    python smoke_client.py http://127.0.0.1:8000/v1 MODEL [API_KEY]

Runs a scripted agent loop with the official ``openai`` SDK over ``client.responses.connect()``:
the model is asked to call ``exec_command`` a few times; the tool outputs are canned (nothing
the model chooses is executed). Prints one JSON line per turn and a summary; exits 0 when every
turn completed and ``cached_tokens`` grew from turn 2 on, 1 otherwise. Needs a running engine
(see ``vllm.sh`` / ``sglang.sh``); not run by the test suite.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from openai import OpenAI

TOOLS: list[Any] = [{
    "type": "function",
    "name": "exec_command",
    "description": "Run a shell command and return its output.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"],
                   "additionalProperties": False},
    "strict": True,
}]
PROMPT = ("Inspect this repository step by step: first run `ls`, then `cat README.md`, then `git log -1`, "
          "one command per turn, and finally summarise what you found in one sentence.")
CANNED = {"ls": "README.md\nsrc\ntests\n", "cat": "# demo\nA small demo project.\n", "git": "commit abc123 Initial commit\n"}
MAX_TURNS = 8


def canned(cmd: str) -> str:
    return CANNED.get(cmd.split()[0] if cmd.split() else "", "ok\n")


def main(base_url: str, model: str, api_key: str = "unused") -> int:
    client = OpenAI(base_url=base_url, api_key=api_key)
    cached: list[int] = []
    statuses: list[str] = []
    with client.responses.connect() as conn:
        conn.response.create(model=model, input=PROMPT, tools=TOOLS, store=False)
        for turn in range(MAX_TURNS):
            final = None
            for event in conn:
                if event.type == "error":
                    print(json.dumps({"turn": turn, "error": event.error.message}))
                    return 1
                if event.type in ("response.completed", "response.failed", "response.incomplete"):
                    final = event.response
                    break
            if final is None:
                return 1
            usage = final.usage
            hits = usage.input_tokens_details.cached_tokens if usage and usage.input_tokens_details else 0
            cached.append(hits)
            statuses.append(final.status or "")
            print(json.dumps({"turn": turn + 1, "status": final.status, "input_tokens": usage.input_tokens if usage else None,
                              "cached_tokens": hits, "output_tokens": usage.output_tokens if usage else None,
                              "error": final.error.message if final.error else None}))
            calls = [item for item in final.output if item.type == "function_call"]
            if final.status != "completed" or not calls:
                break
            outputs: list[Any] = [{"type": "function_call_output", "call_id": c.call_id,
                                   "output": canned(json.loads(c.arguments).get("cmd", ""))} for c in calls]
            conn.response.create(model=model, previous_response_id=final.id, input=outputs, tools=TOOLS, store=False)
    grew = len(cached) >= 2 and all(b > 0 for b in cached[1:]) and cached[1:] == sorted(cached[1:])
    ok = all(s == "completed" for s in statuses) and grew
    print(json.dumps({"turns": len(cached), "cached_tokens": cached, "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
