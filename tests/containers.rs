//! Tests across hosts: three nodes, each in its own container on a private
//! network (`deploy/compose.yaml`, the image of `scripts/image.sh` built from
//! this test build's own `oncekv` binary), with real node loss (`docker
//! kill`), real partitions (`docker network disconnect`), a rolling restart
//! under 32 clients and the replacement of a dead host by a fresh node 4
//! (a container started on the project's network outside compose).
//! Clients run in the test process on the host, through the client ports
//! published on 127.0.0.1; the nodes announce those host addresses as their
//! client addresses (`ONCEKV_ADVERTISE_CLIENT_HOST=127.0.0.1`), so leader
//! hints lead somewhere the host can connect.
//!
//! Each test owns one compose project (a unique name: its own network,
//! containers and volumes), removed with its volumes when the test's guard
//! drops, also when the test panics (the nodes' last log lines are printed
//! first); node 4's container is removed before the project. The image is built once per run of this test binary and reused
//! by later runs of the same binary (its tag is the binary's hash).
//!
//! Where no Docker engine answers, docker-compose is missing or the image
//! cannot be built, every test here prints why and passes as SKIPPED
//! (`ONCEKV_REQUIRE_CONTAINERS=1` makes that a failure instead, for machines
//! that must run them).

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use oncekv::cli::status::query;
use oncekv_client::{AttemptObserver, AttemptOutcome, Client, ClientConfig, Error};
use oncekv_core::Value;
use oncekv_testkit::{agreed_leader, describe, free_ports};
use oncekv_wire::proto::admin_client::AdminClient;
use oncekv_wire::proto::{ChangeVotersRequest, Member, StateHashRequest, StatusReply};
use tokio::time::{Instant, sleep};

const NODES: [u64; 3] = [1, 2, 3];
/// Raft timing for containers on a loaded 2-core machine.
const NODE_ARGS: &str =
    "--heartbeat-ms 100 --election-timeout-min-ms 400 --election-timeout-max-ms 800";

/// Every node's flags: [`NODE_ARGS`], and in a `fault-injection` build
/// (what CI tests) a lost reply to the first new execute after every
/// start, so that clients retry requests that were applied and the
/// registry must answer them from its cache: without that, "nothing
/// applied twice" would go untested across restarts.
fn node_args() -> String {
    if cfg!(feature = "fault-injection") {
        format!("{NODE_ARGS} --fault drop-first-execute-reply")
    } else {
        NODE_ARGS.to_owned()
    }
}
/// Bound of one docker or docker-compose command.
const DOCKER_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound of building the image.
const IMAGE_TIMEOUT: Duration = Duration::from_secs(300);
/// How long the cluster may take to agree on a leader after a change.
const LEADER_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the load may take to make the progress a step waits for.
const PROGRESS_TIMEOUT: Duration = Duration::from_secs(60);
/// Client tasks of the load, each with its own session and its own counter.
const LOAD_CLIENTS: usize = 8;
/// Client tasks of the rolling restart's load (the 32 clients).
const ROLLING_CLIENTS: usize = 32;
/// Id of the node that replaces a dead one.
const NEW_NODE: u64 = 4;
const POLL: Duration = Duration::from_millis(100);

// ---- the image, once per run ----------------------------------------------------

/// The image tag to run, or why these tests cannot run here.
fn image() -> Result<&'static str, &'static str> {
    static IMAGE: OnceLock<Result<String, String>> = OnceLock::new();
    IMAGE
        .get_or_init(build_image)
        .as_ref()
        .map(String::as_str)
        .map_err(String::as_str)
}

fn build_image() -> Result<String, String> {
    run_sync("docker", &["info", "--format", "{{.ServerVersion}}"])
        .map_err(|error| format!("no Docker engine answers: {error}"))?;
    run_sync("docker-compose", &["version", "--short"])
        .map_err(|error| format!("docker-compose does not run: {error}"))?;
    let binary = env!("CARGO_BIN_EXE_oncekv");
    let bytes = std::fs::read(binary).map_err(|error| format!("read {binary}: {error}"))?;
    let tag = format!(
        "oncekv-test:{}",
        &blake3::hash(&bytes).to_hex().as_str()[..12]
    );
    if run_sync("docker", &["image", "inspect", &tag]).is_ok() {
        return Ok(tag);
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/image.sh");
    run_sync_within(IMAGE_TIMEOUT, script, &["--binary", binary, "--tag", &tag])
        .map_err(|error| format!("the image cannot be built: {error}"))?;
    Ok(tag)
}

/// The image, or `None` after printing why the calling test is skipped.
fn image_or_skip(test: &str) -> Option<&'static str> {
    match image() {
        Ok(image) => Some(image),
        Err(reason) => {
            if std::env::var_os("ONCEKV_REQUIRE_CONTAINERS").is_some_and(|value| value == "1") {
                panic!("{test}: {reason} (and ONCEKV_REQUIRE_CONTAINERS=1)");
            }
            eprintln!("SKIPPED containers::{test}: {reason}");
            None
        }
    }
}

/// Runs a program to completion within [`DOCKER_TIMEOUT`] (via `timeout`),
/// blocking; its stdout, or its stderr as the error.
fn run_sync(program: &str, args: &[&str]) -> Result<String, String> {
    run_sync_within(DOCKER_TIMEOUT, program, args)
}

fn run_sync_within(limit: Duration, program: &str, args: &[&str]) -> Result<String, String> {
    let output = std::process::Command::new("timeout")
        .arg("--kill-after=5")
        .arg(limit.as_secs().to_string())
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|error| format!("{program}: {error}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{program} {args:?}: {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// [`run_sync`] without blocking the runtime.
async fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let program = program.to_owned();
    let args: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_sync(&program, &args)
    })
    .await
    .expect("the blocking task ran")
}

// ---- one cluster in containers ---------------------------------------------------

/// A compose project of three nodes; taken down with its volumes on drop.
struct Project {
    name: String,
    env: Vec<(String, String)>,
    /// Client endpoints on the host by node id (node 4's added when it
    /// starts).
    endpoints: BTreeMap<u64, String>,
    /// Containers started outside compose (node 4); removed first on drop.
    extra_containers: std::sync::Mutex<Vec<String>>,
}

impl Project {
    /// Starts the three containers (nothing waits for a leader yet).
    async fn up(test: &str, image: &str) -> Project {
        let ports = free_ports(6).expect("free ports");
        let mut env = vec![
            ("ONCEKV_IMAGE".to_owned(), image.to_owned()),
            (
                "ONCEKV_ADVERTISE_CLIENT_HOST".to_owned(),
                "127.0.0.1".to_owned(),
            ),
            ("ONCEKV_NODE_ARGS".to_owned(), node_args()),
            ("ONCEKV_RESTART".to_owned(), "no".to_owned()),
            ("RUST_LOG".to_owned(), "info".to_owned()),
        ];
        for (index, node) in NODES.iter().enumerate() {
            env.push((
                format!("ONCEKV_CLIENT_PORT_{node}"),
                ports[index].port().to_string(),
            ));
            env.push((
                format!("ONCEKV_METRICS_PORT_{node}"),
                ports[3 + index].port().to_string(),
            ));
        }
        let project = Project {
            // Compose keeps only [a-z0-9_-] of a project name.
            name: format!("oncekvt{}{}", std::process::id(), test.replace('_', "")),
            endpoints: NODES
                .into_iter()
                .zip(&ports)
                .map(|(node, addr)| (node, format!("127.0.0.1:{}", addr.port())))
                .collect(),
            env,
            extra_containers: std::sync::Mutex::default(),
        };
        project
            .compose(&["up", "--detach", "--no-color"])
            .await
            .unwrap_or_else(|error| panic!("compose up: {error}"));
        project
    }

    fn compose_command(&self, args: &[&str]) -> std::process::Command {
        let mut command = std::process::Command::new("timeout");
        command
            .arg("--kill-after=5")
            .arg(DOCKER_TIMEOUT.as_secs().to_string())
            .arg("docker-compose")
            .arg("--file")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/compose.yaml"))
            .arg("--project-name")
            .arg(&self.name)
            .args(args)
            .envs(self.env.iter().map(|(key, value)| (key, value)))
            .stdin(Stdio::null());
        command
    }

    async fn compose(&self, args: &[&str]) -> Result<String, String> {
        let mut command = self.compose_command(args);
        let output = tokio::task::spawn_blocking(move || command.output())
            .await
            .expect("the blocking task ran")
            .map_err(|error| format!("docker-compose: {error}"))?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(format!(
                "docker-compose {args:?}: {}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    }

    fn network(&self) -> String {
        format!("{}_oncekv", self.name)
    }

    /// The container id of node `node`.
    async fn container(&self, node: u64) -> String {
        let id = self
            .compose(&["ps", "--quiet", &format!("node-{node}")])
            .await
            .unwrap_or_else(|error| panic!("compose ps: {error}"));
        let id = id.trim().to_owned();
        assert!(!id.is_empty(), "no container for node {node}");
        id
    }

    async fn docker(&self, args: &[&str]) {
        run("docker", args)
            .await
            .unwrap_or_else(|error| panic!("{error}"));
    }

    /// SIGKILL node `node`'s process (`docker kill`).
    async fn kill(&self, node: u64) {
        let id = self.container(node).await;
        self.docker(&["kill", &id]).await;
    }

    async fn start(&self, node: u64) {
        let id = self.container(node).await;
        self.docker(&["start", &id]).await;
    }

    /// SIGTERM, a grace period, then start again (`docker restart`).
    async fn restart(&self, node: u64) {
        let id = self.container(node).await;
        self.docker(&["restart", "--time", "20", &id]).await;
    }

    /// Cuts node `node` off the network: from its peers and from the host.
    async fn disconnect(&self, node: u64) {
        let id = self.container(node).await;
        self.docker(&["network", "disconnect", &self.network(), &id])
            .await;
    }

    /// Puts node `node` back on the network under its host name.
    async fn connect(&self, node: u64) {
        let id = self.container(node).await;
        let alias = format!("node-{node}");
        self.docker(&[
            "network",
            "connect",
            "--alias",
            &alias,
            &self.network(),
            &id,
        ])
        .await;
    }

    fn endpoint(&self, node: u64) -> &str {
        &self.endpoints[&node]
    }

    /// The host endpoints of `nodes`.
    fn endpoints_of(&self, nodes: &[u64]) -> Vec<String> {
        nodes
            .iter()
            .map(|&node| self.endpoint(node).to_owned())
            .collect()
    }

    /// Starts node [`NEW_NODE`] empty (no `--initialize`, no peers) in a
    /// container of its own on the project's network, host name node-4,
    /// client port published on 127.0.0.1 only; returns its peer address.
    /// The port is picked now, and picked again if another test's container
    /// took it in between.
    async fn start_new_node(&mut self, image: &str) -> String {
        let mut tries = 0;
        loop {
            tries += 1;
            match self.try_start_new_node(image).await {
                Ok(peer) => return peer,
                Err(error) if tries < 5 && error.contains("port is already allocated") => {
                    let name = format!("{}-node-{NEW_NODE}", self.name);
                    let _ = run("docker", &["rm", "--force", &name]).await;
                }
                Err(error) => panic!("start node {NEW_NODE}: {error}"),
            }
        }
    }

    async fn try_start_new_node(&mut self, image: &str) -> Result<String, String> {
        let port = free_ports(1).expect("a free port")[0].port().to_string();
        self.endpoints.insert(NEW_NODE, format!("127.0.0.1:{port}"));
        let port = port.as_str();
        let name = format!("{}-node-{NEW_NODE}", self.name);
        let alias = format!("node-{NEW_NODE}");
        let peer = format!("{alias}:{}", 7200 + NEW_NODE);
        {
            let mut extra = self.extra_containers.lock().expect("not poisoned");
            if !extra.contains(&name) {
                extra.push(name.clone());
            }
        }
        let mut args = vec![
            "run".to_owned(),
            "--detach".to_owned(),
            "--name".to_owned(),
            name,
            "--hostname".to_owned(),
            alias.clone(),
            "--network".to_owned(),
            self.network(),
            "--network-alias".to_owned(),
            alias,
            "--publish".to_owned(),
            format!("127.0.0.1:{port}:{port}"),
            "--env".to_owned(),
            format!("ONCEKV_HEALTH_ENDPOINT=127.0.0.1:{port}"),
            image.to_owned(),
            "node".to_owned(),
            "--id".to_owned(),
            NEW_NODE.to_string(),
            "--insecure".to_owned(),
            "--data-dir".to_owned(),
            "/data/db".to_owned(),
            "--client-addr".to_owned(),
            format!("0.0.0.0:{port}"),
            "--peer-addr".to_owned(),
            format!("0.0.0.0:{}", 7200 + NEW_NODE),
            "--advertise-client-addr".to_owned(),
            self.endpoint(NEW_NODE).to_owned(),
            "--advertise-peer-addr".to_owned(),
            peer.clone(),
        ];
        args.extend(node_args().split_whitespace().map(str::to_owned));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run("docker", &args).await.map(|_| peer)
    }

    async fn statuses(&self, nodes: &[u64]) -> BTreeMap<u64, Result<StatusReply, String>> {
        let answers = futures::future::join_all(
            nodes
                .iter()
                .map(|&node| query(self.endpoint(node), Duration::from_secs(2))),
        )
        .await;
        nodes
            .iter()
            .zip(answers)
            .map(|(&node, answer)| (node, answer.map_err(|error| error.to_string())))
            .collect()
    }

    /// Waits until every node of `nodes` answers and names the same leader
    /// (one of them) in the same term, and the cluster id is known.
    async fn wait_leader(&self, nodes: &[u64]) -> u64 {
        let deadline = Instant::now() + LEADER_TIMEOUT;
        loop {
            let statuses = self.statuses(nodes).await;
            if let Some(leader) = agreed_leader(&statuses)
                && statuses
                    .values()
                    .all(|status| status.as_ref().is_ok_and(|s| !s.cluster_id.is_empty()))
                && nodes.contains(&leader)
            {
                return leader;
            }
            assert!(
                Instant::now() < deadline,
                "nodes {nodes:?} agreed on no leader within {LEADER_TIMEOUT:?}:\n{}",
                describe(&statuses)
            );
            sleep(POLL).await;
        }
    }

    /// Waits until every node of `nodes` reports, through the Admin
    /// `StateHash` RPC, the same applied index (at least `at_least`) and the
    /// same state hash.
    async fn wait_hashes_agree(&self, nodes: &[u64], at_least: u64) -> (u64, String) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut seen = Vec::new();
            for &node in nodes {
                if let Ok(mut admin) =
                    AdminClient::connect(format!("http://{}", self.endpoint(node))).await
                {
                    let mut request = tonic::Request::new(StateHashRequest {});
                    request.set_timeout(Duration::from_secs(5));
                    if let Ok(reply) = admin.state_hash(request).await {
                        let reply = reply.into_inner();
                        assert_eq!(reply.node_id, node);
                        seen.push((reply.applied_index, reply.state_hash));
                    }
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
                "replicas did not converge at an index >= {at_least}: {seen:?}"
            );
            sleep(POLL).await;
        }
    }

    /// Sets the voters to exactly `voters` through the `ChangeVoters` RPC
    /// at the leader that the nodes `via` agree on (retried while the
    /// leader changes or answers UNAVAILABLE); the resulting members.
    async fn change_voters(&self, via: &[u64], voters: &[u64]) -> Vec<Member> {
        let deadline = Instant::now() + LEADER_TIMEOUT;
        loop {
            let leader = self.wait_leader(via).await;
            let cluster_id = self.statuses(&[leader]).await[&leader]
                .as_ref()
                .map(|status| status.cluster_id.clone())
                .unwrap_or_default();
            let outcome =
                match AdminClient::connect(format!("http://{}", self.endpoint(leader))).await {
                    Ok(mut admin) => {
                        let mut request = tonic::Request::new(ChangeVotersRequest {
                            cluster_id,
                            voters: voters.to_vec(),
                        });
                        request.set_timeout(Duration::from_secs(20));
                        admin
                            .change_voters(request)
                            .await
                            .map(|reply| reply.into_inner().members)
                            .map_err(|status| status.to_string())
                    }
                    Err(error) => Err(error.to_string()),
                };
            match outcome {
                Ok(members) => return members,
                Err(error) => assert!(
                    Instant::now() < deadline,
                    "ChangeVoters {voters:?} at node {leader}: {error}"
                ),
            }
            sleep(POLL).await;
        }
    }

    /// The highest applied index any node of `nodes` reports.
    async fn applied_index(&self, nodes: &[u64]) -> u64 {
        self.statuses(nodes)
            .await
            .values()
            .filter_map(|status| status.as_ref().ok())
            .map(|status| status.applied_index)
            .max()
            .unwrap_or(0)
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        let extra = std::mem::take(
            &mut *self
                .extra_containers
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for name in &extra {
            if std::thread::panicking()
                && let Ok(output) = std::process::Command::new("docker")
                    .args(["logs", "--tail", "40", name])
                    .output()
            {
                eprintln!(
                    "----- {name}: last log lines -----\n{}{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                );
            }
            if let Err(error) = run_sync("docker", &["rm", "--force", "--volumes", name]) {
                eprintln!("{name}: {error}");
            }
        }
        if std::thread::panicking()
            && let Ok(output) = self
                .compose_command(&["logs", "--no-color", "--tail", "40"])
                .output()
        {
            eprintln!(
                "----- {}: the nodes' last log lines -----\n{}",
                self.name,
                String::from_utf8_lossy(&output.stdout)
            );
        }
        match self
            .compose_command(&["down", "--volumes", "--timeout", "1"])
            .output()
        {
            Ok(output) if output.status.success() => {}
            Ok(output) => eprintln!(
                "{}: compose down failed: {}",
                self.name,
                String::from_utf8_lossy(&output.stderr)
            ),
            Err(error) => eprintln!("{}: compose down: {error}", self.name),
        }
    }
}

// ---- load and its accounting --------------------------------------------------------

/// What one load client saw of its own counter.
#[derive(Debug, Default)]
struct Tally {
    /// Increments answered with a value.
    acknowledged: u64,
    /// Increments whose outcome is unknown (sent, not answered in time).
    unknown: u64,
    /// Increments refused for sure (nothing executed).
    refused: u64,
    /// The last value an increment returned.
    last_value: i64,
}

/// Closed-loop increments by a number of clients, client i of the load
/// named `name` on key `name-counter-i`, until stopped.
struct Load {
    name: String,
    stop: Arc<AtomicBool>,
    acknowledged: Arc<AtomicU64>,
    /// Attempts answered from the registry's cache: retries of requests that
    /// had already been applied, which dedup answered without re-executing.
    duplicates: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<Tally>>,
    endpoints: Vec<String>,
}

impl Load {
    fn start(endpoints: &[String], clients: usize, name: &str) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let acknowledged = Arc::new(AtomicU64::new(0));
        let duplicates = Arc::new(AtomicU64::new(0));
        let tasks = (0..clients)
            .map(|index| {
                let stop = stop.clone();
                let acknowledged = acknowledged.clone();
                let seen = duplicates.clone();
                let client = Client::with_config(
                    endpoints.to_vec(),
                    ClientConfig {
                        call_timeout: Duration::from_secs(20),
                        attempt_timeout: Duration::from_secs(2),
                        observer: Some(AttemptObserver::new(move |event| {
                            if let AttemptOutcome::Answered {
                                duplicate: true, ..
                            } = event.outcome
                            {
                                seen.fetch_add(1, Ordering::Relaxed);
                            }
                        })),
                        ..ClientConfig::default()
                    },
                );
                let key = format!("{name}-counter-{index}");
                tokio::spawn(async move {
                    let mut tally = Tally::default();
                    while !stop.load(Ordering::Relaxed) {
                        match client.increment(key.as_bytes(), 1).await {
                            Ok(value) => {
                                assert!(
                                    value > tally.last_value,
                                    "{key}: {value} after {}: an increment went backwards",
                                    tally.last_value
                                );
                                tally.acknowledged += 1;
                                tally.last_value = value;
                                acknowledged.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(Error::OutcomeUnknown { .. }) => tally.unknown += 1,
                            Err(_) => tally.refused += 1,
                        }
                    }
                    client.close().await;
                    tally
                })
            })
            .collect();
        Load {
            name: name.to_owned(),
            stop,
            acknowledged,
            duplicates,
            tasks,
            endpoints: endpoints.to_vec(),
        }
    }

    fn acknowledged(&self) -> u64 {
        self.acknowledged.load(Ordering::Relaxed)
    }

    /// Waits until `more` increments beyond those acknowledged now are.
    async fn wait_progress(&self, more: u64, during: &str) {
        let target = self.acknowledged() + more;
        let deadline = Instant::now() + PROGRESS_TIMEOUT;
        while self.acknowledged() < target {
            assert!(
                Instant::now() < deadline,
                "{during}: the load made no progress to {target} acknowledged \
                 increments within {PROGRESS_TIMEOUT:?} (at {})",
                self.acknowledged()
            );
            sleep(POLL).await;
        }
    }

    /// Stops the load and checks every counter: each acknowledged increment
    /// was applied, none twice. A counter ends at its acknowledged count plus
    /// at most its unknown outcomes (each applied once or not at all), and
    /// exactly at its acknowledged count when none was unknown; the last
    /// value returned is never above the final one. Returns the totals
    /// (acknowledged, unknown).
    async fn finish(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let reader = Client::connect(self.endpoints.clone());
        let (mut acknowledged, mut unknown) = (0, 0);
        for (index, task) in self.tasks.into_iter().enumerate() {
            let tally = tokio::time::timeout(Duration::from_secs(60), task)
                .await
                .expect("a load client ended within 60 s")
                .expect("a load client did not panic");
            let key = format!("{}-counter-{index}", self.name);
            let value = match reader.get(key.as_bytes()).await {
                Ok(Some(Value::Int(value))) => value,
                Ok(None) => 0,
                other => panic!("{key}: read {other:?}"),
            };
            let value = u64::try_from(value).expect("a counter is never negative");
            assert!(
                value >= tally.acknowledged && value <= tally.acknowledged + tally.unknown,
                "{key} = {value}, but {} increments were acknowledged and {} unknown: \
                 an increment was lost or applied twice ({tally:?})",
                tally.acknowledged,
                tally.unknown
            );
            assert!(
                tally.last_value as u64 <= value,
                "{key}: {tally:?}, read {value}"
            );
            acknowledged += tally.acknowledged;
            unknown += tally.unknown;
        }
        reader.close().await;
        (acknowledged, unknown)
    }
}

/// The checks that end every scenario: counters exact, the replicas of
/// `nodes` equal at one applied index. Returns how many retries the
/// registry answered from its cache.
async fn check_end(project: &Project, load: Load, scenario: &str, nodes: &[u64]) -> u64 {
    let duplicates = load.duplicates.load(Ordering::Relaxed);
    let clients = load.tasks.len();
    let (acknowledged, unknown) = load.finish().await;
    let applied = project.applied_index(nodes).await;
    let (index, hash) = project.wait_hashes_agree(nodes, applied).await;
    eprintln!(
        "{scenario}: {clients} clients, {acknowledged} increments acknowledged, \
         {unknown} unknown, {duplicates} retries answered from the cache; replicas \
         {nodes:?} agree at index {index} (hash {})",
        &hash[..16]
    );
    assert!(acknowledged > 0);
    duplicates
}

// ---- the scenarios -----------------------------------------------------------------

/// A client against the three hosts keeps working through a SIGKILL of the
/// leader's container and its return; every acknowledged increment is
/// applied exactly once and the replicas end equal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill_loses_nothing_and_applies_nothing_twice() {
    let Some(image) = image_or_skip("leader_kill") else {
        return;
    };
    let project = Project::up("kill", image).await;
    let leader = project.wait_leader(&NODES).await;
    let load = Load::start(&project.endpoints_of(&NODES), LOAD_CLIENTS, "kill");
    load.wait_progress(50, "before the kill").await;

    project.kill(leader).await;
    let survivors: Vec<u64> = NODES.into_iter().filter(|&n| n != leader).collect();
    let new_leader = project.wait_leader(&survivors).await;
    assert_ne!(new_leader, leader);
    load.wait_progress(50, "with the old leader dead").await;

    project.start(leader).await;
    project.wait_leader(&NODES).await;
    load.wait_progress(50, "after the old leader's return")
        .await;
    check_end(&project, load, "leader kill", &NODES).await;
}

/// The leader's container is cut off the network (from its peers and from
/// the clients); the other two elect a leader and serve; once the network
/// heals the old leader follows again and catches up. Nothing acknowledged
/// is lost, nothing applied twice, the replicas end equal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_partition_and_heal() {
    let Some(image) = image_or_skip("leader_partition") else {
        return;
    };
    let project = Project::up("partition", image).await;
    let leader = project.wait_leader(&NODES).await;
    let load = Load::start(&project.endpoints_of(&NODES), LOAD_CLIENTS, "partition");
    load.wait_progress(50, "before the partition").await;

    project.disconnect(leader).await;
    let majority: Vec<u64> = NODES.into_iter().filter(|&n| n != leader).collect();
    let new_leader = project.wait_leader(&majority).await;
    assert_ne!(new_leader, leader);
    load.wait_progress(50, "with the old leader cut off").await;

    project.connect(leader).await;
    let healed = project.wait_leader(&NODES).await;
    assert_ne!(healed, 0);
    load.wait_progress(50, "after the partition healed").await;
    check_end(&project, load, "leader partition", &NODES).await;
}

/// Every node is restarted in turn (SIGTERM, then start) while 32 clients
/// write; the cluster agrees on a leader and serves between restarts, and
/// nothing acknowledged is lost or applied twice (every counter exact, the
/// three replicas' state hashes equal at one applied index). Then, on the
/// same cluster, a dead host is replaced: a follower's container is killed
/// for good, a fresh node 4 starts in a container of its own on the
/// network, joins as a learner (`oncekv admin add-learner` from the host)
/// and the voters become {the two survivors, node 4} (`ChangeVoters`); the
/// cluster serves throughout and node 4's state hash equals the survivors'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_restart_under_load_then_replace_a_dead_host() {
    let Some(image) = image_or_skip("rolling_restart") else {
        return;
    };
    let mut project = Project::up("rolling", image).await;
    project.wait_leader(&NODES).await;
    let load = Load::start(&project.endpoints_of(&NODES), ROLLING_CLIENTS, "rolling");
    load.wait_progress(100, "before the restarts").await;
    for node in NODES {
        project.restart(node).await;
        project.wait_leader(&NODES).await;
        load.wait_progress(60, &format!("after restarting node {node}"))
            .await;
    }
    let duplicates = check_end(&project, load, "rolling restart", &NODES).await;
    if cfg!(feature = "fault-injection") {
        // Each restarted node lost the reply to its first execute: those
        // retries must have been answered from the cache, not re-executed.
        assert!(
            duplicates > 0,
            "no retry answered from the cache: dedup untested"
        );
    }

    // A follower's host dies for good.
    let leader = project.wait_leader(&NODES).await;
    let dead = NODES
        .into_iter()
        .find(|&node| node != leader)
        .expect("a follower");
    let survivors: Vec<u64> = NODES.into_iter().filter(|&n| n != dead).collect();
    let load = Load::start(&project.endpoints_of(&survivors), LOAD_CLIENTS, "replace");
    load.wait_progress(30, "before the host dies").await;
    project.kill(dead).await;
    load.wait_progress(30, &format!("with node {dead} dead"))
        .await;

    // Its replacement: a new host, empty, added as a learner from the host.
    let peer = project.start_new_node(image).await;
    let endpoints = project.endpoints_of(&survivors).join(",");
    let added = oncekv_cli(&[
        "admin",
        "add-learner",
        &NEW_NODE.to_string(),
        &peer,
        project.endpoint(NEW_NODE),
        "--endpoints",
        &endpoints,
        "--timeout-ms",
        "30000",
        "--catch-up-timeout-ms",
        "60000",
    ])
    .await;
    let mut voters = survivors.clone();
    voters.push(NEW_NODE);
    let members = project.change_voters(&survivors, &voters).await;
    let mut voting: Vec<u64> = members
        .iter()
        .filter(|member| member.voter)
        .map(|member| member.node_id)
        .collect();
    voting.sort_unstable();
    assert_eq!(voting, voters, "the voters after ChangeVoters: {members:?}");
    oncekv_cli(&[
        "admin",
        "remove",
        &dead.to_string(),
        "--endpoints",
        &endpoints,
        "--timeout-ms",
        "30000",
    ])
    .await;
    load.wait_progress(30, "with node 4 voting").await;
    let leader = project.wait_leader(&voters).await;
    eprintln!(
        "replace: node {dead} dead, node {NEW_NODE} added ({}), voters {voters:?}, leader {leader}",
        added.trim()
    );
    check_end(&project, load, "replace a dead host", &voters).await;
}

/// Runs this build's `oncekv` binary on the host (the CLI as a user runs
/// it); its stdout, or a panic with its output.
async fn oncekv_cli(args: &[&str]) -> String {
    run(env!("CARGO_BIN_EXE_oncekv"), args)
        .await
        .unwrap_or_else(|error| panic!("{error}"))
}
