//! The HTTP API's failures: [`HttpError`] (an HTTP status and the JSON
//! body `{"reason", "message", ...detail}` with the reason names of the
//! gRPC error table) and the one mapping of the client library's errors to
//! them ([`client_error`], docs/http.md "Errors"). Shared by every
//! resource; it decides no status of its own beyond that mapping and the
//! headers a status implies (`WWW-Authenticate`, `Retry-After`, `Allow`).
//! A resource may ask for an error as an RFC 9457 problem
//! ([`HttpError::into_problem`]): the same body with the problem members
//! added, as `application/problem+json`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use oncekv_client::Error as ClientError;
use serde_json::{Map, Value as Json};

/// A failed request: an HTTP status and the JSON body
/// `{"reason": ..., "message": ..., ...detail}`.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpError {
    pub status: StatusCode,
    /// A reason name of the gRPC error table (`ErrorDetail.reason`).
    pub reason: &'static str,
    pub message: String,
    pub detail: Map<String, Json>,
    /// Answered as an RFC 9457 problem (`application/problem+json`, the
    /// members `type`, `title`, `status` and `detail` added to the body),
    /// as the IETF idempotency draft asks for its 409 and 422.
    pub problem: bool,
}

impl HttpError {
    pub(super) fn new(
        status: StatusCode,
        reason: &'static str,
        message: impl Into<String>,
    ) -> HttpError {
        HttpError {
            status,
            reason,
            message: message.into(),
            detail: Map::new(),
            problem: false,
        }
    }

    /// The same error as an RFC 9457 problem: `type` `about:blank` (the
    /// `reason` member names the problem), `title` the status's phrase,
    /// `status`, and `detail` the message, besides the usual members.
    pub(super) fn into_problem(mut self) -> HttpError {
        self.problem = true;
        self
    }

    pub(super) fn invalid(message: impl Into<String>) -> HttpError {
        HttpError::new(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", message)
    }

    /// 404 for a path no resource answers.
    pub(super) fn no_such_endpoint(path: &str) -> HttpError {
        HttpError::new(
            StatusCode::NOT_FOUND,
            "INVALID_ARGUMENT",
            format!("no such endpoint: {path} (see docs/http.md)"),
        )
    }

    pub(super) fn with(mut self, field: &str, value: Json) -> HttpError {
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
        if self.problem {
            body.insert("type".into(), Json::from("about:blank"));
            body.insert(
                "title".into(),
                Json::from(self.status.canonical_reason().unwrap_or("")),
            );
            body.insert("status".into(), Json::from(self.status.as_u16()));
            body.insert("detail".into(), Json::from(self.message.clone()));
        }
        Json::Object(body)
    }

    /// The body's content type.
    fn content_type(&self) -> &'static str {
        if self.problem {
            "application/problem+json"
        } else {
            "application/json"
        }
    }
}

impl HttpError {
    /// The headers the status implies besides the content type.
    fn status_headers(&self) -> Vec<(header::HeaderName, HeaderValue)> {
        // An answer that says when to come back (a claim in progress) says
        // it in whole seconds too, rounded up.
        if let Some(retry_after_ms) = self.detail.get("retry_after_ms").and_then(Json::as_u64) {
            let seconds = retry_after_ms.div_ceil(1000);
            return vec![(header::RETRY_AFTER, HeaderValue::from(seconds))];
        }
        match self.status {
            StatusCode::UNAUTHORIZED => {
                vec![(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"))]
            }
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => {
                vec![(header::RETRY_AFTER, HeaderValue::from_static("1"))]
            }
            StatusCode::METHOD_NOT_ALLOWED => match self.detail.get("allow") {
                Some(Json::String(allow)) => HeaderValue::from_str(allow)
                    .map(|allow| vec![(header::ALLOW, allow)])
                    .unwrap_or_default(),
                _ => Vec::new(),
            },
            _ => Vec::new(),
        }
    }

    /// The whole HTTP/1.1 response, closing the connection: for a
    /// connection refused before any request of it is read.
    pub(super) fn http1_response(&self) -> Vec<u8> {
        let body = self.body().to_string();
        let mut head = format!(
            "HTTP/1.1 {} {}\r\ncontent-type: {}\r\ncontent-length: {}\r\n\
             connection: close\r\n",
            self.status.as_u16(),
            self.status.canonical_reason().unwrap_or(""),
            self.content_type(),
            body.len()
        );
        for (name, value) in self.status_headers() {
            head.push_str(&format!(
                "{name}: {}\r\n",
                value.to_str().unwrap_or_default()
            ));
        }
        head.push_str("\r\n");
        let mut response = head.into_bytes();
        response.extend_from_slice(body.as_bytes());
        response
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let mut response = (self.status, json_body(&self.body())).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(self.content_type()),
        );
        for (name, value) in self.status_headers() {
            headers.insert(name, value);
        }
        response
    }
}

/// A JSON body with its content type.
pub(super) fn json_body(value: &Json) -> ([(header::HeaderName, HeaderValue); 1], String) {
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
        // Definite: the library refused it before sending (a command
        // beyond the client port's message bound, say), or the cluster did
        // for good; an attempt that may have applied is an unknown outcome.
        ClientError::InvalidArgument(_) if message.contains("nothing was") => {
            HttpError::invalid(message)
        }
        ClientError::InvalidArgument(_) => {
            HttpError::invalid(format!("{message}; nothing was executed"))
        }
        ClientError::Unauthenticated(_) => {
            HttpError::new(StatusCode::UNAUTHORIZED, "UNAUTHENTICATED", message)
        }
        ClientError::PermissionDenied(_) => {
            HttpError::new(StatusCode::FORBIDDEN, "PERMISSION_DENIED", message)
        }
        ClientError::Fenced { current_fence } => {
            HttpError::new(StatusCode::CONFLICT, "FENCED", message)
                .with("current_fence", Json::from(current_fence))
        }
        ClientError::ClaimInProgress { retry_after_ms } => {
            HttpError::new(StatusCode::CONFLICT, "IN_PROGRESS", message)
                .with("retry_after_ms", Json::from(retry_after_ms))
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
        // A definite refusal says nothing was executed (once).
        for (error, message) in [
            (
                ClientError::InvalidArgument("bad lease".into()),
                "invalid argument: bad lease; nothing was executed",
            ),
            (
                ClientError::InvalidArgument("too large: nothing was sent".into()),
                "invalid argument: too large: nothing was sent",
            ),
        ] {
            let mapped = client_error(error);
            assert_eq!(mapped.status, StatusCode::BAD_REQUEST);
            assert_eq!(mapped.message, message);
            assert_eq!(mapped.body().get("outcome_unknown"), None);
        }
        assert!(
            limit.message.contains("nothing was executed"),
            "{}",
            limit.message
        );
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

    /// A refusal written before hyper sees the connection is a complete
    /// HTTP/1.1 response: status line, JSON content type and length, the
    /// status's own headers, `Connection: close`, the body.
    #[test]
    fn a_raw_refusal_is_a_whole_response() {
        let refusal = HttpError::new(StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE", "full")
            .with("http_connections_max", Json::from(3));
        let raw = String::from_utf8(refusal.http1_response()).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        let mut lines = head.split("\r\n");
        assert_eq!(lines.next(), Some("HTTP/1.1 503 Service Unavailable"));
        let headers: Vec<&str> = lines.collect();
        for expected in [
            "content-type: application/json",
            "connection: close",
            "retry-after: 1",
        ] {
            assert!(headers.contains(&expected), "{headers:?}");
        }
        assert!(headers.contains(&format!("content-length: {}", body.len()).as_str()));
        assert_eq!(serde_json::from_str::<Json>(body).unwrap(), refusal.body());
    }
}
