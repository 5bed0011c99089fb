//! A node's CPU priority while it catches up: from the moment it is far
//! behind the cluster's commit (a snapshot arriving, or a long stretch of
//! log to apply) until it is close again, the whole process runs at a
//! lower priority (`--catch-up-nice`), so that on a machine it shares with
//! other nodes its catch-up takes the CPU the quorum leaves over instead of
//! an equal share of it (docs/state-beyond-ram.md §4.9j).
//!
//! Owns the watch that decides when a node is catching up ([`Lag`], pure,
//! with a gap between its two thresholds so that it does not flap) and the
//! one lever it pulls on Linux: the nice value of the node's *autogroup*,
//! the scheduling group Linux gives each session when
//! `kernel.sched_autogroup_enabled` is on. That lever reaches every thread
//! of the node at once (the node's own priority between its threads is
//! kept), weighs the node against the other groups on the machine (no
//! thread's nice value does: it counts only inside its group), and any
//! user may set it back (a thread's nice value, once raised, needs
//! `CAP_SYS_NICE` to come back down). A node only uses it when it leads
//! its session, so that it never lowers a shell or a supervisor it shares
//! one with. Where the lever is missing (another OS, a node sharing its
//! session, autogroup off, a CPU cgroup below the root) the node says so
//! once and runs at its priority.
//!
//! A lowered node that starves there takes its priority back for the rest
//! of that catch-up: it reads, each time it looks, whether an append from
//! its leader arrived since (the peer service's `LeaderContact`) and how
//! late its own look is, and counts a second of either silence, or standing
//! for election, as starving ([`Lag`]).
//!
//! It must not decide anything Raft or the registry decides, nor slow the
//! node in any other way: a catch-up only gets less of a contended CPU.

use crate::metrics::NodeMetrics;
use crate::network::leader_contact::LeaderContact;
use crate::raft_types::Raft;
use crate::shared::snapshot_file::SnapshotInbox;
use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use std::sync::Arc;
use std::time::Duration;

/// Entries between the cluster's commit and this node's applied index from
/// which a follower counts as catching up.
pub const BEHIND_ENTRIES: u64 = 2_000;
/// Entries behind at which it counts as caught up again.
pub const CAUGHT_UP_ENTRIES: u64 = 100;
/// How often the watch looks.
const LOOK_EVERY: Duration = Duration::from_millis(250);
/// The least silence that counts as starving a lowered node (see
/// [`starved_after`]).
const STARVED_AFTER_MIN: Duration = Duration::from_secs(1);

/// How long a lowered node may go without hearing its leader, or without
/// its own look coming round, before it counts as starved: a second, or
/// four heartbeats where they are slower (a leader heard between
/// heartbeats is no sign of anything).
fn starved_after(heartbeat: Duration) -> Duration {
    heartbeat.saturating_mul(4).max(STARVED_AFTER_MIN)
}

/// Whether a node is catching up, and whether at its lowered priority,
/// from what it sees each time it looks.
///
/// A catch-up lowers the node; one that starves there (the leader unheard,
/// or the node's own look late, for [`starved_after`], or the node standing
/// for election) goes on at the node's normal priority until it ends: until
/// the node is close to the commit again, or leads. Weight 15 against 1,024 is next to
/// nothing on a machine whose cores are full: a lowered node can miss its
/// leader's heartbeats, stand for election again and again, and never catch
/// up (docs/state-beyond-ram.md §4.9l). A copy short for ever costs more
/// than the quorum's share the rest of the catch-up takes.
#[derive(Debug)]
pub struct Lag {
    catching_up: bool,
    /// This catch-up starved at the lowered priority.
    starved: bool,
    /// How long the leader has gone unheard during this catch-up.
    unheard: Duration,
    starved_after: Duration,
}

/// What a look found, for [`Lag::look`].
#[derive(Clone, Copy, Debug)]
pub struct Seen {
    /// This node leads: it is never behind.
    pub leading: bool,
    /// This node stands for election: it neither starts nor ends a
    /// catch-up, and a lowered one counts as starved (it did not hear its
    /// leader for an election timeout).
    pub standing: bool,
    /// A snapshot is being received or installed here, or one was since
    /// the last look.
    pub receiving_snapshot: bool,
    /// The cluster's commit index as the leader last told it.
    pub cluster_committed: Option<u64>,
    /// This node's applied index.
    pub applied: Option<u64>,
    /// An append (a heartbeat, entries, a snapshot's head) from a leader
    /// arrived since the last look.
    pub leader_heard: bool,
    /// Time since the last look ([`LOOK_EVERY`] when the node keeps up).
    pub since_last_look: Duration,
}

/// What to do with the node's priority after a look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The node began catching up: lower it.
    Lower,
    /// The node is still catching up, but starved lowered: its priority
    /// back for the rest of the catch-up.
    Starved,
    /// The node caught up (or leads): its priority back.
    Restore,
}

impl Lag {
    /// A lag that counts a lowered node starved after `starved_after` of
    /// silence ([`starved_after`]).
    pub fn new(starved_after: Duration) -> Lag {
        Lag {
            catching_up: false,
            starved: false,
            unheard: Duration::ZERO,
            starved_after,
        }
    }

    /// Takes in a look; returns what to do when something changed.
    pub fn look(&mut self, seen: Seen) -> Option<Step> {
        let behind = match (seen.cluster_committed, seen.applied) {
            (Some(committed), applied) => committed.saturating_sub(applied.unwrap_or(0)),
            (None, _) => 0,
        };
        let now = if seen.leading {
            false
        } else if seen.standing {
            self.catching_up
        } else if seen.receiving_snapshot {
            true
        } else if self.catching_up {
            behind > CAUGHT_UP_ENTRIES
        } else {
            behind >= BEHIND_ENTRIES
        };
        match (self.catching_up, now) {
            (false, true) => {
                self.catching_up = true;
                self.starved = false;
                self.unheard = Duration::ZERO;
                Some(Step::Lower)
            }
            (true, false) => {
                self.catching_up = false;
                Some(Step::Restore)
            }
            (true, true) if !self.starved => {
                if seen.standing {
                    self.starved = true;
                    return Some(Step::Starved);
                }
                self.unheard = if seen.leader_heard {
                    Duration::ZERO
                } else {
                    self.unheard.saturating_add(seen.since_last_look)
                };
                let late = seen.since_last_look.saturating_sub(LOOK_EVERY);
                (self.unheard >= self.starved_after || late >= self.starved_after).then(|| {
                    self.starved = true;
                    Step::Starved
                })
            }
            _ => None,
        }
    }
}

/// The nice value of this process's autogroup, when the process leads its
/// session (and so its group is its own).
pub struct GroupPriority {
    /// Its value when the node started.
    normal: i32,
}

impl GroupPriority {
    /// The lever, or why there is none.
    pub fn of_this_process() -> Result<GroupPriority, String> {
        if !cfg!(target_os = "linux") {
            return Err("lowering a node's priority is only done on Linux".into());
        }
        // SAFETY: plain syscalls about this process, no pointers.
        let (session, me) = unsafe { (libc::getsid(0), libc::getpid()) };
        if session != me {
            return Err(
                "the node shares its session (and scheduling group) with the \
                        process that started it"
                    .into(),
            );
        }
        match std::fs::read_to_string("/proc/sys/kernel/sched_autogroup_enabled") {
            Ok(enabled) if enabled.trim() == "1" => {}
            Ok(_) => return Err("kernel.sched_autogroup_enabled is off".into()),
            Err(error) => return Err(format!("no autogroup here: {error}")),
        }
        let cgroup = std::fs::read_to_string("/proc/self/cgroup")
            .map_err(|error| format!("reading /proc/self/cgroup: {error}"))?;
        let root_cpu_controlled = std::fs::read_to_string("/sys/fs/cgroup/cgroup.subtree_control")
            .is_ok_and(|controllers| controllers.split_whitespace().any(|c| c == "cpu"));
        if let Some(group) = cpu_cgroup(&cgroup, root_cpu_controlled) {
            return Err(format!(
                "the node runs in the CPU cgroup {group}, where autogroup does not apply \
                 (weigh the cgroup instead: cpu.weight)"
            ));
        }
        Ok(GroupPriority {
            normal: read_group_nice()?,
        })
    }

    /// Sets the group's nice value to `nice` (never below its normal
    /// value); returns the value read back.
    pub fn lower(&self, nice: i32) -> Result<i32, String> {
        set_group_nice(nice.max(self.normal))
    }

    /// Sets the group's nice value back to what it was at start; returns
    /// the value read back.
    pub fn restore(&self) -> Result<i32, String> {
        set_group_nice(self.normal)
    }
}

/// The CPU cgroup other than the root that this process is scheduled in,
/// from `/proc/self/cgroup` (`root_cpu_controlled`: cgroup v2's root hands
/// the cpu controller down). Linux applies autogroup only to tasks of the
/// root one. A v1 hierarchy with the cpu controller says it; in v2 a task
/// below the root is in a CPU group of its own (its top-level cgroup's)
/// once the root hands the controller down.
fn cpu_cgroup(cgroup: &str, root_cpu_controlled: bool) -> Option<String> {
    let mut unified = None;
    for line in cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if controllers.split(',').any(|controller| controller == "cpu") {
            return (path != "/").then(|| path.to_owned());
        }
        if id == "0" && controllers.is_empty() {
            unified = Some(path);
        }
    }
    unified
        .filter(|path| *path != "/" && root_cpu_controlled)
        .map(str::to_owned)
}

/// This process's autogroup nice value, from `/proc/self/autogroup`
/// ("/autogroup-5 nice 0").
fn read_group_nice() -> Result<i32, String> {
    let line = std::fs::read_to_string("/proc/self/autogroup")
        .map_err(|error| format!("reading /proc/self/autogroup: {error}"))?;
    parse_group_nice(&line).ok_or_else(|| format!("unexpected /proc/self/autogroup: {line:?}"))
}

fn parse_group_nice(line: &str) -> Option<i32> {
    line.split_whitespace()
        .skip_while(|word| *word != "nice")
        .nth(1)?
        .parse()
        .ok()
}

/// Sets this process's autogroup nice value (any user may raise it, and
/// lower it back to 0) and reads it back.
fn set_group_nice(nice: i32) -> Result<i32, String> {
    std::fs::write("/proc/self/autogroup", nice.to_string())
        .map_err(|error| format!("setting the autogroup's nice value to {nice}: {error}"))?;
    read_group_nice()
}

/// Watches Raft's metrics, the snapshot inbox and the leader's appends
/// until Raft stops, and sets the node's group to `nice` while it catches
/// up (never when `nice` is 0), or until it starves there ([`Lag`]).
pub async fn watch(
    node_id: u64,
    raft: Raft,
    snapshots: SnapshotInbox,
    contact: LeaderContact,
    heartbeat: Duration,
    nice: u8,
    metrics: Arc<NodeMetrics>,
) {
    if nice == 0 {
        return;
    }
    let lever = match GroupPriority::of_this_process() {
        Ok(lever) => Some(lever),
        Err(why) => {
            tracing::info!(
                node_id,
                why,
                "this node keeps its CPU priority while it catches up"
            );
            None
        }
    };
    let mut lag = Lag::new(starved_after(heartbeat));
    let mut every = tokio::time::interval(LOOK_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let raft_metrics = raft.metrics();
    let mut begun = snapshots.receptions_begun();
    let mut heard = contact.heard_mark();
    let mut looked = tokio::time::Instant::now();
    loop {
        every.tick().await;
        let now_begun = snapshots.receptions_begun();
        let now_heard = contact.heard_mark();
        let now = tokio::time::Instant::now();
        let seen = {
            let metrics = raft_metrics.borrow_watched();
            if metrics.running_state.is_err() {
                break;
            }
            Seen {
                leading: metrics.state == ServerState::Leader,
                standing: metrics.state == ServerState::Candidate,
                receiving_snapshot: snapshots.is_receiving() || now_begun != begun,
                cluster_committed: metrics.cluster_committed.map(|id| id.index),
                applied: metrics.last_applied.map(|id| id.index),
                leader_heard: now_heard != heard,
                since_last_look: now.saturating_duration_since(looked),
            }
        };
        (begun, heard, looked) = (now_begun, now_heard, now);
        let Some(step) = lag.look(seen) else {
            continue;
        };
        let what = match step {
            Step::Lower => {
                metrics.catching_up.set(1);
                metrics.catch_ups.inc();
                "catching up: the node's CPU priority is lowered"
            }
            Step::Starved => {
                metrics.catch_ups_starved.inc();
                "starved while catching up: the node's CPU priority is restored \
                 for the rest of the catch-up"
            }
            Step::Restore => {
                metrics.catching_up.set(0);
                "caught up: the node's CPU priority is restored"
            }
        };
        let Some(lever) = &lever else {
            continue;
        };
        let set = if step == Step::Lower {
            lever.lower(i32::from(nice))
        } else {
            lever.restore()
        };
        match set {
            Ok(group_nice) => tracing::info!(
                node_id,
                group_nice,
                cluster_committed = ?seen.cluster_committed,
                applied = ?seen.applied,
                receiving_snapshot = seen.receiving_snapshot,
                leader_heard = seen.leader_heard,
                since_last_look_ms = seen.since_last_look.as_millis(),
                "{what}"
            ),
            Err(error) => tracing::warn!(node_id, error, "cannot change the node's priority"),
        }
    }
    if let Some(lever) = &lever {
        let _ = lever.restore();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STARVED_AFTER: Duration = STARVED_AFTER_MIN;

    /// A look on time, the leader heard since the last.
    fn seen(committed: u64, applied: u64) -> Seen {
        Seen {
            leading: false,
            standing: false,
            receiving_snapshot: false,
            cluster_committed: Some(committed),
            applied: Some(applied),
            leader_heard: true,
            since_last_look: LOOK_EVERY,
        }
    }

    fn lag() -> Lag {
        Lag::new(STARVED_AFTER)
    }

    #[test]
    fn a_follower_is_catching_up_from_far_behind_until_close_again() {
        let mut lag = lag();
        assert_eq!(lag.look(seen(1_000, 0)), None);
        assert_eq!(lag.look(seen(BEHIND_ENTRIES - 1, 0)), None);
        assert_eq!(lag.look(seen(BEHIND_ENTRIES, 0)), Some(Step::Lower));
        // Between the thresholds it stays as it is, either way.
        assert_eq!(lag.look(seen(10_000, 10_000 - BEHIND_ENTRIES + 1)), None);
        assert_eq!(lag.look(seen(10_000, 10_000 - CAUGHT_UP_ENTRIES - 1)), None);
        assert_eq!(
            lag.look(seen(10_000, 10_000 - CAUGHT_UP_ENTRIES)),
            Some(Step::Restore)
        );
        assert_eq!(lag.look(seen(10_000, 10_000 - BEHIND_ENTRIES + 1)), None);
    }

    #[test]
    fn a_snapshot_arriving_is_catching_up_and_a_leader_never_is() {
        let mut lag = lag();
        let receiving = Seen {
            receiving_snapshot: true,
            ..seen(10, 10)
        };
        assert_eq!(lag.look(receiving), Some(Step::Lower));
        // The install done and the log applied: caught up.
        assert_eq!(lag.look(seen(10, 10)), Some(Step::Restore));
        assert_eq!(lag.look(seen(1_000_000, 0)), Some(Step::Lower));
        let leading = Seen {
            leading: true,
            ..receiving
        };
        assert_eq!(lag.look(leading), Some(Step::Restore));
        // Nothing known of the cluster's commit: not behind.
        let unknown = Seen {
            cluster_committed: None,
            ..seen(0, 0)
        };
        assert_eq!(lag.look(unknown), None);
    }

    #[test]
    fn a_lowered_node_that_stops_hearing_its_leader_starves_once_per_catch_up() {
        let mut lag = lag();
        let unheard = Seen {
            leader_heard: false,
            ..seen(10_000, 0)
        };
        // Silent before the catch-up: only the silence after lowering counts.
        assert_eq!(lag.look(unheard), Some(Step::Lower));
        // Silence that a heartbeat breaks starts again from nothing.
        for _ in 0..3 {
            assert_eq!(lag.look(unheard), None);
        }
        assert_eq!(lag.look(seen(10_000, 0)), None);
        for _ in 0..3 {
            assert_eq!(lag.look(unheard), None);
        }
        // Four looks unheard (a second): starved.
        assert_eq!(lag.look(unheard), Some(Step::Starved));
        // It stays at its priority for the rest of the catch-up, heard or not.
        assert_eq!(lag.look(unheard), None);
        assert_eq!(lag.look(seen(10_000, 5_000)), None);
        assert_eq!(lag.look(unheard), None);
        assert_eq!(lag.look(seen(10_000, 10_000)), Some(Step::Restore));
        // The next catch-up is lowered again.
        assert_eq!(lag.look(seen(20_000, 10_000)), Some(Step::Lower));
        assert_eq!(lag.look(seen(20_000, 10_000)), None);
    }

    #[test]
    fn a_lowered_node_whose_own_look_comes_late_starves() {
        let mut lag = lag();
        assert_eq!(lag.look(seen(10_000, 0)), Some(Step::Lower));
        // Late by less than the bound, the leader heard: nothing.
        let late = |by: Duration| Seen {
            since_last_look: LOOK_EVERY + by,
            ..seen(10_000, 0)
        };
        assert_eq!(
            lag.look(late(STARVED_AFTER - Duration::from_millis(1))),
            None
        );
        assert_eq!(lag.look(late(STARVED_AFTER)), Some(Step::Starved));
        // A late look before the catch-up (a paused process resumed) is not
        // starving at the lowered priority.
        let mut lag = self::lag();
        assert_eq!(lag.look(late(Duration::from_secs(30))), Some(Step::Lower));
        assert_eq!(lag.look(seen(10_000, 0)), None);
    }

    #[test]
    fn a_lowered_node_that_stands_for_election_starves_and_stays_at_its_priority() {
        let mut lag = lag();
        let standing = |committed: u64, applied: u64| Seen {
            standing: true,
            ..seen(committed, applied)
        };
        // Standing far behind starts no catch-up (a candidate is never
        // lowered)...
        assert_eq!(lag.look(standing(10_000, 0)), None);
        assert_eq!(lag.look(seen(10_000, 0)), Some(Step::Lower));
        // ... and a lowered one standing has starved.
        assert_eq!(lag.look(standing(10_000, 0)), Some(Step::Starved));
        // Back to following, still behind: not lowered again.
        assert_eq!(lag.look(seen(10_000, 100)), None);
        assert_eq!(lag.look(standing(10_000, 100)), None);
        // Caught up: restored (a no-op), and the next catch-up lowers.
        assert_eq!(lag.look(seen(10_000, 10_000)), Some(Step::Restore));
        assert_eq!(lag.look(seen(20_000, 10_000)), Some(Step::Lower));
        // Leading ends it, starved or not.
        assert_eq!(lag.look(standing(20_000, 10_000)), Some(Step::Starved));
        let leading = Seen {
            leading: true,
            ..seen(20_000, 10_000)
        };
        assert_eq!(lag.look(leading), Some(Step::Restore));
        assert_eq!(lag.look(seen(20_000, 10_000)), Some(Step::Lower));
    }

    #[test]
    fn slow_heartbeats_stretch_the_silence_that_counts_as_starving() {
        assert_eq!(starved_after(Duration::from_millis(30)), STARVED_AFTER_MIN);
        assert_eq!(
            starved_after(Duration::from_millis(500)),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn only_a_task_of_the_root_cpu_group_has_an_autogroup() {
        // cgroup v1 (with the v2 line of a hybrid mount): the cpu line says.
        let hybrid = "9:name=systemd:/\n4:memory:/jobs/7\n1:cpu:/\n0::/\n";
        assert_eq!(cpu_cgroup(hybrid, true), None);
        let v1_below = "3:cpu,cpuacct:/system.slice/oncekv.service\n0::/\n";
        assert_eq!(
            cpu_cgroup(v1_below, false).as_deref(),
            Some("/system.slice/oncekv.service")
        );
        // cgroup v2: below the root only once the root hands cpu down.
        let v2 = "0::/user.slice/user-1000.slice/session-2.scope\n";
        assert_eq!(
            cpu_cgroup(v2, true).as_deref(),
            Some("/user.slice/user-1000.slice/session-2.scope")
        );
        assert_eq!(cpu_cgroup(v2, false), None);
        assert_eq!(cpu_cgroup("0::/\n", true), None);
    }

    #[test]
    fn the_group_nice_value_is_read_from_its_proc_line() {
        assert_eq!(parse_group_nice("/autogroup-5 nice 0\n"), Some(0));
        assert_eq!(parse_group_nice("/autogroup-123 nice 19"), Some(19));
        assert_eq!(parse_group_nice("/autogroup-1 nice -3"), Some(-3));
        assert_eq!(parse_group_nice("garbage"), None);
    }
}
