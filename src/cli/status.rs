//! `oncekv status`: asks every given node for its own view of the cluster (the
//! `Status` RPC, answered by every node, leader or not) and prints one line —
//! or one JSON object — per node, in the order given. It owns the per-call
//! deadline (`--timeout-ms`, default 2000 per node) and the presentation;
//! it never retries, and it judges nothing beyond "did this node answer"
//! (when none did, [`super::reach`] says why on stderr).

use std::io::Write;
use std::time::Duration;

use serde::Serialize;
use tonic::transport::Endpoint;

use super::CommonArgs;
use super::output::{EXIT_FAILED, EXIT_OK, EXIT_USAGE};
use super::reach::{self, Cause, cause_of};
use oncekv_wire::proto::client_client::ClientClient;
use oncekv_wire::proto::{Member, StatusReply, StatusRequest};

/// Default deadline of one `Status` call, connecting included.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(2);

/// `oncekv status`: prints every node's line (stdout) and returns the exit
/// code: 0 when at least one node answered; otherwise 1, with what happened
/// and what to do on stderr; 2 for unusable endpoints.
pub async fn run(common: &CommonArgs) -> i32 {
    let endpoints = match common.endpoints() {
        Ok(endpoints) => endpoints,
        Err(failure) => return failure.print_to_stderr(),
    };
    let timeout = common.timeout_or(STATUS_TIMEOUT.as_millis() as u64);
    let credentials = match common.credentials() {
        Ok(credentials) => credentials,
        Err(error) => {
            eprintln!("error: {error}");
            return EXIT_USAGE;
        }
    };
    let stdout = std::io::stdout();
    let answers = match status_with(
        &mut stdout.lock(),
        &endpoints,
        common.json,
        timeout,
        &credentials,
    )
    .await
    {
        Ok(answers) => answers,
        Err(error) => {
            eprintln!("error: cannot write the status: {error}");
            return EXIT_FAILED;
        }
    };
    if answers.iter().any(|(_, answer)| answer.is_ok()) {
        return EXIT_OK;
    }
    let diagnosis = reach::diagnose(&answers, None);
    eprintln!("error: {}", diagnosis.message);
    eprintln!("hint: {}", diagnosis.hint);
    EXIT_FAILED
}

/// Why one node's status could not be had.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("invalid endpoint: {0}")]
    InvalidEndpoint(String),
    #[error("{0}")]
    Connect(Cause),
    #[error("{:?}: {}", .0.code(), .0.message())]
    Rpc(tonic::Status),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// Asks every endpoint (concurrently, each within `timeout`) and prints one
/// line per node to `out`: a table row, or with `json` one JSON object.
/// Returns every endpoint's answer; an error only when `out` cannot be
/// written.
pub async fn status_to(
    out: &mut impl Write,
    endpoints: &[String],
    json: bool,
    timeout: Duration,
) -> std::io::Result<Vec<reach::Probe>> {
    let credentials = oncekv_client::credentials::Credentials::process_default();
    status_with(out, endpoints, json, timeout, &credentials).await
}

/// [`status_to`] with `credentials`.
pub async fn status_with(
    out: &mut impl Write,
    endpoints: &[String],
    json: bool,
    timeout: Duration,
    credentials: &oncekv_client::credentials::Credentials,
) -> std::io::Result<Vec<reach::Probe>> {
    let answers = futures::future::join_all(
        endpoints
            .iter()
            .map(|endpoint| query_with(endpoint, timeout, credentials)),
    )
    .await;
    for (endpoint, answer) in endpoints.iter().zip(&answers) {
        let line = if json {
            json_line(endpoint, answer)?
        } else {
            plain_line(endpoint, answer)
        };
        writeln!(out, "{line}")?;
    }
    out.flush()?;
    Ok(endpoints.iter().cloned().zip(answers).collect())
}

/// One `Status` call to `endpoint` (`host:port`, or a full `http://` URI),
/// connecting included, within `timeout`; over TLS when the command line
/// (`--ca`) or the `ONCEKV_CA` environment variable names the cluster CA
/// (see [`query_with`], `Credentials::process_default`).
pub async fn query(endpoint: &str, timeout: Duration) -> Result<StatusReply, QueryError> {
    let credentials = oncekv_client::credentials::Credentials::process_default();
    query_with(endpoint, timeout, &credentials).await
}

/// [`query`] with `credentials` (`Status` needs no identity, only the CA
/// of a node with TLS).
pub async fn query_with(
    endpoint: &str,
    timeout: Duration,
    credentials: &oncekv_client::credentials::Credentials,
) -> Result<StatusReply, QueryError> {
    // The one deadline is the timeout around the whole call: tonic's own
    // timeouts, racing it, would report the same silence as other errors.
    let endpoint = match endpoint.strip_prefix("http://") {
        Some(plain) => Endpoint::from_shared(format!("http://{plain}")),
        None if endpoint.contains("://") => Endpoint::from_shared(endpoint.to_owned()),
        None => credentials.endpoint(endpoint),
    }
    .map_err(|error| QueryError::InvalidEndpoint(error_chain(&error)))?;
    let call = async {
        let channel = endpoint
            .connect()
            .await
            .map_err(|error| match cause_of(&error) {
                Cause::TimedOut => QueryError::Timeout(timeout),
                cause => QueryError::Connect(cause),
            })?;
        let reply = ClientClient::new(channel)
            .status(StatusRequest {})
            .await
            .map_err(QueryError::Rpc)?;
        Ok(reply.into_inner())
    };
    tokio::time::timeout(timeout, call)
        .await
        .unwrap_or(Err(QueryError::Timeout(timeout)))
}

/// `node 1  127.0.0.1:7101  leader     term 3  last_log 42  applied 42  snapshot 0  cluster 0123abcd…`
/// or `127.0.0.1:7103  unreachable (<reason>)`.
pub fn plain_line(endpoint: &str, answer: &Result<StatusReply, QueryError>) -> String {
    match answer {
        Ok(reply) => format!(
            "node {}  {}  {:<9}  term {}  last_log {}  applied {}  snapshot {}  cluster {}",
            reply.node_id,
            endpoint,
            reply.role,
            reply.term,
            reply.last_log_index,
            reply.applied_index,
            reply.snapshot_index,
            short_cluster_id(&reply.cluster_id),
        ),
        Err(error) => format!("{endpoint}  unreachable ({error})"),
    }
}

/// One compact JSON object: the whole reply with `"reachable":true`, or
/// `{"endpoint":…,"reachable":false,"error":…}`. Byte fields are hex.
pub fn json_line(
    endpoint: &str,
    answer: &Result<StatusReply, QueryError>,
) -> serde_json::Result<String> {
    match answer {
        Ok(reply) => serde_json::to_string(&AnsweredJson::new(endpoint, reply)),
        Err(error) => serde_json::to_string(&UnreachableJson {
            endpoint,
            reachable: false,
            error: error.to_string(),
        }),
    }
}

#[derive(Serialize)]
struct AnsweredJson<'a> {
    endpoint: &'a str,
    reachable: bool,
    node_id: u64,
    role: &'a str,
    term: u64,
    leader_id: u64,
    leader_client_addr: &'a str,
    last_log_index: u64,
    applied_index: u64,
    snapshot_index: u64,
    purged_index: u64,
    cluster_id: String,
    state_hash: &'a str,
    state_hash_index: u64,
    cluster_time_ms: u64,
    sessions: u64,
    members: Vec<MemberJson<'a>>,
}

impl<'a> AnsweredJson<'a> {
    fn new(endpoint: &'a str, reply: &'a StatusReply) -> Self {
        AnsweredJson {
            endpoint,
            reachable: true,
            node_id: reply.node_id,
            role: &reply.role,
            term: reply.term,
            leader_id: reply.leader_id,
            leader_client_addr: &reply.leader_client_addr,
            last_log_index: reply.last_log_index,
            applied_index: reply.applied_index,
            snapshot_index: reply.snapshot_index,
            purged_index: reply.purged_index,
            cluster_id: hex(&reply.cluster_id),
            state_hash: &reply.state_hash,
            state_hash_index: reply.state_hash_index,
            cluster_time_ms: reply.cluster_time_ms,
            sessions: reply.sessions,
            members: reply.members.iter().map(MemberJson::from).collect(),
        }
    }
}

#[derive(Serialize)]
struct MemberJson<'a> {
    node_id: u64,
    peer_addr: &'a str,
    client_addr: &'a str,
    voter: bool,
}

impl<'a> From<&'a Member> for MemberJson<'a> {
    fn from(member: &'a Member) -> Self {
        MemberJson {
            node_id: member.node_id,
            peer_addr: &member.peer_addr,
            client_addr: &member.client_addr,
            voter: member.voter,
        }
    }
}

#[derive(Serialize)]
struct UnreachableJson<'a> {
    endpoint: &'a str,
    reachable: bool,
    error: String,
}

/// The first 4 bytes in hex and an ellipsis; `-` while the node has none.
fn short_cluster_id(cluster_id: &[u8]) -> String {
    match cluster_id.len() {
        0 => "-".to_owned(),
        1..=4 => hex(cluster_id),
        _ => format!("{}…", hex(&cluster_id[..4])),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// An error and its sources, joined by ": " (tonic's transport error says only
/// "transport error"; the cause, such as "Connection refused", is a source).
/// A cause that repeats the previous message word for word is left out.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut previous = text.clone();
    let mut source = error.source();
    while let Some(cause) = source {
        let message = cause.to_string();
        if message != previous {
            text.push_str(": ");
            text.push_str(&message);
        }
        previous = message;
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply() -> StatusReply {
        StatusReply {
            node_id: 1,
            role: "leader".to_owned(),
            term: 3,
            leader_id: 1,
            leader_client_addr: "127.0.0.1:7101".to_owned(),
            last_log_index: 42,
            applied_index: 41,
            snapshot_index: 0,
            cluster_id: (0u8..16).map(|byte| byte * 0x11).collect(),
            members: vec![Member {
                node_id: 1,
                peer_addr: "127.0.0.1:7201".to_owned(),
                client_addr: "127.0.0.1:7101".to_owned(),
                voter: true,
            }],
            ..StatusReply::default()
        }
    }

    /// A node that answered is one aligned table row.
    #[test]
    fn an_answer_is_one_table_row() {
        assert_eq!(
            plain_line("127.0.0.1:7101", &Ok(reply())),
            "node 1  127.0.0.1:7101  leader     term 3  last_log 42  applied 41  \
             snapshot 0  cluster 00112233…"
        );
        let fresh = StatusReply {
            role: "candidate".to_owned(),
            ..StatusReply::default()
        };
        assert!(
            plain_line("h:1", &Ok(fresh))
                .ends_with("candidate  term 0  last_log 0  applied 0  snapshot 0  cluster -")
        );
    }

    /// A node that did not answer shows why.
    #[test]
    fn a_failure_shows_its_reason() {
        let answer = Err(QueryError::Timeout(STATUS_TIMEOUT));
        assert_eq!(
            plain_line("127.0.0.1:7103", &answer),
            "127.0.0.1:7103  unreachable (no answer within 2s)"
        );
        let json: serde_json::Value =
            serde_json::from_str(&json_line("127.0.0.1:7103", &answer).unwrap()).unwrap();
        assert_eq!(json["reachable"], false);
        assert_eq!(json["error"], "no answer within 2s");
    }

    /// The JSON line is one object holding the whole reply, bytes in hex.
    #[test]
    fn an_answer_is_one_json_object() {
        let line = json_line("127.0.0.1:7101", &Ok(reply())).unwrap();
        assert!(!line.contains('\n'));
        let json: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(json["reachable"], true);
        assert_eq!(json["node_id"], 1);
        assert_eq!(json["role"], "leader");
        assert_eq!(json["cluster_id"], "00112233445566778899aabbccddeeff");
        assert_eq!(json["members"][0]["peer_addr"], "127.0.0.1:7201");
    }

    /// A port nobody listens on is reported unreachable, with the cause.
    #[tokio::test]
    async fn nobody_listening_means_no_answer() {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let mut out = Vec::new();
        let answers = status_to(
            &mut out,
            &[format!("127.0.0.1:{port}")],
            false,
            STATUS_TIMEOUT,
        )
        .await
        .unwrap();
        assert!(answers.iter().all(|(_, answer)| answer.is_err()));
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            format!("127.0.0.1:{port}  unreachable (connection refused)\n")
        );
    }
}
