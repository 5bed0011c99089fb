//! Conversion between protobuf messages and the registry core's types, in
//! both directions, in one place. Decoding from the wire validates shape and
//! the hard size bounds (`oncekv_core::bounds`); replicated limits are the
//! core's business, and this module must not check them.

use crate::proto;
use oncekv_core::{
    ClaimAnswer, ClaimConfig, ClaimConfigPatch, ClaimState, ClaimView, ClusterId, Command,
    CommandResult, ConfigPatch, Fingerprint, IdempotencyKey, KeyView, KeyedConfig,
    KeyedConfigPatch, Limit, LimitExceeded, Nonce, Principal, RegistryConfig, RequestLimits,
    SessionView, Value, ValueKind, bounds,
};

/// Why a wire message could not become a core value.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConvertError {
    #[error("missing field {0}")]
    Missing(&'static str),
    #[error("{0} of {1} bytes exceeds the hard bound of {2} bytes")]
    TooLarge(&'static str, usize, u64),
    #[error("unknown value kind {0}")]
    UnknownKind(i32),
    #[error("empty key: a key is at least one byte long")]
    EmptyKey,
    #[error("empty idempotency key: a key is at least one byte long")]
    EmptyIdempotencyKey,
    #[error("unknown limit name {0:?}")]
    UnknownLimit(String),
    #[error("empty claim key: a key is at least one byte long")]
    EmptyClaimKey,
    #[error("claim_id must be 16 bytes, got {0}")]
    BadClaimId(usize),
    #[error("session_ttl_ms of {0} is beyond {max} (366 days)", max = SESSION_TTL_MS_MAX)]
    SessionTtlTooLong(u64),
}

/// The longest `session_ttl_ms` a config patch may ask for: 366 days, as
/// the key and claim TTLs (a session idle for longer is not a session, and a
/// TTL near `u64::MAX` would keep every abandoned session forever). Refused
/// here, before the patch is proposed, not at apply: apply's bounds are
/// replicated rules, changed only by a rules version.
pub const SESSION_TTL_MS_MAX: u64 = 366 * 24 * 3_600_000;

/// The most bytes of a claim's fingerprint description on the wire.
pub const CLAIM_FINGERPRINT_BYTES_MAX: u64 = 16 << 10;

fn bounded(what: &'static str, bytes: Vec<u8>, max: u64) -> Result<Vec<u8>, ConvertError> {
    if bytes.len() as u64 > max {
        return Err(ConvertError::TooLarge(what, bytes.len(), max));
    }
    Ok(bytes)
}

/// Checks a key from the wire: non-empty (as etcd has it) and within the
/// hard bound. Every path that takes a key goes through it.
pub fn check_key(key: &[u8]) -> Result<(), ConvertError> {
    if key.is_empty() {
        return Err(ConvertError::EmptyKey);
    }
    if key.len() as u64 > bounds::KEY_BYTES_MAX {
        return Err(ConvertError::TooLarge(
            "key",
            key.len(),
            bounds::KEY_BYTES_MAX,
        ));
    }
    Ok(())
}

fn key(bytes: Vec<u8>) -> Result<Vec<u8>, ConvertError> {
    check_key(&bytes)?;
    Ok(bytes)
}

pub fn value_from_proto(value: proto::Value) -> Result<Value, ConvertError> {
    let value = match value.kind.ok_or(ConvertError::Missing("value.kind"))? {
        proto::value::Kind::Bytes(bytes) => Value::Bytes(bytes),
        proto::value::Kind::Int(number) => Value::Int(number),
        proto::value::Kind::List(list) => Value::List(list.items),
    };
    let size = value.size_bytes();
    if size > bounds::VALUE_BYTES_MAX {
        return Err(ConvertError::TooLarge(
            "value",
            size as usize,
            bounds::VALUE_BYTES_MAX,
        ));
    }
    Ok(value)
}

pub fn value_to_proto(value: &Value) -> proto::Value {
    let kind = match value {
        Value::Bytes(bytes) => proto::value::Kind::Bytes(bytes.clone()),
        Value::Int(number) => proto::value::Kind::Int(*number),
        Value::List(items) => proto::value::Kind::List(proto::ListValue {
            items: items.clone(),
        }),
    };
    proto::Value { kind: Some(kind) }
}

fn required_value(value: Option<proto::Value>, field: &'static str) -> Result<Value, ConvertError> {
    value_from_proto(value.ok_or(ConvertError::Missing(field))?)
}

pub fn command_from_proto(command: Option<proto::Command>) -> Result<Command, ConvertError> {
    use proto::command::Op;
    let op = command
        .and_then(|command| command.op)
        .ok_or(ConvertError::Missing("command"))?;
    Ok(match op {
        Op::Put(put) => Command::Put {
            key: key(put.key)?,
            value: required_value(put.value, "put.value")?,
        },
        Op::Delete(delete) => Command::Delete {
            key: key(delete.key)?,
        },
        Op::Increment(increment) => Command::Increment {
            key: key(increment.key)?,
            delta: increment.delta,
        },
        Op::Append(append) => Command::Append {
            key: key(append.key)?,
            element: bounded("element", append.element, bounds::VALUE_BYTES_MAX)?,
        },
        Op::CompareAndSwap(cas) => Command::CompareAndSwap {
            key: key(cas.key)?,
            expected: cas.expected.map(value_from_proto).transpose()?,
            new: required_value(cas.new_value, "compare_and_swap.new_value")?,
        },
    })
}

pub fn command_to_proto(command: &Command) -> proto::Command {
    use proto::command::Op;
    let op = match command {
        Command::Put { key, value } => Op::Put(proto::Put {
            key: key.clone(),
            value: Some(value_to_proto(value)),
        }),
        Command::Delete { key } => Op::Delete(proto::Delete { key: key.clone() }),
        Command::Increment { key, delta } => Op::Increment(proto::Increment {
            key: key.clone(),
            delta: *delta,
        }),
        Command::Append { key, element } => Op::Append(proto::Append {
            key: key.clone(),
            element: element.clone(),
        }),
        Command::CompareAndSwap { key, expected, new } => {
            Op::CompareAndSwap(proto::CompareAndSwap {
                key: key.clone(),
                expected: expected.as_ref().map(value_to_proto),
                new_value: Some(value_to_proto(new)),
            })
        }
    };
    proto::Command { op: Some(op) }
}

fn kind_to_proto(kind: ValueKind) -> proto::ValueKind {
    match kind {
        ValueKind::Bytes => proto::ValueKind::Bytes,
        ValueKind::Int => proto::ValueKind::Int,
        ValueKind::List => proto::ValueKind::List,
    }
}

pub fn result_to_proto(result: &CommandResult) -> proto::CommandResult {
    use proto::command_result::Result as R;
    let result = match result {
        CommandResult::Stored => R::Stored(proto::Stored {}),
        CommandResult::Deleted { existed } => R::Deleted(proto::Deleted { existed: *existed }),
        CommandResult::Incremented { value } => {
            R::Incremented(proto::Incremented { value: *value })
        }
        CommandResult::Overflow { current } => R::Overflow(proto::Overflow { current: *current }),
        CommandResult::Appended { length } => R::Appended(proto::Appended { length: *length }),
        CommandResult::CompareAndSwap { swapped, current } => {
            R::CompareAndSwap(proto::CompareAndSwapResult {
                swapped: *swapped,
                current: current.as_ref().map(value_to_proto),
            })
        }
        CommandResult::WrongType { actual } => R::WrongType(proto::WrongType {
            actual: kind_to_proto(*actual) as i32,
        }),
    };
    proto::CommandResult {
        result: Some(result),
    }
}

pub fn result_from_proto(
    result: Option<proto::CommandResult>,
) -> Result<CommandResult, ConvertError> {
    use proto::command_result::Result as R;
    let result = result
        .and_then(|result| result.result)
        .ok_or(ConvertError::Missing("result"))?;
    Ok(match result {
        R::Stored(_) => CommandResult::Stored,
        R::Deleted(deleted) => CommandResult::Deleted {
            existed: deleted.existed,
        },
        R::Incremented(incremented) => CommandResult::Incremented {
            value: incremented.value,
        },
        R::Overflow(overflow) => CommandResult::Overflow {
            current: overflow.current,
        },
        R::Appended(appended) => CommandResult::Appended {
            length: appended.length,
        },
        R::CompareAndSwap(cas) => CommandResult::CompareAndSwap {
            swapped: cas.swapped,
            current: cas.current.map(value_from_proto).transpose()?,
        },
        R::WrongType(wrong) => CommandResult::WrongType {
            actual: match proto::ValueKind::try_from(wrong.actual) {
                Ok(proto::ValueKind::Bytes) => ValueKind::Bytes,
                Ok(proto::ValueKind::Int) => ValueKind::Int,
                Ok(proto::ValueKind::List) => ValueKind::List,
                _ => return Err(ConvertError::UnknownKind(wrong.actual)),
            },
        },
    })
}

/// An idempotency key from the wire: non-empty and within its hard bound
/// (the replicated `idempotency_key_bytes_max` is the core's to check).
pub fn idempotency_key_from_proto(bytes: Vec<u8>) -> Result<IdempotencyKey, ConvertError> {
    if bytes.is_empty() {
        return Err(ConvertError::EmptyIdempotencyKey);
    }
    Ok(IdempotencyKey(bounded(
        "idempotency key",
        bytes,
        bounds::IDEMPOTENCY_KEY_BYTES_MAX,
    )?))
}

/// A principal an operator names (`GetKey`, `ForgetKey`): any name of at
/// most [`Principal::BYTES_MAX`] bytes, the empty one being anonymous.
pub fn principal_from_proto(name: String) -> Result<Principal, ConvertError> {
    if name.len() > Principal::BYTES_MAX {
        return Err(ConvertError::TooLarge(
            "principal",
            name.len(),
            Principal::BYTES_MAX as u64,
        ));
    }
    Ok(Principal(name))
}

pub fn key_to_proto(view: &KeyView) -> proto::KeyInfo {
    let response = match &view.response {
        Ok(result) => proto::key_info::Response::Result(result_to_proto(result)),
        Err(exceeded) => proto::key_info::Response::Refusal(proto::LimitRefusal {
            limit: exceeded.limit.to_string(),
            limit_max: exceeded.max,
            limit_requested: exceeded.requested,
        }),
    };
    proto::KeyInfo {
        principal: view.principal.0.clone(),
        idempotency_key: view.key.0.clone(),
        created_ms: view.created_ms,
        age_ms: view.age_ms,
        expires_after_ms: view.expires_after_ms,
        fingerprint: view.fingerprint.0.to_be_bytes().to_vec(),
        response: Some(response),
        size_bytes: view.size_bytes,
    }
}

/// A key's record as a reply carries it (for clients of `Admin`): the
/// fingerprint and the cached answer decoded; the rest as sent.
pub fn key_from_proto(info: proto::KeyInfo) -> Result<KeyView, ConvertError> {
    let fingerprint: [u8; 16] = info
        .fingerprint
        .as_slice()
        .try_into()
        .map_err(|_| ConvertError::Missing("fingerprint (16 bytes)"))?;
    let response = match info.response.ok_or(ConvertError::Missing("response"))? {
        proto::key_info::Response::Result(result) => Ok(result_from_proto(Some(result))?),
        proto::key_info::Response::Refusal(refusal) => Err(LimitExceeded {
            limit: Limit::from_name(&refusal.limit)
                .ok_or(ConvertError::UnknownLimit(refusal.limit))?,
            max: refusal.limit_max,
            requested: refusal.limit_requested,
        }),
    };
    Ok(KeyView {
        principal: Principal(info.principal),
        key: IdempotencyKey(info.idempotency_key),
        created_ms: info.created_ms,
        age_ms: info.age_ms,
        expires_after_ms: info.expires_after_ms,
        fingerprint: Fingerprint(u128::from_be_bytes(fingerprint)),
        response,
        size_bytes: info.size_bytes,
    })
}

/// A claim key from the wire: non-empty and within its hard bound (the
/// replicated `claim_key_bytes_max` is the core's to check).
pub fn claim_key_from_proto(bytes: Vec<u8>) -> Result<IdempotencyKey, ConvertError> {
    if bytes.is_empty() {
        return Err(ConvertError::EmptyClaimKey);
    }
    Ok(IdempotencyKey(bounded(
        "claim key",
        bytes,
        bounds::CLAIM_KEY_BYTES_MAX,
    )?))
}

/// A claim's fingerprint: the caller's description within its bound,
/// hashed as the core defines it.
pub fn claim_fingerprint_from_proto(description: &[u8]) -> Result<Fingerprint, ConvertError> {
    if description.len() as u64 > CLAIM_FINGERPRINT_BYTES_MAX {
        return Err(ConvertError::TooLarge(
            "claim fingerprint",
            description.len(),
            CLAIM_FINGERPRINT_BYTES_MAX,
        ));
    }
    Ok(oncekv_core::fingerprint::claim_fingerprint(description))
}

/// A claim id: exactly 16 bytes.
pub fn claim_id_from_proto(bytes: &[u8]) -> Result<Nonce, ConvertError> {
    let id: [u8; 16] = bytes
        .try_into()
        .map_err(|_| ConvertError::BadClaimId(bytes.len()))?;
    Ok(Nonce(u128::from_be_bytes(id)))
}

/// A claim result from the wire, within its hard bound.
pub fn claim_result_from_proto(bytes: Vec<u8>) -> Result<Vec<u8>, ConvertError> {
    bounded("claim result", bytes, bounds::CLAIM_RESULT_BYTES_MAX)
}

/// A claim's answer as its reply carries it.
pub fn claim_answer_to_proto(answer: &ClaimAnswer, log_index: u64) -> proto::ClaimReply {
    use proto::claim_reply::Answer;
    let answer = match answer {
        ClaimAnswer::Won {
            fence,
            attempt,
            lease_deadline_ms,
            cluster_time_ms,
            duplicate,
        } => Answer::Won(proto::ClaimWon {
            fence: *fence,
            attempt: *attempt,
            lease_ms_left: lease_deadline_ms.saturating_sub(*cluster_time_ms),
            lease_deadline_ms: *lease_deadline_ms,
            cluster_time_ms: *cluster_time_ms,
            duplicate: *duplicate,
        }),
        ClaimAnswer::InProgress {
            retry_after_ms,
            attempt,
        } => Answer::InProgress(proto::ClaimInProgress {
            retry_after_ms: *retry_after_ms,
            attempt: *attempt,
        }),
        ClaimAnswer::Completed {
            result,
            completed_ms,
            fence,
            attempt,
        } => Answer::Completed(proto::ClaimCompleted {
            result: result.clone(),
            completed_ms: *completed_ms,
            fence: *fence,
            attempt: *attempt,
        }),
    };
    proto::ClaimReply {
        answer: Some(answer),
        log_index,
    }
}

/// A claim reply back into the core's answer (for clients).
pub fn claim_answer_from_proto(reply: proto::ClaimReply) -> Result<ClaimAnswer, ConvertError> {
    use proto::claim_reply::Answer;
    Ok(
        match reply.answer.ok_or(ConvertError::Missing("claim answer"))? {
            Answer::Won(won) => ClaimAnswer::Won {
                fence: won.fence,
                attempt: won.attempt,
                lease_deadline_ms: won.lease_deadline_ms,
                cluster_time_ms: won.cluster_time_ms,
                duplicate: won.duplicate,
            },
            Answer::InProgress(progress) => ClaimAnswer::InProgress {
                retry_after_ms: progress.retry_after_ms,
                attempt: progress.attempt,
            },
            Answer::Completed(completed) => ClaimAnswer::Completed {
                result: completed.result,
                completed_ms: completed.completed_ms,
                fence: completed.fence,
                attempt: completed.attempt,
            },
        },
    )
}

/// A claim record for operators.
pub fn claim_to_proto(view: &ClaimView) -> proto::ClaimInfo {
    let record = &view.record;
    let (state, at_ms, result) = match &record.state {
        ClaimState::Held {
            lease_deadline_ms, ..
        } => ("held", *lease_deadline_ms, Vec::new()),
        ClaimState::Released { released_ms } => ("released", *released_ms, Vec::new()),
        ClaimState::Completed {
            completed_ms,
            result,
        } => ("completed", *completed_ms, result.clone()),
    };
    proto::ClaimInfo {
        principal: view.principal.0.clone(),
        key: view.key.0.clone(),
        fingerprint: record.fingerprint.0.to_be_bytes().to_vec(),
        fence: record.fence,
        attempt: record.attempt,
        state: state.into(),
        at_ms,
        result,
        expires_after_ms: view.expires_after_ms,
        size_bytes: view.size_bytes,
    }
}

/// Sets the memory budget field of a whole config message.
pub fn budget_into_proto(budget: &oncekv_core::BudgetConfig, config: &mut proto::RegistryConfig) {
    config.memory_budget_bytes = budget.memory_budget_bytes;
    config.principal_quota_percent = budget.principal_quota_percent;
}

/// The memory budget field a wire patch sets.
pub fn budget_patch_from_proto(
    patch: &proto::RegistryConfigPatch,
) -> oncekv_core::BudgetConfigPatch {
    oncekv_core::BudgetConfigPatch {
        memory_budget_bytes: patch.memory_budget_bytes,
        principal_quota_percent: patch.principal_quota_percent,
    }
}

/// Sets the claim fields of a whole config message.
pub fn claim_config_into_proto(claims: &ClaimConfig, config: &mut proto::RegistryConfig) {
    config.claim_ttl_ms = claims.claim_ttl_ms;
    config.claims_max = claims.claims_max;
    config.claim_key_bytes_max = claims.claim_key_bytes_max;
    config.claim_result_bytes_max = claims.claim_result_bytes_max;
    config.claim_cached_bytes_max = claims.claim_cached_bytes_max;
    config.lease_ms_max = claims.lease_ms_max;
}

/// The claim part of a whole config as a reply carries it.
pub fn claim_config_from_proto(config: &proto::RegistryConfig) -> ClaimConfig {
    ClaimConfig {
        claim_ttl_ms: config.claim_ttl_ms,
        claims_max: config.claims_max,
        claim_key_bytes_max: config.claim_key_bytes_max,
        claim_result_bytes_max: config.claim_result_bytes_max,
        claim_cached_bytes_max: config.claim_cached_bytes_max,
        lease_ms_max: config.lease_ms_max,
    }
}

/// The claim fields a wire patch sets.
pub fn claim_config_patch_from_proto(patch: &proto::RegistryConfigPatch) -> ClaimConfigPatch {
    ClaimConfigPatch {
        claim_ttl_ms: patch.claim_ttl_ms,
        claims_max: patch.claims_max,
        claim_key_bytes_max: patch.claim_key_bytes_max,
        claim_result_bytes_max: patch.claim_result_bytes_max,
        claim_cached_bytes_max: patch.claim_cached_bytes_max,
        lease_ms_max: patch.lease_ms_max,
    }
}

/// Sets the claim fields of a wire patch.
pub fn claim_config_patch_into_proto(
    claims: &ClaimConfigPatch,
    patch: &mut proto::RegistryConfigPatch,
) {
    patch.claim_ttl_ms = claims.claim_ttl_ms;
    patch.claims_max = claims.claims_max;
    patch.claim_key_bytes_max = claims.claim_key_bytes_max;
    patch.claim_result_bytes_max = claims.claim_result_bytes_max;
    patch.claim_cached_bytes_max = claims.claim_cached_bytes_max;
    patch.lease_ms_max = claims.lease_ms_max;
}

/// Both replicated configs as one wire message.
pub fn configs_to_proto(config: &RegistryConfig, keyed: &KeyedConfig) -> proto::RegistryConfig {
    proto::RegistryConfig {
        idempotency_key_ttl_ms: keyed.idempotency_key_ttl_ms,
        idempotency_keys_max: keyed.idempotency_keys_max,
        idempotency_key_bytes_max: keyed.idempotency_key_bytes_max,
        idempotency_cached_bytes_max: keyed.idempotency_cached_bytes_max,
        ..registry_config_to_proto(config)
    }
}

/// The idempotency-key part of a whole config as a reply carries it.
pub fn keyed_config_from_proto(config: &proto::RegistryConfig) -> KeyedConfig {
    KeyedConfig {
        idempotency_key_ttl_ms: config.idempotency_key_ttl_ms,
        idempotency_keys_max: config.idempotency_keys_max,
        idempotency_key_bytes_max: config.idempotency_key_bytes_max,
        idempotency_cached_bytes_max: config.idempotency_cached_bytes_max,
    }
}

/// The idempotency-key fields a wire patch sets.
pub fn keyed_config_patch_from_proto(patch: &proto::RegistryConfigPatch) -> KeyedConfigPatch {
    KeyedConfigPatch {
        idempotency_key_ttl_ms: patch.idempotency_key_ttl_ms,
        idempotency_keys_max: patch.idempotency_keys_max,
        idempotency_key_bytes_max: patch.idempotency_key_bytes_max,
        idempotency_cached_bytes_max: patch.idempotency_cached_bytes_max,
    }
}

/// Both patches as one wire message.
pub fn configs_patch_to_proto(
    patch: &ConfigPatch,
    keyed: &KeyedConfigPatch,
) -> proto::RegistryConfigPatch {
    proto::RegistryConfigPatch {
        idempotency_key_ttl_ms: keyed.idempotency_key_ttl_ms,
        idempotency_keys_max: keyed.idempotency_keys_max,
        idempotency_key_bytes_max: keyed.idempotency_key_bytes_max,
        idempotency_cached_bytes_max: keyed.idempotency_cached_bytes_max,
        ..config_patch_to_proto(patch)
    }
}

/// The registry config alone as a wire message (its idempotency-key fields
/// zero: use [`configs_to_proto`] for a reply).
pub fn registry_config_to_proto(config: &RegistryConfig) -> proto::RegistryConfig {
    proto::RegistryConfig {
        session_ttl_ms: config.session_ttl_ms,
        sessions_max: config.sessions_max,
        window: config.window,
        cached_bytes_per_session_max: config.cached_bytes_per_session_max,
        key_bytes_max: config.key_bytes_max,
        value_bytes_max: config.value_bytes_max,
        list_elements_max: config.list_elements_max,
        keys_max: config.keys_max,
        ..proto::RegistryConfig::default()
    }
}

/// A whole config as a reply carries it (`GetConfig`, `SetConfig`); not
/// validated here (a config only changes through a patch, which the core
/// validates as a whole when it applies).
pub fn registry_config_from_proto(
    config: Option<proto::RegistryConfig>,
) -> Result<RegistryConfig, ConvertError> {
    let config = config.ok_or(ConvertError::Missing("config"))?;
    Ok(RegistryConfig {
        session_ttl_ms: config.session_ttl_ms,
        sessions_max: config.sessions_max,
        window: config.window,
        cached_bytes_per_session_max: config.cached_bytes_per_session_max,
        key_bytes_max: config.key_bytes_max,
        value_bytes_max: config.value_bytes_max,
        list_elements_max: config.list_elements_max,
        keys_max: config.keys_max,
    })
}

/// A patch from the wire: the fields it sets (their bounds and combination
/// are checked when its entry applies, against the config in force then).
pub fn config_patch_from_proto(
    patch: Option<proto::RegistryConfigPatch>,
) -> Result<ConfigPatch, ConvertError> {
    let patch = patch.ok_or(ConvertError::Missing("patch"))?;
    if let Some(ttl_ms) = patch
        .session_ttl_ms
        .filter(|ttl_ms| *ttl_ms > SESSION_TTL_MS_MAX)
    {
        return Err(ConvertError::SessionTtlTooLong(ttl_ms));
    }
    Ok(ConfigPatch {
        session_ttl_ms: patch.session_ttl_ms,
        sessions_max: patch.sessions_max,
        window: patch.window,
        cached_bytes_per_session_max: patch.cached_bytes_per_session_max,
        key_bytes_max: patch.key_bytes_max,
        value_bytes_max: patch.value_bytes_max,
        list_elements_max: patch.list_elements_max,
        keys_max: patch.keys_max,
    })
}

pub fn config_patch_to_proto(patch: &ConfigPatch) -> proto::RegistryConfigPatch {
    proto::RegistryConfigPatch {
        session_ttl_ms: patch.session_ttl_ms,
        sessions_max: patch.sessions_max,
        window: patch.window,
        cached_bytes_per_session_max: patch.cached_bytes_per_session_max,
        key_bytes_max: patch.key_bytes_max,
        value_bytes_max: patch.value_bytes_max,
        list_elements_max: patch.list_elements_max,
        keys_max: patch.keys_max,
        ..proto::RegistryConfigPatch::default()
    }
}

pub fn request_limits_to_proto(limits: &RequestLimits) -> proto::RequestLimits {
    proto::RequestLimits {
        key_bytes_max: limits.key_bytes_max,
        value_bytes_max: limits.value_bytes_max,
        list_elements_max: limits.list_elements_max,
    }
}

pub fn request_limits_from_proto(limits: &proto::RequestLimits) -> RequestLimits {
    RequestLimits {
        key_bytes_max: limits.key_bytes_max,
        value_bytes_max: limits.value_bytes_max,
        list_elements_max: limits.list_elements_max,
    }
}

pub fn session_to_proto(session: &SessionView) -> proto::SessionInfo {
    proto::SessionInfo {
        client_id: session.client_id.0,
        floor: session.floor,
        cached_responses: session.cached_responses,
        cached_bytes: session.cached_bytes,
        last_activity_ms: session.last_active_ms,
        idle_ms: session.idle_ms,
        owner: session.owner.0.clone(),
    }
}

/// The wire form of a cluster id: 16 bytes big-endian, empty when unknown.
pub fn cluster_id_bytes(cluster_id: Option<ClusterId>) -> Vec<u8> {
    cluster_id.map_or_else(Vec::new, |id| id.0.to_be_bytes().to_vec())
}

/// A cluster id on the wire that is neither empty nor 16 bytes.
#[derive(Debug, thiserror::Error)]
#[error("cluster id must be 16 bytes (or empty when unknown)")]
pub struct BadClusterId;

/// Parses a 16-byte cluster id; empty means "not known yet".
pub fn parse_cluster_id(bytes: &[u8]) -> Result<Option<ClusterId>, BadClusterId> {
    if bytes.is_empty() {
        return Ok(None);
    }
    let bytes: [u8; 16] = bytes.try_into().map_err(|_| BadClusterId)?;
    Ok(Some(ClusterId(u128::from_be_bytes(bytes))))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Commands and results survive the round trip through protobuf.
    #[test]
    fn round_trips() {
        let commands = [
            Command::Put {
                key: b"k".to_vec(),
                value: Value::List(vec![b"a".to_vec()]),
            },
            Command::Delete { key: b"k".to_vec() },
            Command::Increment {
                key: b"k".to_vec(),
                delta: -4,
            },
            Command::Append {
                key: b"k".to_vec(),
                element: b"e".to_vec(),
            },
            Command::CompareAndSwap {
                key: b"k".to_vec(),
                expected: None,
                new: Value::Int(1),
            },
        ];
        for command in commands {
            assert_eq!(
                command_from_proto(Some(command_to_proto(&command))),
                Ok(command)
            );
        }
        let results = [
            CommandResult::Stored,
            CommandResult::Overflow { current: 3 },
            CommandResult::CompareAndSwap {
                swapped: false,
                current: Some(Value::Bytes(b"x".to_vec())),
            },
            CommandResult::WrongType {
                actual: ValueKind::List,
            },
        ];
        for result in results {
            assert_eq!(
                result_from_proto(Some(result_to_proto(&result))),
                Ok(result)
            );
        }
    }

    /// The registry config survives the round trip; a missing one is refused.
    #[test]
    fn registry_config_round_trips() {
        let config = RegistryConfig {
            session_ttl_ms: 1_500,
            window: 3,
            ..RegistryConfig::default()
        };
        assert_eq!(
            registry_config_from_proto(Some(registry_config_to_proto(&config))),
            Ok(config)
        );
        assert_eq!(
            registry_config_from_proto(None),
            Err(ConvertError::Missing("config"))
        );
    }

    /// A patch survives the round trip, unset fields included; a missing
    /// one is refused.
    #[test]
    fn config_patch_round_trips() {
        let patch = ConfigPatch {
            window: Some(8),
            list_elements_max: Some(0),
            ..ConfigPatch::default()
        };
        assert_eq!(
            config_patch_from_proto(Some(config_patch_to_proto(&patch))),
            Ok(patch)
        );
        assert_eq!(
            config_patch_from_proto(None),
            Err(ConvertError::Missing("patch"))
        );
    }

    /// Both configs and both patches survive the round trip through one
    /// wire message each.
    #[test]
    fn keyed_config_round_trips() {
        let keyed = KeyedConfig {
            idempotency_key_ttl_ms: 1_000,
            idempotency_keys_max: 7,
            ..KeyedConfig::default()
        };
        let config = RegistryConfig::default();
        let wire = configs_to_proto(&config, &keyed);
        assert_eq!(keyed_config_from_proto(&wire), keyed);
        assert_eq!(registry_config_from_proto(Some(wire)), Ok(config));
        let patch = ConfigPatch {
            window: Some(8),
            ..ConfigPatch::default()
        };
        let keyed_patch = KeyedConfigPatch {
            idempotency_key_bytes_max: Some(9),
            ..KeyedConfigPatch::default()
        };
        let wire = configs_patch_to_proto(&patch, &keyed_patch);
        assert_eq!(keyed_config_patch_from_proto(&wire), keyed_patch);
        assert_eq!(config_patch_from_proto(Some(wire)), Ok(patch));
    }

    /// A key's record survives the round trip, a cached refusal included;
    /// bad keys and principals are refused at the edge.
    #[test]
    fn keys_round_trip_and_bad_keys_are_refused() {
        for response in [
            Ok(CommandResult::Incremented { value: 3 }),
            Err(LimitExceeded {
                limit: Limit::ValueBytes,
                max: 8,
                requested: 9,
            }),
        ] {
            let view = KeyView {
                principal: Principal("alice".into()),
                key: IdempotencyKey(b"k".to_vec()),
                created_ms: 1,
                age_ms: 2,
                expires_after_ms: 3,
                fingerprint: Fingerprint(u128::MAX - 5),
                response,
                size_bytes: 99,
            };
            assert_eq!(key_from_proto(key_to_proto(&view)), Ok(view));
        }
        assert_eq!(
            idempotency_key_from_proto(Vec::new()),
            Err(ConvertError::EmptyIdempotencyKey)
        );
        assert!(matches!(
            idempotency_key_from_proto(vec![1; bounds::IDEMPOTENCY_KEY_BYTES_MAX as usize + 1]),
            Err(ConvertError::TooLarge("idempotency key", ..))
        ));
        assert!(principal_from_proto("p".repeat(Principal::BYTES_MAX + 1)).is_err());
        assert_eq!(
            principal_from_proto(String::new()),
            Ok(Principal::anonymous())
        );
    }

    /// Oversized keys, empty keys and missing fields are refused at the edge.
    #[test]
    fn bad_input_is_refused() {
        assert_eq!(
            command_from_proto(None),
            Err(ConvertError::Missing("command"))
        );
        for empty in [
            Command::Delete { key: Vec::new() },
            Command::Put {
                key: Vec::new(),
                value: Value::Int(1),
            },
            Command::Increment {
                key: Vec::new(),
                delta: 1,
            },
            Command::Append {
                key: Vec::new(),
                element: b"e".to_vec(),
            },
            Command::CompareAndSwap {
                key: Vec::new(),
                expected: None,
                new: Value::Int(1),
            },
        ] {
            assert_eq!(
                command_from_proto(Some(command_to_proto(&empty))),
                Err(ConvertError::EmptyKey)
            );
        }
        assert_eq!(check_key(b""), Err(ConvertError::EmptyKey));
        assert_eq!(check_key(b"k"), Ok(()));
        let huge = Command::Delete {
            key: vec![0; bounds::KEY_BYTES_MAX as usize + 1],
        };
        assert!(matches!(
            command_from_proto(Some(command_to_proto(&huge))),
            Err(ConvertError::TooLarge("key", ..))
        ));
    }
}
