"""Calibration from a running server: ``experiments`` (what it sends), ``calibration_fit`` and
``calibration`` (the difference method over HTTP), ``simulated`` (a measured run replayed)."""
