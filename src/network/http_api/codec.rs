//! What every resource of the HTTP API shares to read requests and write
//! answers: keys from percent-encoded path segments, the
//! `Idempotency-Key` header, typed values, byte strings and command
//! results as JSON (docs/http.md, "Values"), and strict parsing of JSON
//! bodies (unknown fields refused). Pure functions: no I/O, no state (but
//! one per-thread flag that carries a list stopped at its bound from the
//! parser to [`parse`]), no decision about what a request does.
//!
//! Parsing is bounded in work, not only in bytes: a JSON list of byte
//! strings stops at [`LIST_ITEMS_MAX`] items *while it is parsed* (an empty
//! item is 3 bytes of JSON but 24 of memory and a parser step, so a 12 MiB
//! body of them was 4 M items, about a second of the runtime thread and
//! 25 times its size in memory). No list above that many items fits the
//! hard bound on `value_bytes_max`, so one more item is `400
//! LIMIT_EXCEEDED` (`value_bytes_max`) at once, the rest unread.

use super::errors::HttpError;
use axum::http::HeaderMap;
use axum::http::StatusCode;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use oncekv_core::bounds::VALUE_BYTES_MAX;
use oncekv_core::{CommandResult, Limit, Value, ValueKind, list_element_size_bytes};
use oncekv_wire::list_value::LIST_ITEMS_MAX;
use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde_json::{Value as Json, json};
use std::cell::Cell;
use std::fmt;

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
    /// A JSON integer (`-0` too), within i64.
    Int(#[serde(deserialize_with = "json_int")] i64),
    /// A list of byte strings given as UTF-8 text.
    List(#[serde(deserialize_with = "bounded_list")] Vec<String>),
    ListBase64(#[serde(deserialize_with = "bounded_list")] Vec<String>),
}

/// A JSON integer as i64. Read through i128, whose serde_json reader takes
/// the integer grammar as it is: `-0` is the integer 0 (read as i64,
/// serde_json makes it the float `-0.0` and refuses it), while a fraction or
/// an exponent (`0.0`, `1e3`) stays refused.
fn json_int<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    let wide = i128::deserialize(deserializer)?;
    i64::try_from(wide).map_err(|_| {
        de::Error::custom(format!("integer {wide} is outside the signed 64-bit range"))
    })
}

thread_local! {
    /// Set by [`bounded_list`] when it stops a list at [`LIST_ITEMS_MAX`],
    /// read (and cleared) by [`parse`] on this thread right after: serde's
    /// errors carry only a message, and this one must become
    /// `LIMIT_EXCEEDED` with its detail fields, not `INVALID_ARGUMENT`.
    static LIST_TOO_LONG: Cell<bool> = const { Cell::new(false) };
}

/// A JSON list of strings, refused as soon as it has more than
/// [`LIST_ITEMS_MAX`] items: the item past the bound is skipped unread
/// (not allocated), and the parse ends there with an error that [`parse`]
/// answers as [`list_too_long`].
fn bounded_list<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    struct Items;
    impl<'de> Visitor<'de> for Items {
        type Value = Vec<String>;

        fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
            write!(formatter, "a list of at most {LIST_ITEMS_MAX} strings")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
            let mut items = Vec::new();
            loop {
                if items.len() == LIST_ITEMS_MAX {
                    if seq.next_element::<IgnoredAny>()?.is_none() {
                        return Ok(items);
                    }
                    LIST_TOO_LONG.set(true);
                    return Err(de::Error::custom(list_too_long().message));
                }
                match seq.next_element::<String>()? {
                    Some(item) => items.push(item),
                    None => return Ok(items),
                }
            }
        }
    }
    deserializer.deserialize_seq(Items)
}

/// The smallest size a list of more than [`LIST_ITEMS_MAX`] items can have
/// (every item empty), as `Value::size_bytes` counts it.
const LIST_TOO_LONG_BYTES_MIN: u64 = (LIST_ITEMS_MAX as u64 + 1) * list_element_size_bytes(&[]);

/// The answer to a list of more than [`LIST_ITEMS_MAX`] items: larger than
/// any value may be, whatever the cluster's `value_bytes_max` (at most its
/// hard bound, `limit_max` here); `limit_requested` is the least such a
/// list takes. Nothing was executed.
pub(super) fn list_too_long() -> HttpError {
    HttpError::new(
        StatusCode::BAD_REQUEST,
        "LIMIT_EXCEEDED",
        format!(
            "request body: a list of more than {LIST_ITEMS_MAX} items is larger than any value \
             may be: it needs at least {LIST_TOO_LONG_BYTES_MIN} bytes, and the replicated \
             limit {} is at most {VALUE_BYTES_MAX}; nothing was executed",
            Limit::ValueBytes
        ),
    )
    .with("limit", Json::from(Limit::ValueBytes.to_string()))
    .with("limit_max", Json::from(VALUE_BYTES_MAX))
    .with("limit_requested", Json::from(LIST_TOO_LONG_BYTES_MIN))
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

/// A JSON body as `T`; a malformed one is 400 `INVALID_ARGUMENT`, one with
/// a list beyond [`LIST_ITEMS_MAX`] items 400 `LIMIT_EXCEEDED`
/// ([`list_too_long`]), found while parsing.
pub(super) fn parse<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, HttpError> {
    LIST_TOO_LONG.set(false);
    serde_json::from_slice(body).map_err(|error| {
        if LIST_TOO_LONG.replace(false) {
            list_too_long()
        } else {
            HttpError::invalid(format!("request body: {error}"))
        }
    })
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
