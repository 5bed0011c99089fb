//! The protected key-value data: typed values in an ordered map, and the
//! planning of a command into a result and an effect. Planning changes
//! nothing, so the registry can check every limit — including the size of
//! the response it is about to cache — before the effect is applied (rule 12).
//! It tells a limit the request breaks by itself (final) from a capacity
//! limit (this attempt); what to do with either is the registry's business.

use super::types::{
    Command, CommandResult, Limit, LimitExceeded, RegistryConfig, Value, kv_entry_memory_bytes,
    list_element_size_bytes,
};
use imbl::OrdMap;

/// The key-value data, ordered so that iteration (snapshots, hashes) is
/// canonical (rule 10). A persistent map: cloning it is O(1) and shares
/// structure until either copy changes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvStore {
    entries: OrdMap<Vec<u8>, Value>,
    /// Sum of [`kv_entry_memory_bytes`] over the entries: what the data
    /// charges against the memory budget (rule 21).
    memory_bytes: u64,
}

/// How a planned command changes the data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Effect {
    Nothing,
    Set(Value),
    Remove,
    /// Push one element onto the list at the key (creating it if absent).
    Push(Vec<u8>),
}

/// A command's result and the effect that produces it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    pub result: CommandResult,
    pub effect: Effect,
}

/// Why a command may not take effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The command breaks a limit by itself, given the data it applies to:
    /// it can never succeed as sent.
    Exceeded(LimitExceeded),
    /// A capacity limit is reached; it may free up.
    Exhausted(Limit),
}

impl KvStore {
    pub fn get(&self, key: &[u8]) -> Option<&Value> {
        self.entries.get(key)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Vec<u8>, &Value)> {
        self.entries.iter()
    }

    /// What the data charges against the memory budget.
    pub fn memory_bytes(&self) -> u64 {
        self.memory_bytes
    }

    /// How many bytes applying `effect` at `key` would add to
    /// [`memory_bytes`](Self::memory_bytes) (0 when it shrinks or keeps it).
    pub(crate) fn growth_bytes(&self, key: &[u8], effect: &Effect) -> u64 {
        let before = self
            .entries
            .get(key)
            .map_or(0, |value| kv_entry_memory_bytes(key, value));
        let after = match (effect, self.entries.get(key)) {
            (Effect::Nothing, _) => before,
            (Effect::Remove, _) => 0,
            (Effect::Set(value), _) => kv_entry_memory_bytes(key, value),
            (Effect::Push(element), Some(_)) => before + list_element_size_bytes(element),
            (Effect::Push(element), None) => {
                kv_entry_memory_bytes(key, &Value::List(vec![element.clone()]))
            }
        };
        after.saturating_sub(before)
    }

    /// Whether the byte count is the sum over the entries.
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let sum: u64 = self
            .entries
            .iter()
            .map(|(key, value)| kv_entry_memory_bytes(key, value))
            .sum();
        if sum != self.memory_bytes {
            return Err(format!(
                "data memory bytes {} but entries sum to {sum}",
                self.memory_bytes
            ));
        }
        Ok(())
    }

    /// Builds a store from pairs in strictly increasing key order (as a
    /// snapshot holds them); `None` if the order is broken.
    pub(crate) fn from_ordered(pairs: Vec<(Vec<u8>, Value)>) -> Option<KvStore> {
        let ordered = pairs.windows(2).all(|pair| pair[0].0 < pair[1].0);
        ordered.then(|| {
            let memory_bytes = pairs
                .iter()
                .map(|(key, value)| kv_entry_memory_bytes(key, value))
                .sum();
            KvStore {
                entries: pairs.into_iter().collect(),
                memory_bytes,
            }
        })
    }

    /// Works out what `command` would return and do, without doing it, and
    /// checks the data limits its effect would have to respect: first the
    /// limits the command breaks by itself (those a client can check
    /// before sending, then a list an append would grow past a limit), then
    /// the key count.
    pub(crate) fn plan(&self, command: &Command, config: &RegistryConfig) -> Result<Plan, Refusal> {
        config
            .request_limits()
            .check(command)
            .map_err(Refusal::Exceeded)?;
        let current = self.entries.get(command.key());
        let plan = plan(current, command);
        self.check_limits(current, &plan.effect, config)?;
        Ok(plan)
    }

    /// The limit, if any, that applying `effect` to `current` would break
    /// beyond those of [`RequestLimits::check`](super::RequestLimits::check).
    fn check_limits(
        &self,
        current: Option<&Value>,
        effect: &Effect,
        config: &RegistryConfig,
    ) -> Result<(), Refusal> {
        if let (Effect::Push(element), Some(list @ Value::List(items))) = (effect, current) {
            let exceeded = |limit, max, requested| {
                Err(Refusal::Exceeded(LimitExceeded {
                    limit,
                    max,
                    requested,
                }))
            };
            let size_bytes = list.size_bytes() + list_element_size_bytes(element);
            if size_bytes > config.value_bytes_max {
                return exceeded(Limit::ValueBytes, config.value_bytes_max, size_bytes);
            }
            let elements = items.len() as u64 + 1;
            if elements > config.list_elements_max {
                return exceeded(Limit::ListElements, config.list_elements_max, elements);
            }
        }
        let creates = current.is_none() && matches!(effect, Effect::Set(_) | Effect::Push(_));
        if creates && self.entries.len() as u64 >= config.keys_max {
            return Err(Refusal::Exhausted(Limit::Keys));
        }
        Ok(())
    }

    /// Applies a planned effect.
    pub(crate) fn apply(&mut self, key: &[u8], effect: Effect) {
        if let Some(value) = self.entries.get(key) {
            self.memory_bytes -= kv_entry_memory_bytes(key, value);
        }
        self.apply_effect(key, effect);
        if let Some(value) = self.entries.get(key) {
            self.memory_bytes += kv_entry_memory_bytes(key, value);
        }
    }

    fn apply_effect(&mut self, key: &[u8], effect: Effect) {
        match effect {
            Effect::Nothing => {}
            Effect::Remove => {
                self.entries.remove(key);
            }
            Effect::Set(value) => {
                if let Some(slot) = self.entries.get_mut(key) {
                    *slot = value;
                } else {
                    self.entries.insert(key.to_vec(), value);
                }
            }
            Effect::Push(element) => match self.entries.get_mut(key) {
                Some(Value::List(items)) => items.push(element),
                Some(other) => {
                    // Planning only pushes onto a list or an absent key.
                    unreachable!("push onto a {:?} value", other.kind())
                }
                None => {
                    self.entries
                        .insert(key.to_vec(), Value::List(vec![element]));
                }
            },
        }
    }
}

fn plan(current: Option<&Value>, command: &Command) -> Plan {
    match command {
        Command::Put { value, .. } => Plan {
            result: CommandResult::Stored,
            effect: Effect::Set(value.clone()),
        },
        Command::Delete { .. } => Plan {
            result: CommandResult::Deleted {
                existed: current.is_some(),
            },
            effect: if current.is_some() {
                Effect::Remove
            } else {
                Effect::Nothing
            },
        },
        Command::Increment { delta, .. } => match current {
            None | Some(Value::Int(_)) => {
                let before = match current {
                    Some(Value::Int(number)) => *number,
                    _ => 0,
                };
                match before.checked_add(*delta) {
                    Some(after) => Plan {
                        result: CommandResult::Incremented { value: after },
                        effect: Effect::Set(Value::Int(after)),
                    },
                    None => unchanged(CommandResult::Overflow { current: before }),
                }
            }
            Some(other) => unchanged(CommandResult::WrongType {
                actual: other.kind(),
            }),
        },
        Command::Append { element, .. } => match current {
            None => Plan {
                result: CommandResult::Appended { length: 1 },
                effect: Effect::Push(element.clone()),
            },
            Some(Value::List(items)) => Plan {
                result: CommandResult::Appended {
                    length: items.len() as u64 + 1,
                },
                effect: Effect::Push(element.clone()),
            },
            Some(other) => unchanged(CommandResult::WrongType {
                actual: other.kind(),
            }),
        },
        Command::CompareAndSwap { expected, new, .. } => {
            if current == expected.as_ref() {
                Plan {
                    result: CommandResult::CompareAndSwap {
                        swapped: true,
                        current: Some(new.clone()),
                    },
                    effect: Effect::Set(new.clone()),
                }
            } else {
                unchanged(CommandResult::CompareAndSwap {
                    swapped: false,
                    current: current.cloned(),
                })
            }
        }
    }
}

fn unchanged(result: CommandResult) -> Plan {
    Plan {
        result,
        effect: Effect::Nothing,
    }
}
