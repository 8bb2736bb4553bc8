"""Serve settings: defaults < file < environment < command line, each value type-checked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import responses_cache
from responses_cache.limits.input_rate import InputRateLimits
from responses_cache.server.cli import input_rate_limits, main
from responses_cache.server.settings import ServeSettings, SettingsError, load_settings


def test_precedence_file_env_overrides(tmp_path: Path) -> None:
    config = tmp_path / "serve.toml"
    config.write_text('port = 9001\nhost = "0.0.0.0"\napi_keys = ["sk-file"]\n[backend_options]\noutput_tokens_per_s = 50\n')
    env = {"RESPONSES_CACHE_PORT": "9002", "RESPONSES_CACHE_INSTANT": "true", "OTHER": "x"}
    settings = load_settings(file=config, env=env, overrides={"port": None, "renderer": "chatml"})
    assert settings.port == 9002 and settings.host == "0.0.0.0" and settings.instant is True
    assert settings.renderer == "chatml" and settings.api_keys == ["sk-file"]
    assert settings.backend_options == {"output_tokens_per_s": 50}
    assert load_settings(file=config, env=env, overrides={"port": 9003}).port == 9003
    assert load_settings() == ServeSettings()


def test_env_lists_and_json(tmp_path: Path) -> None:
    env = {
        "RESPONSES_CACHE_API_KEYS": "sk-a, sk-b",
        "RESPONSES_CACHE_API_KEY": "sk-c",
        "RESPONSES_CACHE_BACKEND_OPTIONS": '{"answer_tokens": 5}',
        "RESPONSES_CACHE_VOCAB_DIR": "/somewhere",  # another component's variable: ignored here
    }
    settings = load_settings(env=env)
    assert settings.api_keys == ["sk-a", "sk-b", "sk-c"] and settings.backend_options == {"answer_tokens": 5}
    json_config = tmp_path / "serve.json"
    json_config.write_text('{"lifetime_s": 120}')
    assert load_settings(file=json_config).lifetime_s == 120.0


@pytest.mark.parametrize(
    ("content", "suffix", "message"),
    [
        ("port = 'eighty'", ".toml", "port"),
        ("prot = 80", ".toml", r"unknown setting\(s\) prot"),
        ("port = ", ".toml", "not valid TOML"),
        ("[1, 2]", ".json", "must hold a table"),
    ],
)
def test_bad_files_name_the_problem(tmp_path: Path, content: str, suffix: str, message: str) -> None:
    path = tmp_path / f"serve{suffix}"
    path.write_text(content)
    with pytest.raises(SettingsError, match=message):
        load_settings(file=path)


def test_bad_env_value() -> None:
    with pytest.raises(SettingsError, match="port"):
        load_settings(env={"RESPONSES_CACHE_PORT": "lots"})


def test_serve_reports_bad_settings_and_unknown_backends(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.toml"
    assert main(["serve", "--config", str(missing)]) == 2
    assert "cannot read config file" in capsys.readouterr().err
    assert main(["serve", "--backend", "no-such-engine"]) == 2
    assert "unknown backend 'no-such-engine'" in capsys.readouterr().err


def test_store_setting(capsys: pytest.CaptureFixture[str]) -> None:
    from responses_cache.server.cli import _store
    from responses_cache.storage.redis_store import RedisResponseStore

    assert _store(load_settings()) is None  # memory: the app's own in-process store
    env = {"RESPONSES_CACHE_STORE": "redis://127.0.0.1:1/3", "RESPONSES_CACHE_STORE_TTL_S": "60"}
    store = _store(load_settings(env=env, overrides={"store_snapshots": False}))
    assert isinstance(store, RedisResponseStore) and store.ttl_s == 60 and not store.keeps_snapshots
    assert main(["serve", "--store", "postgres://db"]) == 2
    assert "unsupported store 'postgres://db'" in capsys.readouterr().err


def test_billing_settings_reach_the_biller(tmp_path: Path) -> None:
    from responses_cache.server.cli import _biller

    env = {
        "RESPONSES_CACHE_BILLING_JSONL": str(tmp_path / "usage.jsonl"),
        "RESPONSES_CACHE_BILLING_JOURNAL": str(tmp_path / "billing.journal"),
        "RESPONSES_CACHE_BILLING_DURABILITY": "machine",
        "RESPONSES_CACHE_BILLING_STOP_TIMEOUT": "1.5",
        "RESPONSES_CACHE_BILLING_FLUSH_INTERVAL": "0.01",
        "RESPONSES_CACHE_BILLING_QUEUE_SIZE": "77",
    }
    biller = _biller(load_settings(env=env))
    assert biller is not None and biller.journal is not None
    assert biller.journal.path == tmp_path / "billing.journal" and biller.durability == "machine"
    assert (biller._stop_timeout, biller._flush_interval, biller._queue_size) == (1.5, 0.01, 77)
    defaults = ServeSettings()
    assert (defaults.billing_durability, defaults.billing_stop_timeout) == ("process", 3.0)
    with pytest.raises(SettingsError, match="billing_durability"):
        load_settings(env={"RESPONSES_CACHE_BILLING_DURABILITY": "disk"})


def test_a_billing_journal_needs_a_sink(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--billing-journal", str(tmp_path / "billing.journal")]) == 2
    assert "billing_journal needs a sink" in capsys.readouterr().err


def test_every_session_policy_is_a_setting_with_the_session_default(tmp_path: Path) -> None:
    import dataclasses

    from responses_cache.server.settings import SESSION_SETTINGS
    from responses_cache.session.session import SessionConfig

    session_fields = {f.name for f in dataclasses.fields(SessionConfig)} - {"limit_message"}
    assert set(SESSION_SETTINGS) == session_fields
    defaults, settings = SessionConfig(), ServeSettings()
    assert all(getattr(settings, name) == getattr(defaults, name) for name in SESSION_SETTINGS)
    config = tmp_path / "serve.toml"
    config.write_text("max_cached_bytes = 1048576\nretain_token_log = false\n")
    env = {"RESPONSES_CACHE_SUPERSEDED_KEEP": "0", "RESPONSES_CACHE_MAX_IN_FLIGHT": "4"}
    loaded = load_settings(file=config, env=env)
    session = SessionConfig(**{name: getattr(loaded, name) for name in SESSION_SETTINGS})
    assert (session.max_cached_bytes, session.retain_token_log) == (1048576, False)
    assert (session.superseded_keep, session.max_in_flight) == (0, 4)


def test_an_unknown_variable_stops_the_command_and_errors_name_the_variable() -> None:
    with pytest.raises(SettingsError, match="RESPONSES_CACHE_MAX_CACHED_BYTE"):
        load_settings(env={"RESPONSES_CACHE_MAX_CACHED_BYTE": "1"})  # a typo is not ignored
    with pytest.raises(SettingsError, match="environment variable RESPONSES_CACHE_MAX_CACHED_BYTES"):
        load_settings(env={"RESPONSES_CACHE_MAX_CACHED_BYTES": "lots"})
    with pytest.raises(SettingsError, match="command-line option"):
        load_settings(overrides={"port": "eighty"})
    # Variables other parts of the package read are not serve settings, and are not refused.
    assert load_settings(env={"RESPONSES_CACHE_VOCAB_DIR": "/v", "RESPONSES_CACHE_MODEL": "m"}) == ServeSettings()


def test_every_variable_the_package_reads_is_a_setting_or_known_to_be_another_components() -> None:
    # A variable read somewhere in the package (or an adapter) that `serve` would refuse as an
    # unknown setting makes that feature unusable with `serve`.
    roots = [Path(responses_cache.__file__).parent, *Path(responses_cache.__file__).parents[1].glob("adapters/*/responses_cache_*")]
    read = {
        name
        for root in roots
        for source in root.rglob("*.py")
        for name in re.findall(r"\bRESPONSES_CACHE_[A-Z][A-Z_]*[A-Z]\b", source.read_text())
    }
    assert "RESPONSES_CACHE_HF_FAST" in read  # the scan sees what it must
    refused = set()
    for name in sorted(read):
        try:
            load_settings(env={name: "0"})
        except SettingsError as exc:
            if "unknown environment variable" in str(exc):
                refused.add(name)
    assert not refused


def test_quotas_setting_by_key_tenant_and_default(tmp_path: Path) -> None:
    from responses_cache.core.auth import tenant_of_key
    from responses_cache.limits.quotas import Quota
    from responses_cache.server.cli import _quotas

    config = tmp_path / "serve.toml"
    config.write_text(
        'api_keys = ["sk-team-a", "sk-team-b"]\n'
        '[quotas."*"]\nrequests_per_minute = 600\nconnections = 32\n'
        '[quotas.sk-team-b]\ntokens_per_minute = 200000\nconcurrent_responses = 8\n'
        '[quotas.research]\ntokens_per_minute = 5\n'
    )
    quotas = _quotas(load_settings(file=config))
    assert quotas is not None
    assert quotas.of(tenant_of_key("sk-team-b")) == Quota(tokens_per_minute=200_000, concurrent_responses=8)
    assert quotas.of(tenant_of_key("sk-team-a")) == Quota(requests_per_minute=600, connections=32)  # the default
    assert quotas.of("research") == Quota(tokens_per_minute=5)  # a tenant by name
    env = {"RESPONSES_CACHE_QUOTAS": '{"*": {"tokens_per_minute": 7}}'}
    from_env = _quotas(load_settings(env=env))
    assert from_env is not None and from_env.of("anyone") == Quota(tokens_per_minute=7)
    assert _quotas(load_settings()) is None


def test_bad_quotas_name_the_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SettingsError, match="requests_per_mnute"):
        load_settings(env={"RESPONSES_CACHE_QUOTAS": '{"*": {"requests_per_mnute": 1}}'})
    with pytest.raises(SettingsError, match="RESPONSES_CACHE_QUOTAS must be a JSON object"):
        load_settings(env={"RESPONSES_CACHE_QUOTAS": "nope"})
    config = tmp_path / "serve.toml"
    config.write_text('[quotas."*"]\nconnections = 0\n')
    assert main(["serve", "--config", str(config)]) == 2
    assert "Quota.connections must be a positive integer" in capsys.readouterr().err
    assert main(["serve", "--engine-slots", "0"]) == 2
    assert "engine_slots must be at least 1" in capsys.readouterr().err


def test_input_rate_settings_default_to_the_limits_and_zero_turns_a_rate_off() -> None:
    assert input_rate_limits(load_settings()) == InputRateLimits()
    env = {"RESPONSES_CACHE_INPUT_BYTES_PER_S": "0", "RESPONSES_CACHE_TENANT_INPUT_BYTES_PER_S": "5000",
           "RESPONSES_CACHE_TENANT_INPUT_BURST_BYTES": "70000", "RESPONSES_CACHE_INPUT_BURST_BYTES": "9"}
    assert input_rate_limits(load_settings(env=env)) == InputRateLimits(
        connection_bytes_per_s=None, connection_burst_bytes=9, tenant_bytes_per_s=5000, tenant_burst_bytes=70000
    )


def test_renderer_options_reach_the_route_renderer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from responses_cache.backends.simulated import SimulatedConfig, SimulatedEngine
    from responses_cache.edge.app import default_router
    from responses_cache.server.cli import server_config
    from responses_cache.tokens.hf import HFRenderer
    from tests.tokens.hf_assets import build_tokenizer_dir

    model = build_tokenizer_dir("qwen", tmp_path / "qwen")
    config = tmp_path / "serve.toml"
    config.write_text(f'renderer = "hf:{model}"\n[renderer_options]\nhistory = "keep"\n')
    settings = load_settings(file=config)
    assert server_config(settings).renderer_options == {"history": "keep"}
    env = {"RESPONSES_CACHE_RENDERER_OPTIONS": '{"history": "keep"}'}
    assert load_settings(env=env).renderer_options == {"history": "keep"}
    engine = SimulatedEngine(SimulatedConfig(instant=True))
    route = default_router(engine, settings.renderer, 4096, settings.renderer_options).resolve("any", "tenant")
    assert isinstance(route.renderer, HFRenderer) and route.renderer.history == "keep"
    default = default_router(engine, settings.renderer, 4096).resolve("any", "tenant")
    assert isinstance(default.renderer, HFRenderer) and default.renderer.history == "template"
    # An option the renderer does not take stops the start, naming it.
    bad = tmp_path / "bad.toml"
    bad.write_text('renderer = "harmony"\n[renderer_options]\nhistory = "keep"\n')
    assert main(["serve", "--config", str(bad)]) == 2
    assert "renderer_options {'history': 'keep'} do not apply to 'harmony'" in capsys.readouterr().err
