//! The claims workload (rule 20): workers claim jobs — a few job keys open
//! at a time, so that they contend — perform the job's effect on a fenced
//! sink, and complete with a result, or release on a simulated failure.
//! Some holders are killed (they abandon the key with no further call:
//! before the effect, between the effect and the complete, while
//! heartbeating) and some paused (they sleep past their lease, then go on
//! with their old fence). The sink is a task of its own standing for the
//! downstream system: it refuses a fence lower than the highest it has
//! accepted for the key and records every write it was asked for in the
//! history (process `sink`). Lost claim replies come from the nodes'
//! reply-drop fault: [`drop_claim_replies`] holds the other writers off for
//! a moment while a leader drops the next replies, so that those are claim
//! replies. Every call is recorded as an invoke and one completion; what to
//! make of them is the checker's business (`checker::claims`). This module
//! must not judge a history, nor skip recording a call it made.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use oncekv_client::{ClaimAnswer, Client, ClientConfig, Error};
use oncekv_wire::proto::{self, Reason};
use oncekv_wire::status::error_detail;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, sleep};

use crate::admin::Admin;
use crate::cluster::Cluster;
use crate::history::{Event, EventType, HolderPlan, Op, Process, Recorder, Reply};
use crate::workload::{CALL_TIMEOUT, Context, KEY_CONFLICT, Raw};

/// Job keys open at a time: the workers pick among them, so they contend.
pub const JOBS_OPEN: usize = 2;
/// Every job is claimed with this fingerprint (one effect per job).
pub const FINGERPRINT: &[u8] = b"jepsen job effect";
/// The error text of a call refused as FENCED.
pub const FENCED: &str = "FENCED";
/// Deadline of one attempt of a claims worker's calls: shorter than the
/// workload's, so that a claim whose reply was lost is retried (and
/// answered with its own win) well within its lease.
pub const CLAIM_ATTEMPT_TIMEOUT: Duration = Duration::from_millis(700);
/// The longest the quiet phase at the end waits for the open jobs to be
/// completed.
pub const DRAIN_MAX: Duration = Duration::from_secs(30);
/// The nemesis operation ids of the lost-claim-reply episodes start here
/// (apart from the schedule's and the final restarts').
pub const DROP_EPISODE_OP_IDS: u64 = 1_000_000;
/// The fault kind of a lost-claim-reply episode in the history.
pub const DROP_CLAIM_REPLIES: &str = "drop-claim-replies";

/// The job key of job `job`.
pub fn job_key(job: u64) -> String {
    format!("job-{job}")
}

/// The result a holder records: names the key, its fence, attempt and
/// worker, so that a replayed result shows whose it is.
pub fn result_text(key: &str, fence: u64, attempt: u64, worker: u64) -> String {
    format!("{key} fence {fence} attempt {attempt} worker {worker}")
}

/// The fence a result made by [`result_text`] names.
pub fn result_fence(result: &str) -> Option<u64> {
    let mut words = result.split(' ');
    while let Some(word) = words.next() {
        if word == "fence" {
            return words.next()?.parse().ok();
        }
    }
    None
}

/// The jobs: which are open, and whether the quiet phase has begun (no
/// new jobs; the workers finish the open ones and stop).
#[derive(Debug, Default)]
pub struct Jobs {
    inner: Mutex<JobsInner>,
}

#[derive(Debug, Default)]
struct JobsInner {
    next: u64,
    open: Vec<u64>,
    draining: bool,
}

impl Jobs {
    /// An open job, chosen by `rng`, opening new ones up to [`JOBS_OPEN`]
    /// unless draining; `None` when none is open.
    fn pick(&self, rng: &mut ChaCha8Rng) -> Option<u64> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        while !inner.draining && inner.open.len() < JOBS_OPEN {
            inner.next += 1;
            let job = inner.next;
            inner.open.push(job);
        }
        inner.open.choose(rng).copied()
    }

    /// `job` is known completed.
    fn done(&self, job: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.open.retain(|open| *open != job);
    }

    /// The quiet phase begins: no new jobs.
    pub fn drain(&self) {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .draining = true;
    }

    pub fn draining(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .draining
    }

    /// Jobs still open.
    pub fn open(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .open
            .len()
    }
}

/// One write asked of the sink.
struct SinkRequest {
    key: String,
    fence: u64,
    attempt: u64,
    worker: u64,
    accepted: oneshot::Sender<bool>,
}

/// The fenced sink's handle: cheap to clone; the sink task ends when every
/// handle is gone.
#[derive(Clone)]
pub struct Sink {
    requests: mpsc::Sender<SinkRequest>,
}

impl Sink {
    /// Starts the sink task, which records every write in `recorder`.
    pub fn spawn(recorder: Recorder) -> (Sink, tokio::task::JoinHandle<()>) {
        let (requests, mut incoming) = mpsc::channel::<SinkRequest>(64);
        let task = tokio::spawn(async move {
            // The highest fence accepted per key.
            let mut highest: BTreeMap<String, u64> = BTreeMap::new();
            let mut op_id = 0;
            while let Some(request) = incoming.recv().await {
                op_id += 1;
                let invoke = Event::invoke(
                    0,
                    Process::Sink,
                    op_id,
                    Op::SinkWrite {
                        key: request.key.clone(),
                        fence: request.fence,
                        attempt: request.attempt,
                        worker: request.worker,
                    },
                );
                recorder.record(invoke.clone());
                let top = highest.entry(request.key).or_insert(0);
                let accepted = request.fence >= *top;
                let mut done;
                if accepted {
                    *top = request.fence;
                    done = Event::complete(&invoke, EventType::Ok, 0);
                } else {
                    done = Event::complete(&invoke, EventType::Fail, 0);
                    done.error = Some(format!("stale fence: {} accepted before", *top));
                }
                recorder.record(done);
                let _ = request.accepted.send(accepted);
            }
        });
        (Sink { requests }, task)
    }

    /// Asks the sink to perform the effect of (`key`, `fence`, `attempt`)
    /// for `worker`: whether it accepted it (false also when the sink is
    /// gone).
    async fn write(&self, key: &str, fence: u64, attempt: u64, worker: u64) -> bool {
        let (accepted, answer) = oneshot::channel();
        let request = SinkRequest {
            key: key.to_string(),
            fence,
            attempt,
            worker,
            accepted,
        };
        if self.requests.send(request).await.is_err() {
            return false;
        }
        answer.await.unwrap_or(false)
    }
}

/// What the claims workers share.
#[derive(Clone)]
pub struct Claims {
    pub jobs: Arc<Jobs>,
    pub sink: Sink,
    /// The lease every claim asks for.
    pub lease: Duration,
}

/// How a complete, release or extend ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CallEnd {
    Ok,
    Fenced,
    /// Refused for another reason, or not sent.
    Failed,
    Unknown,
}

/// Runs one claims worker until there is no open job left in the quiet
/// phase, or it is told to stop; returns its number of operations.
pub async fn run_claims_worker(context: Context, claims: Claims, client_number: u64) -> u64 {
    let mut endpoints = context.endpoints.clone();
    if !endpoints.is_empty() {
        let turn = (client_number % endpoints.len() as u64) as usize;
        endpoints.rotate_left(turn);
    }
    let raw = match Raw::new(endpoints.clone(), &context.credentials(client_number)) {
        Ok(raw) => raw,
        Err(error) => {
            eprintln!("claims worker: {error:#}");
            return 0;
        }
    };
    let client = Client::with_config(
        endpoints,
        ClientConfig {
            call_timeout: CALL_TIMEOUT,
            attempt_timeout: CLAIM_ATTEMPT_TIMEOUT,
            credentials: context.credentials(client_number),
            ..ClientConfig::default()
        },
    );
    let mut worker = Worker {
        rng: context.rng(client_number),
        context,
        claims,
        client,
        raw,
        number: client_number,
        op_id: 0,
    };
    worker.run().await;
    worker.client.close().await;
    worker.op_id
}

/// A claim whose outcome is not known yet: claimed again with the same id.
struct Pending {
    job: u64,
    claim_id: u128,
    plan: HolderPlan,
}

struct Worker {
    context: Context,
    claims: Claims,
    client: Client,
    raw: Raw,
    rng: ChaCha8Rng,
    number: u64,
    op_id: u64,
}

impl Worker {
    async fn run(&mut self) {
        let mut pending: Option<Pending> = None;
        while !self.context.stopped() {
            let Pending {
                job,
                claim_id,
                plan,
            } = match pending.take() {
                Some(pending) => pending,
                None => match self.claims.jobs.pick(&mut self.rng) {
                    Some(job) => Pending {
                        job,
                        claim_id: self.rng.r#gen(),
                        plan: self.draw_plan(),
                    },
                    None if self.claims.jobs.draining() => return,
                    None => {
                        sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                },
            };
            let key = job_key(job);
            match self.claim(&key, claim_id, plan).await {
                Ok(ClaimAnswer::Won { fence, attempt, .. }) => {
                    if self.hold(&key, fence, attempt, plan).await {
                        self.claims.jobs.done(job);
                    }
                }
                Ok(ClaimAnswer::InProgress { retry_after_ms, .. }) => {
                    let jitter = self.rng.gen_range(0..30);
                    sleep(Duration::from_millis(retry_after_ms.min(1_000) + jitter)).await;
                }
                Ok(ClaimAnswer::Completed { .. }) => self.claims.jobs.done(job),
                // Sent and not answered, or not sent: the same claim again.
                Err(Error::KeyOutcomeUnknown { .. } | Error::Unavailable(_)) => {
                    pending = Some(Pending {
                        job,
                        claim_id,
                        plan,
                    });
                    sleep(Duration::from_millis(50)).await;
                }
                Err(_) => sleep(Duration::from_millis(50)).await,
            }
            sleep(Duration::from_millis(self.rng.gen_range(0..30))).await;
        }
    }

    /// What to do with the next key won: in the quiet phase only the plans
    /// that complete; otherwise killed and paused holders among them.
    fn draw_plan(&mut self) -> HolderPlan {
        if self.claims.jobs.draining() {
            return if self.rng.gen_ratio(1, 4) {
                HolderPlan::Heartbeat
            } else {
                HolderPlan::Complete
            };
        }
        const PLANS: [(HolderPlan, u32); 9] = [
            (HolderPlan::Complete, 35),
            (HolderPlan::Heartbeat, 10),
            (HolderPlan::Fail, 10),
            (HolderPlan::KilledBefore, 6),
            (HolderPlan::KilledAfterEffect, 6),
            (HolderPlan::KilledHeartbeating, 5),
            (HolderPlan::PausedBefore, 9),
            (HolderPlan::PausedAfterEffect, 11),
            (HolderPlan::PausedHeartbeating, 8),
        ];
        let total: u32 = PLANS.iter().map(|(_, weight)| weight).sum();
        let mut draw = self.rng.gen_range(0..total);
        for (plan, weight) in PLANS {
            if draw < weight {
                return plan;
            }
            draw -= weight;
        }
        HolderPlan::Complete
    }

    fn effect_time(&mut self) -> Duration {
        Duration::from_millis(self.rng.gen_range(50..500))
    }

    /// Past the lease: a paused holder's sleep.
    fn pause_time(&mut self) -> Duration {
        self.claims.lease + Duration::from_millis(self.rng.gen_range(50..400))
    }

    fn heartbeat_every(&self) -> Duration {
        self.claims.lease / 3
    }

    /// Holds the key won with `fence` as `plan` says; true when this
    /// holder's complete was acknowledged.
    async fn hold(&mut self, key: &str, fence: u64, attempt: u64, plan: HolderPlan) -> bool {
        match plan {
            HolderPlan::Complete => {
                sleep(self.effect_time()).await;
                self.effect_and_record(key, fence, attempt).await
            }
            HolderPlan::Heartbeat => {
                let beats = self.rng.gen_range(2..=3);
                if !self.heartbeat(key, fence, beats).await {
                    return false;
                }
                self.effect_and_record(key, fence, attempt).await
            }
            HolderPlan::Fail => {
                sleep(Duration::from_millis(self.rng.gen_range(10..100))).await;
                self.release(key, fence).await;
                false
            }
            HolderPlan::KilledBefore => false,
            HolderPlan::KilledAfterEffect => {
                sleep(self.effect_time()).await;
                self.effect(key, fence, attempt).await;
                false
            }
            HolderPlan::KilledHeartbeating => {
                let beats = self.rng.gen_range(1..=2);
                self.heartbeat(key, fence, beats).await;
                false
            }
            HolderPlan::PausedBefore => {
                sleep(self.pause_time()).await;
                self.effect_and_record(key, fence, attempt).await
            }
            HolderPlan::PausedAfterEffect => {
                sleep(self.effect_time()).await;
                let accepted = self.effect(key, fence, attempt).await;
                sleep(self.pause_time()).await;
                self.record(key, fence, attempt, accepted).await
            }
            HolderPlan::PausedHeartbeating => {
                let beats = self.rng.gen_range(1..=2);
                if !self.heartbeat(key, fence, beats).await {
                    return false;
                }
                sleep(self.pause_time()).await;
                // Back from the pause: a heartbeat first; a holder told it
                // was fenced stops, as `Client::once`'s effect would.
                if matches!(
                    self.extend(key, fence).await,
                    CallEnd::Fenced | CallEnd::Failed
                ) {
                    return false;
                }
                self.effect_and_record(key, fence, attempt).await
            }
        }
    }

    /// `beats` heartbeats a third of the lease apart; false when one was
    /// FENCED (the holder stops) or the worker was told to stop.
    async fn heartbeat(&mut self, key: &str, fence: u64, beats: u32) -> bool {
        for _ in 0..beats {
            sleep(self.heartbeat_every()).await;
            if self.context.stopped() || self.extend(key, fence).await == CallEnd::Fenced {
                return false;
            }
        }
        true
    }

    /// The effect on the sink, then the complete (or a release when the
    /// sink refused it: the effect did not happen).
    async fn effect_and_record(&mut self, key: &str, fence: u64, attempt: u64) -> bool {
        let accepted = self.effect(key, fence, attempt).await;
        self.record(key, fence, attempt, accepted).await
    }

    async fn effect(&mut self, key: &str, fence: u64, attempt: u64) -> bool {
        if self.context.stopped() {
            return false;
        }
        self.claims
            .sink
            .write(key, fence, attempt, self.number)
            .await
    }

    async fn record(&mut self, key: &str, fence: u64, attempt: u64, accepted: bool) -> bool {
        if accepted {
            let result = result_text(key, fence, attempt, self.number);
            self.complete(key, fence, &result).await == CallEnd::Ok
        } else {
            self.release(key, fence).await;
            false
        }
    }

    fn process(&self) -> Process {
        Process::Client(self.number)
    }

    /// Records the invoke of `op`; returns it.
    fn invoke(&mut self, op: Op) -> Event {
        self.op_id += 1;
        let invoke = Event::invoke(0, self.process(), self.op_id, op);
        self.context.recorder.record(invoke.clone());
        invoke
    }

    async fn claim(
        &mut self,
        key: &str,
        claim_id: u128,
        plan: HolderPlan,
    ) -> Result<ClaimAnswer, Error> {
        let lease_ms = millis(self.claims.lease);
        let invoke = self.invoke(Op::Claim {
            key: key.to_string(),
            claim_id: format!("{claim_id:032x}"),
            lease_ms,
            plan,
        });
        let result = self
            .client
            .claim_as(key.as_bytes(), FINGERPRINT, self.claims.lease, claim_id)
            .await;
        let mut done = match &result {
            Ok(answer) => {
                let mut done = Event::complete(&invoke, EventType::Ok, 0);
                done.reply = Some(claim_reply(answer));
                done.duplicate = matches!(
                    answer,
                    ClaimAnswer::Won {
                        duplicate: true,
                        ..
                    }
                );
                done
            }
            Err(error) => failure(&invoke, error),
        };
        done.attempts = 1;
        self.context.recorder.record(done);
        result
    }

    async fn complete(&mut self, key: &str, fence: u64, result: &str) -> CallEnd {
        if self.context.stopped() {
            return CallEnd::Failed;
        }
        let invoke = self.invoke(Op::CompleteClaim {
            key: key.to_string(),
            fence,
            result: result.to_string(),
        });
        let answer = self
            .client
            .complete_claim(key.as_bytes(), fence, result.as_bytes())
            .await;
        let (done, end) = match answer {
            Ok(completed_ms) => {
                let mut done = Event::complete(&invoke, EventType::Ok, 0);
                done.reply = Some(Reply::ClaimRecorded { completed_ms });
                (done, CallEnd::Ok)
            }
            Err(error) => (failure(&invoke, &error), end_of(&error)),
        };
        self.context.recorder.record(done);
        end
    }

    async fn release(&mut self, key: &str, fence: u64) -> CallEnd {
        if self.context.stopped() {
            return CallEnd::Failed;
        }
        let invoke = self.invoke(Op::ReleaseClaim {
            key: key.to_string(),
            fence,
        });
        let answer = self.client.release_claim(key.as_bytes(), fence).await;
        let (done, end) = match answer {
            Ok(()) => (Event::complete(&invoke, EventType::Ok, 0), CallEnd::Ok),
            Err(error) => (failure(&invoke, &error), end_of(&error)),
        };
        self.context.recorder.record(done);
        end
    }

    /// A heartbeat through the raw RPC (its reply carries the new lease
    /// deadline and the cluster time, which the library's does not return).
    async fn extend(&mut self, key: &str, fence: u64) -> CallEnd {
        if self.context.stopped() {
            return CallEnd::Failed;
        }
        let lease_ms = millis(self.claims.lease);
        let invoke = self.invoke(Op::ExtendClaim {
            key: key.to_string(),
            fence,
            lease_ms,
        });
        let cluster_id = match self.raw.cluster_id().await {
            Ok(id) => id,
            Err(error) => {
                let mut done = Event::complete(&invoke, EventType::Fail, 0);
                done.error = Some(format!("not sent: {error:#}"));
                self.context.recorder.record(done);
                return CallEnd::Failed;
            }
        };
        let request = proto::ExtendClaimRequest {
            cluster_id,
            key: key.as_bytes().to_vec(),
            fence,
            lease_ms,
        };
        let (result, attempts) = self
            .raw
            .call(Instant::now() + CALL_TIMEOUT, |mut client| {
                let request = request.clone();
                async move { client.extend_claim(request).await.map(|r| r.into_inner()) }
            })
            .await;
        let (mut done, end) = match result {
            Ok(reply) => {
                let mut done = Event::complete(&invoke, EventType::Ok, 0);
                done.reply = Some(Reply::ClaimExtended {
                    lease_deadline_ms: reply.lease_deadline_ms,
                    cluster_time_ms: reply.cluster_time_ms,
                });
                (done, CallEnd::Ok)
            }
            Err(status) => {
                let reason = error_detail(&status).map(|detail| detail.reason());
                let (kind, end, error) = match reason {
                    Some(Reason::Fenced) => (EventType::Fail, CallEnd::Fenced, FENCED.to_string()),
                    // A final refusal of the first attempt: nothing ran.
                    Some(
                        Reason::InvalidArgument | Reason::WrongCluster | Reason::LimitExceeded,
                    ) if attempts <= 1 => (
                        EventType::Fail,
                        CallEnd::Failed,
                        status.message().to_string(),
                    ),
                    _ => (
                        EventType::Info,
                        CallEnd::Unknown,
                        format!("{:?}: {}", status.code(), status.message()),
                    ),
                };
                let mut done = Event::complete(&invoke, kind, 0);
                done.error = Some(error);
                (done, end)
            }
        };
        done.attempts = attempts;
        self.context.recorder.record(done);
        end
    }
}

/// The history's reply of a claim answer.
fn claim_reply(answer: &ClaimAnswer) -> Reply {
    match answer {
        ClaimAnswer::Won {
            fence,
            attempt,
            lease_deadline_ms,
            cluster_time_ms,
            ..
        } => Reply::ClaimWon {
            fence: *fence,
            attempt: *attempt,
            lease_deadline_ms: *lease_deadline_ms,
            cluster_time_ms: *cluster_time_ms,
        },
        ClaimAnswer::InProgress {
            retry_after_ms,
            attempt,
        } => Reply::ClaimInProgress {
            retry_after_ms: *retry_after_ms,
            attempt: *attempt,
        },
        ClaimAnswer::Completed {
            result,
            completed_ms,
            fence,
            attempt,
        } => Reply::ClaimCompleted {
            result: String::from_utf8_lossy(result).into_owned(),
            completed_ms: *completed_ms,
            fence: *fence,
            attempt: *attempt,
        },
    }
}

/// The completion of a claim call that returned `error`: unknown when it
/// was sent and not answered, else failed (FENCED and KEY_CONFLICT by
/// their names).
fn failure(invoke: &Event, error: &Error) -> Event {
    let kind = match error {
        Error::KeyOutcomeUnknown { .. } => EventType::Info,
        _ => EventType::Fail,
    };
    let mut done = Event::complete(invoke, kind, 0);
    done.attempts = 1;
    done.error = Some(match error {
        Error::Fenced { .. } => FENCED.to_string(),
        Error::KeyConflict { .. } => KEY_CONFLICT.to_string(),
        other => other.to_string(),
    });
    done
}

fn end_of(error: &Error) -> CallEnd {
    match error {
        Error::Fenced { .. } => CallEnd::Fenced,
        Error::KeyOutcomeUnknown { .. } => CallEnd::Unknown,
        _ => CallEnd::Failed,
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Pause between two lost-claim-reply episodes (jittered by a quarter).
pub const DROP_EPISODE_EVERY: Duration = Duration::from_secs(4);
/// How long an episode waits for the other writers' calls in flight to
/// end before it gives up this time.
const DROP_EPISODE_GATE_WAIT: Duration = Duration::from_secs(1);
/// How long an episode holds the other writers off while the claims
/// consume the drops.
const DROP_EPISODE_MAX: Duration = Duration::from_secs(2);

/// Lost claim replies, until the quiet phase: every few seconds the other
/// writers are held off at the writers' gate (their calls in flight end
/// first), the leader is told to drop its next one or two replies, and the
/// claims workers' next calls that change something (a win, a complete, a
/// release) lose their replies; the library retries them with the same
/// request and must get its own answer back. Each episode is a nemesis
/// operation `drop-claim-replies` in the history. Returns the number of
/// episodes.
pub async fn drop_claim_replies(
    seed: u64,
    cluster: Arc<Cluster>,
    admin: Admin,
    context: Context,
    jobs: Arc<Jobs>,
    episodes: Arc<AtomicU64>,
) -> u64 {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x636c_6169_6d73);
    sleep(crate::faults::WARM_UP).await;
    let mut op_id = DROP_EPISODE_OP_IDS;
    loop {
        let quarter = DROP_EPISODE_EVERY / 4;
        let pause = DROP_EPISODE_EVERY - quarter + quarter.mul_f64(2.0 * rng.r#gen::<f64>());
        let until = Instant::now() + pause;
        while Instant::now() < until && !jobs.draining() && !context.stopped() {
            sleep(Duration::from_millis(100)).await;
        }
        if jobs.draining() || context.stopped() {
            return op_id - DROP_EPISODE_OP_IDS;
        }
        let count = rng.gen_range(1..=2);
        // The other writers' calls end first; new ones wait.
        let Ok(held) = tokio::time::timeout(DROP_EPISODE_GATE_WAIT, context.writers.write()).await
        else {
            continue;
        };
        let Ok(leader) = cluster.wait_for_leader(Duration::from_secs(1)).await else {
            continue;
        };
        op_id += 1;
        let invoke = Event::invoke(
            0,
            Process::Nemesis,
            op_id,
            Op::Fault {
                kind: DROP_CLAIM_REPLIES.to_string(),
                nodes: vec![leader],
            },
        );
        context.recorder.record(invoke.clone());
        if admin.drop_replies(leader, count).await.is_ok() {
            let give_up = Instant::now() + DROP_EPISODE_MAX;
            while Instant::now() < give_up {
                sleep(Duration::from_millis(20)).await;
                match admin.drop_replies(leader, 0).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        }
        drop(held);
        context
            .recorder
            .record(Event::complete(&invoke, EventType::Info, 0));
        episodes.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A result names its fence, and the fence reads back from it.
    #[test]
    fn results_name_their_fence() {
        let result = result_text("job-3", 41, 2, 12);
        assert_eq!(result, "job-3 fence 41 attempt 2 worker 12");
        assert_eq!(result_fence(&result), Some(41));
        assert_eq!(result_fence("job-3 attempt 2"), None);
    }

    /// The open jobs stay at [`JOBS_OPEN`] until the quiet phase; then
    /// only the open ones are handed out, until each is done.
    #[test]
    fn jobs_open_a_few_at_a_time_and_drain() {
        let jobs = Jobs::default();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for _ in 0..10 {
            assert!(jobs.pick(&mut rng).is_some_and(|job| job <= 2));
        }
        assert_eq!(jobs.open(), JOBS_OPEN);
        jobs.done(1);
        assert!(jobs.pick(&mut rng).is_some());
        assert_eq!(jobs.open(), JOBS_OPEN);
        jobs.drain();
        jobs.done(2);
        jobs.done(3);
        assert_eq!(jobs.pick(&mut rng), None);
        assert_eq!(jobs.open(), 0);
    }
}
