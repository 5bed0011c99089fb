//! Test-only fault hooks shared by the node: a handle on how many execute
//! replies this node should still drop, whether it starts with a rewound
//! commit record, the rules version it bootstraps a new cluster at, and
//! how long a snapshot it receives waits before its intake. It
//! owns those settings and nothing else; the services decide where a fault
//! applies. Faults can be
//! set only in a `fault-injection` build (the `--fault` flag of
//! `oncekv node`, or the Admin `InjectFault` RPC); in any other build the
//! counter stays zero.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A shared, cloneable handle on this node's pending faults.
#[derive(Clone, Debug, Default)]
pub struct FaultControl {
    /// Executes (not duplicates) still to be applied without a reply.
    drop_execute_replies: Arc<AtomicU64>,
    /// Whether the node starts with its committed index taken back to the
    /// start of its last term (`--fault rewind-commit-record`).
    rewind_commit_record: bool,
    /// Whether the node starts with the entries of its last term after the
    /// first dropped (`--fault lose-term-tail`).
    lose_term_tail: bool,
    /// The rules version a cluster this node bootstraps starts at, when not
    /// the latest (`--fault bootstrap-at-rules-N`): a cluster as an older
    /// build made it, to raise in a test.
    bootstrap_rules: Option<oncekv_core::RulesVersion>,
    /// How long each snapshot received waits, its reception begun, before
    /// its intake (`--fault hold-snapshot-intake-ms-N`).
    snapshot_intake_hold: Option<Duration>,
}

impl FaultControl {
    /// A handle that will drop the replies of the next `drop_execute_replies`
    /// executes (`--fault drop-first-execute-reply` starts with 1).
    pub fn new(drop_execute_replies: u64) -> FaultControl {
        FaultControl {
            drop_execute_replies: Arc::new(AtomicU64::new(drop_execute_replies)),
            rewind_commit_record: false,
            lose_term_tail: false,
            bootstrap_rules: None,
            snapshot_intake_hold: None,
        }
    }

    /// The same, each snapshot received waiting `hold` before its intake:
    /// the node counts as receiving one (and catching up) meanwhile.
    pub fn holding_snapshot_intake(self, hold: Duration) -> FaultControl {
        FaultControl {
            snapshot_intake_hold: Some(hold),
            ..self
        }
    }

    /// How long a snapshot received waits before its intake, if at all.
    pub fn snapshot_intake_hold(&self) -> Option<Duration> {
        self.snapshot_intake_hold
    }

    /// The same, bootstrapping a new cluster at rules version `rules`.
    pub fn bootstrapping_at_rules(self, rules: oncekv_core::RulesVersion) -> FaultControl {
        FaultControl {
            bootstrap_rules: Some(rules),
            ..self
        }
    }

    /// The rules version to bootstrap a new cluster at, if not the latest.
    pub fn bootstrap_rules(&self) -> Option<oncekv_core::RulesVersion> {
        self.bootstrap_rules
    }

    /// The same, starting with the committed index of the log taken back to
    /// the first entry of its last term, as a power loss can.
    pub fn rewinding_commit_record(self) -> FaultControl {
        FaultControl {
            rewind_commit_record: true,
            ..self
        }
    }

    /// The same, starting with the entries of its last term after the
    /// first dropped and the committed index taken back to that first entry,
    /// as a power loss can on a leader whose followers stored its entries
    /// before its own fdatasync.
    pub fn losing_term_tail(self) -> FaultControl {
        FaultControl {
            lose_term_tail: true,
            ..self
        }
    }

    /// Whether the node must drop the tail of its last term.
    pub fn loses_term_tail(&self) -> bool {
        self.lose_term_tail
    }

    /// Whether the node must rewind its recovered committed index.
    pub fn rewinds_commit_record(&self) -> bool {
        self.rewind_commit_record
    }

    /// Drops `count` more execute replies; returns how many are pending now.
    pub fn add_execute_reply_drops(&self, count: u64) -> u64 {
        let previous = self
            .drop_execute_replies
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |pending| {
                Some(pending.saturating_add(count))
            })
            .unwrap_or_else(|pending| pending);
        previous.saturating_add(count)
    }

    /// Execute replies still to be dropped.
    pub fn pending_execute_reply_drops(&self) -> u64 {
        self.drop_execute_replies.load(Ordering::SeqCst)
    }

    /// Called once per executed (not duplicate) request: true when its reply
    /// must be dropped, consuming one pending drop.
    pub fn take_execute_reply_drop(&self) -> bool {
        self.drop_execute_replies
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |pending| {
                pending.checked_sub(1)
            })
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each pending drop is taken exactly once, by any clone of the handle.
    #[test]
    fn drops_are_taken_once() {
        let faults = FaultControl::new(1);
        let shared = faults.clone();
        assert_eq!(shared.add_execute_reply_drops(2), 3);
        assert!(faults.take_execute_reply_drop());
        assert!(shared.take_execute_reply_drop());
        assert!(faults.take_execute_reply_drop());
        assert!(!faults.take_execute_reply_drop());
        assert_eq!(faults.pending_execute_reply_drops(), 0);
        assert!(!FaultControl::default().take_execute_reply_drop());
    }
}
