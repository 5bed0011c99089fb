//! Why a command could not get through to the cluster, told to people. It
//! asks each endpoint for its `Status` once (a probe, within
//! [`PROBE_TIMEOUT_MAX`]) and turns what it finds — connection refused, no
//! answer, unknown host, no leader, not initialised, a leader that answers
//! but too slowly — into one line of what happened and one of what to do,
//! with the per-endpoint findings for `--json`. It owns that wording and
//! the classification of transport errors; it decides nothing about the
//! command (exit codes and outcomes stay the caller's), and never retries.

use std::fmt;
use std::time::Duration;

use serde_json::{Value as Json, json};

use super::status::{QueryError, query};
use oncekv_wire::proto::StatusReply;

/// Longest wait for one endpoint's probe.
pub const PROBE_TIMEOUT_MAX: Duration = Duration::from_secs(1);
/// Shortest wait for one endpoint's probe, however short the command's own
/// deadline: a node that answers must not be reported silent.
pub const PROBE_TIMEOUT_MIN: Duration = Duration::from_millis(250);

/// A probe's wait for a command whose deadline is `timeout`.
pub fn probe_timeout(timeout: Duration) -> Duration {
    timeout.clamp(PROBE_TIMEOUT_MIN, PROBE_TIMEOUT_MAX)
}

/// What to do when nothing can be reached.
const START_HINT: &str = "is the cluster running? Start the local one with \
`scripts/cluster.sh start`, or point --endpoints at its nodes (HOST:PORT,...); a \
cluster with TLS needs its CA (--ca or ONCEKV_CA)";

/// Why one endpoint could not be talked to, below our service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cause {
    /// Nothing listens there.
    Refused,
    /// The connection attempt timed out.
    TimedOut,
    /// The host name does not resolve.
    UnknownHost,
    /// Anything else: the innermost error's text.
    Other(String),
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::Refused => f.write_str("connection refused"),
            Cause::TimedOut => f.write_str("connection timed out"),
            Cause::UnknownHost => f.write_str("unknown host"),
            Cause::Other(text) => f.write_str(text),
        }
    }
}

/// The cause of a transport failure, from the error's source chain (tonic
/// says only "transport error"; the io error under it says what happened).
pub fn cause_of(error: &(dyn std::error::Error + 'static)) -> Cause {
    let mut innermost = error.to_string();
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::ConnectionRefused => return Cause::Refused,
                std::io::ErrorKind::TimedOut => return Cause::TimedOut,
                _ => {}
            }
        }
        let text = error.to_string();
        if text.starts_with("dns error") {
            return Cause::UnknownHost;
        }
        if !text.is_empty() {
            innermost = text;
        }
        current = error.source();
    }
    Cause::Other(innermost)
}

/// One endpoint and what it said.
pub type Probe = (String, Result<StatusReply, QueryError>);

/// Asks every endpoint for its `Status` (concurrently, each within
/// [`probe_timeout`] of the command's `timeout`); a leader address the
/// nodes name that is not among them is asked too.
pub async fn probe(endpoints: &[String], timeout: Duration) -> Vec<Probe> {
    let timeout = probe_timeout(timeout);
    let ask = |endpoints: Vec<String>| async move {
        let answers = futures::future::join_all(endpoints.iter().map(|e| query(e, timeout))).await;
        endpoints.into_iter().zip(answers).collect::<Vec<Probe>>()
    };
    let mut probes = ask(endpoints.to_vec()).await;
    let hinted: Vec<String> = probes
        .iter()
        .filter_map(|(_, answer)| answer.as_ref().ok())
        .map(|reply| reply.leader_client_addr.clone())
        .filter(|hint| !hint.is_empty() && !endpoints.contains(hint))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if !hinted.is_empty() {
        probes.extend(ask(hinted).await);
    }
    probes
}

/// What went wrong, for people: `message` says what happened, `hint` what
/// to do; `nodes` is what each endpoint said (for `--json`).
#[derive(Debug, Clone, PartialEq)]
pub struct Diagnosis {
    pub message: String,
    pub hint: String,
    pub nodes: Vec<Json>,
}

/// Explains why a command did not get through, from the endpoints'
/// answers. `detail` is what the failed call itself last saw (shown only
/// when the cluster looks healthy, so that the line still says something).
pub fn diagnose(probes: &[Probe], detail: Option<&str>) -> Diagnosis {
    // An endpoint asked twice (given, and named as leader) counts once.
    let mut seen = std::collections::BTreeSet::new();
    let probes: Vec<&Probe> = probes
        .iter()
        .filter(|(endpoint, _)| seen.insert(endpoint.as_str()))
        .collect();
    let probes = probes.as_slice();
    let nodes = probes
        .iter()
        .map(|(endpoint, answer)| node_json(endpoint, answer))
        .collect();
    let answered: Vec<(&str, &StatusReply)> = probes
        .iter()
        .filter_map(|(endpoint, answer)| Some((endpoint.as_str(), answer.as_ref().ok()?)))
        .collect();
    let unreachable = unreachable_groups(probes);
    let (message, hint) = if answered.is_empty() {
        nothing_answered(&unreachable)
    } else if let Some((endpoint, leader)) =
        answered.iter().find(|(_, reply)| reply.role == "leader")
    {
        slow_leader(endpoint, leader, detail)
    } else if answered
        .iter()
        .all(|(_, reply)| reply.cluster_id.is_empty() && reply.leader_id == 0)
    {
        not_initialised(&answered, &unreachable)
    } else if let Some(hint) = answered
        .iter()
        .map(|(_, reply)| reply)
        .find(|reply| !reply.leader_client_addr.is_empty())
    {
        unreachable_leader(probes, hint)
    } else {
        no_leader(&answered, &unreachable)
    };
    Diagnosis {
        message,
        hint,
        nodes,
    }
}

/// No endpoint answered: (what happened, what to do).
fn nothing_answered(unreachable: &[(String, String)]) -> (String, String) {
    let message = match unreachable {
        [(endpoints, cause)] => {
            format!("cannot reach the cluster at {endpoints}: {cause}")
        }
        groups => format!("cannot reach the cluster: {}", join_groups(groups)),
    };
    let hint = if unreachable
        .iter()
        .all(|(_, cause)| *cause == Cause::UnknownHost.to_string())
    {
        "check the host names in --endpoints (HOST:PORT,...)"
    } else {
        START_HINT
    };
    (message, hint.to_owned())
}

/// The leader (at `endpoint`) answers its `Status`, but the call did not
/// get through in time (`detail`: what the call saw).
fn slow_leader(endpoint: &str, leader: &StatusReply, detail: Option<&str>) -> (String, String) {
    let detail = detail.map(plain_reason).filter(|detail| !detail.is_empty());
    (
        format!(
            "the cluster did not answer in time{}; its leader is node {} at {endpoint}",
            detail.map(|d| format!(" ({d})")).unwrap_or_default(),
            leader.node_id,
        ),
        "the cluster may be overloaded or changing leader: retry, or allow more time \
         with --timeout-ms"
            .to_owned(),
    )
}

/// The verb agreeing with `count` subjects.
fn verb(count: usize, one: &'static str, more: &'static str) -> &'static str {
    if count == 1 { one } else { more }
}

/// Nodes answer, but none knows a cluster.
fn not_initialised(
    answered: &[(&str, &StatusReply)],
    unreachable: &[(String, String)],
) -> (String, String) {
    (
        format!(
            "the cluster is not initialised: {} {} but {} no cluster{}",
            answered_list(answered),
            verb(answered.len(), "answers", "answer"),
            verb(answered.len(), "knows", "know"),
            unreachable_suffix(unreachable),
        ),
        "start one node with --initialize and every member's --peer (`scripts/cluster.sh \
         start` does), or point --endpoints at an initialised cluster"
            .to_owned(),
    )
}

/// The nodes name a leader (`hint` is a reply naming it) that did not
/// answer as one.
fn unreachable_leader(probes: &[&Probe], hint: &StatusReply) -> (String, String) {
    let said = probes
        .iter()
        .find(|(endpoint, _)| *endpoint == hint.leader_client_addr)
        .map(|(_, answer)| match answer {
            Err(error) => error.to_string(),
            Ok(reply) => format!("it answers as {}", reply.role),
        })
        .unwrap_or_else(|| "it was not asked".to_owned());
    (
        format!(
            "the nodes name node {} at {} as leader, but {said}",
            hint.leader_id, hint.leader_client_addr
        ),
        "it may have just stopped (a new leader takes a second or two: retry), or its \
         announced client address is not reachable from here (see `oncekv status`)"
            .to_owned(),
    )
}

/// Nodes of a cluster answer, and none knows a leader.
fn no_leader(
    answered: &[(&str, &StatusReply)],
    unreachable: &[(String, String)],
) -> (String, String) {
    (
        format!(
            "the cluster has no leader: {} {}{}",
            answered_list(answered),
            verb(answered.len(), "answers", "answer"),
            unreachable_suffix(unreachable),
        ),
        "an election may be under way, or too few voters are up for a majority: check \
         `oncekv status`, start the stopped nodes (`scripts/cluster.sh start` for the \
         local cluster) and retry"
            .to_owned(),
    )
}

/// The unreachable endpoints, grouped by cause (in order of first mention).
fn unreachable_groups(probes: &[&Probe]) -> Vec<(String, String)> {
    let mut groups: Vec<(Vec<&str>, String)> = Vec::new();
    for (endpoint, answer) in probes {
        let Err(error) = answer else { continue };
        let cause = error.to_string();
        match groups.iter_mut().find(|(_, known)| *known == cause) {
            Some((endpoints, _)) => endpoints.push(endpoint),
            None => groups.push((vec![endpoint], cause)),
        }
    }
    groups
        .into_iter()
        .map(|(endpoints, cause)| (endpoints.join(", "), cause))
        .collect()
}

fn join_groups(groups: &[(String, String)]) -> String {
    groups
        .iter()
        .map(|(endpoints, cause)| format!("{endpoints}: {cause}"))
        .collect::<Vec<_>>()
        .join("; ")
}

fn unreachable_suffix(groups: &[(String, String)]) -> String {
    if groups.is_empty() {
        String::new()
    } else {
        format!("; {}", join_groups(groups))
    }
}

/// `node 1 (follower) at 127.0.0.1:7101, node 2 (candidate) at …`.
fn answered_list(answered: &[(&str, &StatusReply)]) -> String {
    answered
        .iter()
        .map(|(endpoint, reply)| format!("node {} ({}) at {endpoint}", reply.node_id, reply.role))
        .collect::<Vec<_>>()
        .join(", ")
}

fn node_json(endpoint: &str, answer: &Result<StatusReply, QueryError>) -> Json {
    match answer {
        Ok(reply) => json!({
            "endpoint": endpoint,
            "reachable": true,
            "node_id": reply.node_id,
            "role": reply.role,
            "leader_id": reply.leader_id,
        }),
        Err(error) => json!({
            "endpoint": endpoint,
            "reachable": false,
            "error": error.to_string(),
        }),
    }
}

/// A reason from the client library, on one line: a gRPC status written out
/// whole (`code: '…', message: "…", source: …`) becomes its message.
pub fn plain_reason(text: &str) -> String {
    let text = text.strip_prefix("cluster unavailable: ").unwrap_or(text);
    if text.starts_with("code: '")
        && let Some(start) = text.find("message: \"")
    {
        let rest = &text[start + "message: \"".len()..];
        if let Some(end) = rest.find('"') {
            return rest[..end].to_owned();
        }
    }
    text.lines().next().unwrap_or_default().trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(endpoint: &str) -> Probe {
        (
            endpoint.to_owned(),
            Err(QueryError::Connect(Cause::Refused)),
        )
    }

    fn answer(endpoint: &str, node_id: u64, role: &str, leader: Option<(u64, &str)>) -> Probe {
        (
            endpoint.to_owned(),
            Ok(StatusReply {
                node_id,
                role: role.to_owned(),
                cluster_id: vec![7; 16],
                leader_id: leader.map_or(0, |(id, _)| id),
                leader_client_addr: leader.map_or(String::new(), |(_, addr)| addr.to_owned()),
                ..StatusReply::default()
            }),
        )
    }

    /// Nothing listening anywhere: one line naming every endpoint and the
    /// cause, and the hint to start the cluster.
    #[test]
    fn nothing_listening() {
        let diagnosis = diagnose(&[refused("h:1"), refused("h:2")], Some("tcp connect error"));
        assert_eq!(
            diagnosis.message,
            "cannot reach the cluster at h:1, h:2: connection refused"
        );
        assert!(diagnosis.hint.contains("scripts/cluster.sh start"));
        assert_eq!(diagnosis.nodes[1]["error"], "connection refused");
        assert_eq!(diagnosis.nodes[1]["reachable"], false);
        let mixed = diagnose(
            &[
                refused("h:1"),
                (
                    "h:2".to_owned(),
                    Err(QueryError::Timeout(Duration::from_secs(1))),
                ),
            ],
            None,
        );
        assert_eq!(
            mixed.message,
            "cannot reach the cluster: h:1: connection refused; h:2: no answer within 1s"
        );
    }

    /// Nodes that answer without a leader: who answered, as what, and who
    /// did not.
    #[test]
    fn no_leader() {
        let diagnosis = diagnose(
            &[
                answer("h:1", 1, "follower", None),
                answer("h:2", 2, "candidate", None),
                refused("h:3"),
            ],
            None,
        );
        assert_eq!(
            diagnosis.message,
            "the cluster has no leader: node 1 (follower) at h:1, node 2 (candidate) at h:2 \
             answer; h:3: connection refused"
        );
        assert!(diagnosis.hint.contains("majority"), "{}", diagnosis.hint);
    }

    /// A named leader that does not answer is named.
    #[test]
    fn unreachable_leader() {
        let diagnosis = diagnose(
            &[
                answer("h:1", 1, "follower", Some((3, "h:3"))),
                refused("h:3"),
            ],
            None,
        );
        assert_eq!(
            diagnosis.message,
            "the nodes name node 3 at h:3 as leader, but connection refused"
        );
    }

    /// A leader that answers: the call was too slow, and what it last saw.
    #[test]
    fn slow_leader() {
        let diagnosis = diagnose(
            &[answer("h:1", 1, "leader", Some((1, "h:1")))],
            Some(
                "code: 'The operation was cancelled', message: \"attempt timed out\", \
                 source: None",
            ),
        );
        assert_eq!(
            diagnosis.message,
            "the cluster did not answer in time (attempt timed out); its leader is node 1 at h:1"
        );
        assert!(diagnosis.hint.contains("--timeout-ms"));
    }

    /// Nodes without a cluster id and without a leader are not initialised.
    #[test]
    fn not_initialised() {
        let (endpoint, answer) = answer("h:1", 1, "learner", None);
        let fresh = answer.map(|reply| StatusReply {
            cluster_id: Vec::new(),
            ..reply
        });
        let diagnosis = diagnose(&[(endpoint, fresh)], None);
        assert!(
            diagnosis
                .message
                .starts_with("the cluster is not initialised"),
            "{}",
            diagnosis.message
        );
        assert!(diagnosis.hint.contains("--initialize"));
    }

    /// A gRPC status written out whole shrinks to its message; other text
    /// keeps its first line.
    #[test]
    fn reasons_are_one_line() {
        assert_eq!(
            plain_reason(
                "cluster unavailable: code: 'The service is currently unavailable', message: \
                 \"tcp connect error\", source: tonic::transport::Error(Transport, ...)"
            ),
            "tcp connect error"
        );
        assert_eq!(plain_reason("not the leader\nmore"), "not the leader");
    }

    /// The cause is found under tonic's "transport error": refused, unknown
    /// host, or the innermost text.
    #[tokio::test]
    async fn causes_come_from_the_source_chain() {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let error = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .unwrap()
            .connect()
            .await
            .unwrap_err();
        assert_eq!(cause_of(&error), Cause::Refused);
        let io = std::io::Error::other("something odd");
        assert_eq!(cause_of(&io), Cause::Other("something odd".to_owned()));
    }
}
