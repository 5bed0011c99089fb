//! The leader's cluster clock (DESIGN.md rule 11, after LogCabin): the
//! millisecond stamp a leader puts on every registry entry it proposes.
//!
//! At the start of each term the leader confirms its leadership and applies
//! every entry before its term (read index), then takes as its base the
//! applied cluster time — the largest stamp in its log — and from there adds
//! only the time it has itself led (since it became leader, idle or not),
//! measured on a monotonic clock. Time
//! without a leader therefore never counts against clients, and a leader
//! whose wall clock is off by hours changes nothing. The state machine keeps
//! the maximum stamp it has seen, so stamps never move time backwards.

use crate::raft_types::{NodeId, NodeInfo, Raft};
use crate::storage::SharedState;
use openraft::error::{CheckIsLeaderError, RaftError};
use std::sync::Mutex;
use tokio::time::Instant;

#[derive(Clone, Copy, Debug)]
struct TermClock {
    term: u64,
    base_ms: u64,
    started: Instant,
}

/// Why no stamp could be given.
#[derive(Debug, thiserror::Error)]
pub enum ClockError {
    #[error("not the leader")]
    NotLeader {
        leader_id: Option<NodeId>,
        leader: Option<NodeInfo>,
    },
    #[error("leadership could not be confirmed: {0}")]
    Unavailable(String),
}

/// Records when this node became leader of `term` (first sighting only).
fn note_leading(since: &Mutex<Option<(u64, Instant)>>, leading: bool, term: u64) {
    let mut since = since.lock().unwrap_or_else(|p| p.into_inner());
    if leading && since.is_none_or(|(seen, _)| seen != term) {
        *since = Some((term, Instant::now()));
    }
}

pub struct ClusterClock {
    raft: Raft,
    state: SharedState,
    current: Mutex<Option<TermClock>>,
    /// (term, instant) at which this node was seen to become leader: the
    /// clock counts leader time from there, not from the term's first
    /// request, so an idle leader's time counts too.
    leading_since: std::sync::Arc<Mutex<Option<(u64, Instant)>>>,
    /// Serialises the start of a term, so one read index serves everyone.
    starting: tokio::sync::Mutex<()>,
}

impl ClusterClock {
    /// A clock for `raft`; must be created inside a tokio runtime (it
    /// watches the metrics for this node becoming leader).
    pub fn new(raft: Raft, state: SharedState) -> ClusterClock {
        let leading_since = std::sync::Arc::new(Mutex::new(None));
        let watched = std::sync::Arc::downgrade(&leading_since);
        let mut metrics = raft.metrics();
        // openraft's full metrics change on nearly every step of its core
        // (indexes move under load); its server metrics only when the role,
        // vote or leader does. The full ones are watched only while this
        // node leads without a quorum acknowledgement yet.
        let mut server = raft.server_metrics();
        tokio::spawn(async move {
            loop {
                server.borrow_and_update();
                let (leading, term, waiting_for_ack) = {
                    let metrics = metrics.borrow_and_update();
                    let leader = metrics.state == openraft::ServerState::Leader;
                    // Leading counts from the first quorum acknowledgement,
                    // not from the server state alone: openraft restores a
                    // restarted ex-leader as leader at once, before any peer
                    // is back, and that time has no leader in fact (rule 11).
                    let acked = metrics.millis_since_quorum_ack.is_some();
                    (leader && acked, metrics.current_term, leader && !acked)
                };
                let Some(since) = watched.upgrade() else {
                    return;
                };
                note_leading(&since, leading, term);
                drop(since);
                let changed = if waiting_for_ack {
                    metrics.changed().await
                } else {
                    server.changed().await
                };
                if changed.is_err() {
                    return;
                }
            }
        });
        ClusterClock {
            raft,
            state,
            current: Mutex::new(None),
            leading_since,
            starting: tokio::sync::Mutex::new(()),
        }
    }

    fn current_for(&self, term: u64) -> Option<u64> {
        let current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        current
            .filter(|clock| clock.term == term)
            .map(|clock| clock.base_ms + clock.started.elapsed().as_millis() as u64)
    }

    /// The stamp for an entry proposed now by this node as leader.
    pub async fn stamp(&self) -> Result<u64, ClockError> {
        let term = self.raft.metrics().borrow().current_term;
        if let Some(stamp) = self.current_for(term) {
            return Ok(stamp);
        }
        let _starting = self.starting.lock().await;
        if let Some(stamp) = self.current_for(term) {
            return Ok(stamp);
        }
        self.raft
            .ensure_linearizable()
            .await
            .map_err(|error| match error {
                RaftError::APIError(CheckIsLeaderError::ForwardToLeader(forward)) => {
                    ClockError::NotLeader {
                        leader_id: forward.leader_id,
                        leader: forward.leader_node,
                    }
                }
                other => ClockError::Unavailable(other.to_string()),
            })?;
        // Everything before this term is applied now: the applied cluster
        // time is the largest stamp in the log.
        let term = self.raft.metrics().borrow().current_term;
        let base_ms = self.state.read().registry.cluster_time_ms();
        let started = self
            .leading_since
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .filter(|(seen, _)| *seen == term)
            .map_or_else(Instant::now, |(_, since)| since);
        tracing::info!(term, base_ms, "cluster clock starts a new term");
        let clock = TermClock {
            term,
            base_ms,
            started,
        };
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(clock);
        Ok(clock.base_ms + started.elapsed().as_millis() as u64)
    }
}
