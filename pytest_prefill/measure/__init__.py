"""Measurement: timing discipline and fits (numpy), the model under test and its runner (torch and transformers, imported lazily), and calibration."""
