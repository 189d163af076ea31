"""Pre-flight checks as the agent carries them out: the runners, real and simulated."""
