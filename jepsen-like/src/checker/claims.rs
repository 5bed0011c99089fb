//! The claims checks (rule 20): what the claims workload's history (its
//! claims, completes, releases and extends, and the fenced sink's log)
//! must show, job key by job key. Pure, like the rest of the checker; it
//! owns what "a claim makes an outside effect happen once" means here.
//!
//! A *win* is a fence answered `Won` (fresh, or again to a retry of the
//! same claim id). Every bound below uses only what the answers prove: a
//! lease's deadline is the largest one acknowledged for its fence (by its
//! wins and extends — a lower bound of the truth), a win's start the least
//! cluster time any of its answers carried (an upper bound of the truth).
//!
//! - *claim fence violations*: one fence won by two claims, or with two
//!   attempt counts; attempts that do not grow with the fences; a win
//!   acknowledged before another's claim began holding the larger fence.
//! - *claim lease violations*: a takeover won at a cluster time before the
//!   deadline of an earlier fence's lease (unless that holder released the
//!   key before); a fresh win whose lease is not the one asked for.
//! - *claim fences not enforced*: a complete acknowledged for a fence below
//!   one that won the key (anywhere in the history: once the larger fence
//!   won, the smaller can never complete; had it completed first, nothing
//!   could win after); an extend or release acknowledged for a fence below
//!   one whose win was acknowledged before the call began. This is what a
//!   server that skips the fence check shows.
//! - *claim result violations*: two completes acknowledged with different
//!   fences or results; a replay unlike them or unlike another replay, or
//!   naming a fence its result does not; a fence won above the completed
//!   one; a claim begun after a completion was acknowledged answered with
//!   anything but the recorded result.
//! - *claim sink violations*: the sink accepted two effects of one fence,
//!   or a fence below one it had accepted, or refused one it had to
//!   accept; a write naming no win (fence, attempt, worker); a completed
//!   job whose last accepted effect is not the completing holder's.
//! - *claim FENCED unjustified*: a FENCED answer with nothing in the
//!   history that could have superseded the fence (a larger win or a claim
//!   of unknown outcome begun before the answer, or the holder's own
//!   earlier release or complete).
//! - *claims stuck* (liveness): a job that was claimed and never completed
//!   — the workers keep claiming every open job through a quiet phase at
//!   the end, so a job left open means a key no one could win or finish.

use std::collections::{BTreeMap, BTreeSet};

use super::Findings;
use crate::claims::{FENCED, result_fence};
use crate::history::{EventType, HolderPlan, Op, Operation, Process, Reply};

/// Everything the history holds about one job key.
#[derive(Default)]
struct Job<'a> {
    claims: Vec<&'a Operation>,
    completes: Vec<&'a Operation>,
    releases: Vec<&'a Operation>,
    extends: Vec<&'a Operation>,
    /// The sink's writes of the key, in the sink's order.
    sink: Vec<&'a Operation>,
}

/// What the answers say of one fence's win.
#[derive(Clone, Debug)]
struct Win<'a> {
    fence: u64,
    attempt: u64,
    claim_id: &'a str,
    worker: Process,
    /// The earliest invoke of a claim with its claim id: the win was
    /// applied after it.
    claimed_ns: u64,
    /// The earliest acknowledgement of it: applied before.
    acked_ns: u64,
    /// The least cluster time its answers carried.
    start_ms: u64,
    /// The largest lease deadline acknowledged for it (wins and extends).
    deadline_ms: u64,
}

/// A `Won` answer: (fence, attempt, lease deadline, cluster time).
fn won(operation: &Operation) -> Option<(u64, u64, u64, u64)> {
    let done = operation.completion.as_ref()?;
    match (done.kind, &done.reply) {
        (
            EventType::Ok,
            Some(Reply::ClaimWon {
                fence,
                attempt,
                lease_deadline_ms,
                cluster_time_ms,
            }),
        ) => Some((*fence, *attempt, *lease_deadline_ms, *cluster_time_ms)),
        _ => None,
    }
}

/// A `Completed` answer: (result, fence, attempt, acknowledged at).
fn replayed(operation: &Operation) -> Option<(&str, u64, u64, u64)> {
    let done = operation.completion.as_ref()?;
    match (done.kind, &done.reply) {
        (
            EventType::Ok,
            Some(Reply::ClaimCompleted {
                result,
                fence,
                attempt,
                ..
            }),
        ) => Some((result.as_str(), *fence, *attempt, done.time_ns)),
        _ => None,
    }
}

fn fenced(operation: &Operation) -> bool {
    operation
        .completion
        .as_ref()
        .is_some_and(|done| done.kind == EventType::Fail && done.error.as_deref() == Some(FENCED))
}

fn acked(operation: &Operation) -> bool {
    operation.outcome() == EventType::Ok
}

fn unknown(operation: &Operation) -> bool {
    matches!(operation.outcome(), EventType::Info | EventType::Invoke)
}

/// The fence a complete, release or extend names.
fn fence_of(operation: &Operation) -> u64 {
    match &operation.op {
        Op::CompleteClaim { fence, .. }
        | Op::ReleaseClaim { fence, .. }
        | Op::ExtendClaim { fence, .. }
        | Op::SinkWrite { fence, .. } => *fence,
        _ => 0,
    }
}

fn jobs(operations: &[Operation]) -> BTreeMap<&str, Job<'_>> {
    let mut jobs: BTreeMap<&str, Job> = BTreeMap::new();
    for operation in operations {
        let (key, list) = match &operation.op {
            Op::Claim { key, .. } => (key, 0),
            Op::CompleteClaim { key, .. } => (key, 1),
            Op::ReleaseClaim { key, .. } => (key, 2),
            Op::ExtendClaim { key, .. } => (key, 3),
            Op::SinkWrite { key, .. } => (key, 4),
            _ => continue,
        };
        let job = jobs.entry(key).or_default();
        match list {
            0 => job.claims.push(operation),
            1 => job.completes.push(operation),
            2 => job.releases.push(operation),
            3 => job.extends.push(operation),
            _ => job.sink.push(operation),
        }
    }
    jobs
}

/// Runs every claims check on `operations`.
pub(super) fn check_claims(operations: &[Operation], findings: &mut Findings) {
    for (key, job) in jobs(operations) {
        let wins = wins(key, &job, findings);
        check_fence_order(key, &wins, findings);
        check_leases(key, &job, &wins, findings);
        check_fences_enforced(key, &job, &wins, findings);
        let completed = check_results(key, &job, &wins, findings);
        check_sink(key, &job, &wins, completed, findings);
        check_fenced_justified(key, &job, &wins, findings);
        if !job.claims.is_empty() && completed.is_none() {
            findings.safety.claims_stuck += 1;
            findings.problem(format!(
                "job {key} was claimed {} times and never completed",
                job.claims.len()
            ));
        }
    }
}

/// The wins of one key by fence; flags a fence won by two claims or with
/// two attempts, and an extend of a fence nobody won.
fn wins<'a>(key: &str, job: &Job<'a>, findings: &mut Findings) -> BTreeMap<u64, Win<'a>> {
    let mut first_invoke: BTreeMap<&str, u64> = BTreeMap::new();
    for claim in &job.claims {
        if let Op::Claim { claim_id, .. } = &claim.op {
            let earliest = first_invoke.entry(claim_id).or_insert(claim.invoke_ns);
            *earliest = (*earliest).min(claim.invoke_ns);
        }
    }
    let mut wins: BTreeMap<u64, Win> = BTreeMap::new();
    for claim in &job.claims {
        let (Op::Claim { claim_id, .. }, Some((fence, attempt, deadline_ms, start_ms))) =
            (&claim.op, won(claim))
        else {
            continue;
        };
        let acked_ns = claim.complete_ns();
        match wins.get_mut(&fence) {
            None => {
                wins.insert(
                    fence,
                    Win {
                        fence,
                        attempt,
                        claim_id,
                        worker: claim.process,
                        claimed_ns: first_invoke[claim_id.as_str()],
                        acked_ns,
                        start_ms,
                        deadline_ms,
                    },
                );
            }
            Some(win) if win.claim_id != claim_id || win.attempt != attempt => {
                findings.safety.claim_fence_violations += 1;
                findings.problem(format!(
                    "job {key}: fence {fence} won by claim {} (attempt {}) and by claim {claim_id} \
                     (attempt {attempt})",
                    win.claim_id, win.attempt
                ));
            }
            Some(win) => {
                win.acked_ns = win.acked_ns.min(acked_ns);
                win.start_ms = win.start_ms.min(start_ms);
                win.deadline_ms = win.deadline_ms.max(deadline_ms);
            }
        }
    }
    for extend in &job.extends {
        let Some(Reply::ClaimExtended {
            lease_deadline_ms, ..
        }) = extend
            .completion
            .as_ref()
            .filter(|done| done.kind == EventType::Ok)
            .and_then(|done| done.reply.as_ref())
        else {
            continue;
        };
        match wins.get_mut(&fence_of(extend)) {
            Some(win) => win.deadline_ms = win.deadline_ms.max(*lease_deadline_ms),
            None => {
                findings.safety.claim_fence_violations += 1;
                findings.problem(format!(
                    "job {key}: an extend of fence {} was acknowledged but no claim won it",
                    fence_of(extend)
                ));
            }
        }
    }
    wins
}

/// Fences grow with the order of the wins: attempts grow with the fences,
/// and a win acknowledged before another's claim began has the smaller
/// fence.
fn check_fence_order(key: &str, wins: &BTreeMap<u64, Win>, findings: &mut Findings) {
    let sorted: Vec<&Win> = wins.values().collect();
    for pair in sorted.windows(2) {
        if pair[0].attempt >= pair[1].attempt {
            findings.safety.claim_fence_violations += 1;
            findings.problem(format!(
                "job {key}: fence {} has attempt {} but the larger fence {} attempt {}",
                pair[0].fence, pair[0].attempt, pair[1].fence, pair[1].attempt
            ));
        }
    }
    for earlier in &sorted {
        for later in &sorted {
            if later.fence > earlier.fence && later.acked_ns < earlier.claimed_ns {
                findings.safety.claim_fence_violations += 1;
                findings.problem(format!(
                    "job {key}: fence {} was won (acknowledged) before the claim that won fence {} \
                     began: fences must grow",
                    later.fence, earlier.fence
                ));
            }
        }
    }
}

/// No two holders' leases overlap in cluster time: a win's start is at or
/// after the deadline of every smaller fence's lease, unless that holder
/// may have released the key before the win; a fresh win's lease is the
/// one asked for.
fn check_leases(key: &str, job: &Job, wins: &BTreeMap<u64, Win>, findings: &mut Findings) {
    for later in wins.values() {
        for earlier in wins.values().take_while(|w| w.fence < later.fence) {
            let released = job
                .releases
                .iter()
                .any(|r| fence_of(r) == earlier.fence && r.invoke_ns < later.acked_ns);
            if !released && later.start_ms < earlier.deadline_ms {
                findings.safety.claim_lease_violations += 1;
                findings.problem(format!(
                    "job {key}: fence {} won at cluster time {} ms while fence {}'s lease ran to \
                     {} ms",
                    later.fence, later.start_ms, earlier.fence, earlier.deadline_ms
                ));
            }
        }
    }
    for claim in &job.claims {
        let (Op::Claim { lease_ms, .. }, Some((fence, _, deadline_ms, start_ms))) =
            (&claim.op, won(claim))
        else {
            continue;
        };
        let fresh = claim
            .completion
            .as_ref()
            .is_some_and(|done| !done.duplicate);
        if fresh && deadline_ms != start_ms.saturating_add(*lease_ms) {
            findings.safety.claim_lease_violations += 1;
            findings.problem(format!(
                "job {key}: fence {fence} won at {start_ms} ms with a deadline of {deadline_ms} ms \
                 for a lease of {lease_ms} ms"
            ));
        }
    }
}

/// FENCED where the history requires it: no complete of a superseded
/// fence, no extend or release of a fence superseded before the call.
fn check_fences_enforced(key: &str, job: &Job, wins: &BTreeMap<u64, Win>, findings: &mut Findings) {
    for complete in job.completes.iter().filter(|c| acked(c)) {
        let fence = fence_of(complete);
        if let Some(later) = wins.range(fence + 1..).next_back().map(|(_, w)| w) {
            findings.safety.claim_fences_not_enforced += 1;
            findings.problem(format!(
                "job {key}: the complete of fence {fence} ({:?} op {}) was acknowledged, but fence \
                 {} won the key: it had to be FENCED",
                complete.process, complete.op_id, later.fence
            ));
        }
    }
    for call in job.releases.iter().chain(&job.extends).filter(|c| acked(c)) {
        let fence = fence_of(call);
        if let Some(later) = wins
            .range(fence + 1..)
            .map(|(_, w)| w)
            .find(|w| w.acked_ns < call.invoke_ns)
        {
            findings.safety.claim_fences_not_enforced += 1;
            findings.problem(format!(
                "job {key}: {:?} op {} ({}) of fence {fence} was acknowledged, but fence {} had won \
                 the key before it began: it had to be FENCED",
                call.process,
                call.op_id,
                if matches!(call.op, Op::ReleaseClaim { .. }) {
                    "a release"
                } else {
                    "an extend"
                },
                later.fence
            ));
        }
    }
}

/// One completion, replayed the same by every later claim; returns the
/// completed fence (none: the job was never known completed).
fn check_results(
    key: &str,
    job: &Job,
    wins: &BTreeMap<u64, Win>,
    findings: &mut Findings,
) -> Option<u64> {
    // (fence, result, acknowledged at) of every acknowledged completion:
    // the completes and the replays.
    let mut recorded: Vec<(u64, &str, u64, &'static str)> = Vec::new();
    for complete in job.completes.iter().filter(|c| acked(c)) {
        if let Op::CompleteClaim { fence, result, .. } = &complete.op {
            recorded.push((*fence, result, complete.complete_ns(), "completed"));
        }
    }
    for claim in &job.claims {
        let Some((result, fence, attempt, at)) = replayed(claim) else {
            continue;
        };
        recorded.push((fence, result, at, "replayed"));
        if result_fence(result) != Some(fence)
            || wins.get(&fence).is_some_and(|w| w.attempt != attempt)
        {
            findings.safety.claim_result_violations += 1;
            findings.problem(format!(
                "job {key}: a claim replayed {result:?} as the result of fence {fence} attempt \
                 {attempt}"
            ));
        }
    }
    let (first_fence, first_result, _, _) = *recorded.first()?;
    let distinct: BTreeSet<(u64, &str)> = recorded.iter().map(|(f, r, _, _)| (*f, *r)).collect();
    if distinct.len() > 1 {
        findings.safety.claim_result_violations += 1;
        findings.problem(format!(
            "job {key}: completed or replayed as {} different results: {:?}",
            distinct.len(),
            distinct
        ));
    }
    let completed_ns = recorded.iter().map(|(_, _, at, _)| *at).min()?;
    let fence = first_fence;
    if let Some((later, _)) = wins.range(fence + 1..).next() {
        findings.safety.claim_result_violations += 1;
        findings.problem(format!(
            "job {key}: fence {later} won after fence {fence} completed (its result {first_result:?})"
        ));
    }
    for claim in &job.claims {
        if claim.invoke_ns <= completed_ns {
            continue;
        }
        let answer = claim
            .completion
            .as_ref()
            .filter(|done| done.kind == EventType::Ok)
            .and_then(|done| done.reply.as_ref());
        if let Some(reply @ (Reply::ClaimWon { .. } | Reply::ClaimInProgress { .. })) = answer {
            findings.safety.claim_result_violations += 1;
            findings.problem(format!(
                "job {key}: a claim begun after the job's completion was acknowledged was answered \
                 {reply:?}"
            ));
        }
    }
    Some(fence)
}

/// The sink's log of one key against the wins and the completion.
fn check_sink(
    key: &str,
    job: &Job,
    wins: &BTreeMap<u64, Win>,
    completed: Option<u64>,
    findings: &mut Findings,
) {
    let mut highest: Option<u64> = None;
    let mut accepted: BTreeSet<u64> = BTreeSet::new();
    for write in &job.sink {
        let Op::SinkWrite {
            fence,
            attempt,
            worker,
            ..
        } = &write.op
        else {
            continue;
        };
        let named = wins
            .get(fence)
            .is_some_and(|w| w.attempt == *attempt && w.worker == Process::Client(*worker));
        if !named {
            findings.safety.claim_sink_violations += 1;
            findings.problem(format!(
                "job {key}: the sink was asked for the effect of fence {fence} attempt {attempt} by \
                 worker {worker}, which won no such claim"
            ));
        }
        if acked(write) {
            if highest.is_some_and(|top| *fence < top) || !accepted.insert(*fence) {
                findings.safety.claim_sink_violations += 1;
                findings.problem(format!(
                    "job {key}: the sink accepted an effect of fence {fence} after accepting fence \
                     {}",
                    highest.unwrap_or(0)
                ));
            }
            highest = highest.max(Some(*fence));
        } else if highest.is_none_or(|top| *fence >= top) {
            findings.safety.claim_sink_violations += 1;
            findings.problem(format!(
                "job {key}: the sink refused fence {fence} although it had accepted nothing higher"
            ));
        }
    }
    if let Some(fence) = completed
        && highest != Some(fence)
    {
        findings.safety.claim_sink_violations += 1;
        findings.problem(format!(
            "job {key}: completed by fence {fence}, but the last effect the sink accepted is of \
             fence {highest:?}"
        ));
    }
}

/// Every FENCED answer has a cause in the history.
fn check_fenced_justified(
    key: &str,
    job: &Job,
    wins: &BTreeMap<u64, Win>,
    findings: &mut Findings,
) {
    let calls = job
        .completes
        .iter()
        .chain(&job.releases)
        .chain(&job.extends);
    for call in calls.clone().filter(|c| fenced(c)) {
        let fence = fence_of(call);
        let answered_ns = call.complete_ns();
        // A larger fence seen won, a claim whose outcome is unknown, or an
        // "in progress" or "completed" answer naming a later holder (an
        // attempt beyond this fence's): attempts count the key's holders,
        // so that holder took over — even when its own win was never seen
        // (its reply was lost, and its retry, applied after it was taken
        // over in turn or completed, was answered "in progress" or with the
        // record).
        let attempt = wins.get(&fence).map(|w| w.attempt);
        let superseded = wins
            .range(fence + 1..)
            .any(|(_, w)| w.claimed_ns < answered_ns)
            || job.claims.iter().any(|c| {
                c.invoke_ns < answered_ns
                    && (unknown(c) || attempt.is_some_and(|a| attempt_named(c) > Some(a)))
            });
        let own = calls.clone().any(|other| {
            !std::ptr::eq(*other, *call)
                && !matches!(other.op, Op::ExtendClaim { .. })
                && fence_of(other) == fence
                && other.invoke_ns < answered_ns
        });
        if !superseded && !own {
            findings.safety.claim_fenced_unjustified += 1;
            findings.problem(format!(
                "job {key}: {:?} op {} of fence {fence} was FENCED with no larger fence won and \
                 no release or complete of its own before",
                call.process, call.op_id
            ));
        }
    }
}

/// The holder's attempt an acknowledged "in progress" or "completed"
/// answer names.
fn attempt_named(claim: &Operation) -> Option<u64> {
    match claim.completion.as_ref() {
        Some(done) if done.kind == EventType::Ok => match done.reply {
            Some(Reply::ClaimInProgress { attempt, .. })
            | Some(Reply::ClaimCompleted { attempt, .. }) => Some(attempt),
            _ => None,
        },
        _ => None,
    }
}

/// What the claims workload exercised, counted from the history.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClaimFigures {
    /// Job keys claimed, and of them completed.
    pub jobs: u64,
    pub jobs_completed: u64,
    /// Claim calls, and their answers.
    pub claims: u64,
    /// Fresh wins (a new fence).
    pub won: u64,
    /// Wins answered again to a retry of the winning claim: a lost reply
    /// (or a leader change) and the claim's own win back.
    pub won_again: u64,
    /// Fences won with an attempt above 1 (an earlier holder existed).
    pub takeovers: u64,
    pub in_progress: u64,
    /// Claims answered with the recorded result.
    pub replays: u64,
    /// Claim calls of unknown outcome.
    pub claims_unknown: u64,
    pub completes: u64,
    pub completes_ok: u64,
    pub completes_fenced: u64,
    pub releases: u64,
    pub releases_ok: u64,
    pub releases_fenced: u64,
    pub extends: u64,
    pub extends_ok: u64,
    pub extends_fenced: u64,
    /// Completes, releases and extends of unknown outcome.
    pub calls_unknown: u64,
    /// The sink's writes accepted and refused (stale fences).
    pub sink_accepted: u64,
    pub sink_refused: u64,
    /// Wins whose holder was killed, and paused past its lease.
    pub holders_killed: u64,
    pub holders_paused: u64,
}

impl ClaimFigures {
    /// FENCED answers of every kind.
    pub fn fenced(&self) -> u64 {
        self.completes_fenced + self.releases_fenced + self.extends_fenced
    }

    /// Counts the claims workload's calls and the sink's writes.
    pub fn of(operations: &[Operation]) -> ClaimFigures {
        let mut figures = ClaimFigures::default();
        let mut fences: BTreeMap<u64, (u64, HolderPlan)> = BTreeMap::new();
        let jobs = jobs(operations);
        for job in jobs.values() {
            if job.claims.is_empty() {
                continue;
            }
            figures.jobs += 1;
            let completed = job.completes.iter().any(|c| acked(c))
                || job.claims.iter().any(|c| replayed(c).is_some());
            figures.jobs_completed += u64::from(completed);
        }
        for operation in operations {
            let done = operation.completion.as_ref();
            let duplicate = done.is_some_and(|done| done.duplicate);
            let (total, ok, fenced_count) = match &operation.op {
                Op::Claim { plan, .. } => {
                    figures.claims += 1;
                    if let Some((fence, attempt, _, _)) = won(operation) {
                        if duplicate {
                            figures.won_again += 1;
                        } else {
                            figures.won += 1;
                        }
                        fences.insert(fence, (attempt, *plan));
                    }
                    match done.and_then(|done| done.reply.as_ref()) {
                        Some(Reply::ClaimInProgress { .. }) if acked(operation) => {
                            figures.in_progress += 1;
                        }
                        Some(Reply::ClaimCompleted { .. }) if acked(operation) => {
                            figures.replays += 1;
                        }
                        _ => {}
                    }
                    figures.claims_unknown += u64::from(unknown(operation));
                    continue;
                }
                Op::CompleteClaim { .. } => (
                    &mut figures.completes,
                    &mut figures.completes_ok,
                    &mut figures.completes_fenced,
                ),
                Op::ReleaseClaim { .. } => (
                    &mut figures.releases,
                    &mut figures.releases_ok,
                    &mut figures.releases_fenced,
                ),
                Op::ExtendClaim { .. } => (
                    &mut figures.extends,
                    &mut figures.extends_ok,
                    &mut figures.extends_fenced,
                ),
                Op::SinkWrite { .. } => {
                    if acked(operation) {
                        figures.sink_accepted += 1;
                    } else {
                        figures.sink_refused += 1;
                    }
                    continue;
                }
                _ => continue,
            };
            *total += 1;
            *ok += u64::from(acked(operation));
            *fenced_count += u64::from(fenced(operation));
            figures.calls_unknown += u64::from(unknown(operation));
        }
        for (attempt, plan) in fences.values() {
            figures.takeovers += u64::from(*attempt > 1);
            figures.holders_killed += u64::from(plan.killed());
            figures.holders_paused += u64::from(plan.paused());
        }
        figures
    }

    /// Why the claims workload, when it ran, is not conclusive.
    pub fn missing(&self) -> Vec<String> {
        if self.claims == 0 {
            return Vec::new();
        }
        let mut missing = Vec::new();
        if self.jobs_completed == 0 {
            missing.push("no claimed job was completed".to_string());
        }
        if self.takeovers == 0 {
            missing.push("no claim took a key over from an earlier holder".to_string());
        }
        if self.fenced() == 0 {
            missing.push("no stale holder was answered FENCED".to_string());
        }
        missing
    }
}

#[cfg(test)]
mod tests {
    //! Hand-made claims histories: a valid one the checks must pass, and
    //! one change per violation they must catch.
    use super::*;
    use crate::checker::{Findings, Safety};
    use crate::claims::result_text;
    use crate::history::{self, Event};

    const KEY: &str = "job-1";

    /// Builds a claims history with explicit times (ms of the run, used as
    /// both the history's time and, where asked, the cluster time).
    #[derive(Default)]
    struct H {
        events: Vec<Event>,
        next_op: BTreeMap<u64, u64>,
        sink_ops: u64,
    }

    impl H {
        #[allow(clippy::too_many_arguments)] // one history event: every field of it, in order
        fn call(
            &mut self,
            worker: u64,
            at: u64,
            done_at: u64,
            op: Op,
            kind: EventType,
            reply: Option<Reply>,
            error: Option<&str>,
        ) -> &mut Self {
            let op_id = self.next_op.entry(worker).or_default();
            *op_id += 1;
            let invoke = Event::invoke(at * 1_000_000, Process::Client(worker), *op_id, op);
            let mut done = Event::complete(&invoke, kind, done_at * 1_000_000);
            done.reply = reply;
            done.error = error.map(str::to_string);
            self.events.push(invoke);
            self.events.push(done);
            self
        }

        fn claim_op(claim_id: &str, plan: HolderPlan) -> Op {
            Op::Claim {
                key: KEY.into(),
                claim_id: claim_id.into(),
                lease_ms: 100,
                plan,
            }
        }

        /// A fresh win of `fence` (attempt `attempt`) at cluster time `at`
        /// with a lease of 100 ms, answered at `at + 1`.
        fn win(
            &mut self,
            worker: u64,
            claim_id: &str,
            at: u64,
            fence: u64,
            attempt: u64,
        ) -> &mut Self {
            self.call(
                worker,
                at,
                at + 1,
                H::claim_op(claim_id, HolderPlan::Complete),
                EventType::Ok,
                Some(Reply::ClaimWon {
                    fence,
                    attempt,
                    lease_deadline_ms: at + 100,
                    cluster_time_ms: at,
                }),
                None,
            )
        }

        fn in_progress(&mut self, worker: u64, claim_id: &str, at: u64) -> &mut Self {
            self.call(
                worker,
                at,
                at + 1,
                H::claim_op(claim_id, HolderPlan::Complete),
                EventType::Ok,
                Some(Reply::ClaimInProgress {
                    retry_after_ms: 50,
                    attempt: 1,
                }),
                None,
            )
        }

        fn replay(
            &mut self,
            worker: u64,
            claim_id: &str,
            at: u64,
            fence: u64,
            attempt: u64,
            by: u64,
        ) -> &mut Self {
            self.call(
                worker,
                at,
                at + 1,
                H::claim_op(claim_id, HolderPlan::Complete),
                EventType::Ok,
                Some(Reply::ClaimCompleted {
                    result: result_text(KEY, fence, attempt, by),
                    completed_ms: at,
                    fence,
                    attempt,
                }),
                None,
            )
        }

        fn complete(
            &mut self,
            worker: u64,
            at: u64,
            fence: u64,
            attempt: u64,
            kind: EventType,
        ) -> &mut Self {
            let op = Op::CompleteClaim {
                key: KEY.into(),
                fence,
                result: result_text(KEY, fence, attempt, worker),
            };
            let (reply, error) = match kind {
                EventType::Ok => (Some(Reply::ClaimRecorded { completed_ms: at }), None),
                EventType::Fail => (None, Some(FENCED)),
                _ => (None, Some("unknown")),
            };
            self.call(worker, at, at + 1, op, kind, reply, error)
        }

        fn release(&mut self, worker: u64, at: u64, fence: u64, kind: EventType) -> &mut Self {
            let op = Op::ReleaseClaim {
                key: KEY.into(),
                fence,
            };
            let error = (kind == EventType::Fail).then_some(FENCED);
            self.call(worker, at, at + 1, op, kind, None, error)
        }

        fn extend(&mut self, worker: u64, at: u64, fence: u64, deadline: u64) -> &mut Self {
            let op = Op::ExtendClaim {
                key: KEY.into(),
                fence,
                lease_ms: 100,
            };
            let reply = Reply::ClaimExtended {
                lease_deadline_ms: deadline,
                cluster_time_ms: at,
            };
            self.call(worker, at, at + 1, op, EventType::Ok, Some(reply), None)
        }

        /// The sink's answer to `worker`'s effect of (`fence`, `attempt`).
        fn sink(
            &mut self,
            at: u64,
            worker: u64,
            fence: u64,
            attempt: u64,
            accepted: bool,
        ) -> &mut Self {
            self.sink_ops += 1;
            let invoke = Event::invoke(
                at * 1_000_000,
                Process::Sink,
                self.sink_ops,
                Op::SinkWrite {
                    key: KEY.into(),
                    fence,
                    attempt,
                    worker,
                },
            );
            let kind = if accepted {
                EventType::Ok
            } else {
                EventType::Fail
            };
            let done = Event::complete(&invoke, kind, at * 1_000_000);
            self.events.push(invoke);
            self.events.push(done);
            self
        }

        fn check(&self) -> Findings {
            let operations = history::pair(&self.events).expect("paired");
            let mut findings = Findings::default();
            check_claims(&operations, &mut findings);
            findings
        }
    }

    /// Worker 1 wins fence 10, writes, and is paused past its lease;
    /// worker 2 is told "in progress", then takes over with fence 20
    /// (attempt 2) after the lease, heartbeats, writes and completes;
    /// worker 1's stale write is refused and its complete FENCED; worker 3
    /// gets the result replayed.
    fn valid() -> H {
        let mut h = H::default();
        h.win(1, "a", 0, 10, 1)
            .sink(20, 1, 10, 1, true)
            .in_progress(2, "b", 30)
            .extend(1, 40, 10, 140)
            .win(2, "c", 150, 20, 2)
            .extend(2, 180, 20, 280)
            .sink(200, 2, 20, 2, true)
            .sink(210, 1, 10, 1, false)
            .complete(2, 220, 20, 2, EventType::Ok)
            .complete(1, 230, 10, 1, EventType::Fail)
            .replay(3, "d", 240, 20, 2, 2);
        h
    }

    fn safety(h: &H) -> Safety {
        h.check().safety
    }

    /// The valid history passes, and its figures count what it exercised.
    #[test]
    fn a_valid_claims_history_passes() {
        let h = valid();
        let findings = h.check();
        assert_eq!(
            findings.safety,
            Safety::default(),
            "{:?}",
            findings.problems
        );
        let figures = ClaimFigures::of(&history::pair(&h.events).unwrap());
        assert_eq!(
            (
                figures.jobs,
                figures.jobs_completed,
                figures.won,
                figures.takeovers
            ),
            (1, 1, 2, 1)
        );
        assert_eq!((figures.replays, figures.in_progress), (1, 1));
        assert_eq!(
            (
                figures.completes_ok,
                figures.completes_fenced,
                figures.fenced()
            ),
            (1, 1, 1)
        );
        assert_eq!((figures.sink_accepted, figures.sink_refused), (2, 1));
        assert!(figures.missing().is_empty(), "{:?}", figures.missing());
    }

    /// What the server without the fence check does: the stale holder's
    /// complete acknowledged after the takeover; its result then replays.
    #[test]
    fn a_stale_complete_acknowledged_is_caught() {
        let mut h = H::default();
        h.win(1, "a", 0, 10, 1)
            .sink(20, 1, 10, 1, true)
            .win(2, "c", 150, 20, 2)
            .complete(1, 170, 10, 1, EventType::Ok)
            .sink(200, 2, 20, 2, true)
            .complete(2, 220, 20, 2, EventType::Ok)
            .replay(3, "d", 240, 20, 2, 1);
        let s = safety(&h);
        assert!(s.claim_fences_not_enforced >= 1, "{s:?}");
        assert!(s.claim_result_violations >= 1, "{s:?}");
        assert!(s.claim_sink_violations >= 1, "{s:?}");
    }

    /// A takeover before the earlier lease's (extended) deadline overlaps
    /// it; after a release of that holder it does not.
    #[test]
    fn overlapping_leases_are_caught_unless_released() {
        let mut h = H::default();
        h.win(1, "a", 0, 10, 1)
            .extend(1, 50, 10, 150)
            .win(2, "c", 120, 20, 2);
        assert_eq!(safety(&h).claim_lease_violations, 1);
        let mut h = H::default();
        h.win(1, "a", 0, 10, 1)
            .release(1, 40, 10, EventType::Ok)
            .win(2, "c", 60, 20, 2)
            .sink(70, 2, 20, 2, true)
            .complete(2, 80, 20, 2, EventType::Ok);
        assert_eq!(safety(&h), Safety::default());
    }

    /// An extend or release acknowledged for a fence superseded before it
    /// began had to be FENCED.
    #[test]
    fn stale_extends_and_releases_acknowledged_are_caught() {
        let mut h = valid();
        h.extend(1, 300, 10, 400);
        assert_eq!(safety(&h).claim_fences_not_enforced, 1);
        let mut h = valid();
        h.release(1, 300, 10, EventType::Ok);
        assert_eq!(safety(&h).claim_fences_not_enforced, 1);
    }

    /// Fences and attempts must grow with the order of the wins, and one
    /// fence belongs to one claim.
    #[test]
    fn fences_out_of_order_are_caught() {
        let mut h = H::default();
        h.win(1, "a", 0, 20, 1).win(2, "c", 150, 10, 2);
        assert!(safety(&h).claim_fence_violations >= 1);
        let mut h = H::default();
        h.win(1, "a", 0, 10, 2).win(2, "c", 150, 20, 2);
        assert!(safety(&h).claim_fence_violations >= 1);
        let mut h = H::default();
        h.win(1, "a", 0, 10, 1).win(2, "c", 150, 10, 1);
        assert!(safety(&h).claim_fence_violations >= 1);
    }

    /// After a completion, a claim must replay the same result: a win, an
    /// "in progress" or another result are caught.
    #[test]
    fn answers_after_a_completion_are_caught() {
        let mut h = valid();
        h.in_progress(4, "e", 300);
        assert_eq!(safety(&h).claim_result_violations, 1);
        let mut h = valid();
        h.replay(4, "e", 300, 20, 2, 4);
        assert_eq!(safety(&h).claim_result_violations, 1);
        let mut h = valid();
        h.win(4, "e", 300, 30, 3);
        assert!(safety(&h).claim_result_violations >= 1);
    }

    /// The sink must refuse lower fences, accept one effect per fence, and
    /// hear only of fences won.
    #[test]
    fn sink_violations_are_caught() {
        let mut h = valid();
        h.sink(300, 1, 10, 1, true);
        assert!(safety(&h).claim_sink_violations >= 1);
        let mut h = valid();
        h.sink(300, 2, 20, 2, true);
        assert_eq!(safety(&h).claim_sink_violations, 1);
        let mut h = valid();
        h.sink(300, 3, 20, 2, false);
        assert_eq!(safety(&h).claim_sink_violations, 2);
    }

    /// A job claimed and never completed is stuck; a FENCED answer with no
    /// cause is unjustified.
    #[test]
    fn stuck_jobs_and_unjustified_fenced_are_caught() {
        let mut h = H::default();
        h.win(1, "a", 0, 10, 1).sink(20, 1, 10, 1, true);
        let s = safety(&h);
        assert_eq!((s.claims_stuck, s.total()), (1, 1));
        h.complete(1, 30, 10, 1, EventType::Fail);
        assert_eq!(safety(&h).claim_fenced_unjustified, 1);
        // A claim of unknown outcome begun before it may have taken over.
        let mut h = H::default();
        h.win(1, "a", 0, 10, 1)
            .call(
                2,
                150,
                160,
                H::claim_op("c", HolderPlan::Complete),
                EventType::Info,
                None,
                Some("unknown"),
            )
            .complete(1, 170, 10, 1, EventType::Fail);
        let s = safety(&h);
        assert_eq!((s.claim_fenced_unjustified, s.claims_stuck), (0, 1));
        // So does the holder an "in progress" answer names when its attempt
        // is beyond the fenced one's (seed 3 of a long run: that holder's
        // win reply was lost, and its retry came after it was taken over
        // in turn, so its win is nowhere in the history) — but not one
        // naming the fenced holder's own attempt.
        //
        // Likewise a claim begun before the FENCED answer and answered
        // after it with the key's record, completed by a later attempt
        // (seed 12 of a long run: that claim won attempt 2 in a reply that
        // was lost; the key was taken over again and completed by attempt
        // 3 before its retry came) — but not a record of the fenced
        // holder's own attempt.
        let in_progress = |attempt| Reply::ClaimInProgress {
            retry_after_ms: 50,
            attempt,
        };
        let completed = |attempt| Reply::ClaimCompleted {
            result: result_text(KEY, 30, attempt, 4),
            completed_ms: 390,
            fence: 30,
            attempt,
        };
        let cases = [
            (in_progress(2), 160, 0),
            (in_progress(1), 160, 1),
            (completed(3), 400, 0),
            (completed(1), 400, 1),
        ];
        for (reply, answered_at, unjustified) in cases {
            let mut h = H::default();
            h.win(1, "a", 0, 10, 1)
                .call(
                    3,
                    150,
                    answered_at,
                    H::claim_op("d", HolderPlan::Complete),
                    EventType::Ok,
                    Some(reply.clone()),
                    None,
                )
                .complete(1, 170, 10, 1, EventType::Fail);
            assert_eq!(
                safety(&h).claim_fenced_unjustified,
                unjustified,
                "{reply:?}"
            );
        }
    }

    /// A run with claims but no takeover or no FENCED answer is reported
    /// as not exercised.
    #[test]
    fn claims_without_takeovers_or_fenced_are_not_exercised() {
        let mut h = H::default();
        h.win(1, "a", 0, 10, 1)
            .sink(20, 1, 10, 1, true)
            .complete(1, 30, 10, 1, EventType::Ok);
        assert_eq!(safety(&h), Safety::default());
        let missing = ClaimFigures::of(&history::pair(&h.events).unwrap()).missing();
        assert_eq!(missing.len(), 2, "{missing:?}");
    }
}
