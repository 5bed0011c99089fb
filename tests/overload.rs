//! Overload and message limits on real nodes: with a small
//! `--max-pending-proposals`, a burst of far more concurrent proposals than
//! it admits is answered quickly — the excess with `UNAVAILABLE`
//! ("overloaded"), never executed — nothing hangs past its deadline, the
//! leader's memory stays bounded and the cluster serves normally after.
//! An oversized client message is `INVALID_ARGUMENT`, and the node lives on.

mod support;

use oncekv_core::{Command, Value};
use oncekv_wire::proto::{self, Reason};
use std::time::Duration;
use support::cluster::Cluster;
use support::metrics::{counter, sample};
use support::raw::{connect, raw_client, reason};
use tokio::time::Instant;

const MAX_PENDING: usize = 8;
const BURST: usize = 2000;
const CONNECTIONS: usize = 20;
/// Deadline of each call of the burst.
const CALL_DEADLINE: Duration = Duration::from_secs(30);

/// Resident memory of `pid` in KiB (Linux).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

enum Reply {
    Ok,
    Overloaded(Duration),
    NotLeader,
    Other(tonic::Status),
}

/// A burst of `BURST` concurrent `ExecutePlain` increments at the leader:
/// the excess is refused as overloaded, quickly, and never executed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_beyond_admission_is_refused_quickly_and_never_executed() {
    let max_pending = MAX_PENDING.to_string();
    let cluster = Cluster::start_with("overload", &["--max-pending-proposals", &max_pending]).await;
    let raw = raw_client(&cluster).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
    let pid = cluster.pid(leader).expect("the leader runs");
    let rss_before = rss_kib(pid);
    let metrics_before = cluster.scrape(leader).await.expect("scrape the leader");
    assert_eq!(
        sample(&metrics_before, "oncekv_max_pending_proposals", &[]),
        Some(MAX_PENDING as f64)
    );

    let request = proto::ExecutePlainRequest {
        cluster_id: raw.cluster_id.clone(),
        command: Some(oncekv_wire::convert::command_to_proto(
            &Command::Increment {
                key: b"burst".to_vec(),
                delta: 1,
            },
        )),
    };
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        clients.push(connect(&cluster.client_addr(leader)).await);
    }
    let started = Instant::now();
    let calls = (0..BURST).map(|i| {
        let mut client = clients[i % CONNECTIONS].clone();
        let mut request = tonic::Request::new(request.clone());
        request.set_timeout(CALL_DEADLINE);
        async move {
            let sent = Instant::now();
            match tokio::time::timeout(CALL_DEADLINE * 2, client.execute_plain(request)).await {
                Err(_) => panic!("a call outlived twice its deadline"),
                Ok(Ok(_)) => Reply::Ok,
                Ok(Err(status)) => match reason(&status) {
                    Some(Reason::Unavailable)
                        if status.code() == tonic::Code::Unavailable
                            && status.message().contains("overloaded") =>
                    {
                        Reply::Overloaded(sent.elapsed())
                    }
                    Some(Reason::NotLeader) => Reply::NotLeader,
                    _ => Reply::Other(status),
                },
            }
        }
    });
    let replies = futures::future::join_all(calls).await;
    let elapsed = started.elapsed();

    let ok = replies.iter().filter(|r| matches!(r, Reply::Ok)).count();
    let not_leader = replies
        .iter()
        .filter(|r| matches!(r, Reply::NotLeader))
        .count();
    let overloaded: Vec<Duration> = replies
        .iter()
        .filter_map(|r| match r {
            Reply::Overloaded(latency) => Some(*latency),
            _ => None,
        })
        .collect();
    let others: Vec<&tonic::Status> = replies
        .iter()
        .filter_map(|r| match r {
            Reply::Other(status) => Some(status),
            _ => None,
        })
        .collect();
    eprintln!(
        "burst of {BURST} in {elapsed:?}: {ok} ok, {} overloaded, {not_leader} not leader, {} other",
        overloaded.len(),
        others.len()
    );
    assert!(
        others.is_empty(),
        "unexpected failures: {:?}",
        &others[..others.len().min(5)]
    );
    assert!(ok > 0, "some of the burst is admitted");
    assert!(
        overloaded.len() >= BURST / 4,
        "most of a burst of {BURST} against {MAX_PENDING} slots is refused: {} were",
        overloaded.len()
    );
    // Refusal does not wait for Raft: well within the node's request timeout
    // (5 s) even on a loaded machine.
    let slowest = overloaded.iter().max().copied().unwrap_or_default();
    assert!(
        slowest < Duration::from_secs(5),
        "an overloaded reply took {slowest:?}"
    );

    // Refused requests never executed: the counter counts the admitted ones.
    let value = raw.read(b"burst").await;
    assert_eq!(value, Some(Value::Int(ok as i64)));

    let metrics_after = cluster.scrape(leader).await.expect("scrape the leader");
    if not_leader == 0 {
        assert_eq!(
            counter(&metrics_after, "oncekv_overloaded_total", &[])
                - counter(&metrics_before, "oncekv_overloaded_total", &[]),
            overloaded.len() as f64
        );
    }
    let pending = sample(&metrics_after, "oncekv_pending_proposals", &[]).unwrap();
    assert!(pending <= MAX_PENDING as f64, "pending {pending}");

    // A loose bound: the burst must not queue its requests in memory.
    let rss_after = rss_kib(pid);
    assert!(
        rss_after < rss_before + 256 * 1024,
        "RSS grew from {rss_before} KiB to {rss_after} KiB"
    );

    // Afterwards the cluster serves normally, through the library's path.
    let session = raw.register(7).await;
    let request = raw.execute_request(
        session.client_id,
        1,
        1,
        &Command::Increment {
            key: b"after".to_vec(),
            delta: 1,
        },
    );
    raw.execute(Duration::from_secs(60), &request)
        .await
        .expect("a normal request after the burst");
}

/// A client message beyond the limit is INVALID_ARGUMENT with our reason
/// (not tonic's bare OUT_OF_RANGE, which reads like RESPONSE_DISCARDED);
/// nothing executes and the node goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_message_is_invalid_argument() {
    let cluster = Cluster::start("oversized").await;
    let raw = raw_client(&cluster).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
    let huge = vec![7u8; oncekv_wire::CLIENT_MESSAGE_BYTES_MAX + 1024];
    let request = proto::ExecutePlainRequest {
        cluster_id: raw.cluster_id.clone(),
        command: Some(oncekv_wire::convert::command_to_proto(&Command::Put {
            key: b"huge".to_vec(),
            value: Value::Bytes(huge),
        })),
    };
    let error = connect(&cluster.client_addr(leader))
        .await
        .execute_plain(request)
        .await
        .expect_err("an oversized message is refused");
    assert_eq!(error.code(), tonic::Code::InvalidArgument, "{error:?}");
    assert_eq!(reason(&error), Some(Reason::InvalidArgument));
    assert_eq!(raw.read(b"huge").await, None);
    let metrics = cluster.scrape(leader).await.expect("scrape the leader");
    assert!(
        counter(
            &metrics,
            "oncekv_client_replies_total",
            &[("method", "ExecutePlain"), ("result", "invalid_argument")]
        ) >= 1.0
    );
}
