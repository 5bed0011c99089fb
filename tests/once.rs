//! `oncekv once` (src/cli/once/) run as a user runs it — one process per
//! invocation, real commands under `sh` — against real 3-node clusters:
//! five concurrent and five later invocations run the command once and
//! all print its output and exit 0; another command under the key is
//! KEY_CONFLICT (exit 4); a failing command is released and runs again,
//! or is recorded with `--record-failures`; a holder SIGKILLed mid-command
//! takes its command's whole process group with it, and the next
//! invocation runs the command again after the lease with
//! `ONCEKV_ATTEMPT=2` and a larger `ONCEKV_FENCE`, while the dead holder's
//! fence is FENCED; a waiter gives up with exit 75 at `--timeout-ms`; and
//! a holder paused past its lease learns of the takeover when it wakes
//! and stops its command (exit 5). Two clusters in this file.

mod support;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use oncekv_client::{Client, Error};
use support::admin::{Run, oncekv, run_to_exit};
use support::cluster::Cluster;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::time::Instant;

/// `oncekv --endpoints E once ARGS` (the endpoints before `once`: after
/// `--` everything is the command's).
fn once_command(cluster: &Cluster, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncekv"));
    command
        .arg("--endpoints")
        .arg(cluster.client_addrs().join(","))
        .arg("once")
        .args(args)
        .env_remove("RUST_LOG");
    command
}

/// Runs `oncekv once ARGS` to its exit.
async fn once(cluster: &Cluster, args: &[&str]) -> Run {
    run_to_exit(once_command(cluster, args), args).await
}

/// The file's lines.
fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_runs_a_command_once_however_often_it_is_invoked() {
    let cluster = Cluster::start("once-cli").await;
    cluster.wait_for_leader(Duration::from_secs(60)).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("effects");
    let script = format!("echo x >> '{}'; echo ran", file.display());
    // The spelling, `--key KEY`; the positional KEY below.
    let args = ["--key", "job-1", "--", "sh", "-c", script.as_str()];

    // Five at once: one runs, the others wait for it and replay.
    let mut runs = futures::future::join_all(
        (0..5).map(|_| run_to_exit(once_command(&cluster, &args), &args)),
    )
    .await;
    // Five more, after.
    for _ in 0..5 {
        runs.push(once(&cluster, &args).await);
    }
    for run in &runs {
        assert_eq!((run.code, run.stdout.as_str()), (0, "ran\n"), "{run:?}");
    }
    assert_eq!(lines(&file), ["x"], "the command ran once");
    let replays = runs
        .iter()
        .filter(|run| run.stderr.contains("replay:"))
        .count();
    assert_eq!(replays, 9, "nine replays, said on stderr: {runs:?}");

    // --json: one object, with the recorded result.
    let json = once(&cluster, &["job-1", "--json", "--", "sh", "-c", &script]).await;
    assert_eq!(json.code, 0, "{json:?}");
    let object = json.json();
    assert_eq!(object["ok"], true);
    assert_eq!(object["replayed"], true);
    assert_eq!(object["exit_code"], 0);
    assert_eq!(object["stdout"], "ran\n");
    assert_eq!(object["attempt"], 1);

    // Another command under the key: KEY_CONFLICT, exit 4, nothing ran.
    let conflict = once(
        &cluster,
        &["job-1", "--", "sh", "-c", "echo x >> /dev/null"],
    )
    .await;
    assert_eq!(conflict.code, 4, "{conflict:?}");
    assert!(conflict.stderr.contains("another command"), "{conflict:?}");
    assert_eq!(lines(&file), ["x"]);

    // A failing command is released: the next invocation runs it again
    // (as attempt 2), and its exit code passes through each time.
    let failures = dir.path().join("failures");
    let failing = format!(
        "echo attempt $ONCEKV_ATTEMPT >> '{}'; echo failed; exit 3",
        failures.display()
    );
    for _ in 0..2 {
        let run = once(&cluster, &["mail-2", "--", "sh", "-c", &failing]).await;
        assert_eq!((run.code, run.stdout.as_str()), (3, "failed\n"), "{run:?}");
        assert!(run.stderr.contains("released"), "{run:?}");
    }
    assert_eq!(lines(&failures), ["attempt 1", "attempt 2"]);

    // With --record-failures the failure is the recorded result.
    let recorded = dir.path().join("recorded");
    let failing = format!("echo y >> '{}'; echo failed; exit 3", recorded.display());
    for _ in 0..2 {
        let run = once(
            &cluster,
            &["mail-3", "--record-failures", "--", "sh", "-c", &failing],
        )
        .await;
        assert_eq!((run.code, run.stdout.as_str()), (3, "failed\n"), "{run:?}");
    }
    assert_eq!(lines(&recorded), ["y"]);

    // A command that does not exist is refused before anything is claimed.
    let missing = once(&cluster, &["job-9", "--", "no-such-command-for-once"]).await;
    assert_eq!(missing.code, 127, "{missing:?}");

    // The operator's view: the records, the recorded result decoded.
    let endpoints = cluster.client_addrs();
    let shown = oncekv(&endpoints, &["admin", "claims", "show", "job-1", "--json"]).await;
    let claim = &shown.json()["claim"];
    assert_eq!(claim["state"], "completed", "{shown:?}");
    assert_eq!(claim["attempt"], 1);
    assert_eq!(claim["once"]["exit_code"], 0);
    assert_eq!(claim["once"]["stdout"], "ran\n");
    let listed = oncekv(&endpoints, &["admin", "claims", "list"]).await;
    let listed = listed.ok();
    for line in [
        "claim job-1 ",
        "claim mail-2 ",
        "result once exit 3, stdout \"failed\\n\"",
    ] {
        assert!(listed.contains(line), "{line:?} in {listed}");
    }
    assert!(!listed.contains("claim job-9"), "{listed}");
    let config = oncekv(&endpoints, &["admin", "config", "--json"]).await;
    assert!(config.json()["config"]["claim_ttl_ms"].as_u64() > Some(0));
    // Forgotten, the key runs its command anew.
    let forgotten = oncekv(&endpoints, &["admin", "claims", "forget", "job-1"]).await;
    assert!(forgotten.ok().contains("forgotten"), "{forgotten:?}");
    let again = once(&cluster, &args).await;
    assert_eq!(
        (again.code, again.stdout.as_str()),
        (0, "ran\n"),
        "{again:?}"
    );
    assert_eq!(lines(&file), ["x", "x"]);
    let missing = oncekv(&endpoints, &["admin", "claims", "show", "job-9"]).await;
    assert_eq!(missing.code, 1, "{missing:?}");

    // Stdout the cluster's claim_result_bytes_max cannot hold: the exit code
    // is recorded without it, and the command still runs once.
    let set = oncekv(
        &endpoints,
        &["admin", "config", "set", "--claim-result-bytes-max", "100"],
    )
    .await;
    set.ok();
    let loud = format!(
        "echo x >> '{}'; head -c 300 /dev/zero | tr '\\0' a",
        file.display()
    );
    let first = once(&cluster, &["loud-1", "--", "sh", "-c", &loud]).await;
    assert_eq!((first.code, first.stdout.len()), (0, 300), "{first:?}");
    assert!(first.stderr.contains("stdout is not"), "{first:?}");
    let replay = once(&cluster, &["loud-1", "--", "sh", "-c", &loud]).await;
    assert_eq!((replay.code, replay.stdout.as_str()), (0, ""), "{replay:?}");
    assert!(replay.stderr.contains("replay:"), "{replay:?}");
    assert_eq!(lines(&file), ["x", "x", "x"]);
}

/// Whether process `pid` is gone (or a zombie nobody reaped yet: it runs
/// no more).
fn is_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// Reads `reader`'s lines until one starts with `prefix`; returns it.
async fn line_starting<R: tokio::io::AsyncBufRead + Unpin>(
    reader: &mut tokio::io::Lines<R>,
    prefix: &str,
) -> String {
    let read = async {
        while let Some(line) = reader.next_line().await.expect("read stdout") {
            if line.starts_with(prefix) {
                return line;
            }
        }
        panic!("stdout ended before a line starting with {prefix:?}");
    };
    tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .unwrap_or_else(|_| panic!("no line starting with {prefix:?} within 60 s"))
}

/// `fence=N` in `line`.
fn fence_in(line: &str) -> u64 {
    line.split_whitespace()
        .find_map(|word| word.strip_prefix("fence="))
        .and_then(|fence| fence.parse().ok())
        .unwrap_or_else(|| panic!("no fence in {line:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_is_taken_over_and_fenced() {
    let cluster = Cluster::start("once-takeover").await;
    cluster.wait_for_leader(Duration::from_secs(60)).await;
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("sleep.pid");
    // The first attempt hangs in a background `sleep 30` (a grandchild of
    // the guard); a later attempt finishes at once.
    let script = format!(
        "echo attempt=$ONCEKV_ATTEMPT fence=$ONCEKV_FENCE key=$ONCEKV_CLAIM_KEY; \
         if [ \"$ONCEKV_ATTEMPT\" = 1 ]; then sleep 30 & echo $! > '{}'; wait; fi; \
         echo finished",
        pid_file.display()
    );
    let args = [
        "deploy-7",
        "--lease-ms",
        "2000",
        "--",
        "sh",
        "-c",
        script.as_str(),
    ];

    let mut holder = once_command(&cluster, &args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the first holder");
    let mut stdout = BufReader::new(holder.stdout.take().unwrap()).lines();
    let first = line_starting(&mut stdout, "attempt=").await;
    assert!(first.starts_with("attempt=1 "), "{first}");
    assert!(first.ends_with("key=deploy-7"), "{first}");
    let old_fence = fence_in(&first);
    let deadline = Instant::now() + Duration::from_secs(30);
    let sleep_pid = loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|text| text.trim().parse::<i32>().ok())
        {
            break pid;
        }
        assert!(Instant::now() < deadline, "the command wrote no pid");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    // While the holder runs (and renews its lease), a waiter with little
    // patience gives up: exit 75, nothing ran.
    let waiter = once(
        &cluster,
        &[
            "deploy-7",
            "--lease-ms",
            "2000",
            "--timeout-ms",
            "300",
            "--",
            "sh",
            "-c",
            &script,
        ],
    )
    .await;
    assert_eq!(
        (waiter.code, waiter.stdout.as_str()),
        (75, ""),
        "{waiter:?}"
    );
    assert!(waiter.stderr.contains("another holder"), "{waiter:?}");

    // SIGKILL the holder mid-command: its command's whole process group
    // goes with it (no orphan runs on beside the next holder).
    holder.start_kill().expect("SIGKILL the holder");
    holder.wait().await.expect("reap the holder");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !is_gone(sleep_pid) {
        assert!(
            Instant::now() < deadline,
            "the command's `sleep` (pid {sleep_pid}) outlived its killed holder"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The next invocation waits out the dead holder's lease and runs the
    // command again, as attempt 2 with a larger fence.
    let next = once(&cluster, &args).await;
    assert_eq!(next.code, 0, "{next:?}");
    let lines: Vec<&str> = next.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{next:?}");
    assert!(lines[0].starts_with("attempt=2 "), "{next:?}");
    let new_fence = fence_in(lines[0]);
    assert!(new_fence > old_fence, "{new_fence} > {old_fence}");
    assert_eq!(lines[1], "finished");

    // The dead holder's late complete (the library with its old fence):
    // FENCED, naming the fence that holds the key.
    let client = Client::connect(cluster.client_addrs());
    match client.complete_claim(b"deploy-7", old_fence, b"late").await {
        Err(Error::Fenced { current_fence }) => assert_eq!(current_fence, new_fence),
        other => panic!("expected FENCED, got {other:?}"),
    }
    // And the key replays attempt 2's output.
    let replay = once(&cluster, &args).await;
    assert_eq!(
        (replay.code, replay.stdout.as_str()),
        (0, next.stdout.as_str())
    );

    // A holder paused past its lease (SIGSTOP: no heartbeat) is taken over;
    // when it wakes, its heartbeat is FENCED and it stops its command at
    // once: exit 5, and the command never finishes.
    let script = "echo attempt=$ONCEKV_ATTEMPT fence=$ONCEKV_FENCE; \
                  if [ \"$ONCEKV_ATTEMPT\" = 1 ]; then sleep 30; fi; echo finished";
    let args = ["report-3", "--lease-ms", "1000", "--", "sh", "-c", script];
    let mut paused = once_command(&cluster, &args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the holder to pause");
    let mut paused_stdout = BufReader::new(paused.stdout.take().unwrap()).lines();
    let first = line_starting(&mut paused_stdout, "attempt=").await;
    assert!(first.starts_with("attempt=1 "), "{first}");
    let pid = Pid::from_raw(i32::try_from(paused.id().unwrap()).unwrap());
    kill(pid, Signal::SIGSTOP).expect("pause the holder");
    let taken = once(&cluster, &args).await;
    kill(pid, Signal::SIGCONT).expect("wake the holder");
    assert_eq!(taken.code, 0, "{taken:?}");
    assert!(taken.stdout.starts_with("attempt=2 "), "{taken:?}");
    assert!(fence_in(&taken.stdout) > fence_in(&first));
    let mut paused_stderr = paused.stderr.take().unwrap();
    let woke = async {
        let mut rest = Vec::new();
        while let Some(line) = paused_stdout.next_line().await.expect("read stdout") {
            rest.push(line);
        }
        let mut stderr = String::new();
        paused_stderr
            .read_to_string(&mut stderr)
            .await
            .expect("read stderr");
        (paused.wait().await.expect("reap it"), rest, stderr)
    };
    let (status, rest, stderr) = tokio::time::timeout(Duration::from_secs(30), woke)
        .await
        .expect("the woken holder stops within 30 s");
    assert_eq!(status.code(), Some(5), "stdout {rest:?}, stderr {stderr:?}");
    assert!(!rest.iter().any(|line| line == "finished"), "{rest:?}");
    assert!(
        stderr.contains("another holder took the key over"),
        "{stderr:?}"
    );
}
