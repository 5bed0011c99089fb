//! A node's Prometheus metrics: the one registry of every `oncekv_*`
//! metric with its help text, the handles the other layers count with, the
//! refresh of gauges read from Raft and the applied state at scrape time, and
//! the text encoding. It owns no server (see `node::observability`) and the
//! registry core never sees it: outcomes are counted by the storage adapter
//! where entries are applied, wire-level refusals by the network adapter.
//!
//! Every metric is documented in docs/operating.md ("Metrics and dashboard").

use crate::raft_types::{NodeId, TypeConfig};
use crate::shared::StateHashAt;
use oncekv_core::{ClaimAnswer, Entry, Limit, Op, Outcome, Registry, Rejection};
use openraft::{RaftMetrics, ServerState};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Unit;
use std::time::Instant;

/// The `Content-Type` of [`NodeMetrics::encode`]'s output.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Registry outcome of one applied entry, by operation.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub op: &'static str,
    pub outcome: &'static str,
}

/// One client gRPC reply, by method and result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReplyLabels {
    pub method: &'static str,
    pub result: &'static str,
}

/// A request answered from the applied state without a log entry, by
/// method.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    pub method: &'static str,
}

/// One claim event applied, by kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClaimEventLabels {
    pub event: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateHashLabels {
    hash: String,
    applied_index: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    node_id: String,
}

/// Every metric of a node. Cloning a handle shares the metric.
#[derive(Debug)]
pub struct NodeMetrics {
    registry: prometheus_client::registry::Registry,
    // Counted where entries are applied (the same on every replica).
    pub registry_outcomes: Family<OutcomeLabels, Counter>,
    pub sessions_expired: Counter,
    pub idempotency_keys_expired: Counter,
    pub claim_events: Family<ClaimEventLabels, Counter>,
    pub apply_batch_duration: Histogram,
    pub entries_applied: Counter,
    pub snapshots_built: Counter,
    pub snapshots_installed: Counter,
    pub snapshot_extensions_installed: Counter,
    // Counted at the client API of this node.
    pub client_replies: Family<ReplyLabels, Counter>,
    pub answered_from_applied: Family<MethodLabels, Counter>,
    pub overloaded: Counter,
    pub pending_proposals: Gauge,
    pub proposal_duration: Histogram,
    pub proposal_batch_requests: Histogram,
    // Counted by the Raft watcher.
    pub term_changes: Counter,
    pub became_leader: Counter,
    // Set by the catch-up watch (node::catch_up).
    pub catching_up: Gauge,
    pub catch_ups: Counter,
    pub catch_ups_starved: Counter,
    // Set by the log store.
    pub commit_index: Gauge,
    // Refreshed at scrape time.
    sessions_live: Gauge,
    idempotency_keys_live: Gauge,
    idempotency_keys_cached_bytes: Gauge,
    idempotency_keys_in_memory: Gauge,
    record_store_disk_bytes: Gauge,
    claims_live: Gauge,
    claims_held: Gauge,
    claim_records_in_memory: Gauge,
    cached_responses: Gauge,
    cached_bytes: Gauge,
    term: Gauge,
    leader_id: Gauge,
    is_leader: Gauge,
    applied_index: Gauge,
    last_log_index: Gauge,
    snapshot_index: Gauge,
    purged_index: Gauge,
    state_hash_info: Family<StateHashLabels, Gauge>,
    state_hash_prefix: Gauge,
    state_hashes: Counter,
    max_pending_proposals: Gauge,
    process_resident_memory: Gauge,
    process_open_fds: Gauge,
    process_threads: Gauge,
    process_start_time: Gauge,
}

impl Default for NodeMetrics {
    /// Metrics of no particular node (unit tests, a state machine opened
    /// outside a node); `new` names the node.
    fn default() -> NodeMetrics {
        NodeMetrics::new(0)
    }
}

/// Latency buckets: 100 µs doubling to about 6.5 s.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 17))
}

impl NodeMetrics {
    /// Every metric of node `node_id`, registered under `oncekv_` in the
    /// order of the exposition: the applied state, the client path, Raft,
    /// snapshots and the state hash, then the build and the process.
    pub fn new(node_id: NodeId) -> NodeMetrics {
        let mut metrics = NodeMetrics {
            registry: prometheus_client::registry::Registry::with_prefix("oncekv"),
            registry_outcomes: Family::default(),
            sessions_expired: Counter::default(),
            idempotency_keys_expired: Counter::default(),
            claim_events: Family::default(),
            apply_batch_duration: latency_histogram(),
            entries_applied: Counter::default(),
            snapshots_built: Counter::default(),
            snapshots_installed: Counter::default(),
            snapshot_extensions_installed: Counter::default(),
            client_replies: Family::default(),
            answered_from_applied: Family::default(),
            overloaded: Counter::default(),
            pending_proposals: Gauge::default(),
            proposal_duration: latency_histogram(),
            proposal_batch_requests: Histogram::new(exponential_buckets(1.0, 2.0, 11)),
            term_changes: Counter::default(),
            became_leader: Counter::default(),
            catching_up: Gauge::default(),
            catch_ups: Counter::default(),
            catch_ups_starved: Counter::default(),
            commit_index: Gauge::default(),
            sessions_live: Gauge::default(),
            idempotency_keys_live: Gauge::default(),
            idempotency_keys_cached_bytes: Gauge::default(),
            idempotency_keys_in_memory: Gauge::default(),
            record_store_disk_bytes: Gauge::default(),
            claims_live: Gauge::default(),
            claims_held: Gauge::default(),
            claim_records_in_memory: Gauge::default(),
            cached_responses: Gauge::default(),
            cached_bytes: Gauge::default(),
            term: Gauge::default(),
            leader_id: Gauge::default(),
            is_leader: Gauge::default(),
            applied_index: Gauge::default(),
            last_log_index: Gauge::default(),
            snapshot_index: Gauge::default(),
            purged_index: Gauge::default(),
            state_hash_info: Family::default(),
            state_hash_prefix: Gauge::default(),
            state_hashes: Counter::default(),
            max_pending_proposals: Gauge::default(),
            process_resident_memory: Gauge::default(),
            process_open_fds: Gauge::default(),
            process_threads: Gauge::default(),
            process_start_time: Gauge::default(),
        };
        metrics.register_applied();
        metrics.register_client_path();
        metrics.register_raft();
        metrics.register_snapshots_and_hash();
        metrics.register_build_and_process(node_id);
        metrics
    }

    /// What is counted where entries are applied, and sized from the
    /// applied state: outcomes, expiries, live sessions and keys, cached
    /// responses, apply work.
    fn register_applied(&mut self) {
        self.registry.register(
            "registry_outcomes",
            "Registry entries applied on this replica, by operation (register, execute, execute_plain, execute_keyed, keep_alive, unregister, forget_key, set_config, bootstrap) and outcome (applied, duplicate, conflict, discarded, expired, wrong_cluster, rejected_by_limit, limit_exceeded, too_many_outstanding, invalid, permission_denied, not_bootstrapped); the same on every replica at the same applied index. For execute_keyed: applied (executed), duplicate (answered from the key's record), conflict (KEY_CONFLICT), rejected_by_limit (a capacity limit), limit_exceeded (a limit the request breaks)",
            self.registry_outcomes.clone(),
        );
        self.registry.register(
            "sessions_expired",
            "Sessions removed for idleness (TTL in cluster time) on this replica",
            self.sessions_expired.clone(),
        );
        self.registry.register(
            "idempotency_keys_expired",
            "Idempotency keys removed because their TTL passed (cluster time) on this replica",
            self.idempotency_keys_expired.clone(),
        );
        self.registry.register(
            "idempotency_keys_live",
            "Live idempotency keys in the applied state, all principals",
            self.idempotency_keys_live.clone(),
        );
        self.registry.register_with_unit(
            "idempotency_keys_cached",
            "Size of the idempotency key records as idempotency_cached_bytes_max counts it",
            Unit::Bytes,
            self.idempotency_keys_cached_bytes.clone(),
        );
        self.registry.register(
            "idempotency_keys_in_memory",
            "Idempotency key records (and removals) held in memory: those changed since the last snapshot build, which moves them into the record store (all of them after a restart or an install, until the next build)",
            self.idempotency_keys_in_memory.clone(),
        );
        self.registry.register_with_unit(
            "record_store_disk",
            "Bytes on disk of the record store (state/) holding the idempotency key records",
            Unit::Bytes,
            self.record_store_disk_bytes.clone(),
        );
        self.registry.register(
            "claim_events",
            "Claim requests applied on this replica, by event: won (a first holder), taken_over (a holder after an earlier one, whose lease ran out or who released), in_progress (answered with another holder's live lease), replayed (answered with the recorded result), completed, released, fenced (a complete, extend or release of a fence that no longer holds the key: FENCED), conflict (KEY_CONFLICT)",
            self.claim_events.clone(),
        );
        self.registry.register(
            "claims_live",
            "Live claim records in the applied state (held, released or completed), all principals",
            self.claims_live.clone(),
        );
        self.registry.register(
            "claims_held",
            "Claim records whose key is held now (their lease may have run out without a takeover yet)",
            self.claims_held.clone(),
        );
        self.registry.register(
            "claim_records_in_memory",
            "Claim records (and removals) held in memory: every held claim, and the finished ones changed since the last snapshot build, which moves them into the record store (rules version 3; below it every claim is in memory)",
            self.claim_records_in_memory.clone(),
        );
        self.registry.register(
            "sessions_live",
            "Live sessions in the applied state",
            self.sessions_live.clone(),
        );
        self.registry.register(
            "cached_responses",
            "Responses cached for retries, all sessions",
            self.cached_responses.clone(),
        );
        self.registry.register_with_unit(
            "cached_responses",
            "Size of the cached responses as the registry limits count it, all sessions",
            Unit::Bytes,
            self.cached_bytes.clone(),
        );
        self.registry.register(
            "entries_applied",
            "Log entries applied to the state machine (blank and membership entries included)",
            self.entries_applied.clone(),
        );
        self.registry.register_with_unit(
            "apply_batch_duration",
            "Time the state machine takes to apply one batch of committed entries",
            Unit::Seconds,
            self.apply_batch_duration.clone(),
        );
    }

    /// The client path of this node: proposals (their time and batching),
    /// replies, admission control.
    fn register_client_path(&mut self) {
        self.registry.register_with_unit(
            "proposal_duration",
            "Time from proposing a client request on this node to its applied outcome (commit and apply), successful proposals only",
            Unit::Seconds,
            self.proposal_duration.clone(),
        );
        self.registry.register(
            "proposal_batch_requests",
            "Requests carried by each log entry this node proposed and saw applied (rule 17: requests that arrive while earlier entries are in flight share one entry)",
            self.proposal_batch_requests.clone(),
        );
        self.registry.register(
            "client_replies",
            "Replies of the client gRPC API of this node, by method and result (ok, or the error reason: not_leader, unavailable, deadline, too_many_outstanding, resource_exhausted, session_expired, wrong_cluster, seq_conflict, response_discarded, invalid_argument, limit_exceeded, permission_denied, unauthenticated, other)",
            self.client_replies.clone(),
        );
        self.registry.register(
            "answered_from_applied",
            "Client requests this node answered from its applied state after a read index, without a log entry (rule 3's one shortcut), by method: claim (a completed key claimed again with the same fingerprint), execute_keyed (a key repeated with the same command)",
            self.answered_from_applied.clone(),
        );
        self.registry.register(
            "overloaded",
            "Client requests refused with UNAVAILABLE because --max-pending-proposals proposals were already pending",
            self.overloaded.clone(),
        );
        self.registry.register(
            "pending_proposals",
            "Client proposals this node has handed to Raft and not yet seen answered (or timed out)",
            self.pending_proposals.clone(),
        );
        self.registry.register(
            "max_pending_proposals",
            "The --max-pending-proposals bound of admission control",
            self.max_pending_proposals.clone(),
        );
    }

    /// Raft as this node sees it: term, leader, elections and log indexes.
    fn register_raft(&mut self) {
        self.registry
            .register("raft_term", "Current Raft term", self.term.clone());
        self.registry.register(
            "raft_leader_id",
            "Node id of the leader this node knows, 0 when none",
            self.leader_id.clone(),
        );
        self.registry.register(
            "raft_is_leader",
            "1 when this node is the leader, else 0",
            self.is_leader.clone(),
        );
        self.registry.register(
            "raft_term_changes",
            "Term changes this node has seen (each is an election somewhere in the cluster)",
            self.term_changes.clone(),
        );
        self.registry.register(
            "raft_became_leader",
            "Times this node became leader",
            self.became_leader.clone(),
        );
        self.registry.register(
            "catching_up",
            "1 while this node catches up (a snapshot arriving, or far behind the cluster's commit), else 0",
            self.catching_up.clone(),
        );
        self.registry.register(
            "catch_ups",
            "Times this node started catching up",
            self.catch_ups.clone(),
        );
        self.registry.register(
            "catch_ups_starved",
            "Catch-ups that starved (the leader unheard, or a look of the node's own late, for a second or four heartbeats; or the node standing for election): the node's priority, if it could lower it, restored for the rest of the catch-up",
            self.catch_ups_starved.clone(),
        );
        self.registry.register(
            "raft_commit_index",
            "Highest log index this node knows to be committed",
            self.commit_index.clone(),
        );
        self.registry.register(
            "raft_applied_index",
            "Log index of the last entry applied to the state machine",
            self.applied_index.clone(),
        );
        self.registry.register(
            "raft_last_log_index",
            "Index of the last entry in this node's log",
            self.last_log_index.clone(),
        );
        self.registry.register(
            "raft_snapshot_index",
            "Log index covered by this node's current snapshot",
            self.snapshot_index.clone(),
        );
        self.registry.register(
            "raft_purged_index",
            "Log index up to which this node's log is purged",
            self.purged_index.clone(),
        );
    }

    /// Snapshots built and installed, and the state hash replicas compare.
    fn register_snapshots_and_hash(&mut self) {
        self.registry.register(
            "snapshots_built",
            "Snapshots this node built from its own state",
            self.snapshots_built.clone(),
        );
        self.registry.register(
            "snapshots_installed",
            "Snapshots this node installed from a leader",
            self.snapshots_installed.clone(),
        );
        self.registry.register(
            "snapshot_extensions_installed",
            "Of the snapshots installed, those received as an extension of this node's own durable snapshot (only the records added since it sent)",
            self.snapshot_extensions_installed.clone(),
        );
        self.registry.register(
            "state_hash_info",
            "The newest state hash (hex BLAKE3 of the canonical state) and the applied index it was computed at, as labels; value 1",
            self.state_hash_info.clone(),
        );
        self.registry.register(
            "state_hash_prefix",
            "First 48 bits of the newest state hash as a number: equal on replicas whose hashes are of equal applied indexes",
            self.state_hash_prefix.clone(),
        );
        self.registry.register(
            "state_hashes",
            "State hashes this node computed (in the background at most once a second, plus Admin.StateHash)",
            self.state_hashes.clone(),
        );
    }

    /// Build information and the node process (memory, descriptors,
    /// threads, and its start time, read from the wall clock once, here).
    fn register_build_and_process(&mut self, node_id: NodeId) {
        self.registry.register(
            "build",
            "Build information: crate version and node id",
            Info::new(BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
                node_id: node_id.to_string(),
            }),
        );
        self.registry.register_with_unit(
            "process_resident_memory",
            "Resident memory of the node process (Linux /proc; 0 elsewhere)",
            Unit::Bytes,
            self.process_resident_memory.clone(),
        );
        self.registry.register(
            "process_open_fds",
            "Open file descriptors of the node process (Linux /proc; 0 elsewhere)",
            self.process_open_fds.clone(),
        );
        self.registry.register(
            "process_threads",
            "Threads of the node process (Linux /proc; 0 elsewhere)",
            self.process_threads.clone(),
        );
        self.registry.register_with_unit(
            "process_start_time",
            "Start time of the node process, Unix time",
            Unit::Seconds,
            self.process_start_time.clone(),
        );
        #[allow(clippy::disallowed_methods)] // wall clock for an operator, not the registry
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        self.process_start_time.set(saturating_i64(started));
    }

    pub fn set_max_pending_proposals(&self, bound: usize) {
        self.max_pending_proposals
            .set(i64::try_from(bound).unwrap_or(i64::MAX));
    }

    /// Counts the outcome of one registry entry applied at this replica, and
    /// the sessions and idempotency keys it expired (`before` → `after`:
    /// (sessions, keys) counts around the entry).
    pub fn count_applied(
        &self,
        entry: &Entry,
        outcomes: &[Outcome],
        before: (usize, usize),
        after: (usize, usize),
    ) {
        let (sessions_before, keys_before) = before;
        let (sessions_after, keys_after) = after;
        let (mut keys_made, mut keys_forgotten) = (0usize, 0usize);
        for (op, outcome) in entry.ops.iter().zip(outcomes) {
            match (op, outcome) {
                (Op::ExecuteKeyed { .. }, outcome) if makes_key_record(outcome) => keys_made += 1,
                (_, Outcome::KeyForgotten { existed: true }) => keys_forgotten += 1,
                _ => {}
            }
        }
        let keys_expired = (keys_before + keys_made).saturating_sub(keys_forgotten + keys_after);
        if keys_expired > 0 {
            self.idempotency_keys_expired.inc_by(keys_expired as u64);
        }
        let (mut registered, mut unregistered) = (0usize, 0usize);
        for (op, outcome) in entry.ops.iter().zip(outcomes) {
            if let Some(event) = claim_event(op, outcome) {
                self.claim_events
                    .get_or_create(&ClaimEventLabels { event })
                    .inc();
            }
            self.registry_outcomes
                .get_or_create(&OutcomeLabels {
                    op: op_label(op),
                    outcome: outcome_label(outcome),
                })
                .inc();
            match outcome {
                Outcome::Registered(registration) if !registration.duplicate => registered += 1,
                Outcome::Unregistered => unregistered += 1,
                _ => {}
            }
        }
        // Whatever left the registry and was not this entry's own doing
        // expired: before + registered - unregistered - after.
        let expired = (sessions_before + registered).saturating_sub(unregistered + sessions_after);
        if expired > 0 {
            self.sessions_expired.inc_by(expired as u64);
        }
    }

    /// Sets the record store's size on disk (scrape time).
    pub fn set_record_store_disk_bytes(&self, bytes: u64) {
        self.record_store_disk_bytes.set(saturating_i64(bytes));
    }

    /// Sets every scrape-time gauge from Raft's metrics, the applied state
    /// (one pass over its sessions), the newest state hash (`None` before
    /// the first; see `SharedState::latest_hash`) and how many hashes the
    /// node has computed.
    pub fn refresh(
        &self,
        raft: &RaftMetrics<TypeConfig>,
        registry: &Registry,
        hash: Option<&StateHashAt>,
        hashes_computed: u64,
    ) {
        self.term.set(saturating_i64(raft.current_term));
        self.leader_id
            .set(saturating_i64(raft.current_leader.unwrap_or(0)));
        self.is_leader
            .set(i64::from(raft.state == ServerState::Leader));
        self.last_log_index
            .set(saturating_i64(raft.last_log_index.unwrap_or(0)));
        self.snapshot_index
            .set(saturating_i64(raft.snapshot.map_or(0, |id| id.index)));
        self.purged_index
            .set(saturating_i64(raft.purged.map_or(0, |id| id.index)));
        let applied_index = registry.applied_index();
        self.applied_index.set(saturating_i64(applied_index));
        let (mut sessions, mut responses, mut bytes) = (0u64, 0u64, 0u64);
        for session in registry.sessions() {
            sessions += 1;
            responses += session.cached_responses;
            bytes += session.cached_bytes;
        }
        self.sessions_live.set(saturating_i64(sessions));
        self.idempotency_keys_live
            .set(saturating_i64(registry.key_count() as u64));
        self.idempotency_keys_cached_bytes
            .set(saturating_i64(registry.keyed_cached_bytes()));
        self.idempotency_keys_in_memory
            .set(saturating_i64(registry.key_records_held() as u64));
        self.claims_live
            .set(saturating_i64(registry.claim_count() as u64));
        self.claims_held.set(saturating_i64(registry.claims_held()));
        self.claim_records_in_memory
            .set(saturating_i64(registry.claim_records_in_memory() as u64));
        self.cached_responses.set(saturating_i64(responses));
        self.cached_bytes.set(saturating_i64(bytes));
        self.state_hash_info.clear();
        if let Some(hash) = hash {
            self.state_hash_info
                .get_or_create(&StateHashLabels {
                    hash: hash.hash.clone(),
                    applied_index: hash.applied_index.to_string(),
                })
                .set(1);
            self.state_hash_prefix.set(hash_prefix(&hash.hash));
        }
        // A counter that only follows the state's own count.
        self.state_hashes
            .inc_by(hashes_computed.saturating_sub(self.state_hashes.get()));
        self.refresh_process();
    }

    fn refresh_process(&self) {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|value| value.parse::<i64>().ok())
                .unwrap_or(0)
        };
        self.process_resident_memory
            .set(field("VmRSS:").saturating_mul(1024));
        self.process_threads.set(field("Threads:"));
        let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |dir| dir.count());
        self.process_open_fds
            .set(i64::try_from(fds).unwrap_or(i64::MAX));
    }

    /// The Prometheus text exposition (format 0.0.4) of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry);
        text
    }
}

/// Observes `started.elapsed()` into `histogram`, in seconds.
pub fn observe_since(histogram: &Histogram, started: Instant) {
    histogram.observe(started.elapsed().as_secs_f64());
}

/// A monotonic instant for latency metrics (never seen by the registry).
pub fn now() -> Instant {
    #[allow(clippy::disallowed_methods)] // latency measurement, outside the registry
    Instant::now()
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The first 48 bits (12 hex digits) of a hex hash, as a number; 0 for
/// anything else.
pub fn hash_prefix(hex: &str) -> i64 {
    hex.get(..12)
        .and_then(|prefix| i64::from_str_radix(prefix, 16).ok())
        .unwrap_or(0)
}

/// Whether a keyed request's outcome made a record of its key: a first
/// execution, or a refusal of a limit the command broke (cached as the
/// key's answer) — not a key too long, which is refused without a record.
fn makes_key_record(outcome: &Outcome) -> bool {
    match outcome {
        Outcome::Executed { duplicate, .. } => !duplicate,
        Outcome::Rejected(Rejection::LimitExceeded {
            exceeded,
            duplicate,
        }) => !duplicate && exceeded.limit != Limit::IdempotencyKeyBytes,
        _ => false,
    }
}

/// The claim event an applied claim request was, if any.
fn claim_event(op: &Op, outcome: &Outcome) -> Option<&'static str> {
    let claim_op = matches!(
        op,
        Op::Claim(_) | Op::CompleteClaim { .. } | Op::ReleaseClaim { .. } | Op::ExtendClaim { .. }
    );
    if !claim_op {
        return None;
    }
    Some(match outcome {
        Outcome::Claimed(ClaimAnswer::Won {
            duplicate: false,
            attempt: 1,
            ..
        }) => "won",
        Outcome::Claimed(ClaimAnswer::Won {
            duplicate: false, ..
        }) => "taken_over",
        Outcome::Claimed(ClaimAnswer::InProgress { .. }) => "in_progress",
        Outcome::Claimed(ClaimAnswer::Completed { .. }) => "replayed",
        Outcome::ClaimCompleted {
            duplicate: false, ..
        } => "completed",
        Outcome::ClaimReleased { duplicate: false } => "released",
        Outcome::Rejected(Rejection::Fenced { .. }) => "fenced",
        Outcome::Rejected(Rejection::KeyConflict) => "conflict",
        _ => return None,
    })
}

/// The `op` label of a registry entry.
pub fn op_label(op: &Op) -> &'static str {
    match op {
        Op::Bootstrap { .. } | Op::BootstrapWithRules { .. } => "bootstrap",
        Op::Register { .. } => "register",
        Op::Execute(_) => "execute",
        Op::KeepAlive { .. } => "keep_alive",
        Op::Unregister { .. } => "unregister",
        Op::SetConfig { .. } | Op::PatchConfig { .. } => "set_config",
        Op::ExecutePlain { .. } => "execute_plain",
        Op::ExecuteKeyed { .. } => "execute_keyed",
        Op::ForgetKey { .. } => "forget_key",
        Op::PatchConfigs { .. } | Op::PatchAllConfigs { .. } => "set_config",
        Op::Claim(_) => "claim",
        Op::CompleteClaim { .. } => "complete_claim",
        Op::ReleaseClaim { .. } => "release_claim",
        Op::ExtendClaim { .. } => "extend_claim",
        Op::ForgetClaim { .. } => "forget_claim",
        Op::RaiseRules { .. } => "set_config",
    }
}

/// The `outcome` label of an applied entry's outcome.
pub fn outcome_label(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Bootstrapped { already: true, .. } => "duplicate",
        Outcome::Registered(registration) if registration.duplicate => "duplicate",
        Outcome::Executed {
            duplicate: true, ..
        }
        | Outcome::Rejected(Rejection::LimitExceeded {
            duplicate: true, ..
        })
        | Outcome::Claimed(ClaimAnswer::Won {
            duplicate: true, ..
        })
        | Outcome::Claimed(ClaimAnswer::Completed { .. })
        | Outcome::ClaimCompleted {
            duplicate: true, ..
        }
        | Outcome::ClaimReleased { duplicate: true } => "duplicate",
        Outcome::Claimed(ClaimAnswer::InProgress { .. }) => "in_progress",
        Outcome::Bootstrapped { .. }
        | Outcome::Registered(_)
        | Outcome::Executed { .. }
        | Outcome::KeptAlive { .. }
        | Outcome::Unregistered
        | Outcome::ConfigSet(_)
        | Outcome::ConfigsSet { .. }
        | Outcome::KeyForgotten { .. }
        | Outcome::Claimed(ClaimAnswer::Won { .. })
        | Outcome::ClaimCompleted { .. }
        | Outcome::ClaimReleased { .. }
        | Outcome::ClaimExtended { .. }
        | Outcome::ClaimForgotten { .. }
        | Outcome::AllConfigsSet { .. } => "applied",
        Outcome::Rejected(rejection) => match rejection {
            Rejection::SessionExpired => "expired",
            Rejection::WrongCluster { .. } => "wrong_cluster",
            Rejection::SeqConflict | Rejection::KeyConflict => "conflict",
            Rejection::ResponseDiscarded { .. } => "discarded",
            Rejection::TooManyOutstanding { .. } => "too_many_outstanding",
            Rejection::ResourceExhausted(_) => "rejected_by_limit",
            Rejection::LimitExceeded { .. } => "limit_exceeded",
            Rejection::InvalidArgument(_) => "invalid",
            Rejection::PermissionDenied => "permission_denied",
            Rejection::NotBootstrapped => "not_bootstrapped",
            Rejection::Fenced { .. } => "fenced",
        },
    }
}

/// Names of every metric family the node exports, as they appear in the
/// exposition (`# TYPE` lines), plus the `_bucket` / `_sum` / `_count`
/// series of histograms and the `_total` of counters.
pub fn exported_series_names(exposition: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for line in exposition.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("#") || words.next() != Some("TYPE") {
            continue;
        }
        let (Some(name), Some(kind)) = (words.next(), words.next()) else {
            continue;
        };
        names.insert(name.to_string());
        if kind == "histogram" {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{name}{suffix}"));
            }
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every metric is exported with the `oncekv_` prefix, help text and
    /// units last; counters end in `_total`.
    #[test]
    fn exposition_names_and_help() {
        let metrics = NodeMetrics::new(3);
        metrics
            .registry_outcomes
            .get_or_create(&OutcomeLabels {
                op: "execute",
                outcome: "applied",
            })
            .inc();
        let registry = oncekv_core::Registry::new();
        let hash = StateHashAt {
            applied_index: 0,
            cluster_time_ms: 0,
            hash: oncekv_core::snapshot::state_hash(&registry).to_string(),
        };
        metrics.refresh(&RaftMetrics::new_initial(3), &registry, Some(&hash), 1);
        let text = metrics.encode();
        let names = exported_series_names(&text);
        for name in &names {
            assert!(name.starts_with("oncekv_"), "{name}");
        }
        for expected in [
            "oncekv_registry_outcomes_total",
            "oncekv_cached_responses_bytes",
            "oncekv_proposal_duration_seconds_bucket",
            "oncekv_state_hash_prefix",
            "oncekv_state_hashes_total",
            "oncekv_build_info",
        ] {
            assert!(names.contains(expected), "{expected} missing from\n{text}");
        }
        assert!(
            text.contains("oncekv_registry_outcomes_total{op=\"execute\",outcome=\"applied\"} 1")
        );
        assert!(text.contains("oncekv_raft_applied_index 0"));
        for line in text.lines().filter(|line| line.starts_with("# TYPE")) {
            let name = line.split_whitespace().nth(2).unwrap();
            assert!(
                text.contains(&format!("# HELP {name} ")),
                "{name} has no help"
            );
        }
    }

    /// Keyed outcomes are counted by op and outcome, and keys that left
    /// by their TTL (not by an operator's forget, nor keys never recorded)
    /// as expired.
    #[test]
    fn keyed_outcomes_and_expiries_are_counted() {
        use oncekv_core::{
            ClusterId, Command, ConfigPatch, IdempotencyKey, KeyedConfigPatch, Principal,
            RegistryConfig,
        };
        let cluster_id = ClusterId(7);
        let metrics = NodeMetrics::new(1);
        let mut registry = Registry::new();
        let mut index = 0;
        let mut apply = |stamp_ms, op| {
            index += 1;
            let entry = Entry::single(stamp_ms, op);
            let counts = |registry: &Registry| (registry.session_count(), registry.key_count());
            let before = counts(&registry);
            let outcomes = registry.apply(index, &entry);
            metrics.count_applied(&entry, &outcomes, before, counts(&registry));
        };
        let keyed = |key: &str, delta| Op::ExecuteKeyed {
            cluster_id,
            key: IdempotencyKey(key.as_bytes().to_vec()),
            command: Command::Increment {
                key: b"n".to_vec(),
                delta,
            },
            principal: Principal::anonymous(),
        };
        apply(
            0,
            Op::Bootstrap {
                cluster_id,
                config: RegistryConfig::default(),
            },
        );
        apply(
            0,
            Op::PatchConfigs {
                cluster_id,
                patch: ConfigPatch::default(),
                keyed: KeyedConfigPatch {
                    idempotency_key_ttl_ms: Some(1_000),
                    ..KeyedConfigPatch::default()
                },
            },
        );
        apply(10, keyed("a", 1));
        apply(10, keyed("a", 1));
        apply(10, keyed("a", 2));
        apply(10, keyed(&"x".repeat(300), 1));
        apply(10, keyed("b", 1));
        apply(10, keyed("c", 1));
        apply(
            10,
            Op::ForgetKey {
                cluster_id,
                principal: Principal::anonymous(),
                key: IdempotencyKey(b"c".to_vec()),
            },
        );
        apply(5_000, keyed("d", 1));
        let count = |outcome| {
            metrics
                .registry_outcomes
                .get_or_create(&OutcomeLabels {
                    op: "execute_keyed",
                    outcome,
                })
                .get()
        };
        assert_eq!(count("applied"), 4);
        assert_eq!(count("duplicate"), 1);
        assert_eq!(count("conflict"), 1);
        assert_eq!(count("limit_exceeded"), 1);
        assert_eq!(metrics.idempotency_keys_expired.get(), 2, "a and b");
    }

    #[test]
    fn hash_prefix_is_48_bits() {
        assert_eq!(hash_prefix("ffffffffffff00"), (1 << 48) - 1);
        assert_eq!(hash_prefix("0000000000010"), 1);
        assert_eq!(hash_prefix("xyz"), 0);
    }
}
