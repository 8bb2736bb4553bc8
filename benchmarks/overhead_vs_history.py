"""Per-turn API overhead vs conversation length: HTTP full resend, HTTP previous_response_id, WebSocket mode.

A thin wrapper over ``python -m benchmarks.suite --scenarios overhead``; every option of that command works
here too (``--quick``, ``--out DIR``, ...). See docs/benchmarks.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

from benchmarks.suite import main

if __name__ == "__main__":
    sys.exit(main(["--scenarios", "overhead", *sys.argv[1:]]))
