"""``serve`` hands large freed blocks back to the system (:mod:`responses_cache.server.allocator`).

glibc raises its mmap threshold to the size of each large block freed; the next large blocks then
come from the heap, and small live blocks allocated between them keep their pages resident after
they are freed -- what a flood of megabyte frames left behind in ``serve``. Measured in a fresh
interpreter, by its resident memory: the same allocations with and without the setting."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from responses_cache.server import cli

pytestmark = [
    pytest.mark.subprocess,
    pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or bool(os.environ.get("LD_PRELOAD")), reason="glibc malloc"),
]

_PROGRAM = textwrap.dedent("""
    import sys
    from responses_cache.server.allocator import return_large_blocks

    def rss():
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))

    took = return_large_blocks() if sys.argv[1] == "on" else False
    first = bytearray(8 << 20)
    del first  # glibc raises its mmap threshold to 8 MiB here
    before = rss()
    blocks, pins = [], []
    for _ in range(8):  # 4 MiB blocks (a megabyte frame's text, its tokens), a small live block after each
        blocks.append(bytearray(4 << 20))
        pins.append(bytearray(200_000))
    del blocks
    print(took, rss() - before)
""")


def _left(mode: str) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", _PROGRAM, mode], capture_output=True, text=True, check=True, timeout=60)
    took, left = out.stdout.split()
    return took == "True", int(left)


def test_freed_large_blocks_leave_the_process() -> None:
    took, left = _left("on")
    assert took
    assert left < 8 << 20, f"{left >> 20} MiB of 32 MiB freed still resident"


def test_without_the_setting_they_stay() -> None:
    """The measure above can tell: glibc's default keeps most of them."""
    _, left = _left("off")
    assert left > 16 << 20


def test_serve_applies_it() -> None:
    source = Path(cli.__file__).read_text()
    assert "return_large_blocks()" in source.split("def _serve", 1)[1].split("\ndef ", 1)[0]
