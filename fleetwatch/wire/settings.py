"""What both ends of the stream agree on: method path, size limits, keepalive, result wording."""

from __future__ import annotations

from typing import Final

STREAM_METHOD: Final = "/fleetwatch.v1.Fleet/Stream"
SERVICE_NAME: Final = "fleetwatch.v1.Fleet"

# The collector checks each message against this limit itself so that it can count the rejection
# and say what was too big; gRPC's own limit sits above it as a backstop for hostile peers.
MAX_MESSAGE_BYTES: Final = 1 << 20
TRANSPORT_MAX_MESSAGE_BYTES: Final = 8 << 20

# Keepalive: the agent pings every 30 s, even when idle, to find a dead collector or a silently
# dropped NAT/firewall entry; the server must accept pings that often or it sends GOAWAY
# ("too_many_pings"), so its minimum ping interval is below the client's ping time.
CLIENT_KEEPALIVE_TIME_MS: Final = 30_000
CLIENT_KEEPALIVE_TIMEOUT_MS: Final = 10_000
SERVER_KEEPALIVE_TIME_MS: Final = 60_000
SERVER_KEEPALIVE_TIMEOUT_MS: Final = 20_000
SERVER_MIN_PING_INTERVAL_MS: Final = 15_000

# Streams that arrived but that the collector's event loop has not taken up yet. gRPC's own
# limits (1,000, then 3,000 at most) cancel the rest at once: after a restart, thousands of
# agents' Hellos came back CANCELLED within a second and each agent backed off, a second or more
# longer each time; that, not the collector's work, was the restart's long tail. The queue holds
# the largest fleet one collector is sized for (docs/scaling.md); a call still waits at most
# 30 s to be taken up (gRPC's grpc.server_max_unrequested_time_in_server, the agent's own
# Welcome timeout). A waiting call holds what its sender wrote within the stream's HTTP/2
# window (64 KiB to start): some hundreds of MiB at worst with the queue full, and only from a
# peer allowed to open streams at all (with TLS, one holding a fleet certificate). Each of the
# collector's servers on the port (collector/ingest/server.py) has a queue this long.
MAX_PENDING_STREAMS: Final = 8_192

ChannelOptions = list[tuple[str, int]]


def client_options() -> ChannelOptions:
    """Channel options for the agent's connection to the collector."""
    return [
        ("grpc.keepalive_time_ms", CLIENT_KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", CLIENT_KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        # Reconnects are ours (with jitter); keep gRPC's own retry out of the way.
        ("grpc.enable_retries", 0),
    ]


def server_options() -> ChannelOptions:
    """Server options for the collector.

    ``grpc.so_reuseport`` (gRPC's default on Linux, said here because the collector counts on
    it): several servers of one process share the port (collector/ingest/server.py). Linux lets
    only sockets of the same user join the group, so another user cannot take a share of it.
    """
    return [
        ("grpc.so_reuseport", 1),
        ("grpc.keepalive_time_ms", SERVER_KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", SERVER_KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", SERVER_MIN_PING_INTERVAL_MS),
        ("grpc.http2.max_ping_strikes", 2),
        ("grpc.max_receive_message_length", TRANSPORT_MAX_MESSAGE_BYTES),
        ("grpc.server.max_pending_requests", MAX_PENDING_STREAMS),
        ("grpc.server.max_pending_requests_hard_limit", MAX_PENDING_STREAMS),
    ]


# A command result's detail starts with this when the agent refused the command as unsafe (the
# collector counts those as refused, not failed).
COMMAND_REFUSED: Final = "refused: "
