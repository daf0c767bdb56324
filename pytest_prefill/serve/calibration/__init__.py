"""Calibration from a running server: ``experiments`` (what it sends), ``calibration_fit`` and
``calibration`` (the difference method over HTTP), ``server_calibration`` (what it found),
``server_model`` (the server as the simulator sees it, and a measured run replayed in it)."""
