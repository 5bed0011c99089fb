//! One client's session: its acknowledged floor, its cached responses with
//! their fingerprints, and the bookkeeping of their size. It owns the floor
//! invariant (never moves backwards, nothing cached below it) and nothing
//! else: the order of checks lives in the registry.

use super::types::{CommandResult, Fingerprint, LimitExceeded, Nonce, Principal, Seq};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::Arc;

/// A response cached for one (client id, seq): the command's result, or the
/// refusal of a request that breaks a limit by itself (final, so replayed
/// like a result).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachedResponse {
    pub fingerprint: Fingerprint,
    pub result: Result<CommandResult, LimitExceeded>,
}

impl CachedResponse {
    /// The size charged against `cached_bytes_per_session_max`.
    pub fn cached_size_bytes(&self) -> u64 {
        response_size_bytes(&self.result)
    }
}

/// The size charged for caching `response`.
pub(crate) fn response_size_bytes(response: &Result<CommandResult, LimitExceeded>) -> u64 {
    match response {
        Ok(result) => result.cached_size_bytes(),
        Err(exceeded) => exceeded.cached_size_bytes(),
    }
}

/// The largest capacity an emptied deque keeps (`Responses::remove_below`):
/// the least a deque allocates for responses of this size.
const KEPT_EMPTY_CAPACITY: usize = 4;

/// A session's cached responses in ascending seq order. Seqs mostly arrive
/// in order and leave from the front as the floor rises, so a deque kept
/// sorted serves a lookup by binary search and the common insert and
/// removal at its ends without allocating; behind an `Arc`, a copy of the
/// registry (for a snapshot or a hash) shares it until either side writes;
/// a session that never cached anything holds no allocation, one emptied
/// keeps a small deque to refill.
/// (A persistent ordered map allocated and filled a tree node for every
/// response cached.)
#[derive(Clone, Debug, Default)]
pub(crate) struct Responses(Option<Arc<VecDeque<(Seq, CachedResponse)>>>);

impl PartialEq for Responses {
    fn eq(&self, other: &Responses) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for Responses {}

impl Responses {
    fn deque(&self) -> Option<&VecDeque<(Seq, CachedResponse)>> {
        self.0.as_deref()
    }

    fn deque_mut(&mut self) -> &mut VecDeque<(Seq, CachedResponse)> {
        Arc::make_mut(self.0.get_or_insert_with(Default::default))
    }

    fn position(&self, seq: Seq) -> Option<Result<usize, usize>> {
        self.deque()
            .map(|deque| deque.binary_search_by_key(&seq, |(cached, _)| *cached))
    }

    pub fn get(&self, seq: &Seq) -> Option<&CachedResponse> {
        let index = self.position(*seq)?.ok()?;
        self.deque()?.get(index).map(|(_, response)| response)
    }

    /// The lowest seq cached, with its response.
    pub fn first(&self) -> Option<&(Seq, CachedResponse)> {
        self.deque()?.front()
    }

    /// The highest seq cached, with its response.
    pub fn last(&self) -> Option<&(Seq, CachedResponse)> {
        self.deque()?.back()
    }

    pub fn len(&self) -> usize {
        self.deque().map_or(0, VecDeque::len)
    }

    /// Every (seq, response), in ascending seq order.
    pub fn iter(&self) -> std::collections::vec_deque::Iter<'_, (Seq, CachedResponse)> {
        self.deque().map(VecDeque::iter).unwrap_or_default()
    }

    pub fn values(&self) -> impl Iterator<Item = &CachedResponse> {
        self.iter().map(|(_, response)| response)
    }

    /// Caches `response` for `seq`; returns the one it replaces, if any.
    pub fn insert(&mut self, seq: Seq, response: CachedResponse) -> Option<CachedResponse> {
        match self.position(seq) {
            Some(Ok(index)) => Some(std::mem::replace(&mut self.deque_mut()[index].1, response)),
            Some(Err(index)) => {
                self.deque_mut().insert(index, (seq, response));
                None
            }
            None => {
                self.deque_mut().push_back((seq, response));
                None
            }
        }
    }

    /// Removes every response below `floor`; returns their cached size.
    pub fn remove_below(&mut self, floor: Seq) -> u64 {
        if self.first().is_none_or(|(seq, _)| *seq >= floor) {
            return 0;
        }
        let responses = self.deque_mut();
        let mut removed_bytes = 0;
        while responses.front().is_some_and(|(seq, _)| *seq < floor) {
            if let Some((_, removed)) = responses.pop_front() {
                removed_bytes += removed.cached_size_bytes();
            }
        }
        // A session acknowledging one request at a time empties its deque
        // on every request and refills it at once: a small one is kept for
        // that (two allocations and two frees per request on every node,
        // otherwise); a large one is given back.
        if responses.is_empty() && responses.capacity() > KEPT_EMPTY_CAPACITY {
            self.0 = None;
        }
        removed_bytes
    }

    /// Drops every response (the deliberately broken snapshot build only).
    #[cfg(feature = "broken-snapshot-drops-sessions")]
    pub fn clear(&mut self) {
        self.0 = None;
    }
}

impl FromIterator<(Seq, CachedResponse)> for Responses {
    /// From pairs in ascending seq order (the caller checks the order).
    fn from_iter<I: IntoIterator<Item = (Seq, CachedResponse)>>(pairs: I) -> Responses {
        let deque: VecDeque<_> = pairs.into_iter().collect();
        Responses((!deque.is_empty()).then(|| Arc::new(deque)))
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Session {
    pub nonce: Nonce,
    /// The principal that registered the session: the only one whose
    /// requests it serves (rule 19).
    pub owner: Principal,
    /// The highest seq that has had a response cached (0: none yet). The
    /// floor may be raised at most to this plus the window (rule 7).
    pub highest_seq: Seq,
    /// The first outstanding seq: everything below is acknowledged.
    pub floor: Seq,
    /// Cluster time of the last request, in milliseconds.
    pub last_active_ms: u64,
    pub responses: Responses,
    /// Sum of `cached_size_bytes` over `responses`.
    pub cached_bytes: u64,
    /// The cluster time the registry's idle index files the session under:
    /// at most `last_active_ms` (a request moves only the latter; expiry
    /// refiles a session it finds active since). Bookkeeping of the index,
    /// not state: a replica restored from a snapshot files every session
    /// at its last activity, one that applied the log may file it earlier,
    /// and both decide alike — so it takes no part in equality.
    pub filed_ms: u64,
}

/// Every field but `filed_ms` (see there).
impl PartialEq for Session {
    fn eq(&self, other: &Session) -> bool {
        self.nonce == other.nonce
            && self.owner == other.owner
            && self.highest_seq == other.highest_seq
            && self.floor == other.floor
            && self.last_active_ms == other.last_active_ms
            && self.responses == other.responses
            && self.cached_bytes == other.cached_bytes
    }
}

impl Eq for Session {}

impl Session {
    pub fn new(nonce: Nonce, owner: Principal, now_ms: u64) -> Session {
        Session {
            nonce,
            owner,
            highest_seq: 0,
            floor: 0,
            last_active_ms: now_ms,
            responses: Responses::default(),
            cached_bytes: 0,
            filed_ms: now_ms,
        }
    }

    /// Raises the floor to `first_outstanding_seq` if that is higher, and
    /// drops every cached response below the new floor (rule 7).
    /// The floor never goes down, no cached response is below it, and the
    /// size charged is the sum of the cached responses' sizes.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self
            .responses
            .first()
            .is_some_and(|(seq, _)| *seq < self.floor)
        {
            return Err(format!("a cached response below the floor {}", self.floor));
        }
        if self
            .responses
            .last()
            .is_some_and(|(seq, _)| *seq > self.highest_seq)
        {
            return Err(format!(
                "a cached response above the highest seq {}",
                self.highest_seq
            ));
        }
        let sum: u64 = self
            .responses
            .values()
            .map(CachedResponse::cached_size_bytes)
            .sum();
        if sum != self.cached_bytes {
            return Err(format!(
                "cached bytes {} but responses sum to {sum}",
                self.cached_bytes
            ));
        }
        Ok(())
    }

    pub fn raise_floor(&mut self, first_outstanding_seq: Seq) {
        if first_outstanding_seq <= self.floor {
            return;
        }
        self.floor = first_outstanding_seq;
        self.cached_bytes -= self.responses.remove_below(first_outstanding_seq);
    }

    pub fn cache(
        &mut self,
        seq: Seq,
        fingerprint: Fingerprint,
        result: Result<CommandResult, LimitExceeded>,
    ) {
        debug_assert!(seq >= self.floor, "caching below the floor");
        self.highest_seq = self.highest_seq.max(seq);
        self.cached_bytes += response_size_bytes(&result);
        let previous = self.responses.insert(
            seq,
            CachedResponse {
                fingerprint,
                result,
            },
        );
        debug_assert!(previous.is_none(), "a seq executed twice");
    }

    /// Rebuilds a session from snapshot parts, checking its invariants.
    pub fn restore(
        nonce: Nonce,
        owner: Principal,
        highest_seq: Seq,
        floor: Seq,
        last_active_ms: u64,
        responses: Vec<(Seq, CachedResponse)>,
    ) -> Result<Session, &'static str> {
        if !responses.windows(2).all(|pair| pair[0].0 < pair[1].0) {
            return Err("cached responses out of order");
        }
        if responses.first().is_some_and(|(seq, _)| *seq < floor) {
            return Err("cached response below the floor");
        }
        if responses.last().is_some_and(|(seq, _)| *seq > highest_seq) {
            return Err("cached response above the highest seq");
        }
        let cached_bytes = responses
            .iter()
            .map(|(_, response)| response.cached_size_bytes())
            .sum();
        Ok(Session {
            nonce,
            owner,
            highest_seq,
            floor,
            last_active_ms,
            responses: responses.into_iter().collect(),
            cached_bytes,
            filed_ms: last_active_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(value: i64) -> CachedResponse {
        CachedResponse {
            fingerprint: Fingerprint(value as u128),
            result: Ok(CommandResult::Incremented { value }),
        }
    }

    /// Seqs cached out of order are kept sorted, found by seq, replaced in
    /// place, dropped below a rising floor; an emptied large cache holds no
    /// allocation, and a copy is unaffected by writes to the original.
    #[test]
    fn responses_stay_sorted_and_copies_stay_apart() {
        let mut responses = Responses::default();
        for seq in [5, 2, 9, 7, 3] {
            assert_eq!(responses.insert(seq, response(seq as i64)), None);
        }
        let seqs: Vec<Seq> = responses.iter().map(|(seq, _)| *seq).collect();
        assert_eq!(seqs, vec![2, 3, 5, 7, 9]);
        assert_eq!(responses.get(&7), Some(&response(7)));
        assert_eq!(responses.get(&4), None);
        assert_eq!(responses.insert(7, response(70)), Some(response(7)));
        let copy = responses.clone();
        let size = response(0).cached_size_bytes();
        assert_eq!(responses.remove_below(6), 3 * size);
        assert_eq!(responses.first().map(|(seq, _)| *seq), Some(7));
        assert_eq!(responses.last().map(|(seq, _)| *seq), Some(9));
        assert_eq!(copy.len(), 5, "the copy kept what the original dropped");
        assert_eq!(copy.get(&7), Some(&response(70)));
        assert_eq!(responses.remove_below(6), 0);
        assert_eq!(responses.remove_below(100), 2 * size);
        assert_eq!(responses.len(), 0);
        assert!(responses.0.is_none(), "an empty cache allocates nothing");
        assert_eq!(responses, Responses::default());
        let rebuilt: Responses = copy.iter().cloned().collect();
        assert_eq!(rebuilt, copy);
    }

    /// A session that acknowledges each response before the next (what
    /// every closed-loop client does) reuses one small deque: emptied, it
    /// is kept, equal to an empty cache, and refilled in place.
    #[test]
    fn a_deque_emptied_one_response_at_a_time_is_kept() {
        let mut responses = Responses::default();
        responses.insert(1, response(1));
        let kept = Arc::as_ptr(responses.0.as_ref().unwrap());
        for seq in 2..100 {
            responses.remove_below(seq);
            assert!(responses.0.is_some(), "the emptied deque was dropped");
            assert_eq!(responses.len(), 0);
            assert_eq!(responses.first(), None);
            assert_eq!(responses, Responses::default());
            responses.insert(seq, response(seq as i64));
            assert_eq!(Arc::as_ptr(responses.0.as_ref().unwrap()), kept);
        }
        assert_eq!(responses.get(&99), Some(&response(99)));
    }
}
