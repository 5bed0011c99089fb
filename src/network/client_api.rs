//! The client-facing gRPC service: validates requests, stamps them with the
//! cluster clock, proposes them to Raft and maps the applied outcome (or the
//! failure) to the wire. It never decides new / duplicate / conflict itself:
//! that happens only when the committed entry is applied (rule 3). The only
//! early refusals are facts that can never change — malformed input (an
//! empty key included) and a cluster id other than this node's — and
//! admission control, which the
//! shared `Proposer` applies: beyond `--max-pending-proposals` proposals in
//! flight a request is refused at once with `UNAVAILABLE` ("overloaded",
//! this attempt only), so overload never builds an unbounded queue.
//!
//! Rule 3's one shortcut, in one direction only: a claim of a completed key
//! with the same fingerprint, and a keyed request repeated with the same
//! command, are answered from the applied record after a read index —
//! when the core says applying them would answer exactly that and change
//! nothing (`Registry::completed_claim_answer`,
//! `Registry::keyed_duplicate_answer`). Nothing is ever refused or decided
//! new that way; everything else is proposed.

use super::auth::principal_of;
use super::faults::FaultControl;
use super::proposer::Proposer;
use super::status::{check_cluster, read_status, required_cluster};
use crate::metrics::{MethodLabels, NodeMetrics};
use crate::raft_types::{NodeId, Raft};
use crate::read_index::ReadIndex;
use crate::shared::SharedState;
use oncekv_core::{
    Claim, ClientId, Execute, IdempotencyKey, Nonce, Op, Outcome, Registration, Registry,
};
use oncekv_wire::CLIENT_MESSAGE_BYTES_MAX;
use oncekv_wire::convert::{self, cluster_id_bytes};
use oncekv_wire::proto::{self, client_server};
use oncekv_wire::status::{
    ErrorReason, convert_status, invalid, reason_status, rejected, rejected_claim,
};
use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use std::sync::Arc;
use std::time::Duration;
use tonic::{Request, Response, Status};

pub struct ClientApi {
    node_id: NodeId,
    raft: Raft,
    state: SharedState,
    proposer: Proposer,
    /// The linearizable-read barrier.
    read_index: ReadIndex,
    request_timeout: Duration,
    /// Test-only: executes whose replies are dropped (see `FaultControl`).
    faults: FaultControl,
    metrics: Arc<NodeMetrics>,
}

impl ClientApi {
    pub fn new(
        node_id: NodeId,
        raft: Raft,
        state: SharedState,
        proposer: Proposer,
        read_index: ReadIndex,
        request_timeout: Duration,
        faults: FaultControl,
    ) -> ClientApi {
        let metrics = proposer.metrics().clone();
        ClientApi {
            node_id,
            raft,
            state,
            proposer,
            read_index,
            request_timeout,
            faults,
            metrics,
        }
    }

    pub fn into_server(self) -> client_server::ClientServer<ClientApi> {
        client_server::ClientServer::new(self)
            .max_decoding_message_size(CLIENT_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(CLIENT_MESSAGE_BYTES_MAX)
    }

    async fn propose(&self, op: Op) -> Result<(Outcome, u64), Status> {
        self.proposer.propose(op).await
    }

    /// Rule 3's one shortcut: `answer` reads, from an applied state, the
    /// answer the log would give a request while changing nothing (the core
    /// decides which requests have one). When this node's state has it, a
    /// read index confirms this node leads and has applied everything
    /// committed before now, and the answer is read again from that state:
    /// `Ok(Some((answer, applied index)))`, no log entry. `Ok(None)`: no
    /// such answer here, or this node cannot confirm it leads (a follower,
    /// an election) — propose the request. The read index's deadline is
    /// the request's: past it, `DEADLINE_EXCEEDED` (nothing was proposed).
    ///
    /// `answer` is also given the time this node's cluster clock reads now
    /// (the stamp the request's entry would get): a record that has expired
    /// by then has no answer here, so the log expires it (an idle cluster's
    /// applied time stands still). Until the clock runs in this term (its
    /// first entry) every request goes through the log.
    async fn answer_from_applied<T>(
        &self,
        method: &'static str,
        answer: impl Fn(&Registry, u64) -> Option<T>,
    ) -> Result<Option<(T, u64)>, Status> {
        // DELIBERATELY BROKEN builds (`broken-skip-dedup`) must reach the
        // registry with every repeat, or the harness could not catch them.
        if cfg!(feature = "broken-skip-dedup") {
            return Ok(None);
        }
        let Some(now_ms) = self.proposer.clock_now_ms() else {
            return Ok(None);
        };
        if answer(&self.state.read().registry, now_ms).is_none() {
            return Ok(None);
        }
        let confirmed = tokio::time::timeout(self.request_timeout, self.read_index.confirm())
            .await
            .map_err(|_| reason_status(ErrorReason::Deadline))?;
        if confirmed.is_err() {
            return Ok(None);
        }
        let Some(now_ms) = self.proposer.clock_now_ms() else {
            return Ok(None);
        };
        let applied = self.state.read();
        let Some(answer) = answer(&applied.registry, now_ms) else {
            return Ok(None);
        };
        self.metrics
            .answered_from_applied
            .get_or_create(&MethodLabels { method })
            .inc();
        Ok(Some((answer, applied.registry.applied_index())))
    }

    /// Test-only (fault injection): a reply that made a change is dropped,
    /// as if the network lost it; the caller's retry must be answered from
    /// the record.
    async fn maybe_drop_reply(&self, changed: bool, log_index: u64, what: &'static str) {
        if changed && self.faults.take_execute_reply_drop() {
            tracing::warn!(log_index, what, "fault injection: dropping the reply");
            std::future::pending::<()>().await;
        }
    }

    /// The cluster, principal and key of a claim request that names a
    /// fence (complete, release, extend).
    fn fenced_request<T>(
        &self,
        request: &Request<T>,
        cluster_id: &[u8],
        key: Vec<u8>,
    ) -> Result<
        (
            oncekv_core::ClusterId,
            oncekv_core::Principal,
            IdempotencyKey,
        ),
        Status,
    > {
        let principal = principal_of(request);
        let cluster_id = required_cluster(&self.state, cluster_id)?;
        let key = convert::claim_key_from_proto(key).map_err(convert_status)?;
        Ok((cluster_id, principal, key))
    }
}

/// The reply of the three execute RPCs (session, plain, keyed): the result
/// and its duplicate flag, or the rejection as a status.
fn execute_reply(outcome: Outcome, log_index: u64) -> Result<proto::ExecuteReply, Status> {
    match outcome {
        Outcome::Executed { result, duplicate } => Ok(proto::ExecuteReply {
            result: Some(convert::result_to_proto(&result)),
            duplicate,
            log_index,
        }),
        other => Err(rejected(other)),
    }
}

fn parse_nonce(bytes: &[u8]) -> Result<Nonce, Status> {
    let bytes: [u8; 16] = bytes
        .try_into()
        .map_err(|_| invalid("nonce must be 16 bytes"))?;
    Ok(Nonce(u128::from_be_bytes(bytes)))
}

fn registration_reply(registration: Registration) -> proto::RegisterReply {
    proto::RegisterReply {
        cluster_id: cluster_id_bytes(Some(registration.cluster_id)),
        client_id: registration.client_id.0,
        session_ttl_ms: registration.session_ttl_ms,
        window: registration.window,
        duplicate: registration.duplicate,
        limits: Some(convert::request_limits_to_proto(&registration.limits)),
    }
}

#[tonic::async_trait]
impl client_server::Client for ClientApi {
    async fn register(
        &self,
        request: Request<proto::RegisterRequest>,
    ) -> Result<Response<proto::RegisterReply>, Status> {
        let principal = principal_of(&request);
        let request = request.into_inner();
        let cluster_id = check_cluster(&self.state, &request.cluster_id, false)?;
        let nonce = parse_nonce(&request.nonce)?;
        let op = Op::Register {
            cluster_id,
            nonce,
            principal,
        };
        match self.propose(op).await? {
            (Outcome::Registered(registration), log_index) => {
                tracing::info!(
                    client_id = registration.client_id.0,
                    log_index,
                    duplicate = registration.duplicate,
                    "registered"
                );
                Ok(Response::new(registration_reply(registration)))
            }
            (other, _) => Err(rejected(other)),
        }
    }

    async fn execute(
        &self,
        request: Request<proto::ExecuteRequest>,
    ) -> Result<Response<proto::ExecuteReply>, Status> {
        let principal = principal_of(&request);
        let request = request.into_inner();
        let cluster_id = required_cluster(&self.state, &request.cluster_id)?;
        let command = convert::command_from_proto(request.command).map_err(convert_status)?;
        let execute = Execute {
            cluster_id,
            client_id: ClientId(request.client_id),
            seq: request.seq,
            first_outstanding_seq: request.first_outstanding_seq,
            command,
            principal,
        };
        let (outcome, log_index) = self.propose(Op::Execute(execute)).await?;
        tracing::debug!(
            client_id = request.client_id,
            seq = request.seq,
            log_index,
            ?outcome,
            "executed"
        );
        let reply = execute_reply(outcome, log_index)?;
        if !reply.duplicate && self.faults.take_execute_reply_drop() {
            tracing::warn!(
                client_id = request.client_id,
                seq = request.seq,
                log_index,
                "fault injection: dropping the reply"
            );
            std::future::pending::<()>().await;
        }
        Ok(Response::new(reply))
    }

    async fn execute_plain(
        &self,
        request: Request<proto::ExecutePlainRequest>,
    ) -> Result<Response<proto::ExecuteReply>, Status> {
        let request = request.into_inner();
        let cluster_id = required_cluster(&self.state, &request.cluster_id)?;
        let command = convert::command_from_proto(request.command).map_err(convert_status)?;
        let (outcome, log_index) = self
            .propose(Op::ExecutePlain {
                cluster_id,
                command,
            })
            .await?;
        Ok(Response::new(execute_reply(outcome, log_index)?))
    }

    async fn execute_keyed(
        &self,
        request: Request<proto::ExecuteKeyedRequest>,
    ) -> Result<Response<proto::ExecuteReply>, Status> {
        // The key's namespace: whoever the auth layer says is calling.
        let principal = principal_of(&request);
        let request = request.into_inner();
        let cluster_id = required_cluster(&self.state, &request.cluster_id)?;
        let key =
            convert::idempotency_key_from_proto(request.idempotency_key).map_err(convert_status)?;
        let command = convert::command_from_proto(request.command).map_err(convert_status)?;
        // A key record in the record store is read from it (under the state
        // lock, as the registry's own changes are).
        let records = self.state.records().cloned();
        let answered = self
            .answer_from_applied("execute_keyed", |registry, now_ms| {
                registry.keyed_duplicate_answer_with(
                    cluster_id,
                    &key,
                    &command,
                    &principal,
                    now_ms,
                    |id| records.as_ref()?.get(id).ok().flatten(),
                )
            })
            .await?;
        if let Some((outcome, applied_index)) = answered {
            return Ok(Response::new(execute_reply(outcome, applied_index)?));
        }
        let op = Op::ExecuteKeyed {
            cluster_id,
            key,
            command,
            principal,
        };
        let (outcome, log_index) = self.propose(op).await?;
        tracing::debug!(log_index, ?outcome, "executed keyed");
        let reply = execute_reply(outcome, log_index)?;
        if !reply.duplicate && self.faults.take_execute_reply_drop() {
            tracing::warn!(log_index, "fault injection: dropping the keyed reply");
            std::future::pending::<()>().await;
        }
        Ok(Response::new(reply))
    }

    async fn claim(
        &self,
        request: Request<proto::ClaimRequest>,
    ) -> Result<Response<proto::ClaimReply>, Status> {
        let principal = principal_of(&request);
        let request = request.into_inner();
        let cluster_id = required_cluster(&self.state, &request.cluster_id)?;
        let claim = Claim {
            cluster_id,
            principal,
            key: convert::claim_key_from_proto(request.key).map_err(convert_status)?,
            fingerprint: convert::claim_fingerprint_from_proto(&request.fingerprint)
                .map_err(convert_status)?,
            lease_ms: request.lease_ms,
            claim_id: convert::claim_id_from_proto(&request.claim_id).map_err(convert_status)?,
        };
        let records = self.state.records().cloned();
        let answered = self
            .answer_from_applied("claim", |registry, now_ms| {
                // A finished claim may lie in the record store (rules
                // version 3): read there only when the registry says so.
                registry.completed_claim_answer_with(&claim, now_ms, |id| {
                    records.as_ref()?.get_claim(id).ok().flatten()
                })
            })
            .await?;
        if let Some((answer, applied_index)) = answered {
            return Ok(Response::new(convert::claim_answer_to_proto(
                &answer,
                applied_index,
            )));
        }
        match self.propose(Op::Claim(claim)).await? {
            (Outcome::Claimed(answer), log_index) => {
                let won = matches!(
                    answer,
                    oncekv_core::ClaimAnswer::Won {
                        duplicate: false,
                        ..
                    }
                );
                self.maybe_drop_reply(won, log_index, "claim").await;
                Ok(Response::new(convert::claim_answer_to_proto(
                    &answer, log_index,
                )))
            }
            (other, _) => Err(rejected_claim(other, None)),
        }
    }

    async fn complete_claim(
        &self,
        request: Request<proto::CompleteClaimRequest>,
    ) -> Result<Response<proto::CompleteClaimReply>, Status> {
        let (cluster_id, principal, key) = {
            let inner = request.get_ref();
            self.fenced_request(&request, &inner.cluster_id, inner.key.clone())?
        };
        let request = request.into_inner();
        let fence = request.fence;
        let result = convert::claim_result_from_proto(request.result).map_err(convert_status)?;
        let op = Op::CompleteClaim {
            cluster_id,
            principal,
            key,
            fence,
            result,
        };
        match self.propose(op).await? {
            (
                Outcome::ClaimCompleted {
                    completed_ms,
                    duplicate,
                    ..
                },
                log_index,
            ) => {
                self.maybe_drop_reply(!duplicate, log_index, "complete claim")
                    .await;
                Ok(Response::new(proto::CompleteClaimReply {
                    completed_ms,
                    duplicate,
                    log_index,
                }))
            }
            (other, _) => Err(rejected_claim(other, Some(fence))),
        }
    }

    async fn release_claim(
        &self,
        request: Request<proto::ReleaseClaimRequest>,
    ) -> Result<Response<proto::ReleaseClaimReply>, Status> {
        let (cluster_id, principal, key) = {
            let inner = request.get_ref();
            self.fenced_request(&request, &inner.cluster_id, inner.key.clone())?
        };
        let fence = request.get_ref().fence;
        let op = Op::ReleaseClaim {
            cluster_id,
            principal,
            key,
            fence,
        };
        match self.propose(op).await? {
            (Outcome::ClaimReleased { duplicate }, log_index) => {
                self.maybe_drop_reply(!duplicate, log_index, "release claim")
                    .await;
                Ok(Response::new(proto::ReleaseClaimReply {
                    duplicate,
                    log_index,
                }))
            }
            (other, _) => Err(rejected_claim(other, Some(fence))),
        }
    }

    async fn extend_claim(
        &self,
        request: Request<proto::ExtendClaimRequest>,
    ) -> Result<Response<proto::ExtendClaimReply>, Status> {
        let (cluster_id, principal, key) = {
            let inner = request.get_ref();
            self.fenced_request(&request, &inner.cluster_id, inner.key.clone())?
        };
        let fence = request.get_ref().fence;
        let op = Op::ExtendClaim {
            cluster_id,
            principal,
            key,
            fence,
            lease_ms: request.get_ref().lease_ms,
        };
        match self.propose(op).await? {
            (
                Outcome::ClaimExtended {
                    lease_deadline_ms,
                    cluster_time_ms,
                },
                log_index,
            ) => Ok(Response::new(proto::ExtendClaimReply {
                lease_deadline_ms,
                cluster_time_ms,
                lease_ms_left: lease_deadline_ms.saturating_sub(cluster_time_ms),
                log_index,
            })),
            (other, _) => Err(rejected_claim(other, Some(fence))),
        }
    }

    async fn keep_alive(
        &self,
        request: Request<proto::KeepAliveRequest>,
    ) -> Result<Response<proto::KeepAliveReply>, Status> {
        let principal = principal_of(&request);
        let request = request.into_inner();
        let cluster_id = required_cluster(&self.state, &request.cluster_id)?;
        let op = Op::KeepAlive {
            cluster_id,
            client_id: ClientId(request.client_id),
            first_outstanding_seq: request.first_outstanding_seq,
            principal,
        };
        match self.propose(op).await? {
            (
                Outcome::KeptAlive {
                    floor,
                    session_ttl_ms,
                    limits,
                },
                _,
            ) => Ok(Response::new(proto::KeepAliveReply {
                floor,
                session_ttl_ms,
                limits: Some(convert::request_limits_to_proto(&limits)),
            })),
            (other, _) => Err(rejected(other)),
        }
    }

    async fn unregister(
        &self,
        request: Request<proto::UnregisterRequest>,
    ) -> Result<Response<proto::UnregisterReply>, Status> {
        let principal = principal_of(&request);
        let request = request.into_inner();
        let cluster_id = required_cluster(&self.state, &request.cluster_id)?;
        let op = Op::Unregister {
            cluster_id,
            client_id: ClientId(request.client_id),
            principal: Some(principal),
        };
        match self.propose(op).await? {
            (Outcome::Unregistered, _) => Ok(Response::new(proto::UnregisterReply {})),
            (other, _) => Err(rejected(other)),
        }
    }

    async fn read(
        &self,
        request: Request<proto::ReadRequest>,
    ) -> Result<Response<proto::ReadReply>, Status> {
        let request = request.into_inner();
        required_cluster(&self.state, &request.cluster_id)?;
        convert::check_key(&request.key).map_err(convert_status)?;
        // DELIBERATELY BROKEN when built with `broken-stale-reads` (a
        // fault-injection build for the jepsen-like harness only, to prove
        // its checker catches stale reads): no read index, so any node — a
        // follower, a deposed leader — answers from its own applied state.
        #[cfg(feature = "broken-stale-reads")]
        if true {
            let applied = self.state.read();
            let value = applied.registry.get(&request.key);
            return Ok(Response::new(proto::ReadReply {
                value: value.map(convert::value_to_proto),
                applied_index: applied.registry.applied_index(),
            }));
        }
        let confirmed = tokio::time::timeout(self.request_timeout, self.read_index.confirm())
            .await
            .map_err(|_| reason_status(ErrorReason::Deadline))?;
        confirmed.map_err(|error| read_status(error, self.proposer.contact()))?;
        let applied = self.state.read();
        Ok(Response::new(proto::ReadReply {
            value: applied
                .registry
                .get(&request.key)
                .map(convert::value_to_proto),
            applied_index: applied.registry.applied_index(),
        }))
    }

    async fn status(
        &self,
        _request: Request<proto::StatusRequest>,
    ) -> Result<Response<proto::StatusReply>, Status> {
        let metrics = self.raft.metrics().borrow_watched().clone();
        let role = match metrics.state {
            ServerState::Leader => "leader",
            ServerState::Follower => "follower",
            ServerState::Candidate => "candidate",
            ServerState::Learner => "learner",
            ServerState::Shutdown => "shutdown",
        };
        let membership = metrics.membership_config.membership();
        let members = super::admin_api::members_to_proto(membership);
        // Raft's leader only while this node hears from it (a follower cut
        // off from the others keeps its vote for a leader that may be gone).
        let leader_id = self.proposer.contact().leader_of(&metrics);
        let leader_client_addr = leader_id
            .and_then(|leader| membership.get_node(&leader))
            .map(|node| node.client_addr.clone())
            .unwrap_or_default();
        // The newest hash and its index, never one computed for this call:
        // Status is open, and hashing encodes the whole state.
        let hashed = self.state.latest_hash();
        let registry = self.state.registry();
        Ok(Response::new(proto::StatusReply {
            node_id: self.node_id,
            role: role.into(),
            term: metrics.current_term,
            leader_id: leader_id.unwrap_or(0),
            leader_client_addr,
            last_log_index: metrics.last_log_index.unwrap_or(0),
            applied_index: registry.applied_index(),
            snapshot_index: metrics.snapshot.map_or(0, |id| id.index),
            purged_index: metrics.purged.map_or(0, |id| id.index),
            cluster_id: cluster_id_bytes(registry.cluster_id()),
            members,
            state_hash: hashed
                .as_ref()
                .map(|hashed| hashed.hash.clone())
                .unwrap_or_default(),
            cluster_time_ms: registry.cluster_time_ms(),
            sessions: registry.session_count() as u64,
            idempotency_keys: registry.key_count() as u64,
            state_hash_index: hashed.map_or(0, |hashed| hashed.applied_index),
        }))
    }
}
