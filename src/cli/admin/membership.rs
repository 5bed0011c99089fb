//! `oncekv admin members | add-learner | promote | remove | replace`: the
//! membership. It owns the arguments (a new node's id and addresses) and
//! composing the multi-step changes from single Admin RPCs — `promote` is
//! "voters + ID", `replace` is add-learner, wait until caught up, "voters −
//! dead + new", remove dead — each step run on the leader by
//! `Admin::on_leader` (a change whose outcome is unknown at the deadline
//! exits 3). Whether a change is safe is the cluster's to decide.

use std::collections::BTreeSet;

use serde_json::{Value as Json, json};

use oncekv_wire::proto::{self, Member, StatusReply};

use super::cluster::Admin;
use crate::cli::output::{Failure, Success, success};

/// Default wait for a new learner to catch up.
const CATCH_UP_TIMEOUT_MS: u64 = 60_000;

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

pub(super) async fn members(admin: &Admin) -> Result<Success, Failure> {
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

/// `add-learner`: adds the node and waits until it caught up.
pub(super) async fn add_learner(admin: &Admin, args: &AddLearnerArgs) -> Result<Success, Failure> {
    let member = NewMember::new(args.id, &args.peer_addr, &args.client_addr);
    learner(admin, &member, args.catch_up_timeout_ms).await
}

/// Adds `member` as a learner and waits until it caught up.
async fn learner(
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

pub(super) async fn promote(admin: &Admin, id: u64) -> Result<Success, Failure> {
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

pub(super) async fn remove(admin: &Admin, id: u64) -> Result<Success, Failure> {
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

pub(super) async fn replace(admin: &Admin, args: &ReplaceArgs) -> Result<Success, Failure> {
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
    let added = learner(admin, &new, args.catch_up_timeout_ms).await?;
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
