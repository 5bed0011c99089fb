//! The leader's cluster clock (docs/rules.md, rule 11, after LogCabin): the
//! millisecond stamp a leader puts on every registry entry it proposes. It
//! owns the leader's count of led time and nothing else: it never writes to
//! the log or the state, and never reads the wall clock.
//!
//! At the start of each term the leader confirms its leadership and applies
//! every entry before its term (the read barrier, [`crate::read_index`]),
//! then takes as its base the applied cluster time — the largest stamp in
//! its log — and from there adds only the time it has itself led, measured
//! on a monotonic clock from its first quorum acknowledgement in the term.
//! Time without a leader therefore never counts against clients, and a
//! leader whose wall clock is off by hours changes nothing.
//!
//! Led time is time with a quorum. openraft keeps a leader that has lost
//! its quorum leading for as long as no higher term reaches it, and its
//! followers may come back to the same term (restarted before their election
//! timeout, they take its heartbeats). So the clock samples the leader's
//! last quorum acknowledgement every heartbeat, and a silence longer than
//! the election timeout does not count beyond that timeout: neither while it
//! lasts (stamps stand still) nor after acknowledgements resume. A short
//! silence — a slow fsync, a lost heartbeat — counts as usual. The state
//! machine keeps the maximum stamp it has seen, so stamps never move time
//! backwards.

use crate::raft_types::{NodeId, NodeInfo, Raft};
use crate::read_index::ReadIndex;
use crate::shared::SharedState;
use futures::FutureExt;
use openraft::async_runtime::WatchReceiver;
use openraft::error::{LinearizableReadError, RaftError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::{Instant, MissedTickBehavior};

/// Why no stamp could be given.
#[derive(Debug, thiserror::Error)]
pub enum ClockError {
    #[error("not the leader")]
    NotLeader {
        leader_id: Option<NodeId>,
        leader: Option<NodeInfo>,
    },
    #[error("leadership could not be confirmed: {0}")]
    Unavailable(String),
}

/// How the clock watches the quorum.
#[derive(Clone, Copy, Debug)]
pub struct ClockTiming {
    /// How often the leader's last quorum acknowledgement is sampled (the
    /// heartbeat interval).
    pub sample_every: Duration,
    /// The longest silence of the quorum that still counts as led time (the
    /// minimum election timeout: followers do not look for another leader
    /// within it either).
    pub quorum_gap: Duration,
}

/// This node's leadership of one term, as far as the clock counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Leadership {
    term: u64,
    /// The first quorum acknowledgement seen in the term.
    since: Instant,
    /// The latest quorum acknowledgement seen.
    last_ack: Instant,
    /// Silences of the quorum in this term, beyond `quorum_gap` each.
    uncounted: Duration,
}

impl Leadership {
    fn new(term: u64, acked_at: Instant) -> Leadership {
        Leadership {
            term,
            since: acked_at,
            last_ack: acked_at,
            uncounted: Duration::ZERO,
        }
    }

    /// Records a quorum acknowledgement at `acked_at`; returns the time not
    /// counted when it ends a silence longer than `gap`.
    fn acknowledged(&mut self, acked_at: Instant, gap: Duration) -> Option<Duration> {
        if acked_at <= self.last_ack {
            return None;
        }
        let silence = acked_at - self.last_ack;
        self.last_ack = acked_at;
        let excess = silence
            .checked_sub(gap)
            .filter(|excess| !excess.is_zero())?;
        self.uncounted += excess;
        Some(excess)
    }

    /// The led time of the term at `now`: since the first acknowledgement,
    /// less every silence beyond `gap`, the current one included.
    fn led(&self, now: Instant, gap: Duration) -> Duration {
        let ongoing = now
            .saturating_duration_since(self.last_ack)
            .saturating_sub(gap);
        now.saturating_duration_since(self.since)
            .saturating_sub(self.uncounted)
            .saturating_sub(ongoing)
    }
}

#[derive(Debug, Default)]
struct Counted {
    /// Kept up to date by the sampler; created by `stamp` if it has not yet
    /// seen the term.
    leadership: Option<Leadership>,
    /// (term, base) once the term's first stamp confirmed the leadership.
    base: Option<(u64, u64)>,
}

pub struct ClusterClock {
    raft: Raft,
    state: SharedState,
    read_index: ReadIndex,
    quorum_gap: Duration,
    counted: Arc<Mutex<Counted>>,
    /// Serialises the start of a term, so one read barrier serves everyone.
    starting: tokio::sync::Mutex<()>,
}

fn lock(counted: &Mutex<Counted>) -> MutexGuard<'_, Counted> {
    counted.lock().unwrap_or_else(|p| p.into_inner())
}

impl ClusterClock {
    /// A clock for `raft`; must be created inside a tokio runtime (it
    /// samples the leader's quorum acknowledgements until dropped).
    pub fn new(
        raft: Raft,
        state: SharedState,
        read_index: ReadIndex,
        timing: ClockTiming,
    ) -> ClusterClock {
        let counted = Arc::new(Mutex::new(Counted::default()));
        tokio::spawn(sample_quorum(
            raft.clone(),
            Arc::downgrade(&counted),
            timing,
        ));
        ClusterClock {
            raft,
            state,
            read_index,
            quorum_gap: timing.quorum_gap,
            counted,
            starting: tokio::sync::Mutex::new(()),
        }
    }

    fn current_for(&self, term: u64) -> Option<u64> {
        let counted = lock(&self.counted);
        let (base_term, base_ms) = counted.base?;
        let leadership = counted.leadership.filter(|l| l.term == term)?;
        (base_term == term).then(|| {
            base_ms
                .saturating_add(leadership.led(Instant::now(), self.quorum_gap).as_millis() as u64)
        })
    }

    /// What [`ClusterClock::stamp`] would give an entry proposed now, if
    /// this node's clock already runs in the current term (its first stamp
    /// of the term was taken); `None` otherwise. Never waits.
    pub fn now_ms(&self) -> Option<u64> {
        self.current_for(self.raft.metrics().borrow_watched().current_term)
    }

    /// The stamp for an entry proposed now by this node as leader.
    pub async fn stamp(&self) -> Result<u64, ClockError> {
        let term = self.raft.metrics().borrow_watched().current_term;
        if let Some(stamp) = self.current_for(term) {
            return Ok(stamp);
        }
        let _starting = self.starting.lock().await;
        if let Some(stamp) = self.current_for(term) {
            return Ok(stamp);
        }
        self.read_index
            .confirm()
            .await
            .map_err(|error| match error {
                RaftError::APIError(LinearizableReadError::ForwardToLeader(forward)) => {
                    ClockError::NotLeader {
                        leader_id: forward.leader_id,
                        leader: forward.leader_node,
                    }
                }
                other => ClockError::Unavailable(other.to_string()),
            })?;
        // Everything before this term is applied now: the applied cluster
        // time is the largest stamp in the log.
        let term = self.raft.metrics().borrow_watched().current_term;
        let base_ms = self.state.read().registry.cluster_time_ms();
        {
            let mut counted = lock(&self.counted);
            if counted.leadership.is_none_or(|l| l.term != term) {
                // Confirmed just now by a quorum heartbeat.
                counted.leadership = Some(Leadership::new(term, Instant::now()));
            }
            counted.base = Some((term, base_ms));
        }
        tracing::info!(term, base_ms, "cluster clock starts a new term");
        self.current_for(term)
            .ok_or_else(|| ClockError::Unavailable("the term changed while starting".into()))
    }
}

/// Samples this node's last quorum acknowledgement every
/// `timing.sample_every` while it leads, until the clock is dropped.
async fn sample_quorum(raft: Raft, counted: std::sync::Weak<Mutex<Counted>>, timing: ClockTiming) {
    let mut metrics = raft.metrics();
    drop(raft);
    let mut ticks = tokio::time::interval(timing.sample_every);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // When the metrics now held were first seen. openraft reports them on
    // every turn of its core loop (at least every 1.5 heartbeats), with the
    // age of the last quorum acknowledgement at that moment: the
    // acknowledgement was that age before the report. A core that stops
    // reporting (blocked) leaves `seen_at` behind, so its silence grows.
    let mut seen_at = Instant::now();
    loop {
        ticks.tick().await;
        let Some(counted) = counted.upgrade() else {
            return;
        };
        // A change already sent completes at once; none pending, not at all.
        if let Some(changed) = metrics.changed().now_or_never() {
            if changed.is_err() {
                return;
            }
            seen_at = Instant::now();
        }
        #[allow(
            deprecated,
            reason = "the age at report time is what `seen_at` pairs with"
        )]
        let (leading, term, since_ack) = {
            let metrics = metrics.borrow_and_update();
            (
                metrics.state == openraft::ServerState::Leader,
                metrics.current_term,
                metrics.millis_since_quorum_ack.map(Duration::from_millis),
            )
        };
        // Leading counts from the first quorum acknowledgement, not from the
        // server state alone: openraft restores a restarted ex-leader as
        // leader at once, before any peer is back.
        let (true, Some(since_ack)) = (leading, since_ack) else {
            continue;
        };
        let acked_at = seen_at.checked_sub(since_ack).unwrap_or(seen_at);
        let mut counted = lock(&counted);
        match counted.leadership.as_mut() {
            Some(leadership) if leadership.term == term => {
                if let Some(excess) = leadership.acknowledged(acked_at, timing.quorum_gap) {
                    tracing::warn!(
                        term,
                        uncounted_ms = excess.as_millis() as u64,
                        "quorum acknowledgements resumed after a silence longer than the \
                         election timeout: the cluster clock did not count it"
                    );
                }
            }
            _ => counted.leadership = Some(Leadership::new(term, acked_at)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GAP: Duration = Duration::from_millis(400);

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    #[test]
    fn acknowledged_time_counts_in_full() {
        let t0 = Instant::now();
        let mut leadership = Leadership::new(7, t0);
        for step in 1..=100 {
            assert_eq!(leadership.acknowledged(t0 + ms(step * 30), GAP), None);
        }
        assert_eq!(leadership.led(t0 + ms(3_000), GAP), ms(3_000));
        // A silence up to the gap counts too.
        assert_eq!(leadership.led(t0 + ms(3_400), GAP), ms(3_400));
    }

    #[test]
    fn a_long_silence_counts_only_up_to_the_gap_while_and_after_it_lasts() {
        let t0 = Instant::now();
        let mut leadership = Leadership::new(7, t0);
        for step in 1..=10 {
            assert_eq!(leadership.acknowledged(t0 + ms(step * 100), GAP), None);
        }
        // Silent from 1 s: the clock stands still at 1.4 s.
        assert_eq!(leadership.led(t0 + ms(1_400), GAP), ms(1_400));
        assert_eq!(leadership.led(t0 + ms(5_000), GAP), ms(1_400));
        assert_eq!(leadership.led(t0 + ms(60_000), GAP), ms(1_400));
        // Acknowledged again at 60 s: 58.6 s were not counted, and the
        // clock goes on from where it stood.
        assert_eq!(
            leadership.acknowledged(t0 + ms(60_000), GAP),
            Some(ms(58_600))
        );
        assert_eq!(leadership.led(t0 + ms(60_000), GAP), ms(1_400));
        assert_eq!(leadership.led(t0 + ms(60_300), GAP), ms(1_700));
    }

    #[test]
    fn led_time_never_goes_back_across_a_silence() {
        let t0 = Instant::now();
        let mut leadership = Leadership::new(1, t0);
        let mut last = Duration::ZERO;
        let mut acked = t0;
        for step in 0..2_000u64 {
            let now = t0 + ms(step * 10);
            // Silent from 5 s to 12 s, acknowledged every 30 ms otherwise.
            let silent = (5_000..12_000).contains(&(step * 10));
            if !silent && now >= acked + ms(30) {
                acked = now;
                leadership.acknowledged(acked, GAP);
            }
            let led = leadership.led(now, GAP);
            assert!(
                led >= last,
                "led time went back at {step}: {led:?} < {last:?}"
            );
            last = led;
        }
        // The last acknowledgement before the silence was at 4.98 s, the
        // next at 12 s: of those 7.02 s, 0.4 s count.
        assert_eq!(last, ms(19_990 - (12_000 - 4_980 - 400)));
    }

    #[test]
    fn stale_or_repeated_acknowledgements_change_nothing() {
        let t0 = Instant::now();
        let mut leadership = Leadership::new(1, t0 + ms(100));
        assert_eq!(leadership.acknowledged(t0, GAP), None);
        assert_eq!(leadership.acknowledged(t0 + ms(100), GAP), None);
        assert_eq!(leadership.last_ack, t0 + ms(100));
        assert_eq!(leadership.uncounted, Duration::ZERO);
    }
}
