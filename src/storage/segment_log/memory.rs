//! The in-memory index of the log: every entry after the last purge, in
//! index order, and the last purged log id. Appends, truncates and purges
//! follow the same rules at runtime and in recovery's replay, so whatever
//! was accepted once replays the same way. It must not do IO.

use std::collections::VecDeque;

use openraft::RaftTypeConfig;
use openraft::entry::RaftEntry;
use openraft::type_config::alias::LogIdOf;

/// An append that would not continue the log where it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct OutOfOrder {
    /// The index the next entry must have (with an empty log: at least this).
    pub(super) expected_index: u64,
    pub(super) found_index: u64,
}

pub(super) struct MemoryLog<C: RaftTypeConfig> {
    /// Consecutive entries; the front one's index is the first in the log.
    entries: VecDeque<C::Entry>,
    purged: Option<LogIdOf<C>>,
}

impl<C: RaftTypeConfig> Default for MemoryLog<C> {
    fn default() -> Self {
        Self {
            entries: VecDeque::new(),
            purged: None,
        }
    }
}

impl<C> MemoryLog<C>
where
    C: RaftTypeConfig,
    C::Entry: Clone,
{
    pub(super) fn last_purged(&self) -> Option<LogIdOf<C>> {
        self.purged.clone()
    }

    /// The last entry's id, or the last purged id when no entry is left.
    pub(super) fn last_log_id(&self) -> Option<LogIdOf<C>> {
        self.entries
            .back()
            .map(|entry| entry.log_id())
            .or_else(|| self.purged.clone())
    }

    fn first_index(&self) -> Option<u64> {
        self.entries.front().map(|entry| entry.index())
    }

    /// Checks that `entries` continue the log and returns how many leading
    /// ones to skip because they are at or below the last purged index (a
    /// durable snapshot covers them; openraft's storage suite appends such
    /// entries after a purge, openraft itself does not). The rest must have
    /// consecutive indexes, the first right after the last entry, or — with
    /// no entry left — after the last purged one (a log may start at any
    /// index: openraft starts at 0, a follower after a snapshot).
    pub(super) fn accept(&self, entries: &[C::Entry]) -> Result<usize, OutOfOrder> {
        let floor = self.purged.as_ref().map(|purged| purged.index);
        let skip = entries
            .iter()
            .take_while(|entry| floor.is_some_and(|floor| entry.index() <= floor))
            .count();
        let mut next = self
            .entries
            .back()
            .map(|last| last.index().saturating_add(1));
        for entry in &entries[skip..] {
            let found_index = entry.index();
            if let Some(expected_index) = next
                && found_index != expected_index
            {
                return Err(OutOfOrder {
                    expected_index,
                    found_index,
                });
            }
            next = Some(found_index.checked_add(1).ok_or(OutOfOrder {
                expected_index: found_index,
                found_index,
            })?);
        }
        Ok(skip)
    }

    /// Adds entries accepted by [`Self::accept`], the skipped ones removed.
    pub(super) fn append(&mut self, entries: Vec<C::Entry>) {
        self.entries.extend(entries);
    }

    /// Drops entries with index `>= index`.
    pub(super) fn truncate(&mut self, index: u64) {
        if let Some(first) = self.first_index() {
            let keep = usize::try_from(index.saturating_sub(first)).unwrap_or(usize::MAX);
            self.entries.truncate(keep);
        }
    }

    /// Drops entries up to `log_id` and remembers it as last purged.
    /// Purges never go backwards.
    pub(super) fn purge(&mut self, log_id: LogIdOf<C>) {
        if self
            .purged
            .as_ref()
            .is_some_and(|purged| purged.index >= log_id.index)
        {
            return;
        }
        if let Some(first) = self.first_index()
            && log_id.index >= first
        {
            let drop = (log_id.index - first).saturating_add(1);
            let drop = usize::try_from(drop).unwrap_or(usize::MAX);
            self.entries.drain(..drop.min(self.entries.len()));
        }
        self.purged = Some(log_id);
    }

    /// Clones of the entries with index in `[start, end)` (`end` `None`: to the last).
    pub(super) fn range(&self, start: u64, end: Option<u64>) -> Vec<C::Entry> {
        let Some(first) = self.first_index() else {
            return Vec::new();
        };
        let to_position =
            |index: u64| usize::try_from(index.saturating_sub(first)).unwrap_or(usize::MAX);
        let from = to_position(start).min(self.entries.len());
        let to = end
            .map_or(self.entries.len(), to_position)
            .min(self.entries.len());
        if from >= to {
            return Vec::new();
        }
        self.entries.range(from..to).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    openraft::declare_raft_types!(TestConfig: D = u64, R = ());

    fn entries(
        indexes: std::ops::RangeInclusive<u64>,
    ) -> Vec<openraft::type_config::alias::EntryOf<TestConfig>> {
        indexes
            .map(|index| openraft::testing::blank_ent::<TestConfig>(1, 1, index))
            .collect()
    }

    fn indexes(log: &MemoryLog<TestConfig>) -> Vec<u64> {
        log.range(0, None).iter().map(|e| e.log_id.index).collect()
    }

    /// Purges below, inside and past the entries drop exactly the entries
    /// up to the purged index, and never go backwards.
    #[test]
    fn purge_drops_exactly_up_to_the_index() {
        let mut log = MemoryLog::<TestConfig>::default();
        log.append(entries(5..=9));
        log.purge(openraft::testing::log_id::<TestConfig>(1, 1, 3));
        assert_eq!(indexes(&log), vec![5, 6, 7, 8, 9]);
        log.purge(openraft::testing::log_id::<TestConfig>(1, 1, 6));
        assert_eq!(indexes(&log), vec![7, 8, 9]);
        log.purge(openraft::testing::log_id::<TestConfig>(1, 1, 4));
        assert_eq!(log.last_purged().map(|id| id.index), Some(6));
        log.purge(openraft::testing::log_id::<TestConfig>(1, 1, 20));
        assert_eq!(indexes(&log), Vec::<u64>::new());
        assert_eq!(log.last_log_id().map(|id| id.index), Some(20));
    }

    /// Appends must continue the log: after the last entry, or after the
    /// last purged index when it is empty; a batch must be consecutive;
    /// entries at or below the last purged index are skipped.
    #[test]
    fn appends_must_continue_the_log() {
        let mut log = MemoryLog::<TestConfig>::default();
        assert_eq!(log.accept(&entries(4..=6)), Ok(0));
        log.append(entries(4..=6));
        assert_eq!(
            log.accept(&entries(8..=8)),
            Err(OutOfOrder {
                expected_index: 7,
                found_index: 8
            })
        );
        let mut gap = entries(7..=7);
        gap.extend(entries(9..=9));
        assert_eq!(
            log.accept(&gap),
            Err(OutOfOrder {
                expected_index: 8,
                found_index: 9
            })
        );
        log.truncate(5);
        assert_eq!(indexes(&log), vec![4]);
        log.purge(openraft::testing::log_id::<TestConfig>(1, 1, 10));
        assert_eq!(log.accept(&entries(9..=12)), Ok(2));
        assert_eq!(log.accept(&entries(11..=12)), Ok(0));
        let mut skipped_then_gap = entries(9..=10);
        skipped_then_gap.extend(entries(12..=12));
        assert_eq!(
            log.accept(&skipped_then_gap),
            Ok(2),
            "anything may follow an empty log"
        );
    }
}
