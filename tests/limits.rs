//! Limits and malformed input against real 3-node clusters: a request that
//! breaks a replicated limit by itself is refused at once and finally (a
//! retry gets the same answer, at a new leader and after the limit was
//! raised); the client library refuses it before sending and the CLI fails
//! at once with exit 1; an undecodable protobuf body and an empty key are
//! INVALID_ARGUMENT on every service; config changes are patches checked as
//! a whole; an unknown outcome names the most informative reason seen.
//! Three clusters are started in this file (CI has 2 cores).

mod support;

use oncekv_client::{AttemptObserver, AttemptOutcome, Client, ClientConfig, Error};
use oncekv_core::{Command, CommandResult, Limit, Value};
use oncekv_wire::proto::{self, Reason};
use oncekv_wire::status::{REASON_METADATA_KEY, error_detail};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::admin::oncekv;
use support::cluster::Cluster;
use support::raw::{Raw, raw_call, raw_client, reason};
use tokio::time::Instant;

const CALL_DEADLINE: Duration = Duration::from_secs(30);
/// `value_bytes_max` of the default config.
const VALUE_BYTES_MAX: u64 = 64 << 10;

fn put(key: &str, value: Value) -> Command {
    Command::Put {
        key: key.as_bytes().to_vec(),
        value,
    }
}

/// A value one byte above the default `value_bytes_max`.
fn too_big() -> Value {
    Value::Bytes(vec![b'x'; VALUE_BYTES_MAX as usize + 1])
}

/// Sends a config patch through the leader.
async fn patch_config(
    raw: &Raw,
    patch: proto::RegistryConfigPatch,
) -> Result<proto::SetConfigReply, tonic::Status> {
    let request = proto::SetConfigRequest {
        cluster_id: raw.cluster_id.clone(),
        patch: Some(patch),
    };
    raw.admin_on_leader(CALL_DEADLINE, |mut client| {
        let request = request.clone();
        async move { client.set_config(request).await.map(|r| r.into_inner()) }
    })
    .await
}

/// Asserts that `status` is the final refusal of a value one byte too big.
fn assert_value_limit(status: &tonic::Status, max: u64) {
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
    let detail = error_detail(status).expect("our detail");
    assert_eq!(detail.reason(), Reason::LimitExceeded, "{status}");
    assert_eq!(
        (
            detail.limit.as_str(),
            detail.limit_max,
            detail.limit_requested
        ),
        ("value_bytes_max", max, VALUE_BYTES_MAX + 1)
    );
    assert_eq!(
        status.metadata().get(REASON_METADATA_KEY).unwrap(),
        "LIMIT_EXCEEDED"
    );
}

/// On the wire: undecodable bodies and empty keys are INVALID_ARGUMENT with
/// our reason on every service and path, and nothing of them reaches the
/// registry; a value above `value_bytes_max` is LIMIT_EXCEEDED at once,
/// and final: its retry gets the same refusal from a new leader, even
/// after the limit was raised, while a new seq is judged under the new
/// limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_input_and_limits_are_final_on_the_wire() {
    let cluster = Cluster::start("limits-wire").await;
    let raw = raw_client(&cluster).await;
    let leader = cluster.wait_for_leader(CALL_DEADLINE).await;
    let at = cluster.client_addr(leader);

    // Undecodable bodies: a length-delimited field claiming 127 bytes of
    // which one follows, and bytes that are no field at all.
    let garbage: [&[u8]; 2] = [&[0x12, 0x7f, 0x01], &[0xff; 9]];
    let calls: [(String, &'static str); 5] = [
        (at.clone(), "/oncekv.v1.Client/Execute"),
        (at.clone(), "/oncekv.v1.Client/Read"),
        (at.clone(), "/oncekv.v1.Client/Register"),
        (at.clone(), "/oncekv.v1.Admin/SetConfig"),
        (cluster.peer_addr(leader), "/oncekv.v1.Raft/AppendEntries"),
    ];
    for body in garbage {
        for (addr, path) in &calls {
            let status = raw_call(addr, path, body.to_vec())
                .await
                .expect_err("garbage is refused");
            assert_eq!(
                status.code(),
                tonic::Code::InvalidArgument,
                "{path}: {status}"
            );
            assert_eq!(reason(&status), Some(Reason::InvalidArgument), "{path}");
            assert_eq!(
                status.metadata().get(REASON_METADATA_KEY).unwrap(),
                "INVALID_ARGUMENT"
            );
        }
    }

    // A list with more items than any value within the hard bound can hold
    // (each item counts 8 bytes), in a message within the size bound:
    // refused while it decodes, as malformed input, after at most the
    // bound's items — not decoded whole and refused by the value's limit.
    let items = oncekv_wire::list_value::LIST_ITEMS_MAX + 1;
    let many = raw.execute_request(1, 1, 1, &put("many", Value::List(vec![Vec::new(); items])));
    let status = raw_call(
        &at,
        "/oncekv.v1.Client/Execute",
        prost::Message::encode_to_vec(&many),
    )
    .await
    .expect_err("too many items are refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
    assert_eq!(reason(&status), Some(Reason::InvalidArgument), "{status}");
    assert!(
        status.message().contains("more than 524288 items"),
        "{status}"
    );

    // Malformed gRPC framing, refused by tonic before any handler runs: a
    // compressed flag without `grpc-encoding`, a frame shorter than its
    // length, an encoding the node does not support, and no message.
    let message = [0x0a, 0x01, 0x61];
    let framed = |flag: u8, length: u32, bytes: &[u8]| {
        let mut frame = vec![flag];
        frame.extend_from_slice(&length.to_be_bytes());
        frame.extend_from_slice(bytes);
        frame
    };
    let malformed: [(Option<&str>, Vec<u8>); 4] = [
        (None, framed(1, 3, &message)),
        (None, framed(0, 10, &message)),
        (Some("br"), framed(1, 3, &message)),
        (None, Vec::new()),
    ];
    for (encoding, frames) in malformed {
        let status =
            support::raw::raw_frames(&at, "/oncekv.v1.Client/Read", encoding, frames).await;
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
        assert_eq!(reason(&status), Some(Reason::InvalidArgument), "{status}");
        assert!(
            status.message().contains("malformed gRPC framing"),
            "{status}"
        );
    }

    // Empty keys, on every path that takes a key.
    let session = raw.register(1).await;
    let empty = raw.execute_request(session.client_id, 1, 1, &put("", Value::Int(1)));
    let status = raw.execute(CALL_DEADLINE, &empty).await.unwrap_err();
    assert_eq!(reason(&status), Some(Reason::InvalidArgument), "{status}");
    assert!(status.message().contains("empty key"), "{status}");
    let plain = proto::ExecutePlainRequest {
        cluster_id: raw.cluster_id.clone(),
        command: empty.command.clone(),
    };
    let status = raw
        .on_leader(CALL_DEADLINE, |mut client| {
            let request = plain.clone();
            async move { client.execute_plain(request).await }
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&status), Some(Reason::InvalidArgument), "{status}");
    let read = proto::ReadRequest {
        cluster_id: raw.cluster_id.clone(),
        key: Vec::new(),
    };
    let status = raw
        .on_leader(CALL_DEADLINE, |mut client| {
            let request = read.clone();
            async move { client.read(request).await }
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&status), Some(Reason::InvalidArgument), "{status}");
    for node in 1..=3 {
        let status = cluster
            .admin(node)
            .local_read(proto::LocalReadRequest { key: Vec::new() })
            .await
            .unwrap_err();
        assert_eq!(reason(&status), Some(Reason::InvalidArgument), "{status}");
    }
    // Nothing was cached for seq 1: a real command under it executes.
    let first = raw.execute_request(session.client_id, 1, 1, &put("a", Value::Int(1)));
    assert_eq!(
        raw.execute(CALL_DEADLINE, &first).await.unwrap(),
        (CommandResult::Stored, false)
    );

    // A value above the limit: refused at once, finally.
    let big = raw.execute_request(session.client_id, 2, 2, &put("big", too_big()));
    let started = Instant::now();
    let status = raw.execute(CALL_DEADLINE, &big).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_value_limit(&status, VALUE_BYTES_MAX);
    let raised = patch_config(
        &raw,
        proto::RegistryConfigPatch {
            value_bytes_max: Some(2 * VALUE_BYTES_MAX),
            ..Default::default()
        },
    )
    .await
    .expect("raise value_bytes_max");
    assert_eq!(raised.config.unwrap().value_bytes_max, 2 * VALUE_BYTES_MAX);
    cluster.kill(leader);
    cluster.wait_for_new_leader(leader).await;
    let status = raw.execute(CALL_DEADLINE, &big).await.unwrap_err();
    assert_value_limit(&status, VALUE_BYTES_MAX);
    let again = raw.execute_request(session.client_id, 3, 3, &put("big", too_big()));
    assert_eq!(
        raw.execute(CALL_DEADLINE, &again).await.unwrap(),
        (CommandResult::Stored, false)
    );
    assert_eq!(raw.read(b"big").await, Some(too_big()));
}

/// The client library refuses a request that breaks a limit it learned at
/// registration before sending anything, with a typed definite error; a
/// limit raised since is learned again, not held against the request. The
/// CLI fails at once (exit 1) naming the limit. Config changes are patches:
/// two operators changing different fields at once both get their change;
/// a combination that would refuse requests forever is refused naming both
/// fields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_and_cli_fail_at_once_and_config_changes_are_patches() {
    let cluster = Cluster::start("limits-client").await;
    let raw = raw_client(&cluster).await;
    let e = cluster.client_addrs();
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let seen = attempts.clone();
    let config = ClientConfig {
        call_timeout: Duration::from_secs(30),
        observer: Some(AttemptObserver::new(move |event| {
            seen.lock().unwrap().push(event.clone());
        })),
        ..ClientConfig::default()
    };
    let client = Client::with_config(e.clone(), config);
    client.put(b"small", Value::Int(1)).await.unwrap();
    let sent_before = attempts.lock().unwrap().len();

    let started = Instant::now();
    let error = client.put(b"big", too_big()).await.unwrap_err();
    assert_eq!(
        error,
        Error::LimitExceeded {
            limit: Limit::ValueBytes,
            max: VALUE_BYTES_MAX,
            requested: VALUE_BYTES_MAX + 1,
        }
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(
        attempts.lock().unwrap().len(),
        sent_before,
        "refused before sending"
    );
    assert_eq!(
        client.put(b"", Value::Int(1)).await,
        Err(Error::InvalidArgument(
            "empty key: a key is at least one byte long".into()
        ))
    );
    assert!(matches!(
        client.get(b"").await,
        Err(Error::InvalidArgument(_))
    ));

    // The CLI: at once, exit 1, the limit named.
    let value = "x".repeat(VALUE_BYTES_MAX as usize + 1);
    let started = Instant::now();
    let run = oncekv(&e, &["put", "--timeout-ms", "3000", "k", &value]).await;
    assert!(started.elapsed() < Duration::from_millis(2_500), "{run:?}");
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("value_bytes_max"), "{run:?}");
    let run = oncekv(&e, &["put", "k", &value, "--json"]).await;
    assert_eq!(run.code, 1, "{run:?}");
    let object = run.json();
    assert_eq!(object["kind"], "limit_exceeded");
    assert_eq!(object["outcome"], "none");
    assert_eq!(object["limit"], "value_bytes_max");
    assert_eq!(object["limit_requested"], VALUE_BYTES_MAX + 1);

    // A request beyond the message bound both ends keep (8 MiB), though
    // within every replicated limit the client checks (a cas's expected
    // value is not a value it stores), is refused before anything is sent —
    // a definite InvalidArgument, not an unknown outcome — by every kind of
    // call; the session goes on.
    let huge = vec![b'x'; oncekv_wire::CLIENT_MESSAGE_BYTES_MAX + 1];
    let sent_before = attempts.lock().unwrap().len();
    let refusals = [
        client
            .compare_and_swap(b"big", Some(Value::Bytes(huge.clone())), Value::Int(1))
            .await
            .map(drop),
        client
            .execute_with_key(
                b"huge-key",
                Command::Put {
                    key: b"big".to_vec(),
                    value: Value::Bytes(huge.clone()),
                },
            )
            .await
            .map(drop),
        client
            .execute_plain(Command::Put {
                key: b"big".to_vec(),
                value: Value::Bytes(huge.clone()),
            })
            .await
            .map(drop),
        client
            .complete_claim(b"huge-claim", 1, &huge)
            .await
            .map(drop),
    ];
    for refusal in refusals {
        match refusal {
            Err(Error::InvalidArgument(message)) => {
                assert!(message.contains("nothing was sent"), "{message}")
            }
            other => panic!("expected a definite refusal, got {other:?}"),
        }
    }
    assert_eq!(
        attempts.lock().unwrap().len(),
        sent_before,
        "refused before sending"
    );
    assert_eq!(client.increment(b"after-huge", 1).await, Ok(1));

    // A session TTL beyond 366 days (u64::MAX kept every abandoned session
    // for ever) is refused before it is proposed; 366 days is taken.
    let status = patch_config(
        &raw,
        proto::RegistryConfigPatch {
            session_ttl_ms: Some(u64::MAX),
            ..Default::default()
        },
    )
    .await
    .unwrap_err();
    assert_eq!(reason(&status), Some(Reason::InvalidArgument), "{status}");
    assert!(status.message().contains("session_ttl_ms"), "{status}");
    let longest = oncekv_wire::convert::SESSION_TTL_MS_MAX.to_string();
    let run = oncekv(
        &e,
        &["admin", "config", "set", "--session-ttl-ms", &longest],
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    let run = oncekv(&e, &["admin", "config", "set", "--session-ttl-ms", "60000"]).await;
    assert_eq!(run.code, 0, "{run:?}");

    // A combination that would refuse every large response is refused,
    // through the API and the CLI, naming both fields; nothing changes.
    for cached in [0, VALUE_BYTES_MAX + 31] {
        let status = patch_config(
            &raw,
            proto::RegistryConfigPatch {
                cached_bytes_per_session_max: Some(cached),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
        assert_eq!(reason(&status), Some(Reason::InvalidArgument), "{status}");
        assert!(
            status.message().contains("cached_bytes_per_session_max")
                && status.message().contains("value_bytes_max"),
            "{status}"
        );
    }
    let run = oncekv(
        &e,
        &[
            "admin",
            "config",
            "set",
            "--cached-bytes-per-session-max",
            "100",
        ],
    )
    .await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("value_bytes_max"), "{run:?}");
    let status = patch_config(&raw, proto::RegistryConfigPatch::default())
        .await
        .unwrap_err();
    assert_eq!(reason(&status), Some(Reason::InvalidArgument), "{status}");

    // Two operators at once, each changing one field: both changes stay.
    let (window, ttl, value_max) = tokio::join!(
        oncekv(&e, &["admin", "config", "set", "--window", "64"]),
        oncekv(&e, &["admin", "config", "set", "--session-ttl-ms", "45000"]),
        patch_config(
            &raw,
            proto::RegistryConfigPatch {
                value_bytes_max: Some(2 * VALUE_BYTES_MAX),
                ..Default::default()
            },
        ),
    );
    window.ok();
    ttl.ok();
    value_max.expect("raise value_bytes_max");
    let shown = oncekv(&e, &["admin", "config", "--json"]).await.json();
    assert_eq!(shown["config"]["window"], 64);
    assert_eq!(shown["config"]["session_ttl_ms"], 45_000);
    assert_eq!(shown["config"]["value_bytes_max"], 2 * VALUE_BYTES_MAX);

    // The client still holds the old limit from its registration: it asks
    // again before refusing, and the put goes through.
    client.put(b"big", too_big()).await.unwrap();
    assert_eq!(client.get(b"big").await.unwrap(), Some(too_big()));
    client.close().await;
}

/// An unknown outcome reports the most informative reason its attempts
/// met: a call refused for a capacity limit (keys_max) until the leader
/// froze and a follower died names that limit, not the timeouts, "not the
/// leader" or refused connections its last attempts got. (Had every
/// attempt been refused provably unapplied — the limit, a node that
/// proposed nothing, a refused connection — the call would report the
/// limit itself: `tests/budget.rs`. An attempt that times out on the
/// frozen leader may still apply when it wakes: unknown.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcome_unknown_names_the_most_informative_reason() {
    let cluster = Cluster::start("limits-unknown").await;
    let raw = raw_client(&cluster).await;
    patch_config(
        &raw,
        proto::RegistryConfigPatch {
            keys_max: Some(1),
            ..Default::default()
        },
    )
    .await
    .expect("keys_max 1");
    let refused = Arc::new(tokio::sync::Notify::new());
    let signal = refused.clone();
    let config = ClientConfig {
        call_timeout: Duration::from_secs(8),
        attempt_timeout: Duration::from_secs(1),
        observer: Some(AttemptObserver::new(move |event| {
            if matches!(&event.outcome, AttemptOutcome::Retry { reason } if reason == "RESOURCE_EXHAUSTED")
            {
                signal.notify_one();
            }
        })),
        ..ClientConfig::default()
    };
    let client = Client::with_config(cluster.client_addrs(), config);
    client.put(b"a", Value::Int(1)).await.unwrap();
    let call = tokio::spawn({
        let client = client.clone();
        async move { client.increment(b"b", 1).await }
    });
    refused.notified().await;
    let leader = cluster.wait_for_leader(CALL_DEADLINE).await;
    cluster.pause(leader);
    cluster.kill((1..=3).find(|node| *node != leader).unwrap());
    let error = call.await.unwrap().unwrap_err();
    cluster.resume(leader);
    let Error::OutcomeUnknown { reason, .. } = &error else {
        panic!("expected an unknown outcome, got {error:?}");
    };
    assert!(reason.contains("keys_max"), "{reason}");
    assert!(reason.contains("the last of"), "{reason}");
}

/// The client port holds at most `--grpc-connections-per-ip-max`
/// connections from one address: one more is closed by the node at once,
/// before a byte is read, so idle callers cannot take its descriptors; a
/// closed connection gives its place back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_port_bounds_connections_per_address() {
    use tokio::io::AsyncReadExt;
    const PER_IP_MAX: usize = 4;
    let cluster = Cluster::start_with(
        "limits-connections",
        &["--grpc-connections-per-ip-max", &PER_IP_MAX.to_string()],
    )
    .await;
    let addr = cluster.client_addr(1);
    // Whether the node closes `stream` within a second (it sends nothing
    // before the client's HTTP/2 preface, so an admitted one stays silent).
    let closed_by_node = |mut stream: tokio::net::TcpStream| async move {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(1), stream.read(&mut byte)).await;
        (matches!(read, Ok(Ok(0)) | Ok(Err(_))), stream)
    };
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..PER_IP_MAX + 2 {
        let stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let (closed, stream) = closed_by_node(stream).await;
        if closed {
            refused += 1;
        } else {
            held.push(stream);
        }
    }
    assert!(held.len() <= PER_IP_MAX, "{} held", held.len());
    assert!(refused >= 2, "{refused} refused of {}", PER_IP_MAX + 2);
    // Each place comes back when its connection closes: a client gets in.
    drop(held);
    let e = vec![addr];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let run = oncekv(&e, &["status", "--json"]).await;
        if run.code == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{run:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
