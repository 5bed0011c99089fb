//! The headline scenario, made deterministic by the `fault-injection`
//! build: a client's increment is applied but its reply is lost, the leader
//! dies, and the client's retry of the same (client id, seq) at the new
//! leader gets the original response — the counter moved once.
#![cfg(feature = "fault-injection")]

mod support;

use oncekv_core::{Command, CommandResult, Value};
use oncekv_wire::proto::Reason;
use std::time::Duration;
use support::cluster::Cluster;
use support::raw::{Raw, reason};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_leader_death_gets_the_original_response() {
    let cluster = Cluster::start_with("headline", &["--fault", "drop-first-execute-reply"]).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let cluster_id = loop {
        let status = cluster.status(leader).await.unwrap();
        if !status.cluster_id.is_empty() {
            break status.cluster_id;
        }
        assert!(Instant::now() < deadline, "cluster never bootstrapped");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let raw = Raw::new(cluster.client_addrs(), cluster_id);
    let session = raw.register(42).await;
    let increment = Command::Increment {
        key: b"balance".to_vec(),
        delta: 5,
    };
    let request = raw.execute_request(session.client_id, 1, 1, &increment);

    // The first attempt is applied, but its reply never arrives. (Should
    // leadership move meanwhile, follow it: only the leader executes.)
    let deadline = Instant::now() + Duration::from_secs(60);
    let leader = loop {
        let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
        let mut attempt = tonic::Request::new(request.clone());
        attempt.set_timeout(Duration::from_secs(3));
        let error = cluster
            .client(leader)
            .execute(attempt)
            .await
            .expect_err("the reply is dropped");
        if matches!(
            error.code(),
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
        ) {
            break leader;
        }
        assert_eq!(reason(&error), Some(Reason::NotLeader), "{error}");
        assert!(Instant::now() < deadline, "no leader took the request");
    };

    // The leader dies before the client sees any reply.
    cluster.kill(leader);

    // The retry — same client id, seq and command — at the new leader.
    let (result, duplicate) = raw
        .execute(Duration::from_secs(60), &request)
        .await
        .expect("the retry is answered");
    assert_eq!(result, CommandResult::Incremented { value: 5 });
    assert!(duplicate, "answered from the cache, not executed again");
    assert_eq!(raw.read(b"balance").await, Some(Value::Int(5)));
    assert_ne!(
        cluster.wait_for_leader(Duration::from_secs(60)).await,
        leader
    );
}

/// The client library's attempt observer sees its internal retries: the
/// first attempt's reply is lost (it times out and is retried), and the
/// retry is answered from the registry's cache, flagged as a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempt_observer_sees_a_retry_answered_as_duplicate() {
    use oncekv_client::{AttemptEvent, AttemptObserver, AttemptOutcome, Client, ClientConfig};
    use std::sync::{Arc, Mutex};

    let cluster = Cluster::start_with("observer", &["--fault", "drop-first-execute-reply"]).await;
    cluster.wait_for_leader(Duration::from_secs(60)).await;
    let events: Arc<Mutex<Vec<AttemptEvent>>> = Arc::default();
    let seen = events.clone();
    let client = Client::with_config(
        cluster.client_addrs(),
        ClientConfig {
            call_timeout: Duration::from_secs(60),
            attempt_timeout: Duration::from_secs(2),
            observer: Some(AttemptObserver::new(move |event| {
                seen.lock().unwrap().push(event.clone());
            })),
            ..ClientConfig::default()
        },
    );
    assert_eq!(client.increment(b"observed", 3).await.unwrap(), 3);
    let events = events.lock().unwrap().clone();
    let client_id = client.client_id().await.unwrap();
    assert!(
        events
            .iter()
            .all(|e| e.client_id == client_id && e.seq == 1),
        "{events:?}"
    );
    // Every attempt is announced, then ends exactly once, in order.
    for (index, pair) in events.chunks(2).enumerate() {
        assert_eq!(pair[0].attempt, index as u32, "{events:?}");
        assert_eq!(pair[0].outcome, AttemptOutcome::Started, "{events:?}");
        assert_eq!(pair[1].attempt, index as u32, "{events:?}");
        assert_eq!(pair[1].endpoint, pair[0].endpoint, "{events:?}");
    }
    assert!(
        events.iter().any(|e| matches!(
            &e.outcome,
            AttemptOutcome::Retry { reason } if reason == "DeadlineExceeded" || reason == "Cancelled"
        )),
        "the lost reply shows as a retried attempt: {events:?}"
    );
    assert!(
        matches!(
            events.last().map(|e| &e.outcome),
            Some(AttemptOutcome::Answered {
                duplicate: true,
                ..
            })
        ),
        "the retry is answered from the cache: {events:?}"
    );
    client.close().await;
}
