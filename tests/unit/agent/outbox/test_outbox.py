from agent.outbox.queue import Outbox
from agent.poll.findings import PendingEvent
from fleetwatch.model import EventKind, Target


def event(n: int = 0) -> PendingEvent:
    return PendingEvent(EventKind.XID, Target.gpu("GPU-00000000-0000"), 1_000 + n, xid=13)


class TestOutbox:
    def test_numbers_events_from_one_without_gaps(self):
        """Events get 1, 2, 3 ... in the order they are added."""
        box = Outbox("boot")
        seqs = [box.add(event(i)).seq for i in range(3)]
        assert seqs == [1, 2, 3]
        assert box.last_seq == 3
        assert len(box) == 3

    def test_ack_drops_up_to_and_including_seq(self):
        """A cumulative ack removes every event up to its number, and no more."""
        box = Outbox("boot")
        for i in range(5):
            box.add(event(i))
        assert box.ack(3) == 3
        assert [e.seq for e in box.after(0)] == [4, 5]
        assert box.acked_seq == 3

    def test_stale_or_repeated_ack_changes_nothing(self):
        """An older ack after a newer one neither drops nor resurrects events."""
        box = Outbox("boot")
        for i in range(4):
            box.add(event(i))
        box.ack(2)
        assert box.ack(1) == 0
        assert box.acked_seq == 2
        assert len(box) == 2

    def test_ack_beyond_last_seq_is_clamped(self):
        """An ack for numbers never handed out cannot make later events look acked."""
        box = Outbox("boot")
        box.add(event())
        box.ack(10)
        assert box.acked_seq == 1
        new = box.add(event())
        assert new.seq == 2
        assert [e.seq for e in box.after(box.acked_seq)] == [2]

    def test_replay_returns_unacked_in_order(self):
        """After a reconnect everything above the ack is sent again, oldest first."""
        box = Outbox("boot")
        for i in range(4):
            box.add(event(i))
        box.ack(1)
        assert [e.seq for e in box.after(box.acked_seq)] == [2, 3, 4]
        assert [e.seq for e in box.after(3)] == [4]

    def test_first_welcome_renumbers_above_an_earlier_process(self):
        """A restarted agent numbers its events above what the journal already holds."""
        box = Outbox("boot")
        box.add(event(0))
        box.add(event(1))
        box.welcome(journaled_seq=7)
        assert [e.seq for e in box.after(box.acked_seq)] == [8, 9]
        assert box.add(event(2)).seq == 10

    def test_later_welcome_acks_and_never_renumbers(self):
        """Once confirmed, a Welcome is only an ack: resent events keep their numbers."""
        box = Outbox("boot")
        box.welcome(journaled_seq=0)
        for i in range(3):
            box.add(event(i))
        box.welcome(journaled_seq=2)
        assert [e.seq for e in box.after(box.acked_seq)] == [3]

    def test_fresh_collector_does_not_renumber(self):
        """With an empty journal the first Welcome keeps numbering from 1."""
        box = Outbox("boot")
        box.add(event())
        box.welcome(journaled_seq=0)
        assert [e.seq for e in box.after(0)] == [1]

    def test_resume_seq_is_the_first_number_still_held(self):
        """What the Hello declares: the first waiting event, else the next number; everything
        below it was acked (or lost) and is never sent again."""
        box = Outbox("boot")
        assert box.resume_seq == 1
        box.welcome(0)
        for i in range(5):
            box.add(event(i))
        assert box.resume_seq == 1
        box.ack(3)
        assert box.resume_seq == 4
        box.ack(5)
        assert box.resume_seq == 6
        assert [e.seq for e in box.after(box.acked_seq)] == []
