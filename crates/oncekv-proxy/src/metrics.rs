//! The proxy's Prometheus metrics: the one registry of every
//! `oncekv_proxy_*` metric with its help text, the handles the request
//! flow counts with, and the text exposition (served on
//! `--metrics-listen` by [`crate::server::serve_metrics`]). It counts; it
//! must not decide anything. Every metric is documented in docs/proxy.md
//! ("Metrics").

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use std::time::Duration;

/// The `Content-Type` of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// How one request ended, as `requests_total{outcome}` counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// No key (or a method the proxy does not guard): passed through.
    PassedThrough,
    /// Claimed, forwarded, and its final answer recorded.
    Forwarded,
    /// Answered from the record, the upstream untouched.
    Replayed,
    /// 422: the key was used with another request.
    Conflict,
    /// 409: another holder was still at work when the wait ran out.
    InProgress,
    /// Forwarded, but the answer was not final (a 5xx, 408, 409, 425,
    /// 429), the upstream was unreachable or timed out: released.
    Released,
    /// Forwarded, but the lease had been taken over before the answer was
    /// recorded (409 `FENCED`).
    Fenced,
    /// Forwarded, and whether its answer was recorded is unknown (the
    /// cluster did not answer the completion in time).
    Unrecorded,
    /// Refused before anything: a missing or malformed key or tenant
    /// (400), a body or headers too large (413, 431), a slow body (408),
    /// a body that broke off (400; passed through, the upstream got no
    /// whole request).
    Refused,
    /// 503: the cluster could not be asked (fail closed: nothing
    /// forwarded).
    Unavailable,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::PassedThrough => "passed_through",
            Outcome::Forwarded => "forwarded",
            Outcome::Replayed => "replayed",
            Outcome::Conflict => "conflict",
            Outcome::InProgress => "in_progress",
            Outcome::Released => "released",
            Outcome::Fenced => "fenced",
            Outcome::Unrecorded => "unrecorded",
            Outcome::Refused => "refused",
            Outcome::Unavailable => "unavailable",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabels {
    class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PathLabels {
    path: &'static str,
}

/// How an upstream call ended, as `upstream_responses_total{class}`
/// counts it.
#[derive(Clone, Copy, Debug)]
pub enum UpstreamResult {
    Status(http::StatusCode),
    Unreachable,
    Timeout,
}

/// Every metric of a proxy. Cloning a handle shares the metric.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<OutcomeLabels, Counter>,
    in_progress_waits: Counter,
    early_replies_unrecorded: Counter,
    upstream_responses: Family<ClassLabels, Counter>,
    added_latency: Family<PathLabels, Histogram, fn() -> Histogram>,
    callers_reloads: Family<ResultLabels, Counter>,
    tls_reloads: Family<ResultLabels, Counter>,
}

/// Added latency buckets: 50 µs doubling to about 6.5 s.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.0, 18))
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl Metrics {
    /// Every metric, registered under `oncekv_proxy_`.
    pub fn new() -> Metrics {
        let mut metrics = Metrics {
            registry: Registry::with_prefix("oncekv_proxy"),
            requests: Family::default(),
            in_progress_waits: Counter::default(),
            early_replies_unrecorded: Counter::default(),
            upstream_responses: Family::default(),
            added_latency: Family::new_with_constructor(latency_histogram),
            callers_reloads: Family::default(),
            tls_reloads: Family::default(),
        };
        metrics.registry.register(
            "requests",
            "Requests answered, by outcome: passed_through (no key, or a method not guarded), forwarded (claimed, forwarded once, final answer recorded), replayed (answered from the record; the upstream untouched), conflict (422 KEY_CONFLICT), in_progress (409 after --wait-ms), released (forwarded, the answer not final or none: the key released for a retry), fenced (409 FENCED: the lease was taken over before the answer was recorded), unrecorded (forwarded; whether the answer was recorded is unknown), refused (400, 408, 413, 431 before anything), unavailable (503: the cluster could not be asked; nothing forwarded)",
            metrics.requests.clone(),
        );
        metrics.registry.register(
            "in_progress_waits",
            "Keyed requests that found their key held by another request in progress and waited for it (up to --wait-ms); each is also counted once in requests_total by how it ended",
            metrics.in_progress_waits.clone(),
        );
        metrics.registry.register(
            "early_replies_unrecorded",
            "With --reply-before-record: answers given to their caller whose record then failed (the lease taken over, or the cluster out of reach); such an answer is not replayed to a retry",
            metrics.early_replies_unrecorded.clone(),
        );
        metrics.registry.register(
            "upstream_responses",
            "Answers from the upstream, by class: 1xx..5xx, unreachable (no connection, or it broke before an answer), timeout (no answer within --upstream-timeout-ms)",
            metrics.upstream_responses.clone(),
        );
        metrics.registry.register_with_unit(
            "added_latency",
            "Time the proxy adds to a request until its answer's headers are ready: the whole time minus the upstream's, by path: passed_through, forwarded (claim, forward, record), replayed (claim answered from the record), waited (a request that waited for another in progress; includes the wait)",
            Unit::Seconds,
            metrics.added_latency.clone(),
        );
        metrics.registry.register(
            "callers_reloads",
            "Reloads of --callers-file on SIGHUP, by result: ok (the new list in force), failed (the file did not read or parse; the previous list stays in force)",
            metrics.callers_reloads.clone(),
        );
        metrics.registry.register(
            "tls_reloads",
            "Reloads of the listener's --tls-cert and --tls-key on SIGHUP, by result: ok (the new pair presented from the next handshake on), failed (they did not read or load; the previous pair stays in force)",
            metrics.tls_reloads.clone(),
        );
        metrics
    }

    /// Counts a reload of the listener's certificate and key.
    pub fn tls_reload(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.tls_reloads
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Counts a reload of the callers file.
    pub fn callers_reload(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.callers_reloads
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Counts a request that ended with `outcome`.
    pub fn request(&self, outcome: Outcome) {
        self.requests
            .get_or_create(&OutcomeLabels {
                outcome: outcome.label(),
            })
            .inc();
    }

    /// Counts a keyed request that waited for another in progress.
    pub fn waited(&self) {
        self.in_progress_waits.inc();
    }

    /// Counts an answer given before its record (`--reply-before-record`)
    /// whose record then failed.
    pub fn early_reply_unrecorded(&self) {
        self.early_replies_unrecorded.inc();
    }

    /// Counts an upstream call's end.
    pub fn upstream(&self, result: UpstreamResult) {
        let class = match result {
            UpstreamResult::Status(status) => match status.as_u16() {
                100..=199 => "1xx",
                200..=299 => "2xx",
                300..=399 => "3xx",
                400..=499 => "4xx",
                _ => "5xx",
            },
            UpstreamResult::Unreachable => "unreachable",
            UpstreamResult::Timeout => "timeout",
        };
        self.upstream_responses
            .get_or_create(&ClassLabels { class })
            .inc();
    }

    /// Observes the latency added on `path` (`passed_through`,
    /// `forwarded`, `replayed`, `waited`).
    pub fn added_latency(&self, path: &'static str, added: Duration) {
        self.added_latency
            .get_or_create(&PathLabels { path })
            .observe(added.as_secs_f64());
    }

    /// The exposition in Prometheus' text format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        if prometheus_client::encoding::text::encode(&mut text, &self.registry).is_err() {
            text.clear();
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exposition names every metric under `oncekv_proxy_`.
    #[test]
    fn exposition_names_every_metric() {
        let metrics = Metrics::new();
        metrics.request(Outcome::Replayed);
        metrics.waited();
        metrics.upstream(UpstreamResult::Status(http::StatusCode::CREATED));
        metrics.added_latency("forwarded", Duration::from_micros(300));
        metrics.callers_reload(false);
        let text = metrics.encode();
        for line in [
            "oncekv_proxy_requests_total{outcome=\"replayed\"} 1",
            "oncekv_proxy_in_progress_waits_total 1",
            "oncekv_proxy_upstream_responses_total{class=\"2xx\"} 1",
            "oncekv_proxy_added_latency_seconds_count{path=\"forwarded\"} 1",
            "oncekv_proxy_callers_reloads_total{result=\"failed\"} 1",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }
}
