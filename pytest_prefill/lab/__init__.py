"""The lab: our own mini serving engine (its loop is the ``lab`` engine profile). The packed pass,
the loop that runs the simulator's rules, real disaggregation, the falsifier and fidelity. torch
is imported lazily."""
