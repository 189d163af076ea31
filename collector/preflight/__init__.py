"""Pre-flight on the collector: plan, run over the agents, judge, localise, journal, hold."""
