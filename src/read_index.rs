//! The linearizable-read barrier: openraft's read index, raised to the last
//! log id of a term this node restored as leader, and the wait until that
//! index is applied. Used by the Client `Read` RPC and by the cluster clock
//! at the start of a term. It owns that rule and nothing else: it does not
//! read the state or answer anyone.
//!
//! Why the raise. A node that starts with a committed vote for itself was
//! the leader of that term when it stopped. It does not lead that term
//! again (the node turns openraft's `enable_leader_restore` off where it
//! builds its Raft config, see docs/architecture.md), so in practice the raise
//! never applies; it is kept as a second line should a restored leader ever
//! serve reads: the committed index it restarts with is only what was last
//! recorded (the record is not fsynced on its own), so its read index could
//! fall below writes it had acknowledged, and every entry of its term may
//! have been acknowledged. A new term needs nothing more: its first entry
//! follows everything any earlier leader acknowledged.

use crate::raft_types::{LogId, NodeId, Raft, TypeConfig, Vote};
use openraft::RaftLogReader;
use openraft::async_runtime::WatchReceiver;
use openraft::error::{Fatal, LinearizableReadError, RaftError};
use openraft::storage::RaftLogStorage;

type ReadError = RaftError<TypeConfig, LinearizableReadError<TypeConfig>>;

/// The read barrier of one node.
#[derive(Clone)]
pub struct ReadIndex {
    raft: Raft,
    /// The last log id of the term this node led when it started, if any.
    restored: Option<LogId>,
}

/// The last log id of a term `node` was leading when its state was saved:
/// the vote is a committed vote for `node` and the last entry is of that
/// leader. `None` otherwise (a follower, a candidate, or a leader that had
/// not appended anything in its term).
pub fn restored_leader_last_log(
    node: NodeId,
    vote: Option<&Vote>,
    last_log_id: Option<LogId>,
) -> Option<LogId> {
    let vote = vote?;
    if !vote.is_committed() || vote.leader_id().node_id != node {
        return None;
    }
    let last = last_log_id?;
    (last.leader_id == *vote.leader_id()).then_some(last)
}

/// What [`restored_leader_last_log`] says of a log store about to be handed
/// to openraft.
pub async fn restored_from<S>(node: NodeId, store: &mut S) -> Result<Option<LogId>, anyhow::Error>
where
    S: RaftLogStorage<TypeConfig> + RaftLogReader<TypeConfig>,
{
    let vote = store.read_vote().await?;
    let last = store.get_log_state().await?.last_log_id;
    Ok(restored_leader_last_log(node, vote.as_ref(), last))
}

impl ReadIndex {
    /// The barrier for `raft`, whose log held `restored` (see
    /// [`restored_from`]) when the node started.
    pub fn new(raft: Raft, restored: Option<LogId>) -> ReadIndex {
        if let Some(restored) = restored {
            tracing::info!(%restored, "was the leader of its term when it stopped: it will not lead it again, and reads in that term would wait for its last entry");
        }
        ReadIndex { raft, restored }
    }

    /// Confirms this node leads (a quorum heartbeat) and waits until
    /// everything a read must see is applied. Returns the index read at.
    /// The caller bounds it with its deadline.
    pub async fn confirm(&self) -> Result<u64, ReadError> {
        let (read_log_id, applied) = self
            .raft
            .get_read_log_id(openraft::ReadPolicy::ReadIndex)
            .await?;
        let vote = self.raft.metrics().borrow_watched().vote;
        let floor = self
            .restored
            .filter(|restored| vote.is_committed() && restored.leader_id == *vote.leader_id());
        let read_at = read_log_id.index().max(floor.map_or(0, |id| id.index));
        if applied.map_or(0, |id| id.index) < read_at {
            self.raft
                .wait(None)
                .applied_index_at_least(Some(read_at), "linearizable read")
                .await
                .map_err(|_| RaftError::Fatal(Fatal::Stopped))?;
        }
        Ok(read_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_id(term: u64, leader: NodeId, index: u64) -> LogId {
        openraft::testing::log_id::<TypeConfig>(term, leader, index)
    }

    fn leading(term: u64, node: NodeId) -> Vote {
        Vote::new_committed(term, node)
    }

    #[test]
    fn a_leader_restored_in_its_term_reads_at_its_last_entry() {
        let vote = leading(3, 1);
        assert_eq!(
            restored_leader_last_log(1, Some(&vote), Some(log_id(3, 1, 42))),
            Some(log_id(3, 1, 42))
        );
    }

    #[test]
    fn nothing_to_raise_for_followers_candidates_or_an_empty_term() {
        // A follower's vote names another leader.
        assert_eq!(
            restored_leader_last_log(2, Some(&leading(3, 1)), Some(log_id(3, 1, 42))),
            None
        );
        // A candidate's vote is not committed.
        assert_eq!(
            restored_leader_last_log(1, Some(&Vote::new(4, 1)), Some(log_id(3, 1, 42))),
            None
        );
        // Leader of term 4 with nothing appended in it yet.
        assert_eq!(
            restored_leader_last_log(1, Some(&leading(4, 1)), Some(log_id(3, 2, 42))),
            None
        );
        assert_eq!(
            restored_leader_last_log(1, None, Some(log_id(3, 1, 42))),
            None
        );
        assert_eq!(
            restored_leader_last_log(1, Some(&leading(3, 1)), None),
            None
        );
    }
}
