//! Seq numbering of one session: assigns seqs, tracks which are still
//! outstanding, and derives the first outstanding seq (the floor the client
//! reports), which stays correct when responses complete out of order. Pure.

use std::collections::BTreeSet;

#[derive(Clone, Debug)]
pub struct Seqs {
    next: u64,
    outstanding: BTreeSet<u64>,
    window: u64,
}

impl Seqs {
    /// Seqs start at 1; `window` is the session's in-flight window.
    pub fn new(window: u64) -> Seqs {
        Seqs {
            next: 1,
            outstanding: BTreeSet::new(),
            window: window.max(1),
        }
    }

    /// The lowest seq whose response has not arrived (nor been given up):
    /// everything below it is acknowledged.
    pub fn first_outstanding(&self) -> u64 {
        self.outstanding.first().copied().unwrap_or(self.next)
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
}
