//! `oncekv sessions`: every endpoint's `Status` (asked concurrently, once
//! each) summarised one line per node — id, endpoint, role, applied index,
//! live sessions, cluster time — or as the `"nodes"` of one JSON object.
//! It succeeds when any node answered; when none did, [`crate::cli::reach`]
//! says why. It only reads and presents; it calls no key and retries
//! nothing.

use std::time::Duration;

use serde_json::{Value as Json, json};

use oncekv_wire::proto::StatusReply;

use crate::cli::output::{Failure, Success, success};
use crate::cli::reach;
use crate::cli::status::{QueryError, query};

/// `oncekv sessions`: every endpoint's `Status`, asked concurrently.
pub(super) async fn sessions(endpoints: &[String], timeout: Duration) -> Result<Success, Failure> {
    let answers =
        futures::future::join_all(endpoints.iter().map(|endpoint| query(endpoint, timeout))).await;
    let lines = endpoints
        .iter()
        .zip(&answers)
        .map(|(endpoint, answer)| sessions_line(endpoint, answer))
        .collect::<Vec<_>>();
    let nodes: Vec<Json> = endpoints
        .iter()
        .zip(&answers)
        .map(|(endpoint, answer)| sessions_json(endpoint, answer))
        .collect();
    if answers.iter().any(Result::is_ok) {
        Ok(success(lines, [("nodes", Json::Array(nodes))]))
    } else {
        let probes: Vec<reach::Probe> = endpoints.iter().cloned().zip(answers).collect();
        Err(Failure::unreachable(reach::diagnose(&probes, None)))
    }
}

/// `node 1  127.0.0.1:7101  leader     applied 42  sessions 3  cluster_time 12.345s`
/// or `127.0.0.1:7103  unreachable (<reason>)`.
fn sessions_line(endpoint: &str, answer: &Result<StatusReply, QueryError>) -> String {
    match answer {
        Ok(reply) => format!(
            "node {}  {}  {:<9}  applied {}  sessions {}  cluster_time {}.{:03}s",
            reply.node_id,
            endpoint,
            reply.role,
            reply.applied_index,
            reply.sessions,
            reply.cluster_time_ms / 1000,
            reply.cluster_time_ms % 1000,
        ),
        Err(error) => format!("{endpoint}  unreachable ({error})"),
    }
}

fn sessions_json(endpoint: &str, answer: &Result<StatusReply, QueryError>) -> Json {
    match answer {
        Ok(reply) => json!({
            "endpoint": endpoint,
            "reachable": true,
            "node_id": reply.node_id,
            "role": reply.role,
            "applied_index": reply.applied_index,
            "sessions": reply.sessions,
            "cluster_time_ms": reply.cluster_time_ms,
        }),
        Err(error) => json!({
            "endpoint": endpoint,
            "reachable": false,
            "error": error.to_string(),
        }),
    }
}
