//! The request flow (docs/proxy.md, "Semantics"): a request on a method
//! the proxy does not guard, or without an `Idempotency-Key`, passes
//! through unchanged; a keyed one is checked (key, tenant, header and
//! body bounds), fingerprinted, and run through the client library's
//! claim cycle ([`Client::once_observed`]): won → forwarded with its fence
//! and attempt while the lease is heartbeated → a final answer recorded,
//! anything else released; completed → the record replayed; in progress
//! → waited for, then 409; another fingerprint → 422; the cluster out of
//! reach → 503, nothing forwarded. It owns which answer a request gets and
//! the counting of it; it must not decide who holds a key (the cluster
//! does, through the library), and must never forward a keyed request
//! without a won claim.
//!
//! A keyed request runs in a task of its own, so that a caller that hangs
//! up does not cancel it between the forward and the record: a key is
//! either recorded or released (or, if this process dies, left to its
//! lease), never left held by a live proxy.

use crate::Config;
use crate::body::{
    self, BodyBroken, Prefix, Prefixed, ProxyBody, ReadError, full, streamed, streamed_watched,
};
use crate::fingerprint::fingerprint;
use crate::key;
use crate::listener_tls::CertifiedCaller;
use crate::metrics::{Metrics, Outcome, UpstreamResult};
use crate::problem::Problem;
use crate::record::Record;
use crate::upstream::{
    IDEMPOTENCY_ATTEMPT, IDEMPOTENCY_FENCE, Upstream, UpstreamError, strip_hop_by_hop,
};
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, Version, header};
use hyper::body::{Bytes, Incoming};
use oncekv_client::{ClaimToken, Client, Error, OnceError, OnceOptions, OnceOutcome};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

/// The header telling a replay (`true`) from a first answer (`false`).
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// A proxy: its configuration, its handle on the cluster, the upstream
/// and the metrics. Shared by every connection.
pub struct Proxy {
    config: Config,
    recorded_headers: Vec<HeaderName>,
    options: OnceOptions,
    client: Client,
    upstream: Upstream,
    metrics: Arc<Metrics>,
    keyed_tasks: Arc<KeyedTasks>,
}

/// The keyed requests' tasks still running: each records or releases its
/// key, and may outlive its caller's connection; shutdown waits for them.
#[derive(Debug, Default)]
struct KeyedTasks {
    running: std::sync::atomic::AtomicUsize,
    idle: tokio::sync::Notify,
}

/// One running keyed task, counted until dropped.
struct KeyedTask(Arc<KeyedTasks>);

impl KeyedTask {
    fn start(tasks: &Arc<KeyedTasks>) -> KeyedTask {
        tasks
            .running
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        KeyedTask(Arc::clone(tasks))
    }
}

impl Drop for KeyedTask {
    fn drop(&mut self) {
        if self
            .0
            .running
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst)
            == 1
        {
            self.0.idle.notify_waiters();
        }
    }
}

/// What a request got, and what to count of it.
struct Answered {
    response: Response<ProxyBody>,
    outcome: Outcome,
    /// The latency histogram's path, when the request is counted there.
    path: Option<&'static str>,
    /// Time spent waiting for the upstream (not added by the proxy).
    upstream_time: Duration,
}

impl Answered {
    fn problem(problem: Problem, outcome: Outcome) -> Answered {
        Answered {
            response: problem.response(),
            outcome,
            path: None,
            upstream_time: Duration::ZERO,
        }
    }
}

/// The upstream's final answer, to give its first caller.
struct Forwarded {
    head: http::response::Parts,
    body: ProxyBody,
    record: Record,
    upstream_time: Duration,
}

/// Why a forwarded request's answer is not recorded: the key is released.
enum NotRecorded {
    /// The upstream answered, but not finally (5xx, 408, 409, 425, 429):
    /// passed on as it is.
    NotFinal {
        head: http::response::Parts,
        body: ProxyBody,
        upstream_time: Duration,
    },
    /// No answer: no connection, or it broke.
    Unreachable(String),
    /// No (whole) answer within `--upstream-timeout-ms`.
    Timeout,
    /// The request cannot be put onto the upstream (nothing was sent).
    Unsendable(String),
}

/// Whether an upstream status is final (recorded): 2xx, 3xx, and 4xx but
/// 408 (timeout), 409 (conflict), 425 (too early) and 429 (too many
/// requests), which say "not now" rather than "no".
pub fn is_final(status: StatusCode) -> bool {
    match status.as_u16() {
        200..=399 => true,
        408 | 409 | 425 | 429 => false,
        400..=499 => true,
        _ => false,
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// An error and its sources, on one line.
fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

impl Proxy {
    /// A proxy for `config`, claiming through `client`, counting into
    /// `metrics`.
    pub fn new(
        config: Config,
        client: Client,
        metrics: Arc<Metrics>,
    ) -> Result<Proxy, UpstreamError> {
        let upstream = Upstream::new(&config.upstream, &config.upstream_tls)?;
        let options = OnceOptions {
            lease: config.lease,
            wait: config.wait,
            heartbeat: None,
        };
        Ok(Proxy {
            recorded_headers: config.recorded_headers(),
            config,
            options,
            client,
            upstream,
            metrics,
            keyed_tasks: Arc::default(),
        })
    }

    /// Waits until no keyed request's task runs (each recorded or released
    /// its key).
    pub async fn keyed_tasks_done(&self) {
        let tasks = &self.keyed_tasks;
        loop {
            let idle = tasks.idle.notified();
            if tasks.running.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                return;
            }
            idle.await;
        }
    }

    /// The upstream requests go to.
    pub fn upstream(&self) -> &Upstream {
        &self.upstream
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Answers one request (never fails: every failure is an answer).
    pub async fn handle(self: Arc<Self>, request: Request<Incoming>) -> Response<ProxyBody> {
        let started = Instant::now();
        let (mut parts, body) = request.into_parts();
        // Only the proxy tells the upstream a fence: a caller's own copy
        // of these headers never reaches it, keyed or not.
        parts.headers.remove(IDEMPOTENCY_FENCE);
        parts.headers.remove(IDEMPOTENCY_ATTEMPT);
        // Who calls, before anything is read, claimed or forwarded.
        let certified = parts.extensions.remove::<CertifiedCaller>();
        let caller = match self.caller(&parts.headers, certified) {
            Ok(caller) => caller,
            Err(why) => {
                self.metrics.request(Outcome::Refused);
                return Problem::new(
                    StatusCode::PROXY_AUTHENTICATION_REQUIRED,
                    "PROXY_UNAUTHENTICATED",
                    format!("{why}; nothing was forwarded"),
                )
                .response_with_header(
                    header::PROXY_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"oncekv proxy\""),
                );
            }
        };
        let answered = if !self.config.methods.contains(&parts.method) {
            self.pass_through(parts, body).await
        } else {
            match key::idempotency_key(&parts.headers) {
                Err(why) => Answered::problem(
                    Problem::new(StatusCode::BAD_REQUEST, "INVALID_IDEMPOTENCY_KEY", why),
                    Outcome::Refused,
                ),
                Ok(None) if self.config.require_key => Answered::problem(
                    Problem::new(
                        StatusCode::BAD_REQUEST,
                        "MISSING_IDEMPOTENCY_KEY",
                        format!(
                            "a {} request needs an Idempotency-Key header here; nothing was forwarded",
                            parts.method
                        ),
                    ),
                    Outcome::Refused,
                ),
                Ok(None) => self.pass_through(parts, body).await,
                Ok(Some(key)) => self.keyed(parts, body, key, caller).await,
            }
        };
        self.metrics.request(answered.outcome);
        if let Some(path) = answered.path {
            self.metrics.added_latency(
                path,
                started.elapsed().saturating_sub(answered.upstream_time),
            );
        }
        answered.response
    }

    /// Who calls: the name of a `--callers-file` token in the request's
    /// `Proxy-Authorization`, else the name its connection's certificate
    /// gives (`--callers-ca`); `None` when the proxy knows no callers; why
    /// the request is refused (407).
    fn caller(
        &self,
        headers: &HeaderMap,
        certified: Option<CertifiedCaller>,
    ) -> Result<Option<String>, String> {
        if let Some(callers) = &self.config.callers
            && (headers.contains_key(header::PROXY_AUTHORIZATION) || certified.is_none())
        {
            return match callers.current().caller(headers) {
                Ok(name) => Ok(Some(name.to_owned())),
                Err(why) if certified.is_none() && self.config.callers_certificates => Err(
                    format!("{why}, or a client certificate signed by its --callers-ca"),
                ),
                Err(why) => Err(why),
            };
        }
        match certified {
            Some(CertifiedCaller(named)) => named.map(Some),
            // Callers are asked for certificates, and this one gave none
            // (a listener that made it optional without a callers file):
            // refused, never the shared namespace.
            None if self.config.callers_certificates => {
                Err("this proxy needs a client certificate signed by its --callers-ca".to_owned())
            }
            None => Ok(None),
        }
    }

    /// Forwards a request as it is (its body streamed), and its answer.
    async fn pass_through(&self, parts: Parts, body: Incoming) -> Answered {
        let mut headers = parts.headers;
        strip_hop_by_hop(&mut headers);
        let uri = match self.upstream.uri_for(&parts.uri) {
            Ok(uri) => uri,
            Err(error) => {
                return Answered::problem(
                    Problem::new(
                        StatusCode::BAD_REQUEST,
                        "INVALID_REQUEST",
                        format!("the request's path cannot go to the upstream: {error}"),
                    ),
                    Outcome::Refused,
                );
            }
        };
        let broken = BodyBroken::default();
        let mut request = Request::new(streamed_watched(body, &broken));
        *request.method_mut() = parts.method;
        *request.uri_mut() = uri;
        *request.version_mut() = Version::HTTP_11;
        *request.headers_mut() = headers;
        let sent = Instant::now();
        match tokio::time::timeout(self.config.upstream_timeout, self.upstream.send(request)).await
        {
            Err(_) => {
                self.metrics.upstream(UpstreamResult::Timeout);
                Answered::problem(self.upstream_timeout(None), Outcome::PassedThrough)
            }
            // The caller's body broke off (a malformed chunk, a dropped
            // connection) while it was streamed on: the caller's failure,
            // not the upstream's, which got no whole request.
            Ok(Err(_)) if broken.why().is_some() => Answered::problem(
                Problem::new(
                    StatusCode::BAD_REQUEST,
                    "BODY_BROKEN",
                    format!(
                        "the request's body could not be read ({}); the upstream got no whole \
                         request",
                        broken.why().unwrap_or_default()
                    ),
                ),
                Outcome::Refused,
            ),
            Ok(Err(error)) => {
                self.metrics.upstream(UpstreamResult::Unreachable);
                Answered::problem(
                    self.upstream_unreachable(&describe(&error), None),
                    Outcome::PassedThrough,
                )
            }
            Ok(Ok(response)) => {
                let upstream_time = sent.elapsed();
                self.metrics
                    .upstream(UpstreamResult::Status(response.status()));
                let (mut head, body) = response.into_parts();
                strip_hop_by_hop(&mut head.headers);
                Answered {
                    response: Response::from_parts(head, streamed(body)),
                    outcome: Outcome::PassedThrough,
                    path: Some("passed_through"),
                    upstream_time,
                }
            }
        }
    }

    /// A keyed request: checked, read, fingerprinted, then claimed and
    /// forwarded in a task of its own.
    async fn keyed(
        self: &Arc<Self>,
        parts: Parts,
        body: Incoming,
        key: Vec<u8>,
        caller: Option<String>,
    ) -> Answered {
        let header_bytes: usize = parts
            .headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 4)
            .sum();
        if header_bytes > self.config.header_bytes_max {
            return Answered::problem(
                Problem::new(
                    StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                    "HEADERS_TOO_LARGE",
                    format!(
                        "a keyed request's headers may take at most {} bytes (these take {header_bytes}); nothing was forwarded",
                        self.config.header_bytes_max
                    ),
                ),
                Outcome::Refused,
            );
        }
        let tenant = match &self.config.key_scope {
            None => None,
            Some(name) => match key::tenant(&parts.headers, name) {
                Ok(tenant) => Some(tenant),
                Err(why) => {
                    return Answered::problem(
                        Problem::new(
                            StatusCode::BAD_REQUEST,
                            "MISSING_TENANT",
                            format!("{why}; nothing was forwarded"),
                        ),
                        Outcome::Refused,
                    );
                }
            },
        };
        let claim_key = key::caller_claim_key(caller.as_deref(), tenant.as_deref(), &key);
        let deadline = Instant::now() + self.config.body_timeout;
        let body =
            match body::read_request(&parts.headers, body, self.config.body_bytes_max, deadline)
                .await
            {
                Ok(body) => body,
                Err(error) => return Answered::problem(self.unread_body(error), Outcome::Refused),
            };
        let fingerprint = fingerprint(
            &parts.method,
            &parts.uri,
            &parts.headers,
            &self.config.fingerprint_headers,
            &body,
        );
        let proxy = Arc::clone(self);
        let (early, mut early_answer) = tokio::sync::oneshot::channel();
        let early = self.config.reply_before_record.then_some(early);
        let task = KeyedTask::start(&self.keyed_tasks);
        let mut work = tokio::spawn(async move {
            let _task = task;
            proxy
                .claim_and_forward(parts, body, claim_key, fingerprint, early)
                .await
        });
        // With --reply-before-record the upstream's answer may come before
        // the task ends (it goes on to record it); else the task's answer.
        let finished = tokio::select! {
            biased;
            Ok(answered) = &mut early_answer => return answered,
            finished = &mut work => finished,
        };
        match finished {
            Ok(answered) => answered,
            Err(error) => {
                tracing::error!(%error, "a keyed request's task failed");
                Answered::problem(
                    Problem::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "INTERNAL",
                        "the proxy failed while handling this request; retry with the same key",
                    ),
                    Outcome::Unavailable,
                )
            }
        }
    }

    /// Why a keyed request's body was not read, as an answer.
    fn unread_body(&self, error: ReadError) -> Problem {
        match error {
            ReadError::TooLarge => Problem::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "BODY_TOO_LARGE",
                format!(
                    "a keyed request's body is read whole to be fingerprinted, and may be at most {} bytes (streamed and chunked bodies too); nothing was forwarded",
                    self.config.body_bytes_max
                ),
            )
            .with("body_bytes_max", self.config.body_bytes_max),
            ReadError::Timeout => Problem::new(
                StatusCode::REQUEST_TIMEOUT,
                "BODY_TIMEOUT",
                format!(
                    "the body did not arrive within {} ms; nothing was forwarded",
                    self.config.body_timeout.as_millis()
                ),
            ),
            ReadError::Broken(why) => Problem::new(
                StatusCode::BAD_REQUEST,
                "BODY_BROKEN",
                format!("the body could not be read ({why}); nothing was forwarded"),
            ),
        }
    }

    /// Claims the key, forwards once under the won claim, records or
    /// releases; or replays, waits, refuses. With `early` (the proxy's
    /// `--reply-before-record`), a final answer goes to the caller through
    /// it before the record is written; what this returns then is for no
    /// one (the record's failure is logged).
    async fn claim_and_forward(
        &self,
        parts: Parts,
        body: Bytes,
        claim_key: Vec<u8>,
        fingerprint: Vec<u8>,
        early: Option<tokio::sync::oneshot::Sender<Answered>>,
    ) -> Answered {
        let first: Mutex<Option<Forwarded>> = Mutex::new(None);
        let holder: Mutex<Option<(u64, u64)>> = Mutex::new(None);
        let early = Mutex::new(early);
        let mut replied = false;
        let mut waited = false;
        let outcome = self
            .client
            .once_observed(
                &claim_key,
                &fingerprint,
                &self.options,
                |_| waited = true,
                |token| {
                    let (first, holder, parts, early, replied) =
                        (&first, &holder, &parts, &early, &mut replied);
                    async move {
                        *lock(holder) = Some((token.fence, token.attempt));
                        let forwarded = self.forward_claimed(parts, body, &token).await?;
                        let record = forwarded.record.encode();
                        // A holder a heartbeat found fenced records nothing:
                        // its answer waits for the complete's verdict.
                        let early = lock(early).take().filter(|_| !token.is_fenced());
                        match early {
                            Some(early) => {
                                *replied = true;
                                let answer = self.answer_first(forwarded, Outcome::Forwarded);
                                if let Err(answer) = early.send(answer) {
                                    drop(answer);
                                }
                            }
                            None => *lock(first) = Some(forwarded),
                        }
                        Ok::<_, NotRecorded>(record)
                    }
                },
            )
            .await;
        if replied {
            return self.after_early_reply(outcome, &claim_key);
        }
        if waited {
            self.metrics.waited();
        }
        let (fence, attempt) = lock(&holder).unwrap_or((0, 0));
        let first = lock(&first).take();
        match outcome {
            Ok(OnceOutcome::Ran { .. }) => match first {
                Some(forwarded) => self.answer_first(forwarded, Outcome::Forwarded),
                None => Answered::problem(
                    Problem::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "INTERNAL",
                        "the answer was recorded but is missing here; retry with the same key to get it",
                    ),
                    Outcome::Forwarded,
                ),
            },
            Ok(OnceOutcome::Replayed { result, .. }) => Answered {
                response: replay(&result),
                outcome: Outcome::Replayed,
                path: Some(if waited { "waited" } else { "replayed" }),
                upstream_time: Duration::ZERO,
            },
            Err(OnceError::Claim(error)) => self.claim_refused(error, waited),
            Err(OnceError::Failed { error, released }) => {
                if let Err(release) = &released {
                    tracing::warn!(
                        fence,
                        error = %release,
                        "cannot release a key after an answer that is not final; it stays held until its lease runs out"
                    );
                }
                self.not_recorded(error, released.is_ok())
            }
            Err(OnceError::Record { result, error }) => {
                self.record_failed(&claim_key, fence, attempt, &result, error, first)
                    .await
            }
        }
    }

    /// After the caller had its answer (`--reply-before-record`): the
    /// record's fate, logged and counted (the caller's request was counted
    /// as forwarded when it was answered).
    fn after_early_reply(
        &self,
        outcome: Result<OnceOutcome, OnceError<NotRecorded>>,
        claim_key: &[u8],
    ) -> Answered {
        let key = String::from_utf8_lossy(claim_key).into_owned();
        match outcome {
            Ok(_) => {}
            Err(OnceError::Record {
                error: Error::Fenced { current_fence },
                ..
            }) => {
                self.metrics.early_reply_unrecorded();
                tracing::warn!(
                    key,
                    current_fence,
                    "an answer given before its record (--reply-before-record) is not the key's: the lease was taken over before the record landed (FENCED)"
                );
            }
            Err(OnceError::Record { error, .. } | OnceError::Claim(error)) => {
                self.metrics.early_reply_unrecorded();
                tracing::warn!(
                    key,
                    error = %error,
                    "an answer given before its record (--reply-before-record) may not be recorded; the key stays held until its lease runs out if it is not"
                );
            }
            // The effect (the forward) succeeded, or nothing was replied.
            Err(OnceError::Failed { .. }) => {}
        }
        Answered::problem(answer_lost(), Outcome::Forwarded)
    }

    /// Forwards the request under `token`'s claim and reads the answer as
    /// far as it is recorded.
    async fn forward_claimed(
        &self,
        parts: &Parts,
        body: Bytes,
        token: &ClaimToken,
    ) -> Result<Forwarded, NotRecorded> {
        let deadline = Instant::now() + self.config.upstream_timeout;
        let uri = self
            .upstream
            .uri_for(&parts.uri)
            .map_err(|error| NotRecorded::Unsendable(error.to_string()))?;
        let mut headers = parts.headers.clone();
        strip_hop_by_hop(&mut headers);
        headers.insert(IDEMPOTENCY_FENCE, HeaderValue::from(token.fence));
        headers.insert(IDEMPOTENCY_ATTEMPT, HeaderValue::from(token.attempt));
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
        let mut request = Request::new(full(body));
        *request.method_mut() = parts.method.clone();
        *request.uri_mut() = uri;
        *request.version_mut() = Version::HTTP_11;
        *request.headers_mut() = headers;
        let sent = Instant::now();
        let response = match tokio::time::timeout_at(deadline, self.upstream.send(request)).await {
            Err(_) => {
                self.metrics.upstream(UpstreamResult::Timeout);
                return Err(NotRecorded::Timeout);
            }
            Ok(Err(error)) => {
                self.metrics.upstream(UpstreamResult::Unreachable);
                return Err(NotRecorded::Unreachable(describe(&error)));
            }
            Ok(Ok(response)) => response,
        };
        self.metrics
            .upstream(UpstreamResult::Status(response.status()));
        let (mut head, incoming) = response.into_parts();
        strip_hop_by_hop(&mut head.headers);
        if !is_final(head.status) {
            return Err(NotRecorded::NotFinal {
                head,
                body: streamed(incoming),
                upstream_time: sent.elapsed(),
            });
        }
        let mut record = Record {
            status: head.status.as_u16(),
            headers: self.recorded(&head.headers),
            body: Vec::new(),
            body_omitted: None,
        };
        let budget = self
            .config
            .response_bytes_max
            .saturating_sub(record.encoded_len());
        match body::read_prefix(incoming, budget, deadline).await {
            Prefix::Whole(bytes) => {
                record.body = bytes.to_vec();
                Ok(Forwarded {
                    head,
                    body: full(bytes),
                    record,
                    upstream_time: sent.elapsed(),
                })
            }
            Prefix::TooLarge { read, rest } => Ok(Forwarded {
                head,
                record: record.without_body(read.len() as u64),
                body: Prefixed::boxed_body(read, rest),
                upstream_time: sent.elapsed(),
            }),
            Prefix::Timeout => Err(NotRecorded::Timeout),
            Prefix::Broken(why) => Err(NotRecorded::Unreachable(format!(
                "the answer's body broke off: {why}"
            ))),
        }
    }

    /// The allow-listed headers of an answer, in the order received.
    fn recorded(&self, headers: &HeaderMap) -> Vec<(Vec<u8>, Vec<u8>)> {
        headers
            .iter()
            .filter(|(name, _)| self.recorded_headers.contains(name))
            .map(|(name, value)| (name.as_str().as_bytes().to_vec(), value.as_bytes().to_vec()))
            .collect()
    }

    /// The upstream's own answer to its first caller: all its headers,
    /// `Idempotent-Replayed: false`.
    fn answer_first(&self, forwarded: Forwarded, outcome: Outcome) -> Answered {
        let mut response = Response::from_parts(forwarded.head, forwarded.body);
        response
            .headers_mut()
            .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("false"));
        Answered {
            response,
            outcome,
            path: Some("forwarded"),
            upstream_time: forwarded.upstream_time,
        }
    }

    /// A claim that was not won: in progress past the wait (409), another
    /// request's key (422), or the cluster out of reach (503; fail
    /// closed: nothing was forwarded).
    fn claim_refused(&self, error: Error, waited: bool) -> Answered {
        match error {
            Error::ClaimInProgress { retry_after_ms } => Answered {
                path: Some("waited").filter(|_| waited),
                ..Answered::problem(
                    Problem::new(
                        StatusCode::CONFLICT,
                        "IN_PROGRESS",
                        format!(
                            "a request with this key is in progress{}; retry it with the same key and body: you get its answer once it is recorded",
                            if waited {
                                format!(" (waited {} ms for it)", self.config.wait.as_millis())
                            } else {
                                String::new()
                            }
                        ),
                    )
                    .with("retry_after_ms", retry_after_ms.min(1_000))
                    .with("lease_ms_left", retry_after_ms)
                    .retry_after(1),
                    Outcome::InProgress,
                )
            },
            Error::KeyConflict { .. } => Answered::problem(
                Problem::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "KEY_CONFLICT",
                    "this Idempotency-Key was used with another request (another method, path, query, body or fingerprinted header); nothing was forwarded. Use a new key for new work",
                ),
                Outcome::Conflict,
            ),
            error => {
                tracing::warn!(error = %error, kind = error.kind(), "cannot claim a key: the request is refused (fail closed)");
                Answered::problem(
                    Problem::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "CLAIM_UNAVAILABLE",
                        format!(
                            "the oncekv cluster could not be asked to claim this key ({error}); nothing was forwarded. Retry later with the same key and body"
                        ),
                    )
                    .with("kind", error.kind())
                    .retry_after(1),
                    Outcome::Unavailable,
                )
            }
        }
    }

    /// A forwarded request whose answer is not recorded (the key released
    /// when `released`).
    fn not_recorded(&self, error: NotRecorded, released: bool) -> Answered {
        let key_state = if released {
            "the key was released: a retry with the same key forwards again"
        } else {
            "the key could not be released and stays held until its lease runs out; then a retry with the same key forwards again"
        };
        match error {
            NotRecorded::NotFinal {
                head,
                body,
                upstream_time,
            } => Answered {
                response: Response::from_parts(head, body),
                outcome: Outcome::Released,
                path: Some("forwarded"),
                upstream_time,
            },
            NotRecorded::Unreachable(why) => Answered::problem(
                self.upstream_unreachable(&why, Some(key_state)),
                Outcome::Released,
            ),
            NotRecorded::Timeout => {
                Answered::problem(self.upstream_timeout(Some(key_state)), Outcome::Released)
            }
            NotRecorded::Unsendable(why) => Answered::problem(
                Problem::new(
                    StatusCode::BAD_REQUEST,
                    "INVALID_REQUEST",
                    format!(
                        "the request's path cannot go to the upstream ({why}); nothing was forwarded, {key_state}"
                    ),
                ),
                Outcome::Refused,
            ),
        }
    }

    /// The upstream answered finally, but the answer was not recorded.
    async fn record_failed(
        &self,
        claim_key: &[u8],
        fence: u64,
        attempt: u64,
        result: &[u8],
        error: Error,
        first: Option<Forwarded>,
    ) -> Answered {
        let status = first
            .as_ref()
            .map_or(0, |forwarded| forwarded.head.status.as_u16());
        let error = match error {
            // The cluster records less than --response-bytes-max: record
            // the answer without its body rather than leave the key held
            // (its effect happened; a release would run it again).
            Error::LimitExceeded { .. } => {
                let without_body = Record::decode(result)
                    .map(|record| record.without_body(record.body.len() as u64).encode());
                match without_body {
                    Ok(bytes) => match self.client.complete_claim(claim_key, fence, &bytes).await {
                        Ok(_) => {
                            tracing::warn!(
                                fence,
                                "an answer larger than the cluster's claim_result_bytes_max was recorded without its body: lower --response-bytes-max"
                            );
                            return match first {
                                Some(forwarded) => self.answer_first(forwarded, Outcome::Forwarded),
                                None => Answered::problem(answer_lost(), Outcome::Forwarded),
                            };
                        }
                        Err(error) => error,
                    },
                    Err(_) => Error::InvalidArgument("undecodable own record".into()),
                }
            }
            error => error,
        };
        match error {
            Error::Fenced { current_fence } => {
                tracing::warn!(
                    fence,
                    current_fence,
                    upstream_status = status,
                    "the upstream answered after this proxy's lease was taken over: the answer is not recorded (FENCED)"
                );
                Answered {
                    path: Some("forwarded"),
                    upstream_time: first.as_ref().map_or(Duration::ZERO, |f| f.upstream_time),
                    ..Answered::problem(
                        Problem::new(
                            StatusCode::CONFLICT,
                            "FENCED",
                            format!(
                                "the upstream answered {status} to this request under fence {fence} (attempt {attempt}), but this proxy's lease on the key ran out and another holder (fence {current_fence}) took it over before the answer could be recorded: that answer is not the key's, and is not given. Retry with the same key and body to get the recorded answer. An upstream that keeps the highest Idempotency-Fence per key has refused this request's effect if it came second"
                            ),
                        )
                        .with("fence", fence)
                        .with("current_fence", current_fence)
                        .with("upstream_status", status)
                        .retry_after(1),
                        Outcome::Fenced,
                    )
                }
            }
            error => {
                tracing::warn!(
                    fence,
                    error = %error,
                    "the upstream answered, but whether the answer was recorded is unknown"
                );
                match first {
                    Some(forwarded) => self.answer_first(forwarded, Outcome::Unrecorded),
                    None => Answered::problem(answer_lost(), Outcome::Unrecorded),
                }
            }
        }
    }

    fn upstream_unreachable(&self, why: &str, key_state: Option<&str>) -> Problem {
        Problem::new(
            StatusCode::BAD_GATEWAY,
            "UPSTREAM_UNREACHABLE",
            match key_state {
                Some(key_state) => format!(
                    "no answer from the upstream {} ({why}); {key_state}",
                    self.upstream.describe()
                ),
                None => format!(
                    "no answer from the upstream {} ({why})",
                    self.upstream.describe()
                ),
            },
        )
    }

    fn upstream_timeout(&self, key_state: Option<&str>) -> Problem {
        let waited = format!(
            "the upstream {} did not answer within {} ms",
            self.upstream.describe(),
            self.config.upstream_timeout.as_millis()
        );
        Problem::new(
            StatusCode::GATEWAY_TIMEOUT,
            "UPSTREAM_TIMEOUT",
            match key_state {
                Some(key_state) => format!("{waited}; {key_state}"),
                None => waited,
            },
        )
    }
}

fn answer_lost() -> Problem {
    Problem::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "INTERNAL",
        "the upstream answered but the answer is missing here; retry with the same key",
    )
}

/// A recorded answer, replayed: its status, recorded headers and body
/// byte for byte, `Idempotent-Replayed: true`. An answer recorded without
/// its body (too large), or bytes that are not a proxy record, are a 502
/// problem saying so.
pub fn replay(result: &[u8]) -> Response<ProxyBody> {
    let record = match Record::decode(result) {
        Ok(record) => record,
        Err(error) => {
            return Problem::new(
                StatusCode::BAD_GATEWAY,
                "UNDECODABLE_RECORD",
                format!("the key is completed, but its recorded result is not this proxy's: {error}; nothing was forwarded"),
            )
            .response();
        }
    };
    let Ok(status) = StatusCode::from_u16(record.status) else {
        return Problem::new(
            StatusCode::BAD_GATEWAY,
            "UNDECODABLE_RECORD",
            format!("the recorded status {} is not valid", record.status),
        )
        .response();
    };
    if let Some(size) = record.body_omitted {
        let mut response = Problem::new(
            StatusCode::BAD_GATEWAY,
            "ANSWER_NOT_RECORDED",
            format!(
                "this request was performed once (the upstream answered {status}), but its answer's body ({size} bytes or more) was larger than the proxy records (--response-bytes-max), so it cannot be replayed; nothing was forwarded now"
            ),
        )
        .with("upstream_status", status.as_u16())
        .with("body_bytes_at_least", size)
        .response();
        response
            .headers_mut()
            .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        return response;
    }
    let mut response = Response::new(full(record.body));
    *response.status_mut() = status;
    for (name, value) in record.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&name),
            HeaderValue::from_bytes(&value),
        ) {
            response.headers_mut().append(name, value);
        }
    }
    response
        .headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// Final: 2xx, 3xx, 4xx but 408, 409, 425, 429; never 5xx or 1xx.
    #[test]
    fn final_statuses() {
        for code in [200, 201, 204, 303, 400, 404, 410, 422] {
            assert!(is_final(StatusCode::from_u16(code).unwrap()), "{code}");
        }
        for code in [100, 408, 409, 425, 429, 500, 502, 503, 504] {
            assert!(!is_final(StatusCode::from_u16(code).unwrap()), "{code}");
        }
    }

    /// A replay is the record's status, headers and bytes, marked; an
    /// omitted body and foreign bytes are 502 problems.
    #[tokio::test]
    async fn replays_are_the_record() {
        let record = Record {
            status: 201,
            headers: vec![(b"content-type".to_vec(), b"text/plain".to_vec())],
            body: b"made \xff".to_vec(),
            body_omitted: None,
        };
        let response = replay(&record.encode());
        assert_eq!(response.status(), 201);
        assert_eq!(response.headers()["content-type"], "text/plain");
        assert_eq!(response.headers()["idempotent-replayed"], "true");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"made \xff");
        let omitted = replay(&record.without_body(1 << 20).encode());
        assert_eq!(omitted.status(), 502);
        assert_eq!(replay(b"receipt").status(), 502);
    }
}
