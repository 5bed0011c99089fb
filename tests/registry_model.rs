//! Property test: random interleavings of registrations (with retried
//! nonces), executes, retries with the same and with another command,
//! pipelined requests completing out of order, fenced requests and their late
//! copies, keep-alives, config changes, snapshot restores and clock stamps
//! that jump forward and backward. Every outcome must equal that of a plain
//! reference model, and the final data must show each distinct
//! (client, seq) applied at most once and every acknowledged one exactly once.

mod support;

use oncekv_core::snapshot;
use oncekv_core::{
    ClientId, Command, CommandResult, ConfigPatch, Entry, Execute, InvalidArgument, Nonce, Op,
    Outcome, Registration, Registry, RegistryConfig, Rejection, Seq, Value,
};
use proptest::prelude::*;
use support::registry::{CLUSTER, one};

const CLIENTS: usize = 3;
const KEYS: [&str; 2] = ["hot", "cold"];

#[derive(Clone, Debug)]
enum Step {
    /// Register logical client `client`; `retry` resends its current nonce.
    Register {
        client: usize,
        retry: bool,
    },
    /// Issue a new request, or resend an in-flight one (`pick` chooses which).
    Send {
        client: usize,
        pick: usize,
        kind: u8,
        reply_lost: bool,
    },
    /// Resend a request that was already answered or fenced, with the floor
    /// it carried at the time (a late copy from the network).
    LateCopy {
        client: usize,
        pick: usize,
    },
    /// Reuse an answered or in-flight seq with another command.
    Conflict {
        client: usize,
        pick: usize,
    },
    /// Give up on an in-flight request: its outcome is unknown, so the
    /// client fences it by moving its floor past it.
    Fence {
        client: usize,
        pick: usize,
    },
    KeepAlive {
        client: usize,
    },
    SetConfig {
        window: u64,
        session_ttl_ms: u64,
    },
    Clock {
        delta_ms: i64,
    },
    SnapshotRestore,
}

fn step() -> impl Strategy<Value = Step> {
    let client = 0..CLIENTS;
    prop_oneof![
        2 => (client.clone(), any::<bool>()).prop_map(|(client, retry)| Step::Register { client, retry }),
        10 => (client.clone(), any::<usize>(), 0u8..6, any::<bool>()).prop_map(
            |(client, pick, kind, reply_lost)| Step::Send { client, pick, kind, reply_lost }
        ),
        2 => (client.clone(), any::<usize>()).prop_map(|(client, pick)| Step::LateCopy { client, pick }),
        1 => (client.clone(), any::<usize>()).prop_map(|(client, pick)| Step::Conflict { client, pick }),
        1 => (client.clone(), any::<usize>()).prop_map(|(client, pick)| Step::Fence { client, pick }),
        1 => client.prop_map(|client| Step::KeepAlive { client }),
        1 => (1u64..6, prop_oneof![Just(200u64), Just(1_000), Just(5_000)])
            .prop_map(|(window, session_ttl_ms)| Step::SetConfig { window, session_ttl_ms }),
        3 => (-3_000i64..3_000).prop_map(|delta_ms| Step::Clock { delta_ms }),
        1 => Just(Step::SnapshotRestore),
    ]
}

/// A request as the client library would hold it.
#[derive(Clone, Debug)]
struct Request {
    seq: Seq,
    command: Command,
    /// The first outstanding seq it carried when last sent.
    sent_floor: Seq,
}

/// The client side of one logical client.
#[derive(Clone, Debug, Default)]
struct Client {
    nonce: u128,
    generation: u128,
    client_id: Option<ClientId>,
    next_seq: Seq,
    in_flight: Vec<Request>,
    /// Answered or fenced: candidates for late copies and conflicts.
    finished: Vec<Request>,
}

impl Client {
    fn first_outstanding(&self) -> Seq {
        self.in_flight
            .iter()
            .map(|request| request.seq)
            .min()
            .unwrap_or(self.next_seq)
    }
}

/// The reference model: a literal reading of docs/rules.md with plain vectors
/// and linear scans, sharing no code with the registry.
#[derive(Clone, Debug)]
struct Model {
    now_ms: u64,
    config: RegistryConfig,
    sessions: Vec<ModelSession>,
    data: Vec<(Vec<u8>, Value)>,
}

#[derive(Clone, Debug)]
struct ModelSession {
    client_id: ClientId,
    nonce: u128,
    floor: Seq,
    last_active_ms: u64,
    executed: Vec<(Seq, Command, CommandResult)>,
}

/// Rule 7's bound: a floor above one past the highest executed seq (or
/// the floor, if higher) plus the window is refused.
fn beyond_bound(session: &ModelSession, floor: Seq, window: u64) -> Option<Outcome> {
    let highest = session
        .executed
        .iter()
        .map(|(seq, ..)| *seq)
        .max()
        .unwrap_or(0);
    let bound_seq = (highest + 1).max(session.floor) + window;
    (floor > session.floor && floor > bound_seq).then_some(Outcome::Rejected(
        Rejection::InvalidArgument(InvalidArgument::FloorBeyondBound {
            first_outstanding_seq: floor,
            bound_seq,
        }),
    ))
}

impl Model {
    fn advance(&mut self, stamp_ms: u64) {
        self.now_ms = self.now_ms.max(stamp_ms);
        let (now, ttl) = (self.now_ms, self.config.session_ttl_ms);
        self.sessions
            .retain(|session| now.saturating_sub(session.last_active_ms) <= ttl);
    }

    /// The live session of `client_id`, its activity untouched: only a
    /// request that passes every check refreshes it ([`Model::touch`]).
    fn live(&mut self, client_id: ClientId) -> Option<&mut ModelSession> {
        self.sessions
            .iter_mut()
            .find(|session| session.client_id == client_id)
    }

    fn touch(&mut self, client_id: ClientId) {
        let now = self.now_ms;
        if let Some(session) = self.live(client_id) {
            session.last_active_ms = now;
        }
    }

    fn register(&mut self, index: u64, nonce: u128) -> Outcome {
        let registration = |client_id, duplicate| {
            Outcome::Registered(Registration {
                cluster_id: CLUSTER,
                client_id,
                session_ttl_ms: self.config.session_ttl_ms,
                window: self.config.window,
                limits: self.config.request_limits(),
                duplicate,
            })
        };
        if let Some(session) = self.sessions.iter().find(|s| s.nonce == nonce) {
            let outcome = registration(session.client_id, true);
            let id = session.client_id;
            self.touch(id);
            return outcome;
        }
        let outcome = registration(ClientId(index), false);
        self.sessions.push(ModelSession {
            client_id: ClientId(index),
            nonce,
            floor: 0,
            last_active_ms: self.now_ms,
            executed: Vec::new(),
        });
        outcome
    }

    fn execute(&mut self, client_id: ClientId, request: &Request) -> Outcome {
        let window = self.config.window;
        let Some(session) = self.live(client_id) else {
            return Outcome::Rejected(Rejection::SessionExpired);
        };
        if request.sent_floor > request.seq {
            return Outcome::Rejected(Rejection::InvalidArgument(InvalidArgument::FloorAboveSeq {
                seq: request.seq,
                first_outstanding_seq: request.sent_floor,
            }));
        }
        if let Some(refusal) = beyond_bound(session, request.sent_floor, window) {
            return refusal;
        }
        session.floor = session.floor.max(request.sent_floor);
        let floor = session.floor;
        if request.seq < floor {
            return Outcome::Rejected(Rejection::ResponseDiscarded { floor });
        }
        if let Some((_, command, result)) = session
            .executed
            .iter()
            .find(|(seq, ..)| *seq == request.seq)
        {
            if *command != request.command {
                return Outcome::Rejected(Rejection::SeqConflict);
            }
            let result = result.clone();
            self.touch(client_id);
            return Outcome::Executed {
                result,
                duplicate: true,
            };
        }
        if request.seq >= floor + window {
            return Outcome::Rejected(Rejection::TooManyOutstanding { floor, window });
        }
        let result = run(&mut self.data, &request.command);
        let session = self.live(client_id).expect("live above");
        session
            .executed
            .push((request.seq, request.command.clone(), result.clone()));
        self.touch(client_id);
        Outcome::Executed {
            result,
            duplicate: false,
        }
    }

    fn keep_alive(&mut self, client_id: ClientId, floor: Seq) -> Outcome {
        let window = self.config.window;
        match self.live(client_id) {
            Some(session) => {
                if let Some(refusal) = beyond_bound(session, floor, window) {
                    return refusal;
                }
                session.floor = session.floor.max(floor);
                let floor = session.floor;
                self.touch(client_id);
                Outcome::KeptAlive {
                    floor,
                    session_ttl_ms: self.config.session_ttl_ms,
                    limits: self.config.request_limits(),
                }
            }
            None => Outcome::Rejected(Rejection::SessionExpired),
        }
    }
}

/// Executes a command on the model's data (the limits are generous in this
/// test, so they never apply).
fn run(data: &mut Vec<(Vec<u8>, Value)>, command: &Command) -> CommandResult {
    let position = data.iter().position(|(key, _)| key == command.key());
    let current = position.map(|at| data[at].1.clone());
    let mut store = |value: Option<Value>| {
        if let Some(at) = position {
            data.remove(at);
        }
        if let Some(value) = value {
            data.push((command.key().to_vec(), value));
        }
    };
    match command {
        Command::Put { value, .. } => {
            store(Some(value.clone()));
            CommandResult::Stored
        }
        Command::Delete { .. } => {
            store(None);
            CommandResult::Deleted {
                existed: current.is_some(),
            }
        }
        Command::Increment { delta, .. } => match current {
            None => {
                store(Some(Value::Int(*delta)));
                CommandResult::Incremented { value: *delta }
            }
            Some(Value::Int(number)) => match number.checked_add(*delta) {
                Some(value) => {
                    store(Some(Value::Int(value)));
                    CommandResult::Incremented { value }
                }
                None => CommandResult::Overflow { current: number },
            },
            Some(other) => CommandResult::WrongType {
                actual: other.kind(),
            },
        },
        Command::Append { element, .. } => match current {
            None => {
                store(Some(Value::List(vec![element.clone()])));
                CommandResult::Appended { length: 1 }
            }
            Some(Value::List(mut items)) => {
                items.push(element.clone());
                let length = items.len() as u64;
                store(Some(Value::List(items)));
                CommandResult::Appended { length }
            }
            Some(other) => CommandResult::WrongType {
                actual: other.kind(),
            },
        },
        Command::CompareAndSwap { expected, new, .. } => {
            if current == *expected {
                store(Some(new.clone()));
                CommandResult::CompareAndSwap {
                    swapped: true,
                    current: Some(new.clone()),
                }
            } else {
                CommandResult::CompareAndSwap {
                    swapped: false,
                    current,
                }
            }
        }
    }
}

/// The command of a new request; appended elements are unique per
/// (client id, seq), as client ids are never reused.
fn command(kind: u8, client: usize, client_id: ClientId, seq: Seq) -> Command {
    let key = KEYS[(seq as usize + client) % KEYS.len()]
        .as_bytes()
        .to_vec();
    let unique = format!("c{client_id}s{seq}").into_bytes();
    match kind {
        0 | 1 => Command::Append {
            key,
            element: unique,
        },
        2 => Command::Increment {
            key,
            delta: seq as i64 * 10 + client as i64,
        },
        3 => Command::CompareAndSwap {
            key,
            expected: None,
            new: Value::Int(seq as i64),
        },
        4 => Command::Put {
            key,
            value: Value::List(vec![unique]),
        },
        _ => Command::Delete { key },
    }
}

struct Run {
    registry: Registry,
    model: Model,
    clients: Vec<Client>,
    index: u64,
    now_ms: u64,
    /// (client id, seq) of every execute that took effect.
    effects: Vec<(ClientId, Seq)>,
    /// Every entry applied, with its outcome.
    log: Vec<(u64, Entry, Outcome)>,
}

impl Run {
    fn new() -> Run {
        let config = RegistryConfig {
            window: 4,
            session_ttl_ms: 1_000,
            ..RegistryConfig::default()
        };
        let mut run = Run {
            registry: Registry::new(),
            model: Model {
                now_ms: 0,
                config,
                sessions: Vec::new(),
                data: Vec::new(),
            },
            clients: (0..CLIENTS).map(|_| Client::default()).collect(),
            index: 0,
            now_ms: 10_000,
            effects: Vec::new(),
            log: Vec::new(),
        };
        run.apply(Op::Bootstrap {
            cluster_id: CLUSTER,
            config,
        });
        run
    }

    fn apply(&mut self, op: Op) -> Outcome {
        self.index += 1;
        let entry = Entry::single(self.now_ms, op);
        self.model.advance(self.now_ms);
        let outcome = one(self.registry.apply(self.index, &entry));
        if let Err(broken) = self.registry.check_invariants() {
            panic!("invariant broken after entry {}: {broken}", self.index);
        }
        self.log.push((self.index, entry, outcome.clone()));
        outcome
    }

    fn execute(&mut self, client: usize, request: Request) -> Outcome {
        let client_id = self.clients[client].client_id.expect("registered");
        let outcome = self.apply(Op::Execute(Execute {
            cluster_id: CLUSTER,
            client_id,
            seq: request.seq,
            first_outstanding_seq: request.sent_floor,
            command: request.command.clone(),
            principal: oncekv_core::Principal::anonymous(),
        }));
        let expected = self.model.execute(client_id, &request);
        assert_eq!(outcome, expected, "execute {request:?}");
        if let Outcome::Executed {
            duplicate: false, ..
        } = outcome
        {
            assert!(
                !self.effects.contains(&(client_id, request.seq)),
                "({client_id}, {}) took effect twice",
                request.seq
            );
            self.effects.push((client_id, request.seq));
        }
        outcome
    }

    fn step(&mut self, step: &Step) {
        match *step {
            Step::Register { client, retry } => {
                let state = &mut self.clients[client];
                if !retry || state.nonce == 0 {
                    state.generation += 1;
                    state.nonce = (client as u128 + 1) << 64 | state.generation;
                }
                let nonce = state.nonce;
                let outcome = self.apply(Op::Register {
                    cluster_id: Some(CLUSTER),
                    nonce: Nonce(nonce),
                    principal: oncekv_core::Principal::anonymous(),
                });
                assert_eq!(outcome, self.model.register(self.index, nonce));
                let Outcome::Registered(registration) = outcome else {
                    unreachable!("limits are generous")
                };
                let state = &mut self.clients[client];
                if state.client_id != Some(registration.client_id) {
                    *state = Client {
                        nonce,
                        generation: state.generation,
                        client_id: Some(registration.client_id),
                        next_seq: 1,
                        ..Client::default()
                    };
                }
            }
            Step::Send {
                client,
                pick,
                kind,
                reply_lost,
            } => {
                let state = &mut self.clients[client];
                let Some(client_id) = state.client_id else {
                    return;
                };
                let floor = state.first_outstanding();
                let request = if state.in_flight.is_empty() || pick % 3 == 0 {
                    let seq = state.next_seq;
                    state.next_seq += 1;
                    state.in_flight.push(Request {
                        seq,
                        command: command(kind, client, client_id, seq),
                        sent_floor: floor,
                    });
                    state.in_flight.len() - 1
                } else {
                    pick % state.in_flight.len()
                };
                state.in_flight[request].sent_floor = floor;
                let sent = state.in_flight[request].clone();
                let outcome = self.execute(client, sent);
                let answered = matches!(outcome, Outcome::Executed { .. });
                if answered && !reply_lost {
                    let state = &mut self.clients[client];
                    let done = state.in_flight.remove(request);
                    state.finished.push(done);
                }
            }
            Step::LateCopy { client, pick } => {
                let state = &self.clients[client];
                if state.finished.is_empty() {
                    return;
                }
                let request = state.finished[pick % state.finished.len()].clone();
                let floor = self.registry_floor(client);
                let outcome = self.execute(client, request.clone());
                // Behind the floor a late copy is discarded, never executed;
                // an applied one is never executed again (checked in
                // `execute`).
                if floor.is_some_and(|floor| floor > request.seq) {
                    assert!(
                        matches!(
                            outcome,
                            Outcome::Rejected(
                                Rejection::ResponseDiscarded { .. } | Rejection::SessionExpired
                            )
                        ),
                        "late copy {request:?} behind floor {floor:?}: {outcome:?}"
                    );
                }
            }
            Step::Conflict { client, pick } => {
                let state = &self.clients[client];
                let candidates: Vec<&Request> =
                    state.finished.iter().chain(&state.in_flight).collect();
                if candidates.is_empty() {
                    return;
                }
                let mut request = candidates[pick % candidates.len()].clone();
                request.command = Command::Increment {
                    key: b"conflict".to_vec(),
                    delta: 1,
                };
                request.sent_floor = request.sent_floor.min(request.seq);
                self.execute(client, request);
            }
            Step::Fence { client, pick } => {
                let state = &mut self.clients[client];
                if state.in_flight.is_empty() {
                    return;
                }
                let request = state.in_flight.remove(pick % state.in_flight.len());
                state.finished.push(request);
                // The fence is a keep-alive carrying the raised floor.
                self.step(&Step::KeepAlive { client });
            }
            Step::KeepAlive { client } => {
                let Some(client_id) = self.clients[client].client_id else {
                    return;
                };
                let floor = self.clients[client].first_outstanding();
                let outcome = self.apply(Op::KeepAlive {
                    cluster_id: CLUSTER,
                    client_id,
                    first_outstanding_seq: floor,
                    principal: oncekv_core::Principal::anonymous(),
                });
                assert_eq!(outcome, self.model.keep_alive(client_id, floor));
            }
            Step::SetConfig {
                window,
                session_ttl_ms,
            } => {
                // A patch of two fields: the model's config with them set.
                let config = RegistryConfig {
                    window,
                    session_ttl_ms,
                    ..self.model.config
                };
                let outcome = self.apply(Op::PatchConfig {
                    cluster_id: CLUSTER,
                    patch: ConfigPatch {
                        window: Some(window),
                        session_ttl_ms: Some(session_ttl_ms),
                        ..ConfigPatch::default()
                    },
                });
                assert_eq!(outcome, Outcome::ConfigSet(config));
                self.model.config = config;
            }
            Step::Clock { delta_ms } => {
                self.now_ms = self.now_ms.saturating_add_signed(delta_ms);
            }
            Step::SnapshotRestore => {
                let bytes = snapshot::to_bytes(&self.registry);
                let restored = snapshot::from_bytes(&bytes).expect("own snapshot reads back");
                assert_eq!(
                    snapshot::state_hash(&restored),
                    snapshot::state_hash(&self.registry)
                );
                assert_eq!(restored, self.registry);
                self.registry = restored;
            }
        }
    }

    fn registry_floor(&self, client: usize) -> Option<Seq> {
        let client_id = self.clients[client].client_id?;
        Some(self.registry.session(client_id)?.floor)
    }

    /// The end-of-run checks on the data itself.
    fn check_data(&self) {
        let mut model_data = self.model.data.clone();
        model_data.sort_by(|a, b| a.0.cmp(&b.0));
        let data: Vec<(Vec<u8>, Value)> = self
            .registry
            .data()
            .iter()
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        assert_eq!(data, model_data, "data differs from the model");
        // At most once, seen in the data: unique appended elements occur at
        // most once across every list.
        let mut elements: Vec<&Vec<u8>> = data
            .iter()
            .filter_map(|(_, value)| match value {
                Value::List(items) => Some(items.iter()),
                _ => None,
            })
            .flatten()
            .collect();
        let count = elements.len();
        elements.sort();
        elements.dedup();
        assert_eq!(elements.len(), count, "an element was appended twice");
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 1_000,
        max_shrink_iters: 2_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn registry_matches_the_reference_model(steps in prop::collection::vec(step(), 1..200)) {
        let mut run = Run::new();
        for step in &steps {
            run.step(step);
        }
        run.check_data();
        // A twin that replays the same log without ever restoring from a
        // snapshot gives the same answers and ends in the same state.
        let mut twin = Registry::new();
        for (index, entry, outcome) in &run.log {
            prop_assert_eq!(&one(twin.apply(*index, entry)), outcome);
        }
        prop_assert_eq!(snapshot::state_hash(&twin), snapshot::state_hash(&run.registry));
        prop_assert_eq!(&twin, &run.registry);
    }
}
