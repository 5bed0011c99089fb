//! One run of the harness, start to verdict: start a fresh cluster (local
//! processes, or containers of an image), run
//! the workloads while the nemesis plays the seeded schedule and the
//! monitor records leader changes, stop the clients, heal every fault, wait
//! until the replicas agree on an applied index, read every replica, check,
//! and write the history, the results and the HTML report.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context as _, bail};
use oncekv_client::{Client, ClientConfig};
use oncekv_core::Value;
use oncekv_testkit::{Statuses, Timing, hashes_caught_up};
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::{Instant, sleep, sleep_until};

use crate::admin::{Admin, AdminCapabilities};
use crate::checker::{self, Exercise, FinalValue, Findings, NodeFinal, Verdict};
use crate::claims::{self, Claims, Jobs, Sink};
use crate::cluster::{
    Backend, Capabilities, Cluster, ClusterOptions, NODES, agreed_leader, describe,
};
use crate::containers::{ContainerOptions, Containers};
use crate::faults::{self, FaultKind, PlannedFault, ScheduleOptions};
use crate::history::{self, Event, EventType, Op, Process, Recorder};
use crate::pki::{Pki, RunCredentials};
use crate::report::{self, Figures};
use crate::signals::Terminations;
use crate::workload::{self, Context, Counts, Role};

/// What to run.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub seed: u64,
    pub duration: Duration,
    pub leader_kills: u32,
    pub appenders: u64,
    pub incrementers: u64,
    pub readers: u64,
    /// Producers of keyed calls (idempotency keys, no session).
    pub keyed_producers: u64,
    /// Workers of the claims workload (0: none).
    pub claim_workers: u64,
    /// The lease every claim of the claims workload asks for.
    pub claim_lease: Duration,
    pub server_bin: PathBuf,
    pub out_dir: PathBuf,
    pub keep_cluster_dir: bool,
    /// Raft timing of every node.
    pub timing: Timing,
    pub snapshot_every_entries: u64,
    pub logs_kept_after_snapshot: u64,
    pub session_ttl_ms: u64,
    pub quiet: bool,
    /// Run the nodes as containers of this image (real kills, pauses and
    /// partitions) instead of local processes of `server_bin`.
    pub container_image: Option<String>,
    /// TLS on both ports and authentication on the client port (local
    /// processes only); the certificates are made with `server_bin certs`.
    pub tls: bool,
}

/// The results file.
#[derive(Serialize)]
pub struct Results {
    pub verdict: Verdict,
    pub seed: u64,
    pub duration_requested_s: f64,
    /// `processes` or `containers`.
    pub backend: String,
    /// The image the containers ran.
    pub image: Option<String>,
    /// How partitions were made (none: partitions left out).
    pub partitions: Option<String>,
    /// TLS on the client and peer ports (mutual between peers) and
    /// authentication on the client port.
    pub tls: bool,
    pub capabilities: Capabilities,
    pub admin: AdminCapabilities,
    /// Fault kinds left out because the server does not support them.
    pub kinds_unsupported: Vec<String>,
    pub schedule: Vec<PlannedFault>,
    /// Planned faults that did not run (the run's time was up).
    pub faults_skipped: u64,
    pub figures: Figures,
    pub safety: checker::Safety,
    /// The calls that ended with their outcome unknown, and how.
    pub unknowns: checker::unknowns::UnknownFigures,
    pub exercise: Exercise,
    pub problems: Vec<String>,
    /// How the final state was read.
    pub final_read: String,
    pub finals: Vec<NodeFinal>,
}

/// [`run`] as the `jepsen-like` binary runs it: its exit code, 0 (valid),
/// 1 (invalid) or 2 (unknown, a run that could not finish, or one ended by
/// SIGINT, SIGTERM or SIGHUP). A signal drops the run, and with it its
/// cluster (every node killed and reaped); a run that cannot listen for
/// the signals does not start.
pub async fn run_to_exit_code(options: &RunOptions) -> i32 {
    let mut terminations = match Terminations::listen() {
        Ok(terminations) => terminations,
        Err(error) => {
            eprintln!("jepsen-like: cannot listen for termination signals: {error}");
            return 2;
        }
    };
    tokio::select! {
        result = run(options) => match result {
            Ok(verdict) => verdict.exit_code(),
            Err(error) => {
                eprintln!("jepsen-like: the run could not finish: {error:#}");
                2
            }
        },
        signal = terminations.recv() => {
            eprintln!("jepsen-like: interrupted by {signal}; the cluster is stopped");
            2
        }
    }
}

/// Runs the harness; returns the verdict (after writing every output).
pub async fn run(options: &RunOptions) -> anyhow::Result<Verdict> {
    std::fs::create_dir_all(&options.out_dir)
        .with_context(|| format!("create {}", options.out_dir.display()))?;
    let capabilities = match &options.container_image {
        Some(image) => Containers::probe(image).await?,
        None => Capabilities::probe(&options.server_bin)?,
    };
    let dir = tempfile::Builder::new()
        .prefix("oncekv-jepsen-")
        .tempdir()
        .context("create the cluster's temporary directory")?;
    let (cluster, credentials) = start_cluster(options, capabilities, dir.path()).await?;
    let partitions = cluster.partitions();
    if !options.quiet {
        eprintln!(
            "{} cluster at {}; partitions: {}; TLS: {}",
            cluster.backend_name(),
            cluster.client_addrs().join(","),
            partitions.unwrap_or("none"),
            if options.tls {
                "on (mutual between peers; clients by token and by certificate)"
            } else {
                "off"
            }
        );
    }
    let (admin, admin_capabilities) = probe_admin(&cluster, &credentials).await?;
    let (schedule, kinds_unsupported) =
        plan_faults(options, partitions.is_some(), admin_capabilities);
    let tools = Tools {
        admin: admin_capabilities.admin.then_some(admin),
        inject_fault: admin_capabilities.inject_fault,
    };
    let outcome = drive(options, &cluster, &tools, &schedule, &credentials).await;
    let verdict = match outcome {
        Ok(driven) => {
            let verdict = finish(
                options,
                (cluster.backend_name(), partitions),
                capabilities,
                admin_capabilities,
                kinds_unsupported,
                schedule,
                driven,
            )?;
            if verdict != Verdict::Valid {
                keep_logs(options, &cluster);
            }
            verdict
        }
        Err(error) => {
            keep_logs(options, &cluster);
            return Err(error);
        }
    };
    drop(cluster);
    if options.keep_cluster_dir {
        let kept = dir.keep();
        eprintln!("kept the cluster's data and logs in {}", kept.display());
    }
    Ok(verdict)
}

/// Starts the cluster of the run's backend in `dir`: local processes of
/// `options.server_bin` (with the per-link proxies, TLS and the lost-reply
/// fault where the server supports them) or containers of its image.
async fn start_cluster(
    options: &RunOptions,
    capabilities: Capabilities,
    dir: &std::path::Path,
) -> anyhow::Result<(Arc<Cluster>, Arc<RunCredentials>)> {
    let pki = if options.tls {
        if options.container_image.is_some() {
            bail!("--tls runs local processes only (not with containers)");
        }
        if !capabilities.tls {
            bail!(
                "{} has no TLS (--tls-cert, --token-file): cannot run with --tls",
                options.server_bin.display()
            );
        }
        Some(Pki::make(&options.server_bin, &dir.join("pki"), &NODES)?)
    } else {
        None
    };
    let credentials = Arc::new(match &pki {
        Some(pki) => RunCredentials::of(pki)?,
        None => RunCredentials::none(),
    });
    let mut extra_args = Vec::new();
    if capabilities.fault_flag {
        // Every node process drops the reply to its first new execute: a
        // lost reply after every restart too, so that clients retry
        // requests that were applied.
        extra_args.extend([
            "--fault".to_string(),
            "drop-first-execute-reply".to_string(),
        ]);
    }
    let process_options = ClusterOptions {
        server_bin: options.server_bin.clone(),
        dir: dir.to_path_buf(),
        timing: options.timing,
        snapshot_every_entries: options.snapshot_every_entries,
        logs_kept_after_snapshot: options.logs_kept_after_snapshot,
        session_ttl_ms: options.session_ttl_ms,
        proxies: capabilities.peer_via,
        extra_args,
        pki,
    };
    let backend = match &options.container_image {
        Some(image) => Backend::Containers(ContainerOptions {
            image: image.clone(),
            node_args: process_options.node_args(),
        }),
        None => Backend::Processes(process_options),
    };
    // Containers start slower (and the engine may be busy).
    let cluster = Arc::new(
        Cluster::start(backend, Duration::from_secs(90), &credentials.status)
            .await
            .context("start the cluster")?,
    );
    Ok((cluster, credentials))
}

/// The Admin service of the cluster and what the server offers through it.
async fn probe_admin(
    cluster: &Cluster,
    credentials: &RunCredentials,
) -> anyhow::Result<(Admin, AdminCapabilities)> {
    let admin = Admin::new(
        NODES
            .iter()
            .map(|&node| (node, cluster.client_addr(node)))
            .collect(),
        &credentials.admin,
    )?;
    let admin_capabilities = admin.probe(NODES[0]).await?;
    Ok((admin, admin_capabilities))
}

/// The seeded fault schedule of the kinds this cluster can play, and the
/// names of those it cannot (announced unless quiet).
fn plan_faults(
    options: &RunOptions,
    partitions: bool,
    admin_capabilities: AdminCapabilities,
) -> (Vec<PlannedFault>, Vec<String>) {
    let kinds: Vec<FaultKind> = FaultKind::ALL
        .into_iter()
        .filter(|kind| supported(*kind, partitions, admin_capabilities))
        .collect();
    let kinds_unsupported: Vec<String> = FaultKind::ALL
        .into_iter()
        .filter(|kind| !kinds.contains(kind))
        .map(|kind| kind.name().to_string())
        .collect();
    let schedule = faults::schedule(&ScheduleOptions {
        seed: options.seed,
        duration: options.duration,
        leader_kills: options.leader_kills,
        kinds: kinds.clone(),
        election_timeout_max: Duration::from_millis(options.timing.election_timeout_max_ms),
    });
    if !options.quiet {
        eprintln!(
            "seed {}: {} faults planned ({} leader kills); unsupported by this server: {}",
            options.seed,
            schedule.len(),
            options.leader_kills,
            if kinds_unsupported.is_empty() {
                "none".to_string()
            } else {
                kinds_unsupported.join(", ")
            }
        );
    }
    (schedule, kinds_unsupported)
}

fn supported(kind: FaultKind, partitions: bool, admin: AdminCapabilities) -> bool {
    match kind {
        FaultKind::KillLeader
        | FaultKind::KillRandom
        | FaultKind::KillAll
        | FaultKind::PauseLeader => true,
        FaultKind::IsolateLeader
        | FaultKind::IsolateFollower
        | FaultKind::Bridge
        | FaultKind::OneWay => partitions,
        FaultKind::DropReply => admin.inject_fault,
        FaultKind::ShortTtl => admin.admin,
    }
}

/// The Admin hooks the nemesis and the final reads may use.
struct Tools {
    /// Present when the server offers the Admin service.
    admin: Option<Admin>,
    /// `InjectFault` works (a fault-injection build).
    inject_fault: bool,
}

impl Tools {
    /// The Admin service, for a fault that needs it.
    fn admin(&self) -> anyhow::Result<&Admin> {
        self.admin
            .as_ref()
            .context("this fault needs the Admin service")
    }
}

/// Replies a leader loses just before it is killed, so that the requests
/// behind them are retried at the next leader.
const DROPS_BEFORE_KILL: u32 = 2;
/// The workload goes on at least this long after the last fault healed.
const AFTER_LAST_FAULT: Duration = Duration::from_secs(3);
/// The session TTL of the short-TTL phase.
const SHORT_TTL_MS: u64 = 1_500;

fn keep_logs(options: &RunOptions, cluster: &Cluster) {
    for node in NODES {
        let target = options.out_dir.join(format!("node{node}.log"));
        if let Err(error) = cluster.save_log(node, &target) {
            eprintln!("could not keep node {node}'s log: {error:#}");
        }
    }
}

/// What the workload phase produced.
struct Driven {
    recorder: Recorder,
    workload_end_ns: u64,
    faults_skipped: u64,
    finals: Vec<NodeFinal>,
    final_read: String,
}

/// The current leader as the monitor last saw it.
#[derive(Clone, Copy, Debug, Default)]
struct Seen {
    leader: u64,
    term: u64,
}

/// The workload phase: the clients, the monitor and the progress line run
/// while the nemesis plays the schedule; then the clients stop, every
/// fault is healed, and the replicas are settled and read.
async fn drive(
    options: &RunOptions,
    cluster: &Arc<Cluster>,
    tools: &Tools,
    schedule: &[PlannedFault],
    credentials: &Arc<RunCredentials>,
) -> anyhow::Result<Driven> {
    let recorder = Recorder::start();
    let counts = Arc::new(Counts::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let (ttl_tx, ttl_rx) = watch::channel(Duration::from_millis(options.session_ttl_ms));
    let context = Context {
        seed: options.seed,
        endpoints: cluster.client_addrs(),
        recorder: recorder.clone(),
        counts: counts.clone(),
        stop: stop_rx.clone(),
        session_ttl: ttl_rx,
        short_ttl_phase: schedule.iter().any(|f| f.kind == FaultKind::ShortTtl),
        list_epoch: Arc::default(),
        credentials: credentials.clone(),
        writers: Arc::default(),
    };
    // The registry config to restore after the short-TTL phase.
    let original_config = match &tools.admin {
        Some(admin) => Some(admin.get_config(NODES[0]).await?),
        None => None,
    };
    let seen = Arc::new(Mutex::new(Seen::default()));
    let faults_done = Arc::new(AtomicU64::new(0));

    let mut clients = spawn_clients(options, &context);
    let jobs = Arc::new(Jobs::default());
    let claim_workers = spawn_claims(options, &context, &jobs);
    let drop_episodes = Arc::new(AtomicU64::new(0));
    let dropper = match (&tools.admin, tools.inject_fault, claim_workers.is_empty()) {
        (Some(admin), true, false) => Some(tokio::spawn(claims::drop_claim_replies(
            options.seed,
            cluster.clone(),
            admin.clone(),
            context.clone(),
            jobs.clone(),
            drop_episodes.clone(),
        ))),
        _ => None,
    };
    // The leader monitor, then the progress line (unless quiet).
    let mut watchers = vec![tokio::spawn(monitor(
        cluster.clone(),
        recorder.clone(),
        seen.clone(),
        stop_rx.clone(),
    ))];
    watchers.extend((!options.quiet).then(|| {
        tokio::spawn(progress(
            recorder.clone(),
            counts.clone(),
            seen.clone(),
            faults_done.clone(),
            schedule.len() as u64,
            stop_rx.clone(),
        ))
    }));

    // The nemesis runs the schedule; the workload lasts the requested
    // duration, or until the nemesis is done and the cluster has served
    // a few requests since (whichever is later), capped.
    let nemesis_result = nemesis(
        options,
        cluster,
        tools,
        &ttl_tx,
        schedule,
        &recorder,
        &counts,
        &faults_done,
    )
    .await;
    let workload_end_ns = workload_end(options, &recorder, &counts).await;
    drain_claims(&jobs, &mut clients, claim_workers, dropper, options.quiet).await;
    stop_and_heal(&stop_tx, cluster, tools, original_config, clients, watchers).await;
    let skipped = match nemesis_result {
        Ok(skipped) => skipped,
        Err(error) => return Err(error.context("the nemesis failed")),
    };
    if !options.quiet {
        eprintln!("workload stopped; waiting for the replicas to converge");
    }
    let (finals, final_read) =
        settle_and_read(cluster, tools, &recorder, schedule.len(), credentials).await?;
    Ok(Driven {
        recorder,
        workload_end_ns,
        faults_skipped: skipped,
        finals,
        final_read,
    })
}

/// Waits, once the nemesis is done, until the workload may end: after the
/// requested duration, and after the last fault the cluster must serve
/// requests again for a while (a kill at the end is then followed by
/// acknowledgements); returns the end, in the recorder's time.
async fn workload_end(options: &RunOptions, recorder: &Recorder, counts: &Counts) -> u64 {
    let end = options.duration.max(recorder.elapsed() + AFTER_LAST_FAULT);
    sleep(end.saturating_sub(recorder.elapsed())).await;
    let acked = counts.ok.load(Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(20);
    while counts.ok.load(Ordering::Relaxed) < acked + 5 && Instant::now() < deadline {
        sleep(Duration::from_millis(50)).await;
    }
    recorder.now_ns()
}

/// The quiet phase of the claims workload, after the last fault: no new
/// jobs, the lost-reply episodes end, and the workers go on until every
/// open job is completed (they stop by themselves), for at most
/// [`claims::DRAIN_MAX`]; a job still open then stays uncompleted in the
/// history, which the checker reports. The workers' handles join the
/// other clients'.
async fn drain_claims(
    jobs: &Jobs,
    clients: &mut Vec<tokio::task::JoinHandle<u64>>,
    workers: Vec<tokio::task::JoinHandle<u64>>,
    dropper: Option<tokio::task::JoinHandle<u64>>,
    quiet: bool,
) {
    if workers.is_empty() {
        return;
    }
    jobs.drain();
    if let Some(dropper) = dropper {
        let _ = dropper.await;
    }
    let deadline = Instant::now() + claims::DRAIN_MAX;
    while jobs.open() > 0 && Instant::now() < deadline {
        sleep(Duration::from_millis(50)).await;
    }
    if !quiet {
        eprintln!("claims drained; {} jobs left open", jobs.open());
    }
    clients.extend(workers);
}

/// Stops the clients, heals whatever may still be broken (an error
/// mid-fault), then waits for the clients and the watchers to end.
async fn stop_and_heal(
    stop: &watch::Sender<bool>,
    cluster: &Cluster,
    tools: &Tools,
    original_config: Option<oncekv_wire::proto::RegistryConfig>,
    clients: Vec<tokio::task::JoinHandle<u64>>,
    watchers: Vec<tokio::task::JoinHandle<()>>,
) {
    let _ = stop.send(true);
    heal_everything(cluster, tools, original_config).await;
    join_clients(clients).await;
    for watcher in watchers {
        let _ = watcher.await;
    }
}

/// After the workload: a quiet period, every replica at the same applied
/// index (each restarted from its snapshot when the Admin service is
/// there), then every replica's final state, and how it was read.
async fn settle_and_read(
    cluster: &Cluster,
    tools: &Tools,
    recorder: &Recorder,
    planned: usize,
    credentials: &RunCredentials,
) -> anyhow::Result<(Vec<NodeFinal>, String)> {
    sleep(Duration::from_secs(2)).await;
    let mut statuses = converge(cluster).await?;
    if let Some(admin) = &tools.admin {
        statuses = restart_each_from_snapshot(cluster, admin, recorder, planned).await?;
    }
    let keys = workload::keys_of(&recorder.snapshot());
    match &tools.admin {
        Some(admin) => read_finals_local(admin, &keys).await,
        None => read_finals(cluster, statuses, &keys, credentials.client(0)).await,
    }
}

/// Starts the clients: appenders, incrementers, readers, one lifecycle
/// client and the keyed producers, numbered from 1 in that order.
fn spawn_clients(options: &RunOptions, context: &Context) -> Vec<tokio::task::JoinHandle<u64>> {
    let mut clients = Vec::new();
    let mut number = 0;
    let mut next = || {
        number += 1;
        number
    };
    for index in 0..options.appenders {
        let run = workload::run_client(context.clone(), next(), Role::Appender, index);
        clients.push(tokio::spawn(run));
    }
    for index in 0..options.incrementers {
        let run = workload::run_client(context.clone(), next(), Role::Incrementer, index);
        clients.push(tokio::spawn(run));
    }
    for _ in 0..options.readers {
        clients.push(tokio::spawn(workload::run_reader(context.clone(), next())));
    }
    clients.push(tokio::spawn(workload::run_lifecycle(
        context.clone(),
        next(),
    )));
    for index in 0..options.keyed_producers {
        let run = workload::run_keyed_producer(context.clone(), next(), index);
        clients.push(tokio::spawn(run));
    }
    clients
}

/// Starts the claims workers (numbered after the other clients) and the
/// fenced sink they write to.
fn spawn_claims(
    options: &RunOptions,
    context: &Context,
    jobs: &Arc<Jobs>,
) -> Vec<tokio::task::JoinHandle<u64>> {
    if options.claim_workers == 0 {
        return Vec::new();
    }
    let (sink, _sink_task) = Sink::spawn(context.recorder.clone());
    let claims = Claims {
        jobs: jobs.clone(),
        sink,
        lease: options.claim_lease,
    };
    let first = options.appenders
        + options.incrementers
        + options.readers
        + 1
        + options.keyed_producers
        + 1;
    (first..first + options.claim_workers)
        .map(|number| {
            tokio::spawn(claims::run_claims_worker(
                context.clone(),
                claims.clone(),
                number,
            ))
        })
        .collect()
}

/// Lets every stopped client finish its current call (bounded by its
/// deadline); one that does not is aborted, and its open operation stays
/// without a completion, which the checker counts as unknown.
async fn join_clients(clients: Vec<tokio::task::JoinHandle<u64>>) {
    let deadline = Instant::now() + workload::CALL_TIMEOUT + Duration::from_secs(10);
    for mut client in clients {
        if tokio::time::timeout_at(deadline, &mut client)
            .await
            .is_err()
        {
            client.abort();
            eprintln!("a client did not stop in time; its open operation stays unknown");
        }
    }
}

/// Rule 13: a node rebuilt from its snapshot must be indistinguishable
/// from one that replayed the log. Each node in turn writes a snapshot of
/// the final state, is SIGKILLed and restarted from it, and must converge
/// to the same state hash; recorded as nemesis operations numbered after
/// the schedule's `planned` faults. Returns the last converged statuses.
async fn restart_each_from_snapshot(
    cluster: &Cluster,
    admin: &Admin,
    recorder: &Recorder,
    planned: usize,
) -> anyhow::Result<Statuses> {
    let mut statuses = BTreeMap::new();
    for (op_id, node) in (planned as u64 + 1..).zip(NODES) {
        let invoke = Event::invoke(
            0,
            Process::Nemesis,
            op_id,
            Op::Fault {
                kind: "restart-from-snapshot".to_string(),
                nodes: vec![node],
            },
        );
        admin.trigger_snapshot(node).await?;
        recorder.record(invoke.clone());
        cluster.kill(node).await?;
        cluster.restart(node).await?;
        statuses = converge(cluster).await?;
        recorder.record(Event::complete(&invoke, EventType::Info, 0));
    }
    Ok(statuses)
}

/// Plays the schedule; returns how many planned faults were skipped
/// because the run's time was up.
#[allow(clippy::too_many_arguments)]
async fn nemesis(
    options: &RunOptions,
    cluster: &Arc<Cluster>,
    tools: &Tools,
    ttl: &watch::Sender<Duration>,
    schedule: &[PlannedFault],
    recorder: &Recorder,
    counts: &Counts,
    faults_done: &AtomicU64,
) -> anyhow::Result<u64> {
    let started = Instant::now() - recorder.elapsed();
    // Planned faults may push the run past its duration by this much.
    let hard_end = options.duration + Duration::from_secs(30);
    let mut skipped = 0;
    for (op_id, planned) in (1u64..).zip(schedule) {
        sleep_until(started + planned.start).await;
        // Ready: a leader all nodes agree on, and a few requests
        // acknowledged since the last fault healed.
        let acked = counts.ok.load(Ordering::Relaxed);
        let ready_deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < ready_deadline && counts.ok.load(Ordering::Relaxed) < acked + 3 {
            sleep(Duration::from_millis(50)).await;
        }
        if recorder.elapsed() > hard_end {
            skipped += 1;
            continue;
        }
        cluster.check_alive().await?;
        inject(cluster, tools, ttl, planned, op_id, recorder)
            .await
            .with_context(|| format!("fault {op_id} ({})", planned.kind.name()))?;
        faults_done.fetch_add(1, Ordering::Relaxed);
    }
    Ok(skipped)
}

/// Injects one fault, waits its duration, heals it; recorded as an invoke
/// when it starts and an info when it is healed.
async fn inject(
    cluster: &Cluster,
    tools: &Tools,
    ttl: &watch::Sender<Duration>,
    planned: &PlannedFault,
    op_id: u64,
    recorder: &Recorder,
) -> anyhow::Result<()> {
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).await?;
    let targets = Targets::of(planned, leader);
    let invoke = Event::invoke(
        0,
        Process::Nemesis,
        op_id,
        Op::Fault {
            kind: planned.kind.name().to_string(),
            nodes: targets.nodes.clone(),
        },
    );
    if planned.kind == FaultKind::KillLeader && tools.inject_fault {
        // The leader loses a few replies first: their requests are applied,
        // and their clients' retries reach the next leader. (Before the
        // fault's invoke: the window starts at the kill.)
        tools
            .admin()?
            .drop_replies(leader, DROPS_BEFORE_KILL)
            .await?;
        sleep(Duration::from_millis(300)).await;
    }
    play(cluster, tools, ttl, planned, &targets, &invoke, recorder).await?;
    recorder.record(Event::complete(&invoke, EventType::Info, 0));
    Ok(())
}

/// The nodes one fault hits, given the leader when it starts.
struct Targets {
    leader: u64,
    /// The follower `pick` chose (isolated, or cut off from the leader).
    follower: u64,
    nodes: Vec<u64>,
}

impl Targets {
    /// `planned`'s nodes: its kind's, `pick` choosing the follower or the
    /// random node.
    fn of(planned: &PlannedFault, leader: u64) -> Targets {
        let followers: Vec<u64> = NODES.into_iter().filter(|n| *n != leader).collect();
        let follower = followers[planned.pick as usize % followers.len()];
        let nodes = match planned.kind {
            FaultKind::KillLeader | FaultKind::PauseLeader | FaultKind::IsolateLeader => {
                vec![leader]
            }
            FaultKind::KillRandom => vec![NODES[planned.pick as usize % NODES.len()]],
            FaultKind::KillAll => NODES.to_vec(),
            FaultKind::IsolateFollower => vec![follower],
            FaultKind::Bridge | FaultKind::OneWay => vec![leader, follower],
            FaultKind::DropReply | FaultKind::ShortTtl => vec![leader],
        };
        Targets {
            leader,
            follower,
            nodes,
        }
    }
}

/// Puts the fault in force, records its `invoke`, waits its duration and
/// heals it. The invoke is recorded once the fault is in force: a `docker
/// kill` or an `iptables` rule takes tens to hundreds of milliseconds to
/// land, and what the old leader acknowledged meanwhile must not count as
/// "after the kill".
async fn play(
    cluster: &Cluster,
    tools: &Tools,
    ttl: &watch::Sender<Duration>,
    planned: &PlannedFault,
    targets: &Targets,
    invoke: &Event,
    recorder: &Recorder,
) -> anyhow::Result<()> {
    let Targets {
        leader,
        follower,
        ref nodes,
    } = *targets;
    match planned.kind {
        FaultKind::KillLeader | FaultKind::KillRandom | FaultKind::KillAll => {
            for node in nodes {
                cluster.kill(*node).await?;
            }
            recorder.record(invoke.clone());
            sleep(planned.duration).await;
            for node in nodes {
                cluster.restart(*node).await?;
            }
        }
        FaultKind::PauseLeader => {
            cluster.pause(leader).await?;
            recorder.record(invoke.clone());
            sleep(planned.duration).await;
            cluster.resume(leader).await?;
        }
        FaultKind::IsolateLeader | FaultKind::IsolateFollower => {
            cluster.isolate(nodes[0]).await?;
            recorder.record(invoke.clone());
            sleep(planned.duration).await;
            cluster.heal_links().await?;
        }
        FaultKind::Bridge => {
            cluster.cut(leader, follower).await?;
            recorder.record(invoke.clone());
            sleep(planned.duration).await;
            cluster.heal_links().await?;
        }
        FaultKind::OneWay => {
            cluster.block(leader, follower).await?;
            recorder.record(invoke.clone());
            sleep(planned.duration).await;
            cluster.heal_links().await?;
        }
        FaultKind::DropReply => {
            recorder.record(invoke.clone());
            tools.admin()?.drop_replies(leader, planned.count).await?;
            // The clients retry at the same leader after their attempt
            // timeout and get the original replies as duplicates.
            sleep(planned.duration).await;
        }
        FaultKind::ShortTtl => {
            recorder.record(invoke.clone());
            short_ttl_phase(cluster, tools.admin()?, ttl, leader, planned.duration).await?;
        }
    }
    Ok(())
}

/// The short-TTL phase: the registry's session TTL set to
/// [`SHORT_TTL_MS`] through the log for `duration`, then restored; the
/// workload's announced TTL follows.
async fn short_ttl_phase(
    cluster: &Cluster,
    admin: &Admin,
    ttl: &watch::Sender<Duration>,
    leader: u64,
    duration: Duration,
) -> anyhow::Result<()> {
    let original = admin.get_config(leader).await?;
    let cluster_id = cluster
        .status(leader)
        .await
        .map_err(|error| anyhow::anyhow!("status of node {leader}: {error}"))?
        .cluster_id;
    let ttl_only = |session_ttl_ms| oncekv_wire::proto::RegistryConfigPatch {
        session_ttl_ms: Some(session_ttl_ms),
        ..Default::default()
    };
    admin
        .set_config(
            leader,
            &cluster_id,
            ttl_only(SHORT_TTL_MS),
            Duration::from_secs(30),
        )
        .await?;
    // Announced once in force (the lifecycle client idles out the
    // short TTL only while it is), and its end announced before the
    // restore is proposed: a session idle under the short TTL for
    // as long as the announcement stands did expire.
    ttl.send_replace(Duration::from_millis(SHORT_TTL_MS));
    sleep(duration).await;
    ttl.send_replace(Duration::from_millis(original.session_ttl_ms));
    admin
        .set_config(
            leader,
            &cluster_id,
            ttl_only(original.session_ttl_ms),
            Duration::from_secs(30),
        )
        .await?;
    Ok(())
}

/// Restarts every node not running, resumes paused ones, heals the links,
/// restores the registry config.
async fn heal_everything(
    cluster: &Cluster,
    tools: &Tools,
    original_config: Option<oncekv_wire::proto::RegistryConfig>,
) {
    if let Err(error) = cluster.heal_links().await {
        eprintln!("heal: {error:#}");
    }
    for node in NODES {
        if cluster.is_paused(node)
            && let Err(error) = cluster.resume(node).await
        {
            eprintln!("heal: {error:#}");
        }
        if !cluster.is_running(node)
            && let Err(error) = cluster.restart(node).await
        {
            eprintln!("heal: {error:#}");
        }
    }
    if let (Some(admin), Some(original)) = (&tools.admin, original_config)
        && let Err(error) = restore_config(cluster, admin, original).await
    {
        eprintln!("heal: {error:#}");
    }
}

/// Sets the registry config back to `original` if it differs (every
/// field, the idempotency-key ones included: whatever a fault left
/// changed), in one config entry.
async fn restore_config(
    cluster: &Cluster,
    admin: &Admin,
    original: oncekv_wire::proto::RegistryConfig,
) -> anyhow::Result<()> {
    let leader = cluster.wait_for_leader(Duration::from_secs(60)).await?;
    if admin.get_config(leader).await? == original {
        return Ok(());
    }
    let cluster_id = cluster
        .status(leader)
        .await
        .map_err(|error| anyhow::anyhow!("status of node {leader}: {error}"))?
        .cluster_id;
    let patch = restoring_patch(original)?;
    admin
        .set_config(leader, &cluster_id, patch, Duration::from_secs(30))
        .await?;
    Ok(())
}

/// The patch that sets every field of the config to `original`'s: the
/// registry's, the idempotency keys' and the claims'.
fn restoring_patch(
    original: oncekv_wire::proto::RegistryConfig,
) -> anyhow::Result<oncekv_wire::proto::RegistryConfigPatch> {
    let keyed = oncekv_wire::convert::keyed_config_from_proto(&original);
    let claims = oncekv_wire::convert::claim_config_from_proto(&original);
    let whole = oncekv_wire::convert::registry_config_from_proto(Some(original))?;
    let mut patch = oncekv_wire::convert::configs_patch_to_proto(
        &oncekv_core::ConfigPatch::replacing_with(&whole),
        &oncekv_core::KeyedConfigPatch::replacing_with(&keyed),
    );
    let claims = oncekv_core::ClaimConfigPatch {
        claim_ttl_ms: Some(claims.claim_ttl_ms),
        claims_max: Some(claims.claims_max),
        claim_key_bytes_max: Some(claims.claim_key_bytes_max),
        claim_result_bytes_max: Some(claims.claim_result_bytes_max),
        claim_cached_bytes_max: Some(claims.claim_cached_bytes_max),
        lease_ms_max: Some(claims.lease_ms_max),
    };
    oncekv_wire::convert::claim_config_patch_into_proto(&claims, &mut patch);
    Ok(patch)
}

/// Records every new (leader, term) the nodes report, until stopped.
async fn monitor(
    cluster: Arc<Cluster>,
    recorder: Recorder,
    seen: Arc<Mutex<Seen>>,
    stop: watch::Receiver<bool>,
) {
    let mut term = 0;
    while !*stop.borrow() {
        let statuses = cluster.statuses().await;
        if let Some(leader) = statuses
            .values()
            .filter_map(|s| s.as_ref().ok())
            .filter(|s| s.role == "leader" && s.term > term)
            .max_by_key(|s| s.term)
        {
            term = leader.term;
            *seen.lock().unwrap_or_else(PoisonError::into_inner) = Seen {
                leader: leader.node_id,
                term,
            };
            let mut event = Event::invoke(
                0,
                Process::Monitor,
                term,
                Op::LeaderChange {
                    leader: leader.node_id,
                    term,
                },
            );
            event.kind = EventType::Info;
            recorder.record(event);
        }
        sleep(Duration::from_millis(100)).await;
    }
}

/// One progress line a second on stderr.
async fn progress(
    recorder: Recorder,
    counts: Arc<Counts>,
    seen: Arc<Mutex<Seen>>,
    faults_done: Arc<AtomicU64>,
    faults_planned: u64,
    stop: watch::Receiver<bool>,
) {
    while !*stop.borrow() {
        sleep(Duration::from_secs(1)).await;
        let seen = *seen.lock().unwrap_or_else(PoisonError::into_inner);
        eprintln!(
            "[{:6.1}s] ok {} fail {} info {} | reads ok {} fail {} | keyed ok {} not ok {} | faults {}/{} | leader n{} term {}",
            recorder.elapsed().as_secs_f64(),
            counts.ok.load(Ordering::Relaxed),
            counts.fail.load(Ordering::Relaxed),
            counts.info.load(Ordering::Relaxed),
            counts.reads_ok.load(Ordering::Relaxed),
            counts.reads_failed.load(Ordering::Relaxed),
            counts.keyed_ok.load(Ordering::Relaxed),
            counts.keyed_not_ok.load(Ordering::Relaxed),
            faults_done.load(Ordering::Relaxed),
            faults_planned,
            seen.leader,
            seen.term,
        );
    }
}

/// Waits until all three nodes answer with a leader they agree on and the
/// same applied index, twice in a row half a second apart, each with a
/// state hash of that index (a node hashes in the background at most once
/// a second, so its hash may trail its applied index; asking again makes
/// it catch up).
async fn converge(cluster: &Cluster) -> anyhow::Result<Statuses> {
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut previous: Option<Vec<u64>> = None;
    loop {
        let statuses = cluster.statuses().await;
        let applied: Vec<u64> = statuses
            .values()
            .filter_map(|s| s.as_ref().ok())
            .map(|s| s.applied_index)
            .collect();
        let settled = applied.len() == NODES.len()
            && applied.windows(2).all(|w| w[0] == w[1])
            && agreed_leader(&statuses).is_some();
        if settled && previous.as_ref() == Some(&applied) && hashes_caught_up(&statuses) {
            return Ok(statuses);
        }
        previous = settled.then_some(applied);
        if Instant::now() >= deadline {
            bail!(
                "the replicas did not converge within 90 s:\n{}",
                describe(&statuses)
            );
        }
        sleep(Duration::from_millis(500)).await;
    }
}

/// Every node's applied index and state hash (from `Status`), and the
/// values of every key. This server has no per-node local read, so the
/// values come from one linearizable read per key through the leader,
/// attributed to the leader; the equal state hashes at equal applied
/// indexes vouch for the other replicas' data.
async fn read_finals(
    cluster: &Cluster,
    statuses: Statuses,
    keys: &[String],
    credentials: oncekv_client::credentials::Credentials,
) -> anyhow::Result<(Vec<NodeFinal>, String)> {
    let leader = agreed_leader(&statuses).context("a leader after converging")?;
    let client = Client::with_config(
        cluster.client_addrs(),
        ClientConfig {
            call_timeout: Duration::from_secs(30),
            credentials,
            ..ClientConfig::default()
        },
    );
    let mut values = BTreeMap::new();
    for key in keys {
        let value = client
            .get(key.as_bytes())
            .await
            .with_context(|| format!("read {key}"))?;
        values.insert(key.clone(), final_value(value));
    }
    client.close().await;
    // Status again, once the replicas have settled after the reads (the
    // close unregisters) and hashed their last index: hashes compared at
    // equal indexes.
    let after = converge(cluster).await?;
    let mut finals = Vec::new();
    for node in NODES {
        let status = after
            .get(&node)
            .and_then(|s| s.as_ref().ok())
            .with_context(|| format!("node {node}'s status after the reads"))?;
        finals.push(NodeFinal {
            node,
            applied_index: status.state_hash_index,
            state_hash: status.state_hash.clone(),
            values: (node == leader).then(|| values.clone()),
        });
    }
    Ok((
        finals,
        format!(
            "values through the leader (node {leader}); applied index and state hash from every node's Status"
        ),
    ))
}

/// Every node's own applied state: each key by `LocalRead` and the state
/// hash by `StateHash`, all at one applied index per node (re-read, a few
/// times at most, if the index moved in between).
async fn read_finals_local(
    admin: &Admin,
    keys: &[String],
) -> anyhow::Result<(Vec<NodeFinal>, String)> {
    let mut finals = Vec::new();
    for node in NODES {
        let mut tries = 0;
        let final_state = loop {
            tries += 1;
            let mut values = BTreeMap::new();
            let mut indexes = Vec::new();
            for key in keys {
                let reply = admin.local_read(node, key).await?;
                indexes.push(reply.applied_index);
                let value = reply
                    .value
                    .map(oncekv_wire::convert::value_from_proto)
                    .transpose()
                    .with_context(|| format!("decode {key} from node {node}"))?;
                values.insert(key.clone(), final_value(value));
            }
            let hash = admin.state_hash(node).await?;
            if indexes.iter().all(|index| *index == hash.applied_index) {
                break NodeFinal {
                    node,
                    applied_index: hash.applied_index,
                    state_hash: hash.state_hash,
                    values: Some(values),
                };
            }
            if tries >= 5 {
                bail!("node {node}'s applied index kept moving during the final reads");
            }
            sleep(Duration::from_millis(500)).await;
        };
        finals.push(final_state);
    }
    Ok((
        finals,
        "every node's own applied state: Admin.LocalRead of every key and Admin.StateHash"
            .to_string(),
    ))
}

fn final_value(value: Option<Value>) -> FinalValue {
    match value {
        None => FinalValue::Absent,
        Some(Value::List(items)) => FinalValue::List(
            items
                .into_iter()
                .map(|item| String::from_utf8_lossy(&item).into_owned())
                .collect(),
        ),
        Some(Value::Int(value)) => FinalValue::Int(value),
        Some(Value::Bytes(bytes)) => FinalValue::Other(format!("{bytes:?}")),
    }
}

/// Checks a saved run again (`--recheck DIR`: its `history.jsonl` and the
/// replicas' final values and planned leader kills of its
/// `results.json`), with this build's checker — after a checker fix, say;
/// prints what it found and returns the verdict. Writes nothing.
pub fn recheck(dir: &std::path::Path) -> anyhow::Result<Verdict> {
    let history_path = dir.join("history.jsonl");
    let events = history::read_jsonl(std::io::BufReader::new(
        std::fs::File::open(&history_path)
            .with_context(|| format!("open {}", history_path.display()))?,
    ))?;
    let results_path = dir.join("results.json");
    let results: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&results_path)
            .with_context(|| format!("read {}", results_path.display()))?,
    )?;
    let finals: Vec<NodeFinal> =
        serde_json::from_value(results["finals"].clone()).context("results.json: finals")?;
    let planned = results["exercise"]["leader_kills_planned"]
        .as_u64()
        .context("results.json: exercise.leader_kills_planned")?;
    let findings = checker::check(&events, &finals);
    let exercise = checker::exercise(&events, planned);
    let verdict = Verdict::of(&findings, &exercise);
    print!("{}", report::recheck_summary(&findings, &exercise, verdict));
    Ok(verdict)
}

/// Checks, counts, prints and writes the outputs; returns the verdict.
fn finish(
    options: &RunOptions,
    (backend, partitions): (&str, Option<&str>),
    capabilities: Capabilities,
    admin: AdminCapabilities,
    kinds_unsupported: Vec<String>,
    schedule: Vec<PlannedFault>,
    driven: Driven,
) -> anyhow::Result<Verdict> {
    let events = driven.recorder.snapshot();
    let findings: Findings = checker::check(&events, &driven.finals);
    let exercise = checker::exercise(&events, u64::from(options.leader_kills));
    let verdict = Verdict::of(&findings, &exercise);
    let clients = options.appenders
        + options.incrementers
        + options.readers
        + 1
        + options.keyed_producers
        + options.claim_workers;
    let figures = report::figures(
        options.seed,
        clients,
        &events,
        &exercise,
        driven.workload_end_ns,
        u64::try_from(options.timing.new_leader_floor().as_nanos()).unwrap_or(0),
    );
    let summary = report::summary(&figures, &findings, &exercise, verdict);
    println!("{summary}");
    let history_path = options.out_dir.join("history.jsonl");
    history::write_jsonl(
        &events,
        std::io::BufWriter::new(std::fs::File::create(&history_path)?),
    )?;
    let results = Results {
        verdict,
        seed: options.seed,
        duration_requested_s: options.duration.as_secs_f64(),
        backend: backend.to_string(),
        image: options.container_image.clone(),
        partitions: partitions.map(str::to_string),
        tls: options.tls,
        capabilities,
        admin,
        kinds_unsupported,
        schedule,
        faults_skipped: driven.faults_skipped,
        figures: figures.clone(),
        safety: findings.safety.clone(),
        unknowns: findings.unknowns.clone(),
        exercise,
        problems: findings.problems.clone(),
        final_read: driven.final_read,
        finals: driven.finals,
    };
    std::fs::write(
        options.out_dir.join("results.json"),
        serde_json::to_vec_pretty(&results)?,
    )?;
    let html = report::html(&events, &figures, &summary, verdict)
        .map_err(|error| anyhow::anyhow!("draw the report: {error}"))?;
    std::fs::write(options.out_dir.join("report.html"), html)?;
    println!(
        "history, results.json and report.html in {}",
        options.out_dir.display()
    );
    Ok(verdict)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The restoring patch sets every field of the config, the four
    /// idempotency-key ones and the six claim ones included, to the
    /// original's value.
    #[test]
    fn restoring_patch_sets_every_field() {
        let original = oncekv_wire::proto::RegistryConfig {
            session_ttl_ms: 1,
            sessions_max: 2,
            window: 3,
            cached_bytes_per_session_max: 4,
            key_bytes_max: 5,
            value_bytes_max: 6,
            list_elements_max: 7,
            keys_max: 8,
            idempotency_key_ttl_ms: 9,
            idempotency_keys_max: 10,
            idempotency_key_bytes_max: 11,
            idempotency_cached_bytes_max: 12,
            claim_ttl_ms: 13,
            claims_max: 14,
            claim_key_bytes_max: 15,
            claim_result_bytes_max: 16,
            claim_cached_bytes_max: 17,
            lease_ms_max: 18,
            ..oncekv_wire::proto::RegistryConfig::default()
        };
        let patch = restoring_patch(original).unwrap();
        assert_eq!(
            patch,
            oncekv_wire::proto::RegistryConfigPatch {
                session_ttl_ms: Some(1),
                sessions_max: Some(2),
                window: Some(3),
                cached_bytes_per_session_max: Some(4),
                key_bytes_max: Some(5),
                value_bytes_max: Some(6),
                list_elements_max: Some(7),
                keys_max: Some(8),
                idempotency_key_ttl_ms: Some(9),
                idempotency_keys_max: Some(10),
                idempotency_key_bytes_max: Some(11),
                idempotency_cached_bytes_max: Some(12),
                claim_ttl_ms: Some(13),
                claims_max: Some(14),
                claim_key_bytes_max: Some(15),
                claim_result_bytes_max: Some(16),
                claim_cached_bytes_max: Some(17),
                lease_ms_max: Some(18),
                ..oncekv_wire::proto::RegistryConfigPatch::default()
            }
        );
    }
}
