"""``ModerationHook``: asks an external moderation HTTP service about the new texts.

This is the pattern for plugging an ML classifier into the pipeline: the classifier runs as a
service, the hook sends it **only the new texts** of each turn (the verdict on earlier texts is
carried in the hook state) and maps its answer to a :class:`~responses_cache.pipeline.hooks.Verdict`.

Request: ``POST url`` with ``{"input": ["text", ...]}``. Accepted answers: ``{"flagged": bool}`` or
the OpenAI moderation shape ``{"results": [{"flagged": bool, "categories": {...}}, ...]}``.

When the service is unreachable, times out, answers a non-2xx status or an unreadable body,
``fail_open=True`` lets the turn through (those texts are then never classified; ``failures``
counts it) and ``fail_open=False`` flags the turn with code ``moderation_unavailable``.
``httpx`` is imported only when the hook first calls the service.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..pipeline.hooks import HookContext, Phase, Verdict
from ..protocol.items import Item
from .base import DEFAULT_SCOPE, Scope, carried, texts_of

if TYPE_CHECKING:
    import httpx


class ModerationUnavailable(Exception):
    pass


class ModerationHook:
    def __init__(
        self,
        url: str,
        *,
        timeout: float = 2.0,
        fail_open: bool = True,
        name: str = "moderation",
        phase: Phase = "before",
        scope: Iterable[Scope] = DEFAULT_SCOPE,
        headers: Mapping[str, str] | None = None,
        client: httpx.AsyncClient | None = None,
        code: str = "content_filter",
        message: str = "The input was flagged by the moderation service.",
    ) -> None:
        self.url = url
        self.timeout = timeout
        self.fail_open = fail_open
        self.name = name
        self.phase: Phase = phase
        self.scope: tuple[Scope, ...] = tuple(scope)
        self.headers = dict(headers or {})
        self.client = client
        self.code = code
        self.message = message
        self._owned: tuple[asyncio.AbstractEventLoop, httpx.AsyncClient] | None = None
        self.bytes_scanned = 0
        self.calls = 0
        self.failures = 0

    def _client(self, module: Any) -> httpx.AsyncClient:
        """The injected client, or one this hook owns (one per event loop, kept for reuse)."""
        if self.client is not None:
            return self.client
        loop = asyncio.get_running_loop()
        if self._owned is None or self._owned[0] is not loop:
            self._owned = (loop, module.AsyncClient())
        owned: httpx.AsyncClient = self._owned[1]
        return owned

    async def aclose(self) -> None:
        """Close the client this hook created (an injected client stays open)."""
        if self._owned is not None:
            owned, self._owned = self._owned[1], None
            await owned.aclose()

    async def classify(self, texts: list[str]) -> bool:
        """Whether the service flags any of ``texts``; raises :class:`ModerationUnavailable`."""
        import httpx

        self.calls += 1
        try:
            response = await self._client(httpx).post(
                self.url, json={"input": texts}, headers=self.headers, timeout=self.timeout
            )
            response.raise_for_status()
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise ModerationUnavailable(f"{type(exc).__name__}: {exc}") from exc
        return _flagged(body)

    async def __call__(self, ctx: HookContext, new_items: Sequence[Item], state: Any) -> Verdict:
        st = carried(state)
        texts = [t for item in new_items for t in texts_of(item, self.scope) if t]
        scanned = sum(len(t.encode()) for t in texts)
        self.bytes_scanned += scanned
        flagged = False
        if texts and not st.flagged:
            try:
                flagged = await self.classify(texts)
            except ModerationUnavailable:
                self.failures += 1
                if not self.fail_open:
                    # Not carried: a later turn asks the service again.
                    return Verdict(
                        flagged=True,
                        state=st,
                        code="moderation_unavailable",
                        message="The moderation service is unavailable; try again later.",
                    )
        new_state = st.advance(scanned, int(flagged), "moderation" if flagged else None, flagged)
        if new_state.flagged:
            return Verdict(flagged=True, state=new_state, code=self.code, message=self.message)
        return Verdict(state=new_state)


def _flagged(body: Any) -> bool:
    if isinstance(body, dict):
        if "results" in body and isinstance(body["results"], list):
            return any(isinstance(r, dict) and bool(r.get("flagged")) for r in body["results"])
        if "flagged" in body:
            return bool(body["flagged"])
    raise ModerationUnavailable(f"unexpected moderation answer: {body!r:.200}")
