//! The nodes of a local cluster end with the process that controls them,
//! however it ends: a test controller (`oncekv_testkit::LocalCluster`) or
//! the jepsen-like harness, run as a child process of these tests (this
//! test binary re-run as the ignored `controller` test), is SIGKILLed or
//! hung up, and its `oncekv node` children must be gone within a deadline.
//! Linux only (the parent-death signal, `/proc`).
#![cfg(target_os = "linux")]

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use nix::sys::signal::{SigHandler, Signal, kill, signal};
use nix::unistd::Pid;
use oncekv_testkit::{LocalCluster, NODES, Options, Timing};

/// What the child process is (see [`controller`]).
const ROLE: &str = "ONCEKV_TEST_CONTROLLER";
/// How long the child may take to have its three nodes running.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the nodes may outlive their controller.
const GONE_TIMEOUT: Duration = Duration::from_secs(10);

/// Not a test of its own: the child process of the tests below, chosen by
/// the `ONCEKV_TEST_CONTROLLER` environment variable (without it, nothing).
/// `cluster`: a `LocalCluster` started, then held until the process is
/// ended, with no signal handling of its own. `harness`: a long jepsen-like
/// run, as the `jepsen-like` binary runs it.
#[test]
#[ignore = "run by the tests of this file as their child process"]
fn controller() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    // The tests below are about a process that handles no signal, so its
    // hang-up takes the default action. A process started under `nohup`
    // (or any parent ignoring SIGHUP) passes the ignoring down through
    // exec: put the default back.
    // SAFETY: the default action runs none of our code, so no handler can
    // break what a signal handler must not do.
    unsafe { signal(Signal::SIGHUP, SigHandler::SigDfl) }.expect("default SIGHUP action");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    match role.as_str() {
        "cluster" => runtime.block_on(async {
            let mut options = Options::new("controller-exit", env!("CARGO_BIN_EXE_oncekv"));
            options.timing = Some(Timing::TESTS);
            options.start_timeout = START_TIMEOUT;
            let cluster = LocalCluster::start(&options)
                .await
                .expect("start a cluster");
            println!("ready");
            // Held until the parent ends this process.
            std::future::pending::<()>().await;
            drop(cluster);
        }),
        "harness" => {
            let out = tempfile::tempdir().expect("an output directory");
            let options = oncekv_jepsen::run::RunOptions {
                seed: 1,
                duration: Duration::from_secs(300),
                leader_kills: 1,
                appenders: 1,
                incrementers: 1,
                readers: 1,
                keyed_producers: 0,
                claim_workers: 0,
                claim_lease: Duration::from_secs(1),
                server_bin: env!("CARGO_BIN_EXE_oncekv").into(),
                out_dir: out.path().to_owned(),
                keep_cluster_dir: false,
                timing: Timing::TESTS,
                snapshot_every_entries: 200,
                logs_kept_after_snapshot: 50,
                session_ttl_ms: 10_000,
                quiet: true,
                container_image: None,
                tls: false,
            };
            let code = runtime.block_on(oncekv_jepsen::run::run_to_exit_code(&options));
            drop(runtime);
            std::process::exit(code);
        }
        other => panic!("unknown {ROLE}={other}"),
    }
}

/// The child process and the nodes it started; dropping it SIGKILLs all of
/// them that are still there (ours: started by this test or its child).
struct Controller {
    child: Child,
    nodes: Vec<u32>,
    /// Where the child's stderr goes (a pipe nobody reads could fill).
    stderr: tempfile::NamedTempFile,
}

impl Controller {
    /// Starts this test binary as a `role` controller and waits until it
    /// runs three `oncekv node` children (and, for `cluster`, until it says
    /// its cluster is ready).
    fn start(role: &str) -> Controller {
        let stderr = tempfile::NamedTempFile::new().expect("a file for the controller's stderr");
        let mut child = Command::new(std::env::current_exe().expect("this test binary"))
            .args(["controller", "--exact", "--ignored", "--nocapture"])
            .env(ROLE, role)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr.reopen().expect("reopen the stderr file"))
            .spawn()
            .expect("start the controller");
        if role == "cluster" {
            let stdout = child.stdout.take().expect("piped stdout");
            let mut lines = BufReader::new(stdout).lines();
            // Bounded by the child's own start timeout.
            let ready = lines.any(|line| line.is_ok_and(|line| line == "ready"));
            assert!(ready, "the controller's cluster did not become ready");
        }
        let mut controller = Controller {
            child,
            nodes: Vec::new(),
            stderr,
        };
        let pid = controller.child.id();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            controller.nodes = node_children(pid);
            if controller.nodes.len() == NODES.len() {
                return controller;
            }
            if let Some(exit) = controller.child.try_wait().expect("poll the controller") {
                panic!(
                    "the controller exited early ({exit}): {}",
                    controller.stderr()
                );
            }
            assert!(
                Instant::now() < deadline,
                "the controller runs {} nodes, not {}",
                controller.nodes.len(),
                NODES.len()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends `signal` to the controller and waits for it to end.
    fn end_with(&mut self, signal: Signal) -> ExitStatus {
        let pid = Pid::from_raw(i32::try_from(self.child.id()).expect("a pid fits in i32"));
        kill(pid, signal).expect("signal the controller");
        let deadline = Instant::now() + GONE_TIMEOUT;
        loop {
            if let Some(exit) = self.child.try_wait().expect("poll the controller") {
                return exit;
            }
            assert!(
                Instant::now() < deadline,
                "the controller still runs {GONE_TIMEOUT:?} after {signal}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The node processes still alive after [`GONE_TIMEOUT`] (waiting for
    /// them to go).
    fn surviving_nodes(&self) -> Vec<u32> {
        let deadline = Instant::now() + GONE_TIMEOUT;
        loop {
            let alive: Vec<u32> = self
                .nodes
                .iter()
                .copied()
                .filter(|&pid| alive(pid))
                .collect();
            if alive.is_empty() || Instant::now() >= deadline {
                return alive;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stderr(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = self.stderr.reopen() {
            let _ = file.read_to_string(&mut text);
        }
        text
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for &pid in &self.nodes {
            if alive(pid)
                && let Ok(pid) = i32::try_from(pid)
            {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }
}

/// The `oncekv node` processes whose parent is `parent`, from `/proc`.
fn node_children(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let dir = PathBuf::from(format!("/proc/{pid}"));
        let Some((_, ppid)) = stat_fields(pid) else {
            continue;
        };
        let cmdline = std::fs::read(dir.join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if ppid == parent && cmdline.contains(" node --id ") {
            pids.push(pid);
        }
    }
    pids
}

/// The state letter and parent pid of `pid`, from `/proc/PID/stat`.
fn stat_fields(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Whether `pid` is a live process (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    stat_fields(pid).is_some_and(|(state, _)| state != 'Z' && state != 'X')
}

/// A test controller SIGKILLed (no drop runs) takes its nodes with it: the
/// kernel SIGKILLs each node when the controller's spawning thread dies.
#[test]
fn nodes_die_with_a_sigkilled_test_controller() {
    let mut controller = Controller::start("cluster");
    let exit = controller.end_with(Signal::SIGKILL);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&exit),
        Some(Signal::SIGKILL as i32)
    );
    let survivors = controller.surviving_nodes();
    assert!(
        survivors.is_empty(),
        "nodes {survivors:?} outlived their SIGKILLed controller"
    );
}

/// A test controller hung up (a closed terminal; it handles no signal, so
/// SIGHUP ends it without a drop) takes its nodes with it.
#[test]
fn nodes_die_with_a_hung_up_test_controller() {
    let mut controller = Controller::start("cluster");
    let exit = controller.end_with(Signal::SIGHUP);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&exit),
        Some(Signal::SIGHUP as i32)
    );
    let survivors = controller.surviving_nodes();
    assert!(
        survivors.is_empty(),
        "nodes {survivors:?} outlived their hung-up controller"
    );
}

/// The jepsen-like harness hung up in the middle of a run ends the run
/// itself (exit 2, "interrupted by SIGHUP"), stopping its cluster: no node
/// is left running.
#[test]
fn a_hung_up_harness_stops_its_nodes() {
    let mut controller = Controller::start("harness");
    let exit = controller.end_with(Signal::SIGHUP);
    let stderr = controller.stderr();
    assert_eq!(exit.code(), Some(2), "{exit}: {stderr}");
    assert!(stderr.contains("interrupted by SIGHUP"), "{stderr}");
    let survivors = controller.surviving_nodes();
    assert!(
        survivors.is_empty(),
        "nodes {survivors:?} outlived the hung-up harness"
    );
}
