"""Pre-flight qualification of a cluster: the vocabulary the collector and the agents share."""
