//! `oncekv admin snapshot | hash | local-get`: one node's or every
//! member's applied state — make a node build a snapshot now, compare every
//! member's state hash (asked again until they are at one applied index, or
//! the deadline), read a key from one node's applied state (no read index:
//! it may be stale). It owns the arguments and the presentation, and
//! judging whether the hashes agree; it changes nothing but the snapshot
//! it asks for.

use std::time::Duration;

use serde_json::{Value as Json, json};

use oncekv_wire::convert;
use oncekv_wire::proto;

use super::cluster::Admin;
use crate::cli::output::{Failure, Success, success};
use crate::cli::values::{value_json, value_lines};

/// Longest pause between rounds of `hash`.
const BACKOFF_MAX: Duration = Duration::from_millis(500);

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

/// `snapshot --node ADDR`: that node builds a snapshot now.
pub(super) async fn snapshot(admin: &Admin, node: &str) -> Result<Success, Failure> {
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
pub(super) async fn hash(admin: &Admin) -> Result<Success, Failure> {
    let nodes = admin.member_addrs().await;
    let (answers, verdict) = ask_until_decided(admin, &nodes).await;
    let unreachable = answers.iter().filter(|answer| answer.is_err()).count();
    if unreachable == nodes.len() {
        return Err(admin.unreachable(None).await);
    }
    hash_report(&nodes, &answers, verdict, unreachable)
}

/// Asks every node in `nodes` for its state hash, in rounds with a growing
/// pause, until they agree or differ at one index or the deadline passes.
async fn ask_until_decided(
    admin: &Admin,
    nodes: &[String],
) -> (Vec<Result<proto::StateHashReply, Failure>>, Agreement) {
    let mut pause = Duration::from_millis(50);
    loop {
        let answers: Vec<Result<proto::StateHashReply, Failure>> =
            futures::future::join_all(nodes.iter().map(|node| {
                admin.at(node, |mut client| async move {
                    client.state_hash(proto::StateHashRequest {}).await
                })
            }))
            .await;
        let verdict = agreement(&answers);
        if verdict != Agreement::Undecided || admin.past_deadline() {
            return (answers, verdict);
        }
        tokio::time::sleep(pause.min(admin.remaining())).await;
        pause = (pause * 2).min(BACKOFF_MAX);
    }
}

/// What `hash` prints: one line (and object) per node, then the verdict —
/// a success only when every node answered and all agree.
fn hash_report(
    nodes: &[String],
    answers: &[Result<proto::StateHashReply, Failure>],
    verdict: Agreement,
    unreachable: usize,
) -> Result<Success, Failure> {
    let mut lines = Vec::new();
    let mut objects = Vec::new();
    for (node, answer) in nodes.iter().zip(answers) {
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

/// `local-get KEY --node ADDR`: KEY in that node's applied state.
pub(super) async fn local_get(admin: &Admin, key: &str, node: &str) -> Result<Success, Failure> {
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
