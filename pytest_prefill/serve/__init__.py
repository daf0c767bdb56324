"""Running servers of other engines reached over HTTP: the load generator, calibration from a server, and fidelity against it."""
