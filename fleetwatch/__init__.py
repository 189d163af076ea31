"""fleetwatch: GPU cluster health daemon (agent, collector, rules, dashboards)."""

__version__ = "0.1.0"
PROTOCOL_VERSION = 1

__all__ = ["PROTOCOL_VERSION", "__version__"]
