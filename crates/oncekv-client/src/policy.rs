//! The one leader-following policy of everything that calls the cluster —
//! the client library, the admin client (and through it the CLI's admin
//! commands), the harness's raw clients: what a failed attempt means
//! ([`verdict`]: retry this attempt, at the leader a `NOT_LEADER` names if
//! it names one, or stop for good), where the next attempt goes
//! ([`Leader::follow`]: to the hinted leader at once, else to the next
//! endpoint in turn after a jittered backoff; to the same node after a
//! refusal only the leader makes), the loop that runs an idempotent call on
//! the leader until its deadline ([`Follower::call`]), and which of a
//! call's failures says most about why it could not complete
//! ([`informativeness`]).
//! It must not change a request between attempts, nor decide what a
//! refusal means for the caller's own bookkeeping (seqs, floors, unknown
//! outcomes): that is each caller's.

use crate::retry::Backoff;
use oncekv_wire::proto::{Reason, StatusReply};
use oncekv_wire::status::{ErrorReason, error_detail, reason_status};
use rand::Rng;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// What a failed attempt means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// This attempt failed and an attempt of the same request may succeed:
    /// a node that is not the leader (`hint`: the leader's client address,
    /// when it knows one), one that cannot serve now (no quorum, overload),
    /// a capacity limit or the window of this attempt, or a failure below
    /// the service (a refused or reset connection, a deadline) — of which
    /// nothing is known.
    Retry { hint: Option<String> },
    /// Refused for good: no attempt of the same request can do better.
    Final,
}

/// What `status` means for the request it answers (the error table of
/// docs/rules.md: "this attempt" reasons are retried, final ones are not).
pub fn verdict(status: &tonic::Status) -> Verdict {
    match error_detail(status) {
        Some(detail) => match detail.reason() {
            Reason::NotLeader => Verdict::Retry {
                hint: Some(detail.leader_client_addr).filter(|addr| !addr.is_empty()),
            },
            Reason::Unavailable | Reason::TooManyOutstanding | Reason::ResourceExhausted => {
                Verdict::Retry { hint: None }
            }
            _ => Verdict::Final,
        },
        // No detail: the attempt failed below the service (connection
        // refused or reset, a deadline): nothing is known of it.
        None => match status.code() {
            tonic::Code::Unavailable
            | tonic::Code::DeadlineExceeded
            | tonic::Code::Cancelled
            | tonic::Code::Unknown => Verdict::Retry { hint: None },
            _ => Verdict::Final,
        },
    }
}

/// Whether a failed attempt of a change may have reached a leader that went
/// on with it (the node said it could not answer in time, or the answer
/// never came): a caller that gives up after it says the outcome is unknown.
pub fn may_have_applied(status: &tonic::Status) -> bool {
    match error_detail(status) {
        Some(detail) => detail.reason() == Reason::Unavailable,
        None => matches!(
            status.code(),
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
        ),
    }
}

/// Whether `status` is the registry's refusal of this attempt when its
/// entry applied — a capacity limit (`RESOURCE_EXHAUSTED`) or the window
/// (`TOO_MANY_OUTSTANDING`): only the node that leads answers so, so the
/// next attempt goes to it again, after a backoff, rather than on to
/// another endpoint (a follower would only send it back, and one that does
/// not answer would hide the refusal behind its timeout).
pub fn refused_by_leader(status: &tonic::Status) -> bool {
    error_detail(status).is_some_and(|detail| {
        matches!(
            detail.reason(),
            Reason::ResourceExhausted | Reason::TooManyOutstanding
        )
    })
}

/// Where the attempt after a "this attempt" failure (`status`, with the
/// `hint` its [`verdict`] found) of one sent to `target` goes: the leader
/// the hint names; else `target` again when only the leader refuses so
/// ([`refused_by_leader`]); else nowhere in particular (`None`: the next
/// endpoint, after a backoff).
pub fn next_hint(target: &str, status: &tonic::Status, hint: Option<String>) -> Option<String> {
    hint.or_else(|| refused_by_leader(status).then(|| target.to_string()))
}

/// How much a failed attempt tells about why a call could not complete,
/// for reporting a call that gives up: the registry's own reason for
/// refusing this attempt (a capacity limit, the window) says most; a node
/// saying why it cannot serve (no quorum, overload) next; then "not the
/// leader"; a failure below the service (a refused connection, the
/// attempt's own timeout) least.
pub fn informativeness(status: &tonic::Status) -> u8 {
    if refused_by_leader(status) {
        return 3;
    }
    match error_detail(status).map(|detail| detail.reason()) {
        Some(Reason::NotLeader) => 1,
        Some(_) => 2,
        None => 0,
    }
}

/// Keeps in `best` the most informative failure met so far
/// ([`informativeness`]; the latest among equals), as `value` makes it.
pub fn keep_most_telling<T>(
    best: &mut Option<(u8, T)>,
    status: &tonic::Status,
    value: impl FnOnce() -> T,
) {
    let rank = informativeness(status);
    if best.as_ref().is_none_or(|(kept, _)| rank >= *kept) {
        *best = Some((rank, value()));
    }
}

/// A `Status` reply as a call on the leader sees it: the leader's own reply
/// passes; any other node's is the `NOT_LEADER` refusal that sends the
/// caller to the leader it names.
pub fn leader_only(reply: StatusReply) -> Result<StatusReply, tonic::Status> {
    if reply.role == "leader" {
        Ok(reply)
    } else {
        Err(not_leader(reply.leader_client_addr))
    }
}

/// `NOT_LEADER`, pointing at `hint` (a client address; empty: none known).
pub fn not_leader(hint: String) -> tonic::Status {
    reason_status(ErrorReason::NotLeader {
        leader_id: None,
        leader_client_addr: Some(hint).filter(|hint| !hint.is_empty()),
        nothing_proposed: false,
    })
}

/// How many endpoints learnt from hints a [`Leader`] keeps beside the ones
/// it was given: enough for the members a cluster adds while a caller runs,
/// bounded so that a caller told many addresses (a cluster whose members
/// come and go, a node announcing addresses it should not) does not grow
/// without end. The oldest learnt one makes room.
pub const LEARNT_ENDPOINTS_MAX: usize = 8;

/// The endpoints a caller knows and the one it believes leads.
#[derive(Clone, Debug)]
pub struct Leader {
    /// The endpoints given, then at most [`LEARNT_ENDPOINTS_MAX`] learnt
    /// from hints, oldest first.
    endpoints: Vec<String>,
    /// How many of `endpoints` were given (never evicted).
    given: usize,
    /// Index into `endpoints` of the node believed to lead.
    leader: usize,
    /// Where the next try goes when no leader is known: it moves through
    /// every endpoint in turn, so an announced leader address this caller
    /// cannot reach (a host name inside a container network) never sends it
    /// back to the same follower forever.
    rotation: usize,
}

impl Leader {
    pub fn new(endpoints: Vec<String>) -> Leader {
        Leader {
            given: endpoints.len(),
            endpoints,
            leader: 0,
            rotation: 0,
        }
    }

    /// Every endpoint known: those given, then the leaders named by the
    /// latest hints (at most [`LEARNT_ENDPOINTS_MAX`], oldest first).
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The endpoint believed to lead; `None` without endpoints.
    pub fn target(&self) -> Option<&str> {
        match self.endpoints.len() {
            0 => None,
            count => Some(&self.endpoints[self.leader % count]),
        }
    }

    /// After a retryable failure: points at the hinted leader (adding it if
    /// unknown, in place of the oldest learnt endpoint when
    /// [`LEARNT_ENDPOINTS_MAX`] are known) and returns true when that is a
    /// new target worth trying at once. Without a hint, moves on to the
    /// next endpoint and returns false (back off first).
    pub fn follow(&mut self, hint: Option<&str>) -> bool {
        match hint {
            Some(hint) => {
                let index = match self.endpoints.iter().position(|known| known == hint) {
                    Some(index) => index,
                    None => {
                        if self.endpoints.len() - self.given >= LEARNT_ENDPOINTS_MAX {
                            self.forget_oldest_learnt();
                        }
                        self.endpoints.push(hint.to_string());
                        self.endpoints.len() - 1
                    }
                };
                let new_target = self.leader != index;
                self.leader = index;
                new_target
            }
            None => {
                self.rotation = (self.rotation + 1) % self.endpoints.len().max(1);
                self.leader = self.rotation;
                false
            }
        }
    }

    /// Removes the oldest endpoint learnt from a hint; the indexes after it
    /// move down with their endpoints (one pointing at it moves on to the
    /// next).
    fn forget_oldest_learnt(&mut self) {
        let oldest = self.given;
        if oldest >= self.endpoints.len() {
            return;
        }
        self.endpoints.remove(oldest);
        let count = self.endpoints.len().max(1);
        let shift = |index: usize| (if index > oldest { index - 1 } else { index }) % count;
        self.leader = shift(self.leader);
        self.rotation = shift(self.rotation);
    }
}

/// Why a call on the leader failed.
#[derive(Clone, Debug)]
pub enum CallError {
    /// Refused for good ([`Verdict::Final`]): the status says why.
    Final(tonic::Status),
    /// The deadline passed while every attempt failed for that attempt
    /// only; `status` is the most informative failure ([`informativeness`]:
    /// a capacity limit the leader named over a follower's `NOT_LEADER` or
    /// a timeout; the latest among equals), and `maybe_applied` says
    /// whether any attempt may have reached a leader that went on with it
    /// ([`may_have_applied`]).
    GaveUp {
        status: tonic::Status,
        maybe_applied: bool,
    },
}

impl CallError {
    /// The status the call ended with.
    pub fn status(&self) -> &tonic::Status {
        match self {
            CallError::Final(status) | CallError::GaveUp { status, .. } => status,
        }
    }

    /// The status the call ended with, owned.
    pub fn into_status(self) -> tonic::Status {
        match self {
            CallError::Final(status) | CallError::GaveUp { status, .. } => status,
        }
    }
}

/// A [`Leader`] shared by the tasks of one caller, and the backoff between
/// attempts that no hint sends elsewhere.
#[derive(Debug)]
pub struct Follower {
    leader: Mutex<Leader>,
    backoff: Backoff,
}

impl Follower {
    pub fn new(endpoints: Vec<String>, backoff: Backoff) -> Follower {
        Follower {
            leader: Mutex::new(Leader::new(endpoints)),
            backoff,
        }
    }

    fn leader(&self) -> std::sync::MutexGuard<'_, Leader> {
        self.leader.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The endpoint the next attempt goes to.
    pub fn target(&self) -> Option<String> {
        self.leader().target().map(str::to_string)
    }

    /// Every endpoint known.
    pub fn endpoints(&self) -> Vec<String> {
        self.leader().endpoints().to_vec()
    }

    /// After a retryable failure: go where the hint points at once, or try
    /// the next endpoint after a jittered backoff (never past `deadline`).
    pub async fn follow(&self, hint: Option<&str>, attempt: u32, deadline: Instant) {
        if self.leader().follow(hint) {
            return;
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        #[allow(clippy::disallowed_methods)] // jitter is the caller's, not the registry's
        let unit: f64 = rand::thread_rng().r#gen();
        tokio::time::sleep(self.backoff.delay(attempt, unit, remaining)).await;
    }

    /// Runs `call` on the leader until it is answered, refused for good, or
    /// `deadline` passes: each attempt on the client `connect` makes for the
    /// current target, within `attempt_timeout` (and the deadline), and
    /// after a "this attempt" failure the next one follows the hint or moves
    /// on — but for a refusal only the leader makes ([`refused_by_leader`]:
    /// a capacity limit), after which it goes to the same node again. A
    /// final refusal ends the call at once, whichever node made it. The
    /// request must be the same on every attempt (only idempotent calls, or
    /// the same seq / key). Returns the answer or why it failed (at the
    /// deadline the most informative failure, not merely the last), and the
    /// number of attempts made.
    pub async fn call<C, T, F, Fut>(
        &self,
        deadline: Instant,
        attempt_timeout: Duration,
        connect: impl Fn(&str) -> Result<C, tonic::Status>,
        call: F,
    ) -> (Result<T, CallError>, u32)
    where
        F: Fn(C) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        let mut attempt: u32 = 0;
        let mut maybe_applied = false;
        // The most informative failure so far and its rank (the latest
        // among equals): what the call reports if it gives up.
        let mut telling: Option<(u8, tonic::Status)> = None;
        loop {
            let target = self.target();
            let client = match &target {
                Some(target) => connect(target),
                None => Err(tonic::Status::invalid_argument("no endpoints given")),
            };
            let client = match client {
                Ok(client) => client,
                Err(status) => return (Err(CallError::Final(status)), attempt),
            };
            let timeout = deadline
                .saturating_duration_since(Instant::now())
                .min(attempt_timeout)
                .max(Duration::from_millis(1));
            let result = tokio::time::timeout(timeout, call(client))
                .await
                .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("attempt timed out")));
            attempt += 1;
            let status = match result {
                Ok(reply) => return (Ok(reply), attempt),
                Err(status) => status,
            };
            let hint = match verdict(&status) {
                Verdict::Final => return (Err(CallError::Final(status)), attempt),
                Verdict::Retry { hint } => hint,
            };
            maybe_applied |= may_have_applied(&status);
            // The node that refused for a capacity limit leads: stay there.
            let hint = match &target {
                Some(target) => next_hint(target, &status, hint),
                None => hint,
            };
            keep_most_telling(&mut telling, &status, || status.clone());
            if Instant::now() >= deadline {
                let error = CallError::GaveUp {
                    status: telling.map_or(status, |(_, telling)| telling),
                    maybe_applied,
                };
                return (Err(error), attempt);
            }
            self.follow(hint.as_deref(), attempt - 1, deadline).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NOT_LEADER retries at the leader it names; "this attempt" reasons
    /// and failures below the service retry; final reasons stop.
    #[test]
    fn statuses_get_their_verdict() {
        let hinted = reason_status(ErrorReason::NotLeader {
            leader_id: Some(2),
            leader_client_addr: Some("127.0.0.1:7102".into()),
            nothing_proposed: false,
        });
        assert_eq!(
            verdict(&hinted),
            Verdict::Retry {
                hint: Some("127.0.0.1:7102".into())
            }
        );
        assert_eq!(
            verdict(&not_leader(String::new())),
            Verdict::Retry { hint: None }
        );
        for retried in [
            reason_status(ErrorReason::Unavailable("no quorum".into())),
            reason_status(ErrorReason::Deadline),
            reason_status(ErrorReason::TooManyOutstanding {
                floor: 1,
                window: 2,
            }),
            reason_status(ErrorReason::ResourceExhausted(oncekv_core::Limit::Keys)),
            tonic::Status::unavailable("connection refused"),
            tonic::Status::deadline_exceeded("attempt timed out"),
        ] {
            assert_eq!(
                verdict(&retried),
                Verdict::Retry { hint: None },
                "{retried}"
            );
        }
        for last in [
            reason_status(ErrorReason::InvalidArgument("bad".into())),
            reason_status(ErrorReason::SessionExpired),
            reason_status(ErrorReason::SeqConflict),
            reason_status(ErrorReason::KeyConflict),
            reason_status(ErrorReason::PermissionDenied("role".into())),
            tonic::Status::invalid_argument("no detail"),
            tonic::Status::unimplemented("no such RPC"),
        ] {
            assert_eq!(verdict(&last), Verdict::Final, "{last}");
        }
    }

    /// A change may have been applied when the node could not answer in
    /// time or the answer never came; not when nothing was listening.
    #[test]
    fn unanswered_changes_may_have_been_applied() {
        assert!(may_have_applied(&reason_status(ErrorReason::Deadline)));
        assert!(may_have_applied(&tonic::Status::deadline_exceeded("late")));
        assert!(!may_have_applied(&tonic::Status::unavailable("refused")));
        assert!(!may_have_applied(&not_leader("127.0.0.1:7102".into())));
    }

    /// A hint points at its node (added when unknown) and is worth trying
    /// at once unless it is the current target; without one the target
    /// moves through every endpoint in turn.
    #[test]
    fn leaders_follow_hints_then_rotate() {
        let mut leader = Leader::new(vec!["a".into(), "b".into(), "c".into()]);
        assert_eq!(leader.target(), Some("a"));
        assert!(leader.follow(Some("c")));
        assert_eq!(leader.target(), Some("c"));
        assert!(!leader.follow(Some("c")), "the same target: back off");
        assert!(leader.follow(Some("d")));
        assert_eq!(leader.target(), Some("d"));
        assert_eq!(leader.endpoints(), ["a", "b", "c", "d"]);
        let rotated: Vec<String> = (0..5)
            .map(|_| {
                assert!(!leader.follow(None));
                leader.target().unwrap().to_string()
            })
            .collect();
        assert_eq!(rotated, ["b", "c", "d", "a", "b"]);
        assert_eq!(Leader::new(Vec::new()).target(), None);
    }

    /// Hints add the leaders they name, but at most LEARNT_ENDPOINTS_MAX of
    /// them beside the endpoints given: the oldest learnt one makes room,
    /// the given ones stay, the newest hint is the target, and rotation
    /// keeps walking the endpoints kept.
    #[test]
    fn learnt_endpoints_are_bounded() {
        let given = ["a".to_string(), "b".to_string(), "c".to_string()];
        let mut leader = Leader::new(given.to_vec());
        for number in 0..100 {
            let hint = format!("learnt-{number}");
            assert!(leader.follow(Some(&hint)));
            assert_eq!(leader.target(), Some(hint.as_str()));
            assert!(
                leader.endpoints().len() <= given.len() + LEARNT_ENDPOINTS_MAX,
                "{} endpoints after {} hints",
                leader.endpoints().len(),
                number + 1
            );
            if number % 7 == 0 {
                // Rotate a little between hints: indexes stay in range.
                for _ in 0..number % 5 {
                    leader.follow(None);
                    assert!(leader.target().is_some());
                }
            }
        }
        let kept: Vec<String> = (100 - LEARNT_ENDPOINTS_MAX..100)
            .map(|number| format!("learnt-{number}"))
            .collect();
        let expected: Vec<String> = given.iter().cloned().chain(kept).collect();
        assert_eq!(leader.endpoints(), expected.as_slice());
        // A known hint is followed in place, adding nothing.
        assert!(leader.follow(Some("b")));
        assert_eq!(leader.endpoints().len(), given.len() + LEARNT_ENDPOINTS_MAX);
        let visited: std::collections::BTreeSet<String> = (0..expected.len())
            .map(|_| {
                leader.follow(None);
                leader.target().unwrap().to_string()
            })
            .collect();
        assert_eq!(
            visited.len(),
            expected.len(),
            "rotation visits every endpoint"
        );
    }

    /// Only the leader's own `Status` passes; another node's sends the
    /// caller where it points.
    #[test]
    fn status_replies_of_followers_redirect() {
        let leader = StatusReply {
            role: "leader".into(),
            ..StatusReply::default()
        };
        assert!(leader_only(leader).is_ok());
        let follower = StatusReply {
            role: "follower".into(),
            leader_client_addr: "127.0.0.1:7103".into(),
            ..StatusReply::default()
        };
        let refused = leader_only(follower).unwrap_err();
        assert_eq!(
            verdict(&refused),
            Verdict::Retry {
                hint: Some("127.0.0.1:7103".into())
            }
        );
    }

    /// The loop follows a hint to the leader at once, retries "this
    /// attempt" failures until the deadline and stops at a final refusal,
    /// counting attempts.
    #[tokio::test(start_paused = true)]
    async fn calls_follow_the_leader_until_answered_or_final() {
        let follower = Follower::new(vec!["a".into(), "b".into()], Backoff::default());
        let deadline = Instant::now() + Duration::from_secs(5);
        let connect = |endpoint: &str| Ok(endpoint.to_string());
        let (answer, attempts) = follower
            .call(
                deadline,
                Duration::from_secs(1),
                connect,
                |node| async move {
                    match node.as_str() {
                        "c" => Ok(7),
                        _ => Err(not_leader("c".into())),
                    }
                },
            )
            .await;
        assert_eq!((answer.unwrap(), attempts), (7, 2));
        assert_eq!(follower.target().as_deref(), Some("c"), "remembered");

        let (answer, attempts) = follower
            .call(deadline, Duration::from_secs(1), connect, |_| async {
                Err::<(), _>(reason_status(ErrorReason::SeqConflict))
            })
            .await;
        assert!(matches!(answer, Err(CallError::Final(_))));
        assert_eq!(attempts, 1);

        let (answer, attempts) = follower
            .call(deadline, Duration::from_secs(1), connect, |_| async {
                Err::<(), _>(reason_status(ErrorReason::Deadline))
            })
            .await;
        assert!(
            matches!(
                answer,
                Err(CallError::GaveUp {
                    maybe_applied: true,
                    ..
                })
            ),
            "{answer:?}"
        );
        assert!(attempts > 2, "retried until the deadline: {attempts}");
        assert!(Instant::now() >= deadline);
    }

    /// A capacity limit the leader names (registering at `sessions_max`)
    /// is retried at that node, never passed on to the next endpoint, and
    /// is what the call reports at its deadline — not the last failure met
    /// (a follower's NOT_LEADER, or its timeout), which the caller would
    /// report as "unavailable".
    #[tokio::test(start_paused = true)]
    async fn a_capacity_refusal_stays_at_the_leader_and_is_reported() {
        let full = || reason_status(ErrorReason::ResourceExhausted(oncekv_core::Limit::Sessions));
        let connect = |endpoint: &str| Ok(endpoint.to_string());
        for endpoints in [["leader", "follower"], ["follower", "leader"]] {
            let follower = Follower::new(
                endpoints.iter().map(|e| e.to_string()).collect(),
                Backoff::default(),
            );
            let deadline = Instant::now() + Duration::from_secs(2);
            let follower_tries = std::sync::atomic::AtomicU32::new(0);
            let (answer, attempts) = follower
                .call(deadline, Duration::from_secs(1), connect, |node| {
                    let follower_tries = &follower_tries;
                    async move {
                        if node == "leader" {
                            return Err::<(), _>(full());
                        }
                        // A follower that points at the leader, but only
                        // after a while: the deadline would pass here.
                        follower_tries.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        Err(not_leader("leader".into()))
                    }
                })
                .await;
            let Err(CallError::GaveUp { status, .. }) = answer else {
                panic!("{endpoints:?}: {answer:?}");
            };
            assert_eq!(
                error_detail(&status).map(|detail| (detail.reason(), detail.limit)),
                Some((Reason::ResourceExhausted, "sessions_max".to_string())),
                "{endpoints:?}: {status:?}"
            );
            let asked_first = usize::from(endpoints[0] == "follower");
            assert_eq!(
                follower_tries.load(std::sync::atomic::Ordering::SeqCst) as usize,
                asked_first,
                "{endpoints:?}: never back to the follower after the leader refused"
            );
            assert!(attempts > 3, "retried at the leader: {attempts}");
        }
    }

    /// At the deadline the most informative failure is reported, however
    /// many less telling ones came after it: a capacity limit over a
    /// node's NOT_LEADER over a timed-out attempt. A final refusal ends
    /// the call at once, even after a hop.
    #[tokio::test(start_paused = true)]
    async fn a_call_that_gives_up_reports_its_most_telling_failure() {
        let follower = Follower::new(vec!["a".into(), "b".into()], Backoff::default());
        let deadline = Instant::now() + Duration::from_secs(2);
        let calls = std::sync::atomic::AtomicU32::new(0);
        let connect = |endpoint: &str| Ok(endpoint.to_string());
        let (answer, _) = follower
            .call(deadline, Duration::from_millis(200), connect, |node| {
                let first = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
                async move {
                    match (node.as_str(), first) {
                        // Once, the limit; then the leader is gone.
                        ("a", true) => Err::<(), _>(reason_status(ErrorReason::ResourceExhausted(
                            oncekv_core::Limit::Keys,
                        ))),
                        ("a", false) => Err(not_leader("b".into())),
                        _ => std::future::pending().await,
                    }
                }
            })
            .await;
        let Err(CallError::GaveUp { status, .. }) = answer else {
            panic!("{answer:?}");
        };
        assert_eq!(
            error_detail(&status).map(|detail| detail.reason()),
            Some(Reason::ResourceExhausted),
            "{status:?}"
        );

        let follower = Follower::new(vec!["a".into(), "b".into()], Backoff::default());
        let deadline = Instant::now() + Duration::from_secs(2);
        let (answer, attempts) = follower
            .call(
                deadline,
                Duration::from_millis(200),
                connect,
                |node| async move {
                    match node.as_str() {
                        "a" => Err::<(), _>(not_leader("b".into())),
                        _ => Err(reason_status(ErrorReason::PermissionDenied("role".into()))),
                    }
                },
            )
            .await;
        assert!(matches!(answer, Err(CallError::Final(_))), "{answer:?}");
        assert_eq!(attempts, 2);
    }
}
