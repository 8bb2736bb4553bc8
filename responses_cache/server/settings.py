"""Settings of ``responses-cache serve``, loaded in one place.

Precedence, lowest first: defaults, a config file (``--config``, TOML or JSON), environment
variables ``RESPONSES_CACHE_<FIELD>`` (``RESPONSES_CACHE_PORT=9000``; lists comma-separated, mappings
as JSON), then command-line options. Every value is type-checked: a bad one is a
:class:`SettingsError` that names the setting and where it came from.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec

from ..core.runtime import (
    DEFAULT_CONTEXT_WINDOW,
    DEFAULT_DRAIN_TIMEOUT_S,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_OUTBOUND_BYTES,
    DEFAULT_PROCESS_CACHE_BYTES,
    DEFAULT_PROCESS_INPUT_BYTES,
    DEFAULT_WRITE_TIMEOUT_S,
)
from ..limits.input_rate import InputRateLimits
from ..protocol.tools import DEFAULT_TOOL_CACHE_BYTES
from ..session.session import SessionConfig
from ..storage.store import DEFAULT_STORE_BYTES, DEFAULT_STORE_TENANT_BYTES

ENV_PREFIX = "RESPONSES_CACHE_"


class QuotaSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One entry of the ``quotas`` setting (:class:`~responses_cache.limits.quotas.Quota`'s fields)."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    concurrent_responses: int | None = None
    connections: int | None = None


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What ``serve`` bounds every connection by (applied to uvicorn by :mod:`.serving`)."""

    #: Seconds a connection may take to send a complete request head.
    header_timeout_s: float = 10.0
    #: Seconds an idle keep-alive HTTP connection stays open between requests.
    keep_alive_s: int = 5
    #: Connections (HTTP and WebSocket together) served at once; beyond it, new requests and
    #: WebSocket upgrades get 503.
    max_connections: int = 2048
    #: WebSocket pings: interval, and how long a pong may take before the connection is dropped.
    ws_ping_interval_s: float = 20.0
    ws_ping_timeout_s: float = 20.0
    #: After the server closes a WebSocket, seconds its peer has to take the last bytes before the
    #: TCP connection is aborted with RST (a peer that stopped reading).
    ws_linger_s: float = 30.0



_LIMITS = ConnectionLimits()
_RATE = InputRateLimits()
#: ``RESPONSES_CACHE_*`` variables that are not ``serve`` settings but are read elsewhere: the
#: vocabulary directory, the cache directory and the hf renderer's tiktoken switch, a single API
#: key, and the vLLM middleware's configuration.
OTHER_VARIABLES = frozenset(
    ENV_PREFIX + name
    for name in ("API_KEY", "VOCAB_DIR", "DIR", "HF_FAST", "SALT_KEY", "MODEL", "TEMPLATE", "PATH", "HTTP", "ENDPOINT")
)
#: Defaults come from the objects the settings configure (one source for each).
_SESSION = SessionConfig()
#: ``serve`` settings that are :class:`~responses_cache.session.session.SessionConfig` fields.
SESSION_SETTINGS = (
    "max_in_flight", "max_named_lanes", "max_queued", "max_queued_bytes", "lifetime_s", "lifetime_grace_s",
    "max_cached_items", "max_cached_bytes", "max_referenceable_items", "max_referenceable_bytes",
    "retain_token_log", "superseded_keep", "superseded_grace_s", "max_pending_steers",
    "allow_append",
)


class ServeSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    backend: str = "simulated"
    #: Keyword options for the backend's factory (for the simulated engine: ``SimulatedConfig`` fields).
    backend_options: dict[str, Any] = msgspec.field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: list[str] = msgspec.field(default_factory=list)
    instant: bool = False
    renderer: str = "harmony"
    #: Keyword options for the renderer (``get_renderer``'s: for ``hf:`` and ``gguf:``
    #: ``history = "keep"``, ``template_kwargs``; for harmony ``reasoning_effort``).
    renderer_options: dict[str, Any] = msgspec.field(default_factory=dict)
    log_level: str = "warning"
    prometheus: bool = False
    #: OpenTelemetry traces and metrics (the otel extra): the global providers, or, when none is
    #: configured, an OTLP exporter set up from the standard ``OTEL_*`` environment variables.
    otel: bool = False
    #: Logs as JSON lines on stderr, one per turn (INFO) and per error, with trace and response ids.
    log_json: bool = False
    billing_jsonl: str | None = None
    billing_sqlite: str | None = None
    billing_webhook: str | None = None
    #: The write-ahead usage journal (needs one of the sinks above); one per server process.
    billing_journal: str | None = None
    #: ``process`` (survives kill -9; no fsync on the turn's path) or ``machine`` (group-committed
    #: ``fdatasync``; survives power loss).
    billing_durability: Literal["process", "machine"] = "process"
    #: How long shutdown waits for the sink; what it has not taken stays in the journal.
    billing_stop_timeout: float = 3.0
    #: How long a partial batch of records may wait before it is written to the sink.
    billing_flush_interval: float = 0.05
    #: Journaled records also kept in memory for delivery (more are read back from the journal);
    #: without a journal, undelivered records held in memory before a warning is logged.
    billing_queue_size: int = 10_000
    # The WebSocket session and connection-cache policy (SessionConfig; docs/limits.md).
    max_in_flight: int = _SESSION.max_in_flight
    max_named_lanes: int = _SESSION.max_named_lanes
    max_queued: int = _SESSION.max_queued
    max_queued_bytes: int = _SESSION.max_queued_bytes
    lifetime_s: float = _SESSION.lifetime_s
    lifetime_grace_s: float = _SESSION.lifetime_grace_s
    max_cached_items: int = _SESSION.max_cached_items
    max_cached_bytes: int = _SESSION.max_cached_bytes
    max_referenceable_items: int = _SESSION.max_referenceable_items
    max_referenceable_bytes: int = _SESSION.max_referenceable_bytes
    retain_token_log: bool = _SESSION.retain_token_log
    superseded_keep: int = _SESSION.superseded_keep
    superseded_grace_s: float = _SESSION.superseded_grace_s
    max_pending_steers: int = _SESSION.max_pending_steers
    #: The ``response.append`` extension (WebSocket only; off by default).
    allow_append: bool = _SESSION.allow_append
    max_body_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    process_cache_bytes: int = DEFAULT_PROCESS_CACHE_BYTES
    #: The process-wide hot cache's share of ``process_cache_bytes`` (default half; 0: none).
    hot_cache_bytes: int | None = None
    #: Where ``store: true`` responses go: ``memory`` (this process only) or a Redis URL (shared
    #: by every process; the redis extra): ``redis://``, ``rediss://``, ``unix://``,
    #: ``redis+sentinel://``, ``redis[s]+cluster://`` (:mod:`responses_cache.storage.redis_client`).
    store: str = "memory"
    #: Bytes of stored responses the ``memory`` store keeps, all tenants together and per tenant;
    #: least recently used go first (docs/limits.md).
    store_max_bytes: int = DEFAULT_STORE_BYTES
    store_max_tenant_bytes: int = DEFAULT_STORE_TENANT_BYTES
    #: How long a stored conversation lives after its latest turn (Redis store).
    store_ttl_s: float = 30 * 24 * 3600.0
    #: Keep token-log snapshots in the store, so another process appends instead of re-rendering.
    store_snapshots: bool = True
    context_window: int = DEFAULT_CONTEXT_WINDOW
    process_input_bytes: int = DEFAULT_PROCESS_INPUT_BYTES
    write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S
    #: Bytes of events queued for one WebSocket peer before the turns producing more wait.
    outbound_bytes: int = DEFAULT_OUTBOUND_BYTES
    #: Input rate limits (WebSocket): bytes per second one connection, and one tenant's connections
    #: together, may send before the server stops reading them; the burst is what may arrive at
    #: once. A rate of 0 turns that limit off.
    input_bytes_per_s: float = _RATE.connection_bytes_per_s or 0
    input_burst_bytes: int = _RATE.connection_burst_bytes
    tenant_input_bytes_per_s: float = _RATE.tenant_bytes_per_s or 0
    tenant_input_burst_bytes: int = _RATE.tenant_burst_bytes
    tool_cache_bytes: int = DEFAULT_TOOL_CACHE_BYTES
    partition_prefix_cache: bool = True
    #: ``truncation: "auto"`` cuts a prompt that does not fit down to this fraction of the room
    #: below what it needs (0.25: to 75 % of it), so the turns after it append for a while.
    truncation_headroom: float = 0.25
    #: How long a compaction item opens after it was made (30 days).
    compaction_ttl_s: float = 30 * 24 * 3600.0
    #: The most tokens the engine may write for a compaction's summary.
    compaction_max_output_tokens: int = 4096
    #: The key that seals ``include: ["reasoning.encrypted_content"]`` reasoning: 32 random bytes
    #: in base64 (the sealing extra). Unset: that option does nothing. Give it by file or by the
    #: environment (``RESPONSES_CACHE_SEALING_KEY``), never on a command line.
    sealing_key: str | None = None
    header_timeout_s: float = _LIMITS.header_timeout_s
    keep_alive_s: int = _LIMITS.keep_alive_s
    max_connections: int = _LIMITS.max_connections
    ws_ping_interval_s: float = _LIMITS.ws_ping_interval_s
    ws_ping_timeout_s: float = _LIMITS.ws_ping_timeout_s
    #: Per-tenant quotas, by tenant name, by API key (one of ``api_keys``: that key's tenant), or
    #: ``"*"`` for every tenant without an entry of its own (docs/limits.md). With a Redis
    #: ``store`` the counters are kept there, shared by every process.
    quotas: dict[str, QuotaSettings] = msgspec.field(default_factory=dict)
    #: Generations running at once in this process; waiting turns get freed slots round-robin
    #: across tenants (unset: no bound here).
    engine_slots: int | None = None
    #: On ``SIGTERM``: how long running turns and background responses may take to finish before
    #: they are cut (cancelled and billed); docs/deploy.md. A second signal cuts them at once.
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S


FIELDS = frozenset(ServeSettings.__struct_fields__)


class SettingsError(ValueError):
    """A setting has an unknown name or a value of the wrong type."""


def load_settings(
    *,
    file: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> ServeSettings:
    """Merge defaults < ``file`` < ``env`` < ``overrides`` (``None`` values are ignored)."""
    merged: dict[str, Any] = {}
    if file is not None:
        merged.update(_checked(_from_file(Path(file)), f"config file {file}"))
    for variable, value in _from_env(env or {}).items():
        merged.update(_checked(value, f"environment variable {variable}"))
    merged.update(_checked({k: v for k, v in (overrides or {}).items() if v is not None}, "command-line option"))
    return msgspec.convert(merged, ServeSettings, strict=False)


def _checked(values: dict[str, Any], source: str) -> dict[str, Any]:
    """``values`` once they are valid settings; else an error that names where they came from."""
    try:
        msgspec.convert(values, ServeSettings, strict=False)
    except msgspec.ValidationError as exc:
        raise SettingsError(f"invalid setting in {source}: {exc}") from None
    return values


def _from_file(path: Path) -> dict[str, Any]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SettingsError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        if path.suffix == ".toml":
            if sys.version_info >= (3, 11):
                import tomllib
            else:  # pragma: no cover - Python 3.10
                import tomli as tomllib
            loaded: Any = tomllib.loads(data.decode())
        else:
            loaded = json.loads(data)
    except ValueError as exc:
        raise SettingsError(f"config file {path} is not valid {'TOML' if path.suffix == '.toml' else 'JSON'}: {exc}") from None
    if not isinstance(loaded, dict):
        raise SettingsError(f"config file {path} must hold a table/object of settings")
    unknown = sorted(set(loaded) - FIELDS)
    if unknown:
        raise SettingsError(f"config file {path}: unknown setting(s) {', '.join(unknown)}")
    return loaded


def _from_env(env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """The settings the environment gives, by variable (``{variable: {setting: value}}``)."""
    out: dict[str, dict[str, Any]] = {}
    for key, raw in env.items():
        if not key.startswith(ENV_PREFIX) or key in OTHER_VARIABLES:
            continue
        name = key[len(ENV_PREFIX) :].lower()
        if name not in FIELDS:
            raise SettingsError(f"unknown environment variable {key} (no serve setting {name!r})")
        if name == "api_keys":
            out[key] = {name: [k.strip() for k in raw.split(",") if k.strip()]}
        elif name in ("backend_options", "renderer_options", "quotas"):
            try:
                out[key] = {name: json.loads(raw)}
            except ValueError:
                raise SettingsError(f"{key} must be a JSON object") from None
        else:
            out[key] = {name: raw}
    single = env.get(ENV_PREFIX + "API_KEY")
    if single:  # a single key, the common case
        keys = out.pop(ENV_PREFIX + "API_KEYS", {}).get("api_keys", [])
        out[ENV_PREFIX + "API_KEY"] = {"api_keys": [*keys, single]}
    return out
