"""The HTTP server takes a scrape round's connections: its listen backlog and its cap.

Prometheus opens a connection per shard target, hundreds within a scrape interval. With the
standard library's backlog of 5, connections the server had not accepted yet were dropped by
the kernel (their SYNs retried a second, then three seconds later).
"""

import math
import socket
from collections import Counter

from collector.api.auth import Refusals
from collector.api.connections import (
    BoundedHandler,
    BoundedHTTPServer,
    ConnectionLimits,
    connection_cap,
)
from collector.config import CollectorConfig
from collector.export.catalog import SERIES_PER_NODE_BUDGET


def test_two_hundred_connections_wait_in_the_backlog_before_any_is_accepted():
    server = BoundedHTTPServer(
        ("127.0.0.1", 0),
        BoundedHandler,
        limits=ConnectionLimits(),
        refusals=Refusals(Counter()),
    )
    clients: list[socket.socket] = []
    try:
        port = server.server_address[1]
        refused = 0
        for _ in range(200):  # nothing accepts meanwhile: serve_forever never runs
            client = socket.socket()
            client.settimeout(0.5)
            try:
                client.connect(("127.0.0.1", port))
            except OSError:
                refused += 1
                if refused > 3:  # enough to tell: each dropped SYN costs 0.5 s
                    break
            clients.append(client)
        assert refused == 0
    finally:
        for client in clients:
            client.close()
        server.server_close()


def test_the_connection_cap_covers_every_shard_target_of_a_4096_node_fleet():
    """Prometheus holds a connection per shard target while it scrapes; at 128 connections,
    4,096 nodes' targets were answered 503 and evicted."""
    nodes_per_shard = CollectorConfig().metrics_shard_samples // SERIES_PER_NODE_BUDGET
    targets = math.ceil(4096 / nodes_per_shard) + 1  # and the fleet's own target
    assert ConnectionLimits().max_connections > targets


def test_the_connection_cap_is_a_share_of_the_file_limit():
    """A quarter of the open-file limit, never above max_connections nor below 8; no limit
    leaves max_connections."""
    limits = ConnectionLimits()
    assert connection_cap(limits, 65536) == limits.max_connections
    assert connection_cap(limits, 512) == 128
    assert connection_cap(limits, 20) == 8
    assert connection_cap(limits, None) == limits.max_connections
