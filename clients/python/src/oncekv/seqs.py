"""Seq numbering of one session, as the Rust library's `seqs.rs`: assigns
seqs, tracks which are outstanding, and derives the first outstanding seq
(the floor the client reports), correct when responses complete out of
order. It keeps the floor within what the cluster accepts (rule 7): never
more than a window past the last floor the cluster confirmed, however many
requests end unknown while it is out of reach. Pure and not thread-safe:
the session guards it with its lock.
"""

from __future__ import annotations

from typing import Optional


class Seqs:
    def __init__(self, window: int):
        self.next = 1
        self.outstanding: set = set()
        self.window = max(int(window), 1)
        # A floor the cluster's bound is known to be at or above, minus the
        # window: the largest floor it acknowledged and one past the highest
        # seq it answered. 1 for a new session.
        self.confirmed = 1

    def natural_floor(self) -> int:
        """The lowest seq neither answered nor given up."""
        return min(self.outstanding) if self.outstanding else self.next

    def first_outstanding(self) -> int:
        """The floor to send: the natural floor, but never more than a window
        past the confirmed one (beyond it the cluster refuses the floor for
        good, and every later request of the session with it)."""
        return min(self.natural_floor(), self.confirmed + self.window)

    def fence_pending(self) -> bool:
        """Whether seqs given up wait for a fence the cluster has not yet
        confirmed room for."""
        return self.first_outstanding() < self.natural_floor()

    def try_begin(self) -> Optional[int]:
        """The next seq if it fits in the window (seq < floor + window), so
        the server never has to answer TOO_MANY_OUTSTANDING."""
        if self.next >= self.first_outstanding() + self.window:
            return None
        seq = self.next
        self.next += 1
        self.outstanding.add(seq)
        return seq

    def finish(self, seq: int) -> bool:
        """Marks `seq` answered or given up; returns whether the floor moved."""
        before = self.first_outstanding()
        self.outstanding.discard(seq)
        return self.first_outstanding() != before

    def confirm(self, floor: int) -> bool:
        """The cluster acknowledged a floor of at least `floor` (or answered
        a seq below it); returns whether the floor to send moved."""
        before = self.first_outstanding()
        self.confirmed = max(self.confirmed, floor)
        return self.first_outstanding() != before

    def in_flight(self) -> int:
        return len(self.outstanding)
