//! The unknown outcomes of a run: how many calls of the session and keyed
//! workloads the client library reported as "outcome unknown", and how
//! each came out — seen applied in the replicas' final state, never
//! applied (fenced), or not determined. Counts only: the safety checks
//! that judge those calls (an unknown append landing after its client's
//! next one, an unknown key executed twice) live in the checker beside
//! this module. Pure: a paired history and the final values in, figures
//! out.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{FinalValue, final_list};
use crate::history::{EventType, KeyedIntent, Op, Operation, Process};

/// The unknown outcomes of one run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnknownFigures {
    /// Session writes (appends, increments, lifecycle requests) whose
    /// outcome the client reported unknown.
    pub session_writes: u64,
    /// Of those, appends (lifecycle requests included) whose value the
    /// final state holds: applied before the client gave up on them.
    pub appends_applied: u64,
    /// Appends whose value the final state does not hold: fenced by the
    /// library and, as the promise goes, never applied later.
    pub appends_not_applied: u64,
    /// Appends not judged (no replica's values could be read).
    pub appends_undetermined: u64,
    /// Increments reported unknown: their deltas are bounded by the
    /// counter check, not resolved one by one.
    pub increments: u64,
    /// Keyed calls reported unknown.
    pub keyed_calls: u64,
    /// Keys with an unknown call, by how the key's next answer resolved
    /// it: a duplicate (an earlier call had executed), an execution (none
    /// had), or no answer before the run ended.
    pub keys_resolved_applied: u64,
    pub keys_resolved_not_applied: u64,
    pub keys_unresolved: u64,
    /// Session writes and keyed calls still in flight when the workload
    /// stopped (not counted above: the client never reported on them).
    pub cut_off: u64,
}

impl UnknownFigures {
    /// Calls the client reported unknown, of both workloads.
    pub fn total(&self) -> u64 {
        self.session_writes + self.keyed_calls
    }

    /// Counts the unknown outcomes of `operations`, resolving unknown
    /// appends against `final_values` (one replica's values; `None`: not
    /// read).
    pub fn of(
        operations: &[Operation],
        final_values: Option<&BTreeMap<String, FinalValue>>,
    ) -> UnknownFigures {
        let mut figures = UnknownFigures::default();
        // The keys' calls in history order: (reported unknown, answered ok,
        // answered as a duplicate).
        let mut keys: BTreeMap<&str, Vec<(bool, bool, bool)>> = BTreeMap::new();
        for operation in operations {
            if !matches!(operation.process, Process::Client(_)) {
                continue;
            }
            let outcome = operation.outcome();
            if outcome == EventType::Invoke
                && matches!(
                    operation.op,
                    Op::Append { .. }
                        | Op::Increment { .. }
                        | Op::Lifecycle { .. }
                        | Op::Keyed { .. }
                )
            {
                figures.cut_off += 1;
                continue;
            }
            let unknown = outcome == EventType::Info;
            match &operation.op {
                Op::Append { key, value } | Op::Lifecycle { key, value, .. } if unknown => {
                    figures.session_writes += 1;
                    match final_values.map(|values| final_list(values.get(key))) {
                        Some(Ok(list)) if list.contains(value) => figures.appends_applied += 1,
                        Some(Ok(_)) => figures.appends_not_applied += 1,
                        Some(Err(_)) | None => figures.appends_undetermined += 1,
                    }
                }
                Op::Increment { .. } if unknown => {
                    figures.session_writes += 1;
                    figures.increments += 1;
                }
                Op::Keyed {
                    idempotency_key,
                    intent,
                    ..
                } if *intent != KeyedIntent::Conflict => {
                    if unknown {
                        figures.keyed_calls += 1;
                    }
                    let ok = outcome == EventType::Ok;
                    let duplicate = ok
                        && operation
                            .completion
                            .as_ref()
                            .is_some_and(|done| done.duplicate);
                    keys.entry(idempotency_key)
                        .or_default()
                        .push((unknown, ok, duplicate));
                }
                _ => {}
            }
        }
        for calls in keys.values() {
            let Some(first_unknown) = calls.iter().position(|(unknown, _, _)| *unknown) else {
                continue;
            };
            match calls[first_unknown..].iter().find(|(_, ok, _)| *ok) {
                Some((_, _, true)) => figures.keys_resolved_applied += 1,
                Some((_, _, false)) => figures.keys_resolved_not_applied += 1,
                None => figures.keys_unresolved += 1,
            }
        }
        figures
    }
}
