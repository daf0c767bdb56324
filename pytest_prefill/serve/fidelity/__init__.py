"""Fidelity against a running server: ``held_out`` workloads, ``fidelity`` (measured beside
simulated), ``fidelity_interval`` (how sure) and ``prefix_check`` (a prefix cache on a server)."""
