//! Claims over the HTTP/JSON API (`/v1/claims/{key}`, docs/http.md
//! "Claims", rule 20) against real 3-node clusters, through a follower: a
//! won claim is 201, completed, and every later claim is 200 with
//! `Idempotent-Replayed: true` and the recorded result's bytes; a claim
//! while the holder works is 409 `IN_PROGRESS` with `Retry-After`; another
//! fingerprint is 422 `KEY_CONFLICT`; the same claim sent again (the same
//! `claim_id`, or the same `Idempotency-Key`) gets its own win back; a
//! holder whose short lease was taken over is 409 `FENCED` on complete,
//! extend and release; a claim whose outcome is unknown at the deadline is
//! 503 naming the `claim_id` to send again; and on a secure cluster a claim is the token's
//! principal's (no token: 401; two principals' equal keys: two claims).

mod support;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use oncekv_core::ClaimAnswer;
use serde_json::{Value as Json, json};
use std::time::Duration;
use support::cluster::{Cluster, NODES};
use support::http::{Http, Response};
use tokio::time::Instant;

const LEADER_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a short lease's takeover may take to be seen.
const TAKEOVER_TIMEOUT: Duration = Duration::from_secs(20);

const CLAIM_A: &str = "0123456789abcdef0123456789abcdef";
const CLAIM_B: &str = "fedcba9876543210fedcba9876543210";

/// A node that is not `leader`.
fn follower_of(leader: u64) -> u64 {
    *NODES
        .iter()
        .find(|&&node| node != leader)
        .expect("three nodes")
}

/// The response, with `status`; its JSON body.
fn expect(response: Result<Response, String>, status: u16) -> (Response, Json) {
    let response = response.unwrap_or_else(|error| panic!("no response: {error}"));
    let body = response.json();
    assert_eq!(response.status, status, "{body}");
    (response, body)
}

/// A refusal: `status`, `reason`, a message, and the content type.
fn refusal(
    response: Result<Response, String>,
    status: u16,
    reason: &str,
    content_type: &str,
) -> (Response, Json) {
    let (response, body) = expect(response, status);
    assert_eq!(body["reason"], reason, "{body}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert_eq!(response.header("content-type"), Some(content_type));
    (response, body)
}

async fn claim(
    http: &Http,
    key: &str,
    headers: &[(&str, &str)],
    body: Json,
) -> Result<Response, String> {
    http.json("POST", &format!("/v1/claims/{key}"), headers, body)
        .await
}

async fn call(http: &Http, key: &str, operation: &str, body: Json) -> Result<Response, String> {
    http.json("POST", &format!("/v1/claims/{key}/{operation}"), &[], body)
        .await
}

/// Claim → do the effect → complete, through a follower; every later claim
/// replays the recorded bytes (200, `Idempotent-Replayed: true`,
/// byte-identical bodies) without a win; meanwhile a second claimer is 409
/// with `Retry-After`, another fingerprint 422, and the winner's own claim
/// sent again (same `claim_id` or same `Idempotency-Key`) is its own win.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_is_won_once_completed_and_replayed() {
    let cluster = Cluster::start("http-claims").await;
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let http = Http::plain(&cluster.http_addr(follower_of(leader)));
    let charge = |claim_id: &str| {
        json!({
            "fingerprint": "charge order 1 EUR 10",
            "lease_ms": 30_000,
            "claim_id": claim_id,
        })
    };

    // Won: 201, the effect is ours.
    let (won, first) = expect(claim(&http, "order-1", &[], charge(CLAIM_A)).await, 201);
    assert_eq!(won.header("idempotent-replayed"), Some("false"));
    assert_eq!(first["state"], "won", "{first}");
    assert_eq!(first["attempt"], 1, "{first}");
    assert_eq!(first["duplicate"], false, "{first}");
    assert_eq!(first["claim_id"], CLAIM_A, "{first}");
    let fence = first["fence"].as_u64().expect("a fence");
    let left = first["lease_ms_left"].as_u64().expect("the lease left");
    assert!(left > 0 && left <= 30_000, "{first}");

    // The same claim again (a retry after a lost answer): its own win.
    let (again, own) = expect(claim(&http, "order-1", &[], charge(CLAIM_A)).await, 201);
    assert_eq!(again.header("idempotent-replayed"), Some("false"));
    assert_eq!(
        (own["fence"].as_u64(), own["attempt"].as_u64()),
        (Some(fence), Some(1))
    );
    assert_eq!(own["duplicate"], true, "{own}");

    // Another claimer while the holder works: 409, come back later.
    let (busy, body) = refusal(
        claim(&http, "order-1", &[], charge(CLAIM_B)).await,
        409,
        "IN_PROGRESS",
        "application/problem+json",
    );
    let retry_after_ms = body["retry_after_ms"].as_u64().expect("retry_after_ms");
    assert!(retry_after_ms > 0 && retry_after_ms <= 30_000, "{body}");
    let seconds: u64 = busy
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .expect("whole seconds");
    assert_eq!(seconds, retry_after_ms.div_ceil(1000), "{body}");
    assert_eq!(
        (body["status"].as_u64(), body["attempt"].as_u64()),
        (Some(409), Some(1))
    );

    // Another effect under the same key: 422, nothing claimed.
    let (_, body) = refusal(
        claim(
            &http,
            "order-1",
            &[],
            json!({"fingerprint": "charge order 1 EUR 99", "lease_ms": 30_000}),
        )
        .await,
        422,
        "KEY_CONFLICT",
        "application/problem+json",
    );
    assert_eq!(body["key"], "order-1", "{body}");
    assert_eq!(body["status"], 422, "{body}");

    // The effect's result, not UTF-8: recorded under the fence.
    let result = b"\xffcharged: receipt 77".to_vec();
    let complete = json!({"fence": fence, "result_base64": BASE64.encode(&result)});
    let (_, completed) = expect(
        call(&http, "order-1", "complete", complete.clone()).await,
        200,
    );
    assert_eq!(completed["state"], "completed", "{completed}");
    assert_eq!(completed["fence"], fence, "{completed}");
    // The same complete again is answered from the record; one with
    // another result is FENCED under the caller's own fence and records
    // nothing (the replays below still carry the first result).
    let (_, again) = expect(call(&http, "order-1", "complete", complete).await, 200);
    assert_eq!(again["completed_ms"], completed["completed_ms"], "{again}");
    let (_, other) = refusal(
        call(
            &http,
            "order-1",
            "complete",
            json!({"fence": fence, "result": "another receipt"}),
        )
        .await,
        409,
        "FENCED",
        "application/json",
    );
    assert_eq!(other["current_fence"], fence, "{other}");
    assert!(
        other["message"]
            .as_str()
            .is_some_and(|message| message.contains("finished already")),
        "{other}"
    );

    // Every later claim, whoever sends it: the recorded result, no win.
    let mut replays = Vec::new();
    for claim_id in [CLAIM_B, CLAIM_A, "00000000000000000000000000000001"] {
        let (replay, body) = expect(claim(&http, "order-1", &[], charge(claim_id)).await, 200);
        assert_eq!(replay.header("idempotent-replayed"), Some("true"));
        assert_eq!(body["state"], "completed", "{body}");
        let bytes = BASE64
            .decode(body["result_base64"].as_str().expect("result_base64"))
            .expect("base64");
        assert_eq!(bytes, result);
        assert_eq!(
            (body["fence"].as_u64(), body["attempt"].as_u64()),
            (Some(fence), Some(1))
        );
        replays.push(replay.body);
    }
    assert!(
        replays.iter().all(|body| *body == replays[0]),
        "byte-identical replays"
    );
    // The library, on the gRPC port, sees the same record.
    let library = oncekv_client::Client::connect(cluster.client_addrs());
    match library
        .claim(
            b"order-1",
            b"charge order 1 EUR 10",
            Duration::from_secs(30),
        )
        .await
        .expect("the library claims")
    {
        ClaimAnswer::Completed {
            result: seen,
            fence: seen_fence,
            ..
        } => {
            assert_eq!((seen, seen_fence), (result, fence));
        }
        other => panic!("expected the completed record, got {other:?}"),
    }
    library.close().await;

    // A claim named by an Idempotency-Key instead: the header sent again
    // is the same claim (its own win), another header is another claimer.
    let job = json!({"fingerprint": "job 9", "lease_ms": 30_000});
    let (_, keyed) = expect(
        claim(
            &http,
            "job-9",
            &[("Idempotency-Key", "\"run-9-a\"")],
            job.clone(),
        )
        .await,
        201,
    );
    let (_, keyed_again) = expect(
        claim(
            &http,
            "job-9",
            &[("Idempotency-Key", "run-9-a")],
            job.clone(),
        )
        .await,
        201,
    );
    assert_eq!(keyed_again["fence"], keyed["fence"]);
    assert_eq!(keyed_again["claim_id"], keyed["claim_id"]);
    assert_eq!(keyed_again["duplicate"], true, "{keyed_again}");
    refusal(
        claim(
            &http,
            "job-9",
            &[("Idempotency-Key", "\"run-9-b\"")],
            job.clone(),
        )
        .await,
        409,
        "IN_PROGRESS",
        "application/problem+json",
    );
    // Without either, each request is a claimer of its own.
    refusal(
        claim(&http, "job-9", &[], job).await,
        409,
        "IN_PROGRESS",
        "application/problem+json",
    );
}

/// A holder whose short lease ran out is taken over (201, attempt 2, a
/// larger fence); from then on its complete, extend and release are 409
/// `FENCED` naming the new fence, and nothing it sends is recorded. The
/// new holder extends and releases (the effect did not happen), and the
/// next claim wins at once with attempt 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holder_is_fenced() {
    let cluster = Cluster::start("http-claims-fenced").await;
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let http = Http::plain(&cluster.http_addr(follower_of(leader)));
    let job = |claim_id: &str, lease_ms: u64| {
        json!({
            "fingerprint": "deploy 42",
            "lease_ms": lease_ms,
            "claim_id": claim_id,
        })
    };

    let (_, first) = expect(
        claim(&http, "deploy-42", &[], job(CLAIM_A, 1_000)).await,
        201,
    );
    let stale = first["fence"].as_u64().expect("a fence");

    // The holder goes silent; another claimer comes back as told until the
    // lease has run out in cluster time.
    let give_up = Instant::now() + TAKEOVER_TIMEOUT;
    let taken = loop {
        let response = claim(&http, "deploy-42", &[], job(CLAIM_B, 30_000))
            .await
            .unwrap_or_else(|error| panic!("no response: {error}"));
        let body = response.json();
        match response.status {
            201 => break body,
            409 if body["reason"] == "IN_PROGRESS" && Instant::now() < give_up => {
                let wait = body["retry_after_ms"].as_u64().expect("retry_after_ms");
                tokio::time::sleep(Duration::from_millis(wait.clamp(10, 1_000))).await;
            }
            status => panic!("expected a takeover, got {status}: {body}"),
        }
    };
    let fence = taken["fence"].as_u64().expect("a fence");
    assert!(fence > stale, "a larger fence: {taken}");
    assert_eq!(taken["attempt"], 2, "{taken}");

    // The stale holder wakes up: everything it sends is FENCED.
    for (operation, body) in [
        ("complete", json!({"fence": stale, "result": "late"})),
        ("extend", json!({"fence": stale, "lease_ms": 30_000})),
        ("release", json!({"fence": stale})),
    ] {
        let (_, refused) = refusal(
            call(&http, "deploy-42", operation, body).await,
            409,
            "FENCED",
            "application/json",
        );
        assert_eq!(refused["current_fence"], fence, "{operation}: {refused}");
    }

    // The new holder still holds it: it extends, then gives up.
    let (_, extended) = expect(
        call(
            &http,
            "deploy-42",
            "extend",
            json!({"fence": fence, "lease_ms": 20_000}),
        )
        .await,
        200,
    );
    assert_eq!(extended["state"], "held", "{extended}");
    assert!(
        extended["lease_ms_left"]
            .as_u64()
            .is_some_and(|left| left > 10_000)
    );
    let (_, released) = expect(
        call(&http, "deploy-42", "release", json!({"fence": fence})).await,
        200,
    );
    assert_eq!(released, json!({"state": "released", "fence": fence}));
    // The same release again (a retry) is answered from the record: 200,
    // the same body; an extend or complete of the released claim is 409
    // FENCED with the holder's own fence (its claim is finished).
    let (_, again) = expect(
        call(&http, "deploy-42", "release", json!({"fence": fence})).await,
        200,
    );
    assert_eq!(again, released);
    for (operation, body) in [
        ("extend", json!({"fence": fence, "lease_ms": 20_000})),
        ("complete", json!({"fence": fence, "result": "late"})),
    ] {
        let (_, finished) = refusal(
            call(&http, "deploy-42", operation, body).await,
            409,
            "FENCED",
            "application/json",
        );
        assert_eq!(finished["current_fence"], fence, "{operation}: {finished}");
    }

    // Released: the next claim wins at once, nothing of "late" recorded.
    let (_, next) = expect(
        claim(
            &http,
            "deploy-42",
            &[],
            job("000000000000000000000000000000cc", 30_000),
        )
        .await,
        201,
    );
    assert_eq!(next["attempt"], 3, "{next}");
    assert!(
        next["fence"].as_u64().is_some_and(|next| next > fence),
        "{next}"
    );
    // Once another claim took the key, the old fence's release is FENCED
    // with the new holder's fence.
    let (_, taken) = refusal(
        call(&http, "deploy-42", "release", json!({"fence": fence})).await,
        409,
        "FENCED",
        "application/json",
    );
    assert_eq!(taken["current_fence"], next["fence"], "{taken}");
}

/// A claim whose fate is open at the node's deadline (no quorum: both
/// followers paused) is 503 with `outcome_unknown` and the `claim_id` the
/// node chose for it; sent again with that id once the cluster is whole,
/// it is the caller's own claim (201, the same id), never "in progress"
/// against itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_outcome_names_the_claim_to_send_again() {
    let cluster = Cluster::start("http-claims-unknown").await;
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let http = Http::plain(&cluster.http_addr(leader));
    let followers: Vec<u64> = NODES.into_iter().filter(|&node| node != leader).collect();
    for &node in &followers {
        cluster.pause(node);
    }
    let payout = json!({"fingerprint": "payout 3", "lease_ms": 60_000});
    let (_, unknown) = refusal(
        claim(&http, "payout-3", &[], payout.clone()).await,
        503,
        "UNAVAILABLE",
        "application/json",
    );
    for &node in &followers {
        cluster.resume(node);
    }
    assert_eq!(unknown["outcome_unknown"], true, "{unknown}");
    assert_eq!(unknown["retry_with_same_key"], true, "{unknown}");
    let claim_id = unknown["claim_id"]
        .as_str()
        .expect("the claim_id")
        .to_string();
    assert!(
        unknown["message"]
            .as_str()
            .is_some_and(|m| m.contains(&claim_id)),
        "{unknown}"
    );
    cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let mut again = payout;
    again["claim_id"] = Json::from(claim_id.clone());
    let (_, won) = expect(claim(&http, "payout-3", &[], again).await, 201);
    assert_eq!(won["claim_id"], claim_id.as_str(), "{won}");
    assert_eq!(won["attempt"], 1, "{won}");
}

/// On a secure cluster the caller's bearer token is checked from the
/// headers (no token: 401, before the body) and a claim belongs to the
/// token's principal: alice's and bob's "invoice-5" are two claims, both
/// won; alice's completion replays to her while bob's stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_belong_to_the_tokens_principal() {
    let cluster = Cluster::start_secure("http-claims-secure", &[]).await;
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let https = Http::tls(
        &cluster.http_addr(follower_of(leader)),
        &cluster.pki().join("ca.pem"),
    );
    let bearer = |name: &str| {
        let token = std::fs::read_to_string(cluster.pki().join(format!("{name}.token")))
            .expect("read a token");
        format!("Bearer {}", token.trim())
    };
    let (alice, bob) = (bearer("alice"), bearer("bob"));
    let invoice = json!({"fingerprint": "send invoice 5", "lease_ms": 30_000});

    refusal(
        claim(&https, "invoice-5", &[], invoice.clone()).await,
        401,
        "UNAUTHENTICATED",
        "application/json",
    );
    let (_, by_alice) = expect(
        claim(
            &https,
            "invoice-5",
            &[("Authorization", &alice)],
            invoice.clone(),
        )
        .await,
        201,
    );
    let (_, by_bob) = expect(
        claim(&https, "invoice-5", &[("Authorization", &bob)], invoice).await,
        201,
    );
    assert_eq!(
        (by_alice["attempt"].as_u64(), by_bob["attempt"].as_u64()),
        (Some(1), Some(1))
    );
    let (_, completed) = expect(
        https
            .json(
                "POST",
                "/v1/claims/invoice-5/complete",
                &[("Authorization", &alice)],
                json!({"fence": by_alice["fence"], "result": "sent"}),
            )
            .await,
        200,
    );
    assert_eq!(completed["state"], "completed", "{completed}");
    // Alice's key replays her result; bob's is still his, held.
    let again = json!({"fingerprint": "send invoice 5", "lease_ms": 30_000});
    let (_, replay) = expect(
        claim(
            &https,
            "invoice-5",
            &[("Authorization", &alice)],
            again.clone(),
        )
        .await,
        200,
    );
    assert_eq!(replay["result"], "sent", "{replay}");
    refusal(
        claim(&https, "invoice-5", &[("Authorization", &bob)], again).await,
        409,
        "IN_PROGRESS",
        "application/problem+json",
    );
}
