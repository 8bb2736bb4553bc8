"""``serve`` leaves what it built at start-up out of the garbage collector's later walks
(:mod:`responses_cache.server.collector`). Counted in a fresh interpreter that builds the app as
``serve`` does: the objects a full collection examines, before and after."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from responses_cache.server import cli

pytestmark = pytest.mark.subprocess

_PROGRAM = textwrap.dedent("""
    import gc, sys
    from responses_cache.server.cli import server_config
    from responses_cache.server.settings import load_settings
    from responses_cache.edge.app import create_app
    from responses_cache.server.collector import freeze_startup_objects

    app = create_app(server_config(load_settings(file=None, env={}, overrides={})))
    gc.collect()
    before = len(gc.get_objects())
    frozen = freeze_startup_objects() if sys.argv[1] == "on" else 0
    print(before, frozen, len(gc.get_objects()))
""")


def _count(mode: str) -> tuple[int, int, int]:
    out = subprocess.run([sys.executable, "-c", _PROGRAM, mode], capture_output=True, text=True, check=True, timeout=120)
    before, frozen, after = (int(n) for n in out.stdout.split())
    return before, frozen, after


def test_a_full_collection_after_the_start_walks_almost_nothing() -> None:
    before, frozen, after = _count("on")
    assert before > 20_000  # the start-up heap a full collection walked each time
    assert frozen >= before - 100
    assert after < 1_000, f"a full collection still walks {after} objects"


def test_without_it_every_full_collection_walks_the_start_up_heap() -> None:
    """The count above can tell: nothing else takes those objects out of the walk."""
    before, _, after = _count("off")
    assert after >= before - 100 > 20_000


def test_serve_freezes_after_building_the_app_and_before_serving() -> None:
    body = Path(cli.__file__).read_text().split("def _serve", 1)[1].split("\ndef ", 1)[0]
    assert body.index("create_app(config)") < body.index("freeze_startup_objects()") < body.index(".run()")
