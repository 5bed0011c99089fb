//! The Admin gRPC service for operators, served on the client port next to
//! `Client`: membership changes (through openraft's membership API), session
//! inspection and expiry, the replicated registry config, snapshots, state
//! hashes and local reads for replica checks, and test-only faults.
//!
//! It decides nothing the registry decides: an expiry is an `Unregister` log
//! entry, forgetting an idempotency key a `ForgetKey` entry and a config
//! change a `PatchConfigs` entry, stamped by the cluster
//! clock and applied on every replica at the same index (rules 11 and 12).
//! Reads answer from this node's applied state without a read index. The
//! only early refusals are facts that cannot change: malformed input, a
//! wrong cluster id, a membership change the leader's current membership
//! rules out, and not being the leader.

use super::faults::FaultControl;
use super::proposer::Proposer;
use super::status::{faults_not_built, membership_status, not_leader, required_cluster};
use crate::raft_types::{NodeId, NodeInfo, Raft, is_host_port, same_addr};
use crate::shared::SharedState;
use oncekv_core::{ClientId, Op, Outcome, RulesVersion};
use oncekv_wire::CLIENT_MESSAGE_BYTES_MAX;
use oncekv_wire::convert;
use oncekv_wire::proto::{self, admin_server};
use oncekv_wire::status::{ErrorReason, convert_status, invalid, reason_status, rejected};
use openraft::async_runtime::WatchReceiver;
use openraft::{ChangeMembers, Membership, ServerState};
use std::collections::BTreeSet;
use std::time::Duration;
use tonic::{Request, Response, Status};

/// How long a membership change (two log entries with joint consensus) may
/// take before the caller is told its outcome is unknown.
const MEMBERSHIP_CHANGE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default wait for a new learner to catch up (`AddLearnerRequest.timeout_ms`).
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `ChangeVoters` waits for a learner it promotes to have caught
/// up with the leader's log: half the CLI's default deadline, so that its
/// refusal arrives rather than the caller's own timeout.
const PROMOTE_CATCH_UP_TIMEOUT: Duration = Duration::from_secs(5);
/// How long `TriggerSnapshot` waits for the snapshot to be durable.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(60);
/// `ListSessions` page size: default and largest.
const SESSIONS_PAGE_DEFAULT: usize = 100;
const SESSIONS_PAGE_MAX: usize = 1_000;
/// `ListKeys` page size: default and largest.
const KEYS_PAGE_DEFAULT: usize = 100;
const KEYS_PAGE_MAX: usize = 1_000;

pub struct AdminApi {
    node_id: NodeId,
    raft: Raft,
    state: SharedState,
    /// The client service's proposer: admin entries are stamped and
    /// admitted like client entries.
    proposer: Proposer,
    faults: FaultControl,
}

impl AdminApi {
    pub fn new(
        node_id: NodeId,
        raft: Raft,
        state: SharedState,
        proposer: Proposer,
        faults: FaultControl,
    ) -> AdminApi {
        AdminApi {
            node_id,
            raft,
            state,
            proposer,
            faults,
        }
    }

    pub fn into_server(self) -> admin_server::AdminServer<AdminApi> {
        admin_server::AdminServer::new(self)
            .max_decoding_message_size(CLIENT_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(CLIENT_MESSAGE_BYTES_MAX)
    }

    /// Proposes `op` through the shared proposer (stamp, admission,
    /// deadline) and returns its outcome and log index.
    async fn propose(&self, op: Op) -> Result<(Outcome, u64), Status> {
        self.proposer.propose(op).await
    }

    /// The membership as this node leads it (its latest, possibly not yet
    /// committed); `NOT_LEADER` with the leader's hint on any other node.
    fn leader_membership(&self) -> Result<Membership<NodeId, NodeInfo>, Status> {
        let metrics = self.raft.metrics().borrow_watched().clone();
        if metrics.state != ServerState::Leader {
            return Err(not_leader(&metrics, self.proposer.contact()));
        }
        Ok(metrics.membership_config.membership().clone())
    }

    /// Runs one membership change to completion, within
    /// [`MEMBERSHIP_CHANGE_TIMEOUT`]; returns the final entry's index and
    /// the membership it installed.
    async fn change_membership(
        &self,
        change: ChangeMembers<NodeId, NodeInfo>,
        retain: bool,
    ) -> Result<(u64, Vec<proto::Member>), Status> {
        let written = tokio::time::timeout(
            MEMBERSHIP_CHANGE_TIMEOUT,
            self.raft.change_membership(change, retain),
        )
        .await
        .map_err(|_| reason_status(ErrorReason::Deadline))?
        .map_err(|error| membership_status(error, self.proposer.contact()))?;
        let members = written
            .membership
            .as_ref()
            .map(members_to_proto)
            .unwrap_or_default();
        Ok((written.log_id.index, members))
    }

    /// Waits until the leader has replicated to `node_id` everything up to
    /// `log_index`, or `timeout` passes: then `NOT_CAUGHT_UP`, worded for a
    /// learner just `added` or for one about to be promoted. A lost
    /// leadership or a removal is said as such.
    async fn wait_caught_up(
        &self,
        node_id: NodeId,
        log_index: u64,
        timeout: Duration,
        added: bool,
    ) -> Result<u64, Status> {
        let mut metrics = self.raft.metrics();
        let wait = async {
            loop {
                {
                    let now = metrics.borrow_and_update();
                    if now.state != ServerState::Leader {
                        return Err(reason_status(ErrorReason::Unavailable(format!(
                            "this node stopped leading while node {node_id} caught up; \
                             it stays a learner"
                        ))));
                    }
                    if now
                        .membership_config
                        .membership()
                        .get_node(&node_id)
                        .is_none()
                    {
                        return Err(invalid(format!(
                            "node {node_id} was removed while it caught up"
                        )));
                    }
                    let matched = now
                        .replication
                        .as_ref()
                        .and_then(|replication| replication.get(&node_id))
                        .and_then(|matched| matched.map(|id| id.index));
                    if let Some(matched) = matched
                        && matched >= log_index
                    {
                        return Ok(matched);
                    }
                }
                if metrics.changed().await.is_err() {
                    return Err(reason_status(ErrorReason::Unavailable(
                        "the node is shutting down".into(),
                    )));
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.map_err(|_| {
            reason_status(ErrorReason::NotCaughtUp {
                node_id,
                log_index,
                waited: timeout,
                added,
            })
        })?
    }
}

/// Every node of a Raft membership, in node id order, marked voter or not
/// (the Admin membership replies and the Client `Status` reply).
pub(super) fn members_to_proto(membership: &Membership<NodeId, NodeInfo>) -> Vec<proto::Member> {
    membership
        .nodes()
        .map(|(id, node)| proto::Member {
            node_id: *id,
            peer_addr: node.peer_addr.clone(),
            client_addr: node.client_addr.clone(),
            voter: membership.voter_ids().any(|voter| voter == *id),
        })
        .collect()
}

fn parse_addr(field: &str, addr: &str) -> Result<(), Status> {
    if is_host_port(addr) {
        Ok(())
    } else {
        Err(invalid(format!("{field} {addr:?} is not HOST:PORT")))
    }
}

fn voter_ids(membership: &Membership<NodeId, NodeInfo>) -> BTreeSet<NodeId> {
    membership.voter_ids().collect()
}

#[tonic::async_trait]
impl admin_server::Admin for AdminApi {
    async fn add_learner(
        &self,
        request: Request<proto::AddLearnerRequest>,
    ) -> Result<Response<proto::AddLearnerReply>, Status> {
        let request = request.into_inner();
        required_cluster(&self.state, &request.cluster_id)?;
        if request.node_id == 0 {
            return Err(invalid("node id 0 is reserved"));
        }
        parse_addr("peer_addr", &request.peer_addr)?;
        parse_addr("client_addr", &request.client_addr)?;
        let node = NodeInfo {
            peer_addr: request.peer_addr,
            client_addr: request.client_addr,
        };
        let membership = self.leader_membership()?;
        if let Some(existing) = membership.get_node(&request.node_id)
            && !(same_addr(&existing.peer_addr, &node.peer_addr)
                && same_addr(&existing.client_addr, &node.client_addr))
        {
            return Err(invalid(format!(
                "node {} is already a member at {existing}; remove it first",
                request.node_id
            )));
        }
        let timeout = match request.timeout_ms {
            0 => CATCH_UP_TIMEOUT,
            ms => Duration::from_millis(ms),
        };
        let written = tokio::time::timeout(
            MEMBERSHIP_CHANGE_TIMEOUT,
            self.raft.add_learner(request.node_id, node, false),
        )
        .await
        .map_err(|_| reason_status(ErrorReason::Deadline))?
        .map_err(|error| membership_status(error, self.proposer.contact()))?;
        let log_index = written.log_id.index;
        tracing::info!(node_id = request.node_id, log_index, "learner added");
        let matched_index = self
            .wait_caught_up(request.node_id, log_index, timeout, true)
            .await?;
        tracing::info!(
            node_id = request.node_id,
            matched_index,
            "learner caught up"
        );
        let members = self
            .raft
            .metrics()
            .borrow_watched()
            .membership_config
            .membership()
            .clone();
        Ok(Response::new(proto::AddLearnerReply {
            log_index,
            matched_index,
            members: members_to_proto(&members),
        }))
    }

    async fn change_voters(
        &self,
        request: Request<proto::ChangeVotersRequest>,
    ) -> Result<Response<proto::ChangeVotersReply>, Status> {
        let request = request.into_inner();
        required_cluster(&self.state, &request.cluster_id)?;
        let voters: BTreeSet<NodeId> = request.voters.iter().copied().collect();
        if voters.is_empty() {
            return Err(invalid("the voter set must not be empty"));
        }
        let membership = self.leader_membership()?;
        if let Some(unknown) = voters.iter().find(|id| membership.get_node(id).is_none()) {
            return Err(invalid(format!(
                "node {unknown} is not a member; add it as a learner first"
            )));
        }
        // A joint configuration whose new voters cannot follow has no
        // majority: commits stop until it is undone. Promote only learners
        // that have caught up with this leader's log now.
        let current_voters = voter_ids(&membership);
        let last_log_index = self
            .raft
            .metrics()
            .borrow_watched()
            .last_log_index
            .unwrap_or(0);
        for &id in voters.difference(&current_voters) {
            self.wait_caught_up(id, last_log_index, PROMOTE_CATCH_UP_TIMEOUT, false)
                .await?;
        }
        let (log_index, members) = if voters == current_voters {
            // Already so: nothing to propose.
            let index = self
                .raft
                .metrics()
                .borrow_watched()
                .membership_config
                .log_id()
                .map_or(0, |id| id.index);
            (index, members_to_proto(&membership))
        } else {
            // Voters left out stay members, as learners (`retain`).
            self.change_membership(ChangeMembers::ReplaceAllVoters(voters.clone()), true)
                .await?
        };
        tracing::info!(?voters, log_index, "voters changed");
        Ok(Response::new(proto::ChangeVotersReply {
            log_index,
            members,
        }))
    }

    async fn remove_node(
        &self,
        request: Request<proto::RemoveNodeRequest>,
    ) -> Result<Response<proto::RemoveNodeReply>, Status> {
        let request = request.into_inner();
        required_cluster(&self.state, &request.cluster_id)?;
        let node_id = request.node_id;
        let membership = self.leader_membership()?;
        if membership.get_node(&node_id).is_none() {
            return Err(invalid(format!("node {node_id} is not a member")));
        }
        let voters = voter_ids(&membership);
        let change = if voters.contains(&node_id) {
            if voters.len() == 1 {
                return Err(invalid(format!(
                    "node {node_id} is the last voter and cannot be removed"
                )));
            }
            ChangeMembers::RemoveVoters(BTreeSet::from([node_id]))
        } else {
            ChangeMembers::RemoveNodes(BTreeSet::from([node_id]))
        };
        // `retain: false`: a removed voter does not stay as a learner.
        let (log_index, members) = self.change_membership(change, false).await?;
        tracing::info!(node_id, log_index, "node removed");
        Ok(Response::new(proto::RemoveNodeReply { log_index, members }))
    }

    async fn list_sessions(
        &self,
        request: Request<proto::ListSessionsRequest>,
    ) -> Result<Response<proto::ListSessionsReply>, Status> {
        let request = request.into_inner();
        let limit = match request.limit as usize {
            0 => SESSIONS_PAGE_DEFAULT,
            limit => limit.min(SESSIONS_PAGE_MAX),
        };
        let applied = self.state.read();
        let registry = &applied.registry;
        let (sessions, more) = registry.sessions_after(ClientId(request.after_client_id), limit);
        Ok(Response::new(proto::ListSessionsReply {
            sessions: sessions.iter().map(convert::session_to_proto).collect(),
            applied_index: registry.applied_index(),
            more,
            cluster_time_ms: registry.cluster_time_ms(),
        }))
    }

    async fn get_session(
        &self,
        request: Request<proto::GetSessionRequest>,
    ) -> Result<Response<proto::SessionInfo>, Status> {
        let client_id = ClientId(request.into_inner().client_id);
        let session = self.state.read().registry.session(client_id);
        match session {
            Some(session) => Ok(Response::new(convert::session_to_proto(&session))),
            None => Err(reason_status(ErrorReason::SessionExpired)),
        }
    }

    async fn expire_session(
        &self,
        request: Request<proto::ExpireSessionRequest>,
    ) -> Result<Response<proto::ExpireSessionReply>, Status> {
        let request = request.into_inner();
        let cluster_id = required_cluster(&self.state, &request.cluster_id)?;
        // The operator's override of ownership (rule 19): no principal.
        let op = Op::Unregister {
            cluster_id,
            client_id: ClientId(request.client_id),
            principal: None,
        };
        match self.propose(op).await? {
            (Outcome::Unregistered, log_index) => {
                tracing::info!(
                    client_id = request.client_id,
                    log_index,
                    "session expired by an operator"
                );
                Ok(Response::new(proto::ExpireSessionReply { log_index }))
            }
            (other, _) => Err(rejected(other)),
        }
    }

    async fn get_config(
        &self,
        _request: Request<proto::GetConfigRequest>,
    ) -> Result<Response<proto::GetConfigReply>, Status> {
        let applied = self.state.read();
        let registry = &applied.registry;
        Ok(Response::new(proto::GetConfigReply {
            config: registry.cluster_id().map(|_| {
                let mut config =
                    convert::configs_to_proto(registry.config(), registry.keyed_config());
                convert::claim_config_into_proto(registry.claim_config(), &mut config);
                convert::budget_into_proto(registry.budget_config(), &mut config);
                config.rules_version = registry.rules().0;
                config
            }),
            applied_index: registry.applied_index(),
        }))
    }

    async fn set_config(
        &self,
        request: Request<proto::SetConfigRequest>,
    ) -> Result<Response<proto::SetConfigReply>, Status> {
        let request = request.into_inner();
        let cluster_id = required_cluster(&self.state, &request.cluster_id)?;
        let keyed = request
            .patch
            .as_ref()
            .map(convert::keyed_config_patch_from_proto)
            .unwrap_or_default();
        let claims = request
            .patch
            .as_ref()
            .map(convert::claim_config_patch_from_proto)
            .unwrap_or_default();
        let budget = request
            .patch
            .as_ref()
            .map(convert::budget_patch_from_proto)
            .unwrap_or_default();
        let rules = request
            .patch
            .as_ref()
            .and_then(|patch| patch.rules_version)
            .map(RulesVersion);
        let patch = convert::config_patch_from_proto(request.patch).map_err(convert_status)?;
        // A fact of the request alone. Whether the patched configs are
        // valid depends on the configs in force when the entry applies: the
        // core decides that, in log order, on every replica alike.
        let no_config =
            patch.is_empty() && keyed.is_empty() && claims.is_empty() && budget.is_empty();
        let op = match rules {
            None if no_config => return Err(invalid("the config patch sets no field")),
            None => Op::PatchAllConfigs {
                cluster_id,
                patch,
                keyed,
                claims,
                budget,
            },
            // Refused here, never proposed: a node that does not know the
            // version stops at the entry (see the state machine).
            Some(rules) if let Some(why) = rules.unknown_to_this_build() => {
                return Err(invalid(why));
            }
            Some(rules) if no_config => Op::RaiseRules { cluster_id, rules },
            Some(_) => {
                return Err(invalid(
                    "rules_version is raised alone: set the other fields in a second call",
                ));
            }
        };
        match self.propose(op).await? {
            (
                Outcome::AllConfigsSet {
                    config,
                    keyed,
                    claims,
                    budget,
                    rules,
                },
                log_index,
            ) => {
                tracing::info!(
                    log_index,
                    session_ttl_ms = config.session_ttl_ms,
                    window = config.window,
                    idempotency_key_ttl_ms = keyed.idempotency_key_ttl_ms,
                    claim_ttl_ms = claims.claim_ttl_ms,
                    rules_version = rules.0,
                    "registry config set"
                );
                let mut wire = convert::configs_to_proto(&config, &keyed);
                convert::claim_config_into_proto(&claims, &mut wire);
                convert::budget_into_proto(&budget, &mut wire);
                wire.rules_version = rules.0;
                Ok(Response::new(proto::SetConfigReply {
                    log_index,
                    config: Some(wire),
                }))
            }
            (other, _) => Err(rejected(other)),
        }
    }

    async fn list_claims(
        &self,
        request: Request<proto::ListClaimsRequest>,
    ) -> Result<Response<proto::ListClaimsReply>, Status> {
        let request = request.into_inner();
        let (principal, after_key, limit) = key_page(
            request.after_principal,
            request.after_key,
            request.limit,
            oncekv_core::bounds::CLAIM_KEY_BYTES_MAX,
            "claim key",
        )?;
        let applied = self.state.read();
        let registry = &applied.registry;
        let (claims, more) = self
            .state
            .claims_page(registry, &principal, &after_key, limit)
            .map_err(|e| Status::internal(format!("reading the record store: {e}")))?;
        Ok(Response::new(proto::ListClaimsReply {
            claims: claims.iter().map(convert::claim_to_proto).collect(),
            applied_index: registry.applied_index(),
            more,
            cluster_time_ms: registry.cluster_time_ms(),
        }))
    }

    async fn get_claim(
        &self,
        request: Request<proto::GetClaimRequest>,
    ) -> Result<Response<proto::GetClaimReply>, Status> {
        let request = request.into_inner();
        let principal = convert::principal_from_proto(request.principal).map_err(convert_status)?;
        let key = convert::claim_key_from_proto(request.key).map_err(convert_status)?;
        let applied = self.state.read();
        let registry = &applied.registry;
        let claim = self
            .state
            .claim_view(registry, &principal, &key)
            .map_err(|e| Status::internal(format!("reading the record store: {e}")))?;
        Ok(Response::new(proto::GetClaimReply {
            claim: claim.map(|view| convert::claim_to_proto(&view)),
            applied_index: registry.applied_index(),
            cluster_time_ms: registry.cluster_time_ms(),
        }))
    }

    async fn forget_claim(
        &self,
        request: Request<proto::ForgetClaimRequest>,
    ) -> Result<Response<proto::ForgetClaimReply>, Status> {
        let request = request.into_inner();
        let cluster_id = required_cluster(&self.state, &request.cluster_id)?;
        let principal = convert::principal_from_proto(request.principal).map_err(convert_status)?;
        let key = convert::claim_key_from_proto(request.key).map_err(convert_status)?;
        let op = Op::ForgetClaim {
            cluster_id,
            principal: principal.clone(),
            key,
        };
        match self.propose(op).await? {
            (Outcome::ClaimForgotten { existed }, log_index) => {
                tracing::info!(log_index, existed, %principal, "claim forgotten by an operator");
                Ok(Response::new(proto::ForgetClaimReply {
                    log_index,
                    existed,
                }))
            }
            (other, _) => Err(rejected(other)),
        }
    }

    async fn list_keys(
        &self,
        request: Request<proto::ListKeysRequest>,
    ) -> Result<Response<proto::ListKeysReply>, Status> {
        let request = request.into_inner();
        let (principal, after_key, limit) = key_page(
            request.after_principal,
            request.after_key,
            request.limit,
            oncekv_core::bounds::IDEMPOTENCY_KEY_BYTES_MAX,
            "idempotency key",
        )?;
        let applied = self.state.read();
        let registry = &applied.registry;
        let (keys, more) = self
            .state
            .keys_page(registry, &principal, &after_key, limit)
            .map_err(|e| Status::internal(format!("reading the key records: {e}")))?;
        Ok(Response::new(proto::ListKeysReply {
            keys: keys.iter().map(convert::key_to_proto).collect(),
            applied_index: registry.applied_index(),
            more,
            cluster_time_ms: registry.cluster_time_ms(),
        }))
    }

    async fn get_key(
        &self,
        request: Request<proto::GetKeyRequest>,
    ) -> Result<Response<proto::GetKeyReply>, Status> {
        let request = request.into_inner();
        let principal = convert::principal_from_proto(request.principal).map_err(convert_status)?;
        let key =
            convert::idempotency_key_from_proto(request.idempotency_key).map_err(convert_status)?;
        let applied = self.state.read();
        let registry = &applied.registry;
        let view = self
            .state
            .key_view(registry, &principal, &key)
            .map_err(|e| Status::internal(format!("reading the key records: {e}")))?;
        Ok(Response::new(proto::GetKeyReply {
            key: view.map(|view| convert::key_to_proto(&view)),
            applied_index: registry.applied_index(),
            cluster_time_ms: registry.cluster_time_ms(),
        }))
    }

    async fn forget_key(
        &self,
        request: Request<proto::ForgetKeyRequest>,
    ) -> Result<Response<proto::ForgetKeyReply>, Status> {
        let request = request.into_inner();
        let cluster_id = required_cluster(&self.state, &request.cluster_id)?;
        let principal = convert::principal_from_proto(request.principal).map_err(convert_status)?;
        let key =
            convert::idempotency_key_from_proto(request.idempotency_key).map_err(convert_status)?;
        let op = Op::ForgetKey {
            cluster_id,
            principal,
            key,
        };
        match self.propose(op).await? {
            (Outcome::KeyForgotten { existed }, log_index) => {
                tracing::info!(
                    log_index,
                    existed,
                    "idempotency key forgotten by an operator"
                );
                Ok(Response::new(proto::ForgetKeyReply { log_index, existed }))
            }
            (other, _) => Err(rejected(other)),
        }
    }

    async fn trigger_snapshot(
        &self,
        _request: Request<proto::TriggerSnapshotRequest>,
    ) -> Result<Response<proto::TriggerSnapshotReply>, Status> {
        let target = self.state.read().registry.applied_index();
        let mut metrics = self.raft.metrics();
        let wait = async {
            // The snapshot index last seen when a build was asked for.
            let mut asked_at: Option<u64> = None;
            loop {
                let built = metrics
                    .borrow_and_update()
                    .snapshot
                    .map_or(0, |id| id.index);
                if built >= target {
                    return Ok::<u64, Status>(built);
                }
                // Asked once, and again only when a build ended short of
                // `target` (a request is ignored while a build runs) —
                // not at every metrics change, which under load is
                // hundreds a second.
                if asked_at != Some(built) {
                    self.raft.trigger().snapshot().await.map_err(|error| {
                        reason_status(ErrorReason::Unavailable(error.to_string()))
                    })?;
                    asked_at = Some(built);
                }
                let _ = metrics.changed().await;
            }
        };
        let snapshot_index = tokio::time::timeout(SNAPSHOT_TIMEOUT, wait)
            .await
            .map_err(|_| reason_status(ErrorReason::Deadline))??;
        tracing::info!(
            node_id = self.node_id,
            log_index = snapshot_index,
            "snapshot triggered by an operator"
        );
        Ok(Response::new(proto::TriggerSnapshotReply {
            snapshot_index,
        }))
    }

    async fn state_hash(
        &self,
        _request: Request<proto::StateHashRequest>,
    ) -> Result<Response<proto::StateHashReply>, Status> {
        // Index, time and hash of one copy of the state: one moment, hashed
        // for this call if no caller has hashed this index yet.
        let hashed = self.state.hash_now().await;
        Ok(Response::new(proto::StateHashReply {
            applied_index: hashed.applied_index,
            state_hash: hashed.hash,
            cluster_time_ms: hashed.cluster_time_ms,
            node_id: self.node_id,
        }))
    }

    async fn local_read(
        &self,
        request: Request<proto::LocalReadRequest>,
    ) -> Result<Response<proto::LocalReadReply>, Status> {
        let key = request.into_inner().key;
        convert::check_key(&key).map_err(convert_status)?;
        let applied = self.state.read();
        Ok(Response::new(proto::LocalReadReply {
            value: applied.registry.get(&key).map(convert::value_to_proto),
            applied_index: applied.registry.applied_index(),
        }))
    }

    async fn inject_fault(
        &self,
        request: Request<proto::InjectFaultRequest>,
    ) -> Result<Response<proto::InjectFaultReply>, Status> {
        if !cfg!(feature = "fault-injection") {
            return Err(faults_not_built());
        }
        let count = u64::from(request.into_inner().drop_execute_replies);
        let pending = self.faults.add_execute_reply_drops(count);
        tracing::warn!(
            node_id = self.node_id,
            count,
            pending,
            "fault injection: execute replies will be dropped"
        );
        Ok(Response::new(proto::InjectFaultReply {
            drop_execute_replies_pending: pending,
        }))
    }
}

/// Where a page of (principal, key) records starts and how long it is
/// (`ListKeys`, `ListClaims`): the principal and key after which it starts
/// (a key longer than `key_bytes_max`, the hard bound of such keys, is
/// malformed), and the limit (0: the default; at most the maximum).
fn key_page(
    after_principal: String,
    after_key: Vec<u8>,
    limit: u32,
    key_bytes_max: u64,
    kind: &str,
) -> Result<(oncekv_core::Principal, oncekv_core::IdempotencyKey, usize), Status> {
    let limit = match limit as usize {
        0 => KEYS_PAGE_DEFAULT,
        limit => limit.min(KEYS_PAGE_MAX),
    };
    let principal = convert::principal_from_proto(after_principal).map_err(convert_status)?;
    if after_key.len() as u64 > key_bytes_max {
        return Err(invalid(format!("after_key is longer than any {kind}")));
    }
    Ok((principal, oncekv_core::IdempotencyKey(after_key), limit))
}
