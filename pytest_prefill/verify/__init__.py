"""Checking a capacity answer on a server (DESIGN.md, "Checking the answer on a server"): the knee
of each flag set predicted and measured (``knee``, ``knee_interval``, ``knee_sizing``), the flag
sets and the probe rule (``probe_rule``), the load check, ``verification`` (the whole run) and
its ``result`` (the ranking among it)."""
