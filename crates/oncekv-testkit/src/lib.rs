//! What the tools that run local clusters of `oncekv node` processes
//! share (the test suite, the jepsen-like harness and its failover
//! benchmark, the examples, the load generator): the one local-cluster
//! controller ([`LocalCluster`], in `local`), free loopback ports, the
//! leader a set of `Status` replies agrees on, whether their state hashes
//! agree (compared at equal indexes), a one-line-per-node
//! description, log tails, worker threads per node and the percentile every
//! load tool reports. It must not depend on the server, whose nodes the
//! tools drive only over the wire and by signals.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;

use oncekv_wire::proto::StatusReply;

pub mod local;
pub use local::{
    LocalCluster, NODES, Options, StatusClient, Statuses, Timing, ask_all, poll_until,
};

/// `--worker-threads` for each of `nodes` nodes sharing this machine: their
/// share of its cores, at least one. Each node defaulting to one thread per
/// core would put `nodes` times as many threads on the cores, and the
/// wake-ups and switches between them cost more than the threads bring.
pub fn worker_threads_per_node(nodes: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |cores| cores.get());
    (cores / nodes.max(1)).max(1)
}

/// The leader every answering node agrees on: it answered as "leader", and
/// every node that answered names it in the same term. `None` while there is
/// none or they disagree (an election, a stale leader). Nodes that did not
/// answer do not veto.
pub fn agreed_leader(statuses: &BTreeMap<u64, Result<StatusReply, String>>) -> Option<u64> {
    let replies: Vec<&StatusReply> = statuses.values().filter_map(|s| s.as_ref().ok()).collect();
    let leader = replies
        .iter()
        .filter(|reply| reply.role == "leader")
        .max_by_key(|reply| reply.term)?;
    replies
        .iter()
        .all(|reply| reply.leader_id == leader.node_id && reply.term == leader.term)
        .then_some(leader.node_id)
}

/// What the state hashes of a set of `Status` replies say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HashAgreement {
    /// Every node answered with a hash of this applied index, all equal.
    Agree { index: u64, hash: String },
    /// Every node answered with a hash of this applied index, not all
    /// equal: the replicas diverge (rule 15).
    Differ { index: u64 },
    /// A node did not answer, has no hash yet, or the hashes are of
    /// different indexes (a node computes its hash in the background at
    /// most once a second: ask again).
    Undecided,
}

/// Compares the hashes of `statuses` at equal indexes: a reply's
/// `state_hash` describes its `state_hash_index`, which trails its
/// `applied_index` while the node applies writes. Whoever compares hashes
/// across nodes compares them this way.
pub fn hash_agreement(statuses: &BTreeMap<u64, Result<StatusReply, String>>) -> HashAgreement {
    let mut replies = Vec::with_capacity(statuses.len());
    for status in statuses.values() {
        match status {
            Ok(reply) if !reply.state_hash.is_empty() => replies.push(reply),
            _ => return HashAgreement::Undecided,
        }
    }
    let Some(first) = replies.first() else {
        return HashAgreement::Undecided;
    };
    let index = first.state_hash_index;
    if replies.iter().any(|reply| reply.state_hash_index != index) {
        return HashAgreement::Undecided;
    }
    if replies
        .iter()
        .all(|reply| reply.state_hash == first.state_hash)
    {
        HashAgreement::Agree {
            index,
            hash: first.state_hash.clone(),
        }
    } else {
        HashAgreement::Differ { index }
    }
}

/// Whether every node of `statuses` answered and its newest state hash is
/// of its current applied index (its background hash has caught up).
pub fn hashes_caught_up(statuses: &BTreeMap<u64, Result<StatusReply, String>>) -> bool {
    statuses.values().all(|status| {
        status.as_ref().is_ok_and(|reply| {
            !reply.state_hash.is_empty() && reply.state_hash_index == reply.applied_index
        })
    })
}

/// One line per node: role, term, leader, indexes, or why it did not answer.
pub fn describe(statuses: &BTreeMap<u64, Result<StatusReply, String>>) -> String {
    statuses
        .iter()
        .map(|(id, status)| match status {
            Ok(reply) => format!(
                "  node {id}: {} term {} leader {} last_log {} applied {} hash {} at {}",
                reply.role,
                reply.term,
                reply.leader_id,
                reply.last_log_index,
                reply.applied_index,
                reply.state_hash.get(..12).unwrap_or(&reply.state_hash),
                reply.state_hash_index,
            ),
            Err(error) => format!("  node {id}: {error}"),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The ports [`free_ports`] hands out: below Linux's default ephemeral range
/// (32768–60999), so no outgoing connection of this or another process (a
/// client, a peer, a load generator) can take a port between the moment it
/// is handed out and the moment a node binds it, or while a killed node is
/// down before its restart on the same port. Port 0 would pick from the
/// ephemeral range, and did collide under a full test suite.
const PORTS: std::ops::Range<u16> = 20_000..32_768;

/// Every port this process has handed out: never handed out twice, so two
/// clusters of one test binary never share a port even after one of them
/// released it (a node being restarted keeps its ports).
static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// `count` distinct free loopback ports from `PORTS`, never one this
/// process handed out before: each checked by binding it, all bound at once,
/// then released for the nodes to bind. The search starts at a random port so
/// that concurrent processes (a harness beside a test suite) rarely meet.
pub fn free_ports(count: usize) -> std::io::Result<Vec<SocketAddr>> {
    use rand::Rng;
    let mut handed_out = HANDED_OUT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let span = PORTS.end - PORTS.start;
    #[allow(clippy::disallowed_methods)] // a tool's port search, not the registry
    let first = rand::thread_rng().gen_range(0..span);
    let mut listeners = Vec::with_capacity(count);
    for step in 0..span {
        if listeners.len() == count {
            break;
        }
        let port = PORTS.start + (first + step) % span;
        if handed_out.contains(&port) {
            continue;
        }
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            listeners.push(listener);
        }
    }
    if listeners.len() < count {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!("fewer than {count} free loopback ports in {PORTS:?}"),
        ));
    }
    let addrs = listeners
        .iter()
        .map(TcpListener::local_addr)
        .collect::<std::io::Result<Vec<_>>>()?;
    handed_out.extend(addrs.iter().map(SocketAddr::port));
    Ok(addrs)
}

/// The last `lines` lines of the log file at `path`, or why there are none.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let Ok(mut file) = File::open(path) else {
        return "(no log)".to_owned();
    };
    let mut bytes = Vec::new();
    if let Err(error) = std::io::Read::read_to_end(&mut file, &mut bytes) {
        return format!("(unreadable log: {error})");
    }
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The latency at `fraction` (0..=1) of `sorted_micros` (microseconds,
/// ascending), in milliseconds: the sample at the ceiling rank; 0 when there
/// is none. Every load tool of the project reports its percentiles this way.
pub fn percentile(sorted_micros: &[u32], fraction: f64) -> f64 {
    if sorted_micros.is_empty() {
        return 0.0;
    }
    let rank =
        ((sorted_micros.len() as f64 * fraction).ceil() as usize).clamp(1, sorted_micros.len());
    f64::from(sorted_micros[rank - 1]) / 1_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ports are distinct, outside the ephemeral range, bindable when handed
    /// out, and never handed out twice by one process.
    #[test]
    fn free_ports_are_fresh_and_below_the_ephemeral_range() {
        let first = free_ports(9).unwrap();
        let second = free_ports(9).unwrap();
        let all: std::collections::BTreeSet<u16> =
            first.iter().chain(&second).map(SocketAddr::port).collect();
        assert_eq!(all.len(), 18, "a port was handed out twice: {all:?}");
        assert!(all.iter().all(|port| PORTS.contains(port)), "{all:?}");
        for addr in &first {
            TcpListener::bind(addr).expect("a handed-out port is free");
        }
    }

    /// Percentiles pick the ceiling rank of sorted samples.
    #[test]
    fn percentiles() {
        let samples: Vec<u32> = (1..=1_000).collect();
        assert_eq!(percentile(&samples, 0.5), 0.5);
        assert_eq!(percentile(&samples, 0.99), 0.99);
        assert_eq!(percentile(&samples, 0.999), 0.999);
        assert_eq!(percentile(&samples[..1], 0.999), 0.001);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    fn reply(node_id: u64, role: &str, term: u64, leader_id: u64) -> Result<StatusReply, String> {
        Ok(StatusReply {
            node_id,
            role: role.to_owned(),
            term,
            leader_id,
            ..StatusReply::default()
        })
    }

    fn hashed(index: u64, hash: &str, applied: u64) -> Result<StatusReply, String> {
        Ok(StatusReply {
            state_hash: hash.to_owned(),
            state_hash_index: index,
            applied_index: applied,
            ..StatusReply::default()
        })
    }

    /// Hashes are compared at equal hash indexes only: different indexes,
    /// a missing hash or a silent node decide nothing; equal indexes agree
    /// or differ.
    #[test]
    fn hashes_are_compared_at_equal_indexes() {
        let mut statuses = BTreeMap::new();
        statuses.insert(1, hashed(7, "aa", 9));
        statuses.insert(2, hashed(8, "bb", 9));
        assert_eq!(hash_agreement(&statuses), HashAgreement::Undecided);
        assert!(!hashes_caught_up(&statuses));
        statuses.insert(2, hashed(7, "aa", 7));
        assert_eq!(
            hash_agreement(&statuses),
            HashAgreement::Agree {
                index: 7,
                hash: "aa".to_owned()
            }
        );
        statuses.insert(2, hashed(7, "cc", 7));
        assert_eq!(
            hash_agreement(&statuses),
            HashAgreement::Differ { index: 7 }
        );
        statuses.insert(2, hashed(0, "", 7));
        assert_eq!(hash_agreement(&statuses), HashAgreement::Undecided);
        statuses.insert(2, Err("down".to_owned()));
        assert_eq!(hash_agreement(&statuses), HashAgreement::Undecided);
        statuses.insert(1, hashed(9, "dd", 9));
        statuses.insert(2, hashed(9, "dd", 9));
        assert!(hashes_caught_up(&statuses));
    }

    /// A leader counts only when every answering node names it in its term.
    #[test]
    fn agreed_leader_needs_every_answer_to_agree() {
        let mut statuses = BTreeMap::new();
        statuses.insert(1, reply(1, "leader", 3, 1));
        statuses.insert(2, reply(2, "follower", 3, 1));
        statuses.insert(3, Err("down".to_owned()));
        assert_eq!(agreed_leader(&statuses), Some(1));
        statuses.insert(3, reply(3, "follower", 2, 1));
        assert_eq!(agreed_leader(&statuses), None);
        statuses.insert(3, reply(3, "candidate", 4, 0));
        assert_eq!(agreed_leader(&statuses), None);
    }
}
