"""What the tests behind a real proxy share (``test_behind_a_proxy.py``):
two ``responses-cache serve`` processes sharing a Redis store (:class:`Deployment`, from
:mod:`benchmarks.suite.deployment`) and a coding agent over WebSocket mode that reconnects once
on a close (:class:`Agent`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from openai import AsyncOpenAI
from websockets.exceptions import ConnectionClosed

from benchmarks.suite.deployment import KEY, MODEL, TOOLS, Deployment

__all__ = ["KEY", "MODEL", "TOOLS", "Agent", "Deployment", "error_code", "terminal"]


def error_code(event: Any) -> str | None:
    dumped: dict[str, Any] = event.model_dump()
    error = dumped.get("error") or {}
    code = error.get("code") if isinstance(error, dict) else None
    found = code or dumped.get("code")
    return str(found) if found is not None else None


async def terminal(conn: Any) -> Any | None:
    """The turn's final ``response`` (a failure raises); None when the connection went away
    before it (closed, or the drain's ``websocket_connection_limit_reached``)."""
    try:
        async for event in conn:
            if event.type == "response.completed":
                return event.response
            if event.type in ("response.failed", "response.incomplete"):
                raise AssertionError(f"turn ended {event.type}: {event.model_dump()}")
            if event.type == "error":
                if error_code(event) == "websocket_connection_limit_reached":
                    return None
                raise AssertionError(f"error event: {event.model_dump()}")
    except ConnectionClosed:
        return None
    return None


@dataclass
class Agent:
    """A coding agent over WebSocket mode: each user turn asks for a command, gets the call,
    sends the command's output, gets the answer; ``store: true``, chained by
    ``previous_response_id``. On a close it reconnects once and sends the same turn again."""

    client: AsyncOpenAI
    name: str
    completed: list[str] = field(default_factory=list)
    reconnects: int = 0
    previous: str | None = None
    turns: int = 0

    async def turn(self, conn: Any, input: Any) -> tuple[Any, Any]:
        for attempt in (0, 1):
            response = None
            try:
                await conn.response.create(
                    model=MODEL,
                    input=input,
                    tools=TOOLS,
                    store=True,
                    previous_response_id=self.previous,
                )
                response = await terminal(conn)
            except ConnectionClosed:
                pass
            if response is not None:
                self.completed.append(response.id)
                self.previous = response.id
                return conn, response
            assert attempt == 0, f"{self.name}: the turn failed again after its one reconnect"
            self.reconnects += 1
            await conn.close()
            conn = await self.client.responses.connect().enter()
        raise AssertionError("unreachable")

    async def run(self, stop: asyncio.Event, min_turns: int) -> None:
        conn = await self.client.responses.connect().enter()
        try:
            while self.turns < min_turns or not stop.is_set():
                user = [
                    {
                        "role": "user",
                        "content": f"{self.name} turn {self.turns}: run `ls -{self.turns}`",
                    }
                ]
                conn, called = await self.turn(conn, user)
                call = next(item for item in called.output if item.type == "function_call")
                output = [
                    {
                        "type": "function_call_output",
                        "call_id": call.call_id,
                        "output": f"file{self.turns}\n",
                    }
                ]
                conn, answered = await self.turn(conn, output)
                assert f"file{self.turns}" in answered.output_text
                self.turns += 1
                await asyncio.sleep(0.02)  # thinking
        finally:
            await conn.close()
