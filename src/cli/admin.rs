//! `oncekv admin …`: the operator commands over the `Admin` gRPC service —
//! membership, sessions, the registry config, snapshots, state hashes and
//! local reads. It owns finding the leader (following `NOT_LEADER` hints),
//! composing multi-step operations (`promote`, `replace`, `config set`) from
//! single RPCs, and the presentation; the cluster decides everything else.
//! Endpoints, `--json`, `--timeout-ms` (global flags: before `admin`,
//! after it or after the subcommand), the two-line errors and the exit
//! codes are the key-value commands' (see [`super::kv`]).
//!
//! | command | does |
//! | --- | --- |
//! | `members` | the leader's membership: id, voter or learner, addresses |
//! | `add-learner ID PEER_ADDR CLIENT_ADDR` | adds a learner, waits until it caught up |
//! | `promote ID` | makes a member a voter (voters + ID) |
//! | `remove ID` | removes a node (voter or learner) from the membership |
//! | `replace --dead ID --new ID=PEER_ADDR/CLIENT_ADDR` | add-learner, wait, voters − dead + new, remove dead |
//! | `sessions` | every live session (leader's applied state) |
//! | `session ID` | one session |
//! | `expire ID` | ends a session through the log |
//! | `config` | the replicated registry config |
//! | `config set [--session-ttl-ms N] [--window N] …` | changes the given fields, keeps the rest |
//! | `keys list [--after-principal P --after-key K] [--limit N]` | live idempotency keys (leader's applied state; [`super::keys`]) |
//! | `keys show [--principal P] KEY` | one key's record |
//! | `keys forget [--principal P] KEY` | removes the key's record through the log |
//! | `snapshot --node ADDR` | that node builds a snapshot now |
//! | `hash` | every member's applied index and state hash, and whether they agree |
//! | `local-get KEY --node ADDR` | the key in that node's applied state (no read index) |
//!
//! Retries: the client library's one leader-following policy
//! (`oncekv_client::policy`, through `oncekv_client::admin`): a call is
//! retried at the hinted leader on `NOT_LEADER`, and on another endpoint
//! when a node is unreachable or cannot serve this attempt, until
//! `--timeout-ms`. A change whose outcome is unknown at the deadline exits 3.

use std::collections::BTreeSet;
use std::future::Future;
use std::time::Duration;

use serde_json::{Value as Json, json};
use tokio::time::Instant;

use super::CommonArgs;
use super::kv::{Failure, Success, print_report, success, value_json, value_lines};
use super::reach::{self, cause_of};
use oncekv_client::credentials::{AuthChannel, Credentials};
use oncekv_client::policy::{self, CallError, Verdict};
use oncekv_wire::convert;
use oncekv_wire::proto::admin_client::AdminClient;
use oncekv_wire::proto::{self, Member, Reason, StatusReply};
use oncekv_wire::status::error_detail;

/// Default wait for a new learner to catch up.
const CATCH_UP_TIMEOUT_MS: u64 = 60_000;
/// Longest pause between rounds of `hash`.
const BACKOFF_MAX: Duration = Duration::from_millis(500);
/// Longest wait for one node's `Status` while looking for the leader.
const STATUS_ATTEMPT_MAX: Duration = Duration::from_secs(2);
/// Least time a call to one named node is given, even past the deadline.
const ATTEMPT_MIN: Duration = Duration::from_secs(1);

/// `oncekv admin SUBCOMMAND`.
#[derive(Debug, Clone, clap::Args)]
pub struct AdminArgs {
    #[command(subcommand)]
    pub command: AdminCommand,
}

/// The admin subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum AdminCommand {
    /// The membership as the leader sees it: each node's id, whether it
    /// votes, its peer and client addresses.
    Members(OnlyCommon),
    /// Add a node as a learner and wait until it has caught up.
    AddLearner(AddLearnerArgs),
    /// Make a member (a caught-up learner) a voter.
    Promote(NodeArgs),
    /// Remove a node from the membership (a voter or a learner).
    Remove(NodeArgs),
    /// Replace a failed voter: add the new node as a learner, wait until it
    /// caught up, make it a voter in place of the dead one, remove the dead.
    Replace(ReplaceArgs),
    /// List every live session (the leader's applied state).
    Sessions(OnlyCommon),
    /// Show one session: floor, cached responses and bytes, activity.
    Session(SessionArgs),
    /// End a session through the log; its client gets SESSION_EXPIRED.
    Expire(SessionArgs),
    /// Show the replicated registry config; `config set` changes it.
    Config(ConfigArgs),
    /// Idempotency keys: `keys list`, `keys show KEY`, `keys forget KEY`.
    Keys(super::keys::KeysArgs),
    /// Make one node build a snapshot now.
    Snapshot(SnapshotArgs),
    /// Every member's applied index and state hash, and whether they agree.
    Hash(OnlyCommon),
    /// Read KEY from one node's applied state (no read index: may be stale).
    LocalGet(LocalGetArgs),
}

/// A subcommand with no arguments of its own.
#[derive(Debug, Clone, clap::Args)]
pub struct OnlyCommon {}

/// `add-learner ID PEER_ADDR CLIENT_ADDR`.
#[derive(Debug, Clone, clap::Args)]
pub struct AddLearnerArgs {
    pub id: u64,
    pub peer_addr: String,
    pub client_addr: String,
    /// How long the learner may take to catch up (on top of --timeout-ms).
    #[arg(long, default_value_t = CATCH_UP_TIMEOUT_MS)]
    pub catch_up_timeout_ms: u64,
}

/// `promote ID`, `remove ID`.
#[derive(Debug, Clone, clap::Args)]
pub struct NodeArgs {
    pub id: u64,
}

/// `replace --dead ID --new ID=PEER_ADDR/CLIENT_ADDR`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplaceArgs {
    /// The voter to replace.
    #[arg(long)]
    pub dead: u64,
    /// The new node, as ID=PEER_ADDR/CLIENT_ADDR (already running, started
    /// without --initialize).
    #[arg(long = "new", value_name = "ID=PEER_ADDR/CLIENT_ADDR")]
    pub new_node: String,
    /// How long the new node may take to catch up (on top of --timeout-ms).
    #[arg(long, default_value_t = CATCH_UP_TIMEOUT_MS)]
    pub catch_up_timeout_ms: u64,
}

/// `session ID`, `expire ID`.
#[derive(Debug, Clone, clap::Args)]
pub struct SessionArgs {
    /// The session's client id.
    pub client_id: u64,
}

/// `config [set …]`.
#[derive(Debug, Clone, clap::Args)]
pub struct ConfigArgs {
    #[command(subcommand)]
    pub action: Option<ConfigAction>,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum ConfigAction {
    /// Change the given fields through a config log entry (the others stay).
    Set(ConfigSetArgs),
}

/// `config set`: any subset of the fields.
#[derive(Debug, Clone, clap::Args)]
pub struct ConfigSetArgs {
    #[arg(long)]
    pub session_ttl_ms: Option<u64>,
    #[arg(long)]
    pub sessions_max: Option<u64>,
    #[arg(long)]
    pub window: Option<u64>,
    #[arg(long)]
    pub cached_bytes_per_session_max: Option<u64>,
    #[arg(long)]
    pub key_bytes_max: Option<u64>,
    #[arg(long)]
    pub value_bytes_max: Option<u64>,
    #[arg(long)]
    pub list_elements_max: Option<u64>,
    #[arg(long)]
    pub keys_max: Option<u64>,
    /// How long an idempotency key's record lives after its first execution.
    #[arg(long)]
    pub idempotency_key_ttl_ms: Option<u64>,
    /// Live idempotency keys, all principals together.
    #[arg(long)]
    pub idempotency_keys_max: Option<u64>,
    /// Longest idempotency key.
    #[arg(long)]
    pub idempotency_key_bytes_max: Option<u64>,
    /// Bytes of all idempotency keys' records together.
    #[arg(long)]
    pub idempotency_cached_bytes_max: Option<u64>,
}

/// `snapshot --node ADDR`.
#[derive(Debug, Clone, clap::Args)]
pub struct SnapshotArgs {
    /// The node's client address (host:port).
    #[arg(long)]
    pub node: String,
}

/// `local-get KEY --node ADDR`.
#[derive(Debug, Clone, clap::Args)]
pub struct LocalGetArgs {
    pub key: String,
    /// The node's client address (host:port).
    #[arg(long)]
    pub node: String,
}

impl AdminArgs {
    /// Runs the command, prints its result (stdout) or error (stderr), and
    /// returns the process exit code.
    pub async fn run(&self, common: &CommonArgs) -> i32 {
        let report = match common.endpoints() {
            Ok(endpoints) => match common.credentials() {
                Ok(credentials) => {
                    let admin = Admin::new(endpoints, common.timeout(), credentials);
                    self.command.execute(admin).await
                }
                Err(error) => Err(Failure::usage(error.to_string())),
            },
            Err(failure) => Err(failure),
        };
        let stdout = std::io::stdout();
        let stderr = std::io::stderr();
        print_report(&mut stdout.lock(), &mut stderr.lock(), common.json, report)
    }
}

impl AdminCommand {
    async fn execute(&self, mut admin: Admin) -> Result<Success, Failure> {
        match self {
            AdminCommand::Members(_) => members(&admin).await,
            AdminCommand::AddLearner(args) => {
                admin.extend(args.catch_up_timeout_ms);
                let member = NewMember::new(args.id, &args.peer_addr, &args.client_addr);
                add_learner(&admin, &member, args.catch_up_timeout_ms).await
            }
            AdminCommand::Promote(args) => promote(&admin, args.id).await,
            AdminCommand::Remove(args) => remove(&admin, args.id).await,
            AdminCommand::Replace(args) => {
                admin.extend(args.catch_up_timeout_ms);
                replace(&admin, args).await
            }
            AdminCommand::Sessions(_) => sessions(&admin).await,
            AdminCommand::Session(args) => session(&admin, args.client_id).await,
            AdminCommand::Expire(args) => expire(&admin, args.client_id).await,
            AdminCommand::Config(args) => match &args.action {
                None => show_config(&admin).await,
                Some(ConfigAction::Set(set)) => set_config(&admin, set).await,
            },
            AdminCommand::Keys(args) => args.action.execute(&admin).await,
            AdminCommand::Snapshot(args) => snapshot(&admin, &args.node).await,
            AdminCommand::Hash(_) => hash(&admin).await,
            AdminCommand::LocalGet(args) => local_get(&admin, &args.key, &args.node).await,
        }
    }
}

/// A node to add: id and addresses, checked for shape.
struct NewMember {
    id: u64,
    peer_addr: String,
    client_addr: String,
}

impl NewMember {
    fn new(id: u64, peer_addr: &str, client_addr: &str) -> NewMember {
        NewMember {
            id,
            peer_addr: peer_addr.trim().to_owned(),
            client_addr: client_addr.trim().to_owned(),
        }
    }

    /// `ID=PEER_ADDR/CLIENT_ADDR`, as `oncekv node --peer` takes it.
    fn parse(spec: &str) -> Result<NewMember, Failure> {
        let bad = || Failure::usage(format!("--new {spec:?}: expected ID=PEER_ADDR/CLIENT_ADDR"));
        let (id, addrs) = spec.split_once('=').ok_or_else(bad)?;
        let (peer_addr, client_addr) = addrs.split_once('/').ok_or_else(bad)?;
        let id = id.trim().parse().map_err(|_| bad())?;
        Ok(NewMember::new(id, peer_addr, client_addr))
    }
}

/// The cluster as the admin commands see it: its Admin service (the client
/// library's, following the leader), the endpoints given and the command's
/// deadline.
pub(super) struct Admin {
    cluster: oncekv_client::admin::Admin,
    endpoints: Vec<String>,
    deadline: Instant,
    /// The command's `--timeout-ms` (bounds the probes that explain a
    /// failure).
    timeout: Duration,
}

impl Admin {
    fn new(endpoints: Vec<String>, timeout: Duration, credentials: Credentials) -> Admin {
        Admin {
            cluster: oncekv_client::admin::Admin::new(endpoints.clone(), credentials),
            endpoints,
            deadline: Instant::now() + timeout,
            timeout,
        }
    }

    /// Why the cluster could not be got through to, from asking every
    /// endpoint once; `detail` is what the failed call saw.
    async fn unreachable(&self, detail: Option<&str>) -> Failure {
        tracing::debug!(?detail, endpoints = ?self.endpoints, "the call did not get through");
        let probes = reach::probe(&self.endpoints, self.timeout).await;
        Failure::unreachable(reach::diagnose(&probes, detail))
    }

    /// Moves the deadline by `ms` (for waits the cluster bounds itself).
    fn extend(&mut self, ms: u64) {
        self.deadline += Duration::from_millis(ms);
    }

    fn remaining(&self) -> Duration {
        self.deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    }

    fn client(&self, endpoint: &str) -> Result<AdminClient<AuthChannel>, Failure> {
        self.cluster
            .node(endpoint)
            .map_err(|status| Failure::usage(status.message().to_owned()))
    }

    /// One call to one node, within the deadline, no retries.
    pub(super) async fn at<T, F, Fut>(&self, endpoint: &str, call: F) -> Result<T, Failure>
    where
        F: FnOnce(AdminClient<AuthChannel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let client = self.client(endpoint)?;
        let timeout = self.remaining().max(ATTEMPT_MIN);
        let failure = match tokio::time::timeout(timeout, call(client)).await {
            Ok(Ok(reply)) => return Ok(reply.into_inner()),
            Ok(Err(status))
                if error_detail(&status).is_none()
                    && policy::verdict(&status) != Verdict::Final =>
            {
                tracing::debug!(%endpoint, ?status, "the call did not get through");
                node_unreachable(endpoint, &cause_of(&status).to_string())
            }
            Ok(Err(status)) => status_failure(&status),
            Err(_) => node_unreachable(endpoint, &format!("no answer within {timeout:?}")),
        };
        Err(failure.with("node", json!(endpoint)))
    }

    /// Runs `call` on the leader: follows `NOT_LEADER` hints, moves on from
    /// unreachable nodes, retries until the deadline. With `mutation`, a
    /// deadline after some attempt may have reached a leader reports an
    /// unknown outcome.
    pub(super) async fn on_leader<T, F, Fut>(&self, mutation: bool, call: F) -> Result<T, Failure>
    where
        F: Fn(AdminClient<AuthChannel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        // A malformed endpoint is the caller's to fix, before any call.
        for endpoint in &self.endpoints {
            self.client(endpoint)?;
        }
        let (status, maybe_applied) = match self.cluster.on_leader(self.deadline, call).await {
            Ok(reply) => return Ok(reply),
            Err(CallError::Final(status)) => return Err(status_failure(&status)),
            Err(CallError::GaveUp {
                status,
                maybe_applied,
            }) => (status, mutation && maybe_applied),
        };
        tracing::debug!(?status, maybe_applied, "giving up at the deadline");
        Err(if maybe_applied {
            Failure::new(
                "outcome_unknown",
                format!(
                    "no answer before the deadline ({}): the change may or may not \
                     have been made",
                    status.message()
                ),
            )
            .hint(
                "check with `oncekv admin members` (or `admin config`) before running \
                 it again",
            )
            .unknown()
        } else if error_detail(&status).is_none() {
            // Below our service: why the nodes could not be reached.
            self.unreachable(Some(status.message())).await
        } else {
            status_failure(&status)
        })
    }

    /// The leader's own `Status` (found through the nodes' leader hints);
    /// when none is found before the deadline, why, from asking every node.
    pub(super) async fn leader_status(&self) -> Result<StatusReply, Failure> {
        match self
            .cluster
            .leader_status(self.deadline, STATUS_ATTEMPT_MAX)
            .await
        {
            Ok(reply) => Ok(reply),
            Err(error) => {
                tracing::debug!(status = ?error.status(), "no leader found");
                Err(self.unreachable(None).await)
            }
        }
    }

    /// The cluster id, as the leader knows it.
    pub(super) async fn cluster_id(&self) -> Result<Vec<u8>, Failure> {
        let status = self.leader_status().await?;
        if status.cluster_id.is_empty() {
            return Err(Failure::new(
                "unavailable",
                "the cluster is not initialised yet",
            ));
        }
        Ok(status.cluster_id)
    }
}

/// One named node could not be talked to: `cause` says why.
fn node_unreachable(endpoint: &str, cause: &str) -> Failure {
    Failure::new("unavailable", format!("cannot reach {endpoint}: {cause}")).hint(
        "is the node running, and is this its client address? `oncekv status` shows every node",
    )
}

/// A final failure from the cluster, named like the key-value commands'.
fn status_failure(status: &tonic::Status) -> Failure {
    let kind = match error_detail(status).map(|detail| detail.reason()) {
        Some(Reason::SessionExpired) => "session_expired",
        Some(Reason::WrongCluster) => "wrong_cluster",
        Some(Reason::InvalidArgument) => "invalid_argument",
        Some(Reason::ResourceExhausted) => "resource_exhausted",
        Some(_) => "unavailable",
        None => match status.code() {
            tonic::Code::InvalidArgument => "invalid_argument",
            tonic::Code::Unimplemented => "unimplemented",
            _ => "unavailable",
        },
    };
    Failure::new(kind, status.message().to_owned())
}

fn member_line(member: &Member, leader_id: u64) -> String {
    format!(
        "node {}  {:<7}  peer {}  client {}{}",
        member.node_id,
        if member.voter { "voter" } else { "learner" },
        member.peer_addr,
        member.client_addr,
        if member.node_id == leader_id {
            "  (leader)"
        } else {
            ""
        },
    )
}

fn members_json(members: &[Member]) -> Json {
    members
        .iter()
        .map(|member| {
            json!({
                "node_id": member.node_id,
                "voter": member.voter,
                "peer_addr": member.peer_addr,
                "client_addr": member.client_addr,
            })
        })
        .collect()
}

async fn members(admin: &Admin) -> Result<Success, Failure> {
    let status = admin.leader_status().await?;
    Ok(success(
        status
            .members
            .iter()
            .map(|member| member_line(member, status.node_id))
            .collect(),
        [
            ("leader_id", json!(status.node_id)),
            ("members", members_json(&status.members)),
        ],
    ))
}

async fn add_learner(
    admin: &Admin,
    member: &NewMember,
    catch_up_timeout_ms: u64,
) -> Result<Success, Failure> {
    let cluster_id = admin.cluster_id().await?;
    let request = proto::AddLearnerRequest {
        cluster_id,
        node_id: member.id,
        peer_addr: member.peer_addr.clone(),
        client_addr: member.client_addr.clone(),
        timeout_ms: catch_up_timeout_ms,
    };
    let reply = admin
        .on_leader(true, |mut client| {
            let request = request.clone();
            async move { client.add_learner(request).await }
        })
        .await?;
    Ok(success(
        vec![format!(
            "node {} added as a learner at index {}; caught up to index {}",
            member.id, reply.log_index, reply.matched_index
        )],
        [
            ("node_id", json!(member.id)),
            ("log_index", json!(reply.log_index)),
            ("matched_index", json!(reply.matched_index)),
            ("members", members_json(&reply.members)),
        ],
    ))
}

/// Sets the voter set to `voters`.
async fn change_voters(
    admin: &Admin,
    cluster_id: Vec<u8>,
    voters: &BTreeSet<u64>,
) -> Result<proto::ChangeVotersReply, Failure> {
    let request = proto::ChangeVotersRequest {
        cluster_id,
        voters: voters.iter().copied().collect(),
    };
    admin
        .on_leader(true, |mut client| {
            let request = request.clone();
            async move { client.change_voters(request).await }
        })
        .await
}

fn voters(status: &StatusReply) -> BTreeSet<u64> {
    status
        .members
        .iter()
        .filter(|member| member.voter)
        .map(|member| member.node_id)
        .collect()
}

async fn promote(admin: &Admin, id: u64) -> Result<Success, Failure> {
    let status = admin.leader_status().await?;
    let mut voters = voters(&status);
    voters.insert(id);
    let reply = change_voters(admin, status.cluster_id, &voters).await?;
    Ok(success(
        vec![format!(
            "node {id} is a voter (membership at index {})",
            reply.log_index
        )],
        [
            ("node_id", json!(id)),
            ("log_index", json!(reply.log_index)),
            ("members", members_json(&reply.members)),
        ],
    ))
}

async fn remove_node(
    admin: &Admin,
    cluster_id: Vec<u8>,
    id: u64,
) -> Result<proto::RemoveNodeReply, Failure> {
    let request = proto::RemoveNodeRequest {
        cluster_id,
        node_id: id,
    };
    admin
        .on_leader(true, |mut client| {
            let request = request.clone();
            async move { client.remove_node(request).await }
        })
        .await
}

async fn remove(admin: &Admin, id: u64) -> Result<Success, Failure> {
    let cluster_id = admin.cluster_id().await?;
    let reply = remove_node(admin, cluster_id, id).await?;
    Ok(success(
        vec![format!(
            "node {id} removed (membership at index {}); stop its process",
            reply.log_index
        )],
        [
            ("node_id", json!(id)),
            ("log_index", json!(reply.log_index)),
            ("members", members_json(&reply.members)),
        ],
    ))
}

async fn replace(admin: &Admin, args: &ReplaceArgs) -> Result<Success, Failure> {
    let new = NewMember::parse(&args.new_node)?;
    if new.id == args.dead {
        return Err(Failure::usage("--dead and --new name the same node"));
    }
    let status = admin.leader_status().await?;
    if !voters(&status).contains(&args.dead) {
        return Err(Failure::new(
            "invalid_argument",
            format!("node {} is not a voter", args.dead),
        ));
    }
    let mut lines = Vec::new();
    let added = add_learner(admin, &new, args.catch_up_timeout_ms).await?;
    lines.extend(added.lines);
    // The voters now, in case they changed meanwhile: minus dead, plus new.
    let status = admin.leader_status().await?;
    let mut voters = voters(&status);
    voters.remove(&args.dead);
    voters.insert(new.id);
    let changed = change_voters(admin, status.cluster_id.clone(), &voters).await?;
    lines.push(format!(
        "voters are now {voters:?} (membership at index {})",
        changed.log_index
    ));
    let removed = remove_node(admin, status.cluster_id, args.dead).await?;
    lines.push(format!(
        "node {} removed (membership at index {}); stop its process",
        args.dead, removed.log_index
    ));
    Ok(success(
        lines,
        [
            ("dead", json!(args.dead)),
            ("new", json!(new.id)),
            ("log_index", json!(removed.log_index)),
            ("members", members_json(&removed.members)),
        ],
    ))
}

fn session_line(session: &proto::SessionInfo) -> String {
    format!(
        "client {}  floor {}  cached {} ({} bytes)  last_activity {}  idle {}.{:03}s",
        session.client_id,
        session.floor,
        session.cached_responses,
        session.cached_bytes,
        session.last_activity_ms,
        session.idle_ms / 1000,
        session.idle_ms % 1000,
    )
}

fn session_json(session: &proto::SessionInfo) -> Json {
    json!({
        "client_id": session.client_id,
        "floor": session.floor,
        "cached_responses": session.cached_responses,
        "cached_bytes": session.cached_bytes,
        "last_activity_ms": session.last_activity_ms,
        "idle_ms": session.idle_ms,
    })
}

/// Every live session of the leader's applied state, page by page.
async fn sessions(admin: &Admin) -> Result<Success, Failure> {
    let leader = admin.leader_status().await?.leader_client_addr;
    let mut after_client_id = 0;
    let mut all = Vec::new();
    let applied_index = loop {
        let request = proto::ListSessionsRequest {
            after_client_id,
            limit: 0,
        };
        let page = admin
            .at(&leader, |mut client| async move {
                client.list_sessions(request).await
            })
            .await?;
        all.extend(page.sessions);
        match all.last() {
            Some(last) if page.more => after_client_id = last.client_id,
            _ => break page.applied_index,
        }
    };
    let mut lines: Vec<String> = all.iter().map(session_line).collect();
    lines.push(format!(
        "{} sessions (applied index {applied_index})",
        all.len()
    ));
    Ok(success(
        lines,
        [
            ("applied_index", json!(applied_index)),
            ("sessions", all.iter().map(session_json).collect()),
        ],
    ))
}

async fn session(admin: &Admin, client_id: u64) -> Result<Success, Failure> {
    let leader = admin.leader_status().await?.leader_client_addr;
    let session = admin
        .at(&leader, |mut client| async move {
            client
                .get_session(proto::GetSessionRequest { client_id })
                .await
        })
        .await?;
    Ok(success(
        vec![session_line(&session)],
        [("session", session_json(&session))],
    ))
}

async fn expire(admin: &Admin, client_id: u64) -> Result<Success, Failure> {
    let cluster_id = admin.cluster_id().await?;
    let request = proto::ExpireSessionRequest {
        cluster_id,
        client_id,
    };
    let reply = admin
        .on_leader(true, |mut client| {
            let request = request.clone();
            async move { client.expire_session(request).await }
        })
        .await?;
    Ok(success(
        vec![format!(
            "session {client_id} expired at index {}",
            reply.log_index
        )],
        [
            ("client_id", json!(client_id)),
            ("log_index", json!(reply.log_index)),
        ],
    ))
}

/// The config's fields, in a fixed order, as (name, value).
fn config_fields(config: &proto::RegistryConfig) -> [(&'static str, u64); 12] {
    [
        ("session_ttl_ms", config.session_ttl_ms),
        ("sessions_max", config.sessions_max),
        ("window", config.window),
        (
            "cached_bytes_per_session_max",
            config.cached_bytes_per_session_max,
        ),
        ("key_bytes_max", config.key_bytes_max),
        ("value_bytes_max", config.value_bytes_max),
        ("list_elements_max", config.list_elements_max),
        ("keys_max", config.keys_max),
        ("idempotency_key_ttl_ms", config.idempotency_key_ttl_ms),
        ("idempotency_keys_max", config.idempotency_keys_max),
        (
            "idempotency_key_bytes_max",
            config.idempotency_key_bytes_max,
        ),
        (
            "idempotency_cached_bytes_max",
            config.idempotency_cached_bytes_max,
        ),
    ]
}

fn config_report(config: &proto::RegistryConfig, index_name: &str, index: u64) -> Success {
    let fields = config_fields(config);
    let mut lines: Vec<String> = fields
        .iter()
        .map(|(name, value)| format!("{name} {value}"))
        .collect();
    lines.push(format!("({index_name} {index})"));
    let object: serde_json::Map<String, Json> = fields
        .iter()
        .map(|(name, value)| ((*name).to_owned(), json!(value)))
        .collect();
    success(
        lines,
        [(index_name, json!(index)), ("config", Json::Object(object))],
    )
}

/// The leader's applied config.
async fn leader_config(admin: &Admin) -> Result<(proto::RegistryConfig, u64), Failure> {
    let leader = admin.leader_status().await?.leader_client_addr;
    let reply = admin
        .at(&leader, |mut client| async move {
            client.get_config(proto::GetConfigRequest {}).await
        })
        .await?;
    let config = reply
        .config
        .ok_or_else(|| Failure::new("unavailable", "the cluster is not initialised yet"))?;
    Ok((config, reply.applied_index))
}

async fn show_config(admin: &Admin) -> Result<Success, Failure> {
    let (config, applied_index) = leader_config(admin).await?;
    Ok(config_report(&config, "applied_index", applied_index))
}

async fn set_config(admin: &Admin, set: &ConfigSetArgs) -> Result<Success, Failure> {
    let changes = [
        set.session_ttl_ms,
        set.sessions_max,
        set.window,
        set.cached_bytes_per_session_max,
        set.key_bytes_max,
        set.value_bytes_max,
        set.list_elements_max,
        set.keys_max,
        set.idempotency_key_ttl_ms,
        set.idempotency_keys_max,
        set.idempotency_key_bytes_max,
        set.idempotency_cached_bytes_max,
    ];
    if changes.iter().all(Option::is_none) {
        return Err(Failure::usage(
            "config set needs at least one field to change (see --help)",
        ));
    }
    let cluster_id = admin.cluster_id().await?;
    // Only the given fields travel: the registry applies them to the config
    // in force when the entry applies, so a concurrent change of other
    // fields is kept, and a retry sets the same values again.
    let patch = proto::RegistryConfigPatch {
        session_ttl_ms: set.session_ttl_ms,
        sessions_max: set.sessions_max,
        window: set.window,
        cached_bytes_per_session_max: set.cached_bytes_per_session_max,
        key_bytes_max: set.key_bytes_max,
        value_bytes_max: set.value_bytes_max,
        list_elements_max: set.list_elements_max,
        keys_max: set.keys_max,
        idempotency_key_ttl_ms: set.idempotency_key_ttl_ms,
        idempotency_keys_max: set.idempotency_keys_max,
        idempotency_key_bytes_max: set.idempotency_key_bytes_max,
        idempotency_cached_bytes_max: set.idempotency_cached_bytes_max,
    };
    let request = proto::SetConfigRequest {
        cluster_id,
        patch: Some(patch),
    };
    let reply = admin
        .on_leader(true, |mut client| {
            let request = request.clone();
            async move { client.set_config(request).await }
        })
        .await?;
    let applied = reply.config.unwrap_or_default();
    Ok(config_report(&applied, "log_index", reply.log_index))
}

async fn snapshot(admin: &Admin, node: &str) -> Result<Success, Failure> {
    let reply = admin
        .at(node, |mut client| async move {
            client
                .trigger_snapshot(proto::TriggerSnapshotRequest {})
                .await
        })
        .await?;
    Ok(success(
        vec![format!(
            "{node}: snapshot at index {} is durable",
            reply.snapshot_index
        )],
        [
            ("node", json!(node)),
            ("snapshot_index", json!(reply.snapshot_index)),
        ],
    ))
}

/// Whether the nodes that answered hold the same hash at the same index.
#[derive(Debug, PartialEq, Eq)]
enum Agreement {
    Agree(u64),
    Differ(u64),
    /// Not all at one index (the cluster is busy), or none answered.
    Undecided,
}

fn agreement(answers: &[Result<proto::StateHashReply, Failure>]) -> Agreement {
    let replies: Vec<&proto::StateHashReply> = answers
        .iter()
        .filter_map(|answer| answer.as_ref().ok())
        .collect();
    let Some(first) = replies.first() else {
        return Agreement::Undecided;
    };
    if replies
        .iter()
        .any(|reply| reply.applied_index != first.applied_index)
    {
        return Agreement::Undecided;
    }
    if replies
        .iter()
        .all(|reply| reply.state_hash == first.state_hash)
    {
        Agreement::Agree(first.applied_index)
    } else {
        Agreement::Differ(first.applied_index)
    }
}

/// Every member's state hash; asked again (until the deadline) while they
/// are not all at one applied index.
async fn hash(admin: &Admin) -> Result<Success, Failure> {
    let leader = admin
        .cluster
        .leader_status(admin.deadline, STATUS_ATTEMPT_MAX)
        .await;
    let nodes: Vec<String> = match leader {
        Ok(status) => status
            .members
            .iter()
            .map(|member| member.client_addr.clone())
            .collect(),
        Err(_) => admin.endpoints.clone(),
    };
    let mut pause = Duration::from_millis(50);
    let (answers, verdict) = loop {
        let answers: Vec<Result<proto::StateHashReply, Failure>> =
            futures::future::join_all(nodes.iter().map(|node| {
                admin.at(node, |mut client| async move {
                    client.state_hash(proto::StateHashRequest {}).await
                })
            }))
            .await;
        let verdict = agreement(&answers);
        if verdict != Agreement::Undecided || Instant::now() >= admin.deadline {
            break (answers, verdict);
        }
        tokio::time::sleep(pause.min(admin.remaining())).await;
        pause = (pause * 2).min(BACKOFF_MAX);
    };
    let unreachable = answers.iter().filter(|answer| answer.is_err()).count();
    if unreachable == nodes.len() {
        return Err(admin.unreachable(None).await);
    }
    let mut lines = Vec::new();
    let mut objects = Vec::new();
    for (node, answer) in nodes.iter().zip(&answers) {
        match answer {
            Ok(reply) => {
                lines.push(format!(
                    "node {}  {node}  applied {}  hash {}",
                    reply.node_id, reply.applied_index, reply.state_hash
                ));
                objects.push(json!({
                    "endpoint": node,
                    "node_id": reply.node_id,
                    "applied_index": reply.applied_index,
                    "state_hash": reply.state_hash,
                    "cluster_time_ms": reply.cluster_time_ms,
                }));
            }
            Err(failure) => {
                lines.push(format!("{node}  unreachable"));
                objects.push(
                    json!({"endpoint": node, "reachable": false, "error": failure.message()}),
                );
            }
        }
    }
    match verdict {
        Agreement::Agree(index) if unreachable > 0 => Err(Failure::new(
            "incomplete",
            format!(
                "the nodes that answered agree at index {index}, but {unreachable} did not \
                 answer: {}",
                lines.join("; ")
            ),
        )
        .with("nodes", Json::Array(objects))),
        Agreement::Agree(index) => {
            lines.push(format!("agree at index {index}"));
            Ok(success(
                lines,
                [
                    ("agree", json!(true)),
                    ("applied_index", json!(index)),
                    ("nodes", Json::Array(objects)),
                ],
            ))
        }
        Agreement::Differ(index) => Err(Failure::new(
            "hash_mismatch",
            format!("replicas DIFFER at index {index}: {}", lines.join("; ")),
        )
        .with("nodes", Json::Array(objects))),
        Agreement::Undecided => Err(Failure::new(
            "undecided",
            format!(
                "the members that answered were not at one applied index before the deadline: {}",
                lines.join("; ")
            ),
        )
        .with("nodes", Json::Array(objects))),
    }
}

async fn local_get(admin: &Admin, key: &str, node: &str) -> Result<Success, Failure> {
    let request = proto::LocalReadRequest {
        key: key.as_bytes().to_vec(),
    };
    let reply = admin
        .at(node, |mut client| async move {
            client.local_read(request).await
        })
        .await?;
    let fields = |value: Json| {
        [
            ("key", json!(key)),
            ("node", json!(node)),
            ("applied_index", json!(reply.applied_index)),
            ("value", value),
        ]
    };
    match reply.value.clone().map(convert::value_from_proto) {
        Some(Ok(value)) => Ok(success(value_lines(&value), fields(value_json(&value)))),
        Some(Err(error)) => Err(Failure::new(
            "invalid_argument",
            format!("malformed value from {node}: {error}"),
        )),
        None => {
            let mut failure = Failure::new(
                "not_found",
                format!(
                    "key not found at {node} (applied index {})",
                    reply.applied_index
                ),
            );
            for (name, value) in fields(Json::Null) {
                failure = failure.with(name, value);
            }
            Err(failure)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};

    /// `oncekv admin ARGS…`, as the binary parses it.
    fn parse(args: &[&str]) -> Result<AdminCommand, clap::Error> {
        parse_with_common(args).map(|(command, _)| command)
    }

    fn parse_with_common(args: &[&str]) -> Result<(AdminCommand, CommonArgs), clap::Error> {
        let args = ["oncekv", "admin"].into_iter().chain(args.iter().copied());
        let cli = Cli::try_parse_checked(args)?;
        match cli.command {
            Command::Admin(admin) => Ok((admin.command, cli.common)),
            other => panic!("not an admin command: {other:?}"),
        }
    }

    /// The subcommands parse as documented; `config set` takes any subset.
    #[test]
    fn subcommands_parse() {
        assert!(matches!(
            parse(&["add-learner", "4", "127.0.0.1:7204", "127.0.0.1:7104"]),
            Ok(AdminCommand::AddLearner(args)) if args.id == 4 && args.client_addr == "127.0.0.1:7104"
        ));
        assert!(matches!(
            parse(&["replace", "--dead", "3", "--new", "4=127.0.0.1:7204/127.0.0.1:7104"]),
            Ok(AdminCommand::Replace(args)) if args.dead == 3
        ));
        let Ok(AdminCommand::Config(config)) = parse(&["config", "set", "--window", "8"]) else {
            panic!("config set parses");
        };
        let Some(ConfigAction::Set(set)) = config.action else {
            panic!("a set action");
        };
        assert_eq!((set.window, set.session_ttl_ms), (Some(8), None));
        assert!(matches!(parse(&["config"]), Ok(AdminCommand::Config(c)) if c.action.is_none()));
        assert!(parse(&["snapshot"]).is_err(), "--node is required");
        assert!(matches!(
            parse_with_common(&["local-get", "k", "--node", "127.0.0.1:7101", "--json"]),
            Ok((AdminCommand::LocalGet(args), common)) if common.json && args.key == "k"
        ));
    }

    /// The common flags mean the same before `admin`, between `admin` and
    /// its subcommand, and after it, for every admin subcommand (`config
    /// set` one level deeper included).
    #[test]
    fn common_flags_go_anywhere() {
        let expected = CommonArgs {
            endpoints: vec!["a:1".into()],
            json: true,
            timeout_ms: Some(700),
            ..CommonArgs::default()
        };
        let flags = ["--json", "--endpoints", "a:1", "--timeout-ms", "700"];
        for command in [
            &["members"][..],
            &["add-learner", "4", "127.0.0.1:7204", "127.0.0.1:7104"],
            &["promote", "4"],
            &["remove", "4"],
            &["replace", "--dead", "3", "--new", "4=p:1/c:1"],
            &["sessions"],
            &["session", "5"],
            &["expire", "5"],
            &["config"],
            &["config", "set", "--window", "8"],
            &["keys", "list"],
            &[
                "keys",
                "list",
                "--after-principal",
                "p",
                "--after-key",
                "k",
                "--limit",
                "3",
            ],
            &["keys", "show", "--principal", "p", "k"],
            &["keys", "forget", "k"],
            &["snapshot", "--node", "n:1"],
            &["hash"],
            &["local-get", "k", "--node", "n:1"],
        ] {
            let before: Vec<&str> = ["oncekv"]
                .iter()
                .chain(&flags)
                .chain(&["admin"])
                .chain(command)
                .copied()
                .collect();
            let middle: Vec<&str> = ["oncekv", "admin"]
                .iter()
                .chain(&flags)
                .chain(command)
                .copied()
                .collect();
            let after: Vec<&str> = ["oncekv", "admin"]
                .iter()
                .chain(command)
                .chain(&flags)
                .copied()
                .collect();
            for args in [before, middle, after] {
                let cli = Cli::try_parse_checked(&args)
                    .unwrap_or_else(|error| panic!("{args:?}: {error}"));
                assert!(matches!(cli.command, Command::Admin(_)), "{args:?}");
                assert_eq!(cli.common, expected, "{args:?}");
            }
        }
    }

    /// `--new` takes ID=PEER_ADDR/CLIENT_ADDR, nothing else.
    #[test]
    fn new_member_specs() {
        let member = NewMember::parse("4=127.0.0.1:7204/127.0.0.1:7104").unwrap();
        assert_eq!(
            (
                member.id,
                member.peer_addr.as_str(),
                member.client_addr.as_str()
            ),
            (4, "127.0.0.1:7204", "127.0.0.1:7104")
        );
        for bad in ["4", "x=a/b", "4=127.0.0.1:7204"] {
            assert!(NewMember::parse(bad).is_err(), "{bad}");
        }
    }

    /// Replicas agree only when all answered at one index with one hash.
    #[test]
    fn agreement_needs_one_index_and_one_hash() {
        let reply = |index, hash: &str| {
            Ok(proto::StateHashReply {
                applied_index: index,
                state_hash: hash.to_owned(),
                ..Default::default()
            })
        };
        assert_eq!(
            agreement(&[reply(5, "a"), reply(5, "a")]),
            Agreement::Agree(5)
        );
        assert_eq!(
            agreement(&[reply(5, "a"), reply(5, "b")]),
            Agreement::Differ(5)
        );
        assert_eq!(
            agreement(&[reply(5, "a"), reply(6, "a")]),
            Agreement::Undecided
        );
        assert_eq!(
            agreement(&[reply(5, "a"), Err(Failure::new("unavailable", "down"))]),
            Agreement::Agree(5),
            "judged among the nodes that answered (the command still fails)"
        );
        assert_eq!(agreement(&[]), Agreement::Undecided);
    }
}
