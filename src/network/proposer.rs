//! The one way the node's services write registry requests: admission
//! control (at most `--max-pending-proposals` requests in flight on this
//! node; beyond it `UNAVAILABLE`, "overloaded", at once), batching (rule 17),
//! the cluster-clock stamp (rule 11), the Raft write and its deadline. It
//! decides nothing about a request: that happens when its entry is applied
//! (rule 3).
//!
//! Batching: requests go to one batcher task. It proposes a request at once
//! when fewer than [`BATCHES_IN_FLIGHT`] entries are in flight (so a lone
//! request waits for nothing), and otherwise lets requests gather until an
//! entry completes, then proposes everything gathered — up to
//! [`BATCH_REQUESTS_MAX`] requests and about [`BATCH_BYTES_MAX`] bytes — as
//! one log entry, stamped once. Each request gets its own outcome back. Under
//! load, the costs of an entry (its append, fsyncs, replication and apply
//! call) are paid once per batch instead of once per request.

use super::leader_contact::LeaderContact;
use super::status::{clock_status, outcomes_miscounted, write_status};
use crate::clock::ClusterClock;
use crate::metrics::{self, NodeMetrics};
use crate::raft_types::{Raft, TypeConfig};
use oncekv_core::{Command, Entry, Op, Outcome, Value};
use oncekv_wire::status::{ErrorReason, reason_status};
use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tonic::Status;

/// Entries this node's batcher has in flight at once. Two keep the leader's
/// log busy while the previous entry replicates; more only split the
/// waiting requests into smaller batches (measured with openraft 0.9; with
/// 0.10's pipelined replication not re-tuned yet).
pub const BATCHES_IN_FLIGHT: usize = 2;
/// Most requests in one entry.
pub const BATCH_REQUESTS_MAX: usize = 1_024;
/// A request joins a non-empty batch only if the batch's estimated size stays
/// within this; a single request of any admitted size (at most the client
/// message limit, 8 MiB) still forms a batch of its own. So an entry stays
/// below 8 MiB + 1,024 × 1 KiB of framing (see the size arithmetic in
/// `network::peer`).
pub const BATCH_BYTES_MAX: usize = 4 << 20;

type ServerMetrics = openraft::metrics::RaftServerMetrics<TypeConfig>;

/// What a proposal's caller receives: the request's outcome and the log
/// index of the entry that carried it.
type Answer = Result<(Outcome, u64), Status>;

/// Proposes requests for the client and admin services; clones share one
/// admission budget and one batcher.
#[derive(Clone)]
pub struct Proposer {
    queue: mpsc::UnboundedSender<Proposal>,
    request_timeout: Duration,
    /// One permit per request in flight; the queue above is unbounded only
    /// in type: nothing enters it without a permit.
    admission: Arc<Semaphore>,
    max_pending_proposals: usize,
    metrics: Arc<NodeMetrics>,
    contact: LeaderContact,
    /// The clock that stamps the entries (read by [`Proposer::clock_now_ms`]).
    clock: Arc<ClusterClock>,
}

/// One request waiting for, or riding in, an entry.
struct Proposal {
    op: Op,
    size_bytes: usize,
    reply: oneshot::Sender<Answer>,
    /// Held until the entry carrying the request is answered by Raft or
    /// times out — even if the caller gave up first: a dropped call does not
    /// withdraw its entry from Raft, so it must not make room for another.
    _pending: Pending,
}

/// A request in flight: holds its admission permit and counts itself in the
/// pending-proposals gauge until dropped.
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
    /// A proposer for `raft`; starts its batcher task (it ends when the
    /// last clone of the proposer is dropped).
    pub fn new(
        raft: Raft,
        clock: Arc<ClusterClock>,
        request_timeout: Duration,
        max_pending_proposals: usize,
        metrics: Arc<NodeMetrics>,
        contact: LeaderContact,
    ) -> Proposer {
        metrics.set_max_pending_proposals(max_pending_proposals);
        let (queue, waiting) = mpsc::unbounded_channel();
        let batcher = Batcher {
            raft,
            clock: clock.clone(),
            request_timeout,
            metrics: metrics.clone(),
            contact: contact.clone(),
            in_flight: Arc::new(Semaphore::new(BATCHES_IN_FLIGHT)),
        };
        tokio::spawn(batcher.run(waiting));
        Proposer {
            queue,
            request_timeout,
            admission: Arc::new(Semaphore::new(max_pending_proposals)),
            max_pending_proposals,
            metrics,
            contact,
            clock,
        }
    }

    /// The stamp an entry proposed now would carry, if this node's cluster
    /// clock runs in the current term ([`ClusterClock::now_ms`]).
    pub fn clock_now_ms(&self) -> Option<u64> {
        self.clock.now_ms()
    }

    /// The metrics of the node this proposer serves.
    pub fn metrics(&self) -> &Arc<NodeMetrics> {
        &self.metrics
    }

    /// Whom the node this proposer serves hears as its leader.
    pub fn contact(&self) -> &LeaderContact {
        &self.contact
    }

    /// Proposes `op` and waits, within the request timeout, for the entry
    /// carrying it to be committed and applied; returns its outcome and the
    /// entry's log index.
    ///
    /// Admission: the request needs one of `max_pending_proposals` permits,
    /// taken without waiting — none free means `UNAVAILABLE` (overloaded) at
    /// once, and nothing was proposed. A request whose caller has stopped
    /// waiting before its batch forms is never proposed.
    pub async fn propose(&self, op: Op) -> Answer {
        let Ok(permit) = self.admission.clone().try_acquire_owned() else {
            self.metrics.overloaded.inc();
            return Err(reason_status(ErrorReason::Unavailable(format!(
                "overloaded: {} proposals already pending on this node; retry with backoff",
                self.max_pending_proposals
            ))));
        };
        let (reply, answer) = oneshot::channel();
        let proposal = Proposal {
            size_bytes: op_size_bytes(&op),
            op,
            reply,
            _pending: Pending::new(permit, self.metrics.clone()),
        };
        if self.queue.send(proposal).is_err() {
            return Err(reason_status(ErrorReason::Unavailable(
                "the node is shutting down".into(),
            )));
        }
        match tokio::time::timeout(self.request_timeout, answer).await {
            Ok(Ok(answer)) => answer,
            // The batch task ended without answering (it panicked or the
            // runtime is stopping): the entry may have been proposed, so
            // the outcome is unknown, never a definite failure.
            Ok(Err(_)) => Err(reason_status(ErrorReason::Unavailable(
                "the proposal ended without an answer; the outcome is unknown".into(),
            ))),
            Err(_) => Err(reason_status(ErrorReason::Deadline)),
        }
    }
}

/// The size a request adds to a batch, estimated from its payload: what
/// bounds an entry is the keys and values it carries, plus a fixed
/// allowance for ids and framing.
fn op_size_bytes(op: &Op) -> usize {
    const FRAMING_BYTES: usize = 64;
    let command_bytes = |command: &Command| -> usize {
        let value_bytes = |value: &Value| usize::try_from(value.size_bytes()).unwrap_or(usize::MAX);
        command.key().len()
            + match command {
                Command::Put { value, .. } => value_bytes(value),
                Command::Append { element, .. } => element.len(),
                Command::CompareAndSwap { expected, new, .. } => {
                    expected.as_ref().map_or(0, value_bytes) + value_bytes(new)
                }
                Command::Delete { .. } | Command::Increment { .. } => 0,
            }
    };
    FRAMING_BYTES.saturating_add(match op {
        Op::Execute(execute) => command_bytes(&execute.command) + execute.principal.0.len(),
        Op::ExecutePlain { command, .. } => command_bytes(command),
        Op::ExecuteKeyed {
            key,
            command,
            principal,
            ..
        } => command_bytes(command) + key.0.len() + principal.0.len(),
        Op::ForgetKey { key, principal, .. }
        | Op::ForgetClaim { key, principal, .. }
        | Op::ReleaseClaim { key, principal, .. }
        | Op::ExtendClaim { key, principal, .. } => key.0.len() + principal.0.len(),
        Op::Claim(claim) => claim.key.0.len() + claim.principal.0.len(),
        Op::CompleteClaim {
            key,
            principal,
            result,
            ..
        } => key.0.len() + principal.0.len() + result.len(),
        _ => 0,
    })
}

/// Forms batches from the queued requests and proposes them.
struct Batcher {
    raft: Raft,
    clock: Arc<ClusterClock>,
    request_timeout: Duration,
    metrics: Arc<NodeMetrics>,
    contact: LeaderContact,
    /// One permit per entry in flight.
    in_flight: Arc<Semaphore>,
}

impl Batcher {
    async fn run(self, mut waiting: mpsc::UnboundedReceiver<Proposal>) {
        let mut server = self.raft.server_metrics();
        // A request that did not fit the previous batch opens the next one.
        let mut carried: Option<Proposal> = None;
        loop {
            let first = match carried.take() {
                Some(proposal) => proposal,
                None => match waiting.recv().await {
                    Some(proposal) => proposal,
                    None => return,
                },
            };
            // While every slot is taken, requests gather in the queue. A
            // leader that steps down leaves its pending entries unanswered
            // until they commit or are truncated (openraft), possibly
            // for the whole request timeout: requests must not wait behind
            // them for a slot, so a step-down answers the waiting ones.
            let slot = loop {
                if let Some(status) = not_leading(&server, &self.contact) {
                    break Err(status);
                }
                tokio::select! {
                    slot = self.in_flight.clone().acquire_owned() => match slot {
                        Ok(slot) => break Ok(slot),
                        Err(_) => return,
                    },
                    changed = server.changed() => {
                        if changed.is_err() {
                            return;
                        }
                    }
                }
            };
            let slot = match slot {
                Ok(slot) => slot,
                Err(status) => {
                    answer_all(first, &mut waiting, &status);
                    continue;
                }
            };
            let mut batch = Vec::new();
            let mut batch_bytes = 0usize;
            let mut next = Some(first);
            while let Some(proposal) = next.take() {
                if proposal.reply.is_closed() {
                    // Its caller gave up (deadline) before it was proposed:
                    // reported as unknown, and never proposed at all.
                    next = waiting.try_recv().ok();
                    continue;
                }
                if !batch.is_empty()
                    && (batch.len() >= BATCH_REQUESTS_MAX
                        || batch_bytes.saturating_add(proposal.size_bytes) > BATCH_BYTES_MAX)
                {
                    carried = Some(proposal);
                    break;
                }
                batch_bytes = batch_bytes.saturating_add(proposal.size_bytes);
                batch.push(proposal);
                next = waiting.try_recv().ok();
            }
            if batch.is_empty() {
                continue;
            }
            let raft = self.raft.clone();
            let clock = self.clock.clone();
            let metrics = self.metrics.clone();
            let request_timeout = self.request_timeout;
            let contact = self.contact.clone();
            tokio::spawn(async move {
                propose_batch(raft, clock, request_timeout, &metrics, &contact, batch).await;
                drop(slot);
            });
        }
    }
}

/// `NOT_LEADER` (with the leader's client address when this node hears
/// from one) if this node does not lead now, as openraft's server metrics
/// say. Only a shortcut: the Raft write is what decides, and refusing here
/// proposes nothing.
fn not_leading(
    server: &openraft::type_config::alias::WatchReceiverOf<TypeConfig, ServerMetrics>,
    contact: &LeaderContact,
) -> Option<Status> {
    let metrics = server.borrow_watched();
    if metrics.state == ServerState::Leader {
        return None;
    }
    let leader_id = contact.leader(metrics.state, metrics.current_leader);
    let leader_client_addr = leader_id.and_then(|leader| {
        metrics
            .membership_config
            .membership()
            .get_node(&leader)
            .map(|node| node.client_addr.clone())
    });
    Some(reason_status(ErrorReason::NotLeader {
        leader_id,
        leader_client_addr,
        nothing_proposed: true,
    }))
}

/// Answers `first` and every request queued behind it with `status`,
/// without proposing any.
fn answer_all(first: Proposal, waiting: &mut mpsc::UnboundedReceiver<Proposal>, status: &Status) {
    for proposal in std::iter::once(first).chain(std::iter::from_fn(|| waiting.try_recv().ok())) {
        let _ = proposal.reply.send(Err(status.clone()));
    }
}

/// Proposes one batch as one entry and answers each of its requests.
async fn propose_batch(
    raft: Raft,
    clock: Arc<ClusterClock>,
    request_timeout: Duration,
    metrics: &NodeMetrics,
    contact: &LeaderContact,
    batch: Vec<Proposal>,
) {
    let started = metrics::now();
    let requests = batch.len();
    let (ops, waiters): (Vec<Op>, Vec<_>) = batch
        .into_iter()
        .map(|proposal| (proposal.op, (proposal.reply, proposal._pending)))
        .unzip();
    let write = async {
        let stamp_ms = clock
            .stamp()
            .await
            .map_err(|error| clock_status(error, contact))?;
        let written = raft
            .client_write(Entry {
                stamp_ms,
                ops: ops.into(),
            })
            .await
            .map_err(|error| write_status(error, contact))?;
        Ok::<_, Status>((written.data, written.log_id.index))
    };
    let written = match tokio::time::timeout(request_timeout, write).await {
        Ok(written) => written,
        Err(_) => Err(reason_status(ErrorReason::Deadline)),
    };
    match written {
        Ok((outcomes, log_index)) if outcomes.len() == requests => {
            metrics::observe_since(&metrics.proposal_duration, started);
            metrics.proposal_batch_requests.observe(requests as f64);
            for ((reply, _pending), outcome) in waiters.into_iter().zip(outcomes) {
                // A caller that stopped waiting has nothing left to tell.
                let _ = reply.send(Ok((outcome, log_index)));
            }
        }
        Ok((outcomes, log_index)) => {
            tracing::error!(
                log_index,
                requests,
                outcomes = outcomes.len(),
                "an entry applied with a different number of outcomes than requests"
            );
            let status = outcomes_miscounted();
            for (reply, _pending) in waiters {
                let _ = reply.send(Err(status.clone()));
            }
        }
        Err(status) => {
            for (reply, _pending) in waiters {
                let _ = reply.send(Err(status.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncekv_core::{ClientId, ClusterId, Execute};

    /// A request's estimated size grows with its key and value, so large
    /// requests close a batch early.
    #[test]
    fn size_estimate_counts_payload() {
        let execute = |value: Vec<u8>| {
            Op::Execute(Execute {
                cluster_id: ClusterId(1),
                client_id: ClientId(1),
                seq: 0,
                first_outstanding_seq: 0,
                command: Command::Put {
                    key: b"key".to_vec(),
                    value: Value::Bytes(value),
                },
                principal: oncekv_core::Principal::anonymous(),
            })
        };
        assert_eq!(op_size_bytes(&execute(Vec::new())), 64 + 3);
        assert_eq!(
            op_size_bytes(&execute(vec![0; 1 << 20])),
            64 + 3 + (1 << 20)
        );
    }
}
