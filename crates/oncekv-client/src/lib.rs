//! The client library: exactly-once calls made effortless. A [`Client`]
//! registers a session lazily (idempotently, by a random nonce), numbers
//! every request, tracks the first outstanding seq, keeps many requests in
//! flight within the session's window, and retries every "this attempt"
//! failure with the *same* (client id, seq, command) — following leader
//! hints, with exponential backoff and full jitter — until the call's
//! deadline. At the deadline the outcome is unknown: the call says so and
//! the seq is fenced (the floor moves past it), so a late copy can never
//! execute — and so is a retry refused for good after an attempt that may
//! have been applied, unless the refusal proves nothing ran (rule 22: see
//! [`Error`]). The floor never runs more than a window ahead of the last
//! one the cluster confirmed ([`seqs`]), so no outage leaves a session the
//! cluster refuses. A session the cluster no longer knows, or refuses for
//! good, is never silently replaced under in-flight calls: they report an
//! unknown outcome, and only new calls (and a call refused before anything
//! of it can have run) get a new session. A request that can never succeed — an empty
//! key, or one that breaks a request limit the cluster told the session
//! (key, value or list too large) — is refused before it is sent, with a
//! definite, typed error; the cluster refuses it the same way, finally, if
//! it is sent anyway.
//!
//! Producers without a session — a consumer deduplicating by message id, a
//! webhook handler — call [`Client::execute_with_key`] instead: exactly once
//! per idempotency key (rule 18), no session, no register, the same key
//! retried across leader changes until the call's deadline. Keys belong to
//! the principal of the client's credentials; without authentication every
//! caller shares the anonymous principal's keys, so namespace your keys.
//!
//! Leader following is the one policy of [`policy`]; [`admin`] is the
//! client of the operators' `Admin` service on it; [`credentials`] what a
//! caller shows a node. The crate speaks only the wire (`oncekv-wire`):
//! it must not depend on the server (no Raft, no storage), and must never
//! re-send under a new session a request that may have run (rule 9).
//!
//! ```no_run
//! # async fn demo() -> Result<(), oncekv_client::Error> {
//! let client = oncekv_client::Client::connect(["127.0.0.1:7101", "127.0.0.1:7102"]);
//! let balance = client.increment(b"balance", 5).await?;
//! client.close().await;
//! # let _ = balance; Ok(()) }
//! ```

pub mod admin;
mod claims;
pub mod credentials;
pub mod policy;
pub mod retry;
pub mod seqs;

pub use claims::{ClaimToken, OnceError, OnceOptions, OnceOutcome};
use credentials::{AuthChannel, Credentials};
pub use oncekv_core::ClaimAnswer;
use oncekv_core::{Command, CommandResult, Limit, LimitExceeded, RequestLimits, Value};
use oncekv_wire::convert;
use oncekv_wire::proto::{self, Reason, client_client::ClientClient};
use oncekv_wire::status::{error_detail, refuses_floor_bound};
use policy::{CallError, Follower, Verdict};
use retry::Backoff;
use seqs::Seqs;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::Instrument;

/// Why a call failed. The unknown outcomes — [`Error::OutcomeUnknown`],
/// [`Error::KeyOutcomeUnknown`] and [`Error::PlainOutcomeUnknown`] — are the
/// only ones after which the command may or may not have taken effect;
/// every other error means it did not.
///
/// Rule 22: once an attempt may have reached a leader that applies it (it
/// timed out, its connection broke, a node said it could not answer in
/// time or was no longer the leader), a later refusal for good of a retry
/// says nothing about that earlier attempt, so it is reported as unknown —
/// `UNAUTHENTICATED` from a node whose token file changed, `PERMISSION_DENIED`,
/// `SESSION_EXPIRED`, `INVALID_ARGUMENT`, `WRONG_CLUSTER`,
/// `RESPONSE_DISCARDED` alike — with the refusal in its reason. Only
/// refusals that prove nothing ran for the request stay definite: a
/// `LIMIT_EXCEEDED` or `SEQ_CONFLICT` for the seq (the seq's own cached
/// answer: had an attempt executed, every retry would get its result), and
/// for a key `KEY_CONFLICT` or a command's `LIMIT_EXCEEDED` (the key's
/// record; see [`Client::execute_with_key`] for the one caveat). The claim
/// calls follow the same rule: after such an attempt only `KEY_CONFLICT`
/// stays definite, and `FENCED`, `INVALID_ARGUMENT` (a lease beyond a
/// lowered `lease_ms_max`), `LIMIT_EXCEEDED` (a key or result beyond a
/// lowered limit), `WRONG_CLUSTER`… of a retry are
/// [`Error::KeyOutcomeUnknown`]. A reply that arrives but cannot be
/// decoded is an unknown outcome too: the request was applied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The deadline passed, the session vanished, or a retry was refused
    /// for good after an earlier attempt that may have been applied, while
    /// the request's fate was open. The library fences the seq (see
    /// `fenced`) so that it never executes later.
    #[error("outcome unknown for seq {seq}: {reason}")]
    OutcomeUnknown {
        seq: u64,
        reason: String,
        /// The raised floor is committed: no copy of this request can
        /// execute any more. When false (an earlier seq is still in flight,
        /// or the cluster stayed unreachable) the next request carries it.
        fenced: bool,
    },
    /// Nothing was executed, and the cluster could not be reached in time.
    #[error("cluster unavailable: {0}")]
    Unavailable(String),
    #[error("session expired")]
    SessionExpired,
    #[error("wrong cluster (this cluster's id is {expected})")]
    WrongCluster { expected: String },
    #[error("seq {seq} was already used with another command")]
    SeqConflict { seq: u64 },
    #[error("seq {seq} is below the acknowledged floor {floor}")]
    ResponseDiscarded { seq: u64, floor: u64 },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The node requires credentials and got none it knows (final: fix
    /// `ClientConfig::credentials`).
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The credentials' principal may not do this: its role lacks the
    /// service, or the session belongs to another principal (final).
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// A replicated capacity limit refused the request until the deadline,
    /// and no attempt of it can have run: each was refused when its entry
    /// applied, or by a node that proposed nothing (rule 22). Nothing was
    /// executed. After an attempt that may have reached a leader, the same
    /// refusal is reported as an unknown outcome instead.
    #[error("resource exhausted: {0}")]
    ResourceExhausted(String),
    /// The request itself breaks a replicated limit (a key, value or list
    /// too large, or a response too large to cache): it can never succeed
    /// as sent. Nothing was executed — whether the library refused it
    /// before sending or the cluster did (finally: every retry of the seq
    /// gets the same answer).
    #[error(
        "the request breaks the replicated limit {limit} = {max} (it needs {requested}); nothing was executed"
    )]
    LimitExceeded {
        limit: Limit,
        max: u64,
        requested: u64,
    },
    /// `execute_with_key`: the idempotency key was used before (by this
    /// principal, within its TTL) with another command. Nothing executed;
    /// the key keeps answering its first command. Final: a caller bug, or
    /// a key reused for new work.
    #[error("idempotency key {key:?} was already used with another command; nothing was executed")]
    KeyConflict {
        /// The key, lossily as text (for messages).
        key: String,
    },
    /// `execute_with_key`: the deadline passed while the keyed request's
    /// fate was open; it may or may not have executed. Unlike a session's
    /// unknown outcome, it can be learnt: call again with the same key and
    /// the same command while the key lives (its TTL, 24 h by default) —
    /// a duplicate answer is the original result.
    #[error(
        "outcome unknown for idempotency key {key:?} ({reason}); to learn it, call again with the same key and command"
    )]
    KeyOutcomeUnknown { key: String, reason: String },
    /// A claim's complete, extend or release: this holder's fence no
    /// longer holds the key — a later claim took over after its lease ran
    /// out (`current_fence` is the new holder's), or this fence's claim is
    /// finished already: released, or completed (with another result, for
    /// a complete), and then `current_fence` is the caller's own. Nothing
    /// was recorded. Final for this holder: stop.
    #[error(
        "fenced: the key's fence is now {current_fence}: a later claim took over, or, if that is \
         this holder's own fence, its claim is finished already (released, or completed with \
         another result); nothing was recorded"
    )]
    Fenced { current_fence: u64 },
    /// `once` (or a claim the caller waits on): another holder's lease was
    /// still live when the caller's patience ran out. Nothing ran in this
    /// call; claim again after `retry_after_ms`.
    #[error("another holder's claim is in progress; retry after {retry_after_ms} ms")]
    ClaimInProgress { retry_after_ms: u64 },
    /// `execute_plain` (at-least-once, no session, no key): an attempt was
    /// sent that may have been applied — and may still be — but no answer
    /// came before the deadline, or a retry was refused for good. Nothing
    /// can fence it or learn its outcome but reading the data.
    #[error(
        "outcome unknown (at-least-once, no session): {reason}; it may have taken effect, and may still"
    )]
    PlainOutcomeUnknown { reason: String },
}

impl Error {
    /// The error's stable name: the names the CLI's `--json` output gives
    /// in its `kind` field (scripts match on them, so they never change).
    /// Every unknown outcome, a session's, a key's or a plain call's, is
    /// `outcome_unknown`.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::OutcomeUnknown { .. }
            | Error::KeyOutcomeUnknown { .. }
            | Error::PlainOutcomeUnknown { .. } => "outcome_unknown",
            Error::Unavailable(_) => "unavailable",
            Error::SessionExpired => "session_expired",
            Error::WrongCluster { .. } => "wrong_cluster",
            Error::SeqConflict { .. } => "seq_conflict",
            Error::ResponseDiscarded { .. } => "response_discarded",
            Error::InvalidArgument(_) => "invalid_argument",
            Error::Unauthenticated(_) => "unauthenticated",
            Error::PermissionDenied(_) => "permission_denied",
            Error::ResourceExhausted(_) => "resource_exhausted",
            Error::LimitExceeded { .. } => "limit_exceeded",
            Error::KeyConflict { .. } => "key_conflict",
            Error::Fenced { .. } => "fenced",
            Error::ClaimInProgress { .. } => "in_progress",
        }
    }

    /// The one mapping of a cluster's refusal to an error: the reason in
    /// `status`'s detail (as `oncekv_wire::status` spells it), for the
    /// request numbered `seq` (0 when it has none). A "this attempt" reason
    /// (not the leader, cannot serve now, beyond the window) is
    /// [`Error::Unavailable`], a capacity limit [`Error::ResourceExhausted`],
    /// and `KEY_CONFLICT` an [`Error::KeyConflict`] naming no key (the
    /// caller knows it). `None` when the status carries no reason: it failed
    /// below the service (a transport failure, say), and what that means is
    /// the caller's to say.
    pub fn from_reason(status: &tonic::Status, seq: u64) -> Option<Error> {
        let detail = error_detail(status)?;
        let message = || status.message().to_string();
        Some(match detail.reason() {
            // (`Unspecified` never arrives: `error_detail` drops it.)
            Reason::Unspecified
            | Reason::NotLeader
            | Reason::Unavailable
            | Reason::TooManyOutstanding => Error::Unavailable(message()),
            // Admin only (a learner behind the leader's log): final for
            // the call, which the policy's verdict says; nothing else of
            // this library sees it.
            Reason::NotCaughtUp => Error::Unavailable(message()),
            Reason::ResourceExhausted => Error::ResourceExhausted(message()),
            Reason::SessionExpired => Error::SessionExpired,
            Reason::WrongCluster => Error::WrongCluster {
                expected: hex(&detail.expected_cluster_id),
            },
            Reason::SeqConflict => Error::SeqConflict { seq },
            Reason::ResponseDiscarded => Error::ResponseDiscarded {
                seq,
                floor: detail.floor,
            },
            Reason::InvalidArgument => Error::InvalidArgument(message()),
            Reason::LimitExceeded => match Limit::from_name(&detail.limit) {
                Some(limit) => Error::LimitExceeded {
                    limit,
                    max: detail.limit_max,
                    requested: detail.limit_requested,
                },
                // A limit this build does not know: still final.
                None => Error::InvalidArgument(message()),
            },
            Reason::PermissionDenied => Error::PermissionDenied(message()),
            Reason::Unauthenticated => Error::Unauthenticated(message()),
            Reason::KeyConflict => Error::KeyConflict { key: String::new() },
            Reason::Fenced => Error::Fenced {
                current_fence: detail.current_fence,
            },
        })
    }
}

impl From<LimitExceeded> for Error {
    fn from(exceeded: LimitExceeded) -> Error {
        Error::LimitExceeded {
            limit: exceeded.limit,
            max: exceeded.max,
            requested: exceeded.requested,
        }
    }
}

/// What [`Client::execute_with_key`] returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyedReply {
    /// The command's result: this call's, or the original one.
    pub result: CommandResult,
    /// Answered from the key's record: a request with this key had already
    /// executed (an earlier attempt of this call, or an earlier call), and
    /// nothing executed now.
    pub duplicate: bool,
    /// Log index of the entry that carried the answered attempt.
    pub log_index: u64,
}

/// Tuning of a [`Client`].
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Overall deadline of one call, retries included.
    pub call_timeout: Duration,
    /// Deadline of one attempt (then the next attempt, maybe elsewhere).
    pub attempt_timeout: Duration,
    pub backoff: Backoff,
    /// Keep-alives are sent when idle for this fraction of the TTL.
    pub keep_alive_fraction: f64,
    /// Told about every attempt of every `execute` (none by default).
    pub observer: Option<AttemptObserver>,
    /// TLS and token to show the nodes (none by default: plain
    /// connections to a node without authentication). The session belongs
    /// to the principal these credentials name (rule 19).
    pub credentials: Credentials,
}

/// One step of one attempt of an `execute` call, as an [`AttemptObserver`]
/// sees it: which (client id, seq) went where, and how that attempt ended.
/// Lets a harness or a metrics layer see the retries the library makes
/// internally (an attempt answered as a duplicate is a retry of a request
/// that had already been applied).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptEvent {
    pub client_id: u64,
    pub seq: u64,
    /// 0 for the first attempt of the call, then 1, 2, ...
    pub attempt: u32,
    /// The endpoint (`host:port`) the attempt was sent to.
    pub endpoint: String,
    pub outcome: AttemptOutcome,
}

/// What an [`AttemptEvent`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// The attempt is about to be sent.
    Started,
    /// The node answered with a result; `duplicate` when it came from the
    /// registry's cache (the command had already been executed).
    Answered { duplicate: bool, log_index: u64 },
    /// This attempt failed; the call retries the same request (or, at its
    /// deadline, reports the outcome as unknown).
    Retry { reason: String },
    /// A final error: the call ends with it.
    Final { reason: String },
}

/// A callback told synchronously about every attempt of every `execute`;
/// it must be cheap and must not block (it runs on the calling task).
#[derive(Clone)]
pub struct AttemptObserver(pub Arc<dyn Fn(&AttemptEvent) + Send + Sync>);

impl AttemptObserver {
    pub fn new(callback: impl Fn(&AttemptEvent) + Send + Sync + 'static) -> AttemptObserver {
        AttemptObserver(Arc::new(callback))
    }
}

impl std::fmt::Debug for AttemptObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AttemptObserver(..)")
    }
}

impl Default for ClientConfig {
    fn default() -> ClientConfig {
        ClientConfig {
            call_timeout: Duration::from_secs(10),
            attempt_timeout: Duration::from_secs(2),
            backoff: Backoff::default(),
            keep_alive_fraction: 1.0 / 3.0,
            observer: None,
            credentials: Credentials::none(),
        }
    }
}

/// A handle on the cluster; cheap to clone and share across tasks.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    config: ClientConfig,
    channels: Mutex<BTreeMap<String, ClientClient<AuthChannel>>>,
    /// The endpoints and the one believed to lead.
    follower: Follower,
    cluster_id: Mutex<Vec<u8>>,
    session: tokio::sync::Mutex<Option<Arc<Session>>>,
}

/// One registered session.
struct Session {
    client_id: u64,
    cluster_id: Vec<u8>,
    /// The session TTL as last heard from the cluster (at register, then
    /// at every keep-alive): keep-alives are paced by it.
    ttl_ms: std::sync::atomic::AtomicU64,
    seqs: Mutex<Seqs>,
    /// The request limits as last heard from the cluster (at register, then
    /// at every keep-alive); `None` from a server that does not send them.
    limits: Mutex<Option<RequestLimits>>,
    /// Signalled whenever a seq finishes or the cluster confirms a floor
    /// (the window may have opened).
    finished: Notify,
    /// The session is expired, or unusable (its floor refused as beyond
    /// the bound): no new call uses it.
    expired: std::sync::atomic::AtomicBool,
    /// When the cluster last refreshed the session's activity: an answered
    /// execute or an accepted keep-alive (a refused request refreshes
    /// nothing), so keep-alives are paced by what the cluster counts.
    last_refreshed: Mutex<Instant>,
}

/// How one attempt ended.
enum Attempt<T> {
    Done(T),
    /// Retry the same request (this attempt failed), maybe elsewhere.
    Retry {
        status: tonic::Status,
        hint: Option<String>,
    },
    Final(tonic::Status),
}

/// Why [`Client::execute_seq`] ended without a result.
enum SeqError {
    /// The call's error.
    Call(Error),
    /// The session is unusable (its floor refused as beyond the bound) and
    /// nothing of this request can have run: the refusal.
    Unusable(String),
}

impl From<SeqError> for Error {
    fn from(error: SeqError) -> Error {
        match error {
            SeqError::Call(error) => error,
            // Nothing ran: a definite refusal.
            SeqError::Unusable(refusal) => Error::InvalidArgument(refusal),
        }
    }
}

/// How a call retried with the same request ([`Client::send_retried`])
/// ended, and whether any attempt may have reached a leader that applies
/// it ([`may_have_reached`]).
enum Sent<T> {
    Answered(T),
    /// The last attempt was refused for good; `reached` is about the
    /// attempts before it.
    Refused {
        status: tonic::Status,
        reached: bool,
    },
    /// The deadline passed while every attempt failed for that attempt only.
    GaveUp {
        failures: Failures,
        last: tonic::Status,
        reached: bool,
    },
    /// The next attempt could not be made (no endpoint, a malformed one).
    Unsendable {
        error: Error,
        reached: bool,
    },
}

/// A keyed or claim call's [`Sent`] once [`Sent::keyed_fate`] has taken the
/// attempts that ran out of time or could not be made.
enum Decided<T> {
    Answered(T),
    Refused {
        status: tonic::Status,
        reached: bool,
    },
}

impl<T> Sent<T> {
    /// A keyed or claim call that ran out of time or could not send again:
    /// its fate can be learnt (the same key again), so it is `unknown` —
    /// but for a capacity limit that refused every attempt before any
    /// could have run, said as such, and for an attempt that could not be
    /// made when no earlier one may have been applied. An answer or a
    /// refusal is left to the caller.
    fn keyed_fate(self, unknown: impl Fn(String) -> Error) -> Result<Decided<T>, Error> {
        match self {
            Sent::Answered(reply) => Ok(Decided::Answered(reply)),
            Sent::Refused { status, reached } => Ok(Decided::Refused { status, reached }),
            Sent::GaveUp {
                failures, reached, ..
            } => Err(failures
                .exhausted_before_any_reach(reached)
                .unwrap_or_else(|| unknown(failures.reason()))),
            Sent::Unsendable { error, reached } => Err(if reached {
                unknown(format!(
                    "{error} (after an attempt that may have been applied)"
                ))
            } else {
                error
            }),
        }
    }
}

/// Whether a failed attempt may have reached a leader that applies it, now
/// or later (rule 22). Only three failures prove it did not: a refusal the
/// registry made when that attempt's entry applied (`TOO_MANY_OUTSTANDING`,
/// `RESOURCE_EXHAUSTED`: the entry is spent, nothing executed), a
/// `NOT_LEADER` whose node says it proposed nothing (`nothing_proposed`: it
/// did not lead when the request came), and a connection refused (nothing
/// was sent). Everything else may have: a timeout or a broken connection;
/// `UNAVAILABLE` (a proposal that ended without an answer, an entry still
/// to commit); any other `NOT_LEADER`, which a node also answers after
/// appending the entry, when a leader change drops or purges it
/// (openraft's `LogEntryDiscarded`). Stricter than
/// [`policy::may_have_applied`], which judges idempotent and admin calls.
pub(crate) fn may_have_reached(status: &tonic::Status) -> bool {
    match error_detail(status) {
        Some(detail) => match detail.reason() {
            Reason::TooManyOutstanding | Reason::ResourceExhausted => false,
            Reason::NotLeader => !detail.nothing_proposed,
            _ => true,
        },
        None => !connection_refused(status),
    }
}

/// An attempt given less than this before the deadline would be cut off
/// in flight (a loopback round trip with the leader's and a follower's
/// `fdatasync` takes about a millisecond; a loaded machine, tens) — or
/// less than twice the slowest attempt of the call so far, whichever is
/// more.
const MIN_ATTEMPT_TIME: Duration = Duration::from_millis(20);

/// Whether a failed Unregister still shows the session ended: the cluster
/// refused it for good as unknown or expired (SESSION_EXPIRED), which a
/// retry meets when its first attempt applied and the reply was lost.
fn session_is_gone(error: &CallError) -> bool {
    matches!(error, CallError::Final(status)
        if error_detail(status).is_some_and(|detail| detail.reason() == Reason::SessionExpired))
}

/// Whether `status` reports a connection the peer refused (nothing sent):
/// an `io::Error` of kind `ConnectionRefused` somewhere in its sources.
fn connection_refused(status: &tonic::Status) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    // A chain is a few errors deep; the bound only guards against a cycle.
    for _ in 0..16 {
        let Some(error) = source else {
            return false;
        };
        if let Some(io) = error.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return true;
        }
        source = error.source();
    }
    false
}

/// The reason of an unknown outcome whose last attempt was refused for
/// good (`refusal`) after an earlier one that may have been applied.
fn refused_after_send(refusal: &dyn std::fmt::Display) -> String {
    format!("a retry was refused ({refusal}) after an earlier attempt that may have been applied")
}

/// What a refusal for good of `seq` means to the caller, given whether an
/// earlier attempt may have reached a leader (`reached`, rule 22). A
/// refusal without a registry reason (a transport or server fault) may
/// itself have followed the log: unknown. With `reached`, every refusal is
/// unknown but the two that prove nothing ran for the seq — its cached
/// `LIMIT_EXCEEDED` and `SEQ_CONFLICT`. An expiry, or a floor refused as
/// beyond the bound, makes the session unusable either way.
fn final_execute_error(
    session: &Session,
    status: &tonic::Status,
    seq: u64,
    reached: bool,
) -> Error {
    let Some(error) = Error::from_reason(status, seq) else {
        return Error::OutcomeUnknown {
            seq,
            reason: format!("{:?}: {}", status.code(), status.message()),
            fenced: false,
        };
    };
    if error == Error::SessionExpired || refuses_floor_bound(status) {
        session.unusable();
    }
    match error {
        Error::LimitExceeded { .. } | Error::SeqConflict { .. } => error,
        error if !reached => error,
        error => Error::OutcomeUnknown {
            seq,
            reason: refused_after_send(&error),
            fenced: false,
        },
    }
}

/// What a refusal for good of an `execute_with_key` call means, given
/// whether an earlier attempt may have reached a leader (`reached`). With
/// it, every refusal is unknown but those that prove this command did not
/// run with this key: `KEY_CONFLICT` (the key's record holds another
/// command; had an attempt of this one executed, its record would answer
/// every retry as a duplicate) and a command's `LIMIT_EXCEEDED` (the key's
/// recorded answer). A key longer than `idempotency_key_bytes_max` is
/// judged before the record is looked up, so after a send it proves
/// nothing (the limit may have been lowered since an attempt executed).
fn final_keyed_error(status: &tonic::Status, key: &str, reached: bool) -> Error {
    refusal_of_key(
        status,
        key,
        reached,
        |error| matches!(error, Error::LimitExceeded { limit, .. } if *limit != Limit::IdempotencyKeyBytes),
    )
}

/// A refusal for good of a call named by `key` (keyed or claim), given
/// whether an earlier attempt may have reached a leader (`reached`): with
/// it, every refusal is [`Error::KeyOutcomeUnknown`] naming the refusal
/// but `KEY_CONFLICT` (the key's record holds another request) and those
/// `proves_not_run` says prove this request did not run. A refusal with no
/// registry reason came from below the registry: this attempt may have
/// reached the log, unknown either way.
pub(crate) fn refusal_of_key(
    status: &tonic::Status,
    key: &str,
    reached: bool,
    proves_not_run: impl Fn(&Error) -> bool,
) -> Error {
    let unknown = |reason: String| Error::KeyOutcomeUnknown {
        key: key.to_string(),
        reason,
    };
    let Some(error) = Error::from_reason(status, 0) else {
        return unknown(format!("{:?}: {}", status.code(), status.message()));
    };
    match error {
        Error::KeyConflict { .. } => Error::KeyConflict {
            key: key.to_string(),
        },
        error if !reached || proves_not_run(&error) => error,
        error => unknown(refused_after_send(&error)),
    }
}

/// An attempt's answer or failure, by the one policy ([`policy::verdict`]).
fn classify<T>(result: Result<T, tonic::Status>) -> Attempt<T> {
    match result {
        Ok(reply) => Attempt::Done(reply),
        Err(status) => match policy::verdict(&status) {
            Verdict::Retry { hint } => Attempt::Retry { status, hint },
            Verdict::Final => Attempt::Final(status),
        },
    }
}

/// A final refusal of the request numbered `seq` (0 when none): its
/// reason's error ([`Error::from_reason`]); with no reason, the status's own
/// words as an invalid argument.
fn final_error(status: &tonic::Status, seq: u64) -> Error {
    Error::from_reason(status, seq)
        .unwrap_or_else(|| Error::InvalidArgument(status.message().to_string()))
}

/// The error of an idempotent call (no seq) on the leader that failed
/// ([`Client::on_leader`]): a refusal for good is itself, whichever node
/// made it; at the deadline, the most informative failure the call met
/// ([`policy::informativeness`]) decides.
fn give_up(error: CallError) -> Error {
    match error {
        CallError::Final(status) => final_error(&status, 0),
        // A capacity limit that stayed reached until the deadline is said
        // so (the caller backs off), not hidden behind "unavailable" or a
        // follower's "not the leader" met on the way.
        CallError::GaveUp { status, .. } => match Error::from_reason(&status, 0) {
            Some(exhausted @ Error::ResourceExhausted(_)) => exhausted,
            _ => Error::Unavailable(status.to_string()),
        },
    }
}

/// A short machine-readable reason of a failed attempt: the registry's
/// reason when the status carries one, else the gRPC code.
fn status_reason(status: &tonic::Status) -> String {
    match error_detail(status) {
        Some(detail) => detail.reason().as_str_name().to_string(),
        None => format!("{:?}", status.code()),
    }
}

/// The failed attempts of one call, so that an unknown outcome reports the
/// most informative reason seen, not merely the last one (a call refused
/// for a capacity limit whose last attempt met an election would otherwise
/// say "not the leader").
#[derive(Debug, Default)]
struct Failures {
    /// The most informative failure so far (the latest among equals).
    best: Option<(u8, String)>,
    last: Option<String>,
    count: u32,
    /// The latest refusal by a capacity limit, if any.
    exhausted: Option<tonic::Status>,
    /// When the attempt in flight started, if known (from the second
    /// attempt on: see `exhausted_and_out_of_time`).
    attempt_started: Option<Instant>,
    /// The slowest attempt measured.
    slowest_attempt: Duration,
}

impl Failures {
    fn note(&mut self, status: &tonic::Status) {
        if let Some(started) = self.attempt_started.take() {
            self.slowest_attempt = self.slowest_attempt.max(started.elapsed());
        }
        let text = match error_detail(status) {
            Some(_) => status.message().to_string(),
            None => format!("{:?}: {}", status.code(), status.message()),
        };
        policy::keep_most_telling(&mut self.best, status, || text.clone());
        self.last = Some(text);
        self.count += 1;
        if error_detail(status).is_some_and(|detail| detail.reason() == Reason::ResourceExhausted) {
            self.exhausted = Some(status.clone());
        }
    }

    /// The error of a call whose deadline passed after a capacity limit
    /// refused its attempts, when none of them may have reached a leader
    /// that applies it (`reached` false): nothing ran, so the caller is told
    /// the limit and backs off (docs/http.md's 429, the CLI's
    /// `resource_exhausted`) instead of hearing "unknown". `None` otherwise.
    pub(crate) fn exhausted_before_any_reach(&self, reached: bool) -> Option<Error> {
        if reached {
            return None;
        }
        Error::from_reason(self.exhausted.as_ref()?, 0)
    }

    /// After the backoff that follows a failed attempt, right before the
    /// next: the same, when too little time is left for another attempt —
    /// less than [`MIN_ATTEMPT_TIME`] or twice the slowest attempt so far —
    /// which the deadline would likely cut off in flight, turning "refused,
    /// nothing ran" into "unknown". Otherwise `None`, and the next attempt
    /// is timed from now.
    pub(crate) fn exhausted_and_out_of_time(
        &mut self,
        reached: bool,
        deadline: Instant,
    ) -> Option<Error> {
        let now = Instant::now();
        let needed = MIN_ATTEMPT_TIME.max(self.slowest_attempt.saturating_mul(2));
        if deadline.saturating_duration_since(now) >= needed {
            self.attempt_started = Some(now);
            return None;
        }
        self.exhausted_before_any_reach(reached)
    }

    /// The reason to report: the most informative failure, and the last one
    /// when it differs.
    fn reason(&self) -> String {
        match (&self.best, &self.last) {
            (Some((_, best)), Some(last)) if best != last => format!(
                "{best} (the last of {} failed attempts: {last})",
                self.count
            ),
            (Some((_, best)), _) => best.clone(),
            (None, _) => "no attempt was answered".into(),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

impl Client {
    /// A client of the cluster reachable at `endpoints` (`host:port` of
    /// any members); nothing is contacted until the first call.
    pub fn connect<I, S>(endpoints: I) -> Client
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Client::with_config(endpoints, ClientConfig::default())
    }

    pub fn with_config<I, S>(endpoints: I, config: ClientConfig) -> Client
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let endpoints = endpoints.into_iter().map(Into::into).collect();
        Client {
            inner: Arc::new(Inner {
                follower: Follower::new(endpoints, config.backoff),
                config,
                channels: Mutex::new(BTreeMap::new()),
                cluster_id: Mutex::new(Vec::new()),
                session: tokio::sync::Mutex::new(None),
            }),
        }
    }

    pub async fn put(&self, key: &[u8], value: Value) -> Result<(), Error> {
        self.execute(Command::Put {
            key: key.to_vec(),
            value,
        })
        .await
        .map(drop)
    }

    /// Deletes `key`; returns whether it existed.
    pub async fn delete(&self, key: &[u8]) -> Result<bool, Error> {
        match self.execute(Command::Delete { key: key.to_vec() }).await? {
            CommandResult::Deleted { existed } => Ok(existed),
            other => Err(unexpected(other)),
        }
    }

    /// Adds `delta`; returns the application result (the new value, an
    /// overflow or a wrong type).
    pub async fn increment_result(&self, key: &[u8], delta: i64) -> Result<CommandResult, Error> {
        self.execute(Command::Increment {
            key: key.to_vec(),
            delta,
        })
        .await
    }

    /// Adds `delta` and returns the new value; an overflow or a wrong type
    /// becomes `InvalidArgument` (use `increment_result` to see them).
    pub async fn increment(&self, key: &[u8], delta: i64) -> Result<i64, Error> {
        match self.increment_result(key, delta).await? {
            CommandResult::Incremented { value } => Ok(value),
            other => Err(Error::InvalidArgument(format!("increment: {other:?}"))),
        }
    }

    /// Appends `element`; returns the list's new length.
    pub async fn append(&self, key: &[u8], element: &[u8]) -> Result<CommandResult, Error> {
        self.execute(Command::Append {
            key: key.to_vec(),
            element: element.to_vec(),
        })
        .await
    }

    /// Stores `new` if the value is `expected` (`None`: absent); returns
    /// whether it swapped and the value now stored.
    pub async fn compare_and_swap(
        &self,
        key: &[u8],
        expected: Option<Value>,
        new: Value,
    ) -> Result<(bool, Option<Value>), Error> {
        match self
            .execute(Command::CompareAndSwap {
                key: key.to_vec(),
                expected,
                new,
            })
            .await?
        {
            CommandResult::CompareAndSwap { swapped, current } => Ok((swapped, current)),
            other => Err(unexpected(other)),
        }
    }

    /// A linearizable read through the leader.
    pub async fn get(&self, key: &[u8]) -> Result<Option<Value>, Error> {
        check_key(key)?;
        let deadline = self.deadline();
        let cluster_id = self.cluster_id(deadline).await?;
        let request = proto::ReadRequest {
            cluster_id,
            key: key.to_vec(),
        };
        let reply = self
            .on_leader(deadline, |mut client| {
                let request = request.clone();
                async move { client.read(request).await.map(|r| r.into_inner()) }
            })
            .await
            .map_err(give_up)?;
        reply
            .value
            .map(|value| {
                convert::value_from_proto(value).map_err(|e| Error::InvalidArgument(e.to_string()))
            })
            .transpose()
    }

    /// Executes `command` exactly once (or reports that its outcome is
    /// unknown), retrying the same request until the call's deadline.
    ///
    /// A session the cluster refuses as unusable (its floor beyond what it
    /// may fence, `FloorBeyondBound`) is dropped; when nothing of this
    /// request can have run — that refusal came before any attempt that may
    /// have reached a leader — the command is sent once more, as a new
    /// request of a new session. A request whose outcome is unknown is never
    /// re-sent under a new session (rule 9).
    pub async fn execute(&self, command: Command) -> Result<CommandResult, Error> {
        check_key(command.key())?;
        let deadline = Instant::now() + self.inner.config.call_timeout;
        let proto_command = convert::command_to_proto(&command);
        // The command field of the request (`ExecuteRequest.command`, tag
        // 5), measured once, without building the request around it.
        let command_bytes = prost::encoding::message::encoded_len(5, &proto_command);
        let mut sessions_tried = 0;
        loop {
            let session = self.session(deadline).await?;
            sessions_tried += 1;
            self.check_request_limits(&session, &command).await?;
            // The largest the request can be encoded, before a seq is taken:
            // the other fields at their longest, plus the command.
            let envelope = proto::ExecuteRequest {
                cluster_id: session.cluster_id.clone(),
                client_id: session.client_id,
                seq: u64::MAX,
                first_outstanding_seq: u64::MAX,
                command: None,
            };
            check_encoded_size(prost::Message::encoded_len(&envelope) + command_bytes)?;
            let seq = self.take_seq(&session, deadline).await?;
            let span = tracing::debug_span!("execute", client_id = session.client_id, seq);
            let result = self
                .execute_seq(&session, seq, &proto_command, deadline)
                .instrument(span)
                .await;
            session.finish(seq);
            let result = match result {
                Err(SeqError::Call(Error::OutcomeUnknown { seq, reason, .. })) => {
                    // Fence: commit the raised floor before reporting, so a
                    // late copy of this request can never execute.
                    let fenced = !session.is_expired() && self.fence(&session, seq).await;
                    Some(Err(Error::OutcomeUnknown {
                        seq,
                        reason,
                        fenced,
                    }))
                }
                Err(SeqError::Unusable(refusal)) if sessions_tried < 2 => {
                    tracing::info!(
                        client_id = session.client_id,
                        %refusal,
                        "the session is unusable; registering a new one"
                    );
                    None
                }
                other => Some(other.map_err(Error::from)),
            };
            if session.is_expired() {
                self.drop_session(&session).await;
            }
            if let Some(result) = result {
                return result;
            }
        }
    }

    /// Takes the next seq of `session` once the window has room (until
    /// `deadline`). Room held by requests given up but not yet fenced — the
    /// floor may move at most a window past the last one the cluster
    /// confirmed — is freed by fencing them: a keep-alive the cluster
    /// acknowledges.
    async fn take_seq(&self, session: &Arc<Session>, deadline: Instant) -> Result<u64, Error> {
        loop {
            let notified = session.finished.notified();
            if let Some(seq) = session.try_begin() {
                return Ok(seq);
            }
            let mut until = deadline;
            if session.fence_pending() {
                let fence_deadline =
                    deadline.min(Instant::now() + self.inner.config.attempt_timeout);
                if self.keep_alive(session, fence_deadline).await.is_some() {
                    continue;
                }
                // Not acknowledged: try again after a pause, or sooner if
                // a call of this session finishes.
                until = deadline.min(Instant::now() + self.inner.config.backoff.cap);
            }
            let _ = tokio::time::timeout_at(until, notified).await;
            if Instant::now() >= deadline {
                return Err(Error::Unavailable(if session.fence_pending() {
                    "the session's window stayed full: requests given up earlier wait for a \
                     fence the cluster did not acknowledge"
                        .into()
                } else {
                    "the session's window stayed full".into()
                }));
            }
        }
    }

    /// Fences `seq`, given up: commits, with keep-alives, a floor past it.
    /// True once the cluster acknowledged one. False when an earlier seq
    /// still in flight holds the floor (the next request carries it) or
    /// the cluster did not answer. The floor sent moves at most a window
    /// past the confirmed one per acknowledgement, and a seq is taken less
    /// than two windows past it, so two keep-alives always suffice; each
    /// has one attempt timeout.
    async fn fence(&self, session: &Arc<Session>, seq: u64) -> bool {
        for _ in 0..3 {
            if session.first_outstanding() <= seq && !session.fence_pending() {
                return false;
            }
            let deadline = Instant::now() + self.inner.config.attempt_timeout;
            match self.keep_alive(session, deadline).await {
                Some(floor) if floor > seq => return true,
                Some(_) => {}
                None => return false,
            }
        }
        false
    }

    /// Refuses, before a seq is taken or anything is sent, a command that
    /// breaks a request limit. The session's limits may be stale (config
    /// changes after its register or last keep-alive): a command they
    /// refuse is checked again against the limits a keep-alive returns now,
    /// so a raised limit never refuses a request wrongly. If that keep-alive
    /// fails, the command is sent and the cluster decides.
    async fn check_request_limits(
        &self,
        session: &Arc<Session>,
        command: &Command,
    ) -> Result<(), Error> {
        let Some(limits) = session.limits() else {
            return Ok(());
        };
        let deadline = Instant::now() + self.inner.config.attempt_timeout;
        if limits.check(command).is_ok() || self.keep_alive(session, deadline).await.is_none() {
            return Ok(());
        }
        match session.limits() {
            Some(limits) => limits.check(command).map_err(Error::from),
            None => Ok(()),
        }
    }

    async fn execute_seq(
        &self,
        session: &Arc<Session>,
        seq: u64,
        proto_command: &proto::Command,
        deadline: Instant,
    ) -> Result<CommandResult, SeqError> {
        let mut attempt: u32 = 0;
        let mut failures = Failures::default();
        // Whether an attempt so far may have reached a leader that applies
        // it (rule 22): from then on only proof says "not executed".
        let mut reached = false;
        loop {
            let request = proto::ExecuteRequest {
                cluster_id: session.cluster_id.clone(),
                client_id: session.client_id,
                seq,
                first_outstanding_seq: session.first_outstanding(),
                command: Some(proto_command.clone()),
            };
            let floor_sent = request.first_outstanding_seq;
            let answer = match self
                .execute_attempt(session, request, attempt, deadline)
                .await
            {
                Ok(answer) => answer,
                Err(error) if !reached => return Err(SeqError::Call(error)),
                Err(error) => {
                    return Err(SeqError::Call(Error::OutcomeUnknown {
                        seq,
                        reason: format!("{error} (after an attempt that may have been applied)"),
                        fenced: false,
                    }));
                }
            };
            match answer {
                Attempt::Done(reply) => {
                    // Applied: the session's floor is at least the one sent
                    // and the seq's answer is cached (the bound is past both).
                    session.confirm(floor_sent.max(seq.saturating_add(1)));
                    session.refreshed();
                    // Executed, but the answer is unreadable: unknown to us.
                    return convert::result_from_proto(reply.into_inner().result).map_err(
                        |error| {
                            SeqError::Call(Error::OutcomeUnknown {
                                seq,
                                reason: format!("undecodable reply: {error}"),
                                fenced: false,
                            })
                        },
                    );
                }
                Attempt::Final(status) => {
                    if error_detail(&status)
                        .is_some_and(|detail| detail.reason() == Reason::LimitExceeded)
                    {
                        // The refusal is the seq's cached answer.
                        session.confirm(floor_sent.max(seq.saturating_add(1)));
                    }
                    if refuses_floor_bound(&status) && !reached {
                        session.unusable();
                        return Err(SeqError::Unusable(status.message().to_string()));
                    }
                    return Err(SeqError::Call(final_execute_error(
                        session, &status, seq, reached,
                    )));
                }
                Attempt::Retry { status, hint } => {
                    failures.note(&status);
                    reached |= may_have_reached(&status);
                    if Instant::now() >= deadline {
                        if let Some(exhausted) = failures.exhausted_before_any_reach(reached) {
                            return Err(SeqError::Call(exhausted));
                        }
                        return Err(SeqError::Call(Error::OutcomeUnknown {
                            seq,
                            reason: failures.reason(),
                            fenced: false,
                        }));
                    }
                    self.inner
                        .follower
                        .follow(hint.as_deref(), attempt, deadline)
                        .await;
                    if let Some(exhausted) = failures.exhausted_and_out_of_time(reached, deadline) {
                        return Err(SeqError::Call(exhausted));
                    }
                }
            }
            attempt += 1;
        }
    }

    /// Sends attempt number `attempt` of `request` to the leader as we
    /// know it, within its share of `deadline`, tells the observer (if
    /// any) that it started and how it ended, and classifies the answer by
    /// the one policy.
    async fn execute_attempt(
        &self,
        session: &Session,
        request: proto::ExecuteRequest,
        attempt: u32,
        deadline: Instant,
    ) -> Result<Attempt<tonic::Response<proto::ExecuteReply>>, Error> {
        let seq = request.seq;
        let target = self.leader_endpoint()?;
        let mut client = self.channel(&target)?;
        let mut call = tonic::Request::new(request);
        call.set_timeout(self.attempt_timeout(deadline));
        tracing::trace!(attempt, endpoint = %target, "attempt");
        let observe = |outcome: AttemptOutcome| {
            if let Some(observer) = &self.inner.config.observer {
                (observer.0)(&AttemptEvent {
                    client_id: session.client_id,
                    seq,
                    attempt,
                    endpoint: target.clone(),
                    outcome,
                });
            }
        };
        observe(AttemptOutcome::Started);
        let answer = match classify(client.execute(call).await) {
            // A refusal only the leader makes: the next attempt goes there.
            Attempt::Retry { status, hint } => Attempt::Retry {
                hint: policy::next_hint(&target, &status, hint),
                status,
            },
            answer => answer,
        };
        observe(match &answer {
            Attempt::Done(reply) => AttemptOutcome::Answered {
                duplicate: reply.get_ref().duplicate,
                log_index: reply.get_ref().log_index,
            },
            Attempt::Retry { status, .. } => AttemptOutcome::Retry {
                reason: status_reason(status),
            },
            Attempt::Final(status) => AttemptOutcome::Final {
                reason: status_reason(status),
            },
        });
        Ok(answer)
    }

    /// Executes `command` with no session: AT-LEAST-ONCE. Retried on "this
    /// attempt" failures like any call, so a retry after a lost reply may
    /// apply it twice. A baseline for measuring what exactly-once costs.
    ///
    /// Once an attempt may have reached a leader that applies it, a call
    /// that ends without an answer — its deadline, or a retry refused for
    /// good — is [`Error::PlainOutcomeUnknown`]: it may have taken effect
    /// (and may still). [`Error::Unavailable`] and the other errors mean
    /// nothing was applied.
    pub async fn execute_plain(&self, command: Command) -> Result<CommandResult, Error> {
        check_key(command.key())?;
        let deadline = self.deadline();
        let request = proto::ExecutePlainRequest {
            cluster_id: self.cluster_id(deadline).await?,
            command: Some(convert::command_to_proto(&command)),
        };
        check_message_size(&request)?;
        let unknown = |reason: String| Error::PlainOutcomeUnknown { reason };
        let sent = self
            .send_retried(deadline, |mut client, call_timeout| {
                let mut call = tonic::Request::new(request.clone());
                call.set_timeout(call_timeout);
                async move { client.execute_plain(call).await }
            })
            .await;
        match sent {
            Sent::Answered(reply) => convert::result_from_proto(reply.into_inner().result)
                // Applied, but the answer is unreadable.
                .map_err(|error| unknown(format!("undecodable reply: {error}"))),
            Sent::Refused { status, reached } => Err(match Error::from_reason(&status, 0) {
                // Refused below the registry: this attempt may have been applied.
                None => unknown(format!("{:?}: {}", status.code(), status.message())),
                Some(error) if !reached => error,
                // Not even a limit the request breaks proves anything: an
                // earlier copy may have grown the list it refuses to grow.
                Some(error) => unknown(refused_after_send(&error)),
            }),
            Sent::GaveUp {
                failures,
                last,
                reached,
            } => Err(if reached {
                unknown(failures.reason())
            } else {
                failures
                    .exhausted_before_any_reach(reached)
                    .unwrap_or_else(|| {
                        give_up(CallError::GaveUp {
                            status: last,
                            maybe_applied: false,
                        })
                    })
            }),
            Sent::Unsendable { error, reached } => Err(if reached {
                unknown(format!(
                    "{error} (after an attempt that may have been applied)"
                ))
            } else {
                error
            }),
        }
    }

    /// Sends one request (`call`, given a client of the target and the
    /// attempt's timeout) to the leader as we know it until it is answered,
    /// refused for good or `deadline` passes — following hints and backing
    /// off like every call — and says how it ended and whether an attempt
    /// may have reached a leader that applies it.
    async fn send_retried<T, F, Fut>(&self, deadline: Instant, call: F) -> Sent<T>
    where
        F: Fn(ClientClient<AuthChannel>, Duration) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        let mut attempt: u32 = 0;
        let mut failures = Failures::default();
        let mut reached = false;
        loop {
            let target = match self.leader_endpoint() {
                Ok(target) => target,
                Err(error) => return Sent::Unsendable { error, reached },
            };
            let client = match self.channel(&target) {
                Ok(client) => client,
                Err(error) => return Sent::Unsendable { error, reached },
            };
            let timeout = self.attempt_timeout(deadline);
            let result = tokio::time::timeout(timeout, call(client, timeout))
                .await
                .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("attempt timed out")));
            match classify(result) {
                Attempt::Done(reply) => return Sent::Answered(reply),
                Attempt::Final(status) => return Sent::Refused { status, reached },
                Attempt::Retry { status, hint } => {
                    // A refusal only the leader makes: the next attempt goes there.
                    let hint = policy::next_hint(&target, &status, hint);
                    failures.note(&status);
                    reached |= may_have_reached(&status);
                    if Instant::now() >= deadline {
                        return Sent::GaveUp {
                            failures,
                            last: status,
                            reached,
                        };
                    }
                    self.inner
                        .follower
                        .follow(hint.as_deref(), attempt, deadline)
                        .await;
                    if failures
                        .exhausted_and_out_of_time(reached, deadline)
                        .is_some()
                    {
                        return Sent::GaveUp {
                            failures,
                            last: status,
                            reached,
                        };
                    }
                }
            }
            attempt += 1;
        }
    }

    /// Executes `command` exactly once per idempotency `key` (rule 18),
    /// with no session: the first request with the key that reaches the
    /// log executes; a repeat of the same command with the key — a retry of
    /// this call, or a later call — gets the original result with
    /// `duplicate` set. Every "this attempt" failure (NOT_LEADER,
    /// UNAVAILABLE, RESOURCE_EXHAUSTED, a deadline or lost connection) is
    /// retried with the same key and command, following leader hints with
    /// backoff, until the call's deadline; then the outcome is unknown
    /// ([`Error::KeyOutcomeUnknown`]) — and calling again with the same key
    /// and command learns it while the key lives.
    ///
    /// Errors: [`Error::KeyConflict`] when the key was used with another
    /// command (final); [`Error::LimitExceeded`] for a key longer than
    /// `idempotency_key_bytes_max` or a command that breaks a request limit
    /// (final); [`Error::InvalidArgument`] for an empty key or data key.
    pub async fn execute_with_key(
        &self,
        key: &[u8],
        command: Command,
    ) -> Result<KeyedReply, Error> {
        let key_text = String::from_utf8_lossy(key).into_owned();
        convert::idempotency_key_from_proto(key.to_vec())
            .map_err(|error| Error::InvalidArgument(error.to_string()))?;
        check_key(command.key())?;
        let deadline = self.deadline();
        let request = proto::ExecuteKeyedRequest {
            cluster_id: self.cluster_id(deadline).await?,
            idempotency_key: key.to_vec(),
            command: Some(convert::command_to_proto(&command)),
        };
        check_message_size(&request)?;
        let span = tracing::debug_span!("execute_with_key", key = %key_text);
        self.execute_keyed_attempts(request, &key_text, deadline)
            .instrument(span)
            .await
    }

    async fn execute_keyed_attempts(
        &self,
        request: proto::ExecuteKeyedRequest,
        key: &str,
        deadline: Instant,
    ) -> Result<KeyedReply, Error> {
        let unknown = |reason: String| Error::KeyOutcomeUnknown {
            key: key.to_string(),
            reason,
        };
        let sent = self
            .send_retried(deadline, |mut client, call_timeout| {
                let mut call = tonic::Request::new(request.clone());
                call.set_timeout(call_timeout);
                async move { client.execute_keyed(call).await }
            })
            .await;
        // The fate of a keyed call that ran out of time can be learnt:
        // unknown, whether or not an attempt may have been applied (see
        // `Sent::keyed_fate`).
        match sent.keyed_fate(unknown)? {
            Decided::Answered(reply) => {
                let reply = reply.into_inner();
                let result = convert::result_from_proto(reply.result)
                    .map_err(|error| unknown(format!("undecodable reply: {error}")))?;
                Ok(KeyedReply {
                    result,
                    duplicate: reply.duplicate,
                    log_index: reply.log_index,
                })
            }
            Decided::Refused { status, reached } => Err(final_keyed_error(&status, key, reached)),
        }
    }

    /// Ends the session; true when the cluster confirmed that it is gone
    /// (or there was none): the Unregister applied, or the cluster no
    /// longer knows the session (an earlier attempt of this close applied
    /// with its reply lost, or the session had expired). Best effort: an
    /// unconfirmed session simply expires later.
    pub async fn close(&self) -> bool {
        let session = self.inner.session.lock().await.take();
        let Some(session) = session else {
            return true;
        };
        let request = proto::UnregisterRequest {
            cluster_id: session.cluster_id.clone(),
            client_id: session.client_id,
        };
        // One attempt timeout of its own (docs/client.md): closing must not
        // hold a caller for a whole call timeout when the cluster is away.
        let deadline = Instant::now() + self.inner.config.attempt_timeout;
        self.on_leader(deadline, |mut client| {
            let request = request.clone();
            async move { client.unregister(request).await }
        })
        .await
        .map_or_else(|error| session_is_gone(&error), |_| true)
    }

    /// The deadline of a call starting now.
    fn deadline(&self) -> Instant {
        Instant::now() + self.inner.config.call_timeout
    }

    /// The client id of the current session, registering one if needed.
    pub async fn client_id(&self) -> Result<u64, Error> {
        let deadline = Instant::now() + self.inner.config.call_timeout;
        Ok(self.session(deadline).await?.client_id)
    }

    fn attempt_timeout(&self, deadline: Instant) -> Duration {
        deadline
            .saturating_duration_since(Instant::now())
            .min(self.inner.config.attempt_timeout)
            .max(Duration::from_millis(1))
    }

    fn leader_endpoint(&self) -> Result<String, Error> {
        self.inner
            .follower
            .target()
            .ok_or_else(|| Error::InvalidArgument("no endpoints given".into()))
    }

    fn channel(&self, endpoint: &str) -> Result<ClientClient<AuthChannel>, Error> {
        let mut channels = self
            .inner
            .channels
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(client) = channels.get(endpoint) {
            return Ok(client.clone());
        }
        let credentials = &self.inner.config.credentials;
        let channel = credentials
            .endpoint(endpoint)
            .map_err(|error| Error::InvalidArgument(format!("endpoint {endpoint}: {error}")))?
            .connect_timeout(Duration::from_secs(1))
            .tcp_nodelay(true)
            .connect_lazy();
        let client = ClientClient::new(credentials.wrap(channel))
            .max_decoding_message_size(oncekv_wire::CLIENT_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(oncekv_wire::CLIENT_MESSAGE_BYTES_MAX);
        channels.insert(endpoint.to_string(), client.clone());
        Ok(client)
    }

    /// Runs an idempotent call on the leader with retries until
    /// `deadline` (the one policy: [`Follower::call`]).
    async fn on_leader<T, F, Fut>(&self, deadline: Instant, call: F) -> Result<T, CallError>
    where
        F: Fn(ClientClient<AuthChannel>) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        let connect = |endpoint: &str| {
            self.channel(endpoint)
                .map_err(|error| tonic::Status::invalid_argument(error.to_string()))
        };
        let attempt_timeout = self.inner.config.attempt_timeout;
        self.inner
            .follower
            .call(deadline, attempt_timeout, connect, call)
            .await
            .0
    }

    /// The cluster's id, asked of any node once.
    async fn cluster_id(&self, deadline: Instant) -> Result<Vec<u8>, Error> {
        let known = self
            .inner
            .cluster_id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if !known.is_empty() {
            return Ok(known);
        }
        let status = self
            .on_leader(deadline, |mut client| async move {
                let status = client.status(proto::StatusRequest {}).await?.into_inner();
                if status.cluster_id.is_empty() {
                    // Ask the leader: it has applied the bootstrap entry.
                    return Err(policy::not_leader(status.leader_client_addr));
                }
                policy::leader_only(status)
            })
            .await
            .map_err(|error| match error {
                // A node's refusal for good is itself; anything else, or a
                // call that ran out of time, is a cluster out of reach.
                CallError::Final(status) => Error::from_reason(&status, 0)
                    .unwrap_or_else(|| Error::Unavailable(status.to_string())),
                gave_up @ CallError::GaveUp { .. } => give_up(gave_up),
            })?;
        *self
            .inner
            .cluster_id
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = status.cluster_id.clone();
        Ok(status.cluster_id)
    }

    /// The live session, registering one (idempotently) if there is none.
    async fn session(&self, deadline: Instant) -> Result<Arc<Session>, Error> {
        let mut slot = self.inner.session.lock().await;
        if let Some(session) = slot.as_ref()
            && !session.expired.load(std::sync::atomic::Ordering::SeqCst)
        {
            return Ok(session.clone());
        }
        let cluster_id = self.cluster_id(deadline).await?;
        #[allow(clippy::disallowed_methods)] // a nonce is random by definition (rule 2)
        let nonce: u128 = rand::random();
        let request = proto::RegisterRequest {
            cluster_id: cluster_id.clone(),
            nonce: nonce.to_be_bytes().to_vec(),
        };
        // Retried with the same nonce: a lost reply never leaks a session.
        let reply = self
            .on_leader(deadline, |mut client| {
                let request = request.clone();
                async move { client.register(request).await.map(|r| r.into_inner()) }
            })
            .await
            .map_err(give_up)?;
        tracing::debug!(client_id = reply.client_id, "session registered");
        let session = Arc::new(Session {
            client_id: reply.client_id,
            cluster_id: reply.cluster_id,
            ttl_ms: std::sync::atomic::AtomicU64::new(reply.session_ttl_ms),
            seqs: Mutex::new(Seqs::new(reply.window)),
            limits: Mutex::new(
                reply
                    .limits
                    .as_ref()
                    .map(convert::request_limits_from_proto),
            ),
            finished: Notify::new(),
            expired: std::sync::atomic::AtomicBool::new(false),
            last_refreshed: Mutex::new(Instant::now()),
        });
        self.spawn_keep_alive(Arc::downgrade(&session));
        *slot = Some(session.clone());
        Ok(session)
    }

    async fn drop_session(&self, expired: &Arc<Session>) {
        let mut slot = self.inner.session.lock().await;
        if slot
            .as_ref()
            .is_some_and(|current| Arc::ptr_eq(current, expired))
        {
            *slot = None;
        }
    }

    /// Sends keep-alives while the cluster has not refreshed the session
    /// for a fraction of its TTL (no answered execute, no accepted
    /// keep-alive: refused requests refresh nothing); after a keep-alive
    /// that failed, waits that long again. Stops when the session is gone.
    fn spawn_keep_alive(&self, session: Weak<Session>) {
        let client = Arc::downgrade(&self.inner);
        let fraction = self.inner.config.keep_alive_fraction;
        tokio::spawn(async move {
            loop {
                let Some(live) = session.upgrade() else {
                    return;
                };
                let ttl =
                    Duration::from_millis(live.ttl_ms.load(std::sync::atomic::Ordering::Relaxed));
                let period = ttl.mul_f64(fraction).max(Duration::from_millis(10));
                let idle = live
                    .last_refreshed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .elapsed();
                drop(live);
                if idle < period {
                    tokio::time::sleep(period - idle).await;
                    continue;
                }
                let (Some(inner), Some(live)) = (client.upgrade(), session.upgrade()) else {
                    return;
                };
                if live.is_expired() {
                    return;
                }
                let client = Client { inner };
                let deadline = Instant::now() + client.inner.config.attempt_timeout;
                if client.keep_alive(&live, deadline).await.is_none() {
                    drop((client, live));
                    tokio::time::sleep(period).await;
                }
            }
        });
    }

    /// Sends a keep-alive carrying the current floor, until `deadline`;
    /// the floor the cluster acknowledged once applied (which confirms it:
    /// [`Session::confirm`]). A keep-alive refused because the session
    /// expired, or because its floor is beyond what the session may fence,
    /// makes the session unusable.
    async fn keep_alive(&self, session: &Arc<Session>, deadline: Instant) -> Option<u64> {
        let request = proto::KeepAliveRequest {
            cluster_id: session.cluster_id.clone(),
            client_id: session.client_id,
            first_outstanding_seq: session.first_outstanding(),
        };
        let result = self
            .on_leader(deadline, |mut client| {
                let request = request.clone();
                async move { client.keep_alive(request).await }
            })
            .await;
        match result {
            Ok(reply) => {
                let reply = reply.into_inner();
                if reply.session_ttl_ms > 0 {
                    session
                        .ttl_ms
                        .store(reply.session_ttl_ms, std::sync::atomic::Ordering::Relaxed);
                }
                if let Some(limits) = &reply.limits {
                    *session.limits.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(convert::request_limits_from_proto(limits));
                }
                session.refreshed();
                session.confirm(reply.floor);
                Some(reply.floor)
            }
            Err(error) => {
                let status = error.status();
                if refuses_floor_bound(status)
                    || error_detail(status)
                        .is_some_and(|detail| detail.reason() == Reason::SessionExpired)
                {
                    session.unusable();
                }
                None
            }
        }
    }
}

impl Session {
    fn limits(&self) -> Option<RequestLimits> {
        *self.limits.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn first_outstanding(&self) -> u64 {
        self.seqs().first_outstanding()
    }

    fn seqs(&self) -> std::sync::MutexGuard<'_, Seqs> {
        self.seqs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cluster refreshed the session's activity just now.
    fn refreshed(&self) {
        *self
            .last_refreshed
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    fn is_expired(&self) -> bool {
        self.expired.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The session is gone or can never be used again: no new call uses it.
    fn unusable(&self) {
        self.expired
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    fn try_begin(&self) -> Option<u64> {
        self.seqs().try_begin()
    }

    fn fence_pending(&self) -> bool {
        self.seqs().fence_pending()
    }

    fn finish(&self, seq: u64) -> bool {
        let moved = self.seqs().finish(seq);
        self.finished.notify_waiters();
        moved
    }

    /// The cluster confirmed a floor of at least `floor` ([`Seqs::confirm`]).
    fn confirm(&self, floor: u64) {
        if self.seqs().confirm(floor) {
            self.finished.notify_waiters();
        }
    }
}

/// An empty key can never be valid (the cluster refuses it on every path).
fn check_key(key: &[u8]) -> Result<(), Error> {
    convert::check_key(key).map_err(|error| Error::InvalidArgument(error.to_string()))
}

/// Refuses, before anything is sent, a request no node can receive: its
/// encoding beyond the message bound both ends keep
/// ([`oncekv_wire::CLIENT_MESSAGE_BYTES_MAX`]). Within the replicated
/// limits' hard bounds only a long list, or a claim's fingerprint or result,
/// gets there. gRPC would refuse it on this side too, but as a failure of
/// the attempt, which nothing would tell from one that may have reached a
/// leader; this is final, and proves nothing was sent.
pub(crate) fn check_message_size(request: &impl prost::Message) -> Result<(), Error> {
    check_encoded_size(request.encoded_len())
}

/// [`check_message_size`] of a request `size` bytes long encoded.
fn check_encoded_size(size: usize) -> Result<(), Error> {
    if size > oncekv_wire::CLIENT_MESSAGE_BYTES_MAX {
        return Err(Error::InvalidArgument(format!(
            "the request is {size} bytes encoded, beyond the {} bytes a node accepts in one \
             message: nothing was sent",
            oncekv_wire::CLIENT_MESSAGE_BYTES_MAX
        )));
    }
    Ok(())
}

fn unexpected(result: CommandResult) -> Error {
    Error::InvalidArgument(format!("unexpected result {result:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncekv_wire::status::{ErrorReason, reason_status};

    /// A server's refusal of an undecodable request (what the wire codec
    /// answers) is a final INVALID_ARGUMENT to the library, not a retry and
    /// not an unknown outcome; a limit broken by the request is a typed
    /// final error naming the limit.
    #[test]
    fn malformed_request_and_limit_refusals_are_final() {
        let prost = tonic::Status::internal("failed to decode Protobuf message: buffer underflow");
        let refused = oncekv_wire::codec::decode_failure::<proto::ExecuteRequest>(prost);
        let Attempt::Final(status) = classify::<()>(Err(refused)) else {
            panic!("not final");
        };
        assert!(matches!(final_error(&status, 1), Error::InvalidArgument(_)));

        let exceeded = reason_status(ErrorReason::LimitExceeded(LimitExceeded {
            limit: Limit::KeyBytes,
            max: 4,
            requested: 5,
        }));
        let Attempt::Final(status) = classify::<()>(Err(exceeded)) else {
            panic!("not final");
        };
        assert_eq!(
            final_error(&status, 1),
            Error::LimitExceeded {
                limit: Limit::KeyBytes,
                max: 4,
                requested: 5
            }
        );
    }

    /// KEY_CONFLICT is final (never retried); a capacity refusal of a keyed
    /// request is retried like any "this attempt" failure.
    #[test]
    fn key_conflict_is_final_and_capacity_is_retried() {
        let conflict = reason_status(ErrorReason::KeyConflict);
        let Attempt::Final(status) = classify::<()>(Err(conflict)) else {
            panic!("not final");
        };
        assert_eq!(
            error_detail(&status).map(|detail| detail.reason()),
            Some(Reason::KeyConflict)
        );
        let full = reason_status(ErrorReason::ResourceExhausted(Limit::IdempotencyKeys));
        assert!(matches!(classify::<()>(Err(full)), Attempt::Retry { .. }));
        let long = reason_status(ErrorReason::LimitExceeded(LimitExceeded {
            limit: Limit::IdempotencyKeyBytes,
            max: 256,
            requested: 300,
        }));
        let Attempt::Final(status) = classify::<()>(Err(long)) else {
            panic!("not final");
        };
        assert_eq!(
            final_error(&status, 0),
            Error::LimitExceeded {
                limit: Limit::IdempotencyKeyBytes,
                max: 256,
                requested: 300
            }
        );
    }

    /// Every error has its stable name, the CLI's `--json` `kind`.
    #[test]
    fn every_error_has_its_stable_kind() {
        let cases = [
            (
                Error::OutcomeUnknown {
                    seq: 1,
                    reason: "deadline".into(),
                    fenced: true,
                },
                "outcome_unknown",
            ),
            (Error::Unavailable("x".into()), "unavailable"),
            (Error::SessionExpired, "session_expired"),
            (
                Error::WrongCluster {
                    expected: "ab".into(),
                },
                "wrong_cluster",
            ),
            (Error::SeqConflict { seq: 1 }, "seq_conflict"),
            (
                Error::ResponseDiscarded { seq: 1, floor: 2 },
                "response_discarded",
            ),
            (Error::InvalidArgument("x".into()), "invalid_argument"),
            (Error::Unauthenticated("x".into()), "unauthenticated"),
            (Error::PermissionDenied("x".into()), "permission_denied"),
            (Error::ResourceExhausted("x".into()), "resource_exhausted"),
            (
                Error::LimitExceeded {
                    limit: Limit::ValueBytes,
                    max: 1,
                    requested: 2,
                },
                "limit_exceeded",
            ),
            (Error::KeyConflict { key: "k".into() }, "key_conflict"),
            (
                Error::KeyOutcomeUnknown {
                    key: "k".into(),
                    reason: "deadline".into(),
                },
                "outcome_unknown",
            ),
            (Error::Fenced { current_fence: 3 }, "fenced"),
            (Error::ClaimInProgress { retry_after_ms: 5 }, "in_progress"),
            (
                Error::PlainOutcomeUnknown {
                    reason: "deadline".into(),
                },
                "outcome_unknown",
            ),
        ];
        // No wildcard: a new variant does not compile until it is numbered
        // here, and then the coverage check asks for its case above.
        let variant = |error: &Error| match error {
            Error::OutcomeUnknown { .. } => 0,
            Error::Unavailable(_) => 1,
            Error::SessionExpired => 2,
            Error::WrongCluster { .. } => 3,
            Error::SeqConflict { .. } => 4,
            Error::ResponseDiscarded { .. } => 5,
            Error::InvalidArgument(_) => 6,
            Error::Unauthenticated(_) => 7,
            Error::PermissionDenied(_) => 8,
            Error::ResourceExhausted(_) => 9,
            Error::LimitExceeded { .. } => 10,
            Error::KeyConflict { .. } => 11,
            Error::KeyOutcomeUnknown { .. } => 12,
            Error::Fenced { .. } => 13,
            Error::ClaimInProgress { .. } => 14,
            Error::PlainOutcomeUnknown { .. } => 15,
        };
        let covered: std::collections::BTreeSet<usize> =
            cases.iter().map(|(error, _)| variant(error)).collect();
        assert_eq!(covered, (0..16).collect(), "every variant has a case");
        for (error, kind) in &cases {
            assert_eq!(error.kind(), *kind, "{error:?}");
        }
    }

    /// Every wire reason maps to one error (its detail kept); a status
    /// without a reason is the caller's to judge.
    #[test]
    fn every_reason_maps_to_one_error() {
        let kind_of = |reason: ErrorReason| {
            Error::from_reason(&reason_status(reason), 7).map(|error| error.kind())
        };
        let cases = [
            (
                ErrorReason::NotLeader {
                    leader_id: None,
                    leader_client_addr: None,
                    nothing_proposed: false,
                },
                "unavailable",
            ),
            (ErrorReason::Unavailable("no quorum".into()), "unavailable"),
            (ErrorReason::Deadline, "unavailable"),
            (
                ErrorReason::TooManyOutstanding {
                    floor: 1,
                    window: 4,
                },
                "unavailable",
            ),
            (
                ErrorReason::ResourceExhausted(Limit::Keys),
                "resource_exhausted",
            ),
            (ErrorReason::SessionExpired, "session_expired"),
            (
                ErrorReason::WrongCluster(oncekv_core::ClusterId(0xab)),
                "wrong_cluster",
            ),
            (ErrorReason::SeqConflict, "seq_conflict"),
            (ErrorReason::KeyConflict, "key_conflict"),
            (ErrorReason::Fenced { current_fence: 4 }, "fenced"),
            (
                ErrorReason::ResponseDiscarded { floor: 9 },
                "response_discarded",
            ),
            (
                ErrorReason::InvalidArgument("bad".into()),
                "invalid_argument",
            ),
            (
                ErrorReason::LimitExceeded(LimitExceeded {
                    limit: Limit::KeyBytes,
                    max: 4,
                    requested: 5,
                }),
                "limit_exceeded",
            ),
            (
                ErrorReason::Unauthenticated("who".into()),
                "unauthenticated",
            ),
            (
                ErrorReason::PermissionDenied("role".into()),
                "permission_denied",
            ),
        ];
        for (reason, kind) in cases {
            assert_eq!(kind_of(reason.clone()), Some(kind), "{reason:?}");
        }
        let discarded = reason_status(ErrorReason::ResponseDiscarded { floor: 9 });
        assert_eq!(
            Error::from_reason(&discarded, 7),
            Some(Error::ResponseDiscarded { seq: 7, floor: 9 })
        );
        let denied = reason_status(ErrorReason::PermissionDenied("role".into()));
        assert_eq!(
            Error::from_reason(&denied, 0),
            Some(Error::PermissionDenied("role".into()))
        );
        assert_eq!(
            Error::from_reason(&tonic::Status::unavailable("tcp connect error"), 1),
            None
        );
    }

    fn session() -> Session {
        Session {
            client_id: 7,
            cluster_id: Vec::new(),
            ttl_ms: std::sync::atomic::AtomicU64::new(60_000),
            seqs: Mutex::new(Seqs::new(4)),
            limits: Mutex::new(None),
            finished: Notify::new(),
            expired: std::sync::atomic::AtomicBool::new(false),
            last_refreshed: Mutex::new(Instant::now()),
        }
    }

    /// Registering while the cluster is at `sessions_max`: the leader's
    /// refusal is retried there until the deadline and the call fails
    /// `ResourceExhausted` naming the limit — not "unavailable" after the
    /// follower it would otherwise have moved on to, which answers
    /// NOT_LEADER (or nothing in time).
    #[tokio::test(start_paused = true)]
    async fn registering_at_sessions_max_is_resource_exhausted() {
        let follower = Follower::new(vec!["leader".into(), "follower".into()], Backoff::default());
        let deadline = Instant::now() + Duration::from_secs(2);
        let (answer, _) = follower
            .call(
                deadline,
                Duration::from_secs(1),
                |endpoint: &str| Ok(endpoint.to_string()),
                |node| async move {
                    if node == "leader" {
                        Err::<(), _>(reason_status(ErrorReason::ResourceExhausted(
                            Limit::Sessions,
                        )))
                    } else {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        Err(policy::not_leader("leader".into()))
                    }
                },
            )
            .await;
        let error = give_up(answer.expect_err("the limit holds"));
        assert!(
            matches!(&error, Error::ResourceExhausted(why) if why.contains("sessions_max")),
            "{error:?}"
        );
        assert_eq!(error.kind(), "resource_exhausted");
    }

    /// Every final refusal a retry can meet, with what it proves.
    pub(crate) fn final_refusals() -> Vec<ErrorReason> {
        vec![
            ErrorReason::SessionExpired,
            ErrorReason::WrongCluster(oncekv_core::ClusterId(0xab)),
            ErrorReason::SeqConflict,
            ErrorReason::KeyConflict,
            ErrorReason::ResponseDiscarded { floor: 9 },
            ErrorReason::InvalidArgument("bad".into()),
            ErrorReason::FloorBeyondBound {
                first_outstanding_seq: 9,
                bound_seq: 3,
            },
            ErrorReason::LimitExceeded(LimitExceeded {
                limit: Limit::ValueBytes,
                max: 4,
                requested: 5,
            }),
            ErrorReason::LimitExceeded(LimitExceeded {
                limit: Limit::IdempotencyKeyBytes,
                max: 4,
                requested: 5,
            }),
            ErrorReason::Unauthenticated("token unknown".into()),
            ErrorReason::PermissionDenied("role".into()),
        ]
    }

    /// Rule 22 for sessions: a final refusal before anything may have
    /// reached a leader is the refusal itself; after, it is an unknown
    /// outcome (naming the refusal) — UNAUTHENTICATED from a node whose
    /// token file changed above all — except the two refusals that prove
    /// nothing ran for the seq, its cached LIMIT_EXCEEDED and SEQ_CONFLICT.
    /// A status without a reason is unknown either way; an expiry or a
    /// floor beyond the bound makes the session unusable either way.
    #[test]
    fn a_refusal_after_a_send_is_an_unknown_outcome() {
        for reason in final_refusals() {
            let status = reason_status(reason.clone());
            let definite = Error::from_reason(&status, 3).expect("a reason");
            let fresh = session();
            assert_eq!(
                final_execute_error(&fresh, &status, 3, false),
                definite,
                "{reason:?} before a send"
            );
            let unusable = matches!(
                reason,
                ErrorReason::SessionExpired | ErrorReason::FloorBeyondBound { .. }
            );
            assert_eq!(fresh.is_expired(), unusable, "{reason:?}");
            let after = final_execute_error(&session(), &status, 3, true);
            let proof = matches!(
                reason,
                ErrorReason::SeqConflict | ErrorReason::LimitExceeded(_)
            );
            if proof {
                assert_eq!(after, definite, "{reason:?} proves nothing ran");
            } else {
                let Error::OutcomeUnknown {
                    seq,
                    reason: why,
                    fenced,
                } = &after
                else {
                    panic!("{reason:?} after a send: {after:?}");
                };
                assert_eq!((*seq, *fenced), (3, false));
                assert!(why.contains(&definite.to_string()), "{why}");
            }
        }
        let internal = tonic::Status::internal("unexpected outcome");
        assert!(matches!(
            final_execute_error(&session(), &internal, 3, false),
            Error::OutcomeUnknown { .. }
        ));
    }

    /// Rule 22 for keys: after a send, KEY_CONFLICT and a command's
    /// LIMIT_EXCEEDED (the key's own record) stay definite; a key too long
    /// (judged before the record) and every other refusal are unknown.
    #[test]
    fn a_keyed_refusal_after_a_send_is_an_unknown_outcome() {
        for reason in final_refusals() {
            let status = reason_status(reason.clone());
            let before = final_keyed_error(&status, "k1", false);
            let after = final_keyed_error(&status, "k1", true);
            if let ErrorReason::KeyConflict = reason {
                let conflict = Error::KeyConflict { key: "k1".into() };
                assert_eq!((&before, &after), (&conflict, &conflict));
                continue;
            }
            assert_eq!(Some(before.clone()), Error::from_reason(&status, 0));
            let proof = matches!(
                &reason,
                ErrorReason::LimitExceeded(exceeded) if exceeded.limit != Limit::IdempotencyKeyBytes
            );
            if proof {
                assert_eq!(after, before, "{reason:?}");
            } else {
                assert!(
                    matches!(&after, Error::KeyOutcomeUnknown { key, .. } if key == "k1"),
                    "{reason:?} after a send: {after:?}"
                );
            }
        }
    }

    /// Which failed attempts may have reached a leader that applies them:
    /// all but a refusal made when the attempt's entry applied (the window,
    /// a capacity limit), a NOT_LEADER from a node that proposed nothing,
    /// and a connection refused, nothing sent. Any other NOT_LEADER counts:
    /// a node answers it after appending too.
    #[tokio::test]
    async fn only_proof_says_an_attempt_did_not_reach_a_leader() {
        for reached in [
            reason_status(ErrorReason::NotLeader {
                leader_id: None,
                leader_client_addr: None,
                nothing_proposed: false,
            }),
            reason_status(ErrorReason::Unavailable("no quorum".into())),
            reason_status(ErrorReason::Deadline),
            tonic::Status::deadline_exceeded("attempt timed out"),
            tonic::Status::cancelled("Timeout expired"),
            tonic::Status::unavailable("connection reset"),
        ] {
            assert!(may_have_reached(&reached), "{reached:?}");
        }
        for spent in [
            reason_status(ErrorReason::TooManyOutstanding {
                floor: 1,
                window: 2,
            }),
            reason_status(ErrorReason::ResourceExhausted(Limit::Keys)),
            reason_status(ErrorReason::NotLeader {
                leader_id: Some(2),
                leader_client_addr: None,
                nothing_proposed: true,
            }),
        ] {
            assert!(!may_have_reached(&spent), "{spent:?}");
        }
        // A real refused connection: a port bound, then closed.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = closed.local_addr().unwrap();
        drop(closed);
        let client = Client::connect([addr.to_string()]);
        let mut grpc = client.channel(&addr.to_string()).unwrap();
        let refused = grpc
            .status(proto::StatusRequest {})
            .await
            .expect_err("nothing listens");
        assert!(connection_refused(&refused), "{refused:?}");
        assert!(!may_have_reached(&refused), "{refused:?}");
    }

    /// The reason of an unknown outcome is the most informative failure
    /// seen (the latest among equals), with the last one when it differs.
    #[test]
    fn failures_report_the_most_informative_reason() {
        let mut failures = Failures::default();
        failures.note(&tonic::Status::unavailable("tcp connect error"));
        failures.note(&reason_status(ErrorReason::ResourceExhausted(Limit::Keys)));
        failures.note(&reason_status(ErrorReason::NotLeader {
            leader_id: None,
            leader_client_addr: None,
            nothing_proposed: false,
        }));
        failures.note(&tonic::Status::deadline_exceeded("attempt timed out"));
        let reason = failures.reason();
        assert!(
            reason.starts_with("replicated limit keys_max reached"),
            "{reason}"
        );
        assert!(reason.contains("the last of 4 failed attempts"), "{reason}");
        assert!(reason.contains("attempt timed out"), "{reason}");

        let mut one = Failures::default();
        one.note(&reason_status(ErrorReason::Unavailable(
            "overloaded".into(),
        )));
        assert_eq!(one.reason(), "overloaded");
    }

    /// A capacity refusal with too little time left for another attempt is
    /// the limit: under 20 ms, or under twice the slowest attempt measured
    /// (a loaded machine's attempts are slow, and one cut off in flight
    /// would be "unknown").
    #[test]
    fn out_of_time_counts_the_slowest_attempt() {
        let exhausted = reason_status(ErrorReason::ResourceExhausted(Limit::Keys));
        let mut failures = Failures::default();
        failures.note(&exhausted);
        let now = Instant::now();
        assert!(
            failures
                .exhausted_and_out_of_time(false, now + Duration::from_millis(10))
                .is_some()
        );
        assert!(
            failures
                .exhausted_and_out_of_time(false, now + Duration::from_secs(10))
                .is_none(),
            "time for another attempt"
        );
        // That attempt took 60 ms: 100 ms left is not enough for the next.
        std::thread::sleep(Duration::from_millis(60));
        failures.note(&exhausted);
        let now = Instant::now();
        assert!(
            failures
                .exhausted_and_out_of_time(false, now + Duration::from_millis(100))
                .is_some()
        );
        assert!(
            failures
                .exhausted_and_out_of_time(false, now + Duration::from_millis(500))
                .is_none()
        );
        assert!(
            failures.exhausted_and_out_of_time(true, now).is_none(),
            "after a reach, nothing is proven"
        );
    }
}
