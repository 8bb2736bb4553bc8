"""One agent conversation driven in one transport mode.

* ``http_full`` — ``POST /v1/responses`` (SSE) with the whole conversation as ``input`` every turn
  and no ``previous_response_id`` (what stateless clients do; ``store: false``);
* ``http_prev`` — ``POST /v1/responses`` with ``previous_response_id`` and only the new items
  (``store: true``: the server hydrates the chain from its store);
* ``ws`` — WebSocket mode: ``response.create`` with ``previous_response_id`` and only the new items
  on one connection (``store: false``: the connection cache is the only state).
"""

from __future__ import annotations

from typing import Any, Literal

from .clients import HTTPClient, SocketHTTPClient, TurnTiming, WSClient, http_body, ws_frame
from .workload import CHARS_PER_TOKEN

Mode = Literal["http_full", "http_prev", "ws"]
MODES: tuple[Mode, ...] = ("http_full", "http_prev", "ws")
MODEL = "sim-1"


class AgentLoop:
    def __init__(
        self,
        mode: Mode,
        *,
        http_url: str,
        ws_url: str,
        api_key: str,
        instructions: str,
        tools: list[dict[str, Any]],
        store: bool | None = None,
        lean_http: bool = False,
    ) -> None:
        self.mode = mode
        #: ``store`` of every request (default: ``True`` for ``http_prev`` only).
        self.store = mode == "http_prev" if store is None else store
        self.instructions = instructions
        self.tools = tools
        self.transcript: list[dict[str, Any]] = []
        self.previous_id: str | None = None
        self.history_chars = len(instructions)
        self.history_tokens = 0
        self._ws = WSClient(ws_url, api_key) if mode == "ws" else None
        #: ``lean_http``: the hand-parsed socket client instead of httpx (see SocketHTTPClient).
        self._http: HTTPClient | SocketHTTPClient | None = None
        if mode != "ws":
            self._http = SocketHTTPClient(http_url, api_key) if lean_http else HTTPClient(http_url, api_key)

    def body(self, new_items: list[dict[str, Any]]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": MODEL,
            "instructions": self.instructions,
            "tools": self.tools,
            "tool_choice": "auto",
            "parallel_tool_calls": True,
            "store": self.store,
        }
        if self.mode == "http_full":
            body["input"] = [*self.transcript, *new_items]
        else:
            body["input"] = new_items
            if self.previous_id is not None:
                body["previous_response_id"] = self.previous_id
        return body

    def encode(self, new_items: list[dict[str, Any]]) -> str | bytes:
        """The wire form of the next turn (build it before starting a clock)."""
        body = self.body(new_items)
        return ws_frame(body) if self.mode == "ws" else http_body(body)

    def send(self, new_items: list[dict[str, Any]], wire: str | bytes | None = None) -> TurnTiming:
        """Run one turn; ``wire`` is :meth:`encode`'s result for ``new_items`` if already built."""
        if wire is None:
            wire = self.encode(new_items)
        if self._ws is not None:
            assert isinstance(wire, str)
            result = self._ws.turn(wire)
        else:
            assert self._http is not None and isinstance(wire, bytes)
            result = self._http.turn(wire)
        self.record(new_items, result)
        return result

    def record(self, new_items: list[dict[str, Any]], result: TurnTiming) -> None:
        self.transcript.extend(new_items)
        self.transcript.extend(result.output)
        self.previous_id = result.id
        self.history_chars += sum(len(str(i)) for i in new_items) + sum(
            len(str(i)) for i in result.output
        )
        tokens = result.input_tokens + result.output_tokens
        # Without a renderer the server reports no prompt tokens: estimate from characters.
        self.history_tokens = (
            tokens if result.input_tokens else int(self.history_chars / CHARS_PER_TOKEN)
        )

    def close(self) -> None:
        if self._ws is not None:
            self._ws.close()
        if self._http is not None:
            self._http.close()
