//! The registry core's apply cost of a session request against a
//! sessionless one (issue 25 item 9), without Raft or network: 256 sessions
//! send 64-byte puts over 1,000 keys each, 25 requests to an entry, each
//! acknowledging the one before (the load generator's `oncekv-exec`), and
//! the same puts as `ExecutePlain` (`oncekv-plain`). Every 35,000 requests
//! the registry is cloned and the clone kept until the next, as a node's
//! background hash does about once a second at that rate, so writes pay
//! the copy-on-write of shared tree nodes as they do in a node. Rounds of
//! each alternate; it prints nanoseconds per request of each and their
//! ratio:
//!
//! ```text
//! cargo bench --bench session_apply -- [REQUESTS_PER_ROUND] [ROUNDS]
//! ```

use std::time::{Duration, Instant};

use oncekv_core::{
    ClientId, ClusterId, Command, Entry, Execute, Nonce, Op, Outcome, Principal, Registry,
    RegistryConfig, RulesVersion, Value,
};

/// The node's allocator, so allocation costs what it costs in a node.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const CLUSTER: ClusterId = ClusterId(7);
const CLIENTS: u64 = 256;
const KEYS_PER_CLIENT: u64 = 1_000;
const OPS_PER_ENTRY: u64 = 25;
const CLONE_EVERY: u64 = 35_000;

fn put(client: u64, n: u64) -> Command {
    Command::Put {
        key: format!("k{client}-{}", n % KEYS_PER_CLIENT).into_bytes(),
        value: Value::Bytes(vec![b'v'; 64]),
    }
}

struct Load {
    registry: Registry,
    index: u64,
    stamp_ms: u64,
    clients: Vec<ClientId>,
    seqs: Vec<u64>,
    next: u64,
    held_clone: Option<Registry>,
}

impl Load {
    fn apply(&mut self, ops: Vec<Op>) -> Vec<Outcome> {
        self.index += 1;
        // About 35 entries a millisecond at 35 k requests/s: a new cluster
        // millisecond every other entry is generous to neither side.
        self.stamp_ms += self.index % 2;
        let entry = Entry {
            stamp_ms: self.stamp_ms,
            ops: ops.into(),
        };
        self.registry.apply(self.index, &entry)
    }

    fn op(&mut self, session: bool) -> Op {
        let client = self.next % CLIENTS;
        self.next += 1;
        let command = put(client, self.next / CLIENTS);
        if !session {
            return Op::ExecutePlain {
                cluster_id: CLUSTER,
                command,
            };
        }
        let seq = &mut self.seqs[client as usize];
        *seq += 1;
        Op::Execute(Execute {
            cluster_id: CLUSTER,
            client_id: self.clients[client as usize],
            seq: *seq,
            first_outstanding_seq: *seq,
            command,
            principal: Principal::anonymous(),
        })
    }

    /// Applies `requests` requests; returns nanoseconds per request spent
    /// in the registry's `apply` (building the requests, checking the
    /// outcomes and cloning are not counted).
    #[allow(clippy::disallowed_methods)] // a benchmark measures wall time
    fn round(&mut self, requests: u64, session: bool) -> f64 {
        let mut applying = Duration::ZERO;
        let mut done = 0;
        while done < requests {
            let ops: Vec<Op> = (0..OPS_PER_ENTRY).map(|_| self.op(session)).collect();
            let started = Instant::now();
            let outcomes = self.apply(ops);
            applying += started.elapsed();
            for outcome in outcomes {
                assert!(matches!(outcome, Outcome::Executed { .. }), "{outcome:?}");
            }
            done += OPS_PER_ENTRY;
            if self.next % CLONE_EVERY < OPS_PER_ENTRY {
                self.held_clone = Some(self.registry.clone());
            }
        }
        applying.as_nanos() as f64 / done as f64
    }
}

fn main() {
    // `cargo bench` passes `--bench`; the numbers are ours.
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with("--"))
        .map(|arg| arg.parse().expect("a number"))
        .collect();
    let requests = args.first().copied().unwrap_or(1_000_000);
    let rounds = args.get(1).copied().unwrap_or(3);
    let mut load = Load {
        registry: Registry::new(),
        index: 0,
        stamp_ms: 1_000,
        clients: Vec::new(),
        seqs: vec![0; CLIENTS as usize],
        next: 0,
        held_clone: None,
    };
    load.apply(vec![Op::BootstrapWithRules {
        cluster_id: CLUSTER,
        config: RegistryConfig::default(),
        rules: RulesVersion::LATEST,
    }]);
    for client in 0..CLIENTS {
        let registered = load.apply(vec![Op::Register {
            cluster_id: Some(CLUSTER),
            nonce: Nonce(u128::from(client) + 1),
            principal: Principal::anonymous(),
        }]);
        match &registered[..] {
            [Outcome::Registered(registration)] => load.clients.push(registration.client_id),
            other => panic!("registration: {other:?}"),
        }
    }
    // Warm up: every data key exists before measuring.
    load.round(CLIENTS * KEYS_PER_CLIENT, false);
    let (mut session_ns, mut plain_ns) = (Vec::new(), Vec::new());
    // `ONLY=execute` or `ONLY=plain` runs one kind, to profile it alone.
    let only = std::env::var("ONLY").ok();
    for _ in 0..rounds {
        if only.as_deref() != Some("plain") {
            session_ns.push(load.round(requests, true));
        }
        if only.as_deref() != Some("execute") {
            plain_ns.push(load.round(requests, false));
        }
    }
    let median = |values: &mut Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let (session, plain) = (median(&mut session_ns), median(&mut plain_ns));
    println!(
        "execute_ns={session:.0} plain_ns={plain:.0} difference_ns={:.0} (medians of {rounds} rounds of {requests})",
        session - plain
    );
}
