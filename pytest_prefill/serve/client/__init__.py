"""The streaming HTTP client and what each engine is sent: ``http``, ``api``, ``prompts``,
``identity`` (which server a URL is and what it runs with)."""
