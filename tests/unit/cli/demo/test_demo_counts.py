"""The demo summary's counts read the same whatever arrived first.

A run's notifications may reach the webhook receiver before or after its drain request (a rule's
notify goes beside its drain); first-seen order made one run print ``drain_request 1,
notification 12`` and the next ``notification 12, drain_request 1``.
"""

from cli.demo.view import count_by


def test_counts_are_by_name_not_by_arrival():
    one = count_by(["drain_request", "notification", "notification"])
    other = count_by(["notification", "notification", "drain_request"])
    assert one == other == "drain_request 1, notification 2"


def test_nothing_counted_reads_none():
    assert count_by([]) == "none"
