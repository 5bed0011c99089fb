//! The claims resource of the HTTP API, `/v1/claims/{key}` (docs/http.md,
//! "Claims"; rule 20): routes a method and path to one of the four claim
//! calls, reads their JSON bodies, runs each through the caller's client
//! handle (`Client::claim_as`, `complete_claim`, `release_claim`,
//! `extend_claim`) and writes the answers — 201 won, 200 a completed key's
//! recorded result replayed (`Idempotent-Replayed: true`), 409
//! `IN_PROGRESS` with `Retry-After`, 422 `KEY_CONFLICT`, 409 `FENCED`. It
//! decides nothing: who holds a key, and every refusal, is the registry's
//! (at apply), reached through the client library.
//!
//! A claim's request identity (`claim_id`, 16 bytes) comes from the body
//! (32 hex digits), or is derived from an `Idempotency-Key` header, or is
//! chosen at random for this request alone; the won answer and an unknown
//! outcome name it, so that the caller can send the same claim again and
//! get its own win back rather than "in progress" against itself.

use super::codec::{bytes_from_members, bytes_member, idempotency_key, parse, percent_decode};
use super::errors::{HttpError, client_error};
use super::{Answer, Call, Resource};
use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode};
use futures::future::BoxFuture;
use oncekv_client::{Client, Error as ClientError};
use oncekv_core::ClaimAnswer;
use serde::Deserialize;
use serde_json::{Map, Value as Json, json};
use std::time::Duration;

/// This resource in the API's table (`super::RESOURCES`).
pub(super) const RESOURCE: Resource = Resource {
    prefix: PREFIX,
    call,
};

const PREFIX: &str = "/v1/claims";

/// Which of the four calls a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// `POST /v1/claims/{key}`.
    Claim,
    /// `POST /v1/claims/{key}/complete`.
    Complete,
    /// `POST /v1/claims/{key}/release`.
    Release,
    /// `POST /v1/claims/{key}/extend`.
    Extend,
}

/// The operation and key of `method` on `path` (the raw, still
/// percent-encoded path of the URI, without its query).
pub fn route(method: &Method, path: &str) -> Result<(Operation, Vec<u8>), HttpError> {
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
    let operation = match operation {
        None => Operation::Claim,
        Some("complete") => Operation::Complete,
        Some("release") => Operation::Release,
        Some("extend") => Operation::Extend,
        Some(_) => return Err(not_found()),
    };
    let key = percent_decode(segment)?;
    if key.is_empty() {
        return Err(HttpError::invalid("empty key"));
    }
    if *method != Method::POST {
        return Err(HttpError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "INVALID_ARGUMENT",
            format!("{method} is not allowed on {path}; allowed: POST"),
        )
        .with("allow", Json::from("POST")));
    }
    Ok((operation, key))
}

// ---- request identity ------------------------------------------------------------

/// A claim id as the API writes it: 32 lower-case hex digits.
pub fn claim_id_hex(claim_id: u128) -> String {
    format!("{claim_id:032x}")
}

/// A claim id from 32 hex digits (either case).
pub fn parse_claim_id(text: &str) -> Result<u128, HttpError> {
    if text.len() != 32 || !text.bytes().all(|byte| byte.is_ascii_hexdigit()) {
        return Err(HttpError::invalid(
            "request body: `claim_id` must be 32 hex digits (16 bytes)",
        ));
    }
    u128::from_str_radix(text, 16)
        .map_err(|error| HttpError::invalid(format!("request body: `claim_id`: {error}")))
}

/// The claim id an `Idempotency-Key` names: the first 16 bytes of a BLAKE3
/// key derivation from the header's key, so the same header always names
/// the same claim id.
pub fn claim_id_of_idempotency_key(key: &[u8]) -> u128 {
    let derived = blake3::derive_key("oncekv HTTP claim_id from an Idempotency-Key, v1", key);
    let mut first = [0u8; 16];
    first.copy_from_slice(&derived[..16]);
    u128::from_be_bytes(first)
}

/// A claim id for a request that named none: random, for this request only.
fn random_claim_id() -> u128 {
    #[allow(clippy::disallowed_methods)] // a claim id is random by definition (rule 20)
    rand::random()
}

// ---- bodies ------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClaimBody {
    fingerprint: Option<String>,
    fingerprint_base64: Option<String>,
    lease_ms: u64,
    claim_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CompleteBody {
    fence: u64,
    result: Option<String>,
    result_base64: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseBody {
    fence: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExtendBody {
    fence: u64,
    lease_ms: u64,
}

/// What a request asks the client library for, from its body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Claim {
        fingerprint: Vec<u8>,
        lease_ms: u64,
        claim_id: u128,
    },
    Complete {
        fence: u64,
        result: Vec<u8>,
    },
    Release {
        fence: u64,
    },
    Extend {
        fence: u64,
        lease_ms: u64,
    },
}

/// The request `operation` asks for with `body`; a claim's id from the
/// body's `claim_id`, else `header_claim_id` (from `Idempotency-Key`),
/// else `random` (called only then). Both a `claim_id` and the header is
/// 400: they would be two names for one request.
pub fn request(
    operation: Operation,
    body: &[u8],
    header_claim_id: Option<u128>,
    random: impl FnOnce() -> u128,
) -> Result<Request, HttpError> {
    Ok(match operation {
        Operation::Claim => {
            let body = parse::<ClaimBody>(body)?;
            let fingerprint =
                bytes_from_members("fingerprint", body.fingerprint, body.fingerprint_base64)?;
            let claim_id = match (body.claim_id, header_claim_id) {
                (Some(_), Some(_)) => {
                    return Err(HttpError::invalid(
                        "a claim names its request by `claim_id` or by an Idempotency-Key \
                         header, not both",
                    ));
                }
                (Some(text), None) => parse_claim_id(&text)?,
                (None, Some(derived)) => derived,
                (None, None) => random(),
            };
            Request::Claim {
                fingerprint,
                lease_ms: body.lease_ms,
                claim_id,
            }
        }
        Operation::Complete => {
            let body = parse::<CompleteBody>(body)?;
            Request::Complete {
                fence: body.fence,
                result: bytes_from_members("result", body.result, body.result_base64)?,
            }
        }
        Operation::Release => Request::Release {
            fence: parse::<ReleaseBody>(body)?.fence,
        },
        Operation::Extend => {
            let body = parse::<ExtendBody>(body)?;
            Request::Extend {
                fence: body.fence,
                lease_ms: body.lease_ms,
            }
        }
    })
}

// ---- answers -----------------------------------------------------------------------

/// The answer to a claim: 201 won (`Idempotent-Replayed: false`: perform
/// the effect), 200 a completed key's recorded result
/// (`Idempotent-Replayed: true`: the effect is done, nothing ran), or the
/// 409 `IN_PROGRESS` refusal with when to claim again. A completed key's
/// body is a function of its record alone, so every replay is
/// byte-identical.
pub fn claim_answer(key: &[u8], answer: ClaimAnswer, claim_id: u128) -> Result<Answer, HttpError> {
    match answer {
        ClaimAnswer::Won {
            fence,
            attempt,
            lease_deadline_ms,
            cluster_time_ms,
            duplicate,
        } => Ok(Answer {
            status: StatusCode::CREATED,
            body: json!({
                "state": "won",
                "fence": fence,
                "attempt": attempt,
                "lease_ms_left": lease_deadline_ms.saturating_sub(cluster_time_ms),
                "lease_deadline_ms": lease_deadline_ms,
                "cluster_time_ms": cluster_time_ms,
                "duplicate": duplicate,
                "claim_id": claim_id_hex(claim_id),
            }),
            replayed: Some(false),
        }),
        ClaimAnswer::Completed {
            result,
            completed_ms,
            fence,
            attempt,
        } => {
            let mut body = Map::new();
            body.insert("state".into(), Json::from("completed"));
            let (name, value) = bytes_member("result", &result);
            body.insert(name, value);
            body.insert("fence".into(), Json::from(fence));
            body.insert("attempt".into(), Json::from(attempt));
            body.insert("completed_ms".into(), Json::from(completed_ms));
            Ok(Answer {
                status: StatusCode::OK,
                body: Json::Object(body),
                replayed: Some(true),
            })
        }
        ClaimAnswer::InProgress {
            retry_after_ms,
            attempt,
        } => Err(client_error(ClientError::ClaimInProgress { retry_after_ms })
            .with("attempt", Json::from(attempt))
            .with("key", key_text(key))
            .into_problem()),
    }
}

fn key_text(key: &[u8]) -> Json {
    Json::from(String::from_utf8_lossy(key).into_owned())
}

/// A claim call's failure: the client library's mapping (`FENCED` 409 with
/// `current_fence`, limits, authentication, ...), with the two keyed
/// answers told in a claim's words — another fingerprint is 422
/// `KEY_CONFLICT` as an RFC 9457 problem, and an unknown outcome is 503
/// with `outcome_unknown` and what to send again (`claim_id` for a claim).
pub fn claim_error(error: ClientError, key: &[u8], claim_id: Option<u128>) -> HttpError {
    match error {
        ClientError::KeyConflict { .. } => HttpError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "KEY_CONFLICT",
            format!(
                "the key {} is claimed for another effect (another fingerprint); nothing was \
                 claimed. A claim's key names one effect: use another key for another effect",
                key_text(key)
            ),
        )
        .with("key", key_text(key))
        .into_problem(),
        ClientError::KeyOutcomeUnknown { reason, .. } => {
            let again = match claim_id {
                Some(claim_id) => {
                    let hex = claim_id_hex(claim_id);
                    format!("the same body with \"claim_id\": \"{hex}\"")
                }
                None => "the same request".to_string(),
            };
            let error = HttpError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "UNAVAILABLE",
                format!(
                    "outcome unknown for the claim call on key {}: {reason}; send {again} to \
                     learn it (it is answered from the claim's record, never applied twice)",
                    key_text(key)
                ),
            )
            .with("outcome_unknown", Json::Bool(true))
            .with("retry_with_same_key", Json::Bool(true))
            .with("key", key_text(key));
            match claim_id {
                Some(claim_id) => error.with("claim_id", Json::from(claim_id_hex(claim_id))),
                None => error,
            }
        }
        other => client_error(other),
    }
}

/// [`claim_error`] for a holder's complete, release or extend under
/// `fence`: FENCED with the holder's own fence as the key's means its claim
/// is finished (released, or completed — by a complete with another result
/// too), not that another holder took over, and says so.
fn holder_error(error: ClientError, key: &[u8], fence: u64) -> HttpError {
    match error {
        ClientError::Fenced { current_fence } if current_fence == fence && fence != 0 => {
            HttpError::new(
                StatusCode::CONFLICT,
                "FENCED",
                oncekv_wire::status::finished_claim_message(fence),
            )
            .with("current_fence", Json::from(current_fence))
            .with("key", key_text(key))
        }
        ClientError::Fenced { current_fence } => HttpError::new(
            StatusCode::CONFLICT,
            "FENCED",
            oncekv_wire::status::taken_over_message(current_fence),
        )
        .with("current_fence", Json::from(current_fence))
        .with("key", key_text(key)),
        other => claim_error(other, key, None),
    }
}

// ---- the call ----------------------------------------------------------------------

/// The call `method` on `path` asks for.
fn call(method: &Method, path: &str) -> Result<Box<dyn Call>, HttpError> {
    let (operation, key) = route(method, path)?;
    Ok(Box::new(ClaimsCall {
        operation,
        key,
        header_claim_id: None,
    }))
}

/// One request to the resource.
struct ClaimsCall {
    operation: Operation,
    key: Vec<u8>,
    /// A claim's id from its `Idempotency-Key` header.
    header_claim_id: Option<u128>,
}

impl ClaimsCall {
    async fn answer(self, client: Client, body: Bytes) -> Result<Answer, HttpError> {
        let key = self.key;
        // The claim's key is scoped by the principal of the caller's token
        // on the client port (rule 19), not by anything done here.
        match request(self.operation, &body, self.header_claim_id, random_claim_id)? {
            Request::Claim {
                fingerprint,
                lease_ms,
                claim_id,
            } => {
                let answer = client
                    .claim_as(
                        &key,
                        &fingerprint,
                        Duration::from_millis(lease_ms),
                        claim_id,
                    )
                    .await
                    .map_err(|error| claim_error(error, &key, Some(claim_id)))?;
                claim_answer(&key, answer, claim_id)
            }
            Request::Complete { fence, result } => {
                let completed_ms = client
                    .complete_claim(&key, fence, &result)
                    .await
                    .map_err(|error| holder_error(error, &key, fence))?;
                Ok(Answer::new(
                    StatusCode::OK,
                    json!({"state": "completed", "fence": fence, "completed_ms": completed_ms}),
                ))
            }
            Request::Release { fence } => {
                client
                    .release_claim(&key, fence)
                    .await
                    .map_err(|error| holder_error(error, &key, fence))?;
                Ok(Answer::new(
                    StatusCode::OK,
                    json!({"state": "released", "fence": fence}),
                ))
            }
            Request::Extend { fence, lease_ms } => {
                let left = client
                    .extend_claim(&key, fence, Duration::from_millis(lease_ms))
                    .await
                    .map_err(|error| holder_error(error, &key, fence))?;
                Ok(Answer::new(
                    StatusCode::OK,
                    json!({
                        "state": "held",
                        "fence": fence,
                        "lease_ms_left": u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
                    }),
                ))
            }
        }
    }
}

impl Call for ClaimsCall {
    fn check_headers(&mut self, headers: &HeaderMap) -> Result<(), HttpError> {
        // Only a claim has a request identity to name; complete, release
        // and extend are named by their fence and ignore the header.
        if self.operation == Operation::Claim {
            self.header_claim_id = idempotency_key(headers)?
                .as_deref()
                .map(claim_id_of_idempotency_key);
        }
        Ok(())
    }

    fn reads_body(&self) -> bool {
        true
    }

    fn run(
        self: Box<Self>,
        client: Client,
        body: Bytes,
    ) -> BoxFuture<'static, Result<Answer, HttpError>> {
        Box::pin(self.answer(client, body))
    }
}

#[cfg(test)]
mod tests {
    use super::super::IDEMPOTENT_REPLAYED;
    use super::super::test_headers as headers;
    use super::*;
    use axum::http::header;
    use axum::response::IntoResponse;

    fn no_random() -> u128 {
        panic!("a claim that names its id must not draw a random one")
    }

    /// Paths route to their call with the key percent-decoded into raw
    /// bytes; only POST is allowed; empty keys, bad escapes and unknown
    /// operations are refused with the documented status.
    #[test]
    fn routes_and_keys() {
        for (path, operation, key) in [
            ("/v1/claims/order-1", Operation::Claim, &b"order-1"[..]),
            ("/v1/claims/a%2F%ff", Operation::Claim, b"a/\xff"),
            ("/v1/claims/j/complete", Operation::Complete, b"j"),
            ("/v1/claims/j/release", Operation::Release, b"j"),
            ("/v1/claims/j/extend", Operation::Extend, b"j"),
        ] {
            assert_eq!(
                route(&Method::POST, path),
                Ok((operation, key.to_vec())),
                "{path}"
            );
        }
        for (method, path, status) in [
            (Method::POST, "/v1/claims", StatusCode::BAD_REQUEST),
            (Method::POST, "/v1/claims/", StatusCode::BAD_REQUEST),
            (Method::POST, "/v1/claims//complete", StatusCode::BAD_REQUEST),
            (Method::POST, "/v1/claims/a%2", StatusCode::BAD_REQUEST),
            (Method::POST, "/v1/claims/a/finish", StatusCode::NOT_FOUND),
            (Method::POST, "/v1/claims/a/complete/x", StatusCode::NOT_FOUND),
            (Method::GET, "/v1/claims/a", StatusCode::METHOD_NOT_ALLOWED),
            (Method::PUT, "/v1/claims/a/complete", StatusCode::METHOD_NOT_ALLOWED),
            (Method::DELETE, "/v1/claims/a", StatusCode::METHOD_NOT_ALLOWED),
        ] {
            let error = route(&method, path).expect_err(path);
            assert_eq!(error.status, status, "{method} {path}");
            assert_eq!(error.reason, "INVALID_ARGUMENT");
        }
        assert!(super::super::resource("/v1/claims/a/extend").is_some());
    }

    /// A claim's id comes from the body (32 hex digits), else from the
    /// Idempotency-Key header (the same header always the same id,
    /// another header another id), else at random; both at once, or a
    /// malformed id, is 400.
    #[test]
    fn claim_ids() {
        let body = br#"{"fingerprint":"charge 10","lease_ms":500,
                        "claim_id":"000102030405060708090A0B0C0D0E0F"}"#;
        assert_eq!(
            request(Operation::Claim, body, None, no_random),
            Ok(Request::Claim {
                fingerprint: b"charge 10".to_vec(),
                lease_ms: 500,
                claim_id: 0x000102030405060708090a0b0c0d0e0f,
            })
        );
        assert_eq!(claim_id_hex(0x0102), "00000000000000000000000000000102");
        assert_eq!(
            parse_claim_id(&claim_id_hex(u128::MAX - 7)),
            Ok(u128::MAX - 7)
        );

        let key_of = |value: &[u8]| {
            idempotency_key(&headers(&[("idempotency-key", value)]))
                .unwrap()
                .map(|key| claim_id_of_idempotency_key(&key))
        };
        let derived = key_of(b"\"req-1\"").unwrap();
        assert_eq!(key_of(b"req-1"), Some(derived), "the same key, spelled bare");
        assert_ne!(key_of(b"req-2"), Some(derived));
        let unnamed = br#"{"fingerprint_base64":"/w==","lease_ms":500}"#;
        assert_eq!(
            request(Operation::Claim, unnamed, Some(derived), no_random),
            Ok(Request::Claim {
                fingerprint: vec![0xff],
                lease_ms: 500,
                claim_id: derived,
            })
        );
        assert_eq!(
            request(Operation::Claim, unnamed, None, || 42),
            Ok(Request::Claim {
                fingerprint: vec![0xff],
                lease_ms: 500,
                claim_id: 42,
            })
        );

        for (body, header) in [
            (&body[..], Some(derived)),
            (br#"{"fingerprint":"f","lease_ms":5,"claim_id":"0102"}"#, None),
            (
                br#"{"fingerprint":"f","lease_ms":5,"claim_id":"+0000000000000000000000000000001"}"#,
                None,
            ),
            (
                br#"{"fingerprint":"f","lease_ms":5,"claim_id":"zz000000000000000000000000000000"}"#,
                None,
            ),
        ] {
            let error = request(Operation::Claim, body, header, || 1)
                .expect_err(&String::from_utf8_lossy(body));
            assert_eq!(error.status, StatusCode::BAD_REQUEST);
        }
    }

    /// Bodies become the requests the docs describe (results in text or
    /// base64); missing, ambiguous, mistyped or unknown members are 400.
    #[test]
    fn bodies_become_requests() {
        assert_eq!(
            request(Operation::Complete, br#"{"fence":7,"result":"ok"}"#, None, no_random),
            Ok(Request::Complete {
                fence: 7,
                result: b"ok".to_vec()
            })
        );
        assert_eq!(
            request(
                Operation::Complete,
                br#"{"fence":7,"result_base64":"AP8="}"#,
                None,
                no_random
            ),
            Ok(Request::Complete {
                fence: 7,
                result: vec![0, 0xff]
            })
        );
        assert_eq!(
            request(Operation::Release, br#"{"fence":3}"#, None, no_random),
            Ok(Request::Release { fence: 3 })
        );
        assert_eq!(
            request(
                Operation::Extend,
                br#"{"fence":3,"lease_ms":900}"#,
                None,
                no_random
            ),
            Ok(Request::Extend {
                fence: 3,
                lease_ms: 900
            })
        );
        for (operation, body) in [
            (Operation::Claim, &br#"{"lease_ms":5}"#[..]),
            (Operation::Claim, br#"{"fingerprint":"f"}"#),
            (
                Operation::Claim,
                br#"{"fingerprint":"f","fingerprint_base64":"Zg==","lease_ms":5}"#,
            ),
            (Operation::Claim, br#"{"fingerprint":"f","lease_ms":-1}"#),
            (Operation::Claim, br#"{"fingerprint":"f","lease_ms":5,"x":1}"#),
            (Operation::Complete, br#"{"fence":1}"#),
            (Operation::Complete, br#"{"result":"r"}"#),
            (Operation::Complete, br#"{"fence":1,"result_base64":"!"}"#),
            (Operation::Release, b""),
            (Operation::Release, br#"{"fence":"1"}"#),
            (Operation::Extend, br#"{"fence":1}"#),
        ] {
            let error = request(operation, body, None, || 1)
                .expect_err(&String::from_utf8_lossy(body));
            assert_eq!(error.status, StatusCode::BAD_REQUEST, "{operation:?}");
            assert_eq!(error.reason, "INVALID_ARGUMENT");
        }
    }

    async fn body_of(response: axum::response::Response) -> Json {
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    /// A win is 201 naming its fence, attempt, lease and claim id with
    /// `Idempotent-Replayed: false`; a completed key is 200 with the
    /// recorded result (text, or base64 when not UTF-8) and
    /// `Idempotent-Replayed: true`, byte-identical for every replay.
    #[tokio::test]
    async fn won_and_completed_answers() {
        let won = claim_answer(
            b"k",
            ClaimAnswer::Won {
                fence: 9,
                attempt: 2,
                lease_deadline_ms: 1_500,
                cluster_time_ms: 1_000,
                duplicate: true,
            },
            0xab,
        )
        .unwrap()
        .into_response();
        assert_eq!(won.status(), StatusCode::CREATED);
        assert_eq!(won.headers().get(IDEMPOTENT_REPLAYED).unwrap(), "false");
        assert_eq!(
            body_of(won).await,
            json!({"state": "won", "fence": 9, "attempt": 2, "lease_ms_left": 500,
                   "lease_deadline_ms": 1_500, "cluster_time_ms": 1_000, "duplicate": true,
                   "claim_id": "000000000000000000000000000000ab"})
        );

        let completed = |result: &[u8]| {
            claim_answer(
                b"k",
                ClaimAnswer::Completed {
                    result: result.to_vec(),
                    completed_ms: 77,
                    fence: 9,
                    attempt: 2,
                },
                // Another request's id: not in the answer.
                random_claim_id(),
            )
            .unwrap()
        };
        assert_eq!(completed(b"done"), completed(b"done"));
        let replay = completed(b"done").into_response();
        assert_eq!(replay.status(), StatusCode::OK);
        assert_eq!(replay.headers().get(IDEMPOTENT_REPLAYED).unwrap(), "true");
        assert_eq!(
            body_of(replay).await,
            json!({"state": "completed", "result": "done", "fence": 9, "attempt": 2,
                   "completed_ms": 77})
        );
        assert_eq!(
            completed(&[0, 0xff]).body["result_base64"],
            json!("AP8="),
            "binary results in base64"
        );
    }

    /// "In progress" is 409 `IN_PROGRESS` as an RFC 9457 problem with
    /// `retry_after_ms` and `Retry-After` in whole seconds rounded up.
    #[tokio::test]
    async fn in_progress_says_when_to_come_back() {
        for (retry_after_ms, seconds) in [(1_001, "2"), (2_000, "2"), (1, "1"), (0, "0")] {
            let error = claim_answer(
                b"k",
                ClaimAnswer::InProgress {
                    retry_after_ms,
                    attempt: 1,
                },
                1,
            )
            .unwrap_err();
            assert_eq!((error.status, error.reason), (StatusCode::CONFLICT, "IN_PROGRESS"));
            let response = error.clone().into_response();
            assert_eq!(response.headers().get(header::RETRY_AFTER).unwrap(), seconds);
            assert_eq!(
                response.headers().get(header::CONTENT_TYPE).unwrap(),
                "application/problem+json"
            );
            let body = body_of(response).await;
            assert_eq!(body["retry_after_ms"], retry_after_ms);
            assert_eq!(body["attempt"], 1);
            assert_eq!(body["status"], 409);
            assert_eq!(body["type"], "about:blank");
            assert_eq!(body["detail"], body["message"]);
        }
    }

    /// Another fingerprint is 422 `KEY_CONFLICT` as a problem naming the
    /// key; an unknown outcome is 503 with `outcome_unknown` and the claim
    /// id to send again; FENCED keeps the library's mapping (409,
    /// `current_fence`, plain JSON).
    #[tokio::test]
    async fn claim_errors() {
        let conflict = claim_error(
            ClientError::KeyConflict { key: "k".into() },
            b"order-1",
            Some(5),
        );
        assert_eq!(
            (conflict.status, conflict.reason),
            (StatusCode::UNPROCESSABLE_ENTITY, "KEY_CONFLICT")
        );
        let response = conflict.into_response();
        assert_eq!(
            response.headers().get(header::CONTENT_TYPE).unwrap(),
            "application/problem+json"
        );
        let body = body_of(response).await;
        assert_eq!(body["key"], "order-1");
        assert_eq!(body["title"], "Unprocessable Entity");
        assert!(body.get("idempotency_key").is_none(), "{body}");

        let unknown = claim_error(
            ClientError::KeyOutcomeUnknown {
                key: "order-1".into(),
                reason: "deadline".into(),
            },
            b"order-1",
            Some(0xab),
        );
        assert_eq!(unknown.status, StatusCode::SERVICE_UNAVAILABLE);
        let body = unknown.body();
        assert_eq!(body["outcome_unknown"], true);
        assert_eq!(body["claim_id"], "000000000000000000000000000000ab");
        assert!(
            body["message"].as_str().unwrap().contains("000000000000000000000000000000ab"),
            "{body}"
        );

        let fenced = claim_error(ClientError::Fenced { current_fence: 12 }, b"k", None);
        assert_eq!((fenced.status, fenced.reason), (StatusCode::CONFLICT, "FENCED"));
        assert_eq!(fenced.body()["current_fence"], 12);
        let response = fenced.into_response();
        assert_eq!(
            response.headers().get(header::CONTENT_TYPE).unwrap(),
            "application/json"
        );
        assert!(response.headers().get(header::RETRY_AFTER).is_none());
        // A holder's own fence as the key's: its claim is finished, and
        // the message says so instead of naming a new holder.
        let finished = holder_error(ClientError::Fenced { current_fence: 12 }, b"k", 12);
        assert_eq!((finished.status, finished.reason), (StatusCode::CONFLICT, "FENCED"));
        assert_eq!(finished.body()["current_fence"], 12);
        let message = finished.body()["message"].as_str().unwrap().to_owned();
        assert!(message.contains("finished already"), "{message}");
        let taken = holder_error(ClientError::Fenced { current_fence: 13 }, b"k", 12);
        let message = taken.body()["message"].as_str().unwrap().to_owned();
        assert!(message.contains("no longer holds"), "{message}");
        assert!(!message.contains("finished"), "{message}");
        assert_eq!(taken.body()["current_fence"], 13);
    }
}
