"""``fleetwatch demo``: a simulated cluster with faults, watched live by a real collector."""
