//! The one way the node's services write a registry entry: admission
//! control (at most `--max-pending-proposals` proposals in flight on this
//! node; beyond it `UNAVAILABLE`, "overloaded", at once), the cluster-clock
//! stamp (rule 11), the Raft write and its deadline. It decides nothing
//! about the entry: that happens when it is applied (rule 3).

use super::client_api::{clock_status, write_status};
use super::status::{ErrorReason, reason_status};
use crate::clock::ClusterClock;
use crate::metrics::{self, NodeMetrics};
use crate::raft_types::Raft;
use crate::registry::{Entry, Op, Outcome};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;

/// Proposes entries for the client and admin services; clones share one
/// admission budget.
#[derive(Clone)]
pub struct Proposer {
    raft: Raft,
    clock: Arc<ClusterClock>,
    request_timeout: Duration,
    /// One permit per proposal in flight.
    admission: Arc<Semaphore>,
    max_pending_proposals: usize,
    metrics: Arc<NodeMetrics>,
}

/// A proposal in flight: holds its admission permit and counts itself in
/// the pending-proposals gauge until dropped.
struct Pending {
    _permit: OwnedSemaphorePermit,
    metrics: Arc<NodeMetrics>,
}

impl Pending {
    fn new(permit: OwnedSemaphorePermit, metrics: Arc<NodeMetrics>) -> Pending {
        metrics.pending_proposals.inc();
        Pending {
            _permit: permit,
            metrics,
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.metrics.pending_proposals.dec();
    }
}

impl Proposer {
    pub fn new(
        raft: Raft,
        clock: Arc<ClusterClock>,
        request_timeout: Duration,
        max_pending_proposals: usize,
        metrics: Arc<NodeMetrics>,
    ) -> Proposer {
        metrics.set_max_pending_proposals(max_pending_proposals);
        Proposer {
            raft,
            clock,
            request_timeout,
            admission: Arc::new(Semaphore::new(max_pending_proposals)),
            max_pending_proposals,
            metrics,
        }
    }

    /// Proposes `op` stamped by the cluster clock and waits, within the
    /// request timeout, for its entry to be committed and applied; returns
    /// its outcome and log index.
    ///
    /// Admission: the proposal needs one of `max_pending_proposals` permits,
    /// taken without waiting — none free means `UNAVAILABLE` (overloaded)
    /// at once, and nothing was proposed. The proposal then runs in its own
    /// task that keeps the permit until Raft answers or the request timeout
    /// passes, even if the caller gives up first: a dropped call does not
    /// withdraw its entry from Raft, so it must not make room for another.
    pub async fn propose(&self, op: Op) -> Result<(Outcome, u64), Status> {
        let Ok(permit) = self.admission.clone().try_acquire_owned() else {
            self.metrics.overloaded.inc();
            return Err(reason_status(ErrorReason::Unavailable(format!(
                "overloaded: {} proposals already pending on this node; retry with backoff",
                self.max_pending_proposals
            ))));
        };
        let pending = Pending::new(permit, self.metrics.clone());
        let (raft, clock) = (self.raft.clone(), self.clock.clone());
        let work = async move {
            // Moved in explicitly: the slot is held until this proposal
            // ends, whether or not the caller still waits.
            let pending = pending;
            let started = metrics::now();
            let stamp_ms = clock.stamp().await.map_err(clock_status)?;
            let entry = Entry { stamp_ms, op };
            let written = raft.client_write(entry).await.map_err(write_status)?;
            let outcome = written
                .data
                .ok_or_else(|| Status::internal("a registry entry applied without an outcome"))?;
            metrics::observe_since(&pending.metrics.proposal_duration, started);
            Ok((outcome, written.log_id.index))
        };
        let request_timeout = self.request_timeout;
        let task = tokio::spawn(async move {
            tokio::time::timeout(request_timeout, work)
                .await
                .map_err(|_| reason_status(ErrorReason::Deadline))?
        });
        // A task that panicked or was cancelled may have proposed its entry
        // already: the outcome is unknown, never a definite failure.
        task.await.map_err(|error| {
            reason_status(ErrorReason::Unavailable(format!(
                "proposal task failed ({error}); the outcome is unknown"
            )))
        })?
    }
}
