//! The history of a run: every client operation as an `invoke` event
//! followed by exactly one completion (`ok`: it took effect, with its reply
//! — for a read, the value it found; `fail`: it definitely did not; `info`:
//! unknown), plus the nemesis's faults and the monitor's leader changes, in
//! the order they happened. Written and read as JSON lines. This module
//! only records and pairs events; judging them is the checker's job.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The kind of an event, as in Jepsen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventType {
    Invoke,
    Ok,
    Fail,
    Info,
}

/// Who acted: a client task (numbered from 1), the fault injector, the
/// leader monitor, or the claims workload's fenced sink (the downstream
/// system the claim holders perform their effect on).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Process {
    Client(u64),
    Nemesis,
    Monitor,
    Sink,
}

/// What was attempted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "f", rename_all = "snake_case")]
pub enum Op {
    /// Append a unique value (`c{client}-s{op_id}`) to the list at `key`.
    Append { key: String, value: String },
    /// Add `delta` to the counter at `key`.
    Increment { key: String, delta: i64 },
    /// A raw request of the session-lifecycle workload: an append of `value`
    /// to `key`, sent with an explicit (session, seq, first outstanding seq)
    /// to provoke `expect`.
    Lifecycle {
        key: String,
        value: String,
        expect: Expect,
    },
    /// A call of the keyed workload (`Client::execute_with_key`, no
    /// session): `command` on the data key `key` under the idempotency key
    /// `idempotency_key`, sent with `intent`. Every call of one idempotency
    /// key is its own operation; the checker groups them by that key.
    Keyed {
        idempotency_key: String,
        key: String,
        command: KeyedCommand,
        intent: KeyedIntent,
    },
    /// A linearizable read of `key` (a list or a counter) through the
    /// client library's `get`. It changes nothing, so it completes as `ok`
    /// (with its value as the reply) or `fail`, never `info`.
    Read { key: String },
    /// A claim of the job `key` (rule 20, `Client::claim_as`) with the
    /// claim id `claim_id` (32 hex digits; a call retried after an unknown
    /// outcome reuses it) and a lease of `lease_ms`; `plan` is what the
    /// worker does with the key if it wins.
    Claim {
        key: String,
        claim_id: String,
        lease_ms: u64,
        plan: HolderPlan,
    },
    /// The holder of `fence` records `result` (`Client::complete_claim`).
    CompleteClaim {
        key: String,
        fence: u64,
        result: String,
    },
    /// The holder of `fence` gives the key up (`Client::release_claim`).
    ReleaseClaim { key: String, fence: u64 },
    /// The holder of `fence` extends its lease to `lease_ms` from now (a
    /// heartbeat; the raw RPC, whose reply carries the new deadline).
    ExtendClaim {
        key: String,
        fence: u64,
        lease_ms: u64,
    },
    /// The fenced sink's log (process `sink`): the effect of `worker`'s
    /// holder of (`fence`, `attempt`) on `key`, `ok` when the sink accepted
    /// it, `fail` when it refused it (a fence below the highest it had
    /// accepted for the key).
    SinkWrite {
        key: String,
        fence: u64,
        attempt: u64,
        worker: u64,
    },
    /// A fault: `invoke` when it starts, `info` when it is healed.
    Fault { kind: String, nodes: Vec<u64> },
    /// The monitor saw `leader` lead in `term` (a leader change).
    LeaderChange { leader: u64, term: u64 },
}

/// What a lifecycle request is meant to provoke.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Expect {
    /// A new request: applied.
    Applied,
    /// A retry of an acknowledged, not yet trimmed seq: the original reply, as a duplicate.
    Duplicate,
    /// A retry below the floor: `RESPONSE_DISCARDED`, nothing applied.
    Discarded,
    /// A seq reused with another command: `SEQ_CONFLICT`, nothing applied.
    Conflict,
    /// A request of a session idle past the TTL: `SESSION_EXPIRED`, nothing applied.
    Expired,
}

/// What a claims worker does with a key it wins (drawn before it claims).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HolderPlan {
    /// The effect on the sink, then complete (release if the sink refused).
    Complete,
    /// A long effect with heartbeats (extends), then as `Complete`.
    Heartbeat,
    /// A simulated failure: release without an effect.
    Fail,
    /// Killed before the effect: no further call.
    KilledBefore,
    /// Killed between the effect and the complete: no further call.
    KilledAfterEffect,
    /// Killed while heartbeating: a few extends, then nothing.
    KilledHeartbeating,
    /// Paused past its lease before the effect, then the effect and the
    /// complete with its old fence (release if the sink refused).
    PausedBefore,
    /// The effect, then paused past its lease, then the complete with its
    /// old fence.
    PausedAfterEffect,
    /// A few extends, paused past its lease, an extend with its old fence
    /// (stops if FENCED), then the effect and the complete.
    PausedHeartbeating,
}

impl HolderPlan {
    /// The holder is killed (abandons the key with no further call).
    pub fn killed(self) -> bool {
        matches!(
            self,
            HolderPlan::KilledBefore
                | HolderPlan::KilledAfterEffect
                | HolderPlan::KilledHeartbeating
        )
    }

    /// The holder sleeps past its lease, then goes on with its old fence.
    pub fn paused(self) -> bool {
        matches!(
            self,
            HolderPlan::PausedBefore
                | HolderPlan::PausedAfterEffect
                | HolderPlan::PausedHeartbeating
        )
    }
}

/// The command of a keyed call.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyedCommand {
    /// Append `value` (unique to one idempotency key and intent) to the list.
    Append { value: String },
    /// Add `delta` (positive) to the counter.
    Increment { delta: i64 },
}

/// Why a keyed call was sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyedIntent {
    /// The first call of an idempotency key.
    First,
    /// The same key and command again, after a call whose outcome was
    /// unknown or that could not be sent: executes at most once in all.
    Retry,
    /// The same key and command again after it was acknowledged, on
    /// purpose: must be answered as a duplicate with the original result.
    Repeat,
    /// The key of an acknowledged call reused with another command (an
    /// append of a value of its own): must be refused as `KEY_CONFLICT` and
    /// its value must never appear. Retried like the others while unknown.
    Conflict,
}

/// A reply the cluster gave.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    Appended {
        length: u64,
    },
    Incremented {
        value: i64,
    },
    /// A read found a list: the length it shares with the same process's
    /// previous successful read of the same key, then the elements after
    /// that (the list is `previous[..shared]` followed by `tail`). Lists
    /// only grow, so each element is written about once per reader instead
    /// of once per read.
    ReadList {
        shared: u64,
        tail: Vec<String>,
    },
    /// A read found an integer.
    ReadInt {
        value: i64,
    },
    /// A read found no value at the key.
    ReadAbsent,
    /// A claim won the key (a retry of the winning claim gets the same
    /// answer again, flagged `duplicate` on the event).
    ClaimWon {
        fence: u64,
        attempt: u64,
        lease_deadline_ms: u64,
        cluster_time_ms: u64,
    },
    /// Another holder's lease was live.
    ClaimInProgress {
        retry_after_ms: u64,
        attempt: u64,
    },
    /// The key was completed: its recorded result, replayed.
    ClaimCompleted {
        result: String,
        completed_ms: u64,
        fence: u64,
        attempt: u64,
    },
    /// A complete was recorded at this cluster time.
    ClaimRecorded {
        completed_ms: u64,
    },
    /// An extend moved the lease's deadline (cluster time of the extend).
    ClaimExtended {
        lease_deadline_ms: u64,
        cluster_time_ms: u64,
    },
    /// Any other result, described.
    Other {
        text: String,
    },
}

/// One line of the history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Nanoseconds since the run started (monotonic clock).
    pub time_ns: u64,
    #[serde(rename = "type")]
    pub kind: EventType,
    pub process: Process,
    /// Numbers the process's operations; links an invoke to its completion.
    pub op_id: u64,
    pub op: Op,
    /// The registry's client id of the session used (completions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<u64>,
    /// The registry's seq (completions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// Attempts made (the client library retries internally).
    #[serde(default)]
    pub attempts: u32,
    /// Endpoint of the last attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The reply came from the registry's cache (a retry of an applied request).
    #[serde(default)]
    pub duplicate: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<Reply>,
    /// Why it failed or is unknown (a registry reason or an error text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Event {
    /// An invoke event of `op` by `process`.
    pub fn invoke(time_ns: u64, process: Process, op_id: u64, op: Op) -> Event {
        Event {
            time_ns,
            kind: EventType::Invoke,
            process,
            op_id,
            op,
            session: None,
            seq: None,
            attempts: 0,
            node: None,
            duplicate: false,
            reply: None,
            error: None,
        }
    }

    /// The completion of `invoke` as `kind` at `time_ns` (fields to fill in).
    pub fn complete(invoke: &Event, kind: EventType, time_ns: u64) -> Event {
        Event {
            time_ns,
            kind,
            ..invoke.clone()
        }
    }
}

/// A shared, append-only history with its clock; cheap to clone.
#[derive(Clone)]
pub struct Recorder {
    started: Instant,
    events: Arc<Mutex<Vec<Event>>>,
}

impl Recorder {
    /// A recorder whose clock starts now.
    pub fn start() -> Recorder {
        Recorder {
            #[allow(clippy::disallowed_methods)] // the harness measures real time
            started: Instant::now(),
            events: Arc::default(),
        }
    }

    /// Nanoseconds since the run started.
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Time since the run started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Appends `event`, stamped now (its `time_ns` is overwritten so the
    /// history's order and its times always agree); returns the stamp.
    pub fn record(&self, mut event: Event) -> u64 {
        let mut events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        event.time_ns = self.now_ns();
        let time_ns = event.time_ns;
        events.push(event);
        time_ns
    }

    /// A copy of every event so far.
    pub fn snapshot(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Number of events so far.
    pub fn len(&self) -> usize {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Writes `events` as JSON lines.
pub fn write_jsonl<W: Write>(events: &[Event], mut out: W) -> std::io::Result<()> {
    for event in events {
        serde_json::to_writer(&mut out, event)?;
        out.write_all(b"\n")?;
    }
    out.flush()
}

/// Reads JSON lines written by [`write_jsonl`].
pub fn read_jsonl<R: BufRead>(input: R) -> anyhow::Result<Vec<Event>> {
    let mut events = Vec::new();
    for (number, line) in input.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        events.push(
            serde_json::from_str(&line)
                .map_err(|error| anyhow::anyhow!("history line {}: {error}", number + 1))?,
        );
    }
    Ok(events)
}

/// The reply recording a read that found `list`, given the same process's
/// previous successful read of the same key (empty if none).
pub fn list_read_reply(previous: &[String], list: &[String]) -> Reply {
    let shared = previous
        .iter()
        .zip(list)
        .take_while(|(a, b)| a == b)
        .count();
    Reply::ReadList {
        shared: shared as u64,
        tail: list[shared..].to_vec(),
    }
}

/// Rebuilds, in place, the list a [`Reply::ReadList`] stands for from the
/// same process's previous read of that key; an error if `shared` is longer
/// than that read (a malformed history).
pub fn rebuild_list_read(
    list: &mut Vec<String>,
    shared: u64,
    tail: &[String],
) -> Result<(), String> {
    let shared = usize::try_from(shared)
        .ok()
        .filter(|shared| *shared <= list.len())
        .ok_or_else(|| {
            format!(
                "a read shares {shared} elements with a previous read of {} elements",
                list.len()
            )
        })?;
    list.truncate(shared);
    list.extend_from_slice(tail);
    Ok(())
}

/// An operation with its invoke and completion paired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operation {
    pub process: Process,
    pub op_id: u64,
    pub op: Op,
    pub invoke_ns: u64,
    /// The completion; `None` when the history ends before it (counts as
    /// `info`, completed at the end of time).
    pub completion: Option<Event>,
}

impl Operation {
    /// `ok`, `fail` or `info` (also for a missing completion).
    pub fn outcome(&self) -> EventType {
        self.completion
            .as_ref()
            .map_or(EventType::Info, |event| event.kind)
    }

    /// When it completed; `u64::MAX` if it never did.
    pub fn complete_ns(&self) -> u64 {
        self.completion
            .as_ref()
            .map_or(u64::MAX, |event| event.time_ns)
    }
}

/// Pairs every invoke with the next completion of the same (process,
/// op id), in invoke order; the monitor's observations are skipped. A
/// completion without an invoke is an error.
pub fn pair(events: &[Event]) -> Result<Vec<Operation>, String> {
    let mut open: BTreeMap<(Process, u64), usize> = BTreeMap::new();
    let mut operations: Vec<Operation> = Vec::new();
    for event in events {
        if event.process == Process::Monitor {
            // Observations, not operations: nothing to pair.
            continue;
        }
        let id = (event.process, event.op_id);
        if event.kind == EventType::Invoke {
            if open.contains_key(&id) {
                return Err(format!("{id:?} invoked twice without completing"));
            }
            open.insert(id, operations.len());
            operations.push(Operation {
                process: event.process,
                op_id: event.op_id,
                op: event.op.clone(),
                invoke_ns: event.time_ns,
                completion: None,
            });
        } else {
            let index = open
                .remove(&id)
                .ok_or_else(|| format!("{id:?} completed ({:?}) but never invoked", event.kind))?;
            operations[index].completion = Some(event.clone());
        }
    }
    Ok(operations)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn append(client: u64, op_id: u64) -> Event {
        Event::invoke(
            op_id * 10,
            Process::Client(client),
            op_id,
            Op::Append {
                key: "k".into(),
                value: format!("c{client}-s{op_id}"),
            },
        )
    }

    /// Events survive a JSON-lines round trip unchanged.
    #[test]
    fn jsonl_round_trip() {
        let invoke = append(1, 1);
        let mut ok = Event::complete(&invoke, EventType::Ok, 25);
        ok.reply = Some(Reply::Appended { length: 3 });
        ok.duplicate = true;
        ok.session = Some(7);
        ok.seq = Some(1);
        let fault = Event::invoke(
            30,
            Process::Nemesis,
            1,
            Op::Fault {
                kind: "kill-leader".into(),
                nodes: vec![2],
            },
        );
        let events = vec![invoke, ok, fault];
        let mut bytes = Vec::new();
        write_jsonl(&events, &mut bytes).unwrap();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.contains("\"type\":\"invoke\""), "{text}");
        assert!(text.contains("\"duplicate\":true"), "{text}");
        assert_eq!(read_jsonl(&bytes[..]).unwrap(), events);
    }

    /// A list read is recorded against the reader's previous one and
    /// rebuilt from it exactly, whatever the two lists are.
    #[test]
    fn list_reads_round_trip_through_their_delta() {
        let list = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let cases = [
            (list(&[]), list(&["a", "b"])),
            (list(&["a", "b"]), list(&["a", "b", "c"])),
            (list(&["a", "b", "c"]), list(&["a", "b", "c"])),
            (list(&["a", "b", "c"]), list(&["a"])),
            (list(&["a", "b"]), list(&["b", "a", "d"])),
        ];
        for (previous, now) in cases {
            let reply = list_read_reply(&previous, &now);
            let Reply::ReadList { shared, tail } = &reply else {
                panic!("{reply:?}");
            };
            let mut rebuilt = previous.clone();
            rebuild_list_read(&mut rebuilt, *shared, tail).unwrap();
            assert_eq!(rebuilt, now, "{previous:?} -> {reply:?}");
        }
        let reply = list_read_reply(&list(&["a", "b"]), &list(&["a", "b", "c"]));
        assert_eq!(
            reply,
            Reply::ReadList {
                shared: 2,
                tail: list(&["c"])
            }
        );
        assert!(rebuild_list_read(&mut list(&["a"]), 2, &[]).is_err());
    }

    /// Invokes pair with their completions; a missing completion is info.
    #[test]
    fn pairing() {
        let a = append(1, 1);
        let b = append(2, 1);
        let a_ok = Event::complete(&a, EventType::Ok, 50);
        let ops = pair(&[a, b, a_ok]).unwrap();
        assert_eq!(ops.len(), 2);
        assert_eq!(ops[0].outcome(), EventType::Ok);
        assert_eq!(ops[0].complete_ns(), 50);
        assert_eq!(ops[1].outcome(), EventType::Info);
        assert_eq!(ops[1].complete_ns(), u64::MAX);
        let orphan = Event::complete(&append(3, 1), EventType::Ok, 5);
        assert!(pair(&[orphan]).is_err());
    }
}
