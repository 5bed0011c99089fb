//! `oncekv bench --failover` run as a user would run it: it starts its own
//! local 3-node cluster, kills the leader twice, and reports one sample per
//! kill and a consistent counter. Kept light (two kills; CI has 2 cores).

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value as Json;
use std::process::Stdio;
use std::time::Duration;

/// How long the whole run may take before the test gives up on it.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_bench_reports_one_sample_per_kill() {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncekv"))
        .args(["bench", "--failover", "--kills", "2", "--json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run oncekv bench --failover");
    let pid = Pid::from_raw(i32::try_from(child.id().expect("a running child")).expect("a pid"));
    let Ok(output) = tokio::time::timeout(RUN_TIMEOUT, child.wait_with_output()).await else {
        // SIGTERM first: the bench then kills its own nodes on the way out.
        let _ = kill(pid, Signal::SIGTERM);
        tokio::time::sleep(Duration::from_secs(5)).await;
        let _ = kill(pid, Signal::SIGKILL);
        panic!("oncekv bench --failover did not exit within {RUN_TIMEOUT:?}");
    };
    let output = output.expect("wait for oncekv bench --failover");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "exit {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    let report: Json = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|error| panic!("stdout is not one JSON object ({error}):\n{stdout}"));
    assert_eq!(report["kills_done"], 2, "{report}");
    let samples = report["samples_ms"].as_array().expect("samples_ms");
    assert_eq!(samples.len(), 2, "{report}");
    assert!(
        samples
            .iter()
            .all(|ms| ms.as_f64().is_some_and(|ms| ms > 0.0)),
        "{report}"
    );
    assert_eq!(report["consistent"], true, "{report}");
    assert!(
        report["writes_acknowledged"].as_u64().unwrap_or(0) > 0,
        "{report}"
    );
}
