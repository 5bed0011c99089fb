//! Observability of real nodes: a scripted scenario (register, new
//! executes, retries, seq conflicts, a discarded request) moves the outcome
//! counters of every replica by exactly those numbers; the Raft, session and
//! state-hash gauges agree across replicas; the gRPC health service says
//! SERVING and server reflection lists the client service. Also: every
//! query of the Grafana dashboard names a metric the node exports.

mod support;

use oncekv_core::{Command, CommandResult};
use oncekv_wire::proto::Reason;
use std::collections::BTreeMap;
use std::time::Duration;
use support::cluster::{Cluster, NODES};
use support::metrics::{counter, labels_of, sample};
use support::raw::{raw_client, reason};
use tokio::time::Instant;

const CALL_DEADLINE: Duration = Duration::from_secs(60);
const SCRAPE_DEADLINE: Duration = Duration::from_secs(60);

fn incr(key: &str) -> Command {
    Command::Increment {
        key: key.as_bytes().to_vec(),
        delta: 1,
    }
}

/// Every node's exposition, once all of them have applied at least
/// `applied_index` and report the same state hash, of the index each has
/// applied (a node hashes in the background at most once a second; the
/// scrapes that ask make it catch up).
async fn converged_scrapes(cluster: &Cluster, applied_index: u64) -> BTreeMap<u64, String> {
    let deadline = Instant::now() + SCRAPE_DEADLINE;
    loop {
        let mut scrapes = BTreeMap::new();
        for node in NODES {
            if let Ok(text) = cluster.scrape(node).await {
                scrapes.insert(node, text);
            }
        }
        let hashes: Vec<_> = scrapes
            .values()
            .map(|text| labels_of(text, "oncekv_state_hash_info"))
            .collect();
        let applied: Vec<f64> = scrapes
            .values()
            .filter_map(|text| sample(text, "oncekv_raft_applied_index", &[]))
            .collect();
        let caught_up = scrapes.values().all(|text| {
            let hash_index = labels_of(text, "oncekv_state_hash_info")
                .and_then(|labels| {
                    labels
                        .into_iter()
                        .find_map(|(key, value)| (key == "applied_index").then_some(value))
                })
                .and_then(|index| index.parse::<f64>().ok());
            hash_index.is_some() && hash_index == sample(text, "oncekv_raft_applied_index", &[])
        });
        if scrapes.len() == NODES.len()
            && applied.iter().all(|index| *index >= applied_index as f64)
            && caught_up
            && hashes
                .iter()
                .all(|hash| hash.is_some() && *hash == hashes[0])
        {
            return scrapes;
        }
        assert!(
            Instant::now() < deadline,
            "[{}] replicas did not converge at index {applied_index}: {hashes:?}",
            cluster.name()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn outcome(text: &str, op: &str, outcome: &str) -> f64 {
    counter(
        text,
        "oncekv_registry_outcomes_total",
        &[("op", op), ("outcome", outcome)],
    )
}

/// The scripted scenario moves the outcome counters of every replica by
/// exactly its numbers, and the gauges agree across replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcome_counters_match_a_scripted_scenario() {
    const NEW: u64 = 5;
    const RETRIES: u64 = 3;
    const CONFLICTS: u64 = 2;

    let cluster = Cluster::start("metrics").await;
    let raw = raw_client(&cluster).await;
    let before = converged_scrapes(&cluster, 1).await;

    let session = raw.register(0xfeed).await;
    let client = session.client_id;
    let mut last_index = 0;
    for seq in 1..=NEW {
        let request = raw.execute_request(client, seq, seq, &incr("n"));
        let (result, duplicate) = raw.execute(CALL_DEADLINE, &request).await.unwrap();
        assert_eq!(result, CommandResult::Incremented { value: seq as i64 });
        assert!(!duplicate);
    }
    for _ in 0..RETRIES {
        let request = raw.execute_request(client, NEW, NEW, &incr("n"));
        let (_, duplicate) = raw.execute(CALL_DEADLINE, &request).await.unwrap();
        assert!(duplicate);
    }
    for _ in 0..CONFLICTS {
        let request = raw.execute_request(client, NEW, NEW, &incr("other"));
        let error = raw.execute(CALL_DEADLINE, &request).await.unwrap_err();
        assert_eq!(reason(&error), Some(Reason::SeqConflict));
    }
    // Seq NEW - 1 lies below the floor (NEW) the requests above raised.
    let request = raw.execute_request(client, NEW - 1, NEW - 1, &incr("n"));
    let error = raw.execute(CALL_DEADLINE, &request).await.unwrap_err();
    assert_eq!(reason(&error), Some(Reason::ResponseDiscarded));
    for node in NODES {
        if let Ok(status) = cluster.status(node).await {
            last_index = last_index.max(status.applied_index);
        }
    }

    let after = converged_scrapes(&cluster, last_index).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
    for node in NODES {
        let (b, a) = (&before[&node], &after[&node]);
        let delta = |op: &str, result: &str| outcome(a, op, result) - outcome(b, op, result);
        let context = format!("node {node}:\n{a}");
        assert_eq!(delta("register", "applied"), 1.0, "{context}");
        assert_eq!(delta("execute", "applied"), NEW as f64, "{context}");
        assert_eq!(delta("execute", "duplicate"), RETRIES as f64, "{context}");
        assert_eq!(delta("execute", "conflict"), CONFLICTS as f64, "{context}");
        assert_eq!(delta("execute", "discarded"), 1.0, "{context}");
        for other in ["expired", "wrong_cluster", "rejected_by_limit", "invalid"] {
            assert_eq!(delta("execute", other), 0.0, "{other} {context}");
        }
        assert_eq!(sample(a, "oncekv_sessions_live", &[]), Some(1.0));
        // The floor trimmed every cached response but the last.
        assert_eq!(sample(a, "oncekv_cached_responses", &[]), Some(1.0));
        assert!(sample(a, "oncekv_cached_responses_bytes", &[]).unwrap() > 0.0);
        assert_eq!(
            counter(a, "oncekv_sessions_expired_total", &[]),
            counter(b, "oncekv_sessions_expired_total", &[])
        );
        let leading = if node == leader { 1.0 } else { 0.0 };
        assert_eq!(
            sample(a, "oncekv_raft_is_leader", &[]),
            Some(leading),
            "{context}"
        );
        assert_eq!(sample(a, "oncekv_raft_leader_id", &[]), Some(leader as f64));
        assert!(sample(a, "oncekv_raft_term", &[]).unwrap() >= 1.0);
        let applied = sample(a, "oncekv_raft_applied_index", &[]).unwrap();
        assert!(sample(a, "oncekv_raft_commit_index", &[]).unwrap() >= applied);
        assert!(sample(a, "oncekv_raft_last_log_index", &[]).unwrap() >= applied);
        assert!(counter(a, "oncekv_entries_applied_total", &[]) >= applied);
        assert!(sample(a, "oncekv_state_hash_prefix", &[]).unwrap() > 0.0);
        assert_eq!(sample(a, "oncekv_pending_proposals", &[]), Some(0.0));
        assert!(sample(a, "oncekv_build_info", &[("node_id", &node.to_string())]).is_some());
        assert!(sample(a, "oncekv_process_resident_memory_bytes", &[]).unwrap() > 0.0);
    }
    let leader_text = &after[&leader];
    assert!(counter(leader_text, "oncekv_raft_became_leader_total", &[]) >= 1.0);
    // Every reply of the scenario, wherever it was answered.
    let replies = |result: &str| -> f64 {
        NODES
            .iter()
            .map(|node| {
                let labels = [("method", "Execute"), ("result", result)];
                counter(&after[node], "oncekv_client_replies_total", &labels)
                    - counter(&before[node], "oncekv_client_replies_total", &labels)
            })
            .sum()
    };
    assert_eq!(replies("ok"), (NEW + RETRIES) as f64);
    assert_eq!(replies("seq_conflict"), CONFLICTS as f64);
    assert_eq!(replies("response_discarded"), 1.0);
    let proposals: f64 = NODES
        .iter()
        .map(|node| {
            counter(&after[node], "oncekv_proposal_duration_seconds_count", &[])
                - counter(&before[node], "oncekv_proposal_duration_seconds_count", &[])
        })
        .sum();
    assert!(proposals >= (1 + NEW + RETRIES + CONFLICTS + 1) as f64);
}

/// The health service says SERVING on every node of a running cluster, and
/// server reflection (v1 and v1alpha) lists the client and health services.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_serving_and_reflection_lists_services() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

    let cluster = Cluster::start("health").await;
    for node in NODES {
        let channel = tonic::transport::Endpoint::from_shared(format!(
            "http://{}",
            cluster.client_addr(node)
        ))
        .unwrap()
        .connect_lazy();
        let mut health = HealthClient::new(channel.clone());
        let deadline = Instant::now() + Duration::from_secs(60);
        for service in ["", "oncekv.v1.Client"] {
            loop {
                let reply = health
                    .check(HealthCheckRequest {
                        service: service.into(),
                    })
                    .await
                    .map(|reply| reply.into_inner().status());
                if reply.as_ref().ok() == Some(&ServingStatus::Serving) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "node {node} service {service:?}: {reply:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }

        let services = reflection_v1(channel.clone()).await;
        assert!(
            services.contains(&"oncekv.v1.Client".to_string()),
            "{services:?}"
        );
        assert!(
            services.contains(&"grpc.health.v1.Health".to_string()),
            "{services:?}"
        );
        let services = reflection_v1alpha(channel).await;
        assert!(
            services.contains(&"oncekv.v1.Client".to_string()),
            "{services:?}"
        );
    }
}

async fn reflection_v1(channel: tonic::transport::Channel) -> Vec<String> {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut replies = ServerReflectionClient::new(channel)
        .server_reflection_info(futures::stream::iter([request]))
        .await
        .expect("reflection v1")
        .into_inner();
    let reply = replies
        .message()
        .await
        .expect("a reply")
        .expect("one reply");
    match reply.message_response {
        Some(MessageResponse::ListServicesResponse(list)) => list
            .service
            .into_iter()
            .map(|service| service.name)
            .collect(),
        other => panic!("unexpected reflection reply {other:?}"),
    }
}

async fn reflection_v1alpha(channel: tonic::transport::Channel) -> Vec<String> {
    use tonic_reflection::pb::v1alpha::ServerReflectionRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut replies = ServerReflectionClient::new(channel)
        .server_reflection_info(futures::stream::iter([request]))
        .await
        .expect("reflection v1alpha")
        .into_inner();
    let reply = replies
        .message()
        .await
        .expect("a reply")
        .expect("one reply");
    match reply.message_response {
        Some(MessageResponse::ListServicesResponse(list)) => list
            .service
            .into_iter()
            .map(|service| service.name)
            .collect(),
        other => panic!("unexpected reflection reply {other:?}"),
    }
}

/// The Grafana dashboard is valid JSON, has a Prometheus datasource
/// variable, and every query names only metrics a node exports.
#[test]
fn dashboard_queries_name_exported_metrics() {
    let dashboard: serde_json::Value =
        serde_json::from_str(include_str!("../docs/grafana-dashboard.json"))
            .expect("docs/grafana-dashboard.json is valid JSON");
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("templating variables");
    assert!(
        variables
            .iter()
            .any(|variable| variable["type"] == "datasource" && variable["query"] == "prometheus"),
        "a Prometheus datasource variable"
    );

    // A node's exposition, with a sample in every labelled family.
    let metrics = oncekv::metrics::NodeMetrics::new(1);
    metrics
        .registry_outcomes
        .get_or_create(&oncekv::metrics::OutcomeLabels {
            op: "execute",
            outcome: "applied",
        })
        .inc();
    metrics
        .client_replies
        .get_or_create(&oncekv::metrics::ReplyLabels {
            method: "Execute",
            result: "ok",
        })
        .inc();
    metrics
        .claim_events
        .get_or_create(&oncekv::metrics::ClaimEventLabels { event: "won" })
        .inc();
    let registry = oncekv_core::Registry::new();
    let hash = oncekv::shared::StateHashAt {
        applied_index: 0,
        cluster_time_ms: 0,
        hash: oncekv_core::snapshot::state_hash(&registry).to_string(),
    };
    metrics.refresh(
        &openraft::RaftMetrics::new_initial(1),
        &registry,
        Some(&hash),
        1,
    );
    let exported = oncekv::metrics::exported_series_names(&metrics.encode());

    let mut exprs = Vec::new();
    collect_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 12, "panels with queries: {exprs:?}");
    let mut groups = std::collections::BTreeSet::new();
    for expr in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{expr:?} names no oncekv metric");
        for name in names {
            assert!(
                exported.contains(&name),
                "{expr:?} names {name}, which a node does not export"
            );
            groups.insert(name);
        }
    }
    for wanted in [
        "oncekv_registry_outcomes_total",
        "oncekv_sessions_live",
        "oncekv_cached_responses_bytes",
        "oncekv_proposal_duration_seconds_bucket",
        "oncekv_raft_term",
        "oncekv_raft_term_changes_total",
        "oncekv_raft_leader_id",
        "oncekv_raft_commit_index",
        "oncekv_raft_applied_index",
        "oncekv_snapshots_built_total",
        "oncekv_pending_proposals",
        "oncekv_state_hash_prefix",
        "oncekv_idempotency_keys_live",
        "oncekv_idempotency_keys_cached_bytes",
        "oncekv_idempotency_keys_expired_total",
        "oncekv_claim_events_total",
        "oncekv_claims_live",
        "oncekv_claims_held",
    ] {
        assert!(groups.contains(wanted), "no panel queries {wanted}");
    }
}

fn collect_exprs(value: &serde_json::Value, exprs: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr", serde_json::Value::String(expr)) => exprs.push(expr.clone()),
                    _ => collect_exprs(value, exprs),
                }
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                collect_exprs(item, exprs);
            }
        }
        _ => {}
    }
}

/// Every `oncekv_…` identifier in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(start) = rest.find("oncekv_") {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

/// `Status` is open to anyone, and hashing encodes the whole state: a tight
/// loop of `Status` calls on the leader while a client keeps writing (the
/// applied index moving between calls) must not hash once per call. The
/// node's `oncekv_state_hashes_total` moves by about one a second (the
/// background hash), while the calls number in the hundreds; each reply's
/// hash is of an index at most its applied index. Once the writes stop,
/// every node reports a hash of its last applied index, equal on all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_calls_under_writes_do_not_hash_per_call() {
    const LOOP: Duration = Duration::from_secs(4);
    let cluster = Cluster::start("status-hash").await;
    let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let client = oncekv_client::Client::connect(cluster.client_addrs());
    let writer = tokio::spawn({
        let (client, stop) = (client.clone(), stop.clone());
        async move {
            let mut written = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                client.increment(b"n", 1).await.expect("an increment");
                written += 1;
            }
            written
        }
    });
    let hashes = |text: &str| counter(text, "oncekv_state_hashes_total", &[]);
    let before = hashes(&cluster.scrape(leader).await.expect("a scrape"));
    let began = Instant::now();
    let (mut calls, mut indexes) = (0u64, std::collections::BTreeSet::new());
    while began.elapsed() < LOOP {
        let status = cluster.status(leader).await.expect("a Status reply");
        assert!(
            status.state_hash_index <= status.applied_index,
            "{status:?}"
        );
        indexes.insert(status.applied_index);
        calls += 1;
    }
    let elapsed = began.elapsed();
    let after = hashes(&cluster.scrape(leader).await.expect("a scrape"));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let written = writer.await.expect("the writer");
    client.close().await;
    let computed = after - before;
    assert!(
        calls >= 100 && indexes.len() >= 20,
        "too few calls ({calls}) or applied indexes seen ({}) to tell",
        indexes.len()
    );
    // One hash per started second at most, and one more for the scrapes'
    // edges.
    let bound = elapsed.as_secs_f64().ceil() + 2.0;
    assert!(
        computed <= bound,
        "{computed} hashes for {calls} Status calls over {} applied indexes in {elapsed:?} \
         ({written} writes); at most {bound} expected",
        indexes.len()
    );
    let last = cluster
        .statuses()
        .await
        .values()
        .filter_map(|status| status.as_ref().ok())
        .map(|status| status.applied_index)
        .max()
        .expect("a status");
    cluster.wait_converged(&NODES, last).await;
}
