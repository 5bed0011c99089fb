//! The checker: a pure function from a run's history and the final state
//! read from every replica to safety counters and a verdict. It owns what
//! "exactly once" means for this harness and must not do any IO.
//!
//! Lists (appends of unique values):
//! - *duplicated*: a value appears more than once in a list on any replica;
//! - *lost*: an acknowledged append is missing from some replica;
//! - *phantom*: a value nobody appended, or one whose every request
//!   definitely failed, is present;
//! - *order violations*: an acknowledged append A completed before append B
//!   was invoked (any clients), or A of the same client completed in any way
//!   before B was invoked, yet B precedes A in the list;
//! - *reply mismatches*: two replies to the same (session, seq) differ, or
//!   an append's reply length does not match its position in the list.
//!
//! Counters (increments with positive deltas): the final value lies within
//! acknowledged + [0, unknown] deltas; the values returned by acknowledged
//! increments are distinct, respect real-time order, and each one equals the
//! previous returned value plus its own delta plus a sum of unknown deltas
//! (anything else means some increment executed twice or vanished).
//!
//! Session lifecycle: a request below the floor, a conflicting seq or a
//! request of an expired session must not be answered as a success; a retry
//! of an acknowledged seq must be answered as a duplicate.
//!
//! Reads (linearizable `get`s, each with its invoke and completion time;
//! *read violations*, at most one per read): a read must find a state that
//! holds every write acknowledged before the read began and nothing of a
//! write invoked after it completed.
//! - a list read holds each element once, only elements some request
//!   appended (and not only failed ones), none whose first request was
//!   invoked after the read completed, every element acknowledged before
//!   the read began, and is a prefix of the list the replicas hold at the
//!   end (so reads agree with each other and with the final order);
//! - a counter read lies within [the positive deltas acknowledged before the
//!   read began + every negative delta of a request invoked before it
//!   completed and not definitely failed, the negative deltas acknowledged
//!   before it began + every such positive delta]; with positive deltas only
//!   it is also at least the value returned by any increment acknowledged
//!   before it began, and at most the value before any acknowledged
//!   increment invoked after it completed;
//! - a read that begins after another read of the same key completed finds
//!   at least as much (a list as long, a counter of positive deltas as
//!   large).
//!
//! Keyed calls (idempotency keys, no session; grouped by idempotency key,
//! each key carrying one command however often it was sent, plus perhaps a
//! conflicting command of its own):
//! - *keyed duplicated*: a keyed append's value appears more than once in a
//!   list on any replica, or the answers prove two executions of one key
//!   (two answers that are not duplicates, or one that is not a duplicate
//!   sent after a duplicate answer had come back);
//! - *keyed lost*: an acknowledged key's value is missing from some replica;
//! - *keyed phantom*: a value in a keyed list that no key carried, or whose
//!   every call definitely failed;
//! - *keyed reply mismatches*: two answers for one key differ (a duplicate
//!   must carry the original result), an append's length does not match its
//!   value's position in the list, or a key was refused as a conflict with
//!   its own command;
//! - *keyed conflicts applied*: a command sent with an already acknowledged
//!   key was answered with a result instead of `KEY_CONFLICT`, or its value
//!   appears in a list;
//! - *keyed counter violations*: the keyed counters, checked like the
//!   session workload's with each acknowledged key counted once (its
//!   earliest invoke, its first answer) and each unresolved one as unknown.
//!
//! Claims (rule 20; the claims workload's calls and its fenced sink's log):
//! leases that never overlap, fences that grow, FENCED where a fence was
//! superseded, one recorded result replayed by every later claim, one
//! accepted effect per fence, and every job completed by the end — see
//! [`claims`] for each counter.
//!
//! Replicas: after healing, every replica has the same applied index, state
//! hash and values (*divergence* otherwise).

use crate::history::{
    self, Event, EventType, Expect, KeyedCommand, KeyedIntent, Op, Operation, Process, Reply,
};
use crate::workload::KEY_CONFLICT;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

pub mod claims;
pub mod unknowns;

/// How many problem descriptions are kept.
const PROBLEMS_KEPT: usize = 50;
/// Above this sum of unknown deltas the subset-sum check is skipped (only
/// the bounds are checked).
const SUBSET_SUM_LIMIT: i64 = 10_000_000;

/// A value read back from one replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinalValue {
    Absent,
    List(Vec<String>),
    Int(i64),
    Other(String),
}

/// One replica after healing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeFinal {
    pub node: u64,
    pub applied_index: u64,
    pub state_hash: String,
    /// Every key of the run as read from this replica's own applied state;
    /// `None` when this replica's values could not be read on their own (the
    /// state hash still covers them).
    pub values: Option<BTreeMap<String, FinalValue>>,
}

/// The safety counters; any of them above zero makes the run invalid.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Safety {
    pub duplicated: u64,
    pub lost: u64,
    pub phantom: u64,
    pub order_violations: u64,
    pub reply_mismatches: u64,
    pub counter_violations: u64,
    pub lifecycle_violations: u64,
    /// Reads that found a state no linearization allows (stale, from the
    /// future, or out of order).
    #[serde(default)]
    pub read_violations: u64,
    pub divergence: u64,
    /// The history itself is malformed (an unpaired completion).
    pub malformed: u64,
    /// The keyed workload's findings (see the module doc).
    #[serde(default)]
    pub keyed_duplicated: u64,
    #[serde(default)]
    pub keyed_lost: u64,
    #[serde(default)]
    pub keyed_phantom: u64,
    #[serde(default)]
    pub keyed_reply_mismatches: u64,
    #[serde(default)]
    pub keyed_conflicts_applied: u64,
    #[serde(default)]
    pub keyed_counter_violations: u64,
    /// The claims workload's findings (see [`claims`]).
    #[serde(default)]
    pub claim_fence_violations: u64,
    #[serde(default)]
    pub claim_lease_violations: u64,
    #[serde(default)]
    pub claim_fences_not_enforced: u64,
    #[serde(default)]
    pub claim_result_violations: u64,
    #[serde(default)]
    pub claim_sink_violations: u64,
    #[serde(default)]
    pub claim_fenced_unjustified: u64,
    #[serde(default)]
    pub claims_stuck: u64,
}

impl Safety {
    pub fn total(&self) -> u64 {
        self.duplicated
            + self.lost
            + self.phantom
            + self.order_violations
            + self.reply_mismatches
            + self.counter_violations
            + self.lifecycle_violations
            + self.read_violations
            + self.divergence
            + self.malformed
            + self.keyed()
            + self.claims()
    }

    /// The claims workload's violations.
    pub fn claims(&self) -> u64 {
        self.claim_fence_violations
            + self.claim_lease_violations
            + self.claim_fences_not_enforced
            + self.claim_result_violations
            + self.claim_sink_violations
            + self.claim_fenced_unjustified
            + self.claims_stuck
    }

    /// The keyed workload's violations.
    pub fn keyed(&self) -> u64 {
        self.keyed_duplicated
            + self.keyed_lost
            + self.keyed_phantom
            + self.keyed_reply_mismatches
            + self.keyed_conflicts_applied
            + self.keyed_counter_violations
    }
}

/// The checker's findings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Findings {
    pub safety: Safety,
    /// The first problems, described.
    pub problems: Vec<String>,
    /// Replicas whose values were compared.
    pub replicas_read: u64,
    /// The calls that ended with their outcome unknown, and how each came
    /// out (figures, not findings: they make nothing invalid).
    pub unknowns: unknowns::UnknownFigures,
}

impl Findings {
    pub fn valid(&self) -> bool {
        self.safety.total() == 0
    }

    fn problem(&mut self, text: String) {
        if self.problems.len() < PROBLEMS_KEPT {
            self.problems.push(text);
        }
    }
}

/// Checks `events` against the replicas' final state.
pub fn check(events: &[Event], finals: &[NodeFinal]) -> Findings {
    let mut findings = Findings::default();
    let operations = match history::pair(events) {
        Ok(operations) => operations,
        Err(error) => {
            findings.safety.malformed += 1;
            findings.problem(format!("malformed history: {error}"));
            return findings;
        }
    };
    let reads: Vec<(u64, &BTreeMap<String, FinalValue>)> = finals
        .iter()
        .filter_map(|n| n.values.as_ref().map(|v| (n.node, v)))
        .collect();
    findings.replicas_read = reads.len() as u64;
    check_divergence(finals, &mut findings);
    check_replies(&operations, &mut findings);
    check_lifecycle(&operations, &mut findings);
    let lists = list_writes(&operations);
    check_lists(&lists, &reads, &mut findings);
    check_counters(&operations, &reads, &mut findings);
    check_keyed(&operations, &reads, &mut findings);
    claims::check_claims(&operations, &mut findings);
    findings.unknowns = unknowns::UnknownFigures::of(&operations, reads.first().map(|(_, v)| *v));
    check_reads(
        &operations,
        &lists,
        reads.first().map(|(_, v)| *v),
        &mut findings,
    );
    findings
}

fn check_divergence(finals: &[NodeFinal], findings: &mut Findings) {
    let states: BTreeSet<(u64, &str)> = finals
        .iter()
        .map(|n| (n.applied_index, n.state_hash.as_str()))
        .collect();
    if states.len() > 1 {
        findings.safety.divergence += states.len() as u64 - 1;
        let described: Vec<String> = finals
            .iter()
            .map(|n| {
                format!(
                    "node {} applied {} hash {}",
                    n.node, n.applied_index, n.state_hash
                )
            })
            .collect();
        findings.problem(format!(
            "replicas diverge after healing: {}",
            described.join("; ")
        ));
    }
    let read: Vec<&NodeFinal> = finals.iter().filter(|n| n.values.is_some()).collect();
    if let Some((first, rest)) = read.split_first() {
        let first_values = first.values.as_ref().expect("filtered");
        for other in rest {
            let values = other.values.as_ref().expect("filtered");
            let keys: BTreeSet<&String> = first_values.keys().chain(values.keys()).collect();
            for key in keys {
                if first_values.get(key) != values.get(key) {
                    findings.safety.divergence += 1;
                    findings.problem(format!(
                        "key {key:?} differs between node {} and node {}",
                        first.node, other.node
                    ));
                }
            }
        }
    }
}

/// Every reply to the same (session, seq) must be identical.
fn check_replies(operations: &[Operation], findings: &mut Findings) {
    let mut first: BTreeMap<(u64, u64), (&Reply, &Operation)> = BTreeMap::new();
    for operation in operations {
        let Some(done) = &operation.completion else {
            continue;
        };
        let (EventType::Ok, Some(session), Some(seq), Some(reply)) =
            (done.kind, done.session, done.seq, &done.reply)
        else {
            continue;
        };
        match first.get(&(session, seq)) {
            None => {
                first.insert((session, seq), (reply, operation));
            }
            Some((earlier, earlier_op)) if *earlier != reply => {
                findings.safety.reply_mismatches += 1;
                findings.problem(format!(
                    "session {session} seq {seq}: reply {reply:?} to {:?} op {} differs from \
                     {earlier:?} to {:?} op {}",
                    operation.process, operation.op_id, earlier_op.process, earlier_op.op_id
                ));
            }
            Some(_) => {}
        }
    }
}

fn check_lifecycle(operations: &[Operation], findings: &mut Findings) {
    for operation in operations {
        let Op::Lifecycle { expect, value, .. } = &operation.op else {
            continue;
        };
        let Some(done) = &operation.completion else {
            continue;
        };
        let wrong = match (expect, done.kind) {
            (Expect::Discarded | Expect::Conflict | Expect::Expired, EventType::Ok) => true,
            (Expect::Duplicate, EventType::Ok) => !done.duplicate,
            _ => false,
        };
        if wrong {
            findings.safety.lifecycle_violations += 1;
            findings.problem(format!(
                "lifecycle request for {value} expected {expect:?} but was answered ok \
                 (duplicate: {}, reply {:?})",
                done.duplicate, done.reply
            ));
        }
    }
}

/// What is known of one appended value across the requests that carried it
/// (a lifecycle retry carries the same value as its original request).
#[derive(Debug)]
struct Written {
    process: Process,
    /// Earliest invoke of any request carrying it.
    invoke_ns: u64,
    /// Earliest `ok` completion, if any.
    acked_ns: Option<u64>,
    /// Earliest completion of any kind, if any.
    completed_ns: Option<u64>,
    /// Some request's outcome is unknown.
    unknown: bool,
    /// Acknowledged list lengths (the value's position + 1).
    lengths: Vec<u64>,
}

/// Every value appended to each list key, with what is known of it.
type ListWrites<'a> = BTreeMap<&'a str, BTreeMap<&'a str, Written>>;

fn list_writes(operations: &[Operation]) -> ListWrites<'_> {
    let mut keys: ListWrites = BTreeMap::new();
    for operation in operations {
        let (key, value) = match &operation.op {
            Op::Append { key, value } | Op::Lifecycle { key, value, .. } => (key, value),
            _ => continue,
        };
        let written = keys
            .entry(key)
            .or_default()
            .entry(value)
            .or_insert(Written {
                process: operation.process,
                invoke_ns: operation.invoke_ns,
                acked_ns: None,
                completed_ns: None,
                unknown: false,
                lengths: Vec::new(),
            });
        written.invoke_ns = written.invoke_ns.min(operation.invoke_ns);
        let done = operation.completion.as_ref();
        if let Some(done) = done {
            written.completed_ns = Some(
                written
                    .completed_ns
                    .map_or(done.time_ns, |t| t.min(done.time_ns)),
            );
        }
        match operation.outcome() {
            EventType::Ok => {
                let done = done.expect("ok has a completion");
                written.acked_ns = Some(
                    written
                        .acked_ns
                        .map_or(done.time_ns, |t| t.min(done.time_ns)),
                );
                if let Some(Reply::Appended { length }) = &done.reply {
                    written.lengths.push(*length);
                }
            }
            EventType::Info | EventType::Invoke => written.unknown = true,
            EventType::Fail => {}
        }
    }
    keys
}

fn check_lists(
    keys: &ListWrites,
    reads: &[(u64, &BTreeMap<String, FinalValue>)],
    findings: &mut Findings,
) {
    for (key, written) in keys {
        for (node, values) in reads {
            match final_list(values.get(*key)) {
                Ok(list) => check_list(*node, key, list, written, findings),
                Err(other) => {
                    findings.safety.phantom += 1;
                    findings.problem(format!(
                        "node {node}: key {key:?} holds {other:?}, not a list"
                    ));
                }
            }
        }
    }
}

/// A replica's final value of a list key: its elements (none when absent),
/// or the value of another kind it holds instead.
fn final_list(value: Option<&FinalValue>) -> Result<&[String], &FinalValue> {
    match value {
        Some(FinalValue::List(list)) => Ok(list),
        None | Some(FinalValue::Absent) => Ok(&[]),
        Some(other) => Err(other),
    }
}

/// One replica's copy of one list key against every append to it: each
/// value once, only values appended, every acknowledged one present at the
/// length it was acknowledged with, in real-time and per-client order.
fn check_list(
    node: u64,
    key: &str,
    list: &[String],
    written: &BTreeMap<&str, Written>,
    findings: &mut Findings,
) {
    let duplicated = check_list_phantoms(node, key, list, written, findings);
    // Positions of the first occurrence (a duplicate's later copy is
    // already counted).
    let mut first_positions: BTreeMap<&str, usize> = BTreeMap::new();
    for (position, value) in list.iter().enumerate() {
        first_positions.entry(value.as_str()).or_insert(position);
    }
    for value in &duplicated {
        findings.safety.duplicated += 1;
        let count = list.iter().filter(|v| v.as_str() == *value).count();
        findings.problem(format!(
            "node {node}: {value} appears {count} times in {key:?}"
        ));
    }
    check_list_acknowledged(node, key, written, &first_positions, findings);
    check_list_real_time_order(node, key, written, &first_positions, findings);
    check_list_client_order(node, key, written, &first_positions, findings);
}

/// *Phantoms* in one list: values never appended, or whose every request
/// failed (each value's first copy only); returns the values present more
/// than once.
fn check_list_phantoms<'l>(
    node: u64,
    key: &str,
    list: &'l [String],
    written: &BTreeMap<&str, Written>,
    findings: &mut Findings,
) -> BTreeSet<&'l str> {
    let mut positions: BTreeMap<&str, usize> = BTreeMap::new();
    let mut duplicated = BTreeSet::new();
    for (position, value) in list.iter().enumerate() {
        if positions.insert(value, position).is_some() {
            duplicated.insert(value.as_str());
        } else if let Some(record) = written.get(value.as_str()) {
            if record.acked_ns.is_none() && !record.unknown {
                findings.safety.phantom += 1;
                findings.problem(format!(
                    "node {node}: {value} in {key:?} although every request for it failed"
                ));
            }
        } else {
            findings.safety.phantom += 1;
            findings.problem(format!(
                "node {node}: {value} in {key:?} was never appended"
            ));
        }
    }
    duplicated
}

/// *Lost* acknowledged appends, and *reply mismatches*: an acknowledged
/// length that is not the value's position + 1.
fn check_list_acknowledged(
    node: u64,
    key: &str,
    written: &BTreeMap<&str, Written>,
    first_positions: &BTreeMap<&str, usize>,
    findings: &mut Findings,
) {
    for (value, record) in written {
        let position = first_positions.get(value).copied();
        if record.acked_ns.is_some() && position.is_none() {
            findings.safety.lost += 1;
            findings.problem(format!(
                "node {node}: acknowledged {value} missing from {key:?}"
            ));
        }
        if let Some(position) = position {
            for length in &record.lengths {
                if *length != position as u64 + 1 {
                    findings.safety.reply_mismatches += 1;
                    findings.problem(format!(
                        "node {node}: {value} was acknowledged with length {length} but sits at \
                         position {} of {key:?}",
                        position + 1
                    ));
                }
            }
        }
    }
}

/// *Order violations* in real time (any clients): an append acknowledged
/// before another began must precede it.
fn check_list_real_time_order(
    node: u64,
    key: &str,
    written: &BTreeMap<&str, Written>,
    first_positions: &BTreeMap<&str, usize>,
    findings: &mut Findings,
) {
    let items: Vec<OrderItem> = written
        .iter()
        .map(|(value, record)| OrderItem {
            name: (*value).to_string(),
            group: 0,
            before_ns: record.acked_ns,
            invoke_ns: record.invoke_ns,
            position: first_positions.get(value).copied(),
        })
        .collect();
    for (a, b) in order_violations(&items) {
        findings.safety.order_violations += 1;
        findings.problem(format!(
            "node {node}: {b} precedes {a} in {key:?}, but {a} was acknowledged before {b} began"
        ));
    }
}

/// *Order violations* per client: any completion of an earlier request of
/// the same client must precede its later ones.
fn check_list_client_order(
    node: u64,
    key: &str,
    written: &BTreeMap<&str, Written>,
    first_positions: &BTreeMap<&str, usize>,
    findings: &mut Findings,
) {
    let items: Vec<OrderItem> = written
        .iter()
        .map(|(value, record)| OrderItem {
            name: (*value).to_string(),
            group: match record.process {
                Process::Client(client) => client,
                _ => u64::MAX,
            },
            before_ns: record.completed_ns,
            invoke_ns: record.invoke_ns,
            position: first_positions.get(value).copied(),
        })
        .collect();
    for (a, b) in order_violations(&items) {
        findings.safety.order_violations += 1;
        findings.problem(format!(
            "node {node}: {b} precedes {a} in {key:?}, but the same client finished {a} before \
             it began {b}"
        ));
    }
}

/// Every call of one idempotency key.
#[derive(Default)]
struct KeyedGroup<'a> {
    /// The key's own command and data key (of its first call that is not a
    /// conflict).
    target: Option<(&'a str, &'a KeyedCommand)>,
    /// The calls with that command.
    calls: Vec<&'a Operation>,
    /// The calls with another command, sent on purpose.
    conflicts: Vec<&'a Operation>,
}

impl KeyedGroup<'_> {
    fn oks(&self) -> impl Iterator<Item = (&Operation, &Event)> {
        self.calls.iter().filter_map(|call| {
            let done = call.completion.as_ref()?;
            (done.kind == EventType::Ok).then_some((*call, done))
        })
    }

    fn acknowledged(&self) -> bool {
        self.oks().next().is_some()
    }

    /// Some call's outcome is unknown.
    fn unknown(&self) -> bool {
        self.calls
            .iter()
            .any(|call| matches!(call.outcome(), EventType::Info | EventType::Invoke))
    }

    /// The earliest invoke of its calls.
    fn invoke_ns(&self) -> u64 {
        self.calls
            .iter()
            .map(|call| call.invoke_ns)
            .min()
            .unwrap_or(u64::MAX)
    }
}

/// What is known of one value appended by keyed calls.
struct KeyedValue<'a> {
    idempotency_key: &'a str,
    /// Carried by a conflicting command: must never appear.
    conflict: bool,
    acknowledged: bool,
    unknown: bool,
    /// Lengths the acknowledged answers reported.
    lengths: Vec<u64>,
}

fn keyed_groups<'a>(
    operations: &'a [Operation],
    findings: &mut Findings,
) -> BTreeMap<&'a str, KeyedGroup<'a>> {
    let mut groups: BTreeMap<&str, KeyedGroup> = BTreeMap::new();
    for operation in operations {
        let Op::Keyed {
            idempotency_key,
            key,
            command,
            intent,
        } = &operation.op
        else {
            continue;
        };
        let group = groups.entry(idempotency_key).or_default();
        if *intent == KeyedIntent::Conflict {
            group.conflicts.push(operation);
            continue;
        }
        match group.target {
            None => group.target = Some((key, command)),
            Some(target) if target != (key.as_str(), command) => {
                findings.safety.malformed += 1;
                findings.problem(format!(
                    "malformed history: idempotency key {idempotency_key} sent with {command:?} \
                     on {key:?} and with {target:?}"
                ));
                continue;
            }
            Some(_) => {}
        }
        group.calls.push(operation);
    }
    groups
}

/// The keyed workload's checks: each key's answers, then the keyed lists
/// and counters every replica holds against what the keys carried.
fn check_keyed(
    operations: &[Operation],
    reads: &[(u64, &BTreeMap<String, FinalValue>)],
    findings: &mut Findings,
) {
    let groups = keyed_groups(operations, findings);
    for (idempotency_key, group) in &groups {
        check_keyed_answers(idempotency_key, group, findings);
    }
    let writes = KeyedWrites::of(&groups);
    check_keyed_lists(&writes.lists, reads, findings);
    check_keyed_counters(&writes, reads, findings);
}

/// What the keys carried, by data key.
#[derive(Default)]
struct KeyedWrites<'a> {
    /// Each keyed list's values (those of conflicting commands included).
    lists: BTreeMap<&'a str, BTreeMap<&'a str, KeyedValue<'a>>>,
    /// Each acknowledged increment once: (counter key, the key's operation
    /// as one, delta, returned value).
    counted: Vec<(&'a str, Operation, i64, Option<i64>)>,
    /// The deltas of increments whose keys were never acknowledged but may
    /// have executed.
    unknown_deltas: BTreeMap<&'a str, Vec<i64>>,
}

impl<'a> KeyedWrites<'a> {
    /// What the keys of `groups` carried, key by key.
    fn of(groups: &BTreeMap<&'a str, KeyedGroup<'a>>) -> KeyedWrites<'a> {
        let mut writes = KeyedWrites::default();
        for (idempotency_key, group) in groups {
            writes.add_conflicts(idempotency_key, group);
            writes.add_target(idempotency_key, group);
        }
        writes
    }

    /// The values of a key's conflicting appends: they must never appear.
    fn add_conflicts(&mut self, idempotency_key: &'a str, group: &KeyedGroup<'a>) {
        for conflict in &group.conflicts {
            if let Op::Keyed {
                key,
                command: KeyedCommand::Append { value },
                ..
            } = &conflict.op
            {
                self.lists.entry(key).or_default().insert(
                    value,
                    KeyedValue {
                        idempotency_key,
                        conflict: true,
                        acknowledged: false,
                        unknown: false,
                        lengths: Vec::new(),
                    },
                );
            }
        }
    }

    /// The key's own command: its list value, or its increment (counted
    /// once from its earliest invoke and first answer, or unknown).
    fn add_target(&mut self, idempotency_key: &'a str, group: &KeyedGroup<'a>) {
        let Some((key, command)) = group.target else {
            return;
        };
        match command {
            KeyedCommand::Append { value } => {
                let lengths = group
                    .oks()
                    .filter_map(|(_, done)| match &done.reply {
                        Some(Reply::Appended { length }) => Some(*length),
                        _ => None,
                    })
                    .collect();
                self.lists.entry(key).or_default().insert(
                    value,
                    KeyedValue {
                        idempotency_key,
                        conflict: false,
                        acknowledged: group.acknowledged(),
                        unknown: group.unknown(),
                        lengths,
                    },
                );
            }
            KeyedCommand::Increment { delta } => {
                let first_ok = group.oks().min_by_key(|(_, done)| done.time_ns);
                match first_ok {
                    Some((call, done)) => {
                        let returned = match &done.reply {
                            Some(Reply::Incremented { value }) => Some(*value),
                            _ => None,
                        };
                        let mut whole = call.clone();
                        whole.invoke_ns = group.invoke_ns();
                        self.counted.push((key, whole, *delta, returned));
                    }
                    None if group.unknown() => {
                        self.unknown_deltas.entry(key).or_default().push(*delta);
                    }
                    None => {}
                }
            }
        }
    }
}

/// Every replica's keyed lists against the values the keys carried.
fn check_keyed_lists(
    lists: &BTreeMap<&str, BTreeMap<&str, KeyedValue>>,
    reads: &[(u64, &BTreeMap<String, FinalValue>)],
    findings: &mut Findings,
) {
    for (key, values) in lists {
        for (node, final_values) in reads {
            match final_list(final_values.get(*key)) {
                Ok(list) => check_keyed_list(*node, key, list, values, findings),
                Err(other) => {
                    findings.safety.keyed_phantom += 1;
                    findings.problem(format!(
                        "node {node}: keyed list {key:?} holds {other:?}, not a list"
                    ));
                }
            }
        }
    }
}

/// *Keyed counter violations*: the keyed counters, through the session
/// workload's counter checks, counted and described as keyed.
fn check_keyed_counters(
    writes: &KeyedWrites,
    reads: &[(u64, &BTreeMap<String, FinalValue>)],
    findings: &mut Findings,
) {
    let mut counters: BTreeMap<&str, Counter> = BTreeMap::new();
    for (key, operation, delta, returned) in &writes.counted {
        counters
            .entry(key)
            .or_default()
            .acked
            .push((operation, *delta, *returned));
    }
    for (key, deltas) in &writes.unknown_deltas {
        counters.entry(key).or_default().unknown.extend(deltas);
    }
    let mut scratch = Findings::default();
    check_counter_values(&counters, reads, &mut scratch);
    findings.safety.keyed_counter_violations +=
        scratch.safety.counter_violations + scratch.safety.order_violations;
    for problem in scratch.problems {
        findings.problem(format!("keyed {problem}"));
    }
}

/// The answers of one key: equal results, at most one execution, no
/// conflict with its own command, no result for another command.
fn check_keyed_answers(idempotency_key: &str, group: &KeyedGroup, findings: &mut Findings) {
    let mut first: Option<&Reply> = None;
    for (_, done) in group.oks() {
        match (&done.reply, first) {
            (Some(reply), None) => first = Some(reply),
            (Some(reply), Some(earlier)) if reply != earlier => {
                findings.safety.keyed_reply_mismatches += 1;
                findings.problem(format!(
                    "idempotency key {idempotency_key}: answered {reply:?} and {earlier:?}"
                ));
            }
            _ => {}
        }
    }
    // A fresh answer is an execution; a duplicate answer proves one at or
    // before it.
    let fresh: Vec<&Operation> = group
        .oks()
        .filter(|(_, done)| !done.duplicate)
        .map(|(call, _)| call)
        .collect();
    let first_duplicate_ns = group
        .oks()
        .filter(|(_, done)| done.duplicate)
        .map(|(_, done)| done.time_ns)
        .min();
    let fresh_after_duplicate = fresh
        .iter()
        .any(|call| first_duplicate_ns.is_some_and(|at| at < call.invoke_ns));
    if fresh.len() > 1 || fresh_after_duplicate {
        findings.safety.keyed_duplicated += 1;
        findings.problem(format!(
            "idempotency key {idempotency_key} executed more than once: {} answers not marked \
             duplicate{}",
            fresh.len(),
            if fresh_after_duplicate {
                ", one sent after a duplicate answer"
            } else {
                ""
            }
        ));
    }
    for call in &group.calls {
        if call
            .completion
            .as_ref()
            .is_some_and(|done| done.error.as_deref() == Some(KEY_CONFLICT))
        {
            findings.safety.keyed_reply_mismatches += 1;
            findings.problem(format!(
                "idempotency key {idempotency_key} was refused as a conflict with its own command \
                 ({:?} op {})",
                call.process, call.op_id
            ));
        }
    }
    for conflict in &group.conflicts {
        if conflict.outcome() == EventType::Ok {
            findings.safety.keyed_conflicts_applied += 1;
            findings.problem(format!(
                "idempotency key {idempotency_key} reused with another command was answered {:?} \
                 instead of KEY_CONFLICT",
                conflict
                    .completion
                    .as_ref()
                    .and_then(|done| done.reply.as_ref())
            ));
        }
    }
}

fn check_keyed_list(
    node: u64,
    key: &str,
    list: &[String],
    values: &BTreeMap<&str, KeyedValue>,
    findings: &mut Findings,
) {
    // Each value's first position and its number of copies.
    let mut seen: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    for (position, value) in list.iter().enumerate() {
        seen.entry(value.as_str()).or_insert((position, 0)).1 += 1;
    }
    for (value, (position, copies)) in &seen {
        let Some(record) = values.get(value) else {
            findings.safety.keyed_phantom += 1;
            findings.problem(format!(
                "node {node}: {value} in keyed list {key:?} was never sent"
            ));
            continue;
        };
        if record.conflict {
            findings.safety.keyed_conflicts_applied += 1;
            findings.problem(format!(
                "node {node}: {value} in {key:?}: idempotency key {} reused with another \
                 command executed it",
                record.idempotency_key
            ));
            continue;
        }
        if *copies > 1 {
            findings.safety.keyed_duplicated += 1;
            findings.problem(format!(
                "node {node}: {value} (idempotency key {}) appears {copies} times in {key:?}",
                record.idempotency_key
            ));
        }
        if !record.acknowledged && !record.unknown {
            findings.safety.keyed_phantom += 1;
            findings.problem(format!(
                "node {node}: {value} in {key:?} although every call of idempotency key {} \
                 failed",
                record.idempotency_key
            ));
        }
        for length in &record.lengths {
            if *length != *position as u64 + 1 {
                findings.safety.keyed_reply_mismatches += 1;
                findings.problem(format!(
                    "node {node}: idempotency key {} was answered with length {length} but {value} \
                     sits at position {} of {key:?}",
                    record.idempotency_key,
                    position + 1
                ));
            }
        }
    }
    for (value, record) in values {
        if record.acknowledged && !seen.contains_key(value) {
            findings.safety.keyed_lost += 1;
            findings.problem(format!(
                "node {node}: acknowledged {value} (idempotency key {}) missing from {key:?}",
                record.idempotency_key
            ));
        }
    }
}

/// One element for [`order_violations`].
struct OrderItem {
    name: String,
    /// Only items of the same group are compared.
    group: u64,
    /// When it is known to have taken effect (if at all) at the latest.
    before_ns: Option<u64>,
    invoke_ns: u64,
    /// Its position in the serial order (absent: not applied).
    position: Option<usize>,
}

/// Pairs (A, B), by name, where A took effect before B was invoked but B
/// sits before A in the serial order; at most one A per B (the one placed
/// furthest after B). O(n log n) per group.
fn order_violations(items: &[OrderItem]) -> Vec<(String, String)> {
    let mut groups: BTreeMap<u64, Vec<&OrderItem>> = BTreeMap::new();
    for item in items {
        groups.entry(item.group).or_default().push(item);
    }
    let mut violations = Vec::new();
    for members in groups.values() {
        // Predecessors sorted by the time they are known done, with the
        // running maximum of their positions.
        let mut predecessors: Vec<(u64, usize, &str)> = members
            .iter()
            .filter_map(|item| Some((item.before_ns?, item.position?, item.name.as_str())))
            .collect();
        predecessors.sort_unstable();
        let mut running_max: Vec<(usize, &str)> = Vec::with_capacity(predecessors.len());
        for &(_, position, name) in &predecessors {
            let best = match running_max.last() {
                Some(&(max, max_name)) if max >= position => (max, max_name),
                _ => (position, name),
            };
            running_max.push(best);
        }
        for item in members {
            let Some(position) = item.position else {
                continue;
            };
            let done_before = predecessors.partition_point(|&(t, _, _)| t < item.invoke_ns);
            if done_before == 0 {
                continue;
            }
            let (max, name) = running_max[done_before - 1];
            if max > position {
                violations.push((name.to_string(), item.name.clone()));
            }
        }
    }
    violations
}

#[derive(Debug, Default)]
struct Counter<'a> {
    acked: Vec<(&'a Operation, i64, Option<i64>)>,
    unknown: Vec<i64>,
}

fn check_counters(
    operations: &[Operation],
    reads: &[(u64, &BTreeMap<String, FinalValue>)],
    findings: &mut Findings,
) {
    let mut counters: BTreeMap<&str, Counter> = BTreeMap::new();
    for operation in operations {
        let Op::Increment { key, delta } = &operation.op else {
            continue;
        };
        let counter = counters.entry(key).or_default();
        match operation.outcome() {
            EventType::Ok => {
                let returned = match operation.completion.as_ref().and_then(|c| c.reply.as_ref()) {
                    Some(Reply::Incremented { value }) => Some(*value),
                    _ => None,
                };
                counter.acked.push((operation, *delta, returned));
            }
            EventType::Info | EventType::Invoke => counter.unknown.push(*delta),
            EventType::Fail => {}
        }
    }
    check_counter_values(&counters, reads, findings);
}

/// Each counter's returned values, and its final value on every replica.
fn check_counter_values(
    counters: &BTreeMap<&str, Counter>,
    reads: &[(u64, &BTreeMap<String, FinalValue>)],
    findings: &mut Findings,
) {
    for (key, counter) in counters {
        check_returned_values(key, counter, findings);
        for (node, values) in reads {
            let final_value = match values.get(*key) {
                Some(FinalValue::Int(value)) => *value,
                None | Some(FinalValue::Absent) => 0,
                Some(other) => {
                    findings.safety.counter_violations += 1;
                    findings.problem(format!("node {node}: counter {key:?} holds {other:?}"));
                    continue;
                }
            };
            check_final_counter(*node, key, counter, final_value, findings);
        }
    }
}

/// The final value must lie within acknowledged + [negative, positive]
/// unknown deltas, and (positive deltas) the last returned value plus a
/// subset of unknown deltas.
fn check_final_counter(
    node: u64,
    key: &str,
    counter: &Counter,
    final_value: i64,
    findings: &mut Findings,
) {
    let acked: i64 = counter.acked.iter().map(|(_, delta, _)| delta).sum();
    let low = acked + counter.unknown.iter().filter(|d| **d < 0).sum::<i64>();
    let high = acked + counter.unknown.iter().filter(|d| **d > 0).sum::<i64>();
    if final_value < low || final_value > high {
        findings.safety.counter_violations += 1;
        findings.problem(format!(
            "node {node}: counter {key:?} is {final_value}, outside [{low}, {high}] \
             (acknowledged {acked}, {} unknown increments)",
            counter.unknown.len()
        ));
        return;
    }
    if all_positive(counter)
        && let Some(sums) = subset_sums(&counter.unknown)
        && !sums.contains(&(final_value - acked))
    {
        findings.safety.counter_violations += 1;
        findings.problem(format!(
            "node {node}: counter {key:?} is {final_value}: acknowledged {acked} plus no subset \
             of the unknown deltas {:?}",
            counter.unknown
        ));
    }
}

fn all_positive(counter: &Counter) -> bool {
    counter.acked.iter().all(|(_, delta, _)| *delta > 0) && counter.unknown.iter().all(|d| *d > 0)
}

/// With positive deltas the returned values order the acknowledged
/// increments serially: distinct, consistent with real time, and each one
/// the previous plus its own delta plus unknown deltas applied in between.
fn check_returned_values(key: &str, counter: &Counter, findings: &mut Findings) {
    if !all_positive(counter) {
        return;
    }
    let mut returned: Vec<(i64, i64, &Operation)> = Vec::new();
    for (operation, delta, value) in &counter.acked {
        match value {
            Some(value) => returned.push((*value, *delta, operation)),
            None => {
                findings.safety.counter_violations += 1;
                findings.problem(format!(
                    "counter {key:?}: acknowledged increment by {:?} op {} returned no value",
                    operation.process, operation.op_id
                ));
            }
        }
    }
    returned.sort_by_key(|(value, _, _)| *value);
    let sums = subset_sums(&counter.unknown);
    let unknown_total: i64 = counter.unknown.iter().sum();
    let mut previous = 0;
    for (index, &(value, delta, operation)) in returned.iter().enumerate() {
        if index > 0 && returned[index - 1].0 == value {
            findings.safety.counter_violations += 1;
            findings.problem(format!(
                "counter {key:?}: two acknowledged increments returned {value}"
            ));
            continue;
        }
        let gap = value - delta - previous;
        let explained = match &sums {
            Some(sums) => sums.contains(&gap),
            None => (0..=unknown_total).contains(&gap),
        };
        if !explained {
            findings.safety.counter_violations += 1;
            findings.problem(format!(
                "counter {key:?}: {:?} op {} added {delta} and returned {value}, but the previous \
                 returned value is {previous}: {gap} is no sum of unknown deltas",
                operation.process, operation.op_id
            ));
        }
        previous = value;
    }
    let items: Vec<OrderItem> = returned
        .iter()
        .enumerate()
        .map(|(position, (value, _, operation))| OrderItem {
            name: format!(
                "{:?} op {} (returned {value})",
                operation.process, operation.op_id
            ),
            group: 0,
            before_ns: Some(operation.complete_ns()),
            invoke_ns: operation.invoke_ns,
            position: Some(position),
        })
        .collect();
    for (a, b) in order_violations(&items) {
        findings.safety.order_violations += 1;
        findings.problem(format!(
            "counter {key:?}: {b} is ordered before {a}, which was acknowledged before it began"
        ));
    }
}

/// Every sum of a subset of `deltas` (all positive), or `None` when their
/// total is too large to enumerate.
fn subset_sums(deltas: &[i64]) -> Option<BTreeSet<i64>> {
    let total: i64 = deltas.iter().sum();
    if total > SUBSET_SUM_LIMIT {
        return None;
    }
    let mut reachable = vec![false; usize::try_from(total).ok()? + 1];
    reachable[0] = true;
    let mut high = 0usize;
    for &delta in deltas {
        let delta = usize::try_from(delta).ok()?;
        for sum in (0..=high).rev() {
            if reachable[sum] {
                reachable[sum + delta] = true;
            }
        }
        high += delta;
    }
    Some(
        reachable
            .iter()
            .enumerate()
            .filter(|(_, r)| **r)
            .map(|(sum, _)| sum as i64)
            .collect(),
    )
}

/// What a read found, rebuilt from the history.
enum Found<'a> {
    List(&'a [String]),
    Int(i64),
    Absent,
    Other(String),
}

impl Found<'_> {
    fn describe(&self) -> String {
        match self {
            Found::List(list) => format!("a list of {} elements", list.len()),
            Found::Int(value) => format!("the integer {value}"),
            Found::Absent => "nothing".to_string(),
            Found::Other(text) => text.clone(),
        }
    }
}

/// One checked read, for the real-time pass and the count.
struct ReadRecord<'a> {
    process: Process,
    op_id: u64,
    key: &'a str,
    invoke_ns: u64,
    complete_ns: u64,
    /// What later reads must not fall below (list length, counter value);
    /// `None` when the key's values need not grow.
    measure: Option<i64>,
    issues: Vec<String>,
}

/// The acknowledged appends of one list key, by acknowledgement time.
struct ListIndex<'a> {
    written: &'a BTreeMap<&'a str, Written>,
    acked: Vec<(u64, &'a str)>,
}

impl<'a> ListIndex<'a> {
    fn new(written: &'a BTreeMap<&'a str, Written>) -> ListIndex<'a> {
        let mut acked: Vec<(u64, &str)> = written
            .iter()
            .filter_map(|(value, record)| Some((record.acked_ns?, *value)))
            .collect();
        acked.sort_unstable();
        ListIndex { written, acked }
    }

    /// What is wrong with `list`, read between `invoke_ns` and
    /// `complete_ns`, against the appends and the final list.
    fn check(
        &self,
        list: &[String],
        invoke_ns: u64,
        complete_ns: u64,
        final_list: Option<&[String]>,
    ) -> Vec<String> {
        let (mut issues, seen, acked_before) = self.element_issues(list, invoke_ns, complete_ns);
        issues.extend(self.stale_issue(&seen, acked_before, invoke_ns));
        if let Some(final_list) = final_list {
            issues.extend(prefix_issue(list, final_list));
        }
        issues
    }

    /// What is wrong with the elements themselves (the first of each kind:
    /// twice, never appended, only failed, from the future); also the
    /// elements seen and how many were acknowledged before the read began.
    fn element_issues<'l>(
        &self,
        list: &'l [String],
        invoke_ns: u64,
        complete_ns: u64,
    ) -> (Vec<String>, BTreeSet<&'l str>, usize) {
        let mut issues = Vec::new();
        let mut seen: BTreeSet<&str> = BTreeSet::new();
        let mut acked_before = 0usize;
        let (mut twice, mut unknown, mut failed, mut future) = (None, None, None, None);
        for value in list {
            if !seen.insert(value.as_str()) {
                twice.get_or_insert(value);
                continue;
            }
            let Some(record) = self.written.get(value.as_str()) else {
                unknown.get_or_insert(value);
                continue;
            };
            if record.acked_ns.is_none() && !record.unknown {
                failed.get_or_insert(value);
            }
            if record.invoke_ns >= complete_ns {
                future.get_or_insert((value, record.invoke_ns));
            }
            if record.acked_ns.is_some_and(|acked| acked < invoke_ns) {
                acked_before += 1;
            }
        }
        if let Some(value) = twice {
            issues.push(format!("holds {value} more than once"));
        }
        if let Some(value) = unknown {
            issues.push(format!("holds {value}, which was never appended"));
        }
        if let Some(value) = failed {
            issues.push(format!(
                "holds {value}, although every request for it failed"
            ));
        }
        if let Some((value, at)) = future {
            issues.push(format!(
                "holds {value}, whose append began at {} after the read completed",
                ns(at)
            ));
        }
        (issues, seen, acked_before)
    }

    /// Stale: some append acknowledged before the read began is missing
    /// (`acked_before` of them were seen).
    fn stale_issue(
        &self,
        seen: &BTreeSet<&str>,
        acked_before: usize,
        invoke_ns: u64,
    ) -> Option<String> {
        let expected = self.acked.partition_point(|(at, _)| *at < invoke_ns);
        if acked_before >= expected {
            return None;
        }
        let missing: Vec<&(u64, &str)> = self.acked[..expected]
            .iter()
            .filter(|(_, value)| !seen.contains(value))
            .collect();
        let (at, value) = missing.first()?;
        Some(format!(
            "is stale: misses {value}, acknowledged at {} before the read began \
             ({} acknowledged appends missing in all)",
            ns(*at),
            missing.len()
        ))
    }
}

/// The read `list` must be a prefix of the list the replicas hold at the end.
fn prefix_issue(list: &[String], final_list: &[String]) -> Option<String> {
    let position = list
        .iter()
        .zip(final_list)
        .position(|(a, b)| a != b)
        .or((list.len() > final_list.len()).then_some(final_list.len()))?;
    Some(format!(
        "is no prefix of the final list: position {} holds {} where the final \
         list holds {}",
        position + 1,
        list[position],
        final_list
            .get(position)
            .map_or("nothing", |value| value.as_str())
    ))
}

/// The increments of one counter key, sorted for the read bounds.
#[derive(Default)]
struct CounterIndex {
    all_positive: bool,
    /// Acknowledged increments by completion time, with prefix sums of
    /// their positive and negative deltas and the running maximum of their
    /// returned values (all with a leading 0 / `None`).
    acked_done_ns: Vec<u64>,
    acked_positive: Vec<i64>,
    acked_negative: Vec<i64>,
    acked_returned_max: Vec<Option<i64>>,
    /// Increments not definitely failed by invoke time, with prefix sums
    /// of their positive and negative deltas.
    possible_invoke_ns: Vec<u64>,
    possible_positive: Vec<i64>,
    possible_negative: Vec<i64>,
    /// Acknowledged increments by invoke time, with the suffix minimum of
    /// the value before each (returned minus delta; a trailing `None`).
    acked_invoke_ns: Vec<u64>,
    acked_before_min: Vec<Option<i64>>,
}

/// Prefix sums of `values`, with a leading 0.
fn prefix_sums(values: impl Iterator<Item = i64>) -> Vec<i64> {
    let mut sums = vec![0i64];
    for value in values {
        sums.push(sums.last().copied().unwrap_or(0).saturating_add(value));
    }
    sums
}

impl CounterIndex {
    fn new(increments: &[(&Operation, i64)]) -> CounterIndex {
        let returned = |operation: &Operation| match operation
            .completion
            .as_ref()
            .and_then(|c| c.reply.as_ref())
        {
            Some(Reply::Incremented { value }) => Some(*value),
            _ => None,
        };
        let mut acked: Vec<(&Operation, i64)> = increments
            .iter()
            .copied()
            .filter(|(operation, _)| operation.outcome() == EventType::Ok)
            .collect();
        let mut possible: Vec<(u64, i64)> = increments
            .iter()
            .filter(|(operation, _)| operation.outcome() != EventType::Fail)
            .map(|(operation, delta)| (operation.invoke_ns, *delta))
            .collect();
        possible.sort_unstable();
        acked.sort_by_key(|(operation, _)| operation.complete_ns());
        let mut index = CounterIndex {
            all_positive: increments.iter().all(|(_, delta)| *delta > 0),
            acked_done_ns: acked.iter().map(|(o, _)| o.complete_ns()).collect(),
            acked_positive: prefix_sums(acked.iter().map(|(_, d)| (*d).max(0))),
            acked_negative: prefix_sums(acked.iter().map(|(_, d)| (*d).min(0))),
            acked_returned_max: vec![None],
            possible_invoke_ns: possible.iter().map(|(at, _)| *at).collect(),
            possible_positive: prefix_sums(possible.iter().map(|(_, d)| (*d).max(0))),
            possible_negative: prefix_sums(possible.iter().map(|(_, d)| (*d).min(0))),
            ..CounterIndex::default()
        };
        for (operation, _) in &acked {
            let before = index.acked_returned_max.last().copied().flatten();
            index
                .acked_returned_max
                .push(before.max(returned(operation)));
        }
        acked.sort_by_key(|(operation, _)| operation.invoke_ns);
        index.acked_invoke_ns = acked.iter().map(|(o, _)| o.invoke_ns).collect();
        index.acked_before_min = vec![None; acked.len() + 1];
        for (position, (operation, delta)) in acked.iter().enumerate().rev() {
            let value_before = returned(operation).map(|value| value - delta);
            let after = index.acked_before_min[position + 1];
            index.acked_before_min[position] = match (value_before, after) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        index
    }

    /// What is wrong with `value`, read between `invoke_ns` and
    /// `complete_ns`.
    fn check(&self, value: i64, invoke_ns: u64, complete_ns: u64) -> Vec<String> {
        let mut issues = Vec::new();
        let done = self.acked_done_ns.partition_point(|at| *at < invoke_ns);
        let begun = self
            .possible_invoke_ns
            .partition_point(|at| *at < complete_ns);
        let low = self.acked_positive[done].saturating_add(self.possible_negative[begun]);
        let high = self.acked_negative[done].saturating_add(self.possible_positive[begun]);
        if value < low {
            issues.push(format!(
                "is stale: {value} is below {low}, what the increments acknowledged before \
                 the read began add up to at least"
            ));
        } else if value > high {
            issues.push(format!(
                "is from the future: {value} is above {high}, what the increments begun \
                 before the read completed add up to at most"
            ));
        }
        if self.all_positive && issues.is_empty() {
            if let Some(returned) = self.acked_returned_max[done]
                && value < returned
            {
                issues.push(format!(
                    "is stale: {value} is below {returned}, returned by an increment \
                     acknowledged before the read began"
                ));
            }
            let later = self
                .acked_invoke_ns
                .partition_point(|at| *at <= complete_ns);
            if let Some(before) = self.acked_before_min[later]
                && value > before
            {
                issues.push(format!(
                    "is from the future: {value} is above {before}, the value before an \
                     increment that began after the read completed"
                ));
            }
        }
        issues
    }
}

/// Seconds since the start, for problem texts.
fn ns(at: u64) -> String {
    format!("{:.3} s", at as f64 / 1e9)
}

/// *Read violations*: every answered read against the writes of its key
/// and the final state, then against the reads before it; at most one
/// violation per read.
fn check_reads(
    operations: &[Operation],
    lists: &ListWrites,
    final_values: Option<&BTreeMap<String, FinalValue>>,
    findings: &mut Findings,
) {
    let indexes = ReadIndexes::new(operations, lists);
    // Each process's last successful list read of each key, to rebuild the
    // next one from.
    let mut previous: BTreeMap<(Process, &str), Vec<String>> = BTreeMap::new();
    let mut records: Vec<ReadRecord> = Vec::new();
    for operation in operations {
        let Op::Read { key } = &operation.op else {
            continue;
        };
        let Some(done) = operation
            .completion
            .as_ref()
            .filter(|d| d.kind == EventType::Ok)
        else {
            continue;
        };
        let list = previous
            .entry((operation.process, key.as_str()))
            .or_default();
        let Some(found) = found(operation, done, list, findings) else {
            continue;
        };
        let (invoke_ns, complete_ns) = (operation.invoke_ns, done.time_ns);
        // The list the replicas hold at the end (absent: empty).
        let final_list: Option<&[String]> = final_values.map(|values| match values.get(key) {
            Some(FinalValue::List(list)) => list.as_slice(),
            _ => &[],
        });
        let (measure, issues) = indexes.judge(key, &found, invoke_ns, complete_ns, final_list);
        records.push(ReadRecord {
            process: operation.process,
            op_id: operation.op_id,
            key,
            invoke_ns,
            complete_ns,
            measure,
            issues,
        });
    }
    check_reads_in_real_time(&mut records);
    for record in &records {
        if record.issues.is_empty() {
            continue;
        }
        findings.safety.read_violations += 1;
        findings.problem(format!(
            "read of {:?} by {:?} op {} ({} – {}) {}",
            record.key,
            record.process,
            record.op_id,
            ns(record.invoke_ns),
            ns(record.complete_ns),
            record.issues.join("; ")
        ));
    }
}

/// What an answered read found, rebuilt from its reply and `list`, the
/// same process's previous read of the key (updated); `None`, counted as
/// malformed, when a list read cannot be rebuilt.
fn found<'l>(
    operation: &Operation,
    done: &Event,
    list: &'l mut Vec<String>,
    findings: &mut Findings,
) -> Option<Found<'l>> {
    Some(match &done.reply {
        Some(Reply::ReadList { shared, tail }) => {
            if let Err(error) = history::rebuild_list_read(list, *shared, tail) {
                findings.safety.malformed += 1;
                findings.problem(format!(
                    "malformed history: {:?} op {}: {error}",
                    operation.process, operation.op_id
                ));
                return None;
            }
            Found::List(list)
        }
        Some(Reply::ReadInt { value }) => Found::Int(*value),
        Some(Reply::ReadAbsent) => {
            list.clear();
            Found::Absent
        }
        other => Found::Other(format!("{other:?}")),
    })
}

/// The writes of every key, indexed for checking reads of it.
struct ReadIndexes<'a> {
    lists: BTreeMap<&'a str, ListIndex<'a>>,
    counters: BTreeMap<&'a str, CounterIndex>,
}

impl<'a> ReadIndexes<'a> {
    /// The list writes' and the increments' indexes, by key.
    fn new(operations: &'a [Operation], lists: &'a ListWrites) -> ReadIndexes<'a> {
        let list_indexes: BTreeMap<&str, ListIndex> = lists
            .iter()
            .map(|(key, written)| (*key, ListIndex::new(written)))
            .collect();
        let mut increments: BTreeMap<&str, Vec<(&Operation, i64)>> = BTreeMap::new();
        for operation in operations {
            if let Op::Increment { key, delta } = &operation.op {
                increments.entry(key).or_default().push((operation, *delta));
            }
        }
        let counter_indexes: BTreeMap<&str, CounterIndex> = increments
            .iter()
            .map(|(key, increments)| (*key, CounterIndex::new(increments)))
            .collect();
        ReadIndexes {
            lists: list_indexes,
            counters: counter_indexes,
        }
    }

    /// What later reads of `key` must not fall below, and what is wrong
    /// with `found`, read between `invoke_ns` and `complete_ns`.
    fn judge(
        &self,
        key: &str,
        found: &Found,
        invoke_ns: u64,
        complete_ns: u64,
        final_list: Option<&[String]>,
    ) -> (Option<i64>, Vec<String>) {
        match (self.lists.get(key), self.counters.get(key), found) {
            (Some(index), _, Found::List(list)) => (
                Some(list.len() as i64),
                index.check(list, invoke_ns, complete_ns, final_list),
            ),
            (Some(index), _, Found::Absent) => (
                Some(0),
                index.check(&[], invoke_ns, complete_ns, final_list),
            ),
            (_, Some(index), Found::Int(value)) => (
                index.all_positive.then_some(*value),
                index.check(*value, invoke_ns, complete_ns),
            ),
            (_, Some(index), Found::Absent) => (
                index.all_positive.then_some(0),
                index.check(0, invoke_ns, complete_ns),
            ),
            (None, None, Found::Absent) => (None, Vec::new()),
            (None, None, found) => (
                None,
                vec![format!("found {}, but nobody wrote it", found.describe())],
            ),
            (_, _, found) => (
                None,
                vec![format!(
                    "found {}, not the type its writes make",
                    found.describe()
                )],
            ),
        }
    }
}

/// A read that began after another read of the same key completed must
/// find at least as much.
fn check_reads_in_real_time(records: &mut [ReadRecord]) {
    let mut by_key: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (position, record) in records.iter().enumerate() {
        if record.measure.is_some() {
            by_key.entry(record.key).or_default().push(position);
        }
    }
    for positions in by_key.values() {
        let mut done: Vec<(u64, i64, usize)> = positions
            .iter()
            .map(|&p| (records[p].complete_ns, records[p].measure.unwrap_or(0), p))
            .collect();
        done.sort_unstable();
        // The running maximum of what the reads completed so far found.
        let mut running: Vec<(i64, usize)> = Vec::with_capacity(done.len());
        for &(_, measure, position) in &done {
            let best = match running.last() {
                Some(&(max, at)) if max >= measure => (max, at),
                _ => (measure, position),
            };
            running.push(best);
        }
        for &position in positions {
            let record = &records[position];
            let earlier = done.partition_point(|(at, _, _)| *at < record.invoke_ns);
            if earlier == 0 {
                continue;
            }
            let (max, at) = running[earlier - 1];
            let measure = record.measure.unwrap_or(0);
            if max > measure {
                let issue = format!(
                    "went back in time: found {measure}, where {:?} op {}, which completed \
                     before this read began, found {max}",
                    records[at].process, records[at].op_id
                );
                records[position].issues.push(issue);
            }
        }
    }
}

/// Whether a run exercised the fault paths it is meant to (counted from the
/// history alone: server metrics are reset by a kill).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exercise {
    pub leader_kills_planned: u64,
    pub leader_kills: u64,
    /// Leader kills with no acknowledged write invoked after them.
    pub kills_without_ack: u64,
    /// Acknowledged writes during which the leader changed (a kill or a
    /// new leader seen by the monitor).
    pub acks_after_leader_change: u64,
    /// Of those, answered by the registry as duplicates after a retry.
    pub duplicates_after_leader_change: u64,
    /// Every acknowledged write answered as a duplicate.
    pub duplicates: u64,
    /// Acknowledged writes retried at least once.
    pub retried: u64,
    /// Why the run is not conclusive (empty: it is).
    pub missing: Vec<String>,
}

/// The fault kinds that kill the leader.
pub const LEADER_KILL_KINDS: [&str; 1] = ["kill-leader"];

/// Counts what the run exercised; `planned_leader_kills` is what the
/// schedule promised.
pub fn exercise(events: &[Event], planned_leader_kills: u64) -> Exercise {
    let mut result = Exercise {
        leader_kills_planned: planned_leader_kills,
        ..Exercise::default()
    };
    let operations = history::pair(events).unwrap_or_default();
    let (kills, changes) = leader_kills_and_changes(events);
    result.leader_kills = kills.len() as u64;
    // The session workload's writes only: a read changes nothing a retry
    // could duplicate, and keyed calls and claims have figures of their own.
    let acked: Vec<&Operation> = operations
        .iter()
        .filter(|o| {
            matches!(o.process, Process::Client(_))
                && is_session_write(&o.op)
                && o.outcome() == EventType::Ok
        })
        .collect();
    for kill in &kills {
        if !acked.iter().any(|o| o.invoke_ns > *kill) {
            result.kills_without_ack += 1;
        }
    }
    count_acknowledged_writes(&mut result, &acked, &changes);
    result.missing = not_exercised(&result, planned_leader_kills, &operations);
    result
}

/// The times of the leader kills, and of every leader change (a kill, or
/// a new leader seen by the monitor after its first sighting), sorted.
fn leader_kills_and_changes(events: &[Event]) -> (Vec<u64>, Vec<u64>) {
    let mut kills = Vec::new();
    let mut changes = Vec::new();
    // The monitor's first sighting is the initial leader, not a change.
    let mut first_leader_seen = false;
    for event in events {
        match (&event.op, event.kind) {
            (Op::Fault { kind, .. }, EventType::Invoke)
                if LEADER_KILL_KINDS.contains(&kind.as_str()) =>
            {
                kills.push(event.time_ns);
                changes.push(event.time_ns);
            }
            (Op::LeaderChange { .. }, _) if !first_leader_seen => first_leader_seen = true,
            (Op::LeaderChange { .. }, _) => changes.push(event.time_ns),
            _ => {}
        }
    }
    changes.sort_unstable();
    (kills, changes)
}

/// Counts the acknowledged writes answered as duplicates, retried, and
/// spanning a leader change (of `changes`, sorted).
fn count_acknowledged_writes(result: &mut Exercise, acked: &[&Operation], changes: &[u64]) {
    for operation in acked {
        let done = operation.completion.as_ref().expect("ok has a completion");
        if done.duplicate {
            result.duplicates += 1;
        }
        if done.attempts > 1 {
            result.retried += 1;
        }
        let first_change = changes.partition_point(|t| *t <= operation.invoke_ns);
        let changed = changes.get(first_change).is_some_and(|t| *t < done.time_ns);
        if changed {
            result.acks_after_leader_change += 1;
            // The lifecycle client's resends are deliberate, not retries
            // the library made after losing a reply.
            if done.duplicate && done.attempts > 1 && !matches!(operation.op, Op::Lifecycle { .. })
            {
                result.duplicates_after_leader_change += 1;
            }
        }
    }
}

/// Why the run counted in `result` is not conclusive (empty: it is).
fn not_exercised(
    result: &Exercise,
    planned_leader_kills: u64,
    operations: &[Operation],
) -> Vec<String> {
    let mut missing = Vec::new();
    if result.leader_kills < planned_leader_kills {
        missing.push(format!(
            "only {} of {planned_leader_kills} planned leader kills happened",
            result.leader_kills
        ));
    }
    if result.kills_without_ack > 0 {
        missing.push(format!(
            "{} leader kills were not followed by an acknowledged operation",
            result.kills_without_ack
        ));
    }
    // The keyed workload (when it ran) must have had keys acknowledged.
    let keyed: Vec<&Operation> = operations
        .iter()
        .filter(|o| matches!(o.op, Op::Keyed { .. }))
        .collect();
    if !keyed.is_empty() && !keyed.iter().any(|o| o.outcome() == EventType::Ok) {
        missing.push("no keyed call was acknowledged".into());
    }
    if result.duplicates_after_leader_change == 0 {
        missing.push("no retry after a leader change was answered as a duplicate".into());
    }
    // The promises that matter most are about calls that end unknown
    // (fenced and never applied later; a key re-sent after one answered
    // from its record): a run with none has not tested them.
    if unknowns::UnknownFigures::of(operations, None).total() == 0 {
        missing.push("no session write or keyed call ended with its outcome unknown".into());
    }
    missing.extend(claims::ClaimFigures::of(operations).missing());
    missing
}

/// A write of the session workloads (appends, increments, lifecycle
/// requests): not a read, a keyed call, a claims call or the sink's log.
pub fn is_session_write(op: &Op) -> bool {
    matches!(
        op,
        Op::Append { .. } | Op::Increment { .. } | Op::Lifecycle { .. }
    )
}

/// The run's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Valid,
    Invalid,
    Unknown,
}

impl Verdict {
    /// Invalid on any safety violation; else unknown unless exercised.
    pub fn of(findings: &Findings, exercise: &Exercise) -> Verdict {
        if !findings.valid() {
            Verdict::Invalid
        } else if !exercise.missing.is_empty() {
            Verdict::Unknown
        } else {
            Verdict::Valid
        }
    }

    /// The process exit code: 0 valid, 1 invalid, 2 unknown.
    pub fn exit_code(self) -> i32 {
        match self {
            Verdict::Valid => 0,
            Verdict::Invalid => 1,
            Verdict::Unknown => 2,
        }
    }
}

#[cfg(test)]
mod tests {
    //! Hand-made histories: one per violation the checker must catch, and
    //! valid ones it must pass.
    use super::*;
    use crate::history::Event;

    /// Builds a history event by event, with explicit times.
    #[derive(Default)]
    struct H {
        events: Vec<Event>,
        seq: BTreeMap<u64, u64>,
        /// Each reader's last list read of "k" (reads are recorded as a
        /// difference from it).
        lists: BTreeMap<u64, Vec<String>>,
    }

    impl H {
        fn invoke(&mut self, t: u64, client: u64, op_id: u64, op: Op) -> &mut Self {
            self.events
                .push(Event::invoke(t, Process::Client(client), op_id, op));
            self
        }

        fn complete(
            &mut self,
            t: u64,
            client: u64,
            op_id: u64,
            kind: EventType,
            reply: Option<Reply>,
        ) -> &mut Self {
            let invoke = self
                .events
                .iter()
                .find(|e| e.process == Process::Client(client) && e.op_id == op_id)
                .expect("invoked")
                .clone();
            let mut done = Event::complete(&invoke, kind, t);
            done.reply = reply;
            done.attempts = 1;
            done.session = Some(client);
            let seq = self.seq.entry(client).or_default();
            *seq += 1;
            done.seq = Some(*seq);
            self.events.push(done);
            self
        }

        /// An append of `c{client}-s{op_id}` to "k", invoked at `t0` and
        /// completed as `kind` at `t1` with the given length.
        fn append(
            &mut self,
            client: u64,
            op_id: u64,
            t0: u64,
            t1: u64,
            kind: EventType,
            length: u64,
        ) -> &mut Self {
            self.invoke(t0, client, op_id, append_op(client, op_id));
            let reply = (kind == EventType::Ok).then_some(Reply::Appended { length });
            self.complete(t1, client, op_id, kind, reply)
        }

        #[allow(clippy::too_many_arguments)]
        fn incr(
            &mut self,
            client: u64,
            op_id: u64,
            delta: i64,
            t0: u64,
            t1: u64,
            kind: EventType,
            value: i64,
        ) -> &mut Self {
            self.invoke(
                t0,
                client,
                op_id,
                Op::Increment {
                    key: "n".into(),
                    delta,
                },
            );
            let reply = (kind == EventType::Ok).then_some(Reply::Incremented { value });
            self.complete(t1, client, op_id, kind, reply)
        }
    }

    impl H {
        /// A read of `key` by `client`, invoked at `t0` and answered at
        /// `t1` with `reply` (no session or seq: reads have none).
        fn read(
            &mut self,
            client: u64,
            op_id: u64,
            key: &str,
            t0: u64,
            t1: u64,
            reply: Reply,
        ) -> &mut Self {
            let invoke = Event::invoke(
                t0,
                Process::Client(client),
                op_id,
                Op::Read { key: key.into() },
            );
            let mut done = Event::complete(&invoke, EventType::Ok, t1);
            done.reply = Some(reply);
            done.attempts = 1;
            self.events.push(invoke);
            self.events.push(done);
            self
        }

        /// A read of the list "k" that found `list`, recorded as the
        /// workload records it.
        fn read_list(
            &mut self,
            client: u64,
            op_id: u64,
            t0: u64,
            t1: u64,
            list: &[&str],
        ) -> &mut Self {
            let list: Vec<String> = list.iter().map(|v| v.to_string()).collect();
            let previous = self.lists.entry(client).or_default();
            let reply = history::list_read_reply(previous, &list);
            *previous = list;
            self.read(client, op_id, "k", t0, t1, reply)
        }

        /// A read of the counter "n" that found `value`.
        fn read_counter(
            &mut self,
            client: u64,
            op_id: u64,
            t0: u64,
            t1: u64,
            value: i64,
        ) -> &mut Self {
            self.read(client, op_id, "n", t0, t1, Reply::ReadInt { value })
        }
    }

    /// The valid history with reads of both keys that a linearizable
    /// store allows: while appends and increments are in flight, right
    /// after acknowledgements, seeing an unknown append and an unknown
    /// increment that took effect, by two readers.
    fn valid_with_reads() -> (H, Vec<NodeFinal>) {
        let (mut h, finals) = valid();
        h.read_list(9, 1, 2, 4, &[])
            .read_list(9, 2, 12, 14, &["c1-s1"])
            .read_list(8, 1, 12, 32, &["c1-s1", "c2-s1"])
            .read_list(9, 3, 35, 38, &["c1-s1", "c2-s1", "c1-s2"])
            .read_list(8, 2, 39, 41, &["c1-s1", "c2-s1", "c1-s2"])
            .read_list(9, 4, 82, 86, &["c1-s1", "c2-s1", "c1-s2", "c1-s4"])
            .read_list(8, 3, 92, 95, &["c1-s1", "c2-s1", "c1-s2", "c1-s4"])
            .read(9, 5, "n", 95, 99, Reply::ReadAbsent)
            .read_counter(9, 6, 108, 112, 12)
            .read_counter(8, 4, 106, 109, 7)
            .read_counter(9, 7, 135, 140, 15)
            .read(9, 8, "nobody-wrote-this", 140, 141, Reply::ReadAbsent);
        (h, finals)
    }

    /// Reads a linearizable store can give pass.
    #[test]
    fn a_valid_history_with_reads_passes() {
        let (h, finals) = valid_with_reads();
        let findings = check(&h.events, &finals);
        assert!(findings.valid(), "{findings:#?}");
        let figures = crate::report::figures(1, 9, &h.events, &exercise(&h.events, 0), 200, 0);
        assert_eq!(
            (
                figures.reads_ok,
                figures.reads_ok_of_lists,
                figures.reads_ok_of_counters
            ),
            (12, 7, 4)
        );
        assert_eq!(figures.attempted, 9, "reads are not among the writes");
    }

    /// The number of read violations once `read` is added to the valid
    /// history with reads, and the first problem.
    fn read_violations(read: impl FnOnce(&mut H)) -> (u64, String) {
        let (mut h, finals) = valid_with_reads();
        read(&mut h);
        let findings = check(&h.events, &finals);
        let total = findings.safety.total();
        assert_eq!(total, findings.safety.read_violations, "{findings:#?}");
        (
            total,
            findings.problems.first().cloned().unwrap_or_default(),
        )
    }

    #[test]
    fn a_stale_list_read_is_caught() {
        // c1-s4 was acknowledged at 90, before the read began.
        let (count, problem) = read_violations(|h| {
            h.read_list(7, 1, 92, 95, &["c1-s1", "c2-s1", "c1-s2"]);
        });
        assert_eq!(count, 1);
        assert!(
            problem.contains("stale") && problem.contains("c1-s4"),
            "{problem}"
        );
    }

    #[test]
    fn a_list_read_missing_an_acknowledged_append_is_caught() {
        // c2-s1 (acknowledged at 30) missing from the middle: stale, and
        // no prefix of the final list either — still one violating read.
        let (count, problem) = read_violations(|h| {
            h.read_list(7, 1, 35, 38, &["c1-s1", "c1-s2"]);
        });
        assert_eq!(count, 1);
        assert!(problem.contains("misses c2-s1"), "{problem}");
        assert!(problem.contains("no prefix"), "{problem}");
    }

    #[test]
    fn a_list_read_seeing_a_future_append_is_caught() {
        // c1-s4 was invoked at 80, after this read completed at 44.
        let (count, problem) = read_violations(|h| {
            h.read_list(7, 1, 41, 44, &["c1-s1", "c2-s1", "c1-s2", "c1-s4"]);
        });
        assert_eq!(count, 1);
        assert!(
            problem.contains("c1-s4") && problem.contains("after the read"),
            "{problem}"
        );
    }

    #[test]
    fn list_reads_out_of_the_final_order_or_twice_or_failed_are_caught() {
        // Each read at [15, 18], when only c1-s1 had been acknowledged and
        // the longest read so far had one element: nothing but its own
        // list is wrong.
        for (list, defect) in [
            (&["c2-s1", "c1-s1"][..], "no prefix"),
            (&["c1-s1", "c1-s1"][..], "more than once"),
            (&["c1-s1", "c1-s3"][..], "every request for it failed"),
            (&["c1-s1", "c9-s9"][..], "never appended"),
        ] {
            let (count, problem) = read_violations(|h| {
                h.read_list(7, 1, 15, 18, list);
            });
            assert_eq!(count, 1, "{list:?}");
            assert!(problem.contains(defect), "{list:?}: {problem}");
        }
    }

    #[test]
    fn a_list_read_going_back_in_time_is_caught() {
        // Reader 9 saw the unknown c1-s2 (until 38); a read begun after
        // that may not miss it, although it was never acknowledged.
        let (count, problem) = read_violations(|h| {
            h.read_list(7, 1, 39, 42, &["c1-s1", "c2-s1"]);
        });
        assert_eq!(count, 1);
        assert!(problem.contains("back in time"), "{problem}");
    }

    /// An absent read forgets the reader's previous list, as the workload
    /// does: a later reply that claims to share elements with it cannot be
    /// rebuilt, and is malformed.
    #[test]
    fn a_list_read_after_an_absent_one_shares_nothing() {
        let (mut h, finals) = valid();
        h.read_list(9, 1, 12, 14, &["c1-s1"])
            .read(9, 2, "k", 15, 16, Reply::ReadAbsent)
            .read(
                9,
                3,
                "k",
                17,
                18,
                Reply::ReadList {
                    shared: 1,
                    tail: vec![],
                },
            );
        let findings = check(&h.events, &finals);
        assert_eq!(findings.safety.malformed, 1, "{findings:#?}");
    }

    #[test]
    fn counter_reads_outside_their_bounds_are_caught() {
        // Before 99 no increment had begun: nothing to see.
        let (count, problem) = read_violations(|h| {
            h.read_counter(7, 1, 95, 99, 5);
        });
        assert_eq!(count, 1);
        assert!(problem.contains("future"), "{problem}");
        // Both acknowledged (5 and 3) before 135: at least 8.
        let (count, problem) = read_violations(|h| {
            h.read_counter(7, 1, 135, 140, 5);
        });
        assert_eq!(count, 1);
        assert!(problem.contains("stale"), "{problem}");
        // Within [8, 15], but the increment acknowledged at 130 returned 15.
        let (count, problem) = read_violations(|h| {
            h.read_counter(7, 1, 135, 140, 12);
        });
        assert_eq!(count, 1);
        assert!(
            problem.contains("stale") && problem.contains("returned"),
            "{problem}"
        );
        // Before the increment invoked at 120 the counter was at most 12.
        let (count, problem) = read_violations(|h| {
            h.read_counter(7, 1, 113, 118, 15);
        });
        assert_eq!(count, 1);
        assert!(problem.contains("future"), "{problem}");
        // Reader 9 found 12 by 112: a read begun after cannot find less.
        let (count, problem) = read_violations(|h| {
            h.read_counter(7, 1, 113, 118, 7);
        });
        assert_eq!(count, 1);
        assert!(problem.contains("back in time"), "{problem}");
    }

    #[test]
    fn a_value_read_where_nothing_was_written_is_caught() {
        let (count, _) = read_violations(|h| {
            h.read(7, 1, "nobody-wrote-this", 0, 1, Reply::ReadInt { value: 3 });
        });
        assert_eq!(count, 1);
        let (count, _) = read_violations(|h| {
            h.read(
                7,
                1,
                "n",
                140,
                141,
                Reply::ReadList {
                    shared: 0,
                    tail: vec![],
                },
            );
        });
        assert_eq!(count, 1);
    }

    /// With negative deltas the bounds are: positive deltas acknowledged
    /// before the read plus every negative one possibly applied, up to the
    /// negative ones acknowledged plus every positive one possibly applied.
    #[test]
    fn counter_read_bounds_with_negative_deltas() {
        let history = |second: EventType| {
            let mut h = H::default();
            h.incr(1, 1, 10, 0, 10, EventType::Ok, 10)
                .incr(2, 1, -4, 20, 30, second, 6)
                .incr(3, 1, 5, 60, 70, EventType::Info, 0);
            h
        };
        let finals = replicas(&[], 6);
        // -4 unknown: [6, 10] at [40, 50].
        for (value, valid) in [(5, false), (6, true), (10, true), (11, false)] {
            let mut h = history(EventType::Info);
            h.read_counter(9, 1, 40, 50, value);
            let findings = check(&h.events, &finals);
            assert_eq!(
                findings.safety.read_violations,
                u64::from(!valid),
                "{value}: {findings:#?}"
            );
        }
        // -4 acknowledged: exactly 6 at [40, 50]; [6, 11] at [40, 65].
        for (value, end, valid) in [
            (6, 50, true),
            (7, 50, false),
            (11, 65, true),
            (12, 65, false),
        ] {
            let mut h = history(EventType::Ok);
            h.read_counter(9, 1, 40, end, value);
            let findings = check(&h.events, &finals);
            assert_eq!(
                findings.safety.read_violations,
                u64::from(!valid),
                "{value}: {findings:#?}"
            );
        }
    }

    /// A lifecycle request of a session idled past the TTL must be refused
    /// as expired; answered ok, it was executed on a session that should be
    /// gone.
    #[test]
    fn an_expired_session_answered_ok_is_caught() {
        let mut h = H::default();
        h.invoke(
            0,
            1,
            1,
            Op::Lifecycle {
                key: "k".into(),
                value: "c1-s1".into(),
                expect: Expect::Expired,
            },
        )
        .complete(10, 1, 1, EventType::Ok, Some(Reply::Appended { length: 1 }));
        let findings = check(&h.events, &replicas(&["c1-s1"], 0));
        assert_eq!(findings.safety.lifecycle_violations, 1, "{findings:#?}");
        assert_eq!(findings.safety.total(), 1, "{findings:#?}");
        // Refused as expired: nothing wrong.
        let mut h = H::default();
        h.invoke(
            0,
            1,
            1,
            Op::Lifecycle {
                key: "k".into(),
                value: "c1-s1".into(),
                expect: Expect::Expired,
            },
        )
        .complete(10, 1, 1, EventType::Fail, None);
        let findings = check(&h.events, &replicas(&[], 0));
        assert!(findings.valid(), "{findings:#?}");
    }

    fn append_op(client: u64, op_id: u64) -> Op {
        Op::Append {
            key: "k".into(),
            value: format!("c{client}-s{op_id}"),
        }
    }

    /// Three identical replicas holding `list` at "k" and `counter` at "n".
    fn replicas(list: &[&str], counter: i64) -> Vec<NodeFinal> {
        (1..=3)
            .map(|node| NodeFinal {
                node,
                applied_index: 100,
                state_hash: "abc".into(),
                values: Some(BTreeMap::from([
                    (
                        "k".to_string(),
                        FinalValue::List(list.iter().map(|v| v.to_string()).collect()),
                    ),
                    ("n".to_string(), FinalValue::Int(counter)),
                ])),
            })
            .collect()
    }

    /// A valid history: sequential and concurrent appends, an unknown
    /// append present once and another absent, a failed append absent,
    /// counters with an unknown increment that took effect.
    fn valid() -> (H, Vec<NodeFinal>) {
        let mut h = H::default();
        h.append(1, 1, 0, 10, EventType::Ok, 1)
            .append(2, 1, 5, 30, EventType::Ok, 2) // concurrent with c1-s1
            .append(1, 2, 20, 40, EventType::Info, 0) // unknown, applied
            .append(2, 2, 45, 50, EventType::Info, 0) // unknown, not applied
            .append(1, 3, 60, 70, EventType::Fail, 0) // failed, absent
            .append(1, 4, 80, 90, EventType::Ok, 4)
            .incr(1, 5, 5, 100, 110, EventType::Ok, 5)
            .incr(2, 3, 7, 105, 115, EventType::Info, 0) // unknown, applied
            .incr(2, 4, 3, 120, 130, EventType::Ok, 15);
        let finals = replicas(&["c1-s1", "c2-s1", "c1-s2", "c1-s4"], 15);
        (h, finals)
    }

    #[test]
    fn a_valid_history_passes() {
        let (h, finals) = valid();
        let findings = check(&h.events, &finals);
        assert!(findings.valid(), "{findings:#?}");
        assert_eq!(findings.replicas_read, 3);
    }

    #[test]
    fn a_value_appended_twice_is_duplicated() {
        let (h, _) = valid();
        let finals = replicas(&["c1-s1", "c2-s1", "c1-s2", "c1-s2", "c1-s4"], 15);
        let findings = check(&h.events, &finals);
        assert_eq!(findings.safety.duplicated, 3, "{findings:#?}"); // on each replica
    }

    #[test]
    fn a_duplicate_on_one_replica_is_caught() {
        let (h, mut finals) = valid();
        finals[2].values.as_mut().unwrap().insert(
            "k".into(),
            FinalValue::List(
                ["c1-s1", "c1-s1", "c2-s1", "c1-s2", "c1-s4"]
                    .map(String::from)
                    .to_vec(),
            ),
        );
        let findings = check(&h.events, &finals);
        assert!(findings.safety.duplicated >= 1, "{findings:#?}");
        assert!(findings.safety.divergence >= 1, "{findings:#?}");
    }

    #[test]
    fn a_missing_acknowledged_value_is_lost() {
        let (h, _) = valid();
        let finals = replicas(&["c1-s1", "c1-s2", "c1-s4"], 15);
        let findings = check(&h.events, &finals);
        assert_eq!(findings.safety.lost, 3, "{findings:#?}");
    }

    #[test]
    fn a_value_never_appended_is_phantom() {
        let (h, _) = valid();
        let finals = replicas(&["c1-s1", "c2-s1", "c1-s2", "c9-s9", "c1-s4"], 15);
        let findings = check(&h.events, &finals);
        assert_eq!(findings.safety.phantom, 3, "{findings:#?}");
    }

    #[test]
    fn a_failed_append_present_is_phantom() {
        let (h, _) = valid();
        let finals = replicas(&["c1-s1", "c2-s1", "c1-s2", "c1-s3", "c1-s4"], 15);
        let findings = check(&h.events, &finals);
        assert_eq!(findings.safety.phantom, 3, "{findings:#?}");
    }

    #[test]
    fn acknowledged_appends_out_of_real_time_order_are_caught() {
        // c1-s1 acknowledged at 10, c2-s1 invoked at 20, yet c2-s1 first.
        let mut h = H::default();
        h.append(1, 1, 0, 10, EventType::Ok, 2)
            .append(2, 1, 20, 30, EventType::Ok, 1);
        let finals = replicas(&["c2-s1", "c1-s1"], 0);
        let findings = check(&h.events, &finals);
        assert!(findings.safety.order_violations >= 3, "{findings:#?}");
    }

    #[test]
    fn one_clients_unknown_append_landing_after_its_next_is_caught() {
        // c1-s1 unknown (finished at 10), c1-s2 begun at 20: s1 may be
        // absent, but never after s2.
        let mut h = H::default();
        h.append(1, 1, 0, 10, EventType::Info, 0)
            .append(1, 2, 20, 30, EventType::Ok, 1);
        let ok = check(&h.events, &replicas(&["c1-s2"], 0));
        assert!(ok.valid(), "{ok:#?}");
        let findings = check(&h.events, &replicas(&["c1-s2", "c1-s1"], 0));
        assert_eq!(findings.safety.order_violations, 3, "{findings:#?}");
        assert_eq!(findings.safety.reply_mismatches, 0, "{findings:#?}");
    }

    #[test]
    fn concurrent_appends_may_land_in_any_order() {
        let mut h = H::default();
        h.append(1, 1, 0, 30, EventType::Ok, 2)
            .append(2, 1, 10, 20, EventType::Ok, 1);
        let findings = check(&h.events, &replicas(&["c2-s1", "c1-s1"], 0));
        assert!(findings.valid(), "{findings:#?}");
    }

    #[test]
    fn different_replies_to_one_seq_are_caught() {
        let mut h = H::default();
        h.append(1, 1, 0, 10, EventType::Ok, 1);
        // A retry of the same (session, seq) answered differently.
        h.invoke(20, 1, 2, append_op(1, 1));
        let mut done = Event::complete(h.events.last().unwrap(), EventType::Ok, 30);
        done.session = Some(1);
        done.seq = Some(1);
        done.duplicate = true;
        done.reply = Some(Reply::Appended { length: 2 });
        h.events.push(done);
        let findings = check(&h.events, &replicas(&["c1-s1"], 0));
        // The mismatch between the replies, and the second length against
        // the list on each replica.
        assert_eq!(findings.safety.reply_mismatches, 1 + 3, "{findings:#?}");
    }

    #[test]
    fn a_length_that_does_not_match_the_position_is_caught() {
        let mut h = H::default();
        h.append(1, 1, 0, 10, EventType::Ok, 1)
            .append(2, 1, 20, 30, EventType::Ok, 1);
        let findings = check(&h.events, &replicas(&["c1-s1", "c2-s1"], 0));
        assert_eq!(findings.safety.reply_mismatches, 3, "{findings:#?}");
    }

    #[test]
    fn a_counter_beyond_its_bounds_is_caught() {
        let (h, _) = valid();
        // Acknowledged 5 + 3, unknown 7: 8..=15 allowed.
        let findings = check(
            &h.events,
            &replicas(&["c1-s1", "c2-s1", "c1-s2", "c1-s4"], 18),
        );
        assert_eq!(findings.safety.counter_violations, 3, "{findings:#?}");
        let findings = check(
            &h.events,
            &replicas(&["c1-s1", "c2-s1", "c1-s2", "c1-s4"], 7),
        );
        assert_eq!(findings.safety.counter_violations, 3, "{findings:#?}");
    }

    #[test]
    fn a_counter_within_bounds_but_no_subset_sum_is_caught() {
        let mut h = H::default();
        h.incr(1, 1, 5, 0, 10, EventType::Ok, 5)
            .incr(2, 1, 7, 0, 10, EventType::Info, 0)
            .incr(3, 1, 4, 0, 10, EventType::Info, 0);
        // 5 + {0, 4, 7, 11}: 14 is within [5, 16] but no subset.
        let findings = check(&h.events, &replicas(&[], 14));
        assert_eq!(findings.safety.counter_violations, 3, "{findings:#?}");
        let findings = check(&h.events, &replicas(&[], 16));
        assert!(findings.valid(), "{findings:#?}");
    }

    #[test]
    fn an_increment_applied_twice_shows_in_the_returned_values() {
        // Two increments of 5: the second returned 15, so something added
        // another 5 in between, yet nothing was unknown.
        let mut h = H::default();
        h.incr(1, 1, 5, 0, 10, EventType::Ok, 5)
            .incr(1, 2, 5, 20, 30, EventType::Ok, 15);
        let findings = check(&h.events, &replicas(&[], 15));
        assert!(findings.safety.counter_violations >= 1, "{findings:#?}");
    }

    #[test]
    fn equal_returned_values_are_caught() {
        let mut h = H::default();
        h.incr(1, 1, 5, 0, 10, EventType::Ok, 5)
            .incr(2, 1, 5, 0, 10, EventType::Ok, 5);
        let findings = check(&h.events, &replicas(&[], 10));
        assert!(findings.safety.counter_violations >= 1, "{findings:#?}");
    }

    #[test]
    fn returned_values_against_real_time_are_caught() {
        // Client 2 began after client 1 was acknowledged, yet returned the
        // smaller value: it was applied first.
        let mut h = H::default();
        h.incr(1, 1, 5, 0, 10, EventType::Ok, 8)
            .incr(2, 1, 3, 20, 30, EventType::Ok, 3);
        let findings = check(&h.events, &replicas(&[], 8));
        assert_eq!(findings.safety.order_violations, 1, "{findings:#?}");
        assert_eq!(findings.safety.counter_violations, 0, "{findings:#?}");
    }

    #[test]
    fn a_discarded_retry_answered_ok_is_caught() {
        let mut h = H::default();
        h.invoke(
            0,
            1,
            1,
            Op::Lifecycle {
                key: "k".into(),
                value: "c1-s1".into(),
                expect: Expect::Applied,
            },
        )
        .complete(10, 1, 1, EventType::Ok, Some(Reply::Appended { length: 1 }));
        h.invoke(
            20,
            1,
            2,
            Op::Lifecycle {
                key: "k".into(),
                value: "c1-s1".into(),
                expect: Expect::Discarded,
            },
        )
        .complete(30, 1, 2, EventType::Ok, Some(Reply::Appended { length: 1 }));
        let findings = check(&h.events, &replicas(&["c1-s1"], 0));
        assert_eq!(findings.safety.lifecycle_violations, 1, "{findings:#?}");
    }

    #[test]
    fn different_state_hashes_are_divergence() {
        let (h, mut finals) = valid();
        finals[1].state_hash = "def".into();
        let findings = check(&h.events, &finals);
        assert_eq!(findings.safety.divergence, 1, "{findings:#?}");
        let (h, mut finals) = valid();
        finals[2].applied_index = 99;
        let findings = check(&h.events, &finals);
        assert_eq!(findings.safety.divergence, 1, "{findings:#?}");
    }

    #[test]
    fn an_unpaired_completion_is_malformed() {
        let (mut h, finals) = valid();
        h.events.remove(0);
        let findings = check(&h.events, &finals);
        assert_eq!(findings.safety.malformed, 1, "{findings:#?}");
    }

    fn fault(t: u64, op_id: u64, kind: &str, event: EventType) -> Event {
        let mut e = Event::invoke(
            t,
            Process::Nemesis,
            op_id,
            Op::Fault {
                kind: kind.into(),
                nodes: vec![1],
            },
        );
        e.kind = event;
        e
    }

    #[test]
    fn exercise_counts_kills_and_duplicates_after_leader_changes() {
        let mut h = H::default();
        h.append(1, 1, 0, 10, EventType::Ok, 1);
        h.events
            .push(fault(15, 1, "kill-leader", EventType::Invoke));
        h.append(1, 2, 12, 40, EventType::Ok, 2);
        let last = h.events.len() - 1;
        h.events[last].duplicate = true;
        h.events[last].attempts = 3;
        h.events.push(fault(45, 1, "kill-leader", EventType::Info));
        // An append whose outcome is unknown (never applied), so that
        // only the kill's lack of an acknowledgement is missing.
        h.append(2, 1, 20, 30, EventType::Info, 0);
        h.events.sort_by_key(|e| e.time_ns);
        let exercise = exercise(&h.events, 1);
        assert_eq!(exercise.leader_kills, 1);
        // The duplicate's op was invoked before the kill: no ack after it.
        assert_eq!(exercise.kills_without_ack, 1);
        assert_eq!(exercise.duplicates_after_leader_change, 1);
        assert_eq!(exercise.acks_after_leader_change, 1);
        assert_eq!(exercise.missing.len(), 1, "{exercise:?}");
        let findings = check(&h.events, &replicas(&["c1-s1", "c1-s2"], 0));
        assert_eq!(Verdict::of(&findings, &exercise), Verdict::Unknown);

        h.append(1, 3, 50, 60, EventType::Ok, 3);
        let exercise_more = super::exercise(&h.events, 1);
        assert!(exercise_more.missing.is_empty(), "{exercise_more:?}");
        let findings = check(&h.events, &replicas(&["c1-s1", "c1-s2", "c1-s3"], 0));
        assert_eq!(Verdict::of(&findings, &exercise_more), Verdict::Valid);
        let findings = check(&h.events, &replicas(&["c1-s1", "c1-s3"], 0));
        assert_eq!(Verdict::of(&findings, &exercise_more), Verdict::Invalid);
        assert_eq!(super::exercise(&h.events, 2).missing.len(), 1);
    }

    /// The monitor's first sighting of a leader is the initial one, not a
    /// change: a duplicate answered across it does not show a retry that
    /// reached a new leader.
    #[test]
    fn the_initial_leader_is_not_a_leader_change() {
        let mut h = H::default();
        h.events.push(Event::invoke(
            5,
            Process::Monitor,
            1,
            Op::LeaderChange { leader: 1, term: 1 },
        ));
        h.append(1, 1, 0, 40, EventType::Ok, 1);
        let last = h.events.len() - 1;
        h.events[last].duplicate = true;
        h.events[last].attempts = 2;
        h.events.sort_by_key(|e| e.time_ns);
        let exercise = exercise(&h.events, 0);
        assert_eq!(exercise.acks_after_leader_change, 0, "{exercise:?}");
        assert_eq!(exercise.duplicates_after_leader_change, 0, "{exercise:?}");
        h.events.push(Event::invoke(
            20,
            Process::Monitor,
            2,
            Op::LeaderChange { leader: 2, term: 2 },
        ));
        h.events.sort_by_key(|e| e.time_ns);
        let exercise = super::exercise(&h.events, 0);
        assert_eq!(exercise.duplicates_after_leader_change, 1, "{exercise:?}");
    }

    #[test]
    fn subset_sums_are_exact() {
        let sums = subset_sums(&[1, 4, 7]).unwrap();
        assert_eq!(
            sums.into_iter().collect::<Vec<_>>(),
            [0, 1, 4, 5, 7, 8, 11, 12]
        );
    }

    /// How a keyed call of a test history completed.
    enum KDone {
        Ok(Reply, bool),
        Conflict,
        Unknown,
    }

    impl H {
        /// A keyed call by client 5: `intent` of `idem` carrying `command`
        /// on `key`, invoked at `t0`, completed as `done` at `t1`.
        #[allow(clippy::too_many_arguments)]
        fn keyed(
            &mut self,
            op_id: u64,
            idem: &str,
            key: &str,
            command: KeyedCommand,
            intent: KeyedIntent,
            t0: u64,
            t1: u64,
            done: KDone,
        ) -> &mut Self {
            let invoke = Event::invoke(
                t0,
                Process::Client(5),
                op_id,
                Op::Keyed {
                    idempotency_key: idem.into(),
                    key: key.into(),
                    command,
                    intent,
                },
            );
            let mut completion = Event::complete(&invoke, EventType::Info, t1);
            completion.attempts = 1;
            match done {
                KDone::Ok(reply, duplicate) => {
                    completion.kind = EventType::Ok;
                    completion.reply = Some(reply);
                    completion.duplicate = duplicate;
                }
                KDone::Conflict => {
                    completion.kind = EventType::Fail;
                    completion.error = Some(KEY_CONFLICT.into());
                }
                KDone::Unknown => completion.error = Some("outcome unknown".into()),
            }
            self.events.push(invoke);
            self.events.push(completion);
            self
        }

        /// Edits the completion of client 5's `op_id`.
        fn edit(&mut self, op_id: u64, edit: impl FnOnce(&mut Event)) {
            let done = self
                .events
                .iter_mut()
                .find(|e| {
                    e.process == Process::Client(5)
                        && e.op_id == op_id
                        && e.kind != EventType::Invoke
                })
                .expect("completed");
            edit(done);
        }
    }

    fn kappend(value: &str) -> KeyedCommand {
        KeyedCommand::Append {
            value: value.into(),
        }
    }

    fn kincr(delta: i64) -> KeyedCommand {
        KeyedCommand::Increment { delta }
    }

    /// A valid keyed history: an acknowledged key repeated on purpose and
    /// reused with another command (refused), keys whose first call was
    /// unknown and whose retry was answered as a duplicate, keys never
    /// resolved and not applied, on the list "kl" and the counter "kc".
    fn keyed_valid() -> H {
        use KeyedIntent::*;
        let mut h = H::default();
        h.keyed(
            1,
            "i1",
            "kl",
            kappend("v1"),
            First,
            0,
            10,
            KDone::Ok(Reply::Appended { length: 1 }, false),
        )
        .keyed(
            2,
            "i1",
            "kl",
            kappend("v1"),
            Repeat,
            12,
            14,
            KDone::Ok(Reply::Appended { length: 1 }, true),
        )
        .keyed(
            3,
            "i1",
            "kl",
            kappend("v1-conflict"),
            Conflict,
            15,
            16,
            KDone::Conflict,
        )
        .keyed(4, "i2", "kl", kappend("v2"), First, 20, 30, KDone::Unknown)
        .keyed(
            5,
            "i2",
            "kl",
            kappend("v2"),
            Retry,
            31,
            35,
            KDone::Ok(Reply::Appended { length: 2 }, true),
        )
        .keyed(6, "i3", "kl", kappend("v3"), First, 40, 50, KDone::Unknown)
        .keyed(7, "i3", "kl", kappend("v3"), Retry, 51, 55, KDone::Unknown)
        .keyed(8, "i4", "kc", kincr(7), First, 60, 70, KDone::Unknown)
        .keyed(
            9,
            "i4",
            "kc",
            kincr(7),
            Retry,
            71,
            75,
            KDone::Ok(Reply::Incremented { value: 7 }, true),
        )
        .keyed(
            10,
            "i5",
            "kc",
            kincr(3),
            First,
            80,
            90,
            KDone::Ok(Reply::Incremented { value: 10 }, false),
        )
        .keyed(
            11,
            "i5",
            "kc",
            kincr(3),
            Repeat,
            91,
            92,
            KDone::Ok(Reply::Incremented { value: 10 }, true),
        )
        .keyed(12, "i6", "kc", kincr(5), First, 93, 94, KDone::Unknown);
        h
    }

    /// Three identical replicas holding `list` at "kl" and `counter` at "kc".
    fn keyed_replicas(list: &[&str], counter: i64) -> Vec<NodeFinal> {
        (1..=3)
            .map(|node| NodeFinal {
                node,
                applied_index: 100,
                state_hash: "abc".into(),
                values: Some(BTreeMap::from([
                    (
                        "kl".to_string(),
                        FinalValue::List(list.iter().map(|v| v.to_string()).collect()),
                    ),
                    ("kc".to_string(), FinalValue::Int(counter)),
                ])),
            })
            .collect()
    }

    /// The unknown outcomes are counted and resolved: the session
    /// history's unknown appends against the final list (one applied, one
    /// fenced and never applied), its unknown increment; the keyed
    /// history's unknown calls by the key's next answer (a duplicate: an
    /// earlier call executed; an execution: none had; none: unresolved).
    #[test]
    fn unknown_outcomes_are_counted_and_resolved() {
        let (h, finals) = valid();
        let u = check(&h.events, &finals).unknowns;
        assert_eq!(
            (
                u.session_writes,
                u.appends_applied,
                u.appends_not_applied,
                u.increments
            ),
            (3, 1, 1, 1),
            "{u:?}"
        );
        assert_eq!(
            (u.keyed_calls, u.appends_undetermined, u.cut_off),
            (0, 0, 0)
        );

        let mut h = keyed_valid();
        h.keyed(
            13,
            "i7",
            "kc",
            kincr(2),
            KeyedIntent::First,
            95,
            96,
            KDone::Unknown,
        )
        .keyed(
            14,
            "i7",
            "kc",
            kincr(2),
            KeyedIntent::Retry,
            97,
            98,
            KDone::Ok(Reply::Incremented { value: 12 }, false),
        );
        let u = check(&h.events, &keyed_replicas(&["v1", "v2"], 12)).unknowns;
        assert_eq!(u.keyed_calls, 6, "{u:?}");
        assert_eq!(
            (
                u.keys_resolved_applied,
                u.keys_resolved_not_applied,
                u.keys_unresolved
            ),
            (2, 1, 2),
            "{u:?}"
        );
        assert_eq!(u.session_writes, 0);
    }

    /// A run in which nothing ended unknown has not tested the promises
    /// about unknown outcomes: it is not conclusive.
    #[test]
    fn a_run_without_unknown_outcomes_is_not_conclusive() {
        let unknown = "no session write or keyed call ended with its outcome unknown";
        let (h, _) = valid();
        assert!(!exercise(&h.events, 0).missing.iter().any(|m| m == unknown));
        let mut h = H::default();
        h.append(1, 1, 0, 10, EventType::Ok, 1);
        assert!(exercise(&h.events, 0).missing.iter().any(|m| m == unknown));
    }

    #[test]
    fn a_valid_keyed_history_passes() {
        let findings = check(&keyed_valid().events, &keyed_replicas(&["v1", "v2"], 10));
        assert!(findings.valid(), "{findings:#?}");
        // The unknown increment may also have executed.
        let findings = check(&keyed_valid().events, &keyed_replicas(&["v1", "v2"], 15));
        assert!(findings.valid(), "{findings:#?}");
        // So may the unresolved append (at most once).
        let findings = check(
            &keyed_valid().events,
            &keyed_replicas(&["v1", "v2", "v3"], 10),
        );
        assert!(findings.valid(), "{findings:#?}");
    }

    /// A server that executes a repeat again: the element twice on every
    /// replica, and the repeat answered as new with another length.
    #[test]
    fn a_keyed_append_executed_twice_is_caught() {
        let finals = keyed_replicas(&["v1", "v1", "v2"], 10);
        let findings = check(&keyed_valid().events, &finals);
        assert_eq!(findings.safety.keyed_duplicated, 3, "{findings:#?}");
        let mut h = keyed_valid();
        h.edit(2, |done| {
            done.duplicate = false;
            done.reply = Some(Reply::Appended { length: 2 });
        });
        let findings = check(&h.events, &keyed_replicas(&["v1", "v1", "v2"], 10));
        // The answers: two executions, two results; the list: a copy too
        // many, and a length that matches no position.
        assert_eq!(findings.safety.keyed_duplicated, 4, "{findings:#?}");
        assert!(findings.safety.keyed_reply_mismatches >= 2, "{findings:#?}");
    }

    /// An answer not marked duplicate after a duplicate answer came back
    /// is a second execution, even with equal results.
    #[test]
    fn a_fresh_keyed_answer_after_a_duplicate_one_is_caught() {
        let mut h = keyed_valid();
        h.keyed(
            13,
            "i2",
            "kl",
            kappend("v2"),
            KeyedIntent::Repeat,
            40,
            41,
            KDone::Ok(Reply::Appended { length: 2 }, false),
        );
        let findings = check(&h.events, &keyed_replicas(&["v1", "v2"], 10));
        assert_eq!(findings.safety.keyed_duplicated, 1, "{findings:#?}");
        assert_eq!(findings.safety.total(), 1, "{findings:#?}");
    }

    #[test]
    fn an_acknowledged_keyed_append_missing_is_lost() {
        let findings = check(&keyed_valid().events, &keyed_replicas(&["v1"], 10));
        assert_eq!(findings.safety.keyed_lost, 3, "{findings:#?}");
    }

    #[test]
    fn a_keyed_duplicate_answer_unlike_the_original_is_caught() {
        let mut h = keyed_valid();
        h.edit(11, |done| {
            done.reply = Some(Reply::Incremented { value: 13 })
        });
        let findings = check(&h.events, &keyed_replicas(&["v1", "v2"], 10));
        assert_eq!(findings.safety.keyed_reply_mismatches, 1, "{findings:#?}");
    }

    #[test]
    fn a_keyed_conflicting_command_executed_is_caught() {
        // Answered with a result instead of KEY_CONFLICT.
        let mut h = keyed_valid();
        h.edit(3, |done| {
            done.kind = EventType::Ok;
            done.error = None;
            done.reply = Some(Reply::Appended { length: 3 });
        });
        let findings = check(&h.events, &keyed_replicas(&["v1", "v2"], 10));
        assert_eq!(findings.safety.keyed_conflicts_applied, 1, "{findings:#?}");
        // Its value in the list (refused or not).
        let findings = check(
            &keyed_valid().events,
            &keyed_replicas(&["v1", "v2", "v1-conflict"], 10),
        );
        assert_eq!(findings.safety.keyed_conflicts_applied, 3, "{findings:#?}");
        // A key refused as a conflict with its own command.
        let mut h = keyed_valid();
        h.keyed(
            13,
            "i5",
            "kc",
            kincr(3),
            KeyedIntent::Repeat,
            95,
            96,
            KDone::Conflict,
        );
        let findings = check(&h.events, &keyed_replicas(&["v1", "v2"], 10));
        assert_eq!(findings.safety.keyed_reply_mismatches, 1, "{findings:#?}");
    }

    #[test]
    fn keyed_phantoms_are_caught() {
        let findings = check(
            &keyed_valid().events,
            &keyed_replicas(&["v1", "v2", "v9"], 10),
        );
        assert_eq!(findings.safety.keyed_phantom, 3, "{findings:#?}");
    }

    /// An increment applied twice: the counter beyond every sum the
    /// answers allow.
    #[test]
    fn a_keyed_increment_executed_twice_is_caught() {
        // 7 + 3 acknowledged, 5 unknown: 10 or 15, never 17 (3 twice + 7 + ...).
        let findings = check(&keyed_valid().events, &keyed_replicas(&["v1", "v2"], 13));
        assert_eq!(findings.safety.keyed_counter_violations, 3, "{findings:#?}");
        // A repeat answered as new with a new value.
        let mut h = keyed_valid();
        h.edit(11, |done| {
            done.duplicate = false;
            done.reply = Some(Reply::Incremented { value: 13 });
        });
        let findings = check(&h.events, &keyed_replicas(&["v1", "v2"], 13));
        assert_eq!(findings.safety.keyed_duplicated, 1, "{findings:#?}");
        assert_eq!(findings.safety.keyed_reply_mismatches, 1, "{findings:#?}");
    }

    /// The keyed workload (when present) must have had keys acknowledged.
    #[test]
    fn keyed_calls_none_acknowledged_are_not_exercised() {
        let mut h = H::default();
        h.keyed(
            1,
            "i1",
            "kl",
            kappend("v1"),
            KeyedIntent::First,
            0,
            10,
            KDone::Unknown,
        );
        let exercise = exercise(&h.events, 0);
        assert!(
            exercise.missing.iter().any(|m| m.contains("keyed")),
            "{exercise:#?}"
        );
        let exercise = super::exercise(&keyed_valid().events, 0);
        assert!(
            !exercise.missing.iter().any(|m| m.contains("keyed")),
            "{exercise:#?}"
        );
    }
}
