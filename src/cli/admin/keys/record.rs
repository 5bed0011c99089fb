//! How one idempotency key's record prints (`admin keys list` and `show`):
//! one line — key, principal, when it first executed, age, expiry, size,
//! its cached answer — or one JSON object; the answer is the command's
//! result, or the refusal of a command that broke a request limit. Pure
//! presentation of a record the node sent; it must not call the cluster.

use serde_json::{Map, Value as Json, json};

use oncekv_core::CommandResult;
use oncekv_wire::convert;
use oncekv_wire::proto;

use super::key_field;
use crate::cli::values::{bytes_text, hex, kind_name, value_inline, value_json};

/// A principal for people: the empty one is `(anonymous)`.
pub(in crate::cli::admin) fn principal_text(principal: &str) -> &str {
    if principal.is_empty() {
        "(anonymous)"
    } else {
        principal
    }
}

/// Milliseconds as seconds with three decimals.
fn seconds(ms: u64) -> String {
    format!("{}.{:03}s", ms / 1000, ms % 1000)
}

/// A key's cached answer, as text and as JSON: the command's result, or
/// the refusal of a command that broke a request limit; an answer that
/// does not decode is shown as such (it is the node's to report).
fn answer(info: &proto::KeyInfo) -> (String, Json) {
    let decoded = convert::key_from_proto(info.clone()).map(|view| view.response);
    match decoded {
        Ok(Ok(result)) => (result_text(&result), result_json(&result)),
        Ok(Err(refused)) => (
            format!(
                "refused: {} = {} (needs {})",
                refused.limit, refused.max, refused.requested
            ),
            json!({
                "kind": "limit_exceeded",
                "limit": refused.limit.to_string(),
                "limit_max": refused.max,
                "limit_requested": refused.requested,
            }),
        ),
        Err(error) => (
            format!("(undecodable: {error})"),
            json!({ "kind": "undecodable", "error": error.to_string() }),
        ),
    }
}

fn result_text(result: &CommandResult) -> String {
    match result {
        CommandResult::Stored => "stored".to_owned(),
        CommandResult::Deleted { existed: true } => "deleted".to_owned(),
        CommandResult::Deleted { existed: false } => "absent".to_owned(),
        CommandResult::Incremented { value } => format!("incremented to {value}"),
        CommandResult::Overflow { current } => format!("overflow (value {current})"),
        CommandResult::Appended { length } => format!("appended (length {length})"),
        CommandResult::CompareAndSwap { swapped, current } => format!(
            "{} {}",
            if *swapped { "swapped" } else { "not swapped" },
            value_inline(current.as_ref())
        ),
        CommandResult::WrongType { actual } => format!("wrong type ({})", kind_name(*actual)),
    }
}

fn result_json(result: &CommandResult) -> Json {
    match result {
        CommandResult::Stored => json!({ "kind": "stored" }),
        CommandResult::Deleted { existed } => json!({ "kind": "deleted", "existed": existed }),
        CommandResult::Incremented { value } => json!({ "kind": "incremented", "value": value }),
        CommandResult::Overflow { current } => json!({ "kind": "overflow", "current": current }),
        CommandResult::Appended { length } => json!({ "kind": "appended", "length": length }),
        CommandResult::CompareAndSwap { swapped, current } => json!({
            "kind": "compare_and_swap",
            "swapped": swapped,
            "current": current.as_ref().map_or(Json::Null, value_json),
        }),
        CommandResult::WrongType { actual } => {
            json!({ "kind": "wrong_type", "actual": kind_name(*actual) })
        }
    }
}

/// `key order-17  principal (anonymous)  age 1.234s  expires_after 86401234
/// size 120 bytes  answer incremented to 5`.
pub(super) fn key_line(info: &proto::KeyInfo) -> String {
    format!(
        "key {}  principal {}  created {}  age {}  expires_after {}  size {} bytes  answer {}",
        bytes_text(&info.idempotency_key),
        principal_text(&info.principal),
        info.created_ms,
        seconds(info.age_ms),
        info.expires_after_ms,
        info.size_bytes,
        answer(info).0,
    )
}

pub(super) fn key_json(info: &proto::KeyInfo) -> Json {
    let mut object = Map::new();
    object.insert("principal".to_owned(), json!(info.principal));
    let (name, key) = key_field("idempotency_key", &info.idempotency_key);
    object.insert(name, key);
    object.insert("created_ms".to_owned(), json!(info.created_ms));
    object.insert("age_ms".to_owned(), json!(info.age_ms));
    object.insert("expires_after_ms".to_owned(), json!(info.expires_after_ms));
    object.insert("fingerprint".to_owned(), json!(hex(&info.fingerprint)));
    object.insert("size_bytes".to_owned(), json!(info.size_bytes));
    object.insert("answer".to_owned(), answer(info).1);
    Json::Object(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record prints on one line, and as JSON with its answer.
    #[test]
    fn records_print() {
        let info = convert::key_to_proto(&oncekv_core::KeyView {
            principal: oncekv_core::Principal::anonymous(),
            key: oncekv_core::IdempotencyKey(b"order-1".to_vec()),
            created_ms: 1_000,
            age_ms: 2_500,
            expires_after_ms: 86_401_000,
            fingerprint: oncekv_core::Fingerprint(7),
            response: Ok(CommandResult::Incremented { value: 5 }),
            size_bytes: 120,
        });
        assert_eq!(
            key_line(&info),
            "key order-1  principal (anonymous)  created 1000  age 2.500s  expires_after \
             86401000  size 120 bytes  answer incremented to 5"
        );
        let object = key_json(&info);
        assert_eq!(object["idempotency_key"], "order-1");
        assert_eq!(object["principal"], "");
        assert_eq!(object["answer"], json!({"kind": "incremented", "value": 5}));
        assert_eq!(object["size_bytes"], 120);
        assert_eq!(object["fingerprint"], format!("{:032x}", 7));
    }
}
