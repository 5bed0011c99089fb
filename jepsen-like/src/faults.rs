//! The fault schedule: which faults a run injects, in which order, when
//! (planned) and for how long, decided up front from the seed alone (and
//! from which fault kinds the server under test supports). Executing the
//! schedule belongs to the runner; this module does no IO.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// SIGKILL the leader, restart it after the fault's duration.
    KillLeader,
    /// SIGKILL a node picked by the schedule (leader or not), restart it.
    KillRandom,
    /// SIGKILL every node, restart them all.
    KillAll,
    /// SIGSTOP the leader for longer than the election timeout, then SIGCONT.
    PauseLeader,
    /// Cut the leader off from both followers (both directions).
    IsolateLeader,
    /// Cut one follower off from both other nodes.
    IsolateFollower,
    /// Cut the leader from one follower; the other follower still talks to
    /// both (a bridge).
    Bridge,
    /// Block the leader's link to one follower, one direction only.
    OneWay,
    /// The leader applies the next executes but never sends their replies,
    /// so clients must retry requests that were applied.
    DropReply,
    /// A short session TTL set through the config entry, then restored.
    ShortTtl,
}

impl FaultKind {
    pub const ALL: [FaultKind; 10] = [
        FaultKind::KillLeader,
        FaultKind::KillRandom,
        FaultKind::KillAll,
        FaultKind::PauseLeader,
        FaultKind::IsolateLeader,
        FaultKind::IsolateFollower,
        FaultKind::Bridge,
        FaultKind::OneWay,
        FaultKind::DropReply,
        FaultKind::ShortTtl,
    ];

    /// The name used in histories and reports.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillLeader => "kill-leader",
            FaultKind::KillRandom => "kill-random",
            FaultKind::KillAll => "kill-all",
            FaultKind::PauseLeader => "pause-leader",
            FaultKind::IsolateLeader => "isolate-leader",
            FaultKind::IsolateFollower => "isolate-follower",
            FaultKind::Bridge => "bridge",
            FaultKind::OneWay => "one-way",
            FaultKind::DropReply => "drop-reply",
            FaultKind::ShortTtl => "short-ttl",
        }
    }

    /// Needs partitions of the peer links (the per-link proxies of local
    /// processes, or packet filters in containers).
    pub fn needs_partitions(self) -> bool {
        matches!(
            self,
            FaultKind::IsolateLeader
                | FaultKind::IsolateFollower
                | FaultKind::Bridge
                | FaultKind::OneWay
        )
    }
}

/// One planned fault.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedFault {
    /// Planned start since the run began; a fault starts no sooner, and
    /// later if the one before it is not over yet.
    pub start: Duration,
    pub kind: FaultKind,
    /// How long the fault lasts (for kills: how long the nodes stay down).
    pub duration: Duration,
    /// Picks among candidates where the kind needs a choice (which node to
    /// kill, which follower to isolate): an index taken modulo their count.
    pub pick: u32,
    /// DropReply: how many replies to drop.
    pub count: u32,
}

/// What shapes a schedule.
#[derive(Clone, Debug)]
pub struct ScheduleOptions {
    pub seed: u64,
    pub duration: Duration,
    pub leader_kills: u32,
    /// The kinds the server supports; others are left out.
    pub kinds: Vec<FaultKind>,
    /// Longest Raft election timeout: pauses last longer.
    pub election_timeout_max: Duration,
}

/// No fault starts before this (the cluster warms up, clients register).
pub const WARM_UP: Duration = Duration::from_secs(3);
/// No fault starts within this of the end (faults heal, clients recover).
pub const COOL_DOWN: Duration = Duration::from_secs(6);
/// Least planned time between one fault's end and the next one's start.
pub const GAP: Duration = Duration::from_secs(1);
/// Planned time per fault: its duration plus recovery before the next.
pub const SLOT: Duration = Duration::from_millis(3_500);

/// The schedule of a run: the planned leader kills plus as many other
/// faults as fit, every supported kind at least once when time allows,
/// shuffled by the seed.
pub fn schedule(options: &ScheduleOptions) -> Vec<PlannedFault> {
    let mut rng = ChaCha8Rng::seed_from_u64(options.seed ^ 0x6a65_7073_656e);
    let window = options
        .duration
        .saturating_sub(WARM_UP + COOL_DOWN)
        .max(SLOT);
    let slots = (window.as_millis() / SLOT.as_millis()).max(1) as u32;
    let others: Vec<FaultKind> = FaultKind::ALL
        .into_iter()
        .filter(|kind| *kind != FaultKind::KillLeader && options.kinds.contains(kind))
        .collect();
    let mut kinds = vec![FaultKind::KillLeader; options.leader_kills as usize];
    let room = slots.saturating_sub(options.leader_kills) as usize;
    let mut extra = others.clone();
    extra.shuffle(&mut rng);
    extra.truncate(room);
    while extra.len() < room && !others.is_empty() {
        extra.push(others[rng.gen_range(0..others.len())]);
    }
    kinds.extend(extra);
    kinds.shuffle(&mut rng);
    let slot = window / kinds.len().max(1) as u32;
    let mut planned: Vec<PlannedFault> = Vec::with_capacity(kinds.len());
    for (index, kind) in kinds.into_iter().enumerate() {
        let jitter = Duration::from_millis(rng.gen_range(0..=slot.as_millis() as u64 / 4));
        // In its slot, but never before the previous fault is over.
        let earliest = planned
            .last()
            .map_or(WARM_UP, |previous| previous.start + previous.duration + GAP);
        planned.push(PlannedFault {
            start: (WARM_UP + slot * index as u32 + jitter).max(earliest),
            kind,
            duration: duration_of(kind, &mut rng, options.election_timeout_max),
            pick: rng.r#gen(),
            count: rng.gen_range(1..=3),
        });
    }
    planned
}

fn duration_of(kind: FaultKind, rng: &mut ChaCha8Rng, election_max: Duration) -> Duration {
    let mut ms = |low: u64, high: u64| Duration::from_millis(rng.gen_range(low..=high));
    match kind {
        FaultKind::KillLeader | FaultKind::KillRandom => ms(500, 2_000),
        FaultKind::KillAll => ms(500, 1_500),
        // Longer than the election timeout, so followers elect another leader.
        FaultKind::PauseLeader => election_max * 2 + ms(0, 1_000),
        FaultKind::IsolateLeader
        | FaultKind::IsolateFollower
        | FaultKind::Bridge
        | FaultKind::OneWay => ms(1_500, 3_000),
        // Time for the clients to retry the requests whose replies were lost.
        FaultKind::DropReply => ms(2_000, 3_000),
        // Long enough for the lifecycle client to idle out a short TTL.
        FaultKind::ShortTtl => ms(6_000, 8_000),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(seed: u64) -> ScheduleOptions {
        ScheduleOptions {
            seed,
            duration: Duration::from_secs(60),
            leader_kills: 5,
            kinds: FaultKind::ALL.to_vec(),
            election_timeout_max: Duration::from_millis(800),
        }
    }

    /// The same seed gives the same schedule; another seed another one.
    #[test]
    fn schedules_are_determined_by_the_seed() {
        assert_eq!(schedule(&options(7)), schedule(&options(7)));
        assert_ne!(schedule(&options(7)), schedule(&options(8)));
    }

    /// Every planned leader kill is in, every supported kind appears when
    /// there is room, unsupported kinds never, and all of it fits before the
    /// cool-down.
    #[test]
    fn schedules_hold_the_planned_faults() {
        for seed in 0..50 {
            let planned = schedule(&options(seed));
            let kills = planned
                .iter()
                .filter(|f| f.kind == FaultKind::KillLeader)
                .count();
            assert_eq!(kills, 5);
            for kind in FaultKind::ALL {
                assert!(planned.iter().any(|f| f.kind == kind), "{seed}: {kind:?}");
            }
            assert!(
                planned
                    .windows(2)
                    .all(|w| w[0].start + w[0].duration + GAP <= w[1].start),
                "{seed}: faults overlap"
            );
            let last = planned.last().unwrap();
            assert!(planned.iter().all(|f| f.start >= WARM_UP));
            assert!(
                last.start + last.duration <= Duration::from_secs(60),
                "{seed}: the last fault ends at {:?}",
                last.start + last.duration
            );
            let pauses = planned.iter().filter(|f| f.kind == FaultKind::PauseLeader);
            assert!(
                pauses
                    .into_iter()
                    .all(|f| f.duration > Duration::from_millis(800))
            );

            let mut limited = options(seed);
            limited.kinds = vec![FaultKind::KillLeader, FaultKind::KillAll];
            limited.duration = Duration::from_secs(45);
            limited.leader_kills = 3;
            let planned = schedule(&limited);
            assert_eq!(
                planned
                    .iter()
                    .filter(|f| f.kind == FaultKind::KillLeader)
                    .count(),
                3
            );
            assert!(
                planned
                    .iter()
                    .all(|f| matches!(f.kind, FaultKind::KillLeader | FaultKind::KillAll))
            );
        }
    }
}
