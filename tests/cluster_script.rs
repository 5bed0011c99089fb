//! `scripts/cluster.sh` run as a user runs it, against the `oncekv` binary
//! under test (`ONCEKV_BIN`), with a data directory and a port base of its
//! own, while the machine is loaded: the script must keep track of the
//! nodes it starts. Linux only (the script's `setsid`, `/proc`).
#![cfg(target_os = "linux")]

use std::net::TcpListener;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Restarts the loop test makes by default (two of each node, about half
/// a minute on a loaded 2-core machine with the debug build; the slow
/// `nproc` below opens the window on every start, so the old pid handling
/// failed on the first); `ONCEKV_SCRIPT_RESTARTS` changes it (50 took
/// about five minutes). Kept small so that `.ci/run` stays under 15
/// minutes.
const DEFAULT_RESTARTS: usize = 6;
/// How long the `nproc` the script's background child runs takes (see
/// `slow_nproc`).
const SLOW_NPROC: &str = "0.3";
/// Busy threads per core beside the cluster.
const HOG_THREADS_PER_CORE: usize = 3;
/// How long one run of the script may take (`start` waits up to 30 s for a
/// leader itself, `restart` up to 30 s for the node to answer).
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(90);
/// How long the whole loop may take before the test gives up.
const LOOP_TIMEOUT: Duration = Duration::from_secs(600);

/// The nodes' Raft timing (`ONCEKV_NODE_ARGS` unless a test sets its own).
const TIMING_ARGS: &str =
    "--heartbeat-ms 100 --election-timeout-min-ms 400 --election-timeout-max-ms 800";

/// A `scripts/cluster.sh` cluster of the binary under test in a temporary
/// directory; dropping it stops the cluster and SIGKILLs any process that
/// still names its data directory (a node the script lost track of).
struct ScriptCluster {
    data: tempfile::TempDir,
    base: u16,
    /// `PATH` with `slow_nproc`'s directory first.
    path: std::ffi::OsString,
}

impl ScriptCluster {
    fn new() -> ScriptCluster {
        let data = tempfile::Builder::new()
            .prefix("oncekv-script-")
            .tempdir()
            .expect("create the data directory");
        let tools = data.path().join("tools");
        slow_nproc(&tools);
        let mut path = tools.into_os_string();
        if let Some(inherited) = std::env::var_os("PATH") {
            path.push(":");
            path.push(inherited);
        }
        ScriptCluster {
            data,
            base: free_port_base(),
            path,
        }
    }

    fn data(&self) -> &Path {
        self.data.path()
    }

    /// Runs `scripts/cluster.sh ARGS` within [`SCRIPT_TIMEOUT`].
    fn run(&self, args: &[&str]) -> Output {
        self.run_with(args, &[])
    }

    /// Runs `scripts/cluster.sh ARGS` with `envs` set too.
    fn run_with(&self, args: &[&str], envs: &[(&str, &str)]) -> Output {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/cluster.sh");
        let mut child = Command::new("bash")
            .arg(script)
            .args(args)
            .env("ONCEKV_BIN", env!("CARGO_BIN_EXE_oncekv"))
            .env("ONCEKV_DATA", self.data())
            .env("ONCEKV_PORT_BASE", self.base.to_string())
            .env("PATH", &self.path)
            .env_remove("ONCEKV_WORKER_THREADS")
            .env("ONCEKV_NODE_ARGS", TIMING_ARGS)
            .env_remove("ONCEKV_CA")
            .env_remove("ONCEKV_TOKEN")
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run scripts/cluster.sh");
        let deadline = Instant::now() + SCRIPT_TIMEOUT;
        while child.try_wait().expect("poll the script").is_none() {
            if Instant::now() >= deadline {
                let _ = child.kill();
                let output = child.wait_with_output().expect("reap the script");
                panic!(
                    "scripts/cluster.sh {args:?} ran longer than {SCRIPT_TIMEOUT:?}:\n{}{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child
            .wait_with_output()
            .expect("collect the script's output")
    }

    /// Runs the script and panics unless it succeeds.
    fn ok(&self, args: &[&str]) -> String {
        self.ok_with(args, &[])
    }

    /// Runs the script with `envs` set too and panics unless it succeeds.
    fn ok_with(&self, args: &[&str], envs: &[(&str, &str)]) -> String {
        let output = self.run_with(args, envs);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            output.status.success(),
            "scripts/cluster.sh {args:?} failed ({}):\n{text}",
            output.status
        );
        text
    }

    /// Node `n`'s pid file's pid, if the file exists.
    fn pid_file(&self, n: u64) -> Option<u32> {
        let text = std::fs::read_to_string(self.data().join(format!("n{n}/pid"))).ok()?;
        text.trim().parse().ok()
    }

    /// Each node's pid file's pid, checked to be the one live process of
    /// that node (`when` names the moment in the failure).
    fn tracked_nodes(&self, when: &str) -> Vec<u32> {
        (1..=3)
            .map(|n| {
                let tracked = self.pid_file(n).expect("a pid file");
                assert_eq!(self.node_processes(n), vec![tracked], "node {n} {when}");
                tracked
            })
            .collect()
    }

    /// Node `n`'s client address.
    fn client_addr(&self, n: u64) -> String {
        format!("127.0.0.1:{}", u64::from(self.base) + n)
    }

    /// Node `n`'s log as it is now.
    fn node_log(&self, n: u64) -> String {
        std::fs::read_to_string(self.data().join(format!("n{n}/node.log"))).unwrap_or_default()
    }

    /// Runs the `oncekv` CLI against this cluster and panics unless it
    /// succeeds; returns its stdout.
    fn cli(&self, args: &[&str]) -> String {
        let output = Command::new(env!("CARGO_BIN_EXE_oncekv"))
            .args(args)
            .env("ONCEKV_PORT_BASE", self.base.to_string())
            .env_remove("ONCEKV_CA")
            .env_remove("ONCEKV_TOKEN")
            .stdin(Stdio::null())
            .output()
            .expect("run the oncekv CLI");
        assert!(
            output.status.success(),
            "oncekv {args:?} failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Node `n`'s `oncekv status --json`.
    fn status(&self, n: u64) -> serde_json::Value {
        let status = self.cli(&["status", "--json", "--endpoints", &self.client_addr(n)]);
        serde_json::from_str(&status).unwrap_or_else(|error| panic!("{error}: {status}"))
    }

    /// A number of node `n`'s `oncekv status --json`.
    fn status_number(&self, n: u64, field: &str) -> u64 {
        let status = self.status(n);
        status[field]
            .as_u64()
            .unwrap_or_else(|| panic!("{field} in {status}"))
    }

    /// The pids of live processes whose command line names node `n`'s
    /// data directory: the node processes of this cluster, tracked or not.
    fn node_processes(&self, n: u64) -> Vec<u32> {
        let needle = format!("{}/db", self.data().join(format!("n{n}")).display());
        processes_naming(&needle)
    }
}

impl Drop for ScriptCluster {
    fn drop(&mut self) {
        let _ = self.run(&["stop"]);
        for pid in processes_naming(&self.data().display().to_string()) {
            // A node the script lost: ours (its command line names our
            // temporary data directory), so ours to end.
            if let Ok(pid) = i32::try_from(pid) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }
}

/// Writes an `nproc` into `dir` that answers 1 after [`SLOW_NPROC`]
/// seconds. The script's background child runs it (for `--worker-threads`)
/// while it evaluates the node's arguments, before it execs the node: the
/// window in which the child's command line is still the script's own,
/// which a loaded machine opens by chance (2 restarts in 16 at a load
/// average of 1.8), held open on every start.
fn slow_nproc(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).expect("create the tools directory");
    let nproc = dir.join("nproc");
    std::fs::write(&nproc, format!("#!/bin/sh\nsleep {SLOW_NPROC}\necho 1\n"))
        .expect("write nproc");
    std::fs::set_permissions(&nproc, std::fs::Permissions::from_mode(0o755))
        .expect("make nproc executable");
}

/// Pids of live (not zombie) processes whose command line contains
/// `needle`, from `/proc`.
fn processes_naming(needle: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        let Ok(cmdline) = std::fs::read(proc_dir.join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let zombie = std::fs::read_to_string(proc_dir.join("stat"))
            .ok()
            .and_then(|stat| {
                stat.rsplit_once(')')
                    .map(|(_, rest)| rest.trim_start().starts_with('Z'))
            })
            .unwrap_or(false);
        if cmdline.contains(needle) && !zombie && pid != std::process::id() {
            pids.push(pid);
        }
    }
    pids
}

/// A port base whose twelve ports (clients, peers, metrics and HTTP of
/// nodes 1-3) are free now: below the ephemeral range, starting at a
/// random place so that concurrent runs rarely meet, and at a different
/// one for each cluster of this process (its tests run at once, and a
/// base probed free is taken only when the script's nodes bind it).
fn free_port_base() -> u16 {
    static CLUSTERS: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let offsets = [1u16, 2, 3, 101, 102, 103, 201, 202, 203, 301, 302, 303];
    let ours = CLUSTERS.fetch_add(7, Ordering::Relaxed);
    let start = u16::try_from(std::process::id() % 100).expect("below 100") + ours;
    for step in 0..100u16 {
        let base = 20_000 + ((start + step) % 100) * 100;
        let listeners: Vec<_> = offsets
            .iter()
            .filter_map(|offset| TcpListener::bind(("127.0.0.1", base + offset)).ok())
            .collect();
        if listeners.len() == offsets.len() {
            return base;
        }
    }
    panic!("no port base with twelve free ports between 20000 and 30000");
}

/// Busy threads, one per core, until dropped: a loaded machine.
struct CpuHog {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl CpuHog {
    fn start() -> CpuHog {
        let stop = Arc::new(AtomicBool::new(false));
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let threads = (0..cores * HOG_THREADS_PER_CORE)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        for i in 0..10_000u64 {
                            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
                        }
                    }
                })
            })
            .collect();
        CpuHog { stop, threads }
    }
}

impl Drop for CpuHog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// `scripts/cluster.sh restart N`, repeated over nodes 1-3 with every core
/// kept busy, leaves node N running each time with a pid file that names
/// its one live process, and `stop` then leaves no node behind: the script
/// never takes a node that has not exec'd yet for a dead one (whose pid
/// file it used to delete, leaving a stray node holding its ports and data
/// directory). The child's argument evaluation is slowed (`slow_nproc`) so
/// that every start has that window. `ONCEKV_SCRIPT_RESTARTS` sets the
/// number of restarts.
#[test]
fn restarts_on_a_loaded_machine_keep_every_node_tracked() {
    let restarts: usize = std::env::var("ONCEKV_SCRIPT_RESTARTS")
        .ok()
        .and_then(|count| count.parse().ok())
        .unwrap_or(DEFAULT_RESTARTS);
    let cluster = ScriptCluster::new();
    let _hog = CpuHog::start();
    let began = Instant::now();
    cluster.ok(&["start"]);
    cluster.tracked_nodes("after start");
    for round in 0..restarts {
        assert!(
            began.elapsed() < LOOP_TIMEOUT,
            "only {round} restarts within {LOOP_TIMEOUT:?}"
        );
        let n = (round % 3) as u64 + 1;
        let output = cluster.run(&["restart", &n.to_string()]);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let tracked = cluster.pid_file(n);
        let running = cluster.node_processes(n);
        assert!(
            output.status.success() && tracked.is_some() && running == vec![tracked.unwrap()],
            "restart {round} of node {n}: exit {}, pid file {tracked:?}, node processes {running:?}:\n{text}",
            output.status
        );
    }
    cluster.ok(&["stop"]);
    for n in 1..=3 {
        assert_eq!(cluster.pid_file(n), None, "node {n}'s pid file after stop");
        assert!(
            cluster.node_processes(n).is_empty(),
            "node {n} still runs after stop"
        );
    }
}

/// The session of process `pid` (the sixth field of /proc/PID/stat).
fn session_of(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc/PID/stat");
    stat_field(&stat, 6)
        .and_then(|field| field.parse().ok())
        .expect("a session id")
}

/// Field `number` (counted from 1, as proc(5) does) of a `/proc/…/stat`
/// line; the name in brackets, field 2, may hold spaces.
fn stat_field(stat: &str, number: usize) -> Option<&str> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(number.checked_sub(3)?)
}

/// By default each node leads a session of its own (so Linux's autogroup
/// shares the CPU equally between the nodes); with
/// `ONCEKV_SCHED_GROUP=shared` the nodes stay in the caller's session —
/// where a node's idle-priority catch-up threads yield to the other nodes'
/// requests — and still outlive the script; any other value is refused
/// before anything starts.
#[test]
fn nodes_lead_sessions_of_their_own_unless_told_to_share_the_callers() {
    let cluster = ScriptCluster::new();
    let ours = session_of(std::process::id());
    cluster.ok(&["start"]);
    for pid in cluster.tracked_nodes("after start") {
        assert_eq!(session_of(pid), pid, "node {pid} leads its own session");
    }
    cluster.ok(&["stop"]);

    cluster.ok_with(&["start"], &[("ONCEKV_SCHED_GROUP", "shared")]);
    for pid in cluster.tracked_nodes("outlived the script") {
        assert_eq!(
            session_of(pid),
            ours,
            "node {pid} is in the caller's session"
        );
    }
    cluster.ok(&["status"]);
    cluster.ok(&["stop"]);

    let refused = cluster.run_with(&["start"], &[("ONCEKV_SCHED_GROUP", "everyone")]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("ONCEKV_SCHED_GROUP"));
    for n in 1..=3 {
        assert!(
            cluster.node_processes(n).is_empty(),
            "node {n} started anyway"
        );
    }
}

/// This process's autogroup nice value as `/proc/PID/autogroup` shows it
/// ("/autogroup-5 nice 0").
fn group_nice(pid: u32) -> i32 {
    let line = std::fs::read_to_string(format!("/proc/{pid}/autogroup")).expect("autogroup");
    line.split_whitespace()
        .skip_while(|word| *word != "nice")
        .nth(1)
        .and_then(|nice| nice.parse().ok())
        .unwrap_or_else(|| panic!("a nice value in {line:?}"))
}

/// Linux's `SCHED_IDLE` policy number.
const SCHED_IDLE: u32 = 5;

/// The scheduling policy and nice value of each thread of `pid` named
/// `name` (fields 41 and 19 of /proc/PID/task/TID/stat).
fn thread_scheduling(pid: u32, name: &str) -> Vec<(u32, i32)> {
    let mut policies = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return policies;
    };
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let policy = stat_field(&stat, 41).and_then(|field| field.parse().ok());
        let nice = stat_field(&stat, 19).and_then(|field| field.parse().ok());
        if let (Some(policy), Some(nice)) = (policy, nice) {
            policies.push((policy, nice));
        }
    }
    policies
}

/// The nice value of process `pid`'s main thread.
fn process_nice(pid: u32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the node's stat");
    stat_field(&stat, 19)
        .and_then(|field| field.parse().ok())
        .expect("a nice value")
}

/// Sends `signal` to process `pid`.
fn signal(pid: u32, signal: Signal) {
    let pid = Pid::from_raw(i32::try_from(pid).expect("a pid"));
    kill(pid, signal).unwrap_or_else(|error| panic!("{signal} to {pid}: {error}"));
}

/// Waits (bounded) until `holds`; panics with `what` after `limit`.
fn wait_until(limit: Duration, what: impl Fn() -> String, holds: impl Fn() -> bool) {
    let deadline = Instant::now() + limit;
    while !holds() {
        assert!(Instant::now() < deadline, "{}", what());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What a node logs when it lowers its scheduling group to catch up.
const LOWERED: &str = "catching up: the node's CPU priority is lowered";
/// ... when it restores it, caught up.
const RESTORED: &str = "caught up: the node's CPU priority is restored";
/// ... when it restores it because the catch-up starved lowered.
const STARVED: &str = "starved while catching up: the node's CPU priority is restored";
/// ... when the system refuses to change it.
const CANNOT_CHANGE: &str = "cannot change the node's priority";

/// Node `n`'s log once it says `what` (waiting up to `limit`); `None`, said
/// on stderr, when the machine refused the node's priority writes instead
/// (nothing to check there).
fn log_once_it_says(
    cluster: &ScriptCluster,
    n: u64,
    what: &str,
    limit: Duration,
) -> Option<String> {
    wait_until(
        limit,
        || format!("node {n} never said {what:?}:\n{}", cluster.node_log(n)),
        || {
            let log = cluster.node_log(n);
            log.contains(what) || log.contains(CANNOT_CHANGE)
        },
    );
    let log = cluster.node_log(n);
    if log.contains(CANNOT_CHANGE) {
        eprintln!("this machine refuses the nodes' priority writes: nothing to check");
        return None;
    }
    Some(log)
}

/// The pids of a cluster just started, its leader, a follower and the
/// follower's pid.
fn leader_and_follower(cluster: &ScriptCluster) -> (Vec<u32>, u64, u64, u32) {
    let pids = cluster.tracked_nodes("after start");
    let leader = (1..=3)
        .find(|&n| cluster.status(n)["role"] == "leader")
        .expect("a leader after start");
    let follower = (1..=3).find(|&n| n != leader).expect("a follower");
    let pid = pids[usize::try_from(follower - 1).expect("small")];
    (pids, leader, follower, pid)
}

/// Pauses `follower` (process `pid`) and has the others write, snapshot and
/// purge their logs past it, so that once resumed it catches up by a
/// snapshot; returns the leader's snapshot index. The caller resumes it.
fn pause_until_purged_past(cluster: &ScriptCluster, leader: u64, follower: u64, pid: u32) -> u64 {
    let behind = cluster.status_number(follower, "last_log_index");
    signal(pid, Signal::SIGSTOP);
    let others: Vec<String> = (1..=3)
        .filter(|&n| n != follower)
        .map(|n| cluster.client_addr(n))
        .collect();
    cluster.cli(&[
        "bench",
        "--clients",
        "4",
        "--duration",
        "2",
        "--endpoints",
        &others.join(","),
    ]);
    for addr in &others {
        cluster.cli(&[
            "admin",
            "snapshot",
            "--node",
            addr,
            "--endpoints",
            addr,
            "--timeout-ms",
            "60000",
        ]);
    }
    let snapshot = cluster.status_number(leader, "snapshot_index");
    // The leader purges the log it still sends only once the send to the
    // paused node has given up.
    wait_until(
        Duration::from_secs(60),
        || format!("node {leader} kept its log past {behind}"),
        || cluster.status_number(leader, "purged_index") > behind,
    );
    snapshot
}

/// A follower that was paused while the others snapshotted and purged
/// their logs past it catches up by a snapshot and lowers its own
/// scheduling group (its autogroup, as it leads its session) to
/// `--catch-up-nice` while it does, then restores it: its log says both,
/// in that order, and its group is back at nice 0 once it has caught up.
/// Where the machine gives the node no autogroup (the sysctl off, a CPU
/// cgroup below the root), the node says so and lowers nothing; in the
/// caller's session (`ONCEKV_SCHED_GROUP=shared`) it says it keeps its
/// priority.
#[test]
fn a_catching_up_node_lowers_its_scheduling_group_until_it_has_caught_up() {
    let cluster = ScriptCluster::new();
    let args = format!(
        "{TIMING_ARGS} --snapshot-every-entries 1000000 --logs-kept-after-snapshot 5 --catch-up-nice 17"
    );
    cluster.ok_with(&["start"], &[("ONCEKV_NODE_ARGS", &args)]);
    let (pids, leader, follower, pid) = leader_and_follower(&cluster);
    let autogroup_on = std::fs::read_to_string("/proc/sys/kernel/sched_autogroup_enabled")
        .is_ok_and(|enabled| enabled.trim() == "1");
    assert_eq!(group_nice(pid), 0, "the follower's group before");

    let snapshot = pause_until_purged_past(&cluster, leader, follower, pid);
    signal(pid, Signal::SIGCONT);

    // Where this machine gives the node no autogroup (the sysctl off, or a
    // CPU cgroup below the root, as under some CI runners), it must say so
    // and lower nothing.
    let no_autogroup = if autogroup_on {
        "where autogroup does not apply"
    } else {
        "kernel.sched_autogroup_enabled is off"
    };
    if cluster.node_log(follower).contains(no_autogroup) {
        wait_until(
            Duration::from_secs(120),
            || format!("node {follower} never caught up"),
            || cluster.status_number(follower, "snapshot_index") >= snapshot,
        );
        let log = cluster.node_log(follower);
        assert!(!log.contains(LOWERED), "{log}");
        eprintln!("no autogroup for the nodes here: only checked that none lowered itself");
        return;
    }
    let Some(log) = log_once_it_says(&cluster, follower, RESTORED, Duration::from_secs(120)) else {
        return;
    };
    let lowered = log
        .find(LOWERED)
        .unwrap_or_else(|| panic!("lowered first:\n{log}"));
    assert!(lowered < log.find(RESTORED).expect("restored"), "{log}");
    // The node read its group's value back after setting it.
    let line_of = |what: &str| {
        log.lines()
            .find(|line| line.contains(what))
            .map(str::to_owned)
            .unwrap_or_default()
    };
    assert!(line_of(LOWERED).contains("group_nice=17"), "{log}");
    assert!(line_of(RESTORED).contains("group_nice=0"), "{log}");
    assert!(
        cluster.status_number(follower, "snapshot_index") >= snapshot,
        "node {follower} caught up by the snapshot"
    );
    assert_eq!(group_nice(pid), 0, "the follower's group after");
    // The record store's new generation, opened by the intake of the
    // snapshot, runs its workers at the nice value of the node's
    // background work, not at the intake's idle policy (which a thread
    // inherits and cannot leave); so do the other nodes'.
    for (n, &pid) in (1..=3).zip(&pids) {
        let background = (process_nice(pid) + oncekv_records::WORKER_NICE).min(19);
        let workers = thread_scheduling(pid, "fjall:worker");
        assert!(!workers.is_empty(), "node {n}'s record store workers");
        assert!(
            workers
                .iter()
                .all(|&(policy, nice)| policy != SCHED_IDLE && nice == background),
            "node {n}'s record store workers, (policy, nice), not (0, {background}): {workers:?}"
        );
    }
    // The others never were behind.
    for n in (1..=3).filter(|&n| n != follower) {
        assert!(
            !cluster.node_log(n).contains(LOWERED),
            "node {n} lowered itself"
        );
    }
    cluster.ok(&["stop"]);

    // In the caller's session, the node lowers nothing (it would lower
    // the caller too) and says so.
    cluster.ok_with(&["start"], &[("ONCEKV_SCHED_GROUP", "shared")]);
    wait_until(
        Duration::from_secs(30),
        || {
            format!(
                "node {follower} said nothing of its priority:\n{}",
                cluster.node_log(follower)
            )
        },
        || {
            cluster
                .node_log(follower)
                .contains("keeps its CPU priority while it catches up")
        },
    );
    cluster.ok(&["stop"]);
}

/// A catch-up that starves at the lowered priority goes on at the node's
/// own: a follower catching up by a snapshot (its intake held 8 s by a
/// test fault, so that the catch-up lasts) is stopped for 2 s, as a node
/// whose group gets no CPU is, and on its first look after it restores its
/// group while the snapshot is still being taken in, and does not lower it
/// again before it has caught up.
#[cfg(feature = "fault-injection")]
#[test]
fn a_catch_up_starved_at_the_lowered_priority_goes_on_at_the_nodes_own() {
    let cluster = ScriptCluster::new();
    let args = format!(
        "{TIMING_ARGS} --snapshot-every-entries 1000000 --logs-kept-after-snapshot 5 \
         --catch-up-nice 17 --fault hold-snapshot-intake-ms-8000"
    );
    cluster.ok_with(&["start"], &[("ONCEKV_NODE_ARGS", &args)]);
    let (_, leader, follower, pid) = leader_and_follower(&cluster);
    let snapshot = pause_until_purged_past(&cluster, leader, follower, pid);
    signal(pid, Signal::SIGCONT);
    if cluster
        .node_log(follower)
        .contains("keeps its CPU priority while it catches up")
    {
        eprintln!("no autogroup for the nodes here: nothing to lower, nothing to starve");
        return;
    }
    let Some(log) = log_once_it_says(&cluster, follower, LOWERED, Duration::from_secs(60)) else {
        return;
    };
    // A node at nice 17 on a loaded machine may starve on its own: then
    // the stop below would prove nothing.
    if log.contains(STARVED) {
        eprintln!("node {follower} starved before the test stopped it: inconclusive");
        return;
    }
    assert_eq!(group_nice(pid), 17, "the follower's group, lowered");
    // Each reception's intake is held 8 s (and one begins again if the
    // leader's stream broke off during the stop): the node is still
    // catching up when it resumes.
    let stopped_at = log.len();
    signal(pid, Signal::SIGSTOP);
    std::thread::sleep(Duration::from_secs(2));
    signal(pid, Signal::SIGCONT);
    wait_until(
        Duration::from_secs(30),
        || {
            format!(
                "node {follower} never said it starved:\n{}",
                cluster.node_log(follower)
            )
        },
        || cluster.node_log(follower)[stopped_at..].contains(STARVED),
    );
    assert_eq!(group_nice(pid), 0, "the follower's group, starved");
    wait_until(
        Duration::from_secs(120),
        || {
            format!(
                "node {follower} never caught up:\n{}",
                cluster.node_log(follower)
            )
        },
        || cluster.node_log(follower).contains(RESTORED),
    );
    let log = cluster.node_log(follower);
    let at = |what: &str| log.find(what).unwrap_or_else(|| panic!("{what}:\n{log}"));
    assert!(
        at(LOWERED) < at(STARVED) && at(STARVED) < at(RESTORED),
        "{log}"
    );
    assert_eq!(log.matches(LOWERED).count(), 1, "lowered once:\n{log}");
    assert!(
        log.lines()
            .find(|line| line.contains(STARVED))
            .is_some_and(|line| line.contains("group_nice=0")),
        "{log}"
    );
    assert!(
        cluster.status_number(follower, "snapshot_index") >= snapshot,
        "node {follower} caught up by the snapshot"
    );
    assert_eq!(group_nice(pid), 0, "the follower's group after");
    cluster.ok(&["stop"]);
}
