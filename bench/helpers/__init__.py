"""What the benchmarks share, and the child programs and parts they start or import.

Shared: child processes and their pipe, a collector's config and HTTP API, the faults and their
timing, CPU and figures, simulated nodes. Child programs: ``sim_fleet.py``, ``chaos_node.py``.
The chaos benchmark's parts: ``chaos_net.py``, ``chaos_journal.py``.
"""
