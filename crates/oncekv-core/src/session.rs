//! One client's session: its acknowledged floor, its cached responses with
//! their fingerprints, and the bookkeeping of their size. It owns the floor
//! invariant (never moves backwards, nothing cached below it) and nothing
//! else: the order of checks lives in the registry.

use super::types::{CommandResult, Fingerprint, LimitExceeded, Nonce, Principal, Seq};
use imbl::OrdMap;
use serde::{Deserialize, Serialize};

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

#[derive(Clone, Debug, PartialEq, Eq)]
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
    pub responses: OrdMap<Seq, CachedResponse>,
    /// Sum of `cached_size_bytes` over `responses`.
    pub cached_bytes: u64,
}

impl Session {
    pub fn new(nonce: Nonce, owner: Principal, now_ms: u64) -> Session {
        Session {
            nonce,
            owner,
            highest_seq: 0,
            floor: 0,
            last_active_ms: now_ms,
            responses: OrdMap::new(),
            cached_bytes: 0,
        }
    }

    /// Raises the floor to `first_outstanding_seq` if that is higher, and
    /// drops every cached response below the new floor (rule 7).
    /// The floor never goes down, no cached response is below it, and the
    /// size charged is the sum of the cached responses' sizes.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self
            .responses
            .get_min()
            .is_some_and(|(seq, _)| *seq < self.floor)
        {
            return Err(format!("a cached response below the floor {}", self.floor));
        }
        if self
            .responses
            .get_max()
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
        // Usually only a few responses fall below the new floor: pop them
        // one by one rather than splitting the map (which allocates).
        while let Some(&(seq, _)) = self.responses.get_min() {
            if seq >= first_outstanding_seq {
                break;
            }
            if let Some(removed) = self.responses.remove(&seq) {
                self.cached_bytes -= removed.cached_size_bytes();
            }
        }
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
        })
    }
}
