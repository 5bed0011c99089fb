//! The HTTP-level layer around the client gRPC server: it counts every reply
//! of an `oncekv.v1` method by result (the wire-level view: refusals such as
//! `NOT_LEADER` or overload included), and it turns tonic's own refusal of an
//! oversized request — `OUT_OF_RANGE` without our reason, which a client
//! could mistake for `RESPONSE_DISCARDED`'s code — into `INVALID_ARGUMENT`
//! with the `INVALID_ARGUMENT` reason (final: nothing was executed). So it
//! does with tonic's refusals of malformed gRPC framing on our methods (a
//! truncated frame, a compressed flag without `grpc-encoding`, an encoding
//! it does not support, no message at all: bare `INTERNAL` or
//! `UNIMPLEMENTED` without our detail), which come before any handler ran.
//! It decides nothing else and never looks into message bodies.

use crate::metrics::{NodeMetrics, ReplyLabels};
use futures::future::BoxFuture;
use oncekv_wire::CLIENT_MESSAGE_BYTES_MAX;
use oncekv_wire::proto::Reason;
use oncekv_wire::status::{ErrorReason, REASON_METADATA_KEY, reason_status};
use std::sync::Arc;
use std::task::{Context, Poll};

/// Path prefix of the methods counted.
const COUNTED_PREFIX: &str = "/oncekv.v1.";

/// Wraps the client server's routes; see the module docs.
#[derive(Clone)]
pub struct ClientWireLayer {
    metrics: Arc<NodeMetrics>,
}

impl ClientWireLayer {
    pub fn new(metrics: Arc<NodeMetrics>) -> ClientWireLayer {
        ClientWireLayer { metrics }
    }
}

impl<S> tower::Layer<S> for ClientWireLayer {
    type Service = ClientWire<S>;

    fn layer(&self, inner: S) -> ClientWire<S> {
        ClientWire {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

#[derive(Clone)]
pub struct ClientWire<S> {
    inner: S,
    metrics: Arc<NodeMetrics>,
}

impl<S, B> tower::Service<http::Request<B>> for ClientWire<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = method_label(request.uri().path());
        let response = self.inner.call(request);
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let response = response.await?;
            Ok(observe(&metrics, method, response))
        })
    }
}

/// The method's label: a fixed string for every method of ours, so a client
/// cannot make up label values; `None` for anything else.
fn method_label(path: &str) -> Option<&'static str> {
    let name = path.strip_prefix(COUNTED_PREFIX)?;
    Some(match name {
        "Client/Register" => "Register",
        "Client/Execute" => "Execute",
        "Client/ExecutePlain" => "ExecutePlain",
        "Client/ExecuteKeyed" => "ExecuteKeyed",
        "Client/KeepAlive" => "KeepAlive",
        "Client/Unregister" => "Unregister",
        "Client/Read" => "Read",
        "Client/Status" => "Status",
        "Client/Claim" => "Claim",
        "Client/CompleteClaim" => "CompleteClaim",
        "Client/ReleaseClaim" => "ReleaseClaim",
        "Client/ExtendClaim" => "ExtendClaim",
        _ => "other",
    })
}

/// tonic's message when it refused a request's gRPC framing (before any
/// handler ran), percent-decoded; `None` for any other message.
fn framing_refusal(grpc_message: &str) -> Option<String> {
    const TONIC_FRAMING_REFUSALS: [&str; 5] = [
        "protocol error:",
        "Unexpected EOF decoding stream",
        "Content is compressed with",
        "Error decompressing",
        "Missing request message",
    ];
    let message = percent_decode(grpc_message);
    TONIC_FRAMING_REFUSALS
        .iter()
        .any(|prefix| message.starts_with(prefix))
        .then_some(message)
}

/// The `grpc-message` header's percent-encoding undone (invalid escapes
/// kept as they are).
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let escaped = (bytes[at] == b'%')
            .then(|| text.get(at + 1..at + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                out.push(byte);
                at += 3;
            }
            None => {
                out.push(bytes[at]);
                at += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn header<'a>(response: &'a http::Response<tonic::body::Body>, name: &str) -> Option<&'a str> {
    response
        .headers()
        .get(name)
        .and_then(|value| value.to_str().ok())
}

/// Counts `response` and rewrites tonic's oversized-request refusal.
fn observe(
    metrics: &NodeMetrics,
    method: Option<&'static str>,
    response: http::Response<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    // An error of a unary call comes back "trailers-only": its status is in
    // the headers. A success carries its status in the trailers.
    let code = header(&response, "grpc-status")
        .and_then(|code| code.parse::<i32>().ok())
        .map(tonic::Code::from);
    let reason = header(&response, REASON_METADATA_KEY).and_then(Reason::from_str_name);
    let oversized = code == Some(tonic::Code::OutOfRange) && reason.is_none();
    let framing = match (code, reason, method) {
        (Some(tonic::Code::Internal | tonic::Code::Unimplemented), None, Some(_)) => {
            framing_refusal(header(&response, "grpc-message").unwrap_or_default())
        }
        _ => None,
    };
    let rewritten = oversized || framing.is_some();
    let response = if oversized {
        reason_status(ErrorReason::InvalidArgument(format!(
            "request message too large: the limit is {CLIENT_MESSAGE_BYTES_MAX} bytes"
        )))
        .into_http()
    } else if let Some(why) = framing {
        reason_status(ErrorReason::InvalidArgument(format!(
            "malformed gRPC framing: {why}"
        )))
        .into_http()
    } else {
        response
    };
    let result = match (code, reason) {
        _ if rewritten => "invalid_argument",
        (None | Some(tonic::Code::Ok), _) => "ok",
        // An unknown method: not ours to count (and not a label to invent).
        (Some(tonic::Code::Unimplemented), None) => return response,
        (Some(tonic::Code::DeadlineExceeded), _) => "deadline",
        (Some(_), Some(reason)) => reason_label(reason),
        (Some(_), None) => "other",
    };
    if let Some(method) = method {
        metrics
            .client_replies
            .get_or_create(&ReplyLabels { method, result })
            .inc();
    }
    response
}

fn reason_label(reason: Reason) -> &'static str {
    match reason {
        Reason::Unspecified => "other",
        Reason::NotLeader => "not_leader",
        Reason::Unavailable => "unavailable",
        Reason::TooManyOutstanding => "too_many_outstanding",
        Reason::ResourceExhausted => "resource_exhausted",
        Reason::SessionExpired => "session_expired",
        Reason::WrongCluster => "wrong_cluster",
        Reason::SeqConflict => "seq_conflict",
        Reason::ResponseDiscarded => "response_discarded",
        Reason::InvalidArgument => "invalid_argument",
        Reason::LimitExceeded => "limit_exceeded",
        Reason::PermissionDenied => "permission_denied",
        Reason::Unauthenticated => "unauthenticated",
        Reason::KeyConflict => "key_conflict",
        Reason::Fenced => "fenced",
        Reason::NotCaughtUp => "not_caught_up",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(metrics: &NodeMetrics, method: &'static str, result: &'static str) -> u64 {
        metrics
            .client_replies
            .get_or_create(&ReplyLabels { method, result })
            .get()
    }

    /// tonic's "message too large" becomes INVALID_ARGUMENT with our reason;
    /// our own OUT_OF_RANGE (RESPONSE_DISCARDED) passes unchanged.
    #[test]
    fn oversized_request_becomes_invalid_argument() {
        let metrics = NodeMetrics::default();
        let tonic_refusal = tonic::Status::out_of_range("Error, decoded message length too large")
            .into_http::<tonic::body::Body>();
        let rewritten = observe(&metrics, Some("Execute"), tonic_refusal);
        let status = tonic::Status::from_header_map(rewritten.headers()).unwrap();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            header(&rewritten, REASON_METADATA_KEY),
            Some("INVALID_ARGUMENT")
        );
        assert_eq!(count(&metrics, "Execute", "invalid_argument"), 1);

        let discarded = reason_status(ErrorReason::ResponseDiscarded { floor: 3 })
            .into_http::<tonic::body::Body>();
        let kept = observe(&metrics, Some("Execute"), discarded);
        let status = tonic::Status::from_header_map(kept.headers()).unwrap();
        assert_eq!(status.code(), tonic::Code::OutOfRange);
        assert_eq!(count(&metrics, "Execute", "response_discarded"), 1);
    }

    /// tonic's refusals of malformed framing on our methods become
    /// INVALID_ARGUMENT with our reason; any other bare INTERNAL stays.
    #[test]
    fn framing_refusals_become_invalid_arguments() {
        let metrics = NodeMetrics::default();
        for refusal in [
            tonic::Status::internal(
                "protocol error: received message with compressed-flag but no grpc-encoding was specified",
            ),
            tonic::Status::internal("Unexpected EOF decoding stream."),
            tonic::Status::unimplemented("Content is compressed with `br` which isn't supported"),
        ] {
            let rewritten = observe(&metrics, Some("Execute"), refusal.into_http());
            let status = tonic::Status::from_header_map(rewritten.headers()).unwrap();
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
            assert!(status.message().starts_with("malformed gRPC framing"));
            assert_eq!(
                header(&rewritten, REASON_METADATA_KEY),
                Some("INVALID_ARGUMENT")
            );
        }
        let bug = tonic::Status::internal("unexpected outcome").into_http();
        let kept = observe(&metrics, Some("Execute"), bug);
        let status = tonic::Status::from_header_map(kept.headers()).unwrap();
        assert_eq!(status.code(), tonic::Code::Internal);
        assert_eq!(percent_decode("a%20b%zz%2"), "a b%zz%2");
    }

    /// Only our methods are counted, under fixed labels.
    #[test]
    fn labels_are_fixed() {
        assert_eq!(method_label("/oncekv.v1.Client/Execute"), Some("Execute"));
        assert_eq!(method_label("/oncekv.v1.Client/Nonsense"), Some("other"));
        assert_eq!(method_label("/grpc.health.v1.Health/Check"), None);
    }
}
