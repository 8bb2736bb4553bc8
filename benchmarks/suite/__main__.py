"""``python -m benchmarks.suite [options]`` — same as ``python -m benchmarks.suite``."""

import sys

from . import main

sys.exit(main(sys.argv[1:]))
