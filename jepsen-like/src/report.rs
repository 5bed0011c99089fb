//! Figures of a run, computed from its history alone, and their
//! presentation: the printed summary and a self-contained HTML report with
//! SVG plots (throughput and latency over time, fault windows shaded, a
//! mark per leader change) drawn with plotters. Judging belongs to the
//! checker; this module only counts and draws.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use serde::Serialize;

use crate::checker::claims::ClaimFigures;
use crate::checker::unknowns::UnknownFigures;
use crate::checker::{Exercise, Findings, LEADER_KILL_KINDS, Safety, Verdict, is_session_write};
use crate::history::{self, Event, EventType, Expect, KeyedIntent, Op, Process};
use crate::workload::KEY_CONFLICT;

/// A fault as it happened.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FaultWindow {
    pub kind: String,
    pub nodes: Vec<u64>,
    pub start_s: f64,
    /// When it was healed (`None`: never, which the runner does not allow).
    pub end_s: Option<f64>,
}

/// Kill → first acknowledgement statistics, in milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Recovery {
    pub samples_ms: Vec<f64>,
    pub median_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// Acknowledged writes per second in the phases of a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Throughput {
    /// Before the first fault.
    pub before: f64,
    /// While some fault was active.
    pub during: f64,
    /// Between faults (none active, after the first, before the last heal).
    pub between: f64,
    /// After the last fault was healed.
    pub after: f64,
}

/// Every figure of a run.
#[derive(Clone, Debug, Serialize)]
pub struct Figures {
    pub seed: u64,
    pub duration_s: f64,
    pub clients: u64,
    pub attempted: u64,
    pub ok: u64,
    pub fail: u64,
    pub info: u64,
    /// Of `fail`: the lifecycle client's refusals that were the point
    /// (discarded, conflicting, expired).
    pub fail_expected: u64,
    /// Attempts beyond the first, over all operations.
    pub retries: u64,
    /// Acknowledged operations answered by the registry as duplicates.
    pub duplicates: u64,
    pub acks_after_leader_change: u64,
    pub duplicates_after_leader_change: u64,
    pub leader_changes: u64,
    pub faults_by_kind: BTreeMap<String, u64>,
    pub faults: Vec<FaultWindow>,
    pub kill_to_first_ack: Recovery,
    pub throughput: Throughput,
    /// Reads (not among the operations above): answered, of lists and of
    /// counters among them, and failed.
    pub reads_ok: u64,
    pub reads_ok_of_lists: u64,
    pub reads_ok_of_counters: u64,
    pub reads_failed: u64,
    /// The keyed workload (not among the operations above).
    pub keyed: KeyedFigures,
    /// The claims workload (not among the operations above).
    pub claims: ClaimFigures,
}

/// The keyed workload's calls (`execute_with_key`, no session).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KeyedFigures {
    /// Idempotency keys used.
    pub keys: u64,
    /// Of them, acknowledged.
    pub keys_acknowledged: u64,
    /// Calls, of every intent.
    pub attempted: u64,
    pub ok: u64,
    pub fail: u64,
    pub info: u64,
    /// Calls answered as duplicates by the registry.
    pub duplicates: u64,
    /// First calls of a key answered as duplicates: the library's own
    /// retry inside the call (same key, after a lost reply or a leader
    /// change) found the key executed.
    pub first_calls_answered_duplicate: u64,
    /// Calls sent again after an unknown outcome (or not sent), and how
    /// many of those were answered as duplicates (the earlier call had
    /// executed).
    pub retries: u64,
    pub retries_answered_duplicate: u64,
    /// Deliberate repeats of acknowledged keys.
    pub repeats: u64,
    /// Calls reusing an acknowledged key with another command, and how many
    /// were refused as `KEY_CONFLICT`.
    pub conflicts_sent: u64,
    pub conflicts_refused: u64,
}

/// Sorted-sample percentile (nearest rank); 0 when empty.
pub fn percentile(sorted: &[f64], quantile: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((quantile * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// The fault windows of a history.
pub fn fault_windows(events: &[Event]) -> Vec<FaultWindow> {
    let mut windows: Vec<FaultWindow> = Vec::new();
    let mut open: BTreeMap<u64, usize> = BTreeMap::new();
    for event in events {
        let (Process::Nemesis, Op::Fault { kind, nodes }) = (&event.process, &event.op) else {
            continue;
        };
        if event.kind == EventType::Invoke {
            open.insert(event.op_id, windows.len());
            windows.push(FaultWindow {
                kind: kind.clone(),
                nodes: nodes.clone(),
                start_s: seconds(event.time_ns),
                end_s: None,
            });
        } else if let Some(index) = open.remove(&event.op_id) {
            windows[index].end_s = Some(seconds(event.time_ns));
        }
    }
    windows
}

/// Computes the figures; `workload_end_ns` is when the clients stopped,
/// `new_leader_floor_ns` the least time after a kill at which an
/// acknowledgement can come from a new leader (sooner ones are replies the
/// dying leader sent).
pub fn figures(
    seed: u64,
    clients: u64,
    events: &[Event],
    exercise: &Exercise,
    workload_end_ns: u64,
    new_leader_floor_ns: u64,
) -> Figures {
    let operations = history::pair(events).unwrap_or_default();
    // Writes: every figure but the read counts is about them.
    let client_ops: Vec<&history::Operation> = operations
        .iter()
        .filter(|o| matches!(o.process, Process::Client(_)) && is_session_write(&o.op))
        .collect();
    let reads = ReadCounts::of(&operations);
    let count = |kind: EventType| client_ops.iter().filter(|o| o.outcome() == kind).count() as u64;
    let faults = fault_windows(events);
    let mut acks: Vec<u64> = client_ops
        .iter()
        .filter(|o| o.outcome() == EventType::Ok)
        .map(|o| o.complete_ns())
        .collect();
    acks.sort_unstable();
    Figures {
        seed,
        duration_s: seconds(workload_end_ns),
        clients,
        attempted: client_ops.len() as u64,
        ok: count(EventType::Ok),
        fail: count(EventType::Fail),
        info: count(EventType::Info),
        fail_expected: refusals_provoked(&client_ops),
        retries: client_ops
            .iter()
            .filter_map(|o| o.completion.as_ref())
            .map(|c| u64::from(c.attempts.saturating_sub(1)))
            .sum(),
        duplicates: exercise.duplicates,
        acks_after_leader_change: exercise.acks_after_leader_change,
        duplicates_after_leader_change: exercise.duplicates_after_leader_change,
        leader_changes: events
            .iter()
            .filter(|e| matches!(e.op, Op::LeaderChange { .. }))
            .count() as u64,
        faults_by_kind: faults_by_kind(&faults),
        throughput: throughput(&acks, &faults, seconds(workload_end_ns)),
        kill_to_first_ack: kill_to_first_ack(&faults, &acks, new_leader_floor_ns),
        faults,
        reads_ok: reads.ok,
        reads_ok_of_lists: reads.ok_of_lists,
        reads_ok_of_counters: reads.ok_of_counters,
        reads_failed: reads.failed,
        keyed: keyed_figures(&operations),
        claims: ClaimFigures::of(&operations),
    }
}

/// The reads answered (of list keys, of counter keys) and failed.
struct ReadCounts {
    ok: u64,
    ok_of_lists: u64,
    ok_of_counters: u64,
    failed: u64,
}

impl ReadCounts {
    /// Counts the reads among `operations` (list and counter keys as
    /// their writes make them).
    fn of(operations: &[history::Operation]) -> ReadCounts {
        let keys_of = |counters: bool| -> std::collections::BTreeSet<&str> {
            operations
                .iter()
                .filter_map(|o| match &o.op {
                    Op::Increment { key, .. } if counters => Some(key.as_str()),
                    Op::Append { key, .. } | Op::Lifecycle { key, .. } if !counters => {
                        Some(key.as_str())
                    }
                    _ => None,
                })
                .collect()
        };
        let (counter_keys, list_keys) = (keys_of(true), keys_of(false));
        let reads_ok: Vec<&str> = operations
            .iter()
            .filter_map(|o| match &o.op {
                Op::Read { key } if o.outcome() == EventType::Ok => Some(key.as_str()),
                _ => None,
            })
            .collect();
        let reads_of = |keys: &std::collections::BTreeSet<&str>| {
            reads_ok.iter().filter(|key| keys.contains(*key)).count() as u64
        };
        ReadCounts {
            ok: reads_ok.len() as u64,
            ok_of_lists: reads_of(&list_keys),
            ok_of_counters: reads_of(&counter_keys),
            failed: operations
                .iter()
                .filter(|o| is_read(o) && o.outcome() != EventType::Ok)
                .count() as u64,
        }
    }
}

/// The failed writes that were the lifecycle client's point (discarded,
/// conflicting, expired).
fn refusals_provoked(client_ops: &[&history::Operation]) -> u64 {
    client_ops
        .iter()
        .filter(|o| {
            o.outcome() == EventType::Fail
                && matches!(
                    o.op,
                    Op::Lifecycle {
                        expect: Expect::Discarded | Expect::Conflict | Expect::Expired,
                        ..
                    }
                )
        })
        .count() as u64
}

/// How many faults of each kind ran.
fn faults_by_kind(faults: &[FaultWindow]) -> BTreeMap<String, u64> {
    let mut by_kind = BTreeMap::new();
    for fault in faults {
        *by_kind.entry(fault.kind.clone()).or_insert(0) += 1;
    }
    by_kind
}

/// Each leader kill to the first write acknowledged (`acks_ns`, sorted) at
/// least `new_leader_floor_ns` after it.
fn kill_to_first_ack(
    faults: &[FaultWindow],
    acks_ns: &[u64],
    new_leader_floor_ns: u64,
) -> Recovery {
    let mut samples: Vec<f64> = faults
        .iter()
        .filter(|f| LEADER_KILL_KINDS.contains(&f.kind.as_str()))
        .filter_map(|f| {
            let kill_ns = (f.start_s * 1e9) as u64;
            let from = acks_ns.partition_point(|t| *t < kill_ns + new_leader_floor_ns);
            acks_ns.get(from).map(|t| (t - kill_ns) as f64 / 1e6)
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    Recovery {
        median_ms: percentile(&samples, 0.5),
        p99_ms: percentile(&samples, 0.99),
        max_ms: percentile(&samples, 1.0),
        samples_ms: samples,
    }
}

fn is_read(operation: &history::Operation) -> bool {
    matches!(operation.op, Op::Read { .. })
}

/// Counts the keyed workload's calls.
pub fn keyed_figures(operations: &[history::Operation]) -> KeyedFigures {
    let mut figures = KeyedFigures::default();
    let mut keys: std::collections::BTreeMap<&str, bool> = Default::default();
    for operation in operations {
        let Op::Keyed {
            idempotency_key,
            intent,
            ..
        } = &operation.op
        else {
            continue;
        };
        let done = operation.completion.as_ref();
        let ok = operation.outcome() == EventType::Ok;
        let duplicate = ok && done.is_some_and(|done| done.duplicate);
        figures.attempted += 1;
        match operation.outcome() {
            EventType::Ok => figures.ok += 1,
            EventType::Fail => figures.fail += 1,
            EventType::Info | EventType::Invoke => figures.info += 1,
        }
        if duplicate {
            figures.duplicates += 1;
        }
        match intent {
            KeyedIntent::First => {
                if duplicate {
                    figures.first_calls_answered_duplicate += 1;
                }
            }
            KeyedIntent::Retry => {
                figures.retries += 1;
                if duplicate {
                    figures.retries_answered_duplicate += 1;
                }
            }
            KeyedIntent::Repeat => figures.repeats += 1,
            KeyedIntent::Conflict => {
                figures.conflicts_sent += 1;
                if done.is_some_and(|done| done.error.as_deref() == Some(KEY_CONFLICT)) {
                    figures.conflicts_refused += 1;
                }
            }
        }
        if *intent != KeyedIntent::Conflict {
            *keys.entry(idempotency_key).or_default() |= ok;
        }
    }
    figures.keys = keys.len() as u64;
    figures.keys_acknowledged = keys.values().filter(|acked| **acked).count() as u64;
    figures
}

fn throughput(acks_ns: &[u64], faults: &[FaultWindow], end_s: f64) -> Throughput {
    // Faults after the workload (the final restarts) do not count.
    let faults: Vec<&FaultWindow> = faults.iter().filter(|f| f.start_s < end_s).collect();
    let first = faults.first().map_or(end_s, |f| f.start_s);
    let last = faults
        .iter()
        .map(|f| f.end_s.unwrap_or(end_s))
        .fold(first, f64::max);
    let inside = |t: f64| {
        faults
            .iter()
            .any(|f| f.start_s <= t && t < f.end_s.unwrap_or(end_s))
    };
    // Time spent in each phase, by 10 ms steps.
    let step = 0.01;
    let mut time = [0.0f64; 4];
    let phase = |t: f64| {
        if t < first {
            0
        } else if t >= last {
            3
        } else if inside(t) {
            1
        } else {
            2
        }
    };
    let mut t = 0.0;
    while t < end_s {
        time[phase(t)] += step;
        t += step;
    }
    let mut count = [0u64; 4];
    for ack in acks_ns {
        let t = seconds(*ack);
        if t <= end_s {
            count[phase(t)] += 1;
        }
    }
    let rate = |i: usize| {
        if time[i] > 0.05 {
            count[i] as f64 / time[i]
        } else {
            0.0
        }
    };
    Throughput {
        before: rate(0),
        during: rate(1),
        between: rate(2),
        after: rate(3),
    }
}

/// The printed summary.
pub fn summary(
    figures: &Figures,
    findings: &Findings,
    exercise: &Exercise,
    verdict: Verdict,
) -> String {
    let mut out = String::new();
    write_writes(&mut out, figures);
    write_faults(&mut out, figures);
    write_reads_and_keyed(&mut out, figures, &findings.safety);
    write_claims(&mut out, &figures.claims, &findings.safety);
    write_unknowns(&mut out, &findings.unknowns);
    let t = &figures.throughput;
    let _ = writeln!(
        out,
        "throughput (acknowledged writes/s): before faults {:.0}, during faults {:.0}, between faults {:.0}, after faults {:.0}",
        t.before, t.during, t.between, t.after
    );
    write_safety(&mut out, findings);
    write_verdict(&mut out, exercise, verdict);
    out
}

/// The summary's run and writes lines: seed, the session workload's
/// writes, the leader changes.
fn write_writes(out: &mut String, f: &Figures) {
    let _ = writeln!(
        out,
        "seed {}  duration {:.1} s  clients {}",
        f.seed, f.duration_s, f.clients
    );
    let _ = writeln!(
        out,
        "operations (writes): {} attempted, {} ok, {} fail ({} of them refusals the lifecycle client provoked), {} info; {} retries; {} answered as duplicates by the registry",
        f.attempted, f.ok, f.fail, f.fail_expected, f.info, f.retries, f.duplicates
    );
    let _ = writeln!(
        out,
        "leader changes seen: {}; acknowledgements after a leader change: {} ({} of them duplicates of a retried request)",
        f.leader_changes, f.acks_after_leader_change, f.duplicates_after_leader_change
    );
}

/// The summary's fault lines: the faults by kind, and the leader kills'
/// recovery.
fn write_faults(out: &mut String, f: &Figures) {
    let kinds: Vec<String> = f
        .faults_by_kind
        .iter()
        .map(|(kind, n)| format!("{kind} {n}"))
        .collect();
    let _ = writeln!(
        out,
        "faults: {} ({})",
        f.faults.len(),
        if kinds.is_empty() {
            "none".to_string()
        } else {
            kinds.join(", ")
        }
    );
    let r = &f.kill_to_first_ack;
    let _ = writeln!(
        out,
        "leader kill -> first acknowledgement: {} kills, median {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        r.samples_ms.len(),
        r.median_ms,
        r.p99_ms,
        r.max_ms
    );
}

/// The summary's reads line and keyed line, each with its violations.
fn write_reads_and_keyed(out: &mut String, f: &Figures, s: &Safety) {
    let _ = writeln!(
        out,
        "reads: {} ok ({} of lists, {} of counters), {} failed; read violations {}",
        f.reads_ok, f.reads_ok_of_lists, f.reads_ok_of_counters, f.reads_failed, s.read_violations
    );
    let k = &f.keyed;
    let _ = writeln!(
        out,
        "keyed: {} keys ({} acknowledged), {} attempted, {} ok, {} fail, {} info; {} duplicates ({} first calls retried inside the call, {} of {} calls sent again after an unknown outcome, {} deliberate repeats); {} conflicts sent, {} refused KEY_CONFLICT; keyed violations {}",
        k.keys,
        k.keys_acknowledged,
        k.attempted,
        k.ok,
        k.fail,
        k.info,
        k.duplicates,
        k.first_calls_answered_duplicate,
        k.retries_answered_duplicate,
        k.retries,
        k.repeats,
        k.conflicts_sent,
        k.conflicts_refused,
        s.keyed()
    );
}

/// The summary's unknown-outcomes line: how many calls ended unknown and
/// how they came out.
fn write_unknowns(out: &mut String, u: &UnknownFigures) {
    if u.total() == 0 {
        let _ = writeln!(
            out,
            "unknown outcomes: none (no session write or keyed call ended unknown: the run did not test them); {} calls cut off at the end",
            u.cut_off
        );
        return;
    }
    let _ = writeln!(
        out,
        "unknown outcomes: {} session writes ({} appends applied, {} never applied, {} not judged; {} increments) and {} keyed calls (keys then answered as duplicates {}, executed {}, unresolved {}); {} calls cut off at the end",
        u.session_writes,
        u.appends_applied,
        u.appends_not_applied,
        u.appends_undetermined,
        u.increments,
        u.keyed_calls,
        u.keys_resolved_applied,
        u.keys_resolved_not_applied,
        u.keys_unresolved,
        u.cut_off
    );
}

/// The summary's claims line, with its violations (none when the claims
/// workload did not run).
fn write_claims(out: &mut String, c: &ClaimFigures, s: &Safety) {
    if c.claims == 0 {
        return;
    }
    let _ = writeln!(
        out,
        "claims: {} jobs ({} completed), {} claims: {} won ({} takeovers, {} own wins answered again after a lost reply or a retry), {} in progress, {} replays, {} unknown; completes {} ({} ok, {} FENCED), releases {} ({} ok, {} FENCED), extends {} ({} ok, {} FENCED), {} of unknown outcome; holders killed {}, paused {}; sink accepted {}, refused {}; FENCED {}; claim violations {}",
        c.jobs,
        c.jobs_completed,
        c.claims,
        c.won,
        c.takeovers,
        c.won_again,
        c.in_progress,
        c.replays,
        c.claims_unknown,
        c.completes,
        c.completes_ok,
        c.completes_fenced,
        c.releases,
        c.releases_ok,
        c.releases_fenced,
        c.extends,
        c.extends_ok,
        c.extends_fenced,
        c.calls_unknown,
        c.holders_killed,
        c.holders_paused,
        c.sink_accepted,
        c.sink_refused,
        c.fenced(),
        s.claims()
    );
}

/// The summary's safety lines: every counter, the replicas read, the
/// first problems.
/// What a re-check of a saved history prints: the unknown outcomes, the
/// safety counters and problems, and the verdict (the run's throughput and
/// fault figures stay as the run printed them).
pub fn recheck_summary(findings: &Findings, exercise: &Exercise, verdict: Verdict) -> String {
    let mut out = String::new();
    write_unknowns(&mut out, &findings.unknowns);
    write_safety(&mut out, findings);
    write_verdict(&mut out, exercise, verdict);
    out
}

fn write_safety(out: &mut String, findings: &Findings) {
    let s = &findings.safety;
    let _ = writeln!(
        out,
        "safety: duplicated {}, lost {}, phantom {}, order violations {}, reply mismatches {}, counter violations {}, lifecycle violations {}, read violations {}, keyed duplicated {}, keyed lost {}, keyed phantom {}, keyed reply mismatches {}, keyed conflicts applied {}, keyed counter violations {}, claim fence violations {}, claim lease violations {}, claim fences not enforced {}, claim result violations {}, claim sink violations {}, claim FENCED unjustified {}, claims stuck {}, divergence {}{}",
        s.duplicated,
        s.lost,
        s.phantom,
        s.order_violations,
        s.reply_mismatches,
        s.counter_violations,
        s.lifecycle_violations,
        s.read_violations,
        s.keyed_duplicated,
        s.keyed_lost,
        s.keyed_phantom,
        s.keyed_reply_mismatches,
        s.keyed_conflicts_applied,
        s.keyed_counter_violations,
        s.claim_fence_violations,
        s.claim_lease_violations,
        s.claim_fences_not_enforced,
        s.claim_result_violations,
        s.claim_sink_violations,
        s.claim_fenced_unjustified,
        s.claims_stuck,
        s.divergence,
        if s.malformed > 0 {
            format!(", malformed history {}", s.malformed)
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        out,
        "replicas whose values were read on their own: {}",
        findings.replicas_read
    );
    for problem in findings.problems.iter().take(10) {
        let _ = writeln!(out, "  problem: {problem}");
    }
}

/// The summary's end: what the run did not exercise, and the verdict (no
/// newline after it).
fn write_verdict(out: &mut String, exercise: &Exercise, verdict: Verdict) {
    for missing in &exercise.missing {
        let _ = writeln!(out, "  not exercised: {missing}");
    }
    let _ = write!(
        out,
        "verdict: {}",
        match verdict {
            Verdict::Valid => "VALID",
            Verdict::Invalid => "INVALID",
            Verdict::Unknown => "UNKNOWN (the run did not exercise enough)",
        }
    );
}

/// Per-bucket series for the plots.
struct Series {
    bucket_s: f64,
    ok_per_s: Vec<(f64, f64)>,
    p50_ms: Vec<(f64, f64)>,
    p99_ms: Vec<(f64, f64)>,
    max_ms: Vec<(f64, f64)>,
}

fn series(events: &[Event], end_s: f64) -> Series {
    let bucket_s = 0.5;
    let buckets = ((end_s / bucket_s).ceil() as usize).max(1);
    let mut ok = vec![0u64; buckets];
    let mut latencies: Vec<Vec<f64>> = vec![Vec::new(); buckets];
    for operation in history::pair(events).unwrap_or_default() {
        if !matches!(operation.process, Process::Client(_))
            || !is_session_write(&operation.op)
            || operation.outcome() != EventType::Ok
        {
            continue;
        }
        let done = seconds(operation.complete_ns());
        let index = ((done / bucket_s) as usize).min(buckets - 1);
        ok[index] += 1;
        latencies[index].push((operation.complete_ns() - operation.invoke_ns) as f64 / 1e6);
    }
    let at = |i: usize| (i as f64 + 0.5) * bucket_s;
    let mut series = Series {
        bucket_s,
        ok_per_s: ok
            .iter()
            .enumerate()
            .map(|(i, n)| (at(i), *n as f64 / bucket_s))
            .collect(),
        p50_ms: Vec::new(),
        p99_ms: Vec::new(),
        max_ms: Vec::new(),
    };
    for (i, mut bucket) in latencies.into_iter().enumerate() {
        if bucket.is_empty() {
            continue;
        }
        bucket.sort_by(f64::total_cmp);
        series.p50_ms.push((at(i), percentile(&bucket, 0.5)));
        series.p99_ms.push((at(i), percentile(&bucket, 0.99)));
        series.max_ms.push((at(i), percentile(&bucket, 1.0)));
    }
    series
}

/// The smallest value a log-scale chart shows.
const LOG_FLOOR: f64 = 0.1;

const FAULT_COLOURS: [RGBColor; 10] = [
    RGBColor(255, 205, 210),
    RGBColor(255, 224, 178),
    RGBColor(200, 230, 201),
    RGBColor(187, 222, 251),
    RGBColor(225, 190, 231),
    RGBColor(255, 249, 196),
    RGBColor(178, 235, 242),
    RGBColor(215, 204, 200),
    RGBColor(248, 187, 208),
    RGBColor(220, 237, 200),
];

fn colour_of(kind: &str, kinds: &[String]) -> RGBColor {
    let index = kinds.iter().position(|k| k == kind).unwrap_or(0);
    FAULT_COLOURS[index % FAULT_COLOURS.len()]
}

/// One plotted line: its legend, colour and (x, y) points.
type Line<'a> = (&'a str, RGBColor, &'a [(f64, f64)]);

/// A time chart being drawn: seconds across, the (scaled) value up.
type TimeChart<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// `y` as drawn: log10 (from [`LOG_FLOOR`] up) with `log_scale`.
fn scaled(y: f64, log_scale: bool) -> f64 {
    if log_scale {
        y.max(LOG_FLOOR).log10()
    } else {
        y
    }
}

/// Draws one time chart: fault windows shaded, leader changes marked,
/// then the given lines.
/// With `log_scale`, y values are drawn as log10 (from [`LOG_FLOOR`] up)
/// and labelled with their real values.
#[allow(clippy::too_many_arguments)]
fn chart(
    title: &str,
    y_label: &str,
    end_s: f64,
    y_max: f64,
    log_scale: bool,
    faults: &[FaultWindow],
    leader_changes: &[(f64, u64)],
    lines: &[Line<'_>],
) -> Result<String, String> {
    let y_range = if log_scale {
        (LOG_FLOOR.log10(), scaled(y_max.max(10.0), log_scale))
    } else {
        (0.0, y_max.max(1.0))
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1100, 380)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(0f64..end_s.max(1.0), y_range.0..y_range.1)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("seconds since start")
            .y_desc(y_label)
            .y_label_formatter(&|y: &f64| {
                let value = if log_scale { 10f64.powf(*y) } else { *y };
                if value >= 10.0 {
                    format!("{value:.0}")
                } else {
                    format!("{value:.1}")
                }
            })
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(|e| e.to_string())?;
        draw_faults(&mut chart, faults, end_s, y_range)?;
        draw_leader_changes(&mut chart, leader_changes, y_range)?;
        draw_lines(&mut chart, lines, log_scale)?;
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

/// Shades each fault window over the whole height (`bottom`, `top`), in
/// its kind's colour, labelled with its kind.
fn draw_faults(
    chart: &mut TimeChart,
    faults: &[FaultWindow],
    end_s: f64,
    (bottom, top): (f64, f64),
) -> Result<(), String> {
    let kinds: Vec<String> = {
        let mut kinds: Vec<String> = faults.iter().map(|f| f.kind.clone()).collect();
        kinds.sort();
        kinds.dedup();
        kinds
    };
    for fault in faults {
        let end = fault.end_s.unwrap_or(end_s);
        let colour = colour_of(&fault.kind, &kinds);
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(fault.start_s, bottom), (end, top)],
                colour.mix(0.6).filled(),
            )))
            .map_err(|e| e.to_string())?;
        chart
            .draw_series(std::iter::once(Text::new(
                fault.kind.clone(),
                (fault.start_s, top - (top - bottom) * 0.03),
                ("sans-serif", 11).into_font(),
            )))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Marks each leader change with a vertical line labelled with the new
/// leader's node.
fn draw_leader_changes(
    chart: &mut TimeChart,
    leader_changes: &[(f64, u64)],
    (bottom, top): (f64, f64),
) -> Result<(), String> {
    for (at, leader) in leader_changes {
        chart
            .draw_series(LineSeries::new(
                [(*at, bottom), (*at, top)],
                BLACK.mix(0.5).stroke_width(1),
            ))
            .map_err(|e| e.to_string())?;
        chart
            .draw_series(std::iter::once(Text::new(
                format!("n{leader}"),
                (*at, top - (top - bottom) * 0.1),
                ("sans-serif", 10).into_font(),
            )))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Draws the lines, each with its legend entry.
fn draw_lines(chart: &mut TimeChart, lines: &[Line<'_>], log_scale: bool) -> Result<(), String> {
    for (name, colour, points) in lines {
        let colour = *colour;
        chart
            .draw_series(LineSeries::new(
                points.iter().map(|&(x, y)| (x, scaled(y, log_scale))),
                colour.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?
            .label(*name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], colour.stroke_width(2)));
    }
    Ok(())
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The self-contained HTML report.
pub fn html(
    events: &[Event],
    figures: &Figures,
    summary: &str,
    verdict: Verdict,
) -> Result<String, String> {
    let (throughput, latency) = charts(events, figures)?;
    let rows = fault_rows(&figures.faults);
    let colour = match verdict {
        Verdict::Valid => "#2e7d32",
        Verdict::Invalid => "#c62828",
        Verdict::Unknown => "#ef6c00",
    };
    Ok(format!(
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>oncekv jepsen-like run, seed {seed}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 1200px; }}
pre {{ background: #f5f5f5; padding: 1em; white-space: pre-wrap; }}
.verdict {{ color: white; background: {colour}; padding: 0.3em 0.8em; border-radius: 4px; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: 0.2em 0.6em; }}
</style></head><body>
<h1>oncekv jepsen-like run, seed {seed} <span class="verdict">{verdict:?}</span></h1>
<p>Shaded: fault windows (labelled by kind). Vertical lines: a new leader seen by the monitor (labelled with its node).</p>
{throughput}
{latency}
<h2>Figures</h2>
<pre>{summary}</pre>
<h2>Faults</h2>
<table><tr><th>kind</th><th>nodes</th><th>start (s)</th><th>healed (s)</th></tr>
{rows}</table>
</body></html>
"#,
        seed = figures.seed,
        summary = escape(summary),
    ))
}

/// The two charts of the report, throughput and latency, over the
/// workload: faults after it (the final restarts) are in the table only.
fn charts(events: &[Event], figures: &Figures) -> Result<(String, String), String> {
    let end_s = figures.duration_s;
    let series = series(events, end_s);
    let leader_changes: Vec<(f64, u64)> = events
        .iter()
        .filter_map(|e| match e.op {
            Op::LeaderChange { leader, .. } => Some((seconds(e.time_ns), leader)),
            _ => None,
        })
        .filter(|(at, _)| *at <= end_s)
        .collect();
    let faults: Vec<FaultWindow> = figures
        .faults
        .iter()
        .filter(|f| f.start_s < end_s)
        .map(|f| FaultWindow {
            end_s: Some(f.end_s.unwrap_or(end_s).min(end_s)),
            ..f.clone()
        })
        .collect();
    let max_of = |points: &[(f64, f64)]| points.iter().map(|p| p.1).fold(0.0, f64::max);
    let throughput = chart(
        &format!(
            "Acknowledged writes per second ({} s buckets)",
            series.bucket_s
        ),
        "ops/s",
        end_s,
        max_of(&series.ok_per_s) * 1.15,
        false,
        &faults,
        &leader_changes,
        &[("ok/s", RGBColor(25, 118, 210), &series.ok_per_s)],
    )?;
    let latency = chart(
        "Latency of acknowledged writes, invoke to ok (ms, log scale)",
        "ms",
        end_s,
        max_of(&series.max_ms) * 1.5,
        true,
        &faults,
        &leader_changes,
        &[
            ("p50", RGBColor(56, 142, 60), &series.p50_ms),
            ("p99", RGBColor(245, 124, 0), &series.p99_ms),
            ("max", RGBColor(211, 47, 47), &series.max_ms),
        ],
    )?;
    Ok((throughput, latency))
}

/// The faults table's rows, one per fault (those after the workload too).
fn fault_rows(faults: &[FaultWindow]) -> String {
    let mut rows = String::new();
    for fault in faults {
        let _ = writeln!(
            rows,
            "<tr><td>{}</td><td>{:?}</td><td>{:.2}</td><td>{}</td></tr>",
            escape(&fault.kind),
            fault.nodes,
            fault.start_s,
            fault
                .end_s
                .map_or("never".to_string(), |end| format!("{end:.2}")),
        );
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let samples = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&samples, 0.5), 2.0);
        assert_eq!(percentile(&samples, 0.99), 4.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    /// The HTML report is self-contained: inline SVG, no external links.
    #[test]
    fn html_report_inlines_its_svg() {
        let invoke = Event::invoke(
            1_000_000,
            Process::Client(1),
            1,
            Op::Append {
                key: "k".into(),
                value: "c1-s1".into(),
            },
        );
        let mut ok = Event::complete(&invoke, EventType::Ok, 3_000_000);
        ok.reply = Some(history::Reply::Appended { length: 1 });
        let fault = Event::invoke(
            2_000_000_000,
            Process::Nemesis,
            1,
            Op::Fault {
                kind: "kill-leader".into(),
                nodes: vec![1],
            },
        );
        let healed = Event::complete(&fault, EventType::Info, 3_000_000_000);
        let events = [invoke, ok, fault, healed];
        let exercise = crate::checker::exercise(&events, 1);
        let figures = figures(1, 1, &events, &exercise, 4_000_000_000, 0);
        assert_eq!(figures.faults_by_kind.get("kill-leader"), Some(&1));
        let html = html(&events, &figures, "summary <ok>", Verdict::Unknown).unwrap();
        assert!(html.contains("<svg"), "inline SVG");
        assert!(html.contains("summary &lt;ok&gt;"));
        assert!(!html.contains("src=\"http"), "no external resources");
    }
}
