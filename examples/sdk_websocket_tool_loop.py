"""An agent tool loop with the official SDK over WebSocket mode.

Run the server first (``responses-cache serve --backend simulated``), then ``python
examples/sdk_websocket_tool_loop.py``. Each turn sends only the tool output plus
``previous_response_id``; the server continues from its connection cache.
"""

from __future__ import annotations

import subprocess
import sys

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Run a shell command and return its output.",
        "parameters": {
            "type": "object",
            "properties": {"cmd": {"type": "string"}},
            "required": ["cmd"],
            "additionalProperties": False,
        },
        "strict": True,
    }
]


def run(cmd: str) -> str:
    done = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30)
    return done.stdout + done.stderr


def main(base_url: str = "http://127.0.0.1:8000/v1") -> int:
    client = OpenAI(base_url=base_url, api_key="unused")
    with client.responses.connect() as conn:
        conn.response.create(model="sim-1", input="Please run `uname -s` and tell me what it says.", tools=TOOLS)
        while True:
            final = None
            for event in conn:
                if event.type == "error":
                    print(f"error: {event.error.message}", file=sys.stderr)
                    return 1
                if event.type == "response.output_text.delta":
                    print(event.delta, end="", flush=True)
                if event.type in ("response.completed", "response.failed", "response.incomplete"):
                    final = event.response
                    break
            if final is None:
                return 1
            calls = [item for item in final.output if item.type == "function_call"]
            if not calls:
                print()
                return 0
            import json

            outputs = [
                {"type": "function_call_output", "call_id": c.call_id, "output": run(json.loads(c.arguments)["cmd"])}
                for c in calls
            ]
            conn.response.create(model="sim-1", previous_response_id=final.id, input=outputs, tools=TOOLS)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
