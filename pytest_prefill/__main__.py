"""``python -m pytest_prefill`` is ``prefill-bench``."""

from __future__ import annotations

import sys

from pytest_prefill.cli import main

if __name__ == "__main__":
    sys.exit(main())
