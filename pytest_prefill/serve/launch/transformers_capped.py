"""``transformers serve`` with a sequence cap: its CLI has no flag for its scheduler's request
cap (``ContinuousBatchingConfig.max_requests_per_batch``; the FIFO scheduler takes decodes
first, then prompts, and no more than this many requests a batch, so no more than this many
run at once). Run by path under the Python of the venv that has transformers::

    python transformers_capped.py --max-requests-per-batch 4 serve MODEL --continuous-batching ...

it sets that field's default to the cap and runs the ``transformers`` CLI with the rest of the
command line, unchanged. A transformers without the field exits with a line saying so. Imports
nothing of pytest_prefill, so that venv need not have it."""

from __future__ import annotations

import inspect
import re
import sys

FLAG = "--max-requests-per-batch"


def main(argv: list[str]) -> int:
    # ASCII digits only: str.isdigit() takes "²" and "١٢", and int() then fails or reads them
    if (
        len(argv) < 2
        or argv[0] != FLAG
        or not re.fullmatch(r"[0-9]{1,9}", argv[1])
        or int(argv[1]) < 1
    ):
        sys.stderr.write(f"usage: {FLAG} N (N >= 1) then the transformers command's arguments\n")
        return 2
    cap = int(argv[1])
    import transformers

    config = transformers.ContinuousBatchingConfig
    init = config.__init__
    if "max_requests_per_batch" not in inspect.signature(init).parameters:
        sys.stderr.write(
            f"transformers {transformers.__version__} has no "
            "ContinuousBatchingConfig.max_requests_per_batch: no sequence cap to set\n"
        )
        return 2

    def capped(self: object, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("max_requests_per_batch", cap)
        init(self, *args, **kwargs)

    config.__init__ = capped
    from transformers.cli.transformers import main as transformers_main

    sys.argv = ["transformers", *argv[2:]]
    result = transformers_main()
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
