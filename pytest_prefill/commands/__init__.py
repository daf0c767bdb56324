"""The subcommands of ``prefill-bench``, one module each."""
