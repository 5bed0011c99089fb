//! The failover benchmark (`failover-bench`, `scripts/jepsen.sh failover`):
//! how long writes stop when the leader crashes.
//!
//! Starts its own fresh local 3-node cluster ([`LocalCluster`], the
//! project's one local-cluster controller) of the given `oncekv` binary, runs one
//! closed-loop probe writer (a [`Client`] incrementing one counter, recording
//! when every acknowledgement arrived) and, with `--load-clients N`, N more
//! closed-loop load writers (each its own [`Client`] and session, 64-byte
//! puts to a key of its own) for the whole run. Then, `--kills` times: waits
//! until the probe's writes flow and all three nodes agree on a leader,
//! SIGKILLs the leader, measures the time from the kill to the probe's first
//! acknowledged write after it, restarts the killed node and waits until it
//! has caught up. Meanwhile every node's `Status` term is polled, so
//! elections that no kill explains (spurious ones) are counted. At the end the
//! counter is read back: exactly-once means it lies between the writes
//! acknowledged and those plus the unknown ones.
//!
//! The headline figure (median, p99, max of kill → first acknowledgement) is
//! the PROBE writer's: what one client that was waiting in a call when the
//! leader died sees, its retry backoff included. Beside it, under load, the
//! kill → first acknowledgement of ANY client (probe or load writer, the
//! earliest) is reported: when the cluster served again. The load writers'
//! throughput is reported over the whole run and between kills (outside every
//! kill → probe's first acknowledgement window).
//!
//! Every wait has a deadline, and so has the whole run: a misbehaving cluster
//! ends the run with a report of what happened (and a non-zero exit).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::{Instant, sleep, timeout_at};

use oncekv_client::{Client, ClientConfig, Error};
use oncekv_core::Value;
use oncekv_testkit::percentile;
use oncekv_testkit::{LocalCluster, NODES, Options, Timing, agreed_leader, describe};

use crate::signals::Terminations;

/// The counter the writer increments.
const KEY: &[u8] = b"failover-counter";
/// Acknowledged writes needed since the last restart before the next kill.
const ACKS_BEFORE_KILL: usize = 5;
/// Overall deadline of one write, retries included: generous, so that a
/// failover shows up as one slow write rather than an unknown outcome.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Term polling period of every node.
const TERM_POLL: Duration = Duration::from_millis(50);
/// A term increase this long after a kill's first acknowledged write is no
/// longer blamed on the kill.
const ELECTION_GRACE: Duration = Duration::from_secs(2);
/// Deadlines of the killer's steps.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const FIRST_ACK_TIMEOUT: Duration = Duration::from_secs(60);
const RESTART_TIMEOUT: Duration = Duration::from_secs(30);
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);
/// The whole run's deadline: this plus [`RUN_TIME_PER_KILL`] per kill.
const RUN_TIME_BASE: Duration = Duration::from_secs(120);
const RUN_TIME_PER_KILL: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(20);
const LOG_TAIL_LINES: usize = 40;
/// Value size of the background load's puts (as `oncekv bench`'s default).
const LOAD_VALUE_BYTES: usize = 64;

/// What to run.
#[derive(Clone, Debug)]
pub struct FailoverOptions {
    /// The `oncekv` binary the nodes run (a release build for figures).
    pub server_bin: std::path::PathBuf,
    pub kills: u32,
    pub timing: Timing,
    pub json: bool,
    /// Keep the cluster's data and logs after the run (the path is printed).
    pub keep_dir: bool,
    /// Closed-loop background writers running throughout the run.
    pub load_clients: usize,
}

/// One acknowledged write.
#[derive(Clone, Copy, Debug)]
struct Ack {
    acked: Instant,
    value: i64,
}

/// What the writer did.
#[derive(Debug, Default)]
struct WriterLog {
    acks: Vec<Ack>,
    unknown: u64,
    failed: u64,
    last_error: Option<String>,
    /// Puts the background load writers got acknowledged.
    load_acknowledged: u64,
}

type SharedLog = Arc<Mutex<WriterLog>>;

fn lock(log: &SharedLog) -> std::sync::MutexGuard<'_, WriterLog> {
    log.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the background load writers share with the killer: their
/// acknowledged puts, and the first acknowledgement after a kill.
#[derive(Debug)]
struct LoadShared {
    started: Instant,
    acknowledged: AtomicU64,
    /// Microseconds since `started` from which an acknowledgement counts as
    /// the current kill's first (`u64::MAX`: no kill armed).
    armed_from_us: AtomicU64,
    /// The earliest acknowledgement at or after `armed_from_us`, in
    /// microseconds since `started` (`u64::MAX`: none yet).
    first_ack_us: AtomicU64,
}

impl LoadShared {
    fn new(started: Instant) -> LoadShared {
        LoadShared {
            started,
            acknowledged: AtomicU64::new(0),
            armed_from_us: AtomicU64::new(u64::MAX),
            first_ack_us: AtomicU64::new(u64::MAX),
        }
    }

    fn micros(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.started).as_micros()).unwrap_or(u64::MAX)
    }

    /// A load writer's put was acknowledged at `at`.
    fn acknowledge(&self, at: Instant) {
        self.acknowledged.fetch_add(1, Ordering::Relaxed);
        let at = self.micros(at);
        if at >= self.armed_from_us.load(Ordering::Relaxed) {
            self.first_ack_us.fetch_min(at, Ordering::Relaxed);
        }
    }

    fn acknowledged(&self) -> u64 {
        self.acknowledged.load(Ordering::Relaxed)
    }

    /// Starts watching for the first acknowledgement at or after `from`.
    fn arm(&self, from: Instant) {
        self.first_ack_us.store(u64::MAX, Ordering::Relaxed);
        self.armed_from_us
            .store(self.micros(from), Ordering::Relaxed);
    }

    /// Stops watching; returns the first acknowledgement seen since `arm`.
    fn disarm(&self) -> Option<Instant> {
        self.armed_from_us.store(u64::MAX, Ordering::Relaxed);
        let first = self.first_ack_us.swap(u64::MAX, Ordering::Relaxed);
        (first != u64::MAX).then(|| self.started + Duration::from_micros(first))
    }
}

/// One kill of the leader.
#[derive(Clone, Copy, Debug)]
struct Kill {
    node: u64,
    at: Instant,
    /// When the probe's first write after it was acknowledged.
    first_ack: Option<Instant>,
    /// When any client's (probe or load writer) first write after it was
    /// acknowledged; set together with `first_ack`.
    first_any_ack: Option<Instant>,
    /// The load writers' acknowledged puts at the kill and at `first_ack`.
    load_at_kill: u64,
    load_at_first_ack: Option<u64>,
}

/// A term increase seen in some node's `Status`.
#[derive(Clone, Copy, Debug)]
struct TermIncrease {
    at: Instant,
    node: u64,
    from: u64,
    to: u64,
}

/// An election (term increase) that no kill explains.
#[derive(Clone, Debug, Serialize)]
pub struct SpuriousElection {
    /// Seconds since the run started.
    pub at_s: f64,
    /// The node whose `Status` first showed the new term.
    pub node: u64,
    pub from_term: u64,
    pub to_term: u64,
    /// Seconds since the latest kill before it (if any).
    pub since_last_kill_s: Option<f64>,
}

/// One kill as reported.
#[derive(Clone, Debug, Serialize)]
pub struct KillSample {
    pub node: u64,
    /// Kill → the probe writer's first acknowledged write.
    pub first_ack_ms: Option<f64>,
    /// Kill → any client's first acknowledged write.
    pub first_ack_any_client_ms: Option<f64>,
}

/// The figures of one failover run.
#[derive(Clone, Debug, Serialize)]
pub struct FailoverReport {
    pub mode: &'static str,
    pub timing: Timing,
    pub kills_requested: u32,
    pub kills_done: u32,
    /// Kill → the probe writer's first acknowledged write, one per kill, in
    /// milliseconds, sorted.
    pub samples_ms: Vec<f64>,
    /// Every kill in order: the node killed and its sample (none if no
    /// write was acknowledged after it).
    pub per_kill: Vec<KillSample>,
    pub median_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Kill → the first acknowledged write of any client (the probe or a
    /// load writer): the same as the probe's without load.
    pub any_client_median_ms: f64,
    pub any_client_p99_ms: f64,
    pub any_client_max_ms: f64,
    /// Elections (terms) begun within a kill's window: from the kill to its
    /// first acknowledged write plus 2 s.
    pub elections_after_kills: u64,
    /// Every other election.
    pub elections_not_caused_by_kill: u64,
    pub spurious_elections: Vec<SpuriousElection>,
    pub writes_acknowledged: u64,
    /// Background load: clients, and their puts acknowledged per second
    /// over the whole run and between kills (outside every kill → probe's
    /// first acknowledgement window).
    pub load_clients: usize,
    pub load_writes_per_second: f64,
    pub load_writes_per_second_between_kills: f64,
    /// The time that rate is taken over.
    pub load_seconds_between_kills: f64,
    pub writes_unknown: u64,
    pub writes_failed: u64,
    pub final_value: Option<i64>,
    /// The final value lies in [acknowledged, acknowledged + unknown] and
    /// the acknowledged values rose strictly.
    pub consistent: bool,
    pub seconds: f64,
    /// Why the run stopped early, if it did.
    pub aborted: Option<String>,
}

/// Runs the failover benchmark, prints its report, and fails when the run
/// was cut short or the counter is inconsistent.
pub async fn run(options: &FailoverOptions) -> anyhow::Result<()> {
    let report = measure_run(options).await?;
    print(&report, options.json)?;
    if let Some(reason) = &report.aborted {
        bail!("failover run cut short: {reason}");
    }
    if !report.consistent {
        bail!("the counter is inconsistent with the acknowledged writes");
    }
    Ok(())
}

/// Starts the cluster, measures, and returns the report (a run cut short
/// says why in it, with the nodes' log tails on stderr); an error when the
/// options are invalid, the cluster does not start, or on interrupt.
pub async fn measure_run(options: &FailoverOptions) -> anyhow::Result<FailoverReport> {
    let timing = options.timing;
    if timing.heartbeat_ms == 0
        || timing.heartbeat_ms >= timing.election_timeout_min_ms
        || timing.election_timeout_min_ms >= timing.election_timeout_max_ms
    {
        bail!("need 0 < --heartbeat-ms < --election-timeout-min-ms < --election-timeout-max-ms");
    }
    if !options.json {
        eprintln!("starting a local 3-node cluster ({timing:?})");
    }
    // Listening from here on: an interrupt drops the cluster (every node
    // SIGKILLed and reaped) on its way out, also while it starts.
    let terminations = Terminations::listen().context("listen for termination signals")?;
    let interrupt = interrupted(terminations);
    tokio::pin!(interrupt);
    let mut cluster_options = Options::new("failover", &options.server_bin);
    cluster_options.timing = Some(timing);
    cluster_options.keep_dir = options.keep_dir;
    cluster_options.worker_threads = Some(oncekv_testkit::worker_threads_per_node(NODES.len()));
    let cluster = tokio::select! {
        cluster = LocalCluster::start(&cluster_options) => cluster.context("start the local cluster")?,
        () = &mut interrupt => bail!("interrupted"),
    };
    let report = tokio::select! {
        report = measure(&cluster, options) => report,
        () = &mut interrupt => bail!("interrupted"),
    };
    if report.aborted.is_some() {
        eprintln!("{}", cluster.log_tails(LOG_TAIL_LINES));
    }
    Ok(report)
}

/// Resolves on SIGINT, SIGTERM or SIGHUP (see [`Terminations`]).
async fn interrupted(mut terminations: Terminations) {
    let signal = terminations.recv().await;
    eprintln!("failover-bench: interrupted by {signal}; the cluster is stopped");
}

/// The benchmark on a started cluster: the probe writer and the load
/// writers run while the killer kills leaders and every node's term is
/// watched; then the writers stop and the counter is read back.
async fn measure(cluster: &LocalCluster, options: &FailoverOptions) -> FailoverReport {
    let started = Instant::now();
    let client = Client::with_config(
        cluster.client_addrs(),
        ClientConfig {
            call_timeout: CALL_TIMEOUT,
            ..ClientConfig::default()
        },
    );
    let log: SharedLog = Arc::default();
    let (acks_tx, acks_rx) = watch::channel(0usize);
    let (stop_tx, stop_rx) = watch::channel(false);
    let initial_term = highest_term(cluster).await;

    let mut writer = AbortOnDrop(tokio::spawn(write_loop(
        client.clone(),
        log.clone(),
        acks_tx,
        stop_rx.clone(),
    )));
    let load = Arc::new(LoadShared::new(started));
    let mut loaders: Vec<_> = (0..options.load_clients)
        .map(|number| {
            AbortOnDrop(tokio::spawn(load_loop(
                cluster.client_addrs(),
                number,
                load.clone(),
                stop_rx.clone(),
            )))
        })
        .collect();
    let deadline = started + RUN_TIME_BASE + RUN_TIME_PER_KILL * options.kills;
    let mut kills = Vec::new();
    let (aborted, increases) = tokio::join!(
        async {
            let outcome = timeout_at(
                deadline,
                kill_loop(cluster, options, &log, &load, acks_rx, &mut kills),
            )
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the run's deadline passed")));
            let _ = stop_tx.send(true);
            outcome.err().map(|error| format!("{error:#}"))
        },
        watch_terms(cluster, initial_term, stop_rx),
    );
    let not_stopped = join_writers(&mut writer, &mut loaders).await;
    let aborted = aborted.or(not_stopped);
    let final_value = final_counter(cluster, aborted.is_none()).await;
    client.close().await;
    lock(&log).load_acknowledged = load.acknowledged();
    report(
        options,
        started,
        &kills,
        &increases,
        &lock(&log),
        final_value,
        aborted,
    )
}

/// The highest term any node reports (0 if none answers).
async fn highest_term(cluster: &LocalCluster) -> u64 {
    cluster
        .statuses()
        .await
        .values()
        .filter_map(|status| status.as_ref().ok())
        .map(|reply| reply.term)
        .max()
        .unwrap_or(0)
}

/// Lets the stopped writer, then the load writers, finish their current
/// call (bounded by the call timeout); says which did not stop in time.
async fn join_writers(
    writer: &mut AbortOnDrop<()>,
    loaders: &mut [AbortOnDrop<()>],
) -> Option<String> {
    let writer_ended = timeout_at(
        Instant::now() + CALL_TIMEOUT + Duration::from_secs(5),
        &mut writer.0,
    )
    .await;
    let loaders_ended = timeout_at(
        Instant::now() + CALL_TIMEOUT + Duration::from_secs(5),
        futures::future::join_all(loaders.iter_mut().map(|loader| &mut loader.0)),
    )
    .await;
    if writer_ended.is_err() {
        Some("the writer did not stop".to_owned())
    } else if loaders_ended.is_err() {
        Some("the load writers did not stop".to_owned())
    } else {
        None
    }
}

/// The counter read back after the run; best effort (bounded) when the
/// run did not end `cleanly`: the cluster may be unusable.
async fn final_counter(cluster: &LocalCluster, cleanly: bool) -> Option<i64> {
    if cleanly {
        read_counter(cluster).await
    } else {
        tokio::time::timeout(Duration::from_secs(15), read_counter(cluster))
            .await
            .ok()
            .flatten()
    }
}

/// Aborts the spawned task if it is still running when dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The closed-loop writer: one increment at a time until told to stop.
async fn write_loop(
    client: Client,
    log: SharedLog,
    acks: watch::Sender<usize>,
    stop: watch::Receiver<bool>,
) {
    while !*stop.borrow() {
        let result = client.increment(KEY, 1).await;
        let acked = Instant::now();
        let ok = result.is_ok();
        let count = {
            let mut log = lock(&log);
            match result {
                Ok(value) => log.acks.push(Ack { acked, value }),
                Err(Error::OutcomeUnknown { .. }) => log.unknown += 1,
                Err(error) => {
                    log.failed += 1;
                    log.last_error = Some(error.to_string());
                }
            }
            log.acks.len()
        };
        acks.send_replace(count);
        if !ok {
            // Do not spin if failures come back at once.
            sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A background load writer: puts to a key of its own, one at a time,
/// until told to stop; counts its acknowledged puts. Its errors are not
/// reported: the writer's log measures the failover.
async fn load_loop(
    endpoints: Vec<String>,
    number: usize,
    load: Arc<LoadShared>,
    stop: watch::Receiver<bool>,
) {
    let client = Client::with_config(
        endpoints,
        ClientConfig {
            call_timeout: CALL_TIMEOUT,
            ..ClientConfig::default()
        },
    );
    let key = format!("failover-load-{number}");
    let value = Value::Bytes(vec![b'x'; LOAD_VALUE_BYTES]);
    while !*stop.borrow() {
        if client.put(key.as_bytes(), value.clone()).await.is_ok() {
            load.acknowledge(Instant::now());
        } else {
            sleep(Duration::from_millis(10)).await;
        }
    }
    client.close().await;
}

/// Polls every node's term until told to stop; returns every increase of
/// the highest term seen.
async fn watch_terms(
    cluster: &LocalCluster,
    initial_term: u64,
    stop: watch::Receiver<bool>,
) -> Vec<TermIncrease> {
    let state = Mutex::new((initial_term, Vec::new()));
    let poll_node = |node: u64| {
        let state = &state;
        let mut stop = stop.clone();
        async move {
            let mut ticks = tokio::time::interval(TERM_POLL);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = ticks.tick() => {}
                    _ = stop.wait_for(|stop| *stop) => return,
                }
                let Ok(reply) = cluster.status(node).await else {
                    continue;
                };
                let at = Instant::now();
                let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
                let (highest, increases) = &mut *state;
                if reply.term > *highest {
                    tracing::info!(node, from = *highest, to = reply.term, "term increased");
                    increases.push(TermIncrease {
                        at,
                        node,
                        from: *highest,
                        to: reply.term,
                    });
                    *highest = reply.term;
                }
            }
        }
    };
    futures::future::join_all(NODES.map(poll_node)).await;
    state.into_inner().unwrap_or_else(PoisonError::into_inner).1
}

/// The killer: `options.kills` times kill the leader, time the probe's (and
/// any client's) first acknowledged write after it, restart the node and let
/// it catch up.
async fn kill_loop(
    cluster: &LocalCluster,
    options: &FailoverOptions,
    log: &SharedLog,
    load: &LoadShared,
    mut acks: watch::Receiver<usize>,
    kills: &mut Vec<Kill>,
) -> anyhow::Result<()> {
    let new_leader_floor = options.timing.new_leader_floor();
    let mut flowing_since = Instant::now();
    for number in 1..=options.kills {
        let leader = wait_ready(cluster, log, flowing_since)
            .await
            .with_context(|| format!("before kill {number}"))?;
        let from = lock(log).acks.len();
        tracing::info!(number, node = leader, "SIGKILL the leader");
        let at = Instant::now();
        load.arm(at + new_leader_floor);
        let load_at_kill = load.acknowledged();
        cluster
            .kill(leader)
            .with_context(|| format!("kill {number} (node {leader})"))?;
        kills.push(Kill {
            node: leader,
            at,
            first_ack: None,
            first_any_ack: None,
            load_at_kill,
            load_at_first_ack: None,
        });
        let first_ack = wait_first_ack(log, &mut acks, from, at + new_leader_floor)
            .await
            .with_context(|| format!("kill {number} (node {leader})"))?;
        let first_any_ack = load
            .disarm()
            .map_or(first_ack, |load_ack| load_ack.min(first_ack));
        if let Some(kill) = kills.last_mut() {
            kill.first_ack = Some(first_ack);
            kill.first_any_ack = Some(first_any_ack);
            kill.load_at_first_ack = Some(load.acknowledged());
        }
        let ms = (first_ack - at).as_secs_f64() * 1e3;
        let any_ms = (first_any_ack - at).as_secs_f64() * 1e3;
        tracing::info!(
            number,
            node = leader,
            ms,
            any_ms,
            "first acknowledged write after the kill"
        );
        if !options.json {
            let any = if options.load_clients > 0 {
                format!(" (any client's after {any_ms:.1} ms)")
            } else {
                String::new()
            };
            eprintln!(
                "kill {number}/{}: node {leader}, first acknowledged write after {ms:.1} ms{any}",
                options.kills,
            );
        }
        cluster
            .restart(leader, RESTART_TIMEOUT)
            .await
            .with_context(|| format!("restart node {leader} after kill {number}"))?;
        tracing::info!(number, node = leader, "restarted node answers Status");
        wait_caught_up(cluster, leader)
            .await
            .with_context(|| format!("node {leader} catching up after kill {number}"))?;
        tracing::info!(number, node = leader, "restarted node caught up");
        flowing_since = Instant::now();
    }
    Ok(())
}

/// Waits until writes flow ([`ACKS_BEFORE_KILL`] acknowledgements since
/// `since`) and all three nodes answer and agree on a leader; returns it.
async fn wait_ready(
    cluster: &LocalCluster,
    log: &SharedLog,
    since: Instant,
) -> anyhow::Result<u64> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        cluster.check_alive()?;
        let statuses = cluster.statuses().await;
        let flowing = {
            let log = lock(log);
            log.acks
                .iter()
                .rev()
                .take_while(|ack| ack.acked > since)
                .count()
        };
        let all_answer = statuses.len() == NODES.len() && statuses.values().all(Result::is_ok);
        if flowing >= ACKS_BEFORE_KILL
            && all_answer
            && let Some(leader) = agreed_leader(&statuses)
        {
            return Ok(leader);
        }
        if Instant::now() >= deadline {
            let log = lock(log);
            bail!(
                "no flowing writes ({flowing} acknowledged of {ACKS_BEFORE_KILL} needed; last \
                 error: {}) and agreed leader within {READY_TIMEOUT:?}; statuses:\n{}",
                log.last_error.as_deref().unwrap_or("none"),
                describe(&statuses)
            );
        }
        sleep(POLL).await;
    }
}

/// The time of the first acknowledgement at or after `not_before`, among
/// those recorded from index `from` on.
async fn wait_first_ack(
    log: &SharedLog,
    acks: &mut watch::Receiver<usize>,
    from: usize,
    not_before: Instant,
) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + FIRST_ACK_TIMEOUT;
    loop {
        acks.mark_unchanged();
        if let Some(ack) = lock(log).acks[from..]
            .iter()
            .find(|ack| ack.acked >= not_before)
        {
            return Ok(ack.acked);
        }
        match timeout_at(deadline, acks.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => bail!("the writer stopped"),
            Err(_) => {
                let log = lock(log);
                bail!(
                    "no acknowledged write within {FIRST_ACK_TIMEOUT:?} (unknown {}, failed {}, \
                     last error: {})",
                    log.unknown,
                    log.failed,
                    log.last_error.as_deref().unwrap_or("none")
                );
            }
        }
    }
}

/// Waits until `node`'s applied index reaches the leader's (as the leader
/// reported it once `node` answered).
async fn wait_caught_up(cluster: &LocalCluster, node: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + CATCH_UP_TIMEOUT;
    let statuses = cluster
        .wait_until(CATCH_UP_TIMEOUT, "an agreed leader", |statuses| {
            agreed_leader(statuses).is_some()
        })
        .await?;
    let target = agreed_leader(&statuses)
        .and_then(|leader| statuses.get(&leader)?.as_ref().ok())
        .map(|reply| reply.applied_index)
        .context("the leader's applied index")?;
    let left = deadline.saturating_duration_since(Instant::now());
    cluster
        .wait_until(
            left,
            &format!("node {node} applied index reaching {target}"),
            |statuses| {
                statuses
                    .get(&node)
                    .is_some_and(|s| s.as_ref().is_ok_and(|r| r.applied_index >= target))
            },
        )
        .await?;
    Ok(())
}

/// The counter's value read through the leader, `Some(0)` if absent.
async fn read_counter(cluster: &LocalCluster) -> Option<i64> {
    let client = Client::with_config(
        cluster.client_addrs(),
        ClientConfig {
            call_timeout: Duration::from_secs(15),
            ..ClientConfig::default()
        },
    );
    let value = client.get(KEY).await;
    client.close().await;
    match value {
        Ok(None) => Some(0),
        Ok(Some(Value::Int(value))) => Some(value),
        Ok(Some(other)) => {
            eprintln!("the counter holds a non-integer: {other:?}");
            None
        }
        Err(error) => {
            eprintln!("cannot read the counter back: {error}");
            None
        }
    }
}

/// The run's figures from what the killer, the term watcher and the
/// writers recorded.
fn report(
    options: &FailoverOptions,
    started: Instant,
    kills: &[Kill],
    increases: &[TermIncrease],
    log: &WriterLog,
    final_value: Option<i64>,
    aborted: Option<String>,
) -> FailoverReport {
    let micros = kill_delays_micros(kills, |kill| kill.first_ack);
    let any_micros = kill_delays_micros(kills, |kill| kill.first_any_ack);
    let end = Instant::now();
    let (load_puts_between_kills, load_time_between_kills) =
        between_kills(kills, log.load_acknowledged, started, end);
    let (after_kills, spurious) = attribute(kills, increases, Instant::now());
    FailoverReport {
        mode: "failover",
        timing: options.timing,
        kills_requested: options.kills,
        kills_done: kills.len() as u32,
        samples_ms: micros.iter().map(|&m| f64::from(m) / 1e3).collect(),
        per_kill: kill_samples(kills),
        median_ms: percentile(&micros, 0.50),
        p99_ms: percentile(&micros, 0.99),
        max_ms: percentile(&micros, 1.0),
        any_client_median_ms: percentile(&any_micros, 0.50),
        any_client_p99_ms: percentile(&any_micros, 0.99),
        any_client_max_ms: percentile(&any_micros, 1.0),
        elections_after_kills: after_kills,
        elections_not_caused_by_kill: spurious.iter().map(|i| i.to - i.from).sum(),
        spurious_elections: spurious_elections(started, kills, &spurious),
        writes_acknowledged: log.acks.len() as u64,
        load_clients: options.load_clients,
        load_writes_per_second: log.load_acknowledged as f64
            / (end - started).as_secs_f64().max(f64::MIN_POSITIVE),
        load_writes_per_second_between_kills: load_puts_between_kills as f64
            / load_time_between_kills.as_secs_f64().max(f64::MIN_POSITIVE),
        load_seconds_between_kills: load_time_between_kills.as_secs_f64(),
        writes_unknown: log.unknown,
        writes_failed: log.failed,
        final_value,
        consistent: consistent(log, final_value),
        seconds: seconds_since(started, end),
        aborted,
    }
}

/// Seconds from `started` to `at`.
fn seconds_since(started: Instant, at: Instant) -> f64 {
    at.saturating_duration_since(started).as_secs_f64()
}

/// Each kill → its `first` acknowledgement (kills without one left out),
/// in microseconds, sorted.
fn kill_delays_micros(kills: &[Kill], first: fn(&Kill) -> Option<Instant>) -> Vec<u32> {
    let mut micros: Vec<u32> = kills
        .iter()
        .filter_map(|kill| first(kill).map(|ack| ack - kill.at))
        .map(|delay| delay.as_micros().min(u128::from(u32::MAX)) as u32)
        .collect();
    micros.sort_unstable();
    micros
}

/// Every kill in order, with its delays in milliseconds.
fn kill_samples(kills: &[Kill]) -> Vec<KillSample> {
    kills
        .iter()
        .map(|kill| KillSample {
            node: kill.node,
            first_ack_ms: kill
                .first_ack
                .map(|ack| (ack - kill.at).as_secs_f64() * 1e3),
            first_ack_any_client_ms: kill
                .first_any_ack
                .map(|ack| (ack - kill.at).as_secs_f64() * 1e3),
        })
        .collect()
}

/// The `spurious` term increases as reported, each with the time since
/// the latest kill before it.
fn spurious_elections(
    started: Instant,
    kills: &[Kill],
    spurious: &[TermIncrease],
) -> Vec<SpuriousElection> {
    spurious
        .iter()
        .map(|increase| SpuriousElection {
            at_s: seconds_since(started, increase.at),
            node: increase.node,
            from_term: increase.from,
            to_term: increase.to,
            since_last_kill_s: kills
                .iter()
                .rev()
                .find(|kill| kill.at <= increase.at)
                .map(|kill| (increase.at - kill.at).as_secs_f64()),
        })
        .collect()
}

/// Exactly once: the acknowledged values rose strictly, and the final
/// value lies in [acknowledged, acknowledged + unknown].
fn consistent(log: &WriterLog, final_value: Option<i64>) -> bool {
    let acknowledged = log.acks.len() as u64;
    let rising = log
        .acks
        .windows(2)
        .all(|pair| pair[0].value < pair[1].value);
    rising
        && final_value.is_some_and(|value| {
            let value = u64::try_from(value).unwrap_or(u64::MAX);
            acknowledged <= value && value <= acknowledged + log.unknown
        })
}

/// The load writers' acknowledged puts outside every kill's window (the
/// kill → the probe's first acknowledgement, or → `end` if none came), out
/// of `total` acknowledged from `started` to `end`, and the time outside.
fn between_kills(kills: &[Kill], total: u64, started: Instant, end: Instant) -> (u64, Duration) {
    let (mut outage_puts, mut outage) = (0, Duration::ZERO);
    for kill in kills {
        let (until, puts_then) = match (kill.first_ack, kill.load_at_first_ack) {
            (Some(ack), Some(puts)) => (ack, puts),
            _ => (end, total),
        };
        outage += until.saturating_duration_since(kill.at);
        outage_puts += puts_then.saturating_sub(kill.load_at_kill);
    }
    let serving = end
        .saturating_duration_since(started)
        .saturating_sub(outage);
    (total.saturating_sub(outage_puts), serving)
}

/// Splits the term increases into the elections within a kill's window
/// (from the kill until its first acknowledged write plus
/// [`ELECTION_GRACE`], or until `end` if none came) — counted in terms —
/// and the increases outside every window.
fn attribute(kills: &[Kill], increases: &[TermIncrease], end: Instant) -> (u64, Vec<TermIncrease>) {
    let mut caused = 0;
    let mut spurious = Vec::new();
    for increase in increases {
        let in_window = kills.iter().any(|kill| {
            let until = kill.first_ack.map_or(end, |ack| ack + ELECTION_GRACE);
            kill.at <= increase.at && increase.at <= until
        });
        if in_window {
            caused += increase.to - increase.from;
        } else {
            spurious.push(*increase);
        }
    }
    (caused, spurious)
}

/// Prints the report: one JSON line, or the text lines.
fn print(report: &FailoverReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
        return Ok(());
    }
    print_kill_times(report);
    print_elections(report);
    print_writes(report);
    if let Some(reason) = &report.aborted {
        println!("aborted: {reason}");
    }
    Ok(())
}

/// The kills and their kill → first acknowledgement figures.
fn print_kill_times(report: &FailoverReport) {
    let timing = report.timing;
    println!(
        "failover: {} of {} leader kills (SIGKILL) in {:.1} s; heartbeat {} ms, election timeout {}-{} ms",
        report.kills_done,
        report.kills_requested,
        report.seconds,
        timing.heartbeat_ms,
        timing.election_timeout_min_ms,
        timing.election_timeout_max_ms
    );
    println!(
        "kill -> first acknowledged write (probe writer): median {:.1} ms  p99 {:.1} ms  max {:.1} ms",
        report.median_ms, report.p99_ms, report.max_ms
    );
    if report.load_clients > 0 {
        println!(
            "kill -> first acknowledged write (any client): median {:.1} ms  p99 {:.1} ms  max {:.1} ms",
            report.any_client_median_ms, report.any_client_p99_ms, report.any_client_max_ms
        );
    }
    let samples: Vec<String> = report
        .samples_ms
        .iter()
        .map(|ms| format!("{ms:.1}"))
        .collect();
    println!("probe samples (ms, sorted): {}", samples.join(" "));
}

/// The elections, and each spurious one.
fn print_elections(report: &FailoverReport) {
    println!(
        "elections: {} within kill windows, {} not caused by a kill",
        report.elections_after_kills, report.elections_not_caused_by_kill
    );
    for election in &report.spurious_elections {
        println!(
            "  spurious: term {} -> {} seen on node {} at {:.2} s{}",
            election.from_term,
            election.to_term,
            election.node,
            election.at_s,
            election
                .since_last_kill_s
                .map(|s| format!(" ({s:.2} s after the latest kill)"))
                .unwrap_or_default()
        );
    }
}

/// The probe writer's writes and the counter, then the background load.
fn print_writes(report: &FailoverReport) {
    println!(
        "writes: {} acknowledged, {} unknown, {} failed; counter {}: {}",
        report.writes_acknowledged,
        report.writes_unknown,
        report.writes_failed,
        report
            .final_value
            .map_or_else(|| "unread".to_owned(), |value| value.to_string()),
        if report.consistent {
            format!(
                "consistent (between {} and {})",
                report.writes_acknowledged,
                report.writes_acknowledged + report.writes_unknown
            )
        } else {
            "INCONSISTENT".to_owned()
        }
    );
    if report.load_clients > 0 {
        println!(
            "background load: {} clients, {:.0} puts/s acknowledged between kills (over the {:.1} s \
             outside every kill -> probe's first ack window), {:.0} puts/s over the whole run",
            report.load_clients,
            report.load_writes_per_second_between_kills,
            report.load_seconds_between_kills,
            report.load_writes_per_second
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kill at `at` whose probe's first acknowledgement came at
    /// `first.0`, with `first.1` load puts acknowledged in between.
    fn kill(node: u64, at: Instant, first: Option<(Instant, u64)>) -> Kill {
        Kill {
            node,
            at,
            first_ack: first.map(|(ack, _)| ack),
            first_any_ack: first.map(|(ack, _)| ack),
            load_at_kill: 1_000,
            load_at_first_ack: first.map(|(_, puts)| 1_000 + puts),
        }
    }

    /// Term increases inside a kill's window are the kill's; the rest are
    /// spurious, and a kill without a first write keeps its window open.
    #[test]
    fn elections_are_attributed_to_kill_windows() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let kills = [
            kill(1, ms(1_000), Some((ms(1_700), 0))),
            kill(2, ms(10_000), None),
        ];
        let increase = |at: u64, from: u64, to: u64| TermIncrease {
            at: ms(at),
            node: 3,
            from,
            to,
        };
        let increases = [
            increase(500, 1, 2),    // before any kill: spurious
            increase(1_200, 2, 4),  // kill 1's election, a split vote: 2 terms
            increase(3_600, 4, 5),  // within 2 s of kill 1's first write
            increase(3_800, 5, 6),  // after it: spurious
            increase(12_000, 6, 7), // kill 2 never saw a write: open window
        ];
        let (caused, spurious) = attribute(&kills, &increases, ms(20_000));
        assert_eq!(caused, 4);
        let spurious: Vec<u64> = spurious.iter().map(|i| i.to).collect();
        assert_eq!(spurious, [2, 6]);
    }

    /// The load's puts and time between kills leave out every kill's window
    /// and the puts acknowledged in it; an unanswered kill's window runs to
    /// the end.
    #[test]
    fn load_throughput_between_kills_leaves_out_the_kill_windows() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        // 10 s, two 1 s windows with 100 puts each: 8,000 - 200 puts in 8 s.
        let kills = [
            kill(1, ms(2_000), Some((ms(3_000), 100))),
            kill(2, ms(6_000), Some((ms(7_000), 100))),
        ];
        assert_eq!(
            between_kills(&kills, 8_000, t0, ms(10_000)),
            (7_800, Duration::from_secs(8))
        );
        // A kill never answered: its window (and the puts since it) to the end.
        let kills = [kill(1, ms(8_000), None)];
        assert_eq!(
            between_kills(&kills, 1_500, t0, ms(10_000)),
            (1_000, Duration::from_secs(8))
        );
    }

    /// Only load acknowledgements at or after the armed instant count as a
    /// kill's first, and disarming forgets them.
    #[test]
    fn load_first_acknowledgement_is_armed_per_kill() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let load = LoadShared::new(t0);
        load.acknowledge(ms(100));
        assert_eq!(load.disarm(), None, "nothing armed");
        load.arm(ms(500));
        load.acknowledge(ms(400));
        assert_eq!(load.first_ack_us.load(Ordering::Relaxed), u64::MAX);
        load.acknowledge(ms(900));
        load.acknowledge(ms(700));
        assert_eq!(load.disarm(), Some(ms(700)));
        assert_eq!(load.disarm(), None);
        assert_eq!(load.acknowledged(), 4);
    }
}
