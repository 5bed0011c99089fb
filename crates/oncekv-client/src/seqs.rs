//! Seq numbering of one session: assigns seqs, tracks which are still
//! outstanding, and derives the first outstanding seq (the floor the client
//! reports), which stays correct when responses complete out of order. It
//! also keeps the floor within what the cluster accepts (rule 7): never
//! more than a window past the last floor the cluster confirmed, however
//! many requests end unknown while it is out of reach. Pure: it sends
//! nothing and decides nothing about outcomes.

use std::collections::BTreeSet;

#[derive(Clone, Debug)]
pub struct Seqs {
    next: u64,
    outstanding: BTreeSet<u64>,
    window: u64,
    /// A seq the cluster's floor bound is known to be at or above, minus
    /// the window: the largest floor it acknowledged and one past the
    /// highest seq it answered (the bound is one past the highest seq the
    /// session has had applied, or its floor if higher, plus the window).
    /// 1 for a new session (nothing applied, floor 0).
    confirmed: u64,
}

impl Seqs {
    /// Seqs start at 1; `window` is the session's in-flight window.
    pub fn new(window: u64) -> Seqs {
        Seqs {
            next: 1,
            outstanding: BTreeSet::new(),
            window: window.max(1),
            confirmed: 1,
        }
    }

    /// The lowest seq whose response has not arrived (nor been given up):
    /// everything below it is acknowledged or given up.
    fn natural_floor(&self) -> u64 {
        self.outstanding.first().copied().unwrap_or(self.next)
    }

    /// The floor to send: the lowest seq whose response has not arrived
    /// (nor been given up), but never more than a window past the confirmed
    /// floor — beyond that the cluster refuses it (`FloorBeyondBound`,
    /// final), and every later request of the session with it. Seqs given
    /// up above the floor sent wait for their fence until the cluster
    /// confirms a higher floor ([`Seqs::confirm`]).
    pub fn first_outstanding(&self) -> u64 {
        self.natural_floor()
            .min(self.confirmed.saturating_add(self.window))
    }

    /// Whether some seqs given up are not yet below the floor sent, held
    /// back by the confirmed floor: a keep-alive the cluster acknowledges
    /// lets the floor (and the window) move on.
    pub fn fence_pending(&self) -> bool {
        self.first_outstanding() < self.natural_floor()
    }

    /// Takes the next seq if it fits in the window (seq < floor + window),
    /// so the server never has to answer `TOO_MANY_OUTSTANDING`.
    pub fn try_begin(&mut self) -> Option<u64> {
        if self.next >= self.first_outstanding().saturating_add(self.window) {
            return None;
        }
        let seq = self.next;
        self.next += 1;
        self.outstanding.insert(seq);
        Some(seq)
    }

    /// Marks `seq` finished: answered, or given up (fenced). Returns whether
    /// the floor moved.
    pub fn finish(&mut self, seq: u64) -> bool {
        let before = self.first_outstanding();
        self.outstanding.remove(&seq);
        self.first_outstanding() != before
    }

    /// The cluster acknowledged a floor of at least `floor`, or answered a
    /// seq below `floor` (its response cached): the floor bound is at least
    /// `floor` plus the window. Returns whether the floor to send moved.
    pub fn confirm(&mut self, floor: u64) -> bool {
        let before = self.first_outstanding();
        self.confirmed = self.confirmed.max(floor);
        self.first_outstanding() != before
    }

    pub fn in_flight(&self) -> usize {
        self.outstanding.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The floor follows the lowest unanswered seq, whatever the order in
    /// which responses arrive.
    #[test]
    fn floor_under_out_of_order_completion() {
        let mut seqs = Seqs::new(16);
        let taken: Vec<u64> = (0..5).map(|_| seqs.try_begin().unwrap()).collect();
        assert_eq!(taken, [1, 2, 3, 4, 5]);
        assert_eq!(seqs.first_outstanding(), 1);
        assert!(!seqs.finish(3));
        assert!(!seqs.finish(5));
        assert_eq!(seqs.first_outstanding(), 1);
        assert!(seqs.finish(1));
        assert_eq!(seqs.first_outstanding(), 2);
        assert!(seqs.finish(2));
        assert_eq!(seqs.first_outstanding(), 4);
        assert!(seqs.finish(4));
        assert_eq!(seqs.first_outstanding(), 6, "all answered: the next seq");
        assert_eq!(seqs.in_flight(), 0);
    }

    /// No seq at or beyond floor + window is handed out.
    #[test]
    fn window_bounds_new_seqs() {
        let mut seqs = Seqs::new(3);
        assert_eq!(seqs.try_begin(), Some(1));
        assert_eq!(seqs.try_begin(), Some(2));
        assert_eq!(seqs.try_begin(), Some(3));
        assert_eq!(seqs.try_begin(), None);
        seqs.finish(3);
        assert_eq!(seqs.try_begin(), None, "seq 4 >= floor 1 + window 3");
        seqs.finish(1);
        assert_eq!(seqs.try_begin(), Some(4));
        assert_eq!(seqs.try_begin(), None);
    }

    /// Requests given up one after another while nothing is confirmed (an
    /// outage) never take the floor more than a window past the confirmed
    /// floor — the cluster's bound for a session that had nothing applied
    /// is 1 + window — and then no new seq is handed out; once the cluster
    /// confirms the floor sent, the floor and the window move on, a window
    /// at a time, until every given-up seq is below it.
    #[test]
    fn floor_stays_within_a_window_of_the_confirmed_floor() {
        let window = 2;
        let mut seqs = Seqs::new(window);
        let mut given_up = Vec::new();
        while let Some(seq) = seqs.try_begin() {
            seqs.finish(seq);
            given_up.push(seq);
            assert!(
                seqs.first_outstanding() <= 1 + window,
                "floor {} beyond the bound {}",
                seqs.first_outstanding(),
                1 + window
            );
        }
        assert_eq!(given_up, [1, 2, 3, 4], "two windows, then no room");
        assert_eq!(seqs.first_outstanding(), 3);
        assert!(seqs.fence_pending());
        // The keep-alive carrying floor 3 is acknowledged.
        assert!(seqs.confirm(3));
        assert_eq!(seqs.first_outstanding(), 5, "everything given up fenced");
        assert!(!seqs.fence_pending());
        assert_eq!(seqs.try_begin(), Some(5));
        // An answered seq confirms one past it; an old confirmation does
        // not move anything back.
        assert!(!seqs.confirm(6), "seq 5 still holds the floor");
        assert!(seqs.finish(5));
        assert_eq!(seqs.first_outstanding(), 6);
        assert!(!seqs.confirm(2));
        assert_eq!(seqs.first_outstanding(), 6);
    }
}
