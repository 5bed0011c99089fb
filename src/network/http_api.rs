//! The HTTP/JSON API of a node (`--http-addr`, docs/http.md): routes
//! `/v1/kv/{key}` requests, turns their JSON into commands and results and
//! failures into JSON errors carrying the gRPC reason names, and serves it
//! all over plain TCP or TLS with the node's certificate. It decides
//! nothing: every request goes through the client library to this node's
//! own client port, which authenticates the caller (the HTTP caller's bearer
//! token is passed through, never the node's identity) and forwards to the
//! leader by following `NOT_LEADER` hints. It holds no state but a small
//! cache of client handles, one per token.
//!
//! Writes without an `Idempotency-Key` are AT-LEAST-ONCE (`ExecutePlain`).
//! A write with a well-formed key runs EXACTLY ONCE per (principal, key)
//! through `ExecuteKeyed` (`Client::execute_with_key`): the first answer
//! carries `Idempotent-Replayed: false`, a replay the original status and
//! the byte-identical body (rebuilt from the cached `CommandResult` alone)
//! with `Idempotent-Replayed: true`; the key reused with another command is
//! 422 `KEY_CONFLICT`; a malformed key is 400. `GET` ignores the header.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use oncekv_client::credentials::{BearerToken, Credentials};
use oncekv_client::{Client, ClientConfig, Error as ClientError, KeyedReply};
use oncekv_core::{Command, CommandResult, Value, ValueKind};
use serde::Deserialize;
use serde_json::{Map, Value as Json, json};
use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;

/// Largest request body accepted (a compare-and-swap of two values at the
/// hard value bound, base64-encoded, fits); larger is 413.
pub const BODY_BYTES_MAX: usize = 12 << 20;
/// Requests handled at once; one more is refused at once with 503
/// (`UNAVAILABLE`), so bodies held in memory stay bounded.
pub const REQUESTS_IN_FLIGHT_MAX: usize = 64;
/// Deadline of one request's forwarded call, retries included.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Deadline of one attempt of a forwarded call.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// Most bytes of an `Idempotency-Key` (inside its quotes).
pub const IDEMPOTENCY_KEY_BYTES_MAX: usize = 255;
/// Client handles kept (one per distinct bearer token, and one for none).
const CLIENTS_MAX: usize = 64;
/// How long a connection may take to send its TLS handshake or a request's
/// headers.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long in-flight requests may finish after the node is told to stop.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(4);

// ---- errors ------------------------------------------------------------------

/// A failed request: an HTTP status and the JSON body
/// `{"reason": ..., "message": ..., ...detail}`.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpError {
    pub status: StatusCode,
    /// A reason name of the gRPC error table (`ErrorDetail.reason`).
    pub reason: &'static str,
    pub message: String,
    pub detail: Map<String, Json>,
}

impl HttpError {
    fn new(status: StatusCode, reason: &'static str, message: impl Into<String>) -> HttpError {
        HttpError {
            status,
            reason,
            message: message.into(),
            detail: Map::new(),
        }
    }

    fn invalid(message: impl Into<String>) -> HttpError {
        HttpError::new(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", message)
    }

    fn with(mut self, field: &str, value: Json) -> HttpError {
        self.detail.insert(field.to_string(), value);
        self
    }

    /// The JSON body.
    pub fn body(&self) -> Json {
        let mut body = Map::new();
        body.insert("reason".into(), Json::from(self.reason));
        body.insert("message".into(), Json::from(self.message.clone()));
        for (field, value) in &self.detail {
            body.insert(field.clone(), value.clone());
        }
        Json::Object(body)
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let mut response = (self.status, json_body(&self.body())).into_response();
        let headers = response.headers_mut();
        match self.status {
            StatusCode::UNAUTHORIZED => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            StatusCode::METHOD_NOT_ALLOWED => {
                if let Some(Json::String(allow)) = self.detail.get("allow")
                    && let Ok(allow) = HeaderValue::from_str(allow)
                {
                    headers.insert(header::ALLOW, allow);
                }
            }
            _ => {}
        }
        response
    }
}

fn json_body(value: &Json) -> ([(header::HeaderName, HeaderValue); 1], String) {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        value.to_string(),
    )
}

/// The one mapping of the client library's errors to HTTP (docs/http.md,
/// "Errors").
pub fn client_error(error: ClientError) -> HttpError {
    let message = error.to_string();
    match error {
        ClientError::OutcomeUnknown { .. } => {
            HttpError::new(StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE", message)
                .with("outcome_unknown", Json::Bool(true))
        }
        ClientError::Unavailable(_) => {
            HttpError::new(StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE", message)
        }
        ClientError::SessionExpired => {
            HttpError::new(StatusCode::NOT_FOUND, "SESSION_EXPIRED", message)
        }
        ClientError::WrongCluster { expected } => {
            HttpError::new(StatusCode::CONFLICT, "WRONG_CLUSTER", message)
                .with("expected_cluster_id", Json::from(expected))
        }
        ClientError::SeqConflict { .. } => {
            HttpError::new(StatusCode::CONFLICT, "SEQ_CONFLICT", message)
        }
        ClientError::ResponseDiscarded { floor, .. } => {
            HttpError::new(StatusCode::GONE, "RESPONSE_DISCARDED", message)
                .with("floor", Json::from(floor))
        }
        ClientError::InvalidArgument(_) => HttpError::invalid(message),
        ClientError::Unauthenticated(_) => {
            HttpError::new(StatusCode::UNAUTHORIZED, "UNAUTHENTICATED", message)
        }
        ClientError::PermissionDenied(_) => {
            HttpError::new(StatusCode::FORBIDDEN, "PERMISSION_DENIED", message)
        }
        ClientError::ResourceExhausted(_) => {
            HttpError::new(StatusCode::TOO_MANY_REQUESTS, "RESOURCE_EXHAUSTED", message)
        }
        ClientError::LimitExceeded {
            limit,
            max,
            requested,
        } => HttpError::new(StatusCode::BAD_REQUEST, "LIMIT_EXCEEDED", message)
            .with("limit", Json::from(limit.to_string()))
            .with("limit_max", Json::from(max))
            .with("limit_requested", Json::from(requested)),
        ClientError::KeyConflict { key } => HttpError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "KEY_CONFLICT",
            format!(
                "{message}; an Idempotency-Key answers only the request it was first used \
                 with (same method, path and body; see docs/http.md)"
            ),
        )
        .with("idempotency_key", Json::from(key)),
        // At-least-once (no key): the write may have applied, and may
        // still; nothing can fence it or learn it but a read.
        ClientError::PlainOutcomeUnknown { .. } => {
            HttpError::new(StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE", message)
                .with("outcome_unknown", Json::Bool(true))
        }
        // Like `OutcomeUnknown`, but learnable: the same key and request
        // again get the original answer (or execute, if the first never did).
        ClientError::KeyOutcomeUnknown { key, .. } => {
            HttpError::new(StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE", message)
                .with("outcome_unknown", Json::Bool(true))
                .with("retry_with_same_key", Json::Bool(true))
                .with("idempotency_key", Json::from(key))
        }
    }
}

// ---- routes --------------------------------------------------------------------

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

/// The endpoint of `method` on `path` (the raw, still percent-encoded path
/// of the URI, without its query).
pub fn route(method: &Method, path: &str) -> Result<Endpoint, HttpError> {
    let not_found = || {
        HttpError::new(
            StatusCode::NOT_FOUND,
            "INVALID_ARGUMENT",
            format!("no such endpoint: {path} (see docs/http.md)"),
        )
    };
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

/// The `Idempotency-Key` header, if any: a structured-field string
/// (`"..."`, RFC 8941, as the IETF draft has it) or, leniently, a bare
/// token of visible ASCII; 1..=255 bytes, printable ASCII.
pub fn delivery(headers: &HeaderMap) -> Result<Delivery, HttpError> {
    let mut values = headers.get_all("idempotency-key").iter();
    let Some(value) = values.next() else {
        return Ok(Delivery::AtLeastOnce);
    };
    let malformed =
        |why: &str| HttpError::invalid(format!("malformed Idempotency-Key header: {why}"));
    if values.next().is_some() {
        return Err(malformed("given more than once"));
    }
    let text = value
        .to_str()
        .map_err(|_| malformed("not printable ASCII"))?
        .trim_matches(|c| c == ' ' || c == '\t');
    let key = match text.strip_prefix('"') {
        Some(quoted) => {
            let inner = quoted
                .strip_suffix('"')
                .ok_or_else(|| malformed("an unterminated string"))?;
            let mut key = Vec::with_capacity(inner.len());
            let mut chars = inner.bytes();
            while let Some(byte) = chars.next() {
                match byte {
                    b'\\' => match chars.next() {
                        Some(escaped @ (b'"' | b'\\')) => key.push(escaped),
                        _ => return Err(malformed("a bad escape (only \\\" and \\\\)")),
                    },
                    b'"' => return Err(malformed("an unescaped quote inside the string")),
                    0x20..=0x7e => key.push(byte),
                    _ => return Err(malformed("not printable ASCII")),
                }
            }
            key
        }
        None => {
            if !text
                .bytes()
                .all(|byte| byte.is_ascii_graphic() && byte != b'"')
            {
                return Err(malformed(
                    "quote it as a string (\"...\") or use visible ASCII only",
                ));
            }
            text.as_bytes().to_vec()
        }
    };
    if key.is_empty() {
        return Err(malformed("empty"));
    }
    if key.len() > IDEMPOTENCY_KEY_BYTES_MAX {
        return Err(malformed(&format!(
            "{} bytes, at most {IDEMPOTENCY_KEY_BYTES_MAX}",
            key.len()
        )));
    }
    Ok(Delivery::Keyed(key))
}

/// The caller's bearer token (`Authorization: Bearer TOKEN`), if any; a
/// header that is not one is 401 (`UNAUTHENTICATED`).
pub fn bearer_token(headers: &HeaderMap) -> Result<Option<String>, HttpError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let unauthenticated = |why: &str| {
        HttpError::new(
            StatusCode::UNAUTHORIZED,
            "UNAUTHENTICATED",
            format!("malformed Authorization header: {why}"),
        )
    };
    let text = value
        .to_str()
        .map_err(|_| unauthenticated("not printable ASCII"))?;
    let (scheme, token) = text
        .trim()
        .split_once(' ')
        .ok_or_else(|| unauthenticated("expected `Bearer TOKEN`"))?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(unauthenticated("only the Bearer scheme is accepted"));
    }
    let token = token.trim();
    if token.is_empty() || !token.bytes().all(|byte| byte.is_ascii_graphic()) {
        return Err(unauthenticated("the token must be visible ASCII"));
    }
    Ok(Some(token.to_string()))
}

// ---- JSON ------------------------------------------------------------------------

/// A typed value in JSON: exactly one of these members (docs/http.md).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum JsonValue {
    /// Bytes given as UTF-8 text.
    Bytes(String),
    BytesBase64(String),
    Int(i64),
    /// A list of byte strings given as UTF-8 text.
    List(Vec<String>),
    ListBase64(Vec<String>),
}

fn decode_base64(text: &str, what: &str) -> Result<Vec<u8>, HttpError> {
    BASE64
        .decode(text)
        .map_err(|error| HttpError::invalid(format!("{what}: not standard base64: {error}")))
}

impl JsonValue {
    fn into_value(self) -> Result<Value, HttpError> {
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

/// Present (even as `null`) versus absent.
fn present<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
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

fn parse<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, HttpError> {
    serde_json::from_slice(body)
        .map_err(|error| HttpError::invalid(format!("request body: {error}")))
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

// ---- the service -------------------------------------------------------------------

/// Client handles to this node's client port, one per bearer token.
struct Gateway {
    /// This node's announced client address (its certificate names it).
    endpoint: String,
    /// The cluster CA when the node has TLS; never the node's own identity.
    credentials: Credentials,
    clients: Mutex<BTreeMap<Option<[u8; 32]>, Client>>,
}

impl Gateway {
    /// The client showing `token` (the caller's), made on first use. The
    /// cache is bounded: when full, an arbitrary entry makes room (its
    /// connections close; no session is lost, the calls have none).
    fn client(&self, token: Option<&str>) -> Result<Client, HttpError> {
        let slot = token.map(|token| *blake3::hash(token.as_bytes()).as_bytes());
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(client) = clients.get(&slot) {
            return Ok(client.clone());
        }
        let bearer = match token {
            Some(token) => BearerToken::new(token).map_err(|error| {
                HttpError::new(
                    StatusCode::UNAUTHORIZED,
                    "UNAUTHENTICATED",
                    error.to_string(),
                )
            })?,
            None => BearerToken::default(),
        };
        let config = ClientConfig {
            call_timeout: CALL_TIMEOUT,
            attempt_timeout: ATTEMPT_TIMEOUT,
            credentials: self.credentials.with_token(bearer),
            ..ClientConfig::default()
        };
        let client = Client::with_config([self.endpoint.clone()], config);
        if clients.len() >= CLIENTS_MAX {
            clients.pop_first();
        }
        clients.insert(slot, client.clone());
        Ok(client)
    }
}

/// The HTTP API's shared state.
#[derive(Clone)]
pub struct HttpApi {
    gateway: Arc<Gateway>,
    permits: Arc<Semaphore>,
}

impl HttpApi {
    /// An API forwarding to the client port announced as `endpoint`,
    /// trusting the CA at `ca` when the node has TLS.
    pub fn new(endpoint: String, ca: Option<&Path>) -> Result<HttpApi, HttpSetupError> {
        let credentials = match ca {
            None => Credentials::none(),
            Some(ca) => Credentials::load(&oncekv_client::credentials::CredentialPaths {
                ca: Some(ca.to_path_buf()),
                ..Default::default()
            })
            .map_err(|error| HttpSetupError(error.to_string()))?,
        };
        Ok(HttpApi {
            gateway: Arc::new(Gateway {
                endpoint,
                credentials,
                clients: Mutex::new(BTreeMap::new()),
            }),
            permits: Arc::new(Semaphore::new(REQUESTS_IN_FLIGHT_MAX)),
        })
    }

    /// The axum router: every path goes to one handler, which routes itself
    /// (keys are raw percent-decoded bytes, which axum's extractors are not).
    pub fn router(self) -> axum::Router {
        axum::Router::new().fallback(handle).with_state(self)
    }

    async fn serve(&self, method: Method, uri: Uri, headers: HeaderMap, body: Body) -> Response {
        match self.answer(&method, &uri, &headers, body).await {
            Ok(answer) => answer.into_response(),
            Err(error) => error.into_response(),
        }
    }

    async fn answer(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: Body,
    ) -> Result<Answer, HttpError> {
        let endpoint = route(method, uri.path())?;
        let token = bearer_token(headers)?;
        if let Endpoint::Get(key) = endpoint {
            // Reads are idempotent: an Idempotency-Key is not even parsed.
            let client = self.gateway.client(token.as_deref())?;
            return match client.get(&key).await.map_err(client_error)? {
                Some(value) => Ok(Answer::new(
                    StatusCode::OK,
                    json!({ "value": value_json(&value) }),
                )),
                None => Ok(Answer::new(StatusCode::NOT_FOUND, json!({ "value": null }))),
            };
        }
        let delivery = delivery(headers)?;
        let body = read_body(headers, body).await?;
        let command = command(endpoint, &body)?;
        let client = self.gateway.client(token.as_deref())?;
        match delivery {
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

/// A successful answer: a status, a JSON body, and for a keyed write
/// whether it was replayed.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Json,
    /// `Idempotent-Replayed`: `None` (no header) without a key.
    pub replayed: Option<bool>,
}

impl Answer {
    fn new(status: StatusCode, body: Json) -> Answer {
        Answer {
            status,
            body,
            replayed: None,
        }
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

/// The header telling a replay (`true`) from a first execution (`false`).
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        let mut response = (self.status, json_body(&self.body)).into_response();
        if let Some(replayed) = self.replayed {
            response.headers_mut().insert(
                IDEMPOTENT_REPLAYED,
                HeaderValue::from_static(if replayed { "true" } else { "false" }),
            );
        }
        response
    }
}

/// The body, at most [`BODY_BYTES_MAX`] bytes (413 beyond, before reading
/// it when `Content-Length` says so).
async fn read_body(headers: &HeaderMap, body: Body) -> Result<Bytes, HttpError> {
    let too_large = || {
        HttpError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "INVALID_ARGUMENT",
            format!("the request body is larger than {BODY_BYTES_MAX} bytes"),
        )
        .with("body_bytes_max", Json::from(BODY_BYTES_MAX))
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > BODY_BYTES_MAX as u64) {
        return Err(too_large());
    }
    axum::body::to_bytes(body, BODY_BYTES_MAX)
        .await
        .map_err(|error| {
            // Only exceeding the limit and a broken connection fail here.
            if std::error::Error::source(&error).is_some_and(|source| {
                source
                    .downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some()
            }) {
                too_large()
            } else {
                HttpError::invalid(format!("reading the request body: {error}"))
            }
        })
}

async fn handle(
    State(api): State<HttpApi>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let Ok(_permit) = api.permits.clone().try_acquire_owned() else {
        return HttpError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "UNAVAILABLE",
            format!("overloaded: {REQUESTS_IN_FLIGHT_MAX} HTTP requests in flight"),
        )
        .into_response();
    };
    api.serve(method, uri, headers, body).await
}

// ---- serving -------------------------------------------------------------------------

/// Why the HTTP API cannot start.
#[derive(Debug, thiserror::Error)]
#[error("HTTP API: {0}")]
pub struct HttpSetupError(String);

/// Serves `router` on `listener` (HTTP/1.1, over TLS when `tls` is given:
/// the node's certificate and key, no client certificates — callers
/// authenticate with bearer tokens; each connection with the settings
/// current when it arrives) until `shutdown` completes; then in-flight
/// requests get [`SHUTDOWN_GRACE`] to finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<super::tls::NodeTls>,
    router: axum::Router,
    shutdown: impl Future<Output = ()>,
) {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => {
                let (stream, _peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Out of descriptors, say: pause rather than spin.
                        tracing::warn!(%error, "HTTP accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let service = hyper_util::service::TowerToHyperService::new(router.clone());
                let acceptor = tls.as_ref().map(|tls| {
                    tokio_rustls::TlsAcceptor::from(tls.server_config(super::tls::Port::Http))
                });
                let stopped = stopped.clone();
                connections.spawn(async move {
                    match acceptor {
                        None => connection(hyper_util::rt::TokioIo::new(stream), service, stopped).await,
                        Some(acceptor) => {
                            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                                Ok(Ok(tls)) => {
                                    connection(hyper_util::rt::TokioIo::new(tls), service, stopped).await
                                }
                                Ok(Err(error)) => tracing::debug!(%error, "HTTPS handshake failed"),
                                Err(_) => tracing::debug!("HTTPS handshake timed out"),
                            }
                        }
                    }
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    let _ = stop.send(true);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    // Dropping the set aborts whatever is left.
}

/// Serves one connection; on shutdown lets its request in flight finish.
async fn connection<I, S>(io: I, service: S, mut stopped: tokio::sync::watch::Receiver<bool>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::HttpService<hyper::body::Incoming> + Send,
    S::Future: Send + 'static,
    S::ResBody: Send + 'static,
    <S::ResBody as hyper::body::Body>::Data: Send,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HANDSHAKE_TIMEOUT);
    let connection = builder.serve_connection(io, service);
    let mut connection = std::pin::pin!(connection);
    tokio::select! {
        result = connection.as_mut() => {
            if let Err(error) = result {
                tracing::debug!(%error, "HTTP connection ended");
            }
        }
        () = async {
            // The guard `wait_for` returns is not `Send`: drop it here.
            let _ = stopped.wait_for(|stop| *stop).await.map(drop);
        } => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_bytes(value).unwrap(),
            );
        }
        map
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

    /// Bearer tokens are passed through as given; other schemes and junk
    /// are 401.
    #[test]
    fn authorization_header() {
        assert_eq!(bearer_token(&headers(&[])), Ok(None));
        assert_eq!(
            bearer_token(&headers(&[("authorization", b"Bearer abc.def")])),
            Ok(Some("abc.def".into()))
        );
        assert_eq!(
            bearer_token(&headers(&[("authorization", b"bearer  abc")])),
            Ok(Some("abc".into()))
        );
        for bad in [&b"Basic abc"[..], b"Bearer", b"Bearer a b", b"abc"] {
            let error = bearer_token(&headers(&[("authorization", bad)]))
                .expect_err(&String::from_utf8_lossy(bad));
            assert_eq!(error.status, StatusCode::UNAUTHORIZED);
            assert_eq!(error.reason, "UNAUTHENTICATED");
        }
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

    /// Client errors keep their reason names and detail fields, with the
    /// documented HTTP statuses.
    #[test]
    fn client_errors_map_to_statuses() {
        let limit = client_error(ClientError::LimitExceeded {
            limit: oncekv_core::Limit::ValueBytes,
            max: 4,
            requested: 9,
        });
        assert_eq!(limit.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            limit.body(),
            json!({"reason": "LIMIT_EXCEEDED", "message": limit.message,
                   "limit": "value_bytes_max", "limit_max": 4, "limit_requested": 9})
        );
        for (error, status, reason) in [
            (
                ClientError::Unavailable("x".into()),
                StatusCode::SERVICE_UNAVAILABLE,
                "UNAVAILABLE",
            ),
            (
                ClientError::Unauthenticated("x".into()),
                StatusCode::UNAUTHORIZED,
                "UNAUTHENTICATED",
            ),
            (
                ClientError::PermissionDenied("x".into()),
                StatusCode::FORBIDDEN,
                "PERMISSION_DENIED",
            ),
            (
                ClientError::ResourceExhausted("x".into()),
                StatusCode::TOO_MANY_REQUESTS,
                "RESOURCE_EXHAUSTED",
            ),
            (
                ClientError::WrongCluster {
                    expected: "ab".into(),
                },
                StatusCode::CONFLICT,
                "WRONG_CLUSTER",
            ),
            (
                ClientError::InvalidArgument("x".into()),
                StatusCode::BAD_REQUEST,
                "INVALID_ARGUMENT",
            ),
        ] {
            let mapped = client_error(error);
            assert_eq!((mapped.status, mapped.reason), (status, reason));
        }
        let conflict = client_error(ClientError::KeyConflict { key: "k1".into() });
        assert_eq!(
            (conflict.status, conflict.reason),
            (StatusCode::UNPROCESSABLE_ENTITY, "KEY_CONFLICT")
        );
        assert_eq!(conflict.body()["idempotency_key"], "k1");
        let unknown = client_error(ClientError::KeyOutcomeUnknown {
            key: "k1".into(),
            reason: "deadline".into(),
        });
        assert_eq!(
            (unknown.status, unknown.reason),
            (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE")
        );
        let body = unknown.body();
        assert_eq!(body["outcome_unknown"], true);
        assert_eq!(body["retry_with_same_key"], true);
        assert!(
            body["message"].as_str().unwrap().contains("same key"),
            "{body}"
        );
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
