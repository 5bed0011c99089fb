//! Whom this node hears as its leader, and since when: the leader it names
//! in `Status`, in `NOT_LEADER` hints, in its health check and in its
//! `oncekv_raft_leader_id` gauge.
//!
//! With pre-vote on, a follower cut off from the others never raises its
//! term, so Raft keeps its vote for the leader it last followed, and
//! openraft's `current_leader` names that leader for as long as the node is
//! cut off: a dead leader, forever. This module names a follower's leader
//! only while it hears from it: the peer service records each append
//! (heartbeats are appends) and each snapshot's head that arrives under a
//! committed vote, and a leader unheard for longer than the window (twice
//! the largest election timeout, by which time this node would itself
//! have stood for election) is named by nobody. A leader names itself as
//! Raft does.
//!
//! The catch-up watch (`node::catch_up`) reads it too: whether an append
//! arrived between two of its looks ([`LeaderContact::heard_mark`]).
//!
//! It owns one clock reading and one node id; it must not decide anything
//! Raft decides (who leads, whom to vote for): it only words what this
//! node reports.

use crate::raft_types::{NodeId, TypeConfig};
use openraft::{RaftMetrics, ServerState};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// Shared by the peer service (which records) and the services that name
/// a leader (which read). Cheap to clone.
#[derive(Clone, Debug)]
pub struct LeaderContact {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The origin of `heard_at_ms`.
    base: Instant,
    /// Milliseconds after `base`, plus one, of the last append from a
    /// leader; 0 before any.
    heard_at_ms: AtomicU64,
    /// The node that sent it.
    heard_from: AtomicU64,
    window: Duration,
}

impl LeaderContact {
    /// A contact that names a follower's leader while it was heard from
    /// within `window`.
    pub fn new(window: Duration) -> LeaderContact {
        LeaderContact {
            inner: Arc::new(Inner {
                base: Instant::now(),
                heard_at_ms: AtomicU64::new(0),
                heard_from: AtomicU64::new(0),
                window,
            }),
        }
    }

    /// The window for a node whose election timeout is at most
    /// `election_timeout_max`.
    pub fn window_for(election_timeout_max: Duration) -> Duration {
        election_timeout_max.saturating_mul(2)
    }

    /// An append (entries or a heartbeat) from `leader` under a committed
    /// vote arrived now.
    pub fn heard_from(&self, leader: NodeId) {
        self.heard_from_at(leader, Instant::now());
    }

    fn heard_from_at(&self, leader: NodeId, now: Instant) {
        let ms = now.saturating_duration_since(self.inner.base).as_millis();
        let ms = u64::try_from(ms).unwrap_or(u64::MAX - 1) + 1;
        // Two stores, not one: a reader between them may pair the previous
        // time with the new sender, and two appends recorded at once (the
        // heartbeat and replication streams run apart) one's sender with
        // the other's time — both times are "now". `leader_at` names only
        // the leader Raft names, so at worst an append of a stale leader,
        // recorded before Raft refuses it, makes the node name nobody until
        // the real leader's next heartbeat.
        self.inner.heard_from.store(leader, Ordering::Relaxed);
        self.inner.heard_at_ms.store(ms, Ordering::Release);
    }

    /// A mark that changes each time an append from a leader is heard (to
    /// the millisecond): two equal marks mean nothing was heard between.
    pub fn heard_mark(&self) -> u64 {
        self.inner.heard_at_ms.load(Ordering::Acquire)
    }

    /// The leader this node names: itself while Raft says it leads,
    /// otherwise Raft's `current_leader` only if it was heard from within
    /// the window.
    pub fn leader(&self, state: ServerState, current_leader: Option<NodeId>) -> Option<NodeId> {
        self.leader_at(state, current_leader, Instant::now())
    }

    /// `leader` if this node heard from it within the window (the rule for
    /// a follower): for a leader openraft names in an error.
    pub fn heard(&self, leader: Option<NodeId>) -> Option<NodeId> {
        self.leader(ServerState::Follower, leader)
    }

    /// [`LeaderContact::leader`] of what Raft's metrics say.
    pub fn leader_of(&self, metrics: &RaftMetrics<TypeConfig>) -> Option<NodeId> {
        self.leader(metrics.state, metrics.current_leader)
    }

    fn leader_at(
        &self,
        state: ServerState,
        current_leader: Option<NodeId>,
        now: Instant,
    ) -> Option<NodeId> {
        if state == ServerState::Leader {
            return current_leader;
        }
        let leader = current_leader?;
        let heard_at_ms = self.inner.heard_at_ms.load(Ordering::Acquire);
        if heard_at_ms == 0 || self.inner.heard_from.load(Ordering::Relaxed) != leader {
            return None;
        }
        let heard_at = self.inner.base + Duration::from_millis(heard_at_ms - 1);
        (now.saturating_duration_since(heard_at) <= self.inner.window).then_some(leader)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_follower_names_its_leader_only_while_it_hears_from_it() {
        let contact = LeaderContact::new(Duration::from_millis(500));
        let start = Instant::now();
        let follower = |at: Duration, raft_says: Option<NodeId>| {
            contact.leader_at(ServerState::Follower, raft_says, start + at)
        };
        // Raft's vote names node 2, but nothing was heard yet (a restart).
        assert_eq!(follower(Duration::ZERO, Some(2)), None);
        contact.heard_from_at(2, start + Duration::from_millis(100));
        assert_eq!(follower(Duration::from_millis(100), Some(2)), Some(2));
        // (Times are kept to the millisecond, so no closer to the edge.)
        assert_eq!(follower(Duration::from_millis(598), Some(2)), Some(2));
        // Silent for longer than the window: nobody.
        assert_eq!(follower(Duration::from_millis(602), Some(2)), None);
        // Heard again.
        contact.heard_from_at(2, start + Duration::from_millis(900));
        assert_eq!(follower(Duration::from_millis(1000), Some(2)), Some(2));
        // Raft follows another leader now; what was heard came from the old one.
        assert_eq!(follower(Duration::from_millis(1000), Some(3)), None);
        // Raft names no leader: neither does the contact.
        assert_eq!(follower(Duration::from_millis(1000), None), None);
        // A candidate is no different.
        assert_eq!(
            contact.leader_at(
                ServerState::Candidate,
                Some(2),
                start + Duration::from_millis(1000)
            ),
            Some(2)
        );
        // A leader names itself whatever it heard.
        assert_eq!(
            contact.leader_at(
                ServerState::Leader,
                Some(1),
                start + Duration::from_secs(60)
            ),
            Some(1)
        );
    }
}
