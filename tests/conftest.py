"""Test wiring: ``pytester`` for the plugin tests."""

pytest_plugins = ["pytester"]
