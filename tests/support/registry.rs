//! A small driver that feeds the registry core entries at increasing log
//! indexes with a controllable cluster clock, as a Raft log would.

use oncekv_core::{
    ClientId, ClusterId, Command, Entry, Execute, Nonce, Op, Outcome, Registry, RegistryConfig,
    RulesVersion, Seq, Value,
};

/// The one outcome of an entry that carried one request.
pub fn one(mut outcomes: Vec<Outcome>) -> Outcome {
    assert_eq!(outcomes.len(), 1, "an entry of one request has one outcome");
    outcomes.remove(0)
}

pub const CLUSTER: ClusterId = ClusterId(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);

pub struct Driver {
    pub registry: Registry,
    /// Index of the last entry applied.
    pub index: u64,
    /// Stamp given to the next entry.
    pub now_ms: u64,
}

impl Driver {
    /// A registry bootstrapped with the default config at index 1.
    pub fn new() -> Driver {
        Driver::with_config(RegistryConfig::default())
    }

    pub fn with_config(config: RegistryConfig) -> Driver {
        Driver::bootstrapped(Op::Bootstrap {
            cluster_id: CLUSTER,
            config,
        })
    }

    /// A registry bootstrapped under `rules` (with that version's default
    /// configs) at index 1, as a node of this build starts a cluster.
    pub fn with_rules(rules: RulesVersion) -> Driver {
        Driver::bootstrapped(Op::BootstrapWithRules {
            cluster_id: CLUSTER,
            config: RegistryConfig::default(),
            rules,
        })
    }

    fn bootstrapped(bootstrap: Op) -> Driver {
        let mut driver = Driver {
            registry: Registry::new(),
            index: 0,
            now_ms: 1_000,
        };
        let outcome = driver.apply(bootstrap);
        assert!(matches!(
            outcome,
            Outcome::Bootstrapped { already: false, .. }
        ));
        driver
    }

    pub fn apply(&mut self, op: Op) -> Outcome {
        self.index += 1;
        let entry = Entry::single(self.now_ms, op);
        let outcome = one(self.registry.apply(self.index, &entry));
        self.check_invariants();
        outcome
    }

    /// Applies one entry carrying `ops` as a batch; one outcome per op.
    pub fn apply_batch(&mut self, ops: Vec<Op>) -> Vec<Outcome> {
        self.index += 1;
        let entry = Entry {
            stamp_ms: self.now_ms,
            ops: ops.into(),
        };
        let outcomes = self.registry.apply(self.index, &entry);
        self.check_invariants();
        outcomes
    }

    fn check_invariants(&self) {
        if let Err(broken) = self.registry.check_invariants() {
            panic!("invariant broken after entry {}: {broken}", self.index);
        }
    }

    pub fn advance(&mut self, ms: u64) {
        self.now_ms += ms;
    }

    pub fn register(&mut self, nonce: u128) -> ClientId {
        match self.apply(Op::Register {
            cluster_id: Some(CLUSTER),
            nonce: Nonce(nonce),
            principal: oncekv_core::Principal::anonymous(),
        }) {
            Outcome::Registered(registration) => registration.client_id,
            other => panic!("register failed: {other:?}"),
        }
    }

    pub fn execute(
        &mut self,
        client_id: ClientId,
        seq: Seq,
        first_outstanding_seq: Seq,
        command: Command,
    ) -> Outcome {
        self.apply(Op::Execute(Execute {
            cluster_id: CLUSTER,
            client_id,
            seq,
            first_outstanding_seq,
            command,
            principal: oncekv_core::Principal::anonymous(),
        }))
    }

    pub fn keep_alive(&mut self, client_id: ClientId, first_outstanding_seq: Seq) -> Outcome {
        self.apply(Op::KeepAlive {
            cluster_id: CLUSTER,
            client_id,
            first_outstanding_seq,
            principal: oncekv_core::Principal::anonymous(),
        })
    }

    pub fn int(&self, key: &str) -> Option<i64> {
        match self.registry.get(key.as_bytes()) {
            Some(Value::Int(number)) => Some(*number),
            None => None,
            Some(other) => panic!("{key} holds {other:?}"),
        }
    }
}

pub fn incr(key: &str, delta: i64) -> Command {
    Command::Increment {
        key: key.as_bytes().to_vec(),
        delta,
    }
}

pub fn append(key: &str, element: &str) -> Command {
    Command::Append {
        key: key.as_bytes().to_vec(),
        element: element.as_bytes().to_vec(),
    }
}

pub fn put(key: &str, value: Value) -> Command {
    Command::Put {
        key: key.as_bytes().to_vec(),
        value,
    }
}
