"""1,000 concurrent WebSocket connections with 16k-token contexts: errors, turns/s, cache bytes per token.

A thin wrapper over ``python -m benchmarks.suite --scenarios scale``; every option of that command works
here too (``--quick``, ``--out DIR``, ...). See docs/benchmarks.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

from benchmarks.suite import main

if __name__ == "__main__":
    sys.exit(main(["--scenarios", "scale", *sys.argv[1:]]))
