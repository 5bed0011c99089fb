//! Claims (rule 20) on real 3-node clusters, through the client library:
//! concurrent `once` calls of one key run the effect once and all get its
//! result, later calls replay it without running anything; a holder that
//! stops heartbeating (as a killed process would) leaves a lease, not a
//! stuck key — the next call takes over with attempt 2 and a larger fence,
//! and the old holder's complete, extend and release are FENCED; a claim
//! whose reply is lost is answered with its own win on retry; and a
//! leader killed while the effect runs still leaves one effect, recorded.

mod support;

use oncekv_client::{ClaimAnswer, Client, Error, OnceError, OnceOptions, OnceOutcome};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use support::cluster::Cluster;

fn options(lease_ms: u64) -> OnceOptions {
    OnceOptions {
        lease: Duration::from_millis(lease_ms),
        wait: Duration::from_secs(60),
        heartbeat: None,
    }
}

/// Runs `once` for `key` with an effect that counts its runs in `runs` and
/// answers "charged <n>".
async fn charge(
    client: &Client,
    key: &[u8],
    runs: &Arc<AtomicU64>,
    lease_ms: u64,
) -> Result<OnceOutcome, OnceError<String>> {
    let runs = runs.clone();
    client
        .once(
            key,
            b"charge 10 EUR",
            &options(lease_ms),
            |token| async move {
                let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                // Long enough for the concurrent callers to find it in progress.
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok::<_, String>(format!("charged {run} with fence {}", token.fence).into_bytes())
            },
        )
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_runs_an_effect_once_and_takes_over_from_a_dead_holder() {
    let cluster = Cluster::start("claims-once").await;
    cluster.wait_for_leader(Duration::from_secs(60)).await;
    let client = cluster.patient_client();

    // Five concurrent callers, then five more: one run, one result.
    let runs = Arc::new(AtomicU64::new(0));
    let calls: Vec<_> = (0..5)
        .map(|_| {
            let client = client.clone();
            let runs = runs.clone();
            tokio::spawn(async move { charge(&client, b"order-1", &runs, 5_000).await })
        })
        .collect();
    let mut results = Vec::new();
    for call in calls {
        let outcome = call.await.expect("joins").expect("once succeeds");
        results.push(outcome);
    }
    for _ in 0..5 {
        let outcome = charge(&client, b"order-1", &runs, 5_000)
            .await
            .expect("once succeeds");
        assert!(outcome.replayed(), "a later call replays: {outcome:?}");
        results.push(outcome);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the effect ran once");
    let first = results[0].result().to_vec();
    assert!(results.iter().all(|outcome| outcome.result() == first));
    assert_eq!(results.iter().filter(|o| !o.replayed()).count(), 1);
    // Rule 3's one shortcut: each of the five later calls found the key
    // completed in the leader's applied state and was answered from it
    // after a read index, with no log entry.
    let answered = cluster.answered_from_applied("claim").await;
    assert!(
        answered >= 5.0,
        "{answered} claims answered from the applied record"
    );

    // Another description of the effect on the same key is a conflict.
    let conflict = client
        .claim(b"order-1", b"charge 99 EUR", Duration::from_secs(1))
        .await;
    assert!(
        matches!(conflict, Err(Error::KeyConflict { .. })),
        "{conflict:?}"
    );

    // A holder that claims and then goes silent (a killed process: no
    // heartbeat, no complete) blocks the key for its lease only.
    let dead = match client
        .claim(b"job-7", b"run job 7", Duration::from_millis(1_500))
        .await
        .expect("claims")
    {
        ClaimAnswer::Won { fence, attempt, .. } => {
            assert_eq!(attempt, 1);
            fence
        }
        other => panic!("expected a win, got {other:?}"),
    };
    let seen = Arc::new(std::sync::Mutex::new(None));
    let seen_in = seen.clone();
    let outcome = client
        .once(
            b"job-7",
            b"run job 7",
            &options(5_000),
            |token| async move {
                *seen_in.lock().unwrap() = Some((token.fence, token.attempt));
                Ok::<_, String>(b"job 7 done".to_vec())
            },
        )
        .await
        .expect("takes over after the lease");
    let (fence, attempt) = seen.lock().unwrap().expect("the effect ran");
    assert_eq!(attempt, 2, "the takeover knows an earlier holder existed");
    assert!(fence > dead, "a larger fence: {fence} > {dead}");
    assert_eq!(
        outcome,
        OnceOutcome::Ran {
            result: b"job 7 done".to_vec(),
            fence,
            attempt: 2
        }
    );
    // The dead holder wakes up: everything it tries is FENCED.
    let fenced = |result: Result<u64, Error>| match result {
        Err(Error::Fenced { current_fence }) => current_fence,
        other => panic!("expected FENCED, got {other:?}"),
    };
    assert_eq!(
        fenced(
            client
                .complete_claim(b"job-7", dead, b"late")
                .await
                .map(|_| 0)
        ),
        fence
    );
    assert_eq!(
        fenced(
            client
                .extend_claim(b"job-7", dead, Duration::from_secs(1))
                .await
                .map(|_| 0)
        ),
        fence
    );
    assert_eq!(
        fenced(client.release_claim(b"job-7", dead).await.map(|()| 0)),
        fence
    );

    // A failed effect releases the key: the next call runs it again.
    let failed = client
        .once(b"mail-3", b"send mail 3", &options(5_000), |_| async {
            Err::<Vec<u8>, _>("smtp down".to_string())
        })
        .await;
    assert!(
        matches!(
            &failed,
            Err(OnceError::Failed {
                released: Ok(()),
                ..
            })
        ),
        "{failed:?}"
    );
    let sent = client
        .once(
            b"mail-3",
            b"send mail 3",
            &options(5_000),
            |token| async move {
                assert_eq!(token.attempt, 2, "a released key is claimed anew");
                Ok::<_, String>(b"sent".to_vec())
            },
        )
        .await
        .expect("runs again after the release");
    assert!(!sent.replayed());
}

/// A claim whose reply is lost is retried with the same claim id and gets
/// its own win back (never "in progress" against itself); a leader killed
/// while the effect runs still leaves one effect, recorded and replayed.
#[cfg(feature = "fault-injection")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_replies_and_leader_deaths_keep_claims_exactly_once() {
    let cluster =
        Cluster::start_with("claims-faults", &["--fault", "drop-first-execute-reply"]).await;
    cluster.wait_for_leader(Duration::from_secs(60)).await;
    let client = cluster.patient_client();
    match client
        .claim(b"lost", b"effect", Duration::from_secs(30))
        .await
        .expect("claims")
    {
        ClaimAnswer::Won {
            duplicate, attempt, ..
        } => {
            assert!(duplicate, "the retry was answered from the record");
            assert_eq!(attempt, 1);
        }
        other => panic!("expected its own win, got {other:?}"),
    }

    let runs = Arc::new(AtomicU64::new(0));
    let runs_in = runs.clone();
    let cluster = Arc::new(cluster);
    let killer = cluster.clone();
    let outcome = client
        .once(
            b"deploy-9",
            b"deploy 9",
            &options(10_000),
            |token| async move {
                runs_in.fetch_add(1, Ordering::SeqCst);
                let leader = killer.wait_for_leader(Duration::from_secs(60)).await;
                killer.kill(leader);
                killer.wait_for_new_leader(leader).await;
                Ok::<_, String>(format!("deployed with {}", token.fence).into_bytes())
            },
        )
        .await
        .expect("completes at the new leader");
    assert!(!outcome.replayed());
    let again = client
        .once(b"deploy-9", b"deploy 9", &options(10_000), |_| async {
            Ok::<_, String>(b"ran twice".to_vec())
        })
        .await
        .expect("replays");
    assert!(again.replayed());
    assert_eq!(again.result(), outcome.result());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
