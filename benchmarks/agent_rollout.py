"""A 30-tool-call coding-agent rollout end to end over each transport, against the engine's floor.

A thin wrapper over ``python -m benchmarks.suite --scenarios rollout``; every option of that command works
here too (``--quick``, ``--out DIR``, ...). See docs/benchmarks.md.
"""

from __future__ import annotations

import sys

from benchmarks.suite import main

if __name__ == "__main__":
    sys.exit(main(["--scenarios", "rollout", *sys.argv[1:]]))
