//! Finished claims in the record store (rules version 3:
//! docs/state-beyond-ram.md §4.12) on a real 3-node cluster started at
//! version 2 and raised. After the raise to version 3, a completed or
//! released claim leaves memory for the record store at the next snapshot
//! build, as key records do: repeats of stored completed claims are still
//! answered with their result (by the leader from the store after a read
//! index: rule 3's shortcut), a stored released claim is taken over as
//! attempt 2, GetClaim and ListClaims see every claim through the layers
//! and the store on every node, a forgotten stored claim is new again, and
//! restarted nodes agree with the others and still answer repeats.
//! (Needs the `fault-injection` build: the cluster starts at version 2
//! through `--fault bootstrap-at-rules-2`.)
#![cfg(feature = "fault-injection")]

mod support;

use oncekv_client::ClaimAnswer;
use oncekv_wire::proto::{self, admin_client::AdminClient};
use std::time::Duration;
use support::admin::wait_hashes_agree;
use support::cluster::Cluster;
use support::raw::raw_client;
use tonic::transport::Channel;

const DEADLINE: Duration = Duration::from_secs(60);
const LEASE: Duration = Duration::from_secs(30);

/// Every claim on `node`, paged `limit` at a time: (key, state, attempt).
async fn all_claims(cluster: &Cluster, node: u64, limit: u32) -> Vec<(Vec<u8>, String, u64)> {
    let mut admin = cluster.admin(node);
    let mut claims = Vec::new();
    let mut after_key = Vec::new();
    loop {
        let reply = admin
            .list_claims(proto::ListClaimsRequest {
                after_principal: String::new(),
                after_key: after_key.clone(),
                limit,
            })
            .await
            .expect("ListClaims")
            .into_inner();
        for claim in &reply.claims {
            claims.push((claim.key.clone(), claim.state.clone(), claim.attempt));
        }
        match reply.claims.last() {
            Some(last) if reply.more => after_key = last.key.clone(),
            _ => return claims,
        }
    }
}

async fn gauge(cluster: &Cluster, node: u64, name: &str) -> f64 {
    let text = cluster.scrape(node).await.expect("metrics");
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} on node {node}"))
}

fn name(n: u32) -> Vec<u8> {
    format!("job-{n:03}").into_bytes()
}

fn expected_state(n: u32) -> &'static str {
    if n % 3 == 2 { "released" } else { "completed" }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_records_in_the_record_store_still_answer_repeats() {
    // Started at version 2, as a build before version 3 started it.
    let cluster = Cluster::start_with(
        "claims-store",
        &[
            "--fault",
            "bootstrap-at-rules-2",
            "--snapshot-every-entries",
            "1000000",
            "--snapshot-every-key-records",
            "25",
            "--logs-kept-after-snapshot",
            "5",
        ],
    )
    .await;
    let raw = raw_client(&cluster).await;
    let client = cluster.patient_client();
    let finish = async |n: u32| {
        let ClaimAnswer::Won { fence, attempt, .. } =
            client.claim(&name(n), b"job", LEASE).await.unwrap()
        else {
            panic!("claim {n} not won");
        };
        assert_eq!(attempt, 1);
        if expected_state(n) == "released" {
            client.release_claim(&name(n), fence).await.unwrap();
        } else {
            client
                .complete_claim(&name(n), fence, format!("r{n}").as_bytes())
                .await
                .unwrap();
        }
    };
    // The first 40 finish at version 2, all in memory; the raise moves
    // them into groups (then, at the next build, into the store).
    let count = 150;
    for n in 0..40 {
        finish(n).await;
    }
    let leader = cluster.wait_for_leader(DEADLINE).await;
    assert_eq!(
        gauge(&cluster, leader, "oncekv_claim_records_in_memory").await,
        40.0,
        "every claim in memory at version 2"
    );
    let raised = raw
        .set_config(
            DEADLINE,
            proto::RegistryConfigPatch {
                rules_version: Some(3),
                ..Default::default()
            },
        )
        .await;
    assert_eq!(raised.config.expect("the configs").rules_version, 3);
    for n in 40..count {
        finish(n).await;
    }
    for node in 1..=3 {
        assert!(
            cluster
                .data_dir(node)
                .join("state")
                .join("CURRENT")
                .exists(),
            "node {node} has a record store"
        );
        let status = cluster.status(node).await.unwrap();
        assert!(status.snapshot_index > 0, "node {node} built a snapshot");
    }
    // The oldest completed claims went to the store many builds ago: their
    // repeats are answered from it by the leader, with no log entry.
    let shortcuts = cluster.answered_from_applied("claim").await;
    for n in [0u32, 1, 72] {
        match client.claim(&name(n), b"job", LEASE).await.unwrap() {
            ClaimAnswer::Completed {
                result, attempt, ..
            } => {
                assert_eq!(result, format!("r{n}").into_bytes(), "claim {n}");
                assert_eq!(attempt, 1);
            }
            other => panic!("claim {n}: {other:?}"),
        }
    }
    assert_eq!(
        cluster.answered_from_applied("claim").await,
        shortcuts + 3.0,
        "repeats of stored claims answered from the applied state"
    );
    // A stored released claim is taken over: attempt 2, back in memory.
    let ClaimAnswer::Won { attempt, fence, .. } =
        client.claim(&name(2), b"job", LEASE).await.unwrap()
    else {
        panic!("the released claim is taken over");
    };
    assert_eq!(attempt, 2);
    client
        .complete_claim(&name(2), fence, b"r2 again")
        .await
        .unwrap();
    // Forget a stored completed claim: it is new again.
    let forgotten = raw
        .admin_on_leader(DEADLINE, |mut admin: AdminClient<Channel>| {
            let request = proto::ForgetClaimRequest {
                cluster_id: raw.cluster_id.clone(),
                principal: String::new(),
                key: name(3),
            };
            async move { admin.forget_claim(request).await.map(|r| r.into_inner()) }
        })
        .await
        .expect("ForgetClaim");
    assert!(forgotten.existed, "the stored claim existed");
    let ClaimAnswer::Won { attempt, fence, .. } =
        client.claim(&name(3), b"job", LEASE).await.unwrap()
    else {
        panic!("a forgotten claim is new");
    };
    assert_eq!(attempt, 1);
    client.complete_claim(&name(3), fence, b"r3").await.unwrap();

    let expected: Vec<(Vec<u8>, String, u64)> = (0..count)
        .map(|n| {
            let (state, attempt) = match n {
                2 => ("completed", 2),
                n => (expected_state(n), 1),
            };
            (name(n), state.to_owned(), attempt)
        })
        .collect();
    let leader = cluster.wait_for_leader(DEADLINE).await;
    let status = cluster.status(leader).await.unwrap();
    wait_hashes_agree(&cluster, &[1, 2, 3], status.applied_index).await;
    for node in 1..=3 {
        assert_eq!(all_claims(&cluster, node, 7).await, expected, "node {node}");
        let reply = cluster
            .admin(node)
            .get_claim(proto::GetClaimRequest {
                principal: String::new(),
                key: name(0),
            })
            .await
            .expect("GetClaim")
            .into_inner();
        let claim = reply.claim.expect("the oldest claim");
        assert_eq!(
            (claim.state.as_str(), claim.result),
            ("completed", b"r0".to_vec())
        );
    }

    // Every node restarted in turn: the nodes agree, each reads its stored
    // claims from its record store, and repeats are still answered.
    for node in 1..=3 {
        cluster.restart(node).await;
        let leader = cluster.wait_for_leader(DEADLINE).await;
        let status = cluster.status(leader).await.unwrap();
        wait_hashes_agree(&cluster, &[1, 2, 3], status.applied_index).await;
        assert_eq!(
            all_claims(&cluster, node, 50).await,
            expected,
            "node {node}"
        );
        let in_memory = gauge(&cluster, node, "oncekv_claim_records_in_memory").await;
        assert!(in_memory < 30.0, "node {node}: {in_memory}");
    }
    for n in [0u32, 3, 149] {
        let answer = client.claim(&name(n), b"job", LEASE).await.unwrap();
        match (expected_state(n), answer) {
            ("completed", ClaimAnswer::Completed { .. }) => {}
            ("released", ClaimAnswer::Won { attempt: 2, .. }) => {}
            (state, other) => panic!("claim {n} ({state}) after the restarts: {other:?}"),
        }
    }
}
