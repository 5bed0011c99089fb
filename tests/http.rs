//! The HTTP/JSON API (docs/http.md) against real 3-node clusters: every
//! operation through a follower (which forwards to the leader), keys as
//! raw percent-decoded bytes, JSON errors with the gRPC reason names for
//! bad input, a request through a follower while the leader is killed,
//! HTTPS with bearer tokens passed through on a secure cluster, and
//! exactly-once writes with an `Idempotency-Key` (replays byte-identical,
//! reuse with another request 422, keys scoped by the token's principal),
//! and the HTTP port's bounds on slow or unauthenticated clients (bodies
//! trickled a byte at a time, connections per peer address and in total);
//! lists beyond the item bound and commands beyond the client port's
//! message bound are definite 400s, never an outcome unknown.

mod support;

use oncekv_core::Value;
use serde_json::json;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use support::cluster::{Cluster, NODES};
use support::http::{Http, Response, Stream, read_response, send};
use tokio::time::Instant;

const LEADER_TIMEOUT: Duration = Duration::from_secs(60);

/// A node that is not `leader`.
fn follower_of(leader: u64) -> u64 {
    *NODES
        .iter()
        .find(|&&node| node != leader)
        .expect("three nodes")
}

fn ok(response: Result<Response, String>) -> Response {
    let response = response.unwrap_or_else(|error| panic!("no response: {error}"));
    assert_eq!(
        response.status,
        200,
        "{:?}",
        String::from_utf8_lossy(&response.body)
    );
    response
}

/// An error response: the status, the JSON shape `{"reason", "message",
/// ...}` with a non-empty message, and a JSON content type.
fn error(response: Result<Response, String>, status: u16, reason: &str) -> serde_json::Value {
    let response = response.unwrap_or_else(|error| panic!("no response: {error}"));
    let body = response.json();
    assert_eq!(response.status, status, "{body}");
    assert_eq!(body["reason"], reason, "{body}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert_eq!(response.header("content-type"), Some("application/json"));
    body
}

/// Every operation through a follower: results mirror the command results,
/// reads see the writes on every node, keys are raw bytes (the library
/// reads what HTTP wrote under a non-UTF-8 key with a '/').
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_through_a_follower() {
    let cluster = Cluster::start("http-ops").await;
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let follower = follower_of(leader);
    let http = Http::plain(&cluster.http_addr(follower));

    let put = ok(http
        .json(
            "PUT",
            "/v1/kv/greeting",
            &[],
            json!({"value": {"bytes": "hello"}}),
        )
        .await);
    assert_eq!(put.json(), json!({"result": "stored"}));
    for node in NODES {
        let read = ok(Http::plain(&cluster.http_addr(node))
            .request("GET", "/v1/kv/greeting", &[], b"")
            .await);
        assert_eq!(
            read.json(),
            json!({"value": {"bytes": "hello"}}),
            "node {node}"
        );
    }

    // A key with '/' and a non-UTF-8 byte, a binary value.
    ok(http
        .json(
            "PUT",
            "/v1/kv/a%2F%FF",
            &[],
            json!({"value": {"bytes_base64": "AP8="}}),
        )
        .await);
    let library = oncekv_client::Client::connect(cluster.client_addrs());
    assert_eq!(
        library.get(b"a/\xff").await.expect("library read"),
        Some(Value::Bytes(vec![0, 0xff]))
    );
    let read = ok(http.request("GET", "/v1/kv/a%2f%ff", &[], b"").await);
    assert_eq!(read.json(), json!({"value": {"bytes_base64": "AP8="}}));

    let incr = |delta: i64| http.json("POST", "/v1/kv/n/incr", &[], json!({"delta": delta}));
    assert_eq!(
        ok(incr(5).await).json(),
        json!({"result": "incremented", "value": 5})
    );
    assert_eq!(
        ok(incr(-7).await).json(),
        json!({"result": "incremented", "value": -2})
    );
    assert_eq!(
        ok(http
            .json("POST", "/v1/kv/n/incr", &[], json!({"delta": i64::MIN}))
            .await)
        .json(),
        json!({"result": "overflow", "current": -2})
    );

    for (element, length) in [("x", 1), ("y", 2)] {
        let appended = ok(http
            .json("POST", "/v1/kv/l/append", &[], json!({"element": element}))
            .await);
        assert_eq!(
            appended.json(),
            json!({"result": "appended", "length": length})
        );
    }
    let list = ok(http.request("GET", "/v1/kv/l", &[], b"").await);
    assert_eq!(list.json(), json!({"value": {"list": ["x", "y"]}}));
    assert_eq!(
        ok(incr(1).await).json()["result"],
        "incremented",
        "n is still an int"
    );
    let wrong = ok(http
        .json("POST", "/v1/kv/l/incr", &[], json!({"delta": 1}))
        .await);
    assert_eq!(
        wrong.json(),
        json!({"result": "wrong_type", "actual": "list"})
    );

    let cas = |expected: serde_json::Value, new: serde_json::Value| {
        http.json(
            "POST",
            "/v1/kv/c/cas",
            &[],
            json!({"expected": expected, "new": new}),
        )
    };
    assert_eq!(
        ok(cas(json!(null), json!({"int": 1})).await).json(),
        json!({"result": "compare_and_swap", "swapped": true, "current": {"int": 1}})
    );
    assert_eq!(
        ok(cas(json!(null), json!({"int": 2})).await).json(),
        json!({"result": "compare_and_swap", "swapped": false, "current": {"int": 1}})
    );
    assert_eq!(
        ok(cas(json!({"int": 1}), json!({"bytes": "two"})).await).json(),
        json!({"result": "compare_and_swap", "swapped": true, "current": {"bytes": "two"}})
    );

    let deleted = ok(http.request("DELETE", "/v1/kv/c", &[], b"").await);
    assert_eq!(
        deleted.json(),
        json!({"result": "deleted", "existed": true})
    );
    let gone = http
        .request("GET", "/v1/kv/c", &[], b"")
        .await
        .expect("a response");
    assert_eq!((gone.status, gone.json()), (404, json!({"value": null})));
    let again = ok(http.request("DELETE", "/v1/kv/c", &[], b"").await);
    assert_eq!(again.json(), json!({"result": "deleted", "existed": false}));
    library.close().await;
}

/// Bad requests get 4xx JSON errors with the gRPC reason names, and none of
/// them executes anything: malformed keys and bodies, an oversized body, a
/// value over the replicated limit, a wrong method, an unknown path and a
/// malformed Idempotency-Key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_json_errors() {
    let cluster = Cluster::start("http-errors").await;
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let http = Http::plain(&cluster.http_addr(follower_of(leader)));
    let put = |path: &'static str, body: &'static [u8]| http.request("PUT", path, &[], body);

    error(
        put("/v1/kv/", br#"{"value":{"int":1}}"#).await,
        400,
        "INVALID_ARGUMENT",
    );
    error(
        put("/v1/kv/a%zz", br#"{"value":{"int":1}}"#).await,
        400,
        "INVALID_ARGUMENT",
    );
    let body = error(put("/v1/kv/k", b"{not json").await, 400, "INVALID_ARGUMENT");
    assert!(
        body["message"].as_str().unwrap().contains("request body"),
        "{body}"
    );
    error(
        put("/v1/kv/k", br#"{"value":"untyped"}"#).await,
        400,
        "INVALID_ARGUMENT",
    );
    error(
        put("/v1/kv/k", br#"{"value":{"int":1},"extra":true}"#).await,
        400,
        "INVALID_ARGUMENT",
    );
    error(
        http.request("POST", "/v1/kv/k/cas", &[], br#"{"new":{"int":1}}"#)
            .await,
        400,
        "INVALID_ARGUMENT",
    );

    // Oversized: refused on its Content-Length, before the body is read.
    let oversized = oncekv::network::http_api::BODY_BYTES_MAX + 1;
    let head = format!(
        "PUT /v1/kv/k HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {oversized}\r\n\r\n{{\"value\":"
    );
    let body = error(http.raw(head.as_bytes()).await, 413, "INVALID_ARGUMENT");
    assert_eq!(
        body["body_bytes_max"],
        oncekv::network::http_api::BODY_BYTES_MAX
    );

    // Over the replicated value limit (64 KiB by default): the cluster's
    // final refusal, with the limit's name and numbers.
    let big = "v".repeat(100_000);
    let body = error(
        http.json("PUT", "/v1/kv/k", &[], json!({"value": {"bytes": big}}))
            .await,
        400,
        "LIMIT_EXCEEDED",
    );
    assert_eq!(body["limit"], "value_bytes_max", "{body}");
    assert_eq!(body["limit_max"], 65536, "{body}");
    assert!(
        body["limit_requested"].as_u64().unwrap() >= 100_000,
        "{body}"
    );

    // A list beyond the most items any value can hold (LIST_ITEMS_MAX,
    // 524,288 empty items already exceed the hard bound on
    // value_bytes_max): LIMIT_EXCEEDED naming value_bytes_max, decided
    // while the body is parsed, not a decoder message of the node's own
    // forwarded call.
    let items = vec!["\"\""; 600_000].join(",");
    let wide = format!(r#"{{"value":{{"list":[{items}]}}}}"#);
    for headers in [&[][..], &[("Idempotency-Key", "wide-1")][..]] {
        let body = error(
            http.request("PUT", "/v1/kv/k", headers, wide.as_bytes())
                .await,
            400,
            "LIMIT_EXCEEDED",
        );
        assert_eq!(body["limit"], "value_bytes_max", "{body}");
        assert_eq!(body["limit_max"], 4 << 20, "{body}");
        assert_eq!(body["limit_requested"], 524_289 * 8, "{body}");
        assert!(
            !body["message"].as_str().unwrap().contains("Protobuf"),
            "{body}"
        );
    }

    // `-0` is a JSON integer: 0.
    ok(http
        .request("PUT", "/v1/kv/zero", &[], br#"{"value":{"int":-0}}"#)
        .await);
    assert_eq!(
        ok(http.request("GET", "/v1/kv/zero", &[], b"").await).json(),
        json!({"value": {"int": 0}})
    );

    let response = http.request("POST", "/v1/kv/k", &[], b"").await;
    assert_eq!(
        response.as_ref().ok().and_then(|r| r.header("allow")),
        Some("GET, PUT, DELETE")
    );
    error(response, 405, "INVALID_ARGUMENT");
    error(
        http.request("GET", "/v2/nothing", &[], b"").await,
        404,
        "INVALID_ARGUMENT",
    );
    error(
        http.request("POST", "/v1/kv/k/frobnicate", &[], b"").await,
        404,
        "INVALID_ARGUMENT",
    );
    let response = http
        .request("GET", "/v1/kv/k", &[("Authorization", "Basic dTpw")], b"")
        .await;
    assert_eq!(
        response
            .as_ref()
            .ok()
            .and_then(|r| r.header("www-authenticate")),
        Some("Bearer")
    );
    error(response, 401, "UNAUTHENTICATED");

    let http_ref = &http;
    let incr = |key: &'static str| async move {
        http_ref
            .request(
                "POST",
                "/v1/kv/counted/incr",
                &[("Idempotency-Key", key)],
                br#"{"delta":1}"#,
            )
            .await
    };
    error(incr("\"unterminated").await, 400, "INVALID_ARGUMENT");
    error(incr("two words").await, 400, "INVALID_ARGUMENT");

    // None of the above executed anything.
    for key in ["k", "counted"] {
        let read = http
            .request("GET", &format!("/v1/kv/{key}"), &[], b"")
            .await
            .expect("a response");
        assert_eq!(
            (read.status, read.json()),
            (404, json!({"value": null})),
            "{key}"
        );
    }
}

/// A command whose encoding is beyond the message bound of the node's
/// client port (8 MiB), in a body within the HTTP API's 12 MiB: nothing
/// can have executed, so the answer is a definite 4xx — never `503` with
/// `outcome_unknown` and "retry with the same key", which would fail the
/// same way forever. The client library refuses such a request before
/// sending it (`Error::InvalidArgument` or `Error::LimitExceeded`), and
/// the HTTP API maps that to 400 saying nothing was executed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_beyond_the_message_bound_are_definite_refusals() {
    let cluster = Cluster::start("http-message-bound").await;
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let http = Http::plain(&cluster.http_addr(follower_of(leader)));
    let nine_mib = "e".repeat(9 << 20);
    let append = format!(r#"{{"element":"{nine_mib}"}}"#);
    let put = format!(r#"{{"value":{{"bytes":"{nine_mib}"}}}}"#);
    for (method, path, key, body) in [
        ("POST", "/v1/kv/big/append", Some("big-append-1"), &append),
        ("PUT", "/v1/kv/big", Some("big-put-1"), &put),
        ("PUT", "/v1/kv/big", None, &put),
    ] {
        let headers: Vec<(&str, &str)> = key
            .map(|key| ("Idempotency-Key", key))
            .into_iter()
            .collect();
        let response = http
            .request(method, path, &headers, body.as_bytes())
            .await
            .unwrap_or_else(|error| panic!("{method} {path}: no response: {error}"));
        let answer = response.json();
        assert!(
            (400..500).contains(&response.status),
            "{method} {path} {key:?}: {} {answer}",
            response.status
        );
        assert!(
            matches!(
                answer["reason"].as_str(),
                Some("INVALID_ARGUMENT" | "LIMIT_EXCEEDED")
            ),
            "{answer}"
        );
        assert_eq!(answer.get("outcome_unknown"), None, "{answer}");
        assert_eq!(answer.get("retry_with_same_key"), None, "{answer}");
        assert!(
            answer["message"]
                .as_str()
                .is_some_and(|message| message.contains("nothing was")),
            "{answer}"
        );
    }
    let read = http.request("GET", "/v1/kv/big", &[], b"").await.unwrap();
    assert_eq!((read.status, read.json()), (404, json!({"value": null})));
}

/// A write through a follower while the leader is killed: the node retries
/// on the new leader within its deadline, so the request eventually
/// succeeds (bounded wait), and it is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_forwards_across_a_leader_kill() {
    let cluster = Cluster::start("http-failover").await;
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let follower = follower_of(leader);
    let http = Http::plain(&cluster.http_addr(follower));
    let incr = || http.json("POST", "/v1/kv/n/incr", &[], json!({"delta": 1}));
    assert_eq!(ok(incr().await).json()["value"], 1);

    cluster.kill(leader);
    // Sent at once, during the election.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut attempts = 0;
    let value = loop {
        attempts += 1;
        match incr().await {
            Ok(response) if response.status == 200 => break response.json()["value"].clone(),
            Ok(response) => {
                // Only "try again" answers are acceptable meanwhile.
                assert_eq!(response.status, 503, "{:?}", response.json());
                assert_eq!(response.json()["reason"], "UNAVAILABLE");
            }
            Err(error) => panic!("no response from the follower: {error}"),
        }
        assert!(
            Instant::now() < deadline && attempts < 10,
            "no success through node {follower} after {attempts} attempts"
        );
    };
    // At-least-once: a retry inside the node may apply it twice.
    assert!(value == 2 || value == 3, "{value}");
    let new_leader = cluster.wait_for_new_leader(leader).await;
    assert_ne!(new_leader, leader);
    let read = ok(http.request("GET", "/v1/kv/n", &[], b"").await);
    assert_eq!(read.json(), json!({"value": {"int": value}}));
}

/// A write without a key that may have applied says so (rule 22): sent
/// right after both followers are killed, the increment goes into the
/// leader's log but cannot commit (it may still apply once they are back;
/// the leader soon stops leading, and later attempts meet an election), so
/// the 503 carries `"outcome_unknown": true`, unlike a 503 that proves
/// nothing executed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_write_that_may_have_applied_says_so() {
    let cluster = Cluster::start("http-unknown").await;
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let http = Http::plain(&cluster.http_addr(leader));
    assert_eq!(ok(incr_plain(&http).await).json()["value"], 1);
    for node in NODES.into_iter().filter(|&node| node != leader) {
        cluster.kill(node);
    }
    let body = error(incr_plain(&http).await, 503, "UNAVAILABLE");
    assert_eq!(body["outcome_unknown"], true, "{body}");
}

/// On a node with TLS the HTTP port is HTTPS with the node's certificate;
/// the caller's bearer token is what the node authenticates (never the
/// node's own identity): no token or an unknown one is 401; the same
/// Idempotency-Key from two tokens' principals is two keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_passes_the_callers_token_through() {
    let cluster = Cluster::start_secure("http-secure", &[]).await;
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let follower = follower_of(leader);
    let https = Http::tls(&cluster.http_addr(follower), &cluster.pki().join("ca.pem"));
    let token = |name: &str| {
        std::fs::read_to_string(cluster.pki().join(format!("{name}.token")))
            .expect("read a token")
            .trim()
            .to_string()
    };
    let alice = format!("Bearer {}", token("alice"));
    let bob = format!("Bearer {}", token("bob"));

    let put = https
        .json(
            "PUT",
            "/v1/kv/secret",
            &[("Authorization", &alice)],
            json!({"value": {"bytes": "s"}}),
        )
        .await;
    assert_eq!(ok(put).json(), json!({"result": "stored"}));
    let read = ok(https
        .request("GET", "/v1/kv/secret", &[("Authorization", &bob)], b"")
        .await);
    assert_eq!(read.json(), json!({"value": {"bytes": "s"}}));

    error(
        https.request("GET", "/v1/kv/secret", &[], b"").await,
        401,
        "UNAUTHENTICATED",
    );
    error(
        https
            .json(
                "PUT",
                "/v1/kv/secret",
                &[("Authorization", "Bearer not-a-token-of-this-cluster")],
                json!({"value": {"bytes": "x"}}),
            )
            .await,
        401,
        "UNAUTHENTICATED",
    );
    // Plain HTTP on the HTTPS port gets no answer.
    assert!(
        Http::plain(&cluster.http_addr(follower))
            .request("GET", "/v1/kv/secret", &[], b"")
            .await
            .is_err()
    );
    let read = ok(https
        .request("GET", "/v1/kv/secret", &[("Authorization", &alice)], b"")
        .await);
    assert_eq!(read.json(), json!({"value": {"bytes": "s"}}), "unchanged");

    // An Idempotency-Key belongs to the token's principal: alice's and
    // bob's "order-1" are two keys, so both increments execute; each
    // caller's repeat is a replay of its own first answer.
    let incr = async |auth: &str| {
        https
            .request(
                "POST",
                "/v1/kv/orders/incr",
                &[("Authorization", auth), ("Idempotency-Key", "\"order-1\"")],
                br#"{"delta":1}"#,
            )
            .await
    };
    let by_alice = ok(incr(&alice).await);
    assert_eq!(
        by_alice.json(),
        json!({"result": "incremented", "value": 1})
    );
    assert_eq!(by_alice.header("idempotent-replayed"), Some("false"));
    let by_bob = ok(incr(&bob).await);
    assert_eq!(by_bob.json(), json!({"result": "incremented", "value": 2}));
    assert_eq!(by_bob.header("idempotent-replayed"), Some("false"));
    for (auth, first) in [(&alice, &by_alice), (&bob, &by_bob)] {
        let replay = ok(incr(auth).await);
        assert_eq!(replay.body, first.body);
        assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    }
    let read = ok(https
        .request("GET", "/v1/kv/orders", &[("Authorization", &bob)], b"")
        .await);
    assert_eq!(read.json(), json!({"value": {"int": 2}}));
}

/// `POST .../incr` with an `Idempotency-Key` through a follower: the
/// second request is a replay (same status, byte-identical body,
/// `Idempotent-Replayed: true`) and the counter moved once; the key with
/// another body or method is 422 KEY_CONFLICT and executes nothing; a
/// malformed key is 400; a GET ignores the header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_key_replays_the_original_answer() {
    let cluster = Cluster::start("http-keyed").await;
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let http = Http::plain(&cluster.http_addr(follower_of(leader)));
    let incr = async |key: &str, body: &[u8]| {
        http.request("POST", "/v1/kv/k/incr", &[("Idempotency-Key", key)], body)
            .await
    };
    let read = || async {
        ok(http
            .request("GET", "/v1/kv/k", &[("Idempotency-Key", "\"k1\"")], b"")
            .await)
        .json()
    };

    let first = ok(incr("\"k1\"", br#"{"delta":5}"#).await);
    assert_eq!(first.header("idempotent-replayed"), Some("false"));
    assert_eq!(first.json(), json!({"result": "incremented", "value": 5}));
    // The bare-token spelling of the same key, the same body with other
    // whitespace: the same key and command.
    let replay = ok(incr("k1", br#"{ "delta": 5 }"#).await);
    assert_eq!(replay.status, first.status);
    assert_eq!(
        replay.body,
        first.body,
        "{:?}",
        String::from_utf8_lossy(&replay.body)
    );
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(
        read().await,
        json!({"value": {"int": 5}}),
        "incremented once"
    );

    // Another body, another method on the same path key, another path key:
    // another command, refused, nothing executed.
    let body = error(incr("\"k1\"", br#"{"delta":6}"#).await, 422, "KEY_CONFLICT");
    assert_eq!(body["idempotency_key"], "k1", "{body}");
    error(
        http.request("DELETE", "/v1/kv/k", &[("Idempotency-Key", "k1")], b"")
            .await,
        422,
        "KEY_CONFLICT",
    );
    error(
        http.request(
            "POST",
            "/v1/kv/other/incr",
            &[("Idempotency-Key", "k1")],
            br#"{"delta":5}"#,
        )
        .await,
        422,
        "KEY_CONFLICT",
    );
    error(
        incr("\"k1", br#"{"delta":5}"#).await,
        400,
        "INVALID_ARGUMENT",
    );
    assert_eq!(
        read().await,
        json!({"value": {"int": 5}}),
        "nothing else ran"
    );

    // The key still answers its first request.
    let again = ok(incr("k1", br#"{"delta":5}"#).await);
    assert_eq!(again.body, first.body);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    // A GET ignores the header, even a malformed one.
    ok(http
        .request("GET", "/v1/kv/k", &[("Idempotency-Key", "\"bad")], b"")
        .await);
    // A write without a key has no such header.
    let plain = ok(incr_plain(&http).await);
    assert_eq!(plain.header("idempotent-replayed"), None);
    assert_eq!(plain.json()["value"], 6);
}

async fn incr_plain(http: &Http) -> Result<Response, String> {
    http.json("POST", "/v1/kv/k/incr", &[], json!({"delta": 1}))
        .await
}

// ---- slow clients ------------------------------------------------------------

/// The address the slow clients connect from: another peer than the
/// normal requests' 127.0.0.1.
const SLOW_PEER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
/// How many slow clients: the default bound of connections per peer
/// address, and the default number of HTTP requests in flight.
const SLOW_CLIENTS: usize = 64;
/// The body a slow client declares; it never sends more than a few bytes.
const TRICKLE_BODY_BYTES: usize = 1 << 20;
/// A slow client sends one byte of its body this often.
const TRICKLE_EVERY: Duration = Duration::from_millis(400);
/// The body deadline the slow-client tests give their nodes.
const BODY_TIMEOUT: Duration = Duration::from_secs(3);
const NODE_LIMITS: [&str; 2] = ["--http-body-timeout-ms", "3000"];

/// A slowloris connection: its request head declares a body of
/// [`TRICKLE_BODY_BYTES`], then one byte of it follows every
/// [`TRICKLE_EVERY`] while the response is read.
struct Trickler {
    /// Body bytes sent so far.
    sent: Arc<AtomicUsize>,
    /// The response, the body bytes sent before it came, and how long
    /// after the head it came.
    task: tokio::task::JoinHandle<(Result<Response, String>, usize, Duration)>,
}

impl Trickler {
    fn start(http: &Http, path: &str, headers: &[(&str, &str)]) -> Trickler {
        let mut head =
            format!("PUT {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {TRICKLE_BODY_BYTES}\r\n");
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        let sent = Arc::new(AtomicUsize::new(0));
        let counter = sent.clone();
        let http = http.clone();
        let task = tokio::spawn(async move {
            let stream = match http.connect().await {
                Ok(stream) => stream,
                Err(error) => return (Err(error), 0, Duration::ZERO),
            };
            let started = Instant::now();
            let response = tokio::time::timeout(
                support::http::REQUEST_TIMEOUT,
                trickle(stream, head.as_bytes(), &counter),
            )
            .await
            .unwrap_or_else(|_| Err("no response while trickling".into()));
            (response, counter.load(Ordering::SeqCst), started.elapsed())
        });
        Trickler { sent, task }
    }

    fn sent(&self) -> usize {
        self.sent.load(Ordering::SeqCst)
    }

    async fn finish(self) -> (Result<Response, String>, usize, Duration) {
        self.task.await.expect("the trickling task")
    }
}

/// Sends `head`, then a body byte every [`TRICKLE_EVERY`] (counted in
/// `sent`) until the response has been read.
async fn trickle(
    stream: Box<dyn Stream>,
    head: &[u8],
    sent: &AtomicUsize,
) -> Result<Response, String> {
    let (mut reader, mut writer) = tokio::io::split(stream);
    send(&mut writer, head).await?;
    let reading = read_response(&mut reader);
    let mut reading = std::pin::pin!(reading);
    let mut ticks = tokio::time::interval_at(Instant::now() + TRICKLE_EVERY, TRICKLE_EVERY);
    let mut writing = true;
    loop {
        tokio::select! {
            response = &mut reading => return response,
            _ = ticks.tick(), if writing => {
                // A server that answered may close: the answer is what counts.
                match send(&mut writer, b" ").await {
                    Ok(()) => {
                        sent.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(_) => writing = false,
                }
            }
        }
    }
}

/// Waits (bounded) until every trickler has sent `bytes` body bytes: by
/// then the node has had their heads for a while.
async fn wait_trickling(tricklers: &[Trickler], bytes: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while tricklers.iter().any(|trickler| trickler.sent() < bytes) {
        assert!(
            Instant::now() < deadline,
            "the slow clients did not get going"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A normal write through `http` with `headers`: answered 200 in under a
/// second.
async fn answered_at_once(http: &Http, headers: &[(&str, &str)]) {
    let started = Instant::now();
    let response = http
        .json("POST", "/v1/kv/normal/incr", headers, json!({"delta": 1}))
        .await;
    let took = started.elapsed();
    ok(response);
    assert!(
        took < Duration::from_secs(1),
        "a normal request beside the slow clients took {took:?}"
    );
}

/// Every trickler is answered 408 once the body deadline passes, and not
/// before: its body was never sent.
async fn timed_out(tricklers: Vec<Trickler>) {
    for trickler in tricklers {
        let (response, sent, after) = trickler.finish().await;
        let body = error(response, 408, "UNAVAILABLE");
        assert!(sent < TRICKLE_BODY_BYTES);
        assert!(
            after + Duration::from_millis(100) >= BODY_TIMEOUT
                && after < BODY_TIMEOUT + Duration::from_secs(5),
            "408 after {after:?}: {body}"
        );
    }
}

/// A slowloris client cannot hold the HTTP API: 64 connections (the
/// default bound per peer address) that send their headers and then
/// trickle their bodies hold no request permit, so a normal request is
/// still answered, in under a second; a 65th connection from their
/// address and one past `--http-connections-max` are refused at once with
/// a JSON 503 naming the bound; once the body deadline passes every slow
/// client is answered 408, its body unsent, and its address is served
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_do_not_hold_the_http_api() {
    let mut args = NODE_LIMITS.to_vec();
    args.extend(["--http-connections-max", "70"]);
    let cluster = Cluster::start_with("http-slowloris", &args).await;
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let http = Http::plain(&cluster.http_addr(follower_of(leader)));
    answered_at_once(&http, &[]).await;

    let slow = http.connecting_from(SLOW_PEER);
    let tricklers: Vec<Trickler> = (0..SLOW_CLIENTS)
        .map(|i| Trickler::start(&slow, &format!("/v1/kv/slow-{i}"), &[]))
        .collect();
    wait_trickling(&tricklers, 2).await;
    answered_at_once(&http, &[]).await;

    // One more from the slow address: over its bound, refused at once.
    let refused = error(
        slow.request("GET", "/v1/kv/normal", &[], b"").await,
        503,
        "UNAVAILABLE",
    );
    assert_eq!(refused["http_connections_per_ip_max"], 64, "{refused}");
    // From a third address, idle keep-alive connections fill the node's
    // 70 (64 slow ones, one maybe still closing); the next is refused.
    let other = http.connecting_from(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3)));
    let mut held = Vec::new();
    let refused = loop {
        assert!(held.len() <= 6, "{} more connections accepted", held.len());
        let mut stream = other.connect().await.expect("connect");
        send(
            &mut stream,
            b"GET /v1/kv/normal HTTP/1.1\r\nHost: x\r\n\r\n",
        )
        .await
        .expect("send");
        let response = read_response(&mut stream).await;
        match response {
            Ok(response) if response.status == 503 => break Ok(response),
            Ok(response) => assert_eq!(response.status, 200),
            Err(error) => panic!("no answer: {error}"),
        }
        held.push(stream);
    };
    assert!(held.len() >= 5, "refused after {} more", held.len());
    let refused = error(refused, 503, "UNAVAILABLE");
    assert_eq!(refused["http_connections_max"], 70, "{refused}");
    drop(held);

    timed_out(tricklers).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let response = slow.request("GET", "/v1/kv/normal", &[], b"").await;
        match response {
            Ok(response) if response.status == 200 => break,
            // The slow connections' slots are freed as their tasks end.
            Ok(response) if response.status == 503 && Instant::now() < deadline => {}
            other => panic!("the slow address is not served again: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// With authentication on (HTTPS, tokens), slow clients without valid
/// credentials are refused before their body: each of 32 that send
/// headers without a token or with an unknown one and then trickle a body
/// is answered 401 at once, its body unsent; 32 slow clients with a valid
/// token hold no request permit, so a normal authenticated request is
/// still answered in under a second; they get 408 at the body deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_slow_bodies_are_refused_before_the_body() {
    let cluster = Cluster::start_secure("http-slowloris-tls", &NODE_LIMITS).await;
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let https = Http::tls(
        &cluster.http_addr(follower_of(leader)),
        &cluster.pki().join("ca.pem"),
    );
    let token = std::fs::read_to_string(cluster.pki().join("alice.token")).expect("a token");
    let alice = format!("Bearer {}", token.trim());
    let authorized = [("Authorization", alice.as_str())];
    answered_at_once(&https, &authorized).await;

    let slow = https.connecting_from(SLOW_PEER);
    let mut unauthenticated = Vec::new();
    let mut authenticated = Vec::new();
    for i in 0..SLOW_CLIENTS / 2 {
        let path = format!("/v1/kv/slow-{i}");
        let wrong: &[(&str, &str)] = if i % 2 == 0 {
            &[]
        } else {
            &[("Authorization", "Bearer not-a-token-of-this-cluster")]
        };
        unauthenticated.push(Trickler::start(&slow, &path, wrong));
        authenticated.push(Trickler::start(&slow, &path, &authorized));
    }
    for trickler in unauthenticated {
        let (response, sent, after) = trickler.finish().await;
        error(response, 401, "UNAUTHENTICATED");
        assert!(
            sent < TRICKLE_BODY_BYTES && after < Duration::from_secs(2),
            "401 after {after:?} and {sent} body bytes"
        );
    }
    wait_trickling(&authenticated, 2).await;
    answered_at_once(&https, &authorized).await;
    timed_out(authenticated).await;
}
