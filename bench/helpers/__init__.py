"""Helpers of the benchmarks: simulated fleets, chaos nodes and relay, shared actions config."""
