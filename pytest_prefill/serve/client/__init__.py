"""The streaming HTTP client and what each engine is sent: ``http``, ``api``, ``prompts``,
``identity`` (which server a URL is) and ``counters`` (the engines' metric names)."""
