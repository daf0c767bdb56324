"""Our own mini serving engine: the packed pass, the loop that runs the simulator's rules, real disaggregation, the falsifier and fidelity. torch is imported lazily."""
