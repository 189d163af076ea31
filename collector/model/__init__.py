"""The fleet model: nodes, GPUs, links and ports now, their sample slots, history and liveness."""
