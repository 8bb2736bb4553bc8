"""Smoke test of ``python -m benchmarks.hf_render``: one test family at a tiny size, checking the
report's shape (never the figures), and that its ``no-tpl`` path (the template's runs replayed)
builds the same logs as the real one."""

from __future__ import annotations

import pathlib
import sys

import pytest

from benchmarks import hf_render
from tests.tokens.hf_assets import build_tokenizer_dir

pytestmark = [pytest.mark.slow]


def test_reports_every_size_and_the_flatness(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    model = build_tokenizer_dir("qwen", tmp_path / "qwen")
    argv = ["hf_render", "--repeat", "1", "--turns", "2", "--sizes", "1500,3000", "--no-engine", "--model", str(model)]
    monkeypatch.setattr(sys, "argv", argv)
    hf_render.main()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("qwen")]
    assert len(lines) == 3 and "flatness" in lines[-1], lines
    assert all(line.split()[7].endswith("x") for line in lines[:2]), lines  # the no-tpl / harmony column
    assert all(line.split()[8].endswith("x") for line in lines[:2]), lines  # the floor / harmony column


def test_the_replayed_template_gives_the_same_logs(tmp_path: pathlib.Path) -> None:
    path = build_tokenizer_dir("qwen", tmp_path / "qwen")
    r = hf_render.get_renderer(f"hf:{path}", window=8)
    case = hf_render.prepare(r, hf_render.get_renderer("harmony"), 1500, 3, path)
    real = hf_render.run_turns(r, case.log, case.turns)
    for _ in range(2):  # the replay goes round again each time
        replayed = hf_render.run_turns(case.replay, case.log, case.turns)
        assert list(replayed.tokens()) == list(real.tokens())
