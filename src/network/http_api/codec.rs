//! What every resource of the HTTP API shares to read requests and write
//! answers: keys from percent-encoded path segments, the
//! `Idempotency-Key` header, typed values, byte strings and command
//! results as JSON (docs/http.md, "Values"), and strict parsing of JSON
//! bodies (unknown fields refused). Pure functions: no I/O, no state,
//! no decision about what a request does.

use super::errors::HttpError;
use axum::http::HeaderMap;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use oncekv_core::{CommandResult, Value, ValueKind};
use serde::Deserialize;
use serde_json::{Value as Json, json};

/// Decodes one percent-encoded path segment into bytes, strictly: `%` must
/// be followed by two hex digits.
pub fn percent_decode(segment: &str) -> Result<Vec<u8>, HttpError> {
    let bytes = segment.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let digit = |at: usize| {
                bytes
                    .get(at)
                    .and_then(|byte| (*byte as char).to_digit(16))
                    .map(|digit| digit as u8)
            };
            match (digit(index + 1), digit(index + 2)) {
                (Some(high), Some(low)) => decoded.push(high << 4 | low),
                _ => {
                    return Err(HttpError::invalid(
                        "malformed percent-encoding in the key ('%' needs two hex digits)",
                    ));
                }
            }
            index += 3;
        } else {
            decoded.push(bytes[index]);
            index += 1;
        }
    }
    Ok(decoded)
}

/// Most bytes of an `Idempotency-Key` (inside its quotes).
pub const IDEMPOTENCY_KEY_BYTES_MAX: usize =
    oncekv_wire::idempotency_header::IDEMPOTENCY_KEY_HEADER_BYTES_MAX;

/// The `Idempotency-Key` header's key, if any: a structured-field string
/// (`"..."`, RFC 8941, as the IETF draft has it) or, leniently, a bare
/// token of visible ASCII; 1..=255 bytes, printable ASCII
/// (`oncekv_wire::idempotency_header`, which `oncekv proxy` reads it with too).
pub fn idempotency_key(headers: &HeaderMap) -> Result<Option<Vec<u8>>, HttpError> {
    oncekv_wire::idempotency_header::idempotency_key(headers).map_err(HttpError::invalid)
}

/// A typed value in JSON: exactly one of these members (docs/http.md).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub(super) enum JsonValue {
    /// Bytes given as UTF-8 text.
    Bytes(String),
    BytesBase64(String),
    Int(i64),
    /// A list of byte strings given as UTF-8 text.
    List(Vec<String>),
    ListBase64(Vec<String>),
}

pub(super) fn decode_base64(text: &str, what: &str) -> Result<Vec<u8>, HttpError> {
    BASE64
        .decode(text)
        .map_err(|error| HttpError::invalid(format!("{what}: not standard base64: {error}")))
}

impl JsonValue {
    pub(super) fn into_value(self) -> Result<Value, HttpError> {
        Ok(match self {
            JsonValue::Bytes(text) => Value::Bytes(text.into_bytes()),
            JsonValue::BytesBase64(text) => Value::Bytes(decode_base64(&text, "bytes_base64")?),
            JsonValue::Int(value) => Value::Int(value),
            JsonValue::List(items) => {
                Value::List(items.into_iter().map(String::into_bytes).collect())
            }
            JsonValue::ListBase64(items) => Value::List(
                items
                    .iter()
                    .map(|item| decode_base64(item, "list_base64"))
                    .collect::<Result<_, _>>()?,
            ),
        })
    }
}

/// A value as JSON: text forms when every byte string is UTF-8, the
/// `_base64` forms otherwise.
pub fn value_json(value: &Value) -> Json {
    match value {
        Value::Bytes(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) => json!({ "bytes": text }),
            Err(_) => json!({ "bytes_base64": BASE64.encode(bytes) }),
        },
        Value::Int(value) => json!({ "int": value }),
        Value::List(items) => {
            let texts: Option<Vec<&str>> = items
                .iter()
                .map(|item| std::str::from_utf8(item).ok())
                .collect();
            match texts {
                Some(texts) => json!({ "list": texts }),
                None => json!({
                    "list_base64": items.iter().map(|item| BASE64.encode(item)).collect::<Vec<_>>()
                }),
            }
        }
    }
}

/// Bytes as one JSON member named `name` when they are UTF-8 text, or
/// `{name}_base64` (standard base64) otherwise, as values are written.
pub fn bytes_member(name: &str, bytes: &[u8]) -> (String, Json) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (name.to_string(), Json::from(text)),
        Err(_) => (format!("{name}_base64"), Json::from(BASE64.encode(bytes))),
    }
}

/// Bytes given as exactly one of the members `name` (UTF-8 text) and
/// `{name}_base64` (standard base64), as `text` and `base64`.
pub(super) fn bytes_from_members(
    name: &str,
    text: Option<String>,
    base64: Option<String>,
) -> Result<Vec<u8>, HttpError> {
    match (text, base64) {
        (Some(text), None) => Ok(text.into_bytes()),
        (None, Some(base64)) => decode_base64(&base64, &format!("{name}_base64")),
        _ => Err(HttpError::invalid(format!(
            "request body: exactly one of `{name}` and `{name}_base64`"
        ))),
    }
}

fn kind_name(kind: ValueKind) -> &'static str {
    match kind {
        ValueKind::Bytes => "bytes",
        ValueKind::Int => "int",
        ValueKind::List => "list",
    }
}

/// A command's result as JSON, mirroring `CommandResult`.
pub fn result_json(result: &CommandResult) -> Json {
    match result {
        CommandResult::Stored => json!({ "result": "stored" }),
        CommandResult::Deleted { existed } => json!({ "result": "deleted", "existed": existed }),
        CommandResult::Incremented { value } => json!({ "result": "incremented", "value": value }),
        CommandResult::Overflow { current } => json!({ "result": "overflow", "current": current }),
        CommandResult::Appended { length } => json!({ "result": "appended", "length": length }),
        CommandResult::CompareAndSwap { swapped, current } => json!({
            "result": "compare_and_swap",
            "swapped": swapped,
            "current": current.as_ref().map_or(Json::Null, value_json),
        }),
        CommandResult::WrongType { actual } => {
            json!({ "result": "wrong_type", "actual": kind_name(*actual) })
        }
    }
}

/// Present (even as `null`) versus absent.
pub(super) fn present<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
}

/// A JSON body as `T`; a malformed one is 400.
pub(super) fn parse<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, HttpError> {
    serde_json::from_slice(body)
        .map_err(|error| HttpError::invalid(format!("request body: {error}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Results mirror CommandResult; values come back as text when UTF-8,
    /// as base64 otherwise.
    #[test]
    fn results_and_values_as_json() {
        assert_eq!(
            result_json(&CommandResult::Incremented { value: 7 }),
            json!({"result": "incremented", "value": 7})
        );
        assert_eq!(
            result_json(&CommandResult::CompareAndSwap {
                swapped: false,
                current: Some(Value::List(vec![b"a".to_vec(), vec![0xff]])),
            }),
            json!({"result": "compare_and_swap", "swapped": false,
                   "current": {"list_base64": ["YQ==", "/w=="]}})
        );
        assert_eq!(
            result_json(&CommandResult::WrongType {
                actual: ValueKind::List
            }),
            json!({"result": "wrong_type", "actual": "list"})
        );
        assert_eq!(
            value_json(&Value::Bytes(b"hi".to_vec())),
            json!({"bytes": "hi"})
        );
        assert_eq!(value_json(&Value::Int(-1)), json!({"int": -1}));
    }
}
