"""Traffic and planning: workloads, serving metrics, deployments, the capacity search and its executors, the chunk rule and recommendation, the cost-model document schema. Standard library only."""
