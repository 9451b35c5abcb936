"""`python -m tests.bench` (`make bench`): see tests/bench/__init__.py."""

import sys

from tests.bench.driver import main

sys.exit(main())
