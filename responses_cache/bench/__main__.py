"""``python -m responses_cache.bench [options]`` — same as ``responses-cache bench``."""

import sys

from . import main

sys.exit(main(sys.argv[1:]))
