"""Generated protobuf code for wire contract v1 (see fleetwatch.proto)."""
