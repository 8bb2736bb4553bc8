"""The official SDK drives steering: ``connection.response.steer(...)`` on
``AsyncOpenAI().responses.connect()``, every event checked strictly (``wsclient.check_event``) and
parsed into the SDK's own types; the recording backend shows what reached the engine."""

from __future__ import annotations

import json
from typing import Any

from backends import RecordingBackend, output_key, user_key
from openai import AsyncOpenAI
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseIncompleteEvent,
    ResponseSteerAcceptedEvent,
    ResponseSteerFailedEvent,
    ResponseSteerPendingEvent,
)
from wsclient import MODEL, check_event, function_tool

LONG = "one two three four five six seven eight nine ten"
TOOLS = [function_tool()]


class Client:
    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def next(self) -> Any:
        data = await self.conn.recv_bytes()
        check_event(json.loads(data))
        return self.conn.parse_event(data)

    async def until(self, kind: str) -> Any:
        while True:
            event = await self.next()
            if event.type == kind:
                return event


async def test_sdk_steer_mid_answer_pending_and_after_completion(serve: Any, backend: RecordingBackend) -> None:
    server = serve()
    openai = AsyncOpenAI(base_url=server.http_url, api_key="sk-local", max_retries=0)
    async with openai, openai.responses.connect() as conn:
        c = Client(conn)
        # 1. A steer during a long answer: accepted → incomplete (steered) → a successor that completes.
        await conn.response.create(model=MODEL, input="Write an essay.", store=False, metadata={"text": LONG, "gate": "g"})
        created = await c.next()
        assert isinstance(created, ResponseCreatedEvent)
        target = created.response.id
        await c.until("response.output_text.delta")
        await conn.response.steer(input="Keep it to one sentence.", previous_response_id=target)
        accepted = await c.next()
        assert isinstance(accepted, ResponseSteerAcceptedEvent)
        assert accepted.steer.previous_response_id == target and accepted.steer.id.startswith("steer_")
        backend.gates.release("g")
        incomplete = await c.until("response.incomplete")
        assert isinstance(incomplete, ResponseIncompleteEvent)
        assert incomplete.response.incomplete_details is not None and incomplete.response.incomplete_details.reason == "steered"
        successor = await c.next()
        assert isinstance(successor, ResponseCreatedEvent) and successor.response.previous_response_id == target
        done = await c.until("response.completed")
        assert isinstance(done, ResponseCompletedEvent) and done.response.id == successor.response.id
        assert backend.calls[-1].identities()[-1] == user_key("Keep it to one sentence.")

        # 2. A steer while a tool call is outstanding: pending with required_input, then the
        #    client's create carries the steering input prepended.
        await conn.response.create(
            model=MODEL, input="Check the project.", tools=TOOLS, store=False,  # type: ignore[arg-type]
            previous_response_id=done.response.id,
            metadata={"call": "run", "args": '{"step": 1}', "call_id": "call_p", "gate": "h"},
        )
        created = await c.next()
        tool_target = created.response.id
        await c.until("response.function_call_arguments.delta")
        await conn.response.steer(input=[{"type": "message", "role": "user", "content": "Then summarize."}], previous_response_id=tool_target)
        assert isinstance(await c.next(), ResponseSteerAcceptedEvent)
        backend.gates.release("h")
        completed = await c.until("response.completed")
        assert completed.response.id == tool_target
        pending = await c.next()
        assert isinstance(pending, ResponseSteerPendingEvent) and pending.reason == "waiting_for_required_input"
        (stub,) = pending.required_input
        assert stub.type == "function_call_output" and stub.call_id == "call_p" and getattr(stub, "name", None) == "run"
        await conn.response.create(
            model=MODEL, store=False, tools=TOOLS, previous_response_id=tool_target,  # type: ignore[arg-type]
            input=[{"type": "function_call_output", "call_id": stub.call_id, "output": "all green"}],
            metadata={"tag": "cont"},
        )
        cont = await c.until("response.completed")
        assert cont.response.previous_response_id == tool_target
        sent = backend.by_tag("cont").identities()
        assert sent[-2:] == [user_key("Then summarize."), output_key("call_p", "all green")]

        # 3. A steer after completion: failed with response_already_completed.
        await conn.response.steer(input="too late", previous_response_id=cont.response.id)
        failed = await c.next()
        assert isinstance(failed, ResponseSteerFailedEvent)
        assert failed.error.code == "response_already_completed" and failed.steer.input == "too late"
        assert failed.steer.id is None
