"""The roof: the ``fleetwatch`` command, the demo and the dev servers (imports both programs)."""
