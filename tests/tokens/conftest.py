"""Fixtures for the tokenization tests: renderers and the openai-harmony oracle (offline)."""

from __future__ import annotations

import gzip
import importlib.resources
import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from responses_cache.tokens import BaseRenderer, get_renderer

settings.register_profile(
    "tokens",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

#: Renderer configurations the property tests run against.
RENDERERS: dict[str, dict[str, Any]] = {
    "harmony": {"template": "harmony"},
    "harmony-keep-analysis": {"template": "harmony", "auto_drop_analysis": False},
    "chatml-cl100k": {"template": "chatml", "encoding": "cl100k_base"},
    "chatml-o200k": {"template": "chatml", "encoding": "o200k_base"},
}


def make_renderer(name: str) -> BaseRenderer:
    options = dict(RENDERERS[name])
    return get_renderer(options.pop("template"), **options)


@pytest.fixture(scope="module", params=list(RENDERERS))
def renderer(request: pytest.FixtureRequest) -> BaseRenderer:
    return make_renderer(request.param)


@pytest.fixture(scope="session")
def harmony_oracle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """openai-harmony's encoding, loaded offline from our bundled (hash-checked) vocabulary."""
    oh = pytest.importorskip("openai_harmony")
    directory = tmp_path_factory.mktemp("harmony-vocab")
    packed = importlib.resources.files("responses_cache").joinpath("vocab").joinpath("o200k_base.tiktoken.gz")
    (directory / "o200k_base.tiktoken").write_bytes(gzip.decompress(packed.read_bytes()))
    old = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(directory)
    try:
        yield oh.load_harmony_encoding(oh.HarmonyEncodingName.HARMONY_GPT_OSS)
    finally:
        if old is None:
            os.environ.pop("TIKTOKEN_ENCODINGS_BASE", None)
        else:
            os.environ["TIKTOKEN_ENCODINGS_BASE"] = old
