//! The client tasks: appenders of unique values to a few hot lists,
//! incrementers of shared counters, readers of both (linearizable `get`s),
//! a session-lifecycle client that speaks the raw protocol to provoke
//! duplicates, discarded and conflicting seqs and expired sessions, and
//! keyed producers that use no session at all: idempotency keys through
//! `Client::execute_with_key` (rule 18), each key retried with the same
//! command until its outcome is known, some repeated on purpose after their
//! acknowledgement and some reused with another command. Every
//! operation is recorded as an invoke and exactly one completion; what to
//! make of them is the checker's business. Each task's operation stream
//! comes from its own RNG seeded from the run's seed, so the same seed gives
//! the same operations (except which list set a reader reads: the one the
//! appenders are writing at that moment).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use oncekv_client::credentials::{AuthChannel, Credentials};
use oncekv_client::policy::{CallError, Follower};
use oncekv_client::retry::Backoff;
use oncekv_client::{AttemptEvent, AttemptObserver, AttemptOutcome, Client, ClientConfig, Error};
use oncekv_core::{Command, CommandResult, Value};
use oncekv_wire::proto::{self, Reason, client_client::ClientClient};
use oncekv_wire::{convert, status::error_detail};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::history::{
    self, Event, EventType, Expect, KeyedCommand, KeyedIntent, Op, Process, Recorder, Reply,
};
use crate::pki::RunCredentials;

/// Appenders write to this many hot lists at a time.
pub const HOT_LISTS: u64 = 3;
/// Every this many operations an appender moves on to the next set of hot
/// lists, so that no list reaches the registry's value size limit (64 KiB
/// by default: about 6,000 short elements). By operation count, not time,
/// so that the same seed gives the same operations.
pub const OPS_PER_LIST_EPOCH: u64 = 1_500;
/// The counters incrementers add to.
pub const COUNTER_KEYS: [&str; 2] = ["counter-0", "counter-1"];
/// The list the lifecycle client appends to (a cycle adds two elements).
pub const LIFECYCLE_KEY: &str = "life";

/// The list an appender's `op_id`-th operation writes to, given a draw.
pub fn list_key(op_id: u64, draw: u64) -> String {
    format!("list-{}-{}", op_id / OPS_PER_LIST_EPOCH, draw % HOT_LISTS)
}

/// The counters keyed producers add to (apart from the session
/// workload's, so that each workload's checks see only its own writes).
pub const KEYED_COUNTER_KEYS: [&str; 2] = ["keyed-counter-0", "keyed-counter-1"];
/// Keyed producers append to this many lists at a time.
pub const KEYED_LISTS: u64 = 2;
/// Pause between two keyed operations of one producer, at most: the keyed
/// workload runs beside the others at a modest rate.
pub const KEYED_PAUSE_MAX: Duration = Duration::from_millis(20);
/// One acknowledged key in this many is sent again on purpose (a
/// duplicate), and one in this many reused with another command (a
/// conflict).
pub const KEYED_REPEAT_ONE_IN: u32 = 4;
pub const KEYED_CONFLICT_ONE_IN: u32 = 5;

/// The list a keyed producer's `n`-th key appends to, given a draw
/// (rotated by count like the appenders' lists).
pub fn keyed_list_key(n: u64, draw: u64) -> String {
    format!(
        "keyed-list-{}-{}",
        n / OPS_PER_LIST_EPOCH,
        draw % KEYED_LISTS
    )
}

/// A TTL at most this long is idled out in every lifecycle cycle.
pub const SHORT_TTL: Duration = Duration::from_secs(5);
/// Overall deadline of one call, retries included.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Deadline of one attempt (a lost reply is retried after it).
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(1_500);

/// The impatient clients' deadline of one call, retries included: shorter
/// than a failover or a paused leader, so the faults outlast it and the
/// call ends with its outcome unknown (fenced by the library) — the path
/// the patient clients, whose deadline outlasts every fault, never take.
pub const IMPATIENT_CALL_TIMEOUT: Duration = Duration::from_millis(600);
/// The impatient clients' deadline of one attempt.
pub const IMPATIENT_ATTEMPT_TIMEOUT: Duration = Duration::from_millis(250);
/// One session client (appender or incrementer) in this many, and one
/// keyed producer in this many, is impatient (the first of each kind is).
pub const IMPATIENT_ONE_IN: u64 = 3;

/// The (call, attempt) deadlines of a client: impatient for one in
/// [`IMPATIENT_ONE_IN`] of its kind (`index` counts from 0 within it).
pub fn deadlines(index: u64) -> (Duration, Duration) {
    if index.is_multiple_of(IMPATIENT_ONE_IN) {
        (IMPATIENT_CALL_TIMEOUT, IMPATIENT_ATTEMPT_TIMEOUT)
    } else {
        (CALL_TIMEOUT, ATTEMPT_TIMEOUT)
    }
}

/// Every key the history's operations touched, in order.
pub fn keys_of(events: &[Event]) -> Vec<String> {
    let keys: std::collections::BTreeSet<&String> = events
        .iter()
        .filter_map(|event| match &event.op {
            Op::Append { key, .. }
            | Op::Increment { key, .. }
            | Op::Lifecycle { key, .. }
            | Op::Keyed { key, .. }
            | Op::Read { key } => Some(key),
            _ => None,
        })
        .collect();
    keys.into_iter().cloned().collect()
}

/// Live counts for the progress line (writes; reads apart).
#[derive(Debug, Default)]
pub struct Counts {
    pub ok: AtomicU64,
    pub fail: AtomicU64,
    pub info: AtomicU64,
    pub reads_ok: AtomicU64,
    pub reads_failed: AtomicU64,
    /// Keyed calls answered (apart: they do not pace the nemesis).
    pub keyed_ok: AtomicU64,
    pub keyed_not_ok: AtomicU64,
}

impl Counts {
    fn count(&self, kind: EventType) {
        let counter = match kind {
            EventType::Ok => &self.ok,
            EventType::Fail => &self.fail,
            _ => &self.info,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// What every task shares.
#[derive(Clone)]
pub struct Context {
    pub seed: u64,
    pub endpoints: Vec<String>,
    pub recorder: Recorder,
    pub counts: Arc<Counts>,
    pub stop: watch::Receiver<bool>,
    /// The registry's current session TTL (the short-TTL phase changes it).
    pub session_ttl: watch::Receiver<Duration>,
    /// The run has a short-TTL phase (else the lifecycle client idles out
    /// the normal TTL now and then).
    pub short_ttl_phase: bool,
    /// The highest list epoch an appender has reached (see [`list_key`]):
    /// readers read the lists being written.
    pub list_epoch: Arc<AtomicU64>,
    /// What each client shows the nodes (TLS and a principal's token or
    /// certificate on a TLS cluster; nothing otherwise).
    pub credentials: Arc<RunCredentials>,
    /// The writers' gate: every write of the session, lifecycle and keyed
    /// workloads holds it shared while it is in flight, so that the claims'
    /// lost-reply episodes (`crate::claims::drop_claim_replies`) can hold
    /// them off for a moment and the replies a node drops then are claim
    /// replies. Reads never take it (they consume no dropped reply).
    pub writers: Arc<tokio::sync::RwLock<()>>,
}

impl Context {
    pub(crate) fn rng(&self, client: u64) -> ChaCha8Rng {
        ChaCha8Rng::seed_from_u64(self.seed.wrapping_mul(1_000_003).wrapping_add(client))
    }

    pub(crate) fn stopped(&self) -> bool {
        *self.stop.borrow()
    }

    pub(crate) fn credentials(&self, client: u64) -> Credentials {
        self.credentials.client(client)
    }
}

/// The kind of a library-driven client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Appender,
    Incrementer,
}

/// Runs one closed-loop client (one operation at a time) through the
/// client library until told to stop; returns its number of operations.
/// `index` (from 0 among the clients of its role) picks its deadlines
/// ([`deadlines`]).
pub async fn run_client(context: Context, client_number: u64, role: Role, index: u64) -> u64 {
    let mut rng = context.rng(client_number);
    let attempts: Arc<Mutex<Vec<AttemptEvent>>> = Arc::default();
    let seen = attempts.clone();
    let (call_timeout, attempt_timeout) = deadlines(index);
    let client = Client::with_config(
        context.endpoints.clone(),
        ClientConfig {
            call_timeout,
            attempt_timeout,
            observer: Some(AttemptObserver::new(move |event| {
                seen.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(event.clone());
            })),
            credentials: context.credentials(client_number),
            ..ClientConfig::default()
        },
    );
    let process = Process::Client(client_number);
    let mut op_id = 0;
    while !context.stopped() {
        op_id += 1;
        let (op, command) = match role {
            Role::Appender => {
                context
                    .list_epoch
                    .fetch_max(op_id / OPS_PER_LIST_EPOCH, Ordering::Relaxed);
                let key = list_key(op_id, rng.r#gen());
                let value = format!("c{client_number}-s{op_id}");
                (
                    Op::Append {
                        key: key.to_string(),
                        value: value.clone(),
                    },
                    Command::Append {
                        key: key.as_bytes().to_vec(),
                        element: value.into_bytes(),
                    },
                )
            }
            Role::Incrementer => {
                let key = COUNTER_KEYS[rng.gen_range(0..COUNTER_KEYS.len())];
                let delta = rng.gen_range(1..=100);
                (
                    Op::Increment {
                        key: key.to_string(),
                        delta,
                    },
                    Command::Increment {
                        key: key.as_bytes().to_vec(),
                        delta,
                    },
                )
            }
        };
        attempts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        let writing = context.writers.read().await;
        let invoke = Event::invoke(0, process, op_id, op);
        context.recorder.record(invoke.clone());
        let result = client.execute(command).await;
        drop(writing);
        let seen = std::mem::take(&mut *attempts.lock().unwrap_or_else(PoisonError::into_inner));
        let done = completion(&invoke, result, &seen);
        context.counts.count(done.kind);
        let failed = done.kind != EventType::Ok;
        context.recorder.record(done);
        if failed {
            // Do not spin when failures come back at once.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    client.close().await;
    op_id
}

/// Pause between two reads of one reader, at most: reads are cheap for
/// the cluster but each list read is recorded, so unpaced readers would
/// crowd the history and the 2-core machine.
pub const READ_PAUSE_MAX: Duration = Duration::from_millis(10);

/// Runs one closed-loop reader (one `get` at a time, a short random pause
/// between) through the client library until told to stop; returns its
/// number of operations. Each read picks, from the reader's own RNG, a
/// counter or one of the hot lists the appenders are writing now. The
/// reader's endpoint list is rotated by its number, so that readers start
/// at different nodes: a node that answers a read it must refuse (a
/// follower without the read index) gets asked.
pub async fn run_reader(context: Context, client_number: u64) -> u64 {
    let mut rng = context.rng(client_number);
    let client = rotated_client(&context, client_number, (CALL_TIMEOUT, ATTEMPT_TIMEOUT));
    let process = Process::Client(client_number);
    // The last list each key was read as, to record the next read of it
    // as a difference (`Reply::ReadList`).
    let mut last: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let mut op_id = 0;
    while !context.stopped() {
        op_id += 1;
        let key = read_key(&context, &mut rng);
        let invoke = Event::invoke(0, process, op_id, Op::Read { key: key.clone() });
        context.recorder.record(invoke.clone());
        let result = client.get(key.as_bytes()).await;
        let done = read_completion(&context, &invoke, &key, result, &mut last);
        let failed = done.kind != EventType::Ok;
        context.recorder.record(done);
        let pause = if failed {
            Duration::from_millis(20)
        } else {
            READ_PAUSE_MAX.mul_f64(rng.r#gen::<f64>())
        };
        tokio::time::sleep(pause).await;
    }
    client.close().await;
    op_id
}

/// A client (of a reader or a keyed producer) whose endpoint list is
/// rotated by its number, so that such clients start at different nodes,
/// with the (call, attempt) deadlines given.
fn rotated_client(
    context: &Context,
    client_number: u64,
    (call_timeout, attempt_timeout): (Duration, Duration),
) -> Client {
    let mut endpoints = context.endpoints.clone();
    if !endpoints.is_empty() {
        let turn = (client_number % endpoints.len() as u64) as usize;
        endpoints.rotate_left(turn);
    }
    Client::with_config(
        endpoints,
        ClientConfig {
            call_timeout,
            attempt_timeout,
            credentials: context.credentials(client_number),
            ..ClientConfig::default()
        },
    )
}

/// The key of a reader's next read, drawn from its RNG: a counter, or one
/// of the hot lists of the appenders' current epoch.
fn read_key(context: &Context, rng: &mut ChaCha8Rng) -> String {
    let pick = rng.gen_range(0..(COUNTER_KEYS.len() as u64 + HOT_LISTS));
    match COUNTER_KEYS.get(pick as usize) {
        Some(counter) => counter.to_string(),
        None => format!(
            "list-{}-{}",
            context.list_epoch.load(Ordering::Relaxed),
            pick - COUNTER_KEYS.len() as u64
        ),
    }
}

/// The completion of the read `invoke` of `key`, counted: a list found
/// is recorded as a difference from `last`, the key's previous list (then
/// updated; forgotten when the key is absent).
fn read_completion(
    context: &Context,
    invoke: &Event,
    key: &str,
    result: Result<Option<Value>, Error>,
    last: &mut BTreeMap<String, Vec<String>>,
) -> Event {
    match result {
        Ok(value) => {
            let mut done = Event::complete(invoke, EventType::Ok, 0);
            done.reply = Some(match value {
                None => {
                    last.remove(key);
                    Reply::ReadAbsent
                }
                Some(Value::Int(value)) => Reply::ReadInt { value },
                Some(Value::List(items)) => {
                    let list: Vec<String> = items
                        .iter()
                        .map(|item| String::from_utf8_lossy(item).into_owned())
                        .collect();
                    let previous = last.entry(key.to_string()).or_default();
                    let reply = history::list_read_reply(previous, &list);
                    *previous = list;
                    reply
                }
                Some(Value::Bytes(bytes)) => Reply::Other {
                    text: format!("bytes {bytes:?}"),
                },
            });
            context.counts.reads_ok.fetch_add(1, Ordering::Relaxed);
            done
        }
        Err(error) => {
            // A read changes nothing: a failed one is simply failed.
            let mut done = Event::complete(invoke, EventType::Fail, 0);
            done.error = Some(error.to_string());
            context.counts.reads_failed.fetch_add(1, Ordering::Relaxed);
            done
        }
    }
}

/// How a keyed operation (all the calls of one key and command) ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeyedEnd {
    /// Answered with a result.
    Acknowledged,
    /// Refused for good (`KEY_CONFLICT`, or a final error).
    Refused,
    /// Still unknown when the workload stopped.
    Unresolved,
}

/// Runs one keyed producer until told to stop; returns its number of
/// calls. Each key `jepsen-c{client}-k{n}` carries an append of the unique
/// value `c{client}-k{n}` to a keyed list or an increment of a keyed
/// counter; every call whose outcome is unknown (or that could not be
/// sent) is followed by the same key and command again, so that the key's
/// fate becomes known unless the run ends first. After an acknowledgement,
/// now and then the same call again on purpose (it must be a duplicate
/// with the same result), and now and then the key with another command —
/// an append of `c{client}-k{n}-conflict` — which must be refused as
/// `KEY_CONFLICT` and never appear. `index` (from 0 among the keyed
/// producers) picks its deadlines ([`deadlines`]): an impatient producer's
/// calls end unknown under faults and are sent again, as a queue consumer
/// redelivers a message whose handling timed out.
pub async fn run_keyed_producer(context: Context, client_number: u64, index: u64) -> u64 {
    let mut rng = context.rng(client_number);
    let client = rotated_client(&context, client_number, deadlines(index));
    let process = Process::Client(client_number);
    let mut op_id = 0u64;
    let mut n = 0u64;
    while !context.stopped() {
        n += 1;
        let idempotency_key = format!("jepsen-c{client_number}-k{n}");
        let list = keyed_list_key(n, rng.r#gen());
        let (key, command) = if rng.gen_ratio(2, 3) {
            (
                list.clone(),
                KeyedCommand::Append {
                    value: format!("c{client_number}-k{n}"),
                },
            )
        } else {
            let key = KEYED_COUNTER_KEYS[rng.gen_range(0..KEYED_COUNTER_KEYS.len())];
            (
                key.to_string(),
                KeyedCommand::Increment {
                    delta: rng.gen_range(1..=100),
                },
            )
        };
        let mut call = KeyedCall {
            context: &context,
            client: &client,
            process,
            op_id: &mut op_id,
            idempotency_key: &idempotency_key,
        };
        let end = call.until_known(&key, &command, KeyedIntent::First).await;
        if end == KeyedEnd::Acknowledged {
            if rng.gen_ratio(1, KEYED_REPEAT_ONE_IN) {
                call.until_known(&key, &command, KeyedIntent::Repeat).await;
            }
            if rng.gen_ratio(1, KEYED_CONFLICT_ONE_IN) {
                let conflict = KeyedCommand::Append {
                    value: format!("c{client_number}-k{n}-conflict"),
                };
                call.until_known(&list, &conflict, KeyedIntent::Conflict)
                    .await;
            }
        }
        tokio::time::sleep(KEYED_PAUSE_MAX.mul_f64(rng.r#gen::<f64>())).await;
    }
    client.close().await;
    op_id
}

/// The calls of one idempotency key.
struct KeyedCall<'a> {
    context: &'a Context,
    client: &'a Client,
    process: Process,
    op_id: &'a mut u64,
    idempotency_key: &'a str,
}

impl KeyedCall<'_> {
    /// Sends `command` on `key` with the idempotency key, again and again
    /// while its outcome is unknown (or it could not be sent), until it is
    /// answered or refused for good, or the workload stops. Each call is
    /// recorded as an operation; the calls after the first are retries
    /// (conflicts stay conflicts: their command is another one).
    async fn until_known(
        &mut self,
        key: &str,
        command: &KeyedCommand,
        intent: KeyedIntent,
    ) -> KeyedEnd {
        let mut intent = intent;
        loop {
            if self.context.stopped() {
                return KeyedEnd::Unresolved;
            }
            *self.op_id += 1;
            let writing = self.context.writers.read().await;
            let invoke = Event::invoke(
                0,
                self.process,
                *self.op_id,
                Op::Keyed {
                    idempotency_key: self.idempotency_key.to_string(),
                    key: key.to_string(),
                    command: command.clone(),
                    intent,
                },
            );
            self.context.recorder.record(invoke.clone());
            let request = match command {
                KeyedCommand::Append { value } => Command::Append {
                    key: key.as_bytes().to_vec(),
                    element: value.as_bytes().to_vec(),
                },
                KeyedCommand::Increment { delta } => Command::Increment {
                    key: key.as_bytes().to_vec(),
                    delta: *delta,
                },
            };
            let result = self
                .client
                .execute_with_key(self.idempotency_key.as_bytes(), request)
                .await;
            drop(writing);
            let (done, end) = keyed_completion(&invoke, result);
            let counter = if done.kind == EventType::Ok {
                &self.context.counts.keyed_ok
            } else {
                &self.context.counts.keyed_not_ok
            };
            counter.fetch_add(1, Ordering::Relaxed);
            self.context.recorder.record(done);
            if let Some(end) = end {
                return end;
            }
            // Do not spin when failures come back at once.
            tokio::time::sleep(Duration::from_millis(50)).await;
            if intent != KeyedIntent::Conflict {
                intent = KeyedIntent::Retry;
            }
        }
    }
}

/// The completion of a keyed call, and how the key's operation ended
/// (`None`: its outcome is unknown or it was not sent; send it again).
fn keyed_completion(
    invoke: &Event,
    result: Result<oncekv_client::KeyedReply, Error>,
) -> (Event, Option<KeyedEnd>) {
    let (kind, end) = match &result {
        Ok(_) => (EventType::Ok, Some(KeyedEnd::Acknowledged)),
        // Sent, and not answered in time: it may have executed.
        Err(Error::KeyOutcomeUnknown { .. } | Error::ResourceExhausted(_)) => {
            (EventType::Info, None)
        }
        // No cluster id or no endpoint: nothing was sent.
        Err(Error::Unavailable(_)) => (EventType::Fail, None),
        Err(_) => (EventType::Fail, Some(KeyedEnd::Refused)),
    };
    let mut done = Event::complete(invoke, kind, 0);
    done.attempts = 1;
    match result {
        Ok(reply) => {
            done.reply = Some(reply_of(&reply.result));
            done.duplicate = reply.duplicate;
        }
        Err(Error::KeyConflict { .. }) => done.error = Some(KEY_CONFLICT.to_string()),
        Err(error) => done.error = Some(error.to_string()),
    }
    (done, end)
}

/// The error text of a keyed call refused as a conflict.
pub const KEY_CONFLICT: &str = "KEY_CONFLICT";

/// The completion event of a library call from its result and the
/// attempts the observer saw.
pub fn completion(
    invoke: &Event,
    result: Result<CommandResult, Error>,
    attempts: &[AttemptEvent],
) -> Event {
    let (kind, reply, error) = match result {
        Ok(result) => (EventType::Ok, Some(reply_of(&result)), None),
        Err(error) => {
            let kind = match &error {
                // Sent, and not answered in time: it may have been applied.
                Error::OutcomeUnknown { .. }
                | Error::KeyOutcomeUnknown { .. }
                | Error::PlainOutcomeUnknown { .. }
                | Error::ResourceExhausted(_) => EventType::Info,
                // Nothing was executed.
                Error::Unavailable(_)
                | Error::SessionExpired
                | Error::WrongCluster { .. }
                | Error::SeqConflict { .. }
                | Error::ResponseDiscarded { .. }
                | Error::InvalidArgument(_)
                | Error::Unauthenticated(_)
                | Error::PermissionDenied(_)
                | Error::LimitExceeded { .. }
                | Error::KeyConflict { .. }
                | Error::Fenced { .. }
                | Error::ClaimInProgress { .. } => EventType::Fail,
            };
            (kind, None, Some(error.to_string()))
        }
    };
    let mut done = Event::complete(invoke, kind, 0);
    done.reply = reply;
    done.error = error;
    done.attempts = attempts
        .iter()
        .filter(|a| a.outcome == AttemptOutcome::Started)
        .count() as u32;
    if let Some(last) = attempts.last() {
        done.session = Some(last.client_id);
        done.seq = Some(last.seq);
        done.node = Some(last.endpoint.clone());
        done.duplicate = matches!(
            last.outcome,
            AttemptOutcome::Answered {
                duplicate: true,
                ..
            }
        ) && kind == EventType::Ok;
    }
    done
}

fn reply_of(result: &CommandResult) -> Reply {
    match result {
        CommandResult::Appended { length } => Reply::Appended { length: *length },
        CommandResult::Incremented { value } => Reply::Incremented { value: *value },
        other => Reply::Other {
            text: format!("{other:?}"),
        },
    }
}

/// How a raw request ended.
enum RawOutcome {
    Answered {
        reply: Reply,
        duplicate: bool,
    },
    /// A final refusal (the registry's reason) on the given attempt (0: first).
    Refused {
        reason: Reason,
        attempt: u32,
    },
    /// No answer before the deadline.
    Unknown(String),
}

/// The pause between a raw client's attempts that no leader hint sends
/// elsewhere.
const RAW_BACKOFF: Backoff = Backoff {
    base: Duration::from_millis(50),
    cap: Duration::from_millis(50),
};

/// A minimal raw-protocol client: follows leader hints and retries the
/// same request on "this attempt" failures until its deadline — the client
/// library's one policy (`oncekv_client::policy`) — nothing more (no floors
/// or sessions of its own: the lifecycle client sets them).
pub(crate) struct Raw {
    follower: Follower,
    channels: Mutex<BTreeMap<String, ClientClient<AuthChannel>>>,
    credentials: Credentials,
    cluster_id: Vec<u8>,
}

impl Raw {
    pub(crate) fn new(endpoints: Vec<String>, credentials: &Credentials) -> anyhow::Result<Raw> {
        let raw = Raw {
            follower: Follower::new(endpoints.clone(), RAW_BACKOFF),
            channels: Mutex::new(BTreeMap::new()),
            credentials: credentials.clone(),
            cluster_id: Vec::new(),
        };
        for endpoint in &endpoints {
            raw.channel(endpoint)?;
        }
        Ok(raw)
    }

    /// The lazily connected client of `endpoint` (one channel each).
    fn channel(&self, endpoint: &str) -> Result<ClientClient<AuthChannel>, tonic::Status> {
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(client) = channels.get(endpoint) {
            return Ok(client.clone());
        }
        let client = ClientClient::new(
            self.credentials.wrap(
                self.credentials
                    .endpoint(endpoint)
                    .map_err(|error| tonic::Status::invalid_argument(error.to_string()))?
                    .connect_timeout(Duration::from_secs(1))
                    .tcp_nodelay(true)
                    .connect_lazy(),
            ),
        );
        channels.insert(endpoint.to_string(), client.clone());
        Ok(client)
    }

    /// Runs `call` on the leader until it is answered or refused for good,
    /// or `deadline` passes; returns the answer or the last status, and the
    /// number of attempts.
    pub(crate) async fn call<T, F, Fut>(
        &mut self,
        deadline: Instant,
        call: F,
    ) -> (Result<T, tonic::Status>, u32)
    where
        F: Fn(ClientClient<AuthChannel>) -> Fut,
        Fut: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        let connect = |endpoint: &str| self.channel(endpoint);
        let (result, attempts) = self
            .follower
            .call(deadline, ATTEMPT_TIMEOUT, connect, call)
            .await;
        (result.map_err(CallError::into_status), attempts)
    }

    /// Every endpoint's applied cluster time (its `Status`), asked
    /// concurrently, each within [`ATTEMPT_TIMEOUT`]; `None` for a node
    /// that did not answer.
    async fn cluster_times(&self) -> Vec<Option<u64>> {
        let endpoints: Vec<String> = self
            .channels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect();
        let asks = endpoints.iter().map(|endpoint| async move {
            let mut client = self.channel(endpoint).ok()?;
            let reply =
                tokio::time::timeout(ATTEMPT_TIMEOUT, client.status(proto::StatusRequest {}))
                    .await
                    .ok()?
                    .ok()?;
            Some(reply.into_inner().cluster_time_ms)
        });
        futures::future::join_all(asks).await
    }

    pub(crate) async fn cluster_id(&mut self) -> anyhow::Result<Vec<u8>> {
        if self.cluster_id.is_empty() {
            let deadline = Instant::now() + CALL_TIMEOUT;
            let (status, _) = self
                .call(deadline, |mut client| async move {
                    client
                        .status(proto::StatusRequest {})
                        .await
                        .map(|r| r.into_inner())
                })
                .await;
            let status = status?;
            if status.cluster_id.is_empty() {
                anyhow::bail!("the cluster id is not known yet");
            }
            self.cluster_id = status.cluster_id;
        }
        Ok(self.cluster_id.clone())
    }

    async fn register(&mut self, nonce: u128) -> anyhow::Result<u64> {
        let request = proto::RegisterRequest {
            cluster_id: self.cluster_id().await?,
            nonce: nonce.to_be_bytes().to_vec(),
        };
        let (reply, _) = self
            .call(Instant::now() + CALL_TIMEOUT, |mut client| {
                let request = request.clone();
                async move { client.register(request).await.map(|r| r.into_inner()) }
            })
            .await;
        Ok(reply?.client_id)
    }

    async fn execute(
        &mut self,
        client_id: u64,
        seq: u64,
        first_outstanding_seq: u64,
        command: &Command,
    ) -> (RawOutcome, u32, String) {
        let cluster_id = match self.cluster_id().await {
            Ok(id) => id,
            Err(error) => return (RawOutcome::Unknown(error.to_string()), 0, String::new()),
        };
        let request = proto::ExecuteRequest {
            cluster_id,
            client_id,
            seq,
            first_outstanding_seq,
            command: Some(convert::command_to_proto(command)),
        };
        let (result, attempts) = self
            .call(Instant::now() + CALL_TIMEOUT, |mut client| {
                let request = request.clone();
                async move { client.execute(request).await.map(|r| r.into_inner()) }
            })
            .await;
        let node = self.follower.target().unwrap_or_default();
        let outcome = match result {
            Ok(reply) => match convert::result_from_proto(reply.result) {
                Ok(result) => RawOutcome::Answered {
                    reply: reply_of(&result),
                    duplicate: reply.duplicate,
                },
                Err(error) => RawOutcome::Unknown(format!("undecodable reply: {error}")),
            },
            Err(status) => match error_detail(&status).map(|d| d.reason()) {
                Some(
                    reason @ (Reason::SessionExpired
                    | Reason::SeqConflict
                    | Reason::ResponseDiscarded
                    | Reason::InvalidArgument
                    | Reason::WrongCluster),
                ) => RawOutcome::Refused {
                    reason,
                    attempt: attempts - 1,
                },
                _ => RawOutcome::Unknown(status.message().to_string()),
            },
        };
        (outcome, attempts, node)
    }
}

/// The session-lifecycle client: in cycles, registers a session and sends
/// raw requests that must be applied, answered as a duplicate, discarded
/// below the floor, refused as a seq conflict, and — when the TTL is short
/// enough to wait out — refused as expired after idling past the TTL. A
/// cycle ends early as soon as a step's outcome is not the one expected
/// (faults make that happen), so later steps always start from a known
/// state.
pub async fn run_lifecycle(context: Context, client_number: u64) -> u64 {
    let mut rng = context.rng(client_number);
    let mut raw = match Raw::new(
        context.endpoints.clone(),
        &context.credentials(client_number),
    ) {
        Ok(raw) => raw,
        Err(error) => {
            eprintln!("lifecycle client: {error:#}");
            return 0;
        }
    };
    let process = Process::Client(client_number);
    let mut op_id = 0u64;
    let mut cycle = 0u64;
    while !context.stopped() {
        let nonce: u128 = rng.r#gen();
        let Ok(session) = raw.register(nonce).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let plan = lifecycle_plan(client_number, &mut op_id);
        let Some(on_track) =
            send_lifecycle_plan(&context, &mut raw, process, session, plan, &mut rng).await
        else {
            return op_id;
        };
        // Expiry: every cycle while the TTL is short (the short-TTL
        // phase); without such a phase, every fourth cycle, as idling then
        // takes two whole TTLs.
        cycle += 1;
        let mut ttl_watch = context.session_ttl.clone();
        let ttl = *ttl_watch.borrow_and_update();
        let idle_out = ttl <= SHORT_TTL || (!context.short_ttl_phase && cycle % 4 == 1);
        if on_track && idle_out && !context.stopped() {
            let went_on = expire_session(
                &context,
                &mut raw,
                client_number,
                session,
                ttl_watch,
                ttl,
                &mut op_id,
            )
            .await;
            if !went_on {
                return op_id;
            }
        }
    }
    op_id
}

/// One planned lifecycle request: (seq, first outstanding seq, value,
/// expectation, op id).
type LifecycleStep = (u64, u64, String, Expect, u64);

/// One lifecycle cycle's requests, numbered on from `op_id`: an append
/// applied, its duplicate, a second append applied, the first again below
/// the floor (discarded), and another value with the second's seq (a
/// conflict).
fn lifecycle_plan(client_number: u64, op_id: &mut u64) -> [LifecycleStep; 5] {
    let mut step = |expect: Expect, value: String| {
        *op_id += 1;
        (*op_id, expect, value)
    };
    let first = step(Expect::Applied, String::new());
    let v1 = format!("c{client_number}-s{}", first.0);
    let second = step(Expect::Duplicate, v1.clone());
    let third = step(Expect::Applied, String::new());
    let v2 = format!("c{client_number}-s{}", third.0);
    let fourth = step(Expect::Discarded, v1.clone());
    let fifth = step(Expect::Conflict, String::new());
    let v3 = format!("c{client_number}-s{}", fifth.0);
    [
        (1, 1, v1.clone(), Expect::Applied, first.0),
        (1, 1, v1.clone(), Expect::Duplicate, second.0),
        (2, 2, v2, Expect::Applied, third.0),
        (1, 1, v1, Expect::Discarded, fourth.0),
        (2, 2, v3, Expect::Conflict, fifth.0),
    ]
}

/// Sends a cycle's `plan` in order, a short random pause after each
/// request, until one's outcome is not the expected one; `None` when told
/// to stop, else whether every request went as expected.
async fn send_lifecycle_plan(
    context: &Context,
    raw: &mut Raw,
    process: Process,
    session: u64,
    plan: [LifecycleStep; 5],
    rng: &mut ChaCha8Rng,
) -> Option<bool> {
    let mut on_track = true;
    for (seq, floor, value, expect, id) in plan {
        if context.stopped() {
            return None;
        }
        on_track = lifecycle_request(
            context, raw, process, id, session, seq, floor, &value, expect,
        )
        .await;
        if !on_track {
            break;
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(20..100))).await;
    }
    Some(on_track)
}

/// Idles `session` past `ttl`, the TTL `ttl_watch` last announced (in
/// cluster time: the leader's clock runs while it leads, idle or not),
/// then sends a request that must be refused as expired, numbered on from
/// `op_id`; false when told to stop while idling.
async fn expire_session(
    context: &Context,
    raw: &mut Raw,
    client_number: u64,
    session: u64,
    ttl_watch: watch::Receiver<Duration>,
    ttl: Duration,
    op_id: &mut u64,
) -> bool {
    // The session's last activity, in cluster time, is at most the
    // largest applied cluster time of the nodes now, provided every node
    // answers: the node that answered the cycle's last request applied it
    // before answering. Without every answer, expiry is not judged.
    let Some(idle_from_ms) = all_answered_max(&raw.cluster_times().await) else {
        return true;
    };
    let mut stop = context.stop.clone();
    tokio::select! {
        () = tokio::time::sleep(ttl * 2 + Duration::from_millis(500)) => {}
        _ = stop.wait_for(|stop| *stop) => return false,
    }
    // The TTL changed while idling (the short-TTL phase ended; the
    // runner announces that before it proposes the change): the
    // session may never have been idle past the TTL in force, so
    // its expiry is not certain and nothing is asked of it.
    if ttl_watch.has_changed().unwrap_or(true) {
        return true;
    }
    // Idle in cluster time, not in the harness's: the cluster clock does
    // not count time without a leader (rule 11), and a starved machine's
    // leader may have stalled for seconds of the wall-clock idle. Wait
    // (bounded) until some node has applied a cluster time more than a
    // TTL past `idle_from_ms`: the request below, appended after that, is
    // applied at a cluster time at least as large (the state machine's
    // time is the largest seen), so its session has certainly expired.
    // When that time does not come, nothing is asked of the session.
    let wait_until = Instant::now() + ttl * 4;
    loop {
        if expiry_certain(idle_from_ms, &raw.cluster_times().await, ttl) {
            break;
        }
        if Instant::now() >= wait_until || context.stopped() {
            return !context.stopped();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    *op_id += 1;
    let value = format!("c{client_number}-s{op_id}");
    lifecycle_request(
        context,
        raw,
        Process::Client(client_number),
        *op_id,
        session,
        3,
        3,
        &value,
        Expect::Expired,
    )
    .await;
    true
}

/// The largest of the nodes' cluster times, when every node answered.
fn all_answered_max(times: &[Option<u64>]) -> Option<u64> {
    times
        .iter()
        .copied()
        .collect::<Option<Vec<u64>>>()?
        .into_iter()
        .max()
}

/// Whether a session last active at cluster time `idle_from_ms` (at most)
/// has certainly been idle longer than `ttl` once some node reports an
/// applied cluster time among `times` (`None`: that node did not answer).
fn expiry_certain(idle_from_ms: u64, times: &[Option<u64>], ttl: Duration) -> bool {
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    times
        .iter()
        .flatten()
        .any(|now_ms| *now_ms > idle_from_ms.saturating_add(ttl_ms))
}

/// Sends one lifecycle request and records it; true when the outcome was
/// the expected one.
#[allow(clippy::too_many_arguments)]
async fn lifecycle_request(
    context: &Context,
    raw: &mut Raw,
    process: Process,
    op_id: u64,
    session: u64,
    seq: u64,
    first_outstanding_seq: u64,
    value: &str,
    expect: Expect,
) -> bool {
    let writing = context.writers.read().await;
    let invoke = Event::invoke(
        0,
        process,
        op_id,
        Op::Lifecycle {
            key: LIFECYCLE_KEY.to_string(),
            value: value.to_string(),
            expect,
        },
    );
    context.recorder.record(invoke.clone());
    let command = Command::Append {
        key: LIFECYCLE_KEY.as_bytes().to_vec(),
        element: value.as_bytes().to_vec(),
    };
    let (outcome, attempts, node) = raw
        .execute(session, seq, first_outstanding_seq, &command)
        .await;
    drop(writing);
    let (kind, expected) = match &outcome {
        RawOutcome::Answered { duplicate, .. } => (
            EventType::Ok,
            match expect {
                Expect::Applied => !duplicate,
                Expect::Duplicate => *duplicate,
                _ => false,
            },
        ),
        RawOutcome::Refused { reason, attempt } => {
            // A refusal after retries may hide an earlier attempt that was
            // applied — except where the refusal is the very point.
            let definite = *attempt == 0
                || matches!(
                    (expect, reason),
                    (Expect::Discarded, Reason::ResponseDiscarded)
                        | (Expect::Conflict, Reason::SeqConflict)
                );
            (
                if definite {
                    EventType::Fail
                } else {
                    EventType::Info
                },
                matches!(
                    (expect, reason),
                    (Expect::Discarded, Reason::ResponseDiscarded)
                        | (Expect::Conflict, Reason::SeqConflict)
                        | (Expect::Expired, Reason::SessionExpired)
                ),
            )
        }
        RawOutcome::Unknown(_) => (EventType::Info, false),
    };
    let mut done = Event::complete(&invoke, kind, 0);
    done.session = Some(session);
    done.seq = Some(seq);
    done.attempts = attempts;
    done.node = Some(node);
    match outcome {
        RawOutcome::Answered { reply, duplicate } => {
            done.reply = Some(reply);
            done.duplicate = duplicate;
        }
        RawOutcome::Refused { reason, .. } => done.error = Some(reason.as_str_name().to_string()),
        RawOutcome::Unknown(text) => done.error = Some(text),
    }
    context.counts.count(kind);
    context.recorder.record(done);
    expected
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expiry is judged in cluster time: a session idle 3.5 s by the
    /// harness's clock while the cluster clock moved 1.6 s (a starved
    /// leader's stalls do not count, rule 11) is not expected to have
    /// expired under a 2 s TTL; once some node applied a time more than a
    /// TTL past the idle start, it is. And the idle start needs every
    /// node's answer, or it might be below the session's last activity.
    #[test]
    fn expiry_is_judged_in_cluster_time() {
        let ttl = Duration::from_secs(2);
        assert_eq!(
            all_answered_max(&[Some(10_000), Some(10_040), Some(9_990)]),
            Some(10_040)
        );
        assert_eq!(all_answered_max(&[Some(10_000), None, Some(9_990)]), None);
        assert!(!expiry_certain(
            10_040,
            &[Some(11_640), None, Some(11_600)],
            ttl
        ));
        assert!(
            !expiry_certain(10_040, &[Some(12_040)], ttl),
            "exactly a TTL is not past it"
        );
        assert!(expiry_certain(
            10_040,
            &[None, Some(12_041), Some(11_000)],
            ttl
        ));
    }

    /// One session client and one keyed producer in [`IMPATIENT_ONE_IN`]
    /// has deadlines shorter than a failover, the first of each kind
    /// among them, so every run with faults has calls ending unknown.
    #[test]
    fn the_first_client_of_each_kind_is_impatient() {
        assert_eq!(
            deadlines(0),
            (IMPATIENT_CALL_TIMEOUT, IMPATIENT_ATTEMPT_TIMEOUT)
        );
        assert_eq!(deadlines(1), (CALL_TIMEOUT, ATTEMPT_TIMEOUT));
        assert_eq!(deadlines(IMPATIENT_ONE_IN), deadlines(0));
        assert!(IMPATIENT_CALL_TIMEOUT < Duration::from_secs(1));
    }

    fn attempt(attempt: u32, outcome: AttemptOutcome) -> AttemptEvent {
        AttemptEvent {
            client_id: 9,
            seq: 4,
            attempt,
            endpoint: format!("127.0.0.1:{}", 7000 + attempt),
            outcome,
        }
    }

    fn invoke() -> Event {
        Event::invoke(
            0,
            Process::Client(1),
            1,
            Op::Increment {
                key: "n".into(),
                delta: 2,
            },
        )
    }

    /// A retried call answered from the cache completes as ok, flagged a
    /// duplicate, with its attempts, session, seq and last node.
    #[test]
    fn completion_of_a_duplicate_answer() {
        let seen = [
            attempt(0, AttemptOutcome::Started),
            attempt(
                0,
                AttemptOutcome::Retry {
                    reason: "DeadlineExceeded".into(),
                },
            ),
            attempt(1, AttemptOutcome::Started),
            attempt(
                1,
                AttemptOutcome::Answered {
                    duplicate: true,
                    log_index: 30,
                },
            ),
        ];
        let done = completion(
            &invoke(),
            Ok(CommandResult::Incremented { value: 7 }),
            &seen,
        );
        assert_eq!(done.kind, EventType::Ok);
        assert_eq!(done.reply, Some(Reply::Incremented { value: 7 }));
        assert!(done.duplicate);
        assert_eq!(done.attempts, 2);
        assert_eq!((done.session, done.seq), (Some(9), Some(4)));
        assert_eq!(done.node.as_deref(), Some("127.0.0.1:7001"));
    }

    /// An unknown outcome is info; a refusal before anything ran is fail.
    #[test]
    fn completion_of_errors() {
        let seen = [attempt(0, AttemptOutcome::Started)];
        let unknown = Error::OutcomeUnknown {
            seq: 4,
            reason: "deadline".into(),
            fenced: true,
        };
        let done = completion(&invoke(), Err(unknown), &seen);
        assert_eq!(done.kind, EventType::Info);
        assert!(!done.duplicate);
        let done = completion(&invoke(), Err(Error::SessionExpired), &seen);
        assert_eq!(done.kind, EventType::Fail);
        let done = completion(&invoke(), Err(Error::Unavailable("down".into())), &[]);
        assert_eq!(done.kind, EventType::Fail);
        assert_eq!(done.attempts, 0);
    }

    /// A keyed call's completion: answered (a duplicate flagged), refused
    /// as a conflict (final), unknown or not sent (send it again).
    #[test]
    fn keyed_completions() {
        let invoke = Event::invoke(
            0,
            Process::Client(3),
            1,
            Op::Keyed {
                idempotency_key: "jepsen-c3-k1".into(),
                key: "keyed-counter-0".into(),
                command: KeyedCommand::Increment { delta: 2 },
                intent: KeyedIntent::Retry,
            },
        );
        let reply = oncekv_client::KeyedReply {
            result: CommandResult::Incremented { value: 9 },
            duplicate: true,
            log_index: 40,
        };
        let (done, end) = keyed_completion(&invoke, Ok(reply));
        assert_eq!(
            (done.kind, end),
            (EventType::Ok, Some(KeyedEnd::Acknowledged))
        );
        assert!(done.duplicate);
        assert_eq!(done.reply, Some(Reply::Incremented { value: 9 }));
        let conflict = Error::KeyConflict { key: "k".into() };
        let (done, end) = keyed_completion(&invoke, Err(conflict));
        assert_eq!((done.kind, end), (EventType::Fail, Some(KeyedEnd::Refused)));
        assert_eq!(done.error.as_deref(), Some(KEY_CONFLICT));
        let unknown = Error::KeyOutcomeUnknown {
            key: "k".into(),
            reason: "deadline".into(),
        };
        let (done, end) = keyed_completion(&invoke, Err(unknown));
        assert_eq!((done.kind, end), (EventType::Info, None));
        let (done, end) = keyed_completion(&invoke, Err(Error::Unavailable("down".into())));
        assert_eq!((done.kind, end), (EventType::Fail, None));
        let (done, end) = keyed_completion(&invoke, Err(Error::InvalidArgument("bad".into())));
        assert_eq!((done.kind, end), (EventType::Fail, Some(KeyedEnd::Refused)));
    }

    /// Appenders move to fresh lists by operation count, a few at a time.
    #[test]
    fn list_keys_rotate_by_operation_count() {
        assert_eq!(list_key(0, 4), "list-0-1");
        assert_eq!(list_key(OPS_PER_LIST_EPOCH - 1, 2), "list-0-2");
        assert_eq!(list_key(OPS_PER_LIST_EPOCH, 0), "list-1-0");
    }
}
