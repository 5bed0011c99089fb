//! The client library against real 3-node clusters: typed operations,
//! many requests in flight across a leader change, fencing at the deadline,
//! session expiry and keep-alive, and shared counters under leader kills.

mod support;

use oncekv_client::{Client, ClientConfig, Error};
use oncekv_core::{CommandResult, Value};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use support::cluster::Cluster;
use tokio::time::Instant;

fn client(cluster: &Cluster, config: ClientConfig) -> Client {
    Client::with_config(cluster.client_addrs(), config)
}

fn patient() -> ClientConfig {
    ClientConfig {
        call_timeout: Duration::from_secs(60),
        ..ClientConfig::default()
    }
}

/// Every typed operation returns its typed result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_operations() {
    let cluster = Cluster::start("client-ops").await;
    let client = client(&cluster, patient());
    client
        .put(b"name", Value::Bytes(b"once".to_vec()))
        .await
        .unwrap();
    assert_eq!(
        client.get(b"name").await.unwrap(),
        Some(Value::Bytes(b"once".to_vec()))
    );
    assert_eq!(client.increment(b"n", 5).await.unwrap(), 5);
    assert_eq!(client.increment(b"n", -2).await.unwrap(), 3);
    assert_eq!(
        client.increment_result(b"name", 1).await.unwrap(),
        CommandResult::WrongType {
            actual: oncekv_core::ValueKind::Bytes
        }
    );
    assert_eq!(
        client.append(b"list", b"a").await.unwrap(),
        CommandResult::Appended { length: 1 }
    );
    assert_eq!(
        client
            .compare_and_swap(b"n", Some(Value::Int(4)), Value::Int(9))
            .await
            .unwrap(),
        (false, Some(Value::Int(3)))
    );
    assert_eq!(
        client
            .compare_and_swap(b"n", Some(Value::Int(3)), Value::Int(9))
            .await
            .unwrap(),
        (true, Some(Value::Int(9)))
    );
    assert!(client.delete(b"n").await.unwrap());
    assert!(!client.delete(b"n").await.unwrap());
    assert_eq!(client.get(b"n").await.unwrap(), None);
    assert!(client.close().await, "an applied Unregister is confirmed");
}

/// A close whose Unregister applied but whose reply was lost is still
/// confirmed: the retry meets SESSION_EXPIRED, which shows the session gone.
/// Here a raw Unregister of the same session stands for the lost attempt.
/// And with every node gone, close gives up after one attempt timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_confirms_a_session_already_gone() {
    let cluster = Cluster::start("client-close-gone").await;
    let client = client(&cluster, patient());
    let client_id = client.client_id().await.unwrap();
    let raw = support::raw::raw_client(&cluster).await;
    let request = oncekv_wire::proto::UnregisterRequest {
        cluster_id: raw.cluster_id.clone(),
        client_id,
    };
    raw.on_leader(Duration::from_secs(60), |mut grpc| {
        let request = request.clone();
        async move { grpc.unregister(request).await }
    })
    .await
    .expect("the first Unregister applies");
    assert!(
        client.close().await,
        "the session is gone: close must say so, not report a failure"
    );

    // With the cluster gone, close gives up after one attempt timeout of
    // its own (2 s), not the client's whole call timeout (60 s here), and
    // says it could not confirm.
    let other = Client::with_config(cluster.client_addrs(), patient());
    other.client_id().await.unwrap();
    for node in 1..=3 {
        cluster.kill(node);
    }
    let started = tokio::time::Instant::now();
    assert!(!other.close().await, "nothing could confirm the close");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "close took {:?}",
        started.elapsed()
    );
}

/// 64 requests in flight on one session across a leader change: every one
/// takes effect exactly once (the counter ends at 64 and the 64 replies
/// are exactly 1..=64).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_in_flight_across_a_leader_change() {
    let cluster = Cluster::start("client-in-flight").await;
    let client = client(&cluster, patient());
    client.client_id().await.unwrap();
    let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
    let calls: Vec<_> = (0..64)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.increment(b"counter", 1).await })
        })
        .collect();
    cluster.kill(leader);
    let mut values = BTreeSet::new();
    for call in calls {
        values.insert(call.await.unwrap().expect("every call succeeds"));
    }
    assert_eq!(values, (1..=64).collect::<BTreeSet<i64>>());
    assert_eq!(client.get(b"counter").await.unwrap(), Some(Value::Int(64)));
}

/// A call that hits its deadline reports an unknown outcome, and the
/// library fences it before reporting: `fenced` is true and the session's
/// floor, read through `Admin.GetSession` (a read, which moves no floor), is
/// already past the seq before the test sends anything of its own; a copy
/// of the request delivered afterwards is discarded, never executed. The
/// leader applies the increment but drops its reply (the
/// `drop-first-execute-reply` fault), so the outcome is unknown to the
/// client while the cluster stays healthy for the fence.
#[cfg(feature = "fault-injection")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_fences_the_request() {
    use oncekv_core::Command;
    use oncekv_wire::proto::Reason;
    use support::raw::{Raw, reason};

    let cluster =
        Cluster::start_with("client-fence", &["--fault", "drop-first-execute-reply"]).await;
    let hasty = client(
        &cluster,
        ClientConfig {
            // One attempt, ended by the call's deadline: the retry that
            // would be answered from the cache is never sent. The fence's
            // keep-alive has an attempt timeout of its own.
            call_timeout: Duration::from_millis(1_000),
            attempt_timeout: Duration::from_millis(5_000),
            // No background keep-alives: the only floor the library sends
            // after the call is its fence.
            keep_alive_fraction: 1_000.0,
            ..ClientConfig::default()
        },
    );
    let client_id = hasty.client_id().await.unwrap();
    let error = hasty
        .increment(b"fenced", 1)
        .await
        .expect_err("the reply is dropped");
    let Error::OutcomeUnknown { seq, fenced, .. } = error else {
        panic!("expected an unknown outcome, got {error}")
    };
    assert!(fenced, "the library did not report its fence committed");

    // The fence is in the replicated state: some node's applied session has
    // its floor past the seq (the leader that acknowledged the keep-alive
    // has; the others follow).
    let deadline = Instant::now() + Duration::from_secs(10);
    let floors = loop {
        let mut floors = Vec::new();
        for node in 1..=3 {
            let request = oncekv_wire::proto::GetSessionRequest { client_id };
            floors.push(match cluster.admin(node).get_session(request).await {
                Ok(session) => Ok(session.into_inner().floor),
                Err(status) => Err(status.code()),
            });
        }
        let fenced = floors
            .iter()
            .any(|floor| matches!(floor, Ok(floor) if *floor > seq));
        if fenced || Instant::now() >= deadline {
            break floors;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        floors
            .iter()
            .any(|floor| matches!(floor, Ok(floor) if *floor > seq)),
        "no node's session {client_id} has its floor past seq {seq}: {floors:?}"
    );

    // A late copy of the request is discarded, not executed (nor answered
    // from the cache, which the floor dropped).
    let raw = {
        let status = cluster
            .status(cluster.wait_for_leader(Duration::from_secs(60)).await)
            .await
            .unwrap();
        Raw::new(cluster.client_addrs(), status.cluster_id)
    };
    let late = raw.execute_request(
        client_id,
        seq,
        seq,
        &Command::Increment {
            key: b"fenced".to_vec(),
            delta: 1,
        },
    );
    let error = raw
        .execute(Duration::from_secs(60), &late)
        .await
        .expect_err("a late copy is not executed");
    assert_eq!(reason(&error), Some(Reason::ResponseDiscarded));
    assert_eq!(
        raw.read(b"fenced").await,
        Some(Value::Int(1)),
        "executed once, by the original"
    );
}

/// Idle past the TTL without keep-alives, a session expires (the call
/// fails, nothing executes, and the next call gets a new session); with the
/// library's keep-alives it survives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_keeps_a_session_and_its_absence_expires_it() {
    let cluster = Cluster::start_with("client-ttl", &["--session-ttl-ms", "1500"]).await;
    let kept = client(&cluster, patient());
    let silent = client(
        &cluster,
        ClientConfig {
            keep_alive_fraction: 1_000.0,
            ..patient()
        },
    );
    let kept_id = kept.client_id().await.unwrap();
    let silent_id = silent.client_id().await.unwrap();
    // Idle time must pass in real time for a TTL to elapse.
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    assert_eq!(kept.increment(b"k", 1).await.unwrap(), 1);
    assert_eq!(kept.client_id().await.unwrap(), kept_id, "same session");
    assert_eq!(
        silent.increment(b"s", 1).await,
        Err(Error::SessionExpired),
        "an expired session executes nothing"
    );
    assert_eq!(silent.get(b"s").await.unwrap(), None);
    assert_eq!(silent.increment(b"s", 1).await.unwrap(), 1);
    assert_ne!(
        silent.client_id().await.unwrap(),
        silent_id,
        "a new session"
    );
}

/// 8 tasks × 500 increments of shared counters while the leader is killed
/// and restarted twice: each final counter lies between the acknowledged
/// increments and those plus the unknown ones, and the values increments
/// returned are distinct and never above it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_counters_under_leader_kills() {
    const TASKS: usize = 8;
    const PER_TASK: usize = 500;
    let cluster = Arc::new(Cluster::start("client-counters").await);
    let client = client(&cluster, patient());
    let acked = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let client = client.clone();
        let acked = acked.clone();
        tasks.push(tokio::spawn(async move {
            let key = format!("c{}", task % 2);
            let (mut ok, mut unknown, mut values) = (0u64, 0u64, Vec::new());
            for _ in 0..PER_TASK {
                match client.increment(key.as_bytes(), 1).await {
                    Ok(value) => {
                        ok += 1;
                        values.push(value);
                        acked.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(Error::OutcomeUnknown { .. }) => unknown += 1,
                    Err(other) => panic!("{key}: {other}"),
                }
            }
            (key, ok, unknown, values)
        }));
    }
    for threshold in [1_000, 2_500] {
        let deadline = Instant::now() + Duration::from_secs(300);
        while acked.load(Ordering::SeqCst) < threshold {
            assert!(Instant::now() < deadline, "load stalled");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
        cluster.kill(leader);
        cluster.wait_for_new_leader(leader).await;
        cluster.restart(leader).await;
    }
    let mut per_key: std::collections::BTreeMap<String, (u64, u64, Vec<i64>)> = Default::default();
    for task in tasks {
        let (key, ok, unknown, values) = task.await.unwrap();
        let entry = per_key.entry(key).or_default();
        entry.0 += ok;
        entry.1 += unknown;
        entry.2.extend(values);
    }
    for (key, (ok, unknown, mut values)) in per_key {
        let Some(Value::Int(final_value)) = client.get(key.as_bytes()).await.unwrap() else {
            panic!("{key} missing")
        };
        let final_value = final_value as u64;
        assert!(
            ok <= final_value && final_value <= ok + unknown,
            "{key}: {ok} acknowledged, {unknown} unknown, final {final_value}"
        );
        let count = values.len();
        values.sort_unstable();
        values.dedup();
        assert_eq!(
            values.len(),
            count,
            "{key}: two increments returned the same value"
        );
        assert!(values.iter().all(|value| *value as u64 <= final_value));
    }
}

/// Kills the leader and one follower, keeping the other follower: no node
/// can lead, and nothing proposed during the outage can commit later (the
/// one left running never led). Returns the two killed.
async fn stop_two_of_three(cluster: &Cluster) -> [u64; 2] {
    let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
    let follower = (1..=3).find(|&node| node != leader).unwrap();
    cluster.kill(leader);
    cluster.kill(follower);
    [leader, follower]
}

/// Calls `increment` (one call at a time) until `count` calls in a row
/// succeed, for up to two minutes after a restart; panics on a definite
/// refusal of the floor (a wedged session) or when time runs out.
async fn later_calls_succeed(client: &Client, key: &[u8], count: usize) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(120);
    let (mut in_a_row, mut succeeded) = (0, 0);
    while in_a_row < count {
        match client.increment(key, 1).await {
            Ok(_) => {
                in_a_row += 1;
                succeeded += 1;
            }
            Err(error @ (Error::InvalidArgument(_) | Error::SessionExpired)) => {
                panic!("the session is wedged: {error}")
            }
            Err(_) => in_a_row = 0,
        }
        assert!(
            Instant::now() < deadline,
            "no {count} calls in a row succeeded after the restart"
        );
    }
    succeeded
}

/// A long outage does not brick a session (issue 25, item 2). With a
/// window of 2 and a 1 s call deadline, 2 of 3 nodes are down while 5
/// increments are called: the first four end unknown, their fences
/// unacknowledged, and the library keeps its floor within a window of the
/// last floor the cluster confirmed — so it takes no fifth seq (nothing is
/// sent: `Unavailable`) rather than a floor the cluster would refuse
/// forever. Once the nodes are back, the library fences the four and later
/// calls succeed, in the same session; nothing of the outage executed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_survives_calls_given_up_during_an_outage() {
    let cluster = Cluster::start_with("client-outage", &["--window", "2"]).await;
    let client = client(
        &cluster,
        ClientConfig {
            call_timeout: Duration::from_secs(1),
            attempt_timeout: Duration::from_millis(500),
            ..ClientConfig::default()
        },
    );
    let client_id = client.client_id().await.expect("a session");
    let stopped = stop_two_of_three(&cluster).await;
    let mut outcomes = Vec::new();
    for _ in 0..5 {
        outcomes.push(client.increment(b"n", 1).await);
    }
    for (index, outcome) in outcomes.iter().enumerate() {
        match (index, outcome) {
            (0..4, Err(Error::OutcomeUnknown { seq, fenced, .. })) => {
                assert_eq!((*seq, *fenced), (index as u64 + 1, false), "{outcomes:?}")
            }
            (4, Err(Error::Unavailable(why))) => {
                assert!(why.contains("window stayed full"), "{why}")
            }
            _ => panic!("call {index}: {outcome:?}"),
        }
    }
    for node in stopped {
        cluster.restart(node).await;
    }
    let succeeded = later_calls_succeed(&client, b"n", 3).await;
    assert_eq!(
        client.client_id().await.unwrap(),
        client_id,
        "the same session"
    );
    assert_eq!(
        client.get(b"n").await.unwrap(),
        Some(Value::Int(succeeded as i64)),
        "nothing of the outage executed"
    );
}

/// A session whose floor the cluster refuses for good (`FloorBeyondBound`:
/// here the window was lowered from 4 to 1 while four calls ended unknown
/// in an outage, so the library's floor is beyond the new bound) is
/// replaced: the call that met the refusal ran nothing, so the library
/// sends it again under a new session, and later calls succeed — instead
/// of every call failing with INVALID_ARGUMENT forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_floor_is_refused_is_replaced() {
    use oncekv_wire::proto;

    let cluster = Cluster::start_with("client-refused-floor", &["--window", "4"]).await;
    let client = client(
        &cluster,
        ClientConfig {
            call_timeout: Duration::from_secs(1),
            attempt_timeout: Duration::from_millis(500),
            ..ClientConfig::default()
        },
    );
    let first_session = client.client_id().await.expect("a session");
    let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
    let cluster_id = cluster.status(leader).await.unwrap().cluster_id;
    let admin = oncekv_client::admin::Admin::new(
        cluster.client_addrs(),
        oncekv_client::credentials::Credentials::none(),
    );
    let request = proto::SetConfigRequest {
        cluster_id,
        patch: Some(proto::RegistryConfigPatch {
            window: Some(1),
            ..proto::RegistryConfigPatch::default()
        }),
    };
    admin
        .on_leader(Instant::now() + Duration::from_secs(60), |mut admin| {
            let request = request.clone();
            async move { admin.set_config(request).await }
        })
        .await
        .expect("the window is lowered to 1");

    let stopped = stop_two_of_three(&cluster).await;
    for seq in 1..=4 {
        let outcome = client.increment(b"n", 1).await;
        assert!(
            matches!(outcome, Err(Error::OutcomeUnknown { seq: unknown, .. }) if unknown == seq),
            "{outcome:?}"
        );
    }
    for node in stopped {
        cluster.restart(node).await;
    }
    let succeeded = later_calls_succeed(&client, b"n", 3).await;
    assert_ne!(
        client.client_id().await.unwrap(),
        first_session,
        "a new session replaced the refused one"
    );
    assert_eq!(
        client.get(b"n").await.unwrap(),
        Some(Value::Int(succeeded as i64))
    );
}
