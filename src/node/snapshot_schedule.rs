//! When this node builds a snapshot of its log: every `--snapshot-every-entries`
//! applied entries, at a phase of that cycle set by the node's place among
//! the cluster's members, so that the nodes of one cluster build at
//! different indexes instead of all at once. A build costs CPU and memory
//! bandwidth; three at the same index (openraft's "logs since last" policy,
//! from the same start) take them from every replica at the same moment,
//! quorum included, and the writes of that moment wait. Staggered, at most
//! one node of a three-node cluster builds at a time and the other two still
//! make a quorum at full speed.
//!
//! Builds wanted because key records pile up in memory (they move to the
//! record store at a build) follow the same idea: a node builds once three
//! quarters of `--snapshot-every-key-records` are held and it is its turn —
//! wall-clock seconds go round the members — and at once, turn or not,
//! when all of them are.
//!
//! The same task purges the log (Raft's own purge after each build is off):
//! up to `--logs-kept-after-snapshot` entries before the last snapshot, and
//! while this node sends a snapshot to a peer (and for a while after, as the
//! receiver catches up on the log) no further than that snapshot — the
//! receiver needs the log from the entry after it, and without it would
//! need another snapshot, then another: at tens of millions of keys under
//! steady writes, without end. That hold lasts until the log past the sent
//! snapshot reaches five snapshot intervals (the log lives in memory: one
//! interval more than the builds' own hold lets it grow, so that the first
//! build after that hold does not end it); beyond, the purge goes on and
//! the receiver gets a newer snapshot. Builds are held back too while a
//! receiver catches up (a build costs the sender CPU), up to four times
//! both intervals.
//!
//! Owns the schedule (pure functions of the last snapshot index, the
//! interval, the phase and the turn), the purge point (a pure function of
//! the snapshot, the log's end, the entries kept and the sends), and the
//! task that asks Raft for a build or a purge when one is due. It runs
//! neither and decides nothing about what a snapshot holds: Raft runs the
//! build and the purge (never past its snapshot), the state machine writes
//! the snapshot. Builds
//! asked for elsewhere (an operator's request) move the schedule's base like
//! any other. The wall clock only spreads builds over time; nothing correct
//! depends on it.

use crate::network::peer::SnapshotSends;
use crate::raft_types::{NodeId, Raft};
use openraft::async_runtime::WatchReceiver;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// How often the task looks at the applied index and the key records held.
const POLL: Duration = Duration::from_millis(50);

/// How long a build asked for may take to show before it is asked again
/// (Raft ignores a request while a build runs, and a request can be lost
/// to a step down).
const ASK_AGAIN_AFTER: Duration = Duration::from_secs(1);

/// How long each member's turn for key-record builds lasts.
const TURN: Duration = Duration::from_secs(1);

/// How long after a snapshot send ends builds and the purge are still held
/// back: the receiver fetches the log written since the snapshot meanwhile.
const CATCH_UP_GRACE: Duration = Duration::from_secs(10);

/// How far builds are held back while a receiver catches up: both
/// intervals stretched this many times (the log and the key records held
/// in memory grow that much more at most).
const HOLD_STRETCH: u64 = 4;

/// How far the log past a snapshot being sent is kept, in snapshot
/// intervals: one more than builds are held back, since the log grows that
/// much while they are.
const PURGE_HOLD_STRETCH: u64 = HOLD_STRETCH + 1;

/// What the node builds for: `every_entries` applied entries, and key
/// records held in memory (published by the state machine) reaching
/// `key_records_max`; held back while `snapshot_sends` has a receiver
/// catching up. Purges keep `logs_kept` entries before the latest snapshot,
/// and while a receiver catches up, the log after the snapshot it got.
pub(crate) struct Schedule {
    pub every_entries: u64,
    /// Entries kept before the last snapshot when the log is purged.
    pub logs_kept: u64,
    pub key_records_max: usize,
    pub key_records_held: Arc<AtomicUsize>,
    pub snapshot_sends: Arc<SnapshotSends>,
}

/// Where in every cycle of `every` entries the node in place `position` of
/// `count` members builds: spread evenly over the cycle.
pub(crate) fn phase(position: usize, count: usize, every: u64) -> u64 {
    if count == 0 {
        return 0;
    }
    // `position < count`, so the phase is below `every`.
    let phase = u128::from(every) * position as u128 / count as u128;
    u64::try_from(phase).unwrap_or(0)
}

/// The index at which the next build is due, after a snapshot at `base`
/// (0: none yet): the first point `phase + k × every` at least a quarter of
/// a cycle past `base` (at least one entry), so that a node that has just
/// built or installed a snapshot does not build again at once, and the
/// builds of one node are between a quarter and one and a quarter cycles
/// apart — exactly one cycle once it is on its phase.
pub(crate) fn next_due(base: u64, every: u64, phase: u64) -> u64 {
    let every = every.max(1);
    let earliest = base.saturating_add((every / 4).max(1));
    if earliest <= phase {
        return phase;
    }
    let cycles = (earliest - phase).div_ceil(every);
    phase.saturating_add(cycles.saturating_mul(every))
}

/// This node's place among the members (voters and learners) whose ids
/// `ids` gives in order, once each, and their count; a node that is not
/// (yet) a member takes the first place of a cluster of one.
fn position(ids: impl Iterator<Item = NodeId>, node: NodeId) -> (usize, usize) {
    let (mut place, mut count) = (None, 0);
    for id in ids {
        if id == node {
            place = Some(count);
        }
        count += 1;
    }
    place.map_or((0, 1), |place| (place, count))
}

/// Whether the member in place `place` of `count` has its turn for a
/// key-record build at `now_ms` (milliseconds of the wall clock).
pub(crate) fn in_turn(now_ms: u128, place: usize, count: usize) -> bool {
    let count = count.max(1) as u128;
    (now_ms / TURN.as_millis()) % count == place as u128
}

/// Whether `held` key records call for a build: all of `max` at once,
/// three quarters in the node's turn.
pub(crate) fn key_records_due(held: usize, max: usize, turn: bool) -> bool {
    held >= max || (turn && held >= max - max / 4)
}

/// The index up to which (inclusive) the log may be purged: `logs_kept`
/// entries before the snapshot at `snapshot`, and no further than a
/// snapshot being sent (`sending`: the lowest such index) while the log
/// past it, up to `last_log`, is at most `hold_max` entries. `None`:
/// nothing to purge.
pub(crate) fn purge_upto(
    snapshot: u64,
    last_log: u64,
    logs_kept: u64,
    sending: Option<u64>,
    hold_max: u64,
) -> Option<u64> {
    let mut upto = snapshot.checked_sub(logs_kept)?;
    if let Some(sent) = sending
        && last_log.saturating_sub(sent) <= hold_max
    {
        upto = upto.min(sent);
    }
    Some(upto)
}

/// Asks Raft for a build whenever the schedule says one is due, and for a
/// purge whenever the purge point moves; ends when Raft stops.
pub(crate) async fn build_on_schedule(raft: Raft, node: NodeId, schedule: Schedule) {
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    // The snapshot index when a build was last asked for, and when.
    let mut asked: Option<(u64, Instant)> = None;
    // The last purge asked for.
    let mut purge_asked: Option<u64> = None;
    loop {
        tick.tick().await;
        let (applied, last_log, base, purged, (place, count)) = {
            let metrics = raft.metrics();
            let metrics = metrics.borrow_watched();
            (
                metrics.last_applied.as_ref().map_or(0, |id| id.index),
                metrics.last_log_index.unwrap_or(0),
                metrics.snapshot.as_ref().map_or(0, |id| id.index),
                metrics.purged.as_ref().map(|id| id.index),
                // A BTreeMap: ids in order, once each.
                position(
                    metrics
                        .membership_config
                        .membership()
                        .nodes()
                        .map(|(id, _)| *id),
                    node,
                ),
            )
        };
        let sending = schedule.snapshot_sends.log_needed_after(CATCH_UP_GRACE);
        let stretch = if sending.is_some() { HOLD_STRETCH } else { 1 };
        let every = schedule.every_entries;
        if base > 0
            && let Some(upto) = purge_upto(
                base,
                last_log,
                schedule.logs_kept,
                sending,
                PURGE_HOLD_STRETCH.saturating_mul(every),
            )
            // Past what was purged or already asked for (`None` < `Some`).
            && purge_asked.max(purged).is_none_or(|done| upto > done)
        {
            if let Err(error) = raft.trigger().purge_log(upto).await {
                tracing::debug!(%error, "Raft refused a purge request; it is stopping");
                return;
            }
            purge_asked = Some(upto);
        }
        let entries_due = applied
            >= next_due(base, every, phase(place, count, every))
                .saturating_add((stretch - 1).saturating_mul(every));
        // Spreads builds over time only; nothing decided depends on it.
        #[allow(clippy::disallowed_methods)]
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_millis());
        let records_due = key_records_due(
            schedule.key_records_held.load(Ordering::Relaxed),
            schedule
                .key_records_max
                .saturating_mul(usize::try_from(stretch).unwrap_or(1)),
            in_turn(now_ms, place, count),
        );
        if !entries_due && !records_due {
            continue;
        }
        if let Some((asked_base, at)) = asked
            && asked_base == base
            && at.elapsed() < ASK_AGAIN_AFTER
        {
            continue;
        }
        if let Err(error) = raft.trigger().snapshot().await {
            tracing::debug!(%error, "Raft refused a snapshot request; it is stopping");
            return;
        }
        asked = Some((base, Instant::now()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_nodes_build_a_third_of_a_cycle_apart() {
        let every = 9_000;
        let phases: Vec<u64> = (0..3).map(|place| phase(place, 3, every)).collect();
        assert_eq!(phases, [0, 3_000, 6_000]);
        // From an empty log, each node's first build comes within one cycle.
        let first: Vec<u64> = phases.iter().map(|p| next_due(0, every, *p)).collect();
        assert_eq!(first, [9_000, 3_000, 6_000]);
        // Then one cycle apart, each on its own phase: never two at once.
        for (place, first) in first.iter().enumerate() {
            assert_eq!(next_due(*first, every, phases[place]), first + every);
        }
    }

    #[test]
    fn a_snapshot_just_taken_or_installed_puts_the_next_build_off() {
        let every = 1_000;
        // Installed at 3_010, just past this node's point 3_000: the next
        // point is a cycle later, not a build at once.
        assert_eq!(next_due(3_010, every, 0), 4_000);
        // Installed at 2_900, a tenth of a cycle before the point: that
        // point is too close, so the next one.
        assert_eq!(next_due(2_900, every, 0), 4_000);
        // A quarter of a cycle before the point: it stands.
        assert_eq!(next_due(2_750, every, 0), 3_000);
    }

    #[test]
    fn key_records_wait_for_the_turn_until_all_are_held() {
        let max = 100_000;
        assert!(!key_records_due(74_999, max, true));
        assert!(key_records_due(75_000, max, true));
        assert!(!key_records_due(99_999, max, false));
        assert!(key_records_due(100_000, max, false));
        // Turns go round the members, one second each.
        let turns: Vec<usize> = (0..6)
            .map(|second| {
                (0..3)
                    .filter(|place| in_turn(second * 1_000 + 500, *place, 3))
                    .count()
            })
            .collect();
        assert_eq!(turns, [1; 6], "exactly one member's turn at a time");
        assert!(in_turn(4_200, 1, 3));
        assert!(in_turn(123, 0, 1) && in_turn(123, 0, 0));
    }

    #[test]
    fn the_purge_keeps_entries_and_the_log_a_receiver_needs_up_to_a_bound() {
        // 1,000 entries kept before the snapshot.
        assert_eq!(purge_upto(10_000, 12_000, 1_000, None, 50_000), Some(9_000));
        assert_eq!(purge_upto(500, 600, 1_000, None, 50_000), None, "too short");
        assert_eq!(purge_upto(1_000, 1_200, 1_000, None, 50_000), Some(0));
        // A snapshot at 5,000 being sent: its receiver needs the log after
        // it, so nothing past it goes...
        assert_eq!(
            purge_upto(10_000, 12_000, 1_000, Some(5_000), 50_000),
            Some(5_000)
        );
        // ...though newer snapshots were built meanwhile...
        assert_eq!(
            purge_upto(45_000, 55_000, 1_000, Some(5_000), 50_000),
            Some(5_000)
        );
        // ...until the log past it would exceed the bound.
        assert_eq!(
            purge_upto(45_000, 55_001, 1_000, Some(5_000), 50_000),
            Some(44_000)
        );
        // Sending the latest snapshot holds nothing more than usual.
        assert_eq!(
            purge_upto(10_000, 12_000, 1_000, Some(10_000), 50_000),
            Some(9_000)
        );
        assert_eq!(purge_upto(10_000, 10_000, 0, None, 50_000), Some(10_000));
        // The first build after the builds' own hold (due four cycles
        // after the sent snapshot's) still keeps the log the receiver
        // needs: the purge's bound is one cycle longer.
        let (every, sent) = (10_000, 30_500);
        let delayed = next_due(sent, every, 0) + (HOLD_STRETCH - 1) * every;
        assert_eq!(
            purge_upto(
                delayed,
                delayed + every / 4,
                1_000,
                Some(sent),
                PURGE_HOLD_STRETCH * every
            ),
            Some(sent)
        );
    }

    #[test]
    fn tiny_intervals_and_huge_indexes_stay_in_range() {
        assert_eq!(next_due(0, 1, 0), 1);
        assert_eq!(next_due(5, 1, 0), 6);
        assert_eq!(next_due(0, 0, 0), 1);
        assert_eq!(next_due(u64::MAX - 1, 10, 3), u64::MAX);
        assert_eq!(phase(2, 3, u64::MAX), u64::MAX / 3 * 2);
        assert_eq!(phase(0, 0, 100), 0);
    }
}
