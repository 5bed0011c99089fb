//! The harness's failover benchmark (`oncekv_jepsen::failover`, binary
//! `failover-bench`) run on this build's `oncekv`: it starts its own local
//! 3-node cluster, kills the leader twice, and reports one sample per kill
//! and a consistent counter. Kept light (two kills; CI has 2 cores).

use std::time::Duration;

use oncekv_jepsen::failover::{FailoverOptions, measure_run};
use oncekv_testkit::Timing;

/// How long the whole run may take before the test gives up on it (the
/// benchmark has deadlines of its own on every step; this bounds the test
/// if one of them is wrong). Dropping the run's future drops its cluster,
/// which kills and reaps every node.
const RUN_TIMEOUT: Duration = Duration::from_secs(180);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_bench_reports_one_sample_per_kill() {
    let options = FailoverOptions {
        server_bin: env!("CARGO_BIN_EXE_oncekv").into(),
        kills: 2,
        // The node defaults, as `failover-bench` runs by default.
        timing: Timing {
            heartbeat_ms: 30,
            election_timeout_min_ms: 120,
            election_timeout_max_ms: 240,
        },
        json: true,
        keep_dir: false,
        load_clients: 0,
    };
    let report = tokio::time::timeout(RUN_TIMEOUT, measure_run(&options))
        .await
        .unwrap_or_else(|_| panic!("the failover run did not end within {RUN_TIMEOUT:?}"))
        .expect("the failover run starts its cluster");
    assert_eq!(report.aborted, None, "{report:?}");
    assert_eq!(report.kills_done, 2, "{report:?}");
    assert_eq!(report.samples_ms.len(), 2, "{report:?}");
    assert!(report.samples_ms.iter().all(|&ms| ms > 0.0), "{report:?}");
    assert!(report.consistent, "{report:?}");
    assert!(report.writes_acknowledged > 0, "{report:?}");
}
