"""``python -m pytest_prefill`` is ``prefill-bench``."""

from __future__ import annotations

from pytest_prefill.cli import entry

if __name__ == "__main__":
    entry()
