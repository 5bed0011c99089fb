//! `oncekv proxy`: the IETF `Idempotency-Key` header for any upstream HTTP
//! service, as a sidecar (docs/proxy.md). Every request is forwarded to the
//! upstream; a request with an `Idempotency-Key` on a guarded method
//! (`POST` and `PATCH` by default) is first *claimed* in an oncekv cluster
//! (rule 20, through the client library's [`oncekv_client::Client::once`]
//! cycle): the first claim wins and is forwarded once, with its fencing
//! token and attempt in `Idempotency-Fence` and `Idempotency-Attempt`,
//! while a heartbeat extends its lease; a final answer (2xx, 3xx, 4xx but
//! 408/409/425/429) is recorded and replayed byte for byte to every retry
//! with `Idempotent-Replayed: true`; any other outcome (5xx, those four
//! 4xx, an unreachable or silent upstream) releases the key, so a retry
//! forwards again. The same key with another request is 422
//! `KEY_CONFLICT`; a retry while the first is at work waits for it (up to
//! `--wait-ms`), then 409 with `Retry-After`. When the cluster cannot be
//! asked, a keyed request is refused with 503 and never forwarded: the
//! proxy fails closed.
//!
//! The crate is a client of the cluster: it depends on the client library
//! and the wire only, never on the server. Its parts:
//!
//! - [`flow`]: the request flow — pass-through or keyed, the claim, the
//!   forward, the record or release, and every answer;
//! - [`key`]: the header's key, the tenant, the claim key layout;
//! - [`fingerprint`]: what "the same request" means;
//! - [`record`]: the recorded answer's encoding;
//! - [`upstream`]: the upstream's client and hop-by-hop headers;
//! - [`body`]: bounded body reads and the body type;
//! - [`problem`]: the proxy's own `application/problem+json` answers;
//! - [`metrics`]: the `oncekv_proxy_*` metrics;
//! - [`listener_tls`]: HTTPS on the proxy's own listener, and the caller
//!   a client certificate names (`--callers-ca`);
//! - [`server`]: the listeners, connections and shutdown.
//!
//! `oncekv proxy` (`src/cli/proxy.rs` in the root package) only parses
//! flags into a [`Config`] and runs [`server::serve`].

pub mod body;
pub mod callers;
pub mod fingerprint;
pub mod flow;
pub mod key;
pub mod listener_tls;
pub mod metrics;
pub mod problem;
pub mod record;
pub mod server;
pub mod upstream;

pub use flow::Proxy;
pub use metrics::Metrics;

use http::{HeaderName, Method};
use std::time::Duration;

/// The response headers recorded and replayed by default (beside the
/// status and body): what describes the body and where it lives.
pub const DEFAULT_RECORD_HEADERS: &[&str] = &[
    "content-type",
    "content-encoding",
    "content-language",
    "content-location",
    "location",
    "etag",
    "last-modified",
    "cache-control",
];

/// Headers that can never be recorded: the body's framing is the
/// replay's own, and hop-by-hop headers belong to one connection.
const UNRECORDABLE_HEADERS: &[&str] = &[
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "idempotent-replayed",
];

/// How a proxy behaves (the flags of `oncekv proxy`).
#[derive(Clone, Debug)]
pub struct Config {
    /// `http[s]://HOST:PORT[/PREFIX]` of the service behind the proxy.
    pub upstream: String,
    /// For an `https` upstream: what to trust, what to present.
    pub upstream_tls: upstream::UpstreamTls,
    /// The methods whose keyed requests are claimed; others pass through.
    pub methods: Vec<Method>,
    /// Answer 400 to a guarded method without an `Idempotency-Key`.
    pub require_key: bool,
    /// The claim's lease, renewed every third of it while the upstream
    /// works: how long a proxy that dies mid-request blocks its key.
    pub lease: Duration,
    /// How long a retry waits for the same key's request in progress
    /// before 409.
    pub wait: Duration,
    /// How long the upstream has for an answer (headers and the recorded
    /// body); then 504 and the key is released.
    pub upstream_timeout: Duration,
    /// How long a keyed request's body may take to arrive (then 408).
    pub body_timeout: Duration,
    /// Request headers that are part of the fingerprint.
    pub fingerprint_headers: Vec<HeaderName>,
    /// Response headers recorded beside [`DEFAULT_RECORD_HEADERS`].
    pub record_headers: Vec<HeaderName>,
    /// `--key-scope header:NAME`: keys are scoped by this header's value.
    pub key_scope: Option<HeaderName>,
    /// `--callers-file`: only these callers may use the proxy (407
    /// otherwise), and each one's keys are its own; reloadable.
    pub callers: Option<std::sync::Arc<callers::SharedCallers>>,
    /// `--callers-ca`: callers are known by the certificates the listener
    /// asks for ([`listener_tls::CallersCa`] makes it ask): one it verified
    /// names its caller (when no `--callers-file` token does), whose keys
    /// are its own as a token's caller's are, and a request with neither
    /// is 407.
    pub callers_certificates: bool,
    /// Largest keyed request body (read whole, to be fingerprinted): 413.
    pub body_bytes_max: usize,
    /// Largest keyed request's headers, names and values: 431.
    pub header_bytes_max: usize,
    /// Largest recorded answer (status, recorded headers and body, as
    /// encoded); a larger body is passed on but recorded without it. At
    /// most the cluster's `claim_result_bytes_max` (64 KiB by default).
    pub response_bytes_max: usize,
    /// `--reply-before-record`: give a keyed request's final answer to its
    /// caller as soon as the upstream gave it, and record it (one more
    /// consensus write) after, instead of before. One write less on the
    /// caller's path; the key stays held until the record lands, so a
    /// retry meanwhile waits for it and gets the replay. What it gives up
    /// (docs/proxy.md): an answer given whose record then fails — the
    /// lease was taken over meanwhile (FENCED), or the cluster could not
    /// be reached — is an answer the key does not replay.
    pub reply_before_record: bool,
}

impl Config {
    /// The defaults, in front of `upstream`.
    pub fn new(upstream: impl Into<String>) -> Config {
        Config {
            upstream: upstream.into(),
            upstream_tls: upstream::UpstreamTls::default(),
            methods: vec![Method::POST, Method::PATCH],
            require_key: false,
            lease: Duration::from_secs(30),
            wait: Duration::from_secs(5),
            upstream_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(10),
            fingerprint_headers: Vec::new(),
            record_headers: Vec::new(),
            key_scope: None,
            callers: None,
            callers_certificates: false,
            body_bytes_max: 1 << 20,
            header_bytes_max: 16 << 10,
            response_bytes_max: 64 << 10,
            reply_before_record: false,
        }
    }

    /// The response headers recorded: the defaults and the configured
    /// ones, without the unrecordable, each once.
    pub fn recorded_headers(&self) -> Vec<HeaderName> {
        let mut names: Vec<HeaderName> = DEFAULT_RECORD_HEADERS
            .iter()
            .map(|name| HeaderName::from_static(name))
            .chain(self.record_headers.iter().cloned())
            .filter(|name| !UNRECORDABLE_HEADERS.contains(&name.as_str()))
            .collect();
        let mut seen = std::collections::BTreeSet::new();
        names.retain(|name| seen.insert(name.as_str().to_owned()));
        names
    }
}

/// `header:NAME` (the one form of `--key-scope`) as the header's name.
pub fn parse_key_scope(text: &str) -> Result<HeaderName, String> {
    let name = text
        .strip_prefix("header:")
        .ok_or_else(|| format!("--key-scope {text:?}: give header:NAME"))?;
    HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("--key-scope {text:?}: {name:?} is not a header name"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Configured record headers join the defaults once; framing and
    /// hop-by-hop headers are never recorded.
    #[test]
    fn recorded_headers_are_the_defaults_and_the_configured() {
        let mut config = Config::new("http://127.0.0.1:1");
        config.record_headers = ["x-request-cost", "content-type", "content-length"]
            .map(HeaderName::from_static)
            .to_vec();
        let names = config.recorded_headers();
        assert_eq!(names.len(), DEFAULT_RECORD_HEADERS.len() + 1);
        assert!(names.contains(&HeaderName::from_static("x-request-cost")));
        assert!(!names.contains(&HeaderName::from_static("content-length")));
    }

    #[test]
    fn key_scope_is_a_header() {
        assert_eq!(parse_key_scope("header:X-Tenant").unwrap(), "x-tenant");
        assert!(parse_key_scope("X-Tenant").is_err());
        assert!(parse_key_scope("header:bad name").is_err());
    }
}
