//! Helpers for tests of the Admin service and the `oncekv` CLI: state
//! hashes compared across replicas, and the binary run as a user runs it
//! (one process per command).

use super::cluster::Cluster;
use oncekv_wire::proto::StateHashRequest;
use serde_json::Value as Json;
use std::process::Stdio;
use std::time::Duration;
use tokio::time::Instant;

/// How long one CLI process may run before the test gives up on it.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(180);

/// Waits until every node of `nodes` reports, through the Admin `StateHash`
/// RPC, the same applied index (at least `at_least`) and the same hash;
/// returns that index and hash.
pub async fn wait_hashes_agree(cluster: &Cluster, nodes: &[u64], at_least: u64) -> (u64, String) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut seen = Vec::new();
        for &node in nodes {
            let mut request = tonic::Request::new(StateHashRequest {});
            request.set_timeout(Duration::from_secs(5));
            if let Ok(reply) = cluster.admin(node).state_hash(request).await {
                let reply = reply.into_inner();
                assert_eq!(reply.node_id, node);
                seen.push((reply.applied_index, reply.state_hash));
            }
        }
        if seen.len() == nodes.len()
            && seen[0].0 >= at_least
            && seen.iter().all(|entry| *entry == seen[0])
        {
            return seen.swap_remove(0);
        }
        assert!(
            Instant::now() < deadline,
            "replicas {nodes:?} did not converge at an index >= {at_least}: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What one CLI process did.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Asserts success and returns stdout.
    pub fn ok(&self) -> &str {
        assert_eq!(self.code, 0, "expected success: {self:?}");
        &self.stdout
    }

    /// stdout as the one JSON object it must be.
    pub fn json(&self) -> Json {
        assert_eq!(
            self.stdout.lines().count(),
            1,
            "expected one line of JSON: {self:?}"
        );
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|error| panic!("stdout is not JSON ({error}): {self:?}"))
    }
}

/// Runs `oncekv ARGS --endpoints E1,E2,…` and waits (up to [`RUN_TIMEOUT`])
/// for it to exit.
pub async fn oncekv(endpoints: &[String], args: &[&str]) -> Run {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncekv"));
    command
        .args(args)
        .arg("--endpoints")
        .arg(endpoints.join(","));
    run_to_exit(command, args).await
}

/// Runs `command` (an `oncekv` invocation with `args`, for messages) with
/// no stdin, waits (up to [`RUN_TIMEOUT`]) for it to exit and collects
/// its exit code and output.
pub async fn run_to_exit(mut command: tokio::process::Command, args: &[&str]) -> Run {
    command.stdin(Stdio::null()).kill_on_drop(true);
    let output = tokio::time::timeout(RUN_TIMEOUT, command.output())
        .await
        .unwrap_or_else(|_| panic!("oncekv {args:?} did not exit within {RUN_TIMEOUT:?}"))
        .unwrap_or_else(|error| panic!("run oncekv {args:?}: {error}"));
    Run {
        code: output
            .status
            .code()
            .unwrap_or_else(|| panic!("oncekv {args:?} was killed: {:?}", output.status)),
        stdout: String::from_utf8(output.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(output.stderr).expect("stderr is UTF-8"),
    }
}
