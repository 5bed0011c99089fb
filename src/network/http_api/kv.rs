//! The key-value resource of the HTTP API, `/v1/kv/{key}` and its
//! operations (docs/http.md, "Endpoints"): routes a method and path to an
//! [`Endpoint`], turns JSON bodies into commands and results into JSON,
//! and runs each through the caller's client handle — reads as linearizable
//! reads, writes without an `Idempotency-Key` as `ExecutePlain`
//! (AT-LEAST-ONCE), writes with a well-formed key as `ExecuteKeyed`
//! (EXACTLY ONCE per (principal, key)). It decides nothing itself: the
//! cluster does, through the client library.
//!
//! A keyed write's first answer carries `Idempotent-Replayed: false`, a
//! replay the original status and the byte-identical body (rebuilt from
//! the cached `CommandResult` alone) with `Idempotent-Replayed: true`; the
//! key reused with another command is 422 `KEY_CONFLICT`; a malformed key
//! is 400. `GET` ignores the header.

use super::codec::{
    JsonValue, decode_base64, idempotency_key, parse, percent_decode, present, result_json,
    value_json,
};
use super::errors::{HttpError, client_error};
use super::{Answer, Call, Resource};
use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode};
use futures::future::BoxFuture;
use oncekv_client::{Client, KeyedReply};
use oncekv_core::Command;
use serde::Deserialize;
use serde_json::{Value as Json, json};

pub use super::codec::IDEMPOTENCY_KEY_BYTES_MAX;

/// This resource in the API's table (`super::RESOURCES`).
pub(super) const RESOURCE: Resource = Resource {
    prefix: PREFIX,
    call,
};

/// What a request asks for, once its method and path are understood.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Get(Vec<u8>),
    Put(Vec<u8>),
    Delete(Vec<u8>),
    Increment(Vec<u8>),
    Append(Vec<u8>),
    CompareAndSwap(Vec<u8>),
}

const PREFIX: &str = "/v1/kv";

/// The endpoint of `method` on `path` (the raw, still percent-encoded path
/// of the URI, without its query).
pub fn route(method: &Method, path: &str) -> Result<Endpoint, HttpError> {
    let not_found = || HttpError::no_such_endpoint(path);
    let rest = match path.strip_prefix(PREFIX) {
        Some("") | Some("/") => return Err(HttpError::invalid("empty key")),
        Some(rest) => rest.strip_prefix('/').ok_or_else(not_found)?,
        None => return Err(not_found()),
    };
    let (segment, operation) = match rest.split_once('/') {
        Some((segment, operation)) => (segment, Some(operation)),
        None => (rest, None),
    };
    let wrong_method = |allow: &str| {
        HttpError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "INVALID_ARGUMENT",
            format!("{method} is not allowed on {path}; allowed: {allow}"),
        )
        .with("allow", Json::from(allow))
    };
    let known_operation = matches!(operation, None | Some("incr" | "append" | "cas"));
    if !known_operation {
        return Err(not_found());
    }
    let key = percent_decode(segment)?;
    if key.is_empty() {
        return Err(HttpError::invalid("empty key"));
    }
    Ok(match (operation, method) {
        (None, &Method::GET) => Endpoint::Get(key),
        (None, &Method::PUT) => Endpoint::Put(key),
        (None, &Method::DELETE) => Endpoint::Delete(key),
        (None, _) => return Err(wrong_method("GET, PUT, DELETE")),
        (Some(_), method) if *method != Method::POST => return Err(wrong_method("POST")),
        (Some("incr"), _) => Endpoint::Increment(key),
        (Some("append"), _) => Endpoint::Append(key),
        (Some(_), _) => Endpoint::CompareAndSwap(key),
    })
}

// ---- headers ---------------------------------------------------------------------

/// How a write is delivered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// No `Idempotency-Key`: `ExecutePlain`, at-least-once.
    AtLeastOnce,
    /// With a key (its bytes, unquoted): `ExecuteKeyed`, exactly once per
    /// (principal, key).
    Keyed(Vec<u8>),
}

/// How a write is delivered, from its `Idempotency-Key` header
/// ([`idempotency_key`]).
pub fn delivery(headers: &HeaderMap) -> Result<Delivery, HttpError> {
    Ok(match idempotency_key(headers)? {
        None => Delivery::AtLeastOnce,
        Some(key) => Delivery::Keyed(key),
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PutBody {
    value: JsonValue,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IncrementBody {
    delta: i64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AppendBody {
    element: Option<String>,
    element_base64: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CompareAndSwapBody {
    /// `null`: the key must be absent. Required, so that a forgotten field
    /// is not read as "absent".
    #[serde(default, deserialize_with = "present")]
    expected: Option<Option<JsonValue>>,
    new: JsonValue,
}

/// The command a write endpoint asks for, from its JSON body.
pub fn command(endpoint: Endpoint, body: &[u8]) -> Result<Command, HttpError> {
    Ok(match endpoint {
        Endpoint::Get(_) => return Err(HttpError::invalid("a read is not a command")),
        Endpoint::Put(key) => Command::Put {
            key,
            value: parse::<PutBody>(body)?.value.into_value()?,
        },
        Endpoint::Delete(key) => Command::Delete { key },
        Endpoint::Increment(key) => Command::Increment {
            key,
            delta: parse::<IncrementBody>(body)?.delta,
        },
        Endpoint::Append(key) => {
            let element = match parse::<AppendBody>(body)? {
                AppendBody {
                    element: Some(text),
                    element_base64: None,
                } => text.into_bytes(),
                AppendBody {
                    element: None,
                    element_base64: Some(text),
                } => decode_base64(&text, "element_base64")?,
                _ => {
                    return Err(HttpError::invalid(
                        "request body: exactly one of `element` and `element_base64`",
                    ));
                }
            };
            Command::Append { key, element }
        }
        Endpoint::CompareAndSwap(key) => {
            let body = parse::<CompareAndSwapBody>(body)?;
            let expected = body.expected.ok_or_else(|| {
                HttpError::invalid(
                    "request body: missing field `expected` (null: the key must be absent)",
                )
            })?;
            Command::CompareAndSwap {
                key,
                expected: expected.map(JsonValue::into_value).transpose()?,
                new: body.new.into_value()?,
            }
        }
    })
}

/// The call `method` on `path` asks for.
fn call(method: &Method, path: &str) -> Result<Box<dyn Call>, HttpError> {
    Ok(Box::new(KvCall {
        endpoint: route(method, path)?,
        delivery: Delivery::AtLeastOnce,
    }))
}

/// One request to the resource.
struct KvCall {
    endpoint: Endpoint,
    /// From the headers, for a write.
    delivery: Delivery,
}

impl KvCall {
    fn is_read(&self) -> bool {
        matches!(self.endpoint, Endpoint::Get(_))
    }

    async fn answer(self, client: Client, body: Bytes) -> Result<Answer, HttpError> {
        if let Endpoint::Get(key) = self.endpoint {
            return match client.get(&key).await.map_err(client_error)? {
                Some(value) => Ok(Answer::new(
                    StatusCode::OK,
                    json!({ "value": value_json(&value) }),
                )),
                None => Ok(Answer::new(StatusCode::NOT_FOUND, json!({ "value": null }))),
            };
        }
        let command = command(self.endpoint, &body)?;
        match self.delivery {
            Delivery::AtLeastOnce => {
                let result = client.execute_plain(command).await.map_err(client_error)?;
                Ok(Answer::new(StatusCode::OK, result_json(&result)))
            }
            // The key is scoped by the principal of the caller's token on
            // the client port (rule 19), not by anything done here.
            Delivery::Keyed(key) => {
                let reply = client
                    .execute_with_key(&key, command)
                    .await
                    .map_err(client_error)?;
                Ok(keyed_answer(&reply))
            }
        }
    }
}

impl Call for KvCall {
    fn check_headers(&mut self, headers: &HeaderMap) -> Result<(), HttpError> {
        // Reads are idempotent: an Idempotency-Key is not even parsed.
        if !self.is_read() {
            self.delivery = delivery(headers)?;
        }
        Ok(())
    }

    fn reads_body(&self) -> bool {
        // GET ignores its body; DELETE reads (and ignores) it.
        !self.is_read()
    }

    fn run(
        self: Box<Self>,
        client: Client,
        body: Bytes,
    ) -> BoxFuture<'static, Result<Answer, HttpError>> {
        Box::pin(self.answer(client, body))
    }
}

/// The answer to a keyed write: a function of the cached result alone (no
/// log index, time or anything else of this attempt), so a replay's status
/// and body are byte-identical to the first answer's; only
/// `Idempotent-Replayed` differs.
pub fn keyed_answer(reply: &KeyedReply) -> Answer {
    Answer {
        status: StatusCode::OK,
        body: result_json(&reply.result),
        replayed: Some(reply.duplicate),
    }
}

#[cfg(test)]
mod tests {
    use super::super::IDEMPOTENT_REPLAYED;
    use super::super::test_headers as headers;
    use super::*;
    use axum::response::IntoResponse;
    use oncekv_core::{CommandResult, Value};

    fn key_of(endpoint: Endpoint) -> Vec<u8> {
        match endpoint {
            Endpoint::Get(key)
            | Endpoint::Put(key)
            | Endpoint::Delete(key)
            | Endpoint::Increment(key)
            | Endpoint::Append(key)
            | Endpoint::CompareAndSwap(key) => key,
        }
    }

    /// Paths route to their endpoint with the key percent-decoded into raw
    /// bytes (non-UTF-8 and `/` included); empty keys, bad escapes, unknown
    /// paths and wrong methods are refused with the documented status.
    #[test]
    fn routes_and_keys() {
        assert_eq!(
            route(&Method::GET, "/v1/kv/a%2Fb"),
            Ok(Endpoint::Get(b"a/b".to_vec()))
        );
        assert_eq!(
            route(&Method::PUT, "/v1/kv/caf%C3%A9"),
            Ok(Endpoint::Put("café".as_bytes().to_vec()))
        );
        assert_eq!(
            key_of(route(&Method::DELETE, "/v1/kv/%ff%00").unwrap()),
            [0xff, 0]
        );
        assert_eq!(
            route(&Method::POST, "/v1/kv/n/incr"),
            Ok(Endpoint::Increment(b"n".to_vec()))
        );
        assert_eq!(
            route(&Method::POST, "/v1/kv/l/append"),
            Ok(Endpoint::Append(b"l".to_vec()))
        );
        assert_eq!(
            route(&Method::POST, "/v1/kv/c/cas"),
            Ok(Endpoint::CompareAndSwap(b"c".to_vec()))
        );
        for (method, path, status) in [
            (Method::GET, "/v1/kv/", StatusCode::BAD_REQUEST),
            (Method::GET, "/v1/kv", StatusCode::BAD_REQUEST),
            (Method::POST, "/v1/kv//incr", StatusCode::BAD_REQUEST),
            (Method::GET, "/v1/kv/%zz", StatusCode::BAD_REQUEST),
            (Method::GET, "/v1/kv/a%2", StatusCode::BAD_REQUEST),
            (Method::GET, "/v1/kv/a/b", StatusCode::NOT_FOUND),
            (Method::GET, "/v1/kvx", StatusCode::NOT_FOUND),
            (Method::GET, "/", StatusCode::NOT_FOUND),
            (Method::POST, "/v1/kv/a/incr/x", StatusCode::NOT_FOUND),
            (Method::POST, "/v1/kv/a", StatusCode::METHOD_NOT_ALLOWED),
            (Method::GET, "/v1/kv/a/incr", StatusCode::METHOD_NOT_ALLOWED),
        ] {
            let error = route(&method, path).expect_err(path);
            assert_eq!(error.status, status, "{method} {path}");
            assert_eq!(error.reason, "INVALID_ARGUMENT");
        }
    }

    /// The Idempotency-Key header: absent is at-least-once; a quoted string
    /// (with escapes) or a bare token is a key; anything else is 400.
    #[test]
    fn idempotency_key_header() {
        assert_eq!(delivery(&headers(&[])), Ok(Delivery::AtLeastOnce));
        assert_eq!(
            delivery(&headers(&[("idempotency-key", b"\"k 1\\\"x\"")])),
            Ok(Delivery::Keyed(b"k 1\"x".to_vec()))
        );
        assert_eq!(
            delivery(&headers(&[("idempotency-key", b"8e03978e-40d5")])),
            Ok(Delivery::Keyed(b"8e03978e-40d5".to_vec()))
        );
        let long = format!("\"{}\"", "k".repeat(IDEMPOTENCY_KEY_BYTES_MAX + 1));
        for bad in [
            &b"\"\""[..],
            b"\"open",
            b"\"a\"b\"",
            b"\"a\\n\"",
            b"two words",
            b"caf\xc3\xa9",
            long.as_bytes(),
        ] {
            let error = delivery(&headers(&[("idempotency-key", bad)]))
                .expect_err(&String::from_utf8_lossy(bad));
            assert_eq!(error.status, StatusCode::BAD_REQUEST);
            assert_eq!(error.reason, "INVALID_ARGUMENT");
        }
        let twice = headers(&[("idempotency-key", b"a"), ("idempotency-key", b"b")]);
        assert!(delivery(&twice).is_err());
    }

    /// Bodies become the commands the docs describe: typed values in text
    /// or base64, `expected: null` for absent; malformed, ambiguous or
    /// incomplete bodies are 400.
    #[test]
    fn bodies_become_commands() {
        let key = || b"k".to_vec();
        assert_eq!(
            command(Endpoint::Put(key()), br#"{"value":{"bytes":"hi"}}"#),
            Ok(Command::Put {
                key: key(),
                value: Value::Bytes(b"hi".to_vec())
            })
        );
        assert_eq!(
            command(
                Endpoint::Put(key()),
                br#"{"value":{"bytes_base64":"/wA="}}"#
            ),
            Ok(Command::Put {
                key: key(),
                value: Value::Bytes(vec![0xff, 0])
            })
        );
        assert_eq!(
            command(Endpoint::Put(key()), br#"{"value":{"list":["a","b"]}}"#),
            Ok(Command::Put {
                key: key(),
                value: Value::List(vec![b"a".to_vec(), b"b".to_vec()])
            })
        );
        assert_eq!(
            command(Endpoint::Increment(key()), br#"{"delta":-3}"#),
            Ok(Command::Increment {
                key: key(),
                delta: -3
            })
        );
        assert_eq!(
            command(Endpoint::Append(key()), br#"{"element_base64":"AQI="}"#),
            Ok(Command::Append {
                key: key(),
                element: vec![1, 2]
            })
        );
        assert_eq!(
            command(
                Endpoint::CompareAndSwap(key()),
                br#"{"expected":null,"new":{"int":1}}"#
            ),
            Ok(Command::CompareAndSwap {
                key: key(),
                expected: None,
                new: Value::Int(1)
            })
        );
        assert_eq!(
            command(Endpoint::Delete(key()), b"ignored"),
            Ok(Command::Delete { key: key() })
        );
        for (endpoint, body) in [
            (Endpoint::Put(key()), &b"not json"[..]),
            (Endpoint::Put(key()), br#"{"value":"bare"}"#),
            (Endpoint::Put(key()), br#"{"value":{"bytes":"a","int":1}}"#),
            (
                Endpoint::Put(key()),
                br#"{"value":{"int":9223372036854775808}}"#,
            ),
            (Endpoint::Put(key()), br#"{"value":{"bytes_base64":"!!"}}"#),
            (Endpoint::Put(key()), br#"{"value":{"int":1},"extra":1}"#),
            (Endpoint::Increment(key()), br#"{"delta":"1"}"#),
            (Endpoint::Increment(key()), b""),
            (Endpoint::Append(key()), br#"{}"#),
            (
                Endpoint::Append(key()),
                br#"{"element":"a","element_base64":"YQ=="}"#,
            ),
            (Endpoint::CompareAndSwap(key()), br#"{"new":{"int":1}}"#),
        ] {
            let error = command(endpoint, body).expect_err(&String::from_utf8_lossy(body));
            assert_eq!(error.status, StatusCode::BAD_REQUEST);
            assert_eq!(error.reason, "INVALID_ARGUMENT");
        }
    }

    /// A list stops at `LIST_ITEMS_MAX` items while it is parsed: at the
    /// bound it is a value; one item more is 400 `LIMIT_EXCEEDED` naming
    /// `value_bytes_max` (docs/http.md, "Errors") — for `list` and
    /// `list_base64`, in a put and in either value of a compare-and-swap —
    /// and the parser never reaches what follows (malformed JSON after the
    /// item past the bound is not what the answer is about).
    #[test]
    fn lists_stop_at_the_item_bound_while_parsed() {
        use oncekv_wire::list_value::LIST_ITEMS_MAX;
        let items = |count: usize| vec!["\"\""; count].join(",");
        let at = format!(r#"{{"value":{{"list":[{}]}}}}"#, items(LIST_ITEMS_MAX));
        match command(Endpoint::Put(b"k".to_vec()), at.as_bytes()) {
            Ok(Command::Put {
                value: Value::List(list),
                ..
            }) => assert_eq!(list.len(), LIST_ITEMS_MAX),
            other => panic!("{:?}", other.map(|_| ())),
        }
        let over = items(LIST_ITEMS_MAX + 1);
        for (endpoint, body) in [
            (
                Endpoint::Put(b"k".to_vec()),
                format!(r#"{{"value":{{"list":[{over}]}}}}"#),
            ),
            (
                Endpoint::Put(b"k".to_vec()),
                format!(r#"{{"value":{{"list_base64":[{over}]}}}}"#),
            ),
            (
                Endpoint::CompareAndSwap(b"k".to_vec()),
                format!(r#"{{"expected":{{"list":[{over}]}},"new":{{"int":1}}}}"#),
            ),
            (
                Endpoint::CompareAndSwap(b"k".to_vec()),
                format!(r#"{{"expected":null,"new":{{"list":[{over}]}}}}"#),
            ),
            // Cut off right after the item past the bound: never read.
            (
                Endpoint::Put(b"k".to_vec()),
                format!(r#"{{"value":{{"list":[{over},"#),
            ),
        ] {
            let error = command(endpoint, body.as_bytes()).unwrap_err();
            assert_eq!(
                (error.status, error.reason),
                (StatusCode::BAD_REQUEST, "LIMIT_EXCEEDED"),
                "{}",
                error.message
            );
            let body = error.body();
            assert_eq!(body["limit"], "value_bytes_max");
            assert_eq!(body["limit_max"], 4 << 20);
            assert_eq!(body["limit_requested"], (LIST_ITEMS_MAX as u64 + 1) * 8);
        }
        // A malformed body after one too long is malformed again, not "too long".
        let error = command(Endpoint::Put(b"k".to_vec()), b"{").unwrap_err();
        assert_eq!(error.reason, "INVALID_ARGUMENT");
    }

    /// `-0` is a JSON integer (0); fractions, exponents and numbers outside
    /// i64 are not integers of a value.
    #[test]
    fn int_values_follow_the_integer_grammar() {
        let put = |body: &str| command(Endpoint::Put(b"k".to_vec()), body.as_bytes());
        for (text, int) in [
            ("-0", 0),
            ("0", 0),
            ("-42", -42),
            ("9223372036854775807", i64::MAX),
            ("-9223372036854775808", i64::MIN),
        ] {
            assert_eq!(
                put(&format!(r#"{{"value":{{"int":{text}}}}}"#)),
                Ok(Command::Put {
                    key: b"k".to_vec(),
                    value: Value::Int(int)
                }),
                "{text}"
            );
        }
        for text in [
            "-0.0",
            "0.0",
            "1e3",
            "1.5",
            "9223372036854775808",
            "-9223372036854775809",
            "\"1\"",
            "null",
        ] {
            let error = put(&format!(r#"{{"value":{{"int":{text}}}}}"#)).expect_err(text);
            assert_eq!(
                (error.status, error.reason),
                (StatusCode::BAD_REQUEST, "INVALID_ARGUMENT"),
                "{text}"
            );
        }
    }

    /// A keyed answer depends on the cached result alone: the first answer
    /// and a replay (another log index) have the same status and
    /// byte-identical bodies, and differ only in `Idempotent-Replayed`.
    #[tokio::test]
    async fn keyed_replays_are_byte_identical() {
        let result = CommandResult::CompareAndSwap {
            swapped: false,
            current: Some(Value::List(vec![b"a".to_vec(), vec![0xff]])),
        };
        let first = keyed_answer(&KeyedReply {
            result: result.clone(),
            duplicate: false,
            log_index: 7,
        });
        let replay = keyed_answer(&KeyedReply {
            result,
            duplicate: true,
            log_index: 19,
        });
        let mut bodies = Vec::new();
        for (answer, replayed) in [(first, "false"), (replay, "true")] {
            let response = answer.into_response();
            assert_eq!(response.status(), StatusCode::OK);
            assert_eq!(
                response.headers().get(IDEMPOTENT_REPLAYED).unwrap(),
                replayed
            );
            let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap();
            bodies.push(body);
        }
        assert_eq!(bodies[0], bodies[1]);
        let plain = Answer::new(StatusCode::OK, json!({"result": "stored"})).into_response();
        assert!(plain.headers().get(IDEMPOTENT_REPLAYED).is_none());
    }
}
