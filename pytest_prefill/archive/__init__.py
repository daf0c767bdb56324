"""The per-machine JSON archive of runs, and the one way a cost spec is resolved. Standard library only."""
