//! The headline scenario, made deterministic by the `fault-injection`
//! build: a client's increment is applied but its reply is lost, the leader
//! dies, and the client's retry of the same (client id, seq) at the new
//! leader gets the original response — the counter moved once.
#![cfg(feature = "fault-injection")]

mod support;

use oncekv::proto::Reason;
use oncekv::registry::{Command, CommandResult, Value};
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
