//! The proxy's own answers: RFC 9457 problem details
//! (`application/problem+json`) with the `reason` names of docs/proxy.md
//! — `KEY_CONFLICT`, `IN_PROGRESS`, `FENCED`, `MISSING_IDEMPOTENCY_KEY`,
//! `CLAIM_UNAVAILABLE`, ... It only shapes answers; which one a request
//! gets is the request flow's.

use crate::body::{ProxyBody, full};
use http::{HeaderValue, Response, StatusCode, header};
use serde_json::{Map, Value as Json};

/// One problem answer, built up before it is written.
#[derive(Debug)]
pub struct Problem {
    status: StatusCode,
    members: Map<String, Json>,
    retry_after_seconds: Option<u64>,
}

impl Problem {
    /// A problem with `status`, the stable `reason` name, and `detail`:
    /// what happened and what to do, in words.
    pub fn new(status: StatusCode, reason: &str, detail: impl Into<String>) -> Problem {
        let mut members = Map::new();
        members.insert("type".into(), Json::from("about:blank"));
        members.insert(
            "title".into(),
            Json::from(status.canonical_reason().unwrap_or("Error")),
        );
        members.insert("status".into(), Json::from(status.as_u16()));
        members.insert("reason".into(), Json::from(reason));
        members.insert("detail".into(), Json::from(detail.into()));
        Problem {
            status,
            members,
            retry_after_seconds: None,
        }
    }

    /// Adds a member.
    pub fn with(mut self, name: &str, value: impl Into<Json>) -> Problem {
        self.members.insert(name.into(), value.into());
        self
    }

    /// Adds `Retry-After: seconds`.
    pub fn retry_after(mut self, seconds: u64) -> Problem {
        self.retry_after_seconds = Some(seconds);
        self
    }

    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The answer with one more header (`Proxy-Authenticate` on a 407).
    pub fn response_with_header(
        self,
        name: header::HeaderName,
        value: HeaderValue,
    ) -> Response<ProxyBody> {
        let mut response = self.response();
        response.headers_mut().insert(name, value);
        response
    }

    /// The answer.
    pub fn response(self) -> Response<ProxyBody> {
        let body = Json::Object(self.members).to_string();
        let mut response = Response::new(full(body));
        *response.status_mut() = self.status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(seconds) = self.retry_after_seconds {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
