"""Compute from the model and the device: a device catalog, per-operation physics from a model's
shapes, efficiency tables fitted on public per-op data, and a cost model derived from them
(DESIGN.md, "Compute from the model and the device"). Standard library only."""

from __future__ import annotations

from pytest_prefill.plan.compute.devices import CATALOG, Device, custom_device, device_named

__all__ = ["CATALOG", "Device", "custom_device", "device_named"]
