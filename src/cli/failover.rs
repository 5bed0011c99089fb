//! `oncekv bench --failover`: how long writes stop when the leader crashes.
//!
//! Starts its own fresh local 3-node cluster ([`LocalCluster`]), runs one
//! closed-loop writer (a [`Client`] incrementing one counter, recording when
//! every acknowledgement arrived) and, `--kills` times: waits until writes
//! flow and all three nodes agree on a leader, SIGKILLs the leader, measures
//! the time from the kill to the first acknowledged write after it, restarts
//! the killed node and waits until it has caught up. Meanwhile every node's
//! `Status` term is polled, so elections that no kill explains (spurious
//! ones) are counted. At the end the counter is read back: exactly-once means
//! it lies between the writes acknowledged and those plus the unknown ones.
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

use super::bench::percentile;
use super::local_cluster::{self, LocalCluster, NODES, Timing, agreed_leader, describe};
use crate::client::{Client, ClientConfig, Error};
use crate::registry::Value;

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

/// One kill of the leader.
#[derive(Clone, Copy, Debug)]
struct Kill {
    node: u64,
    at: Instant,
    /// When the first write after it was acknowledged.
    first_ack: Option<Instant>,
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
    pub first_ack_ms: Option<f64>,
}

/// The figures of one failover run.
#[derive(Clone, Debug, Serialize)]
pub struct FailoverReport {
    pub mode: &'static str,
    pub timing: Timing,
    pub kills_requested: u32,
    pub kills_done: u32,
    /// Kill → first acknowledged write, one per kill, in milliseconds, sorted.
    pub samples_ms: Vec<f64>,
    /// Every kill in order: the node killed and its sample (none if no
    /// write was acknowledged after it).
    pub per_kill: Vec<KillSample>,
    pub median_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Elections (terms) begun within a kill's window: from the kill to its
    /// first acknowledged write plus 2 s.
    pub elections_after_kills: u64,
    /// Every other election.
    pub elections_not_caused_by_kill: u64,
    pub spurious_elections: Vec<SpuriousElection>,
    pub writes_acknowledged: u64,
    /// Background load: clients, and their puts acknowledged per second.
    pub load_clients: usize,
    pub load_writes_per_second: f64,
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
    let interrupt = interrupted();
    tokio::pin!(interrupt);
    let cluster_options = local_cluster::Options {
        name: "failover".to_owned(),
        timing,
        keep_dir: options.keep_dir,
        ..local_cluster::Options::default()
    };
    let cluster = tokio::select! {
        cluster = LocalCluster::start(&cluster_options) => cluster.context("start the local cluster")?,
        () = &mut interrupt => bail!("interrupted"),
    };
    let report = tokio::select! {
        report = measure(&cluster, options) => report,
        () = &mut interrupt => bail!("interrupted"),
    };
    print(&report, options.json)?;
    if report.aborted.is_some() {
        eprintln!("{}", cluster.log_tails(LOG_TAIL_LINES));
    }
    drop(cluster);
    if let Some(reason) = &report.aborted {
        bail!("failover run cut short: {reason}");
    }
    if !report.consistent {
        bail!("the counter is inconsistent with the acknowledged writes");
    }
    Ok(())
}

/// Resolves on ctrl-c or SIGTERM.
async fn interrupted() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut terminate) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

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
    let initial_term = cluster
        .statuses()
        .await
        .values()
        .filter_map(|status| status.as_ref().ok())
        .map(|reply| reply.term)
        .max()
        .unwrap_or(0);

    let mut writer = AbortOnDrop(tokio::spawn(write_loop(
        client.clone(),
        log.clone(),
        acks_tx,
        stop_rx.clone(),
    )));
    let load_acknowledged = Arc::new(AtomicU64::new(0));
    let mut loaders: Vec<_> = (0..options.load_clients)
        .map(|number| {
            AbortOnDrop(tokio::spawn(load_loop(
                cluster.client_addrs(),
                number,
                load_acknowledged.clone(),
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
                kill_loop(cluster, options, &log, acks_rx, &mut kills),
            )
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the run's deadline passed")));
            let _ = stop_tx.send(true);
            outcome.err().map(|error| format!("{error:#}"))
        },
        watch_terms(cluster, initial_term, stop_rx),
    );
    // The writer finishes its current call (bounded by its call timeout).
    let writer_ended = timeout_at(
        Instant::now() + CALL_TIMEOUT + Duration::from_secs(5),
        &mut writer.0,
    )
    .await;
    let mut aborted = aborted;
    if writer_ended.is_err() && aborted.is_none() {
        aborted = Some("the writer did not stop".to_owned());
    }
    // Load writers stop after their current call, like the writer.
    let loaders_ended = timeout_at(
        Instant::now() + CALL_TIMEOUT + Duration::from_secs(5),
        futures::future::join_all(loaders.iter_mut().map(|loader| &mut loader.0)),
    )
    .await;
    if loaders_ended.is_err() && aborted.is_none() {
        aborted = Some("the load writers did not stop".to_owned());
    }
    let final_value = if aborted.is_none() {
        read_counter(cluster).await
    } else {
        // Best effort: the cluster may be unusable.
        tokio::time::timeout(Duration::from_secs(15), read_counter(cluster))
            .await
            .ok()
            .flatten()
    };
    client.close().await;
    lock(&log).load_acknowledged = load_acknowledged.load(Ordering::Relaxed);
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
    acknowledged: Arc<AtomicU64>,
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
            acknowledged.fetch_add(1, Ordering::Relaxed);
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

/// The killer: `options.kills` times kill the leader, time the first
/// acknowledged write after it, restart the node and let it catch up.
async fn kill_loop(
    cluster: &LocalCluster,
    options: &FailoverOptions,
    log: &SharedLog,
    mut acks: watch::Receiver<usize>,
    kills: &mut Vec<Kill>,
) -> anyhow::Result<()> {
    let timing = cluster.timing();
    // No new leader can acknowledge a write sooner than this after a kill:
    // a follower's election timer (at least the minimum timeout) started at
    // most one heartbeat before the kill. An acknowledgement sooner than half
    // of it is a reply the killed leader sent just before dying.
    let new_leader_floor =
        Duration::from_millis(timing.election_timeout_min_ms - timing.heartbeat_ms) / 2;
    let mut flowing_since = Instant::now();
    for number in 1..=options.kills {
        let leader = wait_ready(cluster, log, flowing_since)
            .await
            .with_context(|| format!("before kill {number}"))?;
        let from = lock(log).acks.len();
        tracing::info!(number, node = leader, "SIGKILL the leader");
        let at = Instant::now();
        cluster
            .kill(leader)
            .with_context(|| format!("kill {number} (node {leader})"))?;
        kills.push(Kill {
            node: leader,
            at,
            first_ack: None,
        });
        let first_ack = wait_first_ack(log, &mut acks, from, at + new_leader_floor)
            .await
            .with_context(|| format!("kill {number} (node {leader})"))?;
        if let Some(kill) = kills.last_mut() {
            kill.first_ack = Some(first_ack);
        }
        let ms = (first_ack - at).as_secs_f64() * 1e3;
        tracing::info!(
            number,
            node = leader,
            ms,
            "first acknowledged write after the kill"
        );
        if !options.json {
            eprintln!(
                "kill {number}/{}: node {leader}, first acknowledged write after {ms:.1} ms",
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
    let target = loop {
        let statuses = cluster.statuses().await;
        if let Some(leader) = agreed_leader(&statuses)
            && let Some(Ok(reply)) = statuses.get(&leader)
        {
            break reply.applied_index;
        }
        if Instant::now() >= deadline {
            bail!(
                "no agreed leader within {CATCH_UP_TIMEOUT:?}; statuses:\n{}",
                describe(&statuses)
            );
        }
        sleep(POLL).await;
    };
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

fn report(
    options: &FailoverOptions,
    started: Instant,
    kills: &[Kill],
    increases: &[TermIncrease],
    log: &WriterLog,
    final_value: Option<i64>,
    aborted: Option<String>,
) -> FailoverReport {
    let mut micros: Vec<u32> = kills
        .iter()
        .filter_map(|kill| kill.first_ack.map(|ack| ack - kill.at))
        .map(|delay| delay.as_micros().min(u128::from(u32::MAX)) as u32)
        .collect();
    micros.sort_unstable();
    let (after_kills, spurious) = attribute(kills, increases, Instant::now());
    let seconds = |at: Instant| at.saturating_duration_since(started).as_secs_f64();
    let spurious_elections = spurious
        .iter()
        .map(|increase| SpuriousElection {
            at_s: seconds(increase.at),
            node: increase.node,
            from_term: increase.from,
            to_term: increase.to,
            since_last_kill_s: kills
                .iter()
                .rev()
                .find(|kill| kill.at <= increase.at)
                .map(|kill| (increase.at - kill.at).as_secs_f64()),
        })
        .collect::<Vec<_>>();
    let acknowledged = log.acks.len() as u64;
    let rising = log
        .acks
        .windows(2)
        .all(|pair| pair[0].value < pair[1].value);
    let consistent = rising
        && final_value.is_some_and(|value| {
            let value = u64::try_from(value).unwrap_or(u64::MAX);
            acknowledged <= value && value <= acknowledged + log.unknown
        });
    FailoverReport {
        mode: "failover",
        timing: options.timing,
        kills_requested: options.kills,
        kills_done: kills.len() as u32,
        samples_ms: micros.iter().map(|&m| f64::from(m) / 1e3).collect(),
        per_kill: kills
            .iter()
            .map(|kill| KillSample {
                node: kill.node,
                first_ack_ms: kill
                    .first_ack
                    .map(|ack| (ack - kill.at).as_secs_f64() * 1e3),
            })
            .collect(),
        median_ms: percentile(&micros, 0.50),
        p99_ms: percentile(&micros, 0.99),
        max_ms: percentile(&micros, 1.0),
        elections_after_kills: after_kills,
        elections_not_caused_by_kill: spurious.iter().map(|i| i.to - i.from).sum(),
        spurious_elections,
        writes_acknowledged: acknowledged,
        load_clients: options.load_clients,
        load_writes_per_second: log.load_acknowledged as f64
            / started.elapsed().as_secs_f64().max(f64::MIN_POSITIVE),
        writes_unknown: log.unknown,
        writes_failed: log.failed,
        final_value,
        consistent,
        seconds: seconds(Instant::now()),
        aborted,
    }
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

fn print(report: &FailoverReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
        return Ok(());
    }
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
        "kill -> first acknowledged write: median {:.1} ms  p99 {:.1} ms  max {:.1} ms",
        report.median_ms, report.p99_ms, report.max_ms
    );
    let samples: Vec<String> = report
        .samples_ms
        .iter()
        .map(|ms| format!("{ms:.1}"))
        .collect();
    println!("samples (ms, sorted): {}", samples.join(" "));
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
            "background load: {} clients, {:.0} puts/s acknowledged over the run",
            report.load_clients, report.load_writes_per_second
        );
    }
    if let Some(reason) = &report.aborted {
        println!("aborted: {reason}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Term increases inside a kill's window are the kill's; the rest are
    /// spurious, and a kill without a first write keeps its window open.
    #[test]
    fn elections_are_attributed_to_kill_windows() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let kills = [
            Kill {
                node: 1,
                at: ms(1_000),
                first_ack: Some(ms(1_700)),
            },
            Kill {
                node: 2,
                at: ms(10_000),
                first_ack: None,
            },
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
}
