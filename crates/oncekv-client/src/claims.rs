//! Claims from the client (rule 20): the four calls, each retried with the
//! same request (the same claim id, the same fence) until the call's
//! deadline — once an attempt may have reached a leader that applies it, a
//! later refusal is an unknown outcome unless it proves the call did not
//! take effect (rule 22) — and [`Client::once`], the reserve → do → record
//! → release cycle around a caller's own effect: claim (waiting out another
//! holder's lease), run the effect with its fence while a heartbeat extends
//! the lease, complete with its result or release on failure, and replay a
//! recorded result without running anything. It owns that cycle and the
//! retry of each call; it must not decide who holds a key (the registry
//! does, at apply) or re-claim under a new claim id within one call.

use super::{AuthChannel, Client, ClientClient, Decided, Error, refusal_of_key};
use oncekv_core::ClaimAnswer;
use oncekv_wire::convert;
use oncekv_wire::proto;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// How [`Client::once`] claims and holds a key.
#[derive(Clone, Debug)]
pub struct OnceOptions {
    /// The lease asked for (and renewed by each heartbeat): how long a
    /// holder that dies blocks the key before another may take over.
    pub lease: Duration,
    /// How long to wait for another holder's lease (claiming again after
    /// each "in progress") before giving up with
    /// [`Error::ClaimInProgress`].
    pub wait: Duration,
    /// How often the heartbeat extends the lease while the effect runs
    /// (default: a third of the lease).
    pub heartbeat: Option<Duration>,
}

impl Default for OnceOptions {
    fn default() -> OnceOptions {
        OnceOptions {
            lease: Duration::from_secs(30),
            wait: Duration::from_secs(60),
            heartbeat: None,
        }
    }
}

/// The holder's side of a won claim, handed to the effect.
#[derive(Clone, Debug)]
pub struct ClaimToken {
    pub key: Vec<u8>,
    /// The fencing token: pass it to the downstream that performs the
    /// effect, so that it can refuse a holder whose lease was taken over.
    pub fence: u64,
    /// Holders so far, this one included: above 1, an earlier holder may
    /// have half-done the effect — reconcile before redoing it.
    pub attempt: u64,
    fenced: Arc<AtomicBool>,
}

impl ClaimToken {
    /// Whether a heartbeat learnt that this holder was fenced (its lease
    /// ran out and another holder took over): stop, the effect is theirs.
    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::SeqCst)
    }
}

/// What [`Client::once`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OnceOutcome {
    /// This call ran the effect and recorded its result.
    Ran {
        result: Vec<u8>,
        fence: u64,
        attempt: u64,
    },
    /// The effect had been done (by this process earlier, or another): its
    /// recorded result; nothing ran.
    Replayed {
        result: Vec<u8>,
        fence: u64,
        attempt: u64,
        completed_ms: u64,
    },
}

impl OnceOutcome {
    /// The effect's recorded result.
    pub fn result(&self) -> &[u8] {
        match self {
            OnceOutcome::Ran { result, .. } | OnceOutcome::Replayed { result, .. } => result,
        }
    }

    /// Whether the result was replayed (nothing ran in this call).
    pub fn replayed(&self) -> bool {
        matches!(self, OnceOutcome::Replayed { .. })
    }
}

/// Why [`Client::once`] did not return a result.
#[derive(Debug, thiserror::Error)]
pub enum OnceError<E> {
    /// The key could not be claimed: nothing ran in this call
    /// ([`Error::ClaimInProgress`] after waiting, [`Error::KeyConflict`]
    /// for another fingerprint, an unavailable cluster…).
    #[error("could not claim the key: {0}")]
    Claim(Error),
    /// The effect failed; the claim was released (when `released` is
    /// `Ok`), so the next claim of the key runs it again.
    #[error("the effect failed: {error}")]
    Failed {
        error: E,
        released: Result<(), Error>,
    },
    /// The effect ran and returned `result`, but recording it failed:
    /// FENCED (the lease ran out and another holder took over — the
    /// downstream must refuse this holder's fence), or an unknown outcome
    /// (calling `once` again with the same key learns it).
    #[error("the effect ran but its result was not recorded: {error}")]
    Record { result: Vec<u8>, error: Error },
}

/// The first pause of [`Client::once`] after an "in progress" answer; it
/// doubles after each one, up to [`WAIT_PAUSE_MAX`].
const WAIT_FIRST_PAUSE: Duration = Duration::from_millis(25);
/// The longest pause between two claims while another holder works.
const WAIT_PAUSE_MAX: Duration = Duration::from_secs(1);

/// A task aborted when its handle is dropped (a plain `JoinHandle`
/// detaches it instead).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A claim request's identity: random, chosen once per logical claim.
fn new_claim_id() -> u128 {
    #[allow(clippy::disallowed_methods)] // a claim id is random by definition (rule 20)
    rand::random()
}

impl Client {
    /// Claims `key` for an effect described by `fingerprint` (any bytes;
    /// another description on the key is [`Error::KeyConflict`]) with a
    /// lease of `lease`: won, in progress, or completed (see
    /// [`ClaimAnswer`]). Retried with the same claim id until the call's
    /// deadline, so a lost reply is answered with this call's own win.
    pub async fn claim(
        &self,
        key: &[u8],
        fingerprint: &[u8],
        lease: Duration,
    ) -> Result<ClaimAnswer, Error> {
        self.claim_as(key, fingerprint, lease, new_claim_id()).await
    }

    /// [`Client::claim`] with the caller's own claim id (a retry of a claim
    /// made earlier, by this process or one that took over its work).
    ///
    /// After an attempt that may have reached a leader (a lost reply, a
    /// timeout), a retry refused for good — a lease beyond a `lease_ms_max`
    /// lowered meanwhile, a key beyond a lowered `claim_key_bytes_max` — is
    /// [`Error::KeyOutcomeUnknown`]: the claim may have been won (and is
    /// held until its lease runs out). Only [`Error::KeyConflict`] stays
    /// definite. So is a reply that arrived but cannot be decoded. The same
    /// holds for the other claim calls, `FENCED` of a retry included (a
    /// release that was applied lets the next claim take over at once).
    pub async fn claim_as(
        &self,
        key: &[u8],
        fingerprint: &[u8],
        lease: Duration,
        claim_id: u128,
    ) -> Result<ClaimAnswer, Error> {
        let deadline = self.deadline();
        let request = proto::ClaimRequest {
            cluster_id: self.cluster_id(deadline).await?,
            key: key.to_vec(),
            fingerprint: fingerprint.to_vec(),
            lease_ms: millis(lease),
            claim_id: claim_id.to_be_bytes().to_vec(),
        };
        crate::check_message_size(&request)?;
        let reply = self
            .claim_call(key, deadline, request, |mut client, request| async move {
                client.claim(request).await
            })
            .await?;
        claim_answer(reply, key)
    }

    /// Records `result` as the effect's result under `fence`; every later
    /// claim of the key replays it. The same complete again (a retry) is
    /// answered from the record. [`Error::Fenced`] when the fence no longer
    /// holds the key, and when this fence completed it already with another
    /// result (`current_fence` is then `fence`: the first result stands);
    /// nothing is recorded either way. Returns the cluster time of the
    /// completion.
    pub async fn complete_claim(
        &self,
        key: &[u8],
        fence: u64,
        result: &[u8],
    ) -> Result<u64, Error> {
        let deadline = self.deadline();
        let request = proto::CompleteClaimRequest {
            cluster_id: self.cluster_id(deadline).await?,
            key: key.to_vec(),
            fence,
            result: result.to_vec(),
        };
        crate::check_message_size(&request)?;
        let reply = self
            .claim_call(key, deadline, request, |mut client, request| async move {
                client.complete_claim(request).await
            })
            .await?;
        Ok(reply.completed_ms)
    }

    /// Gives the key up under `fence` (the effect did not happen): the next
    /// claim wins at once. [`Error::Fenced`] when the fence no longer holds
    /// the key.
    pub async fn release_claim(&self, key: &[u8], fence: u64) -> Result<(), Error> {
        let deadline = self.deadline();
        let request = proto::ReleaseClaimRequest {
            cluster_id: self.cluster_id(deadline).await?,
            key: key.to_vec(),
            fence,
        };
        self.claim_call(key, deadline, request, |mut client, request| async move {
            client.release_claim(request).await
        })
        .await?;
        Ok(())
    }

    /// Extends the lease of `fence` to `lease` from now (in cluster time);
    /// the lease left. [`Error::Fenced`] when the fence no longer holds the
    /// key.
    pub async fn extend_claim(
        &self,
        key: &[u8],
        fence: u64,
        lease: Duration,
    ) -> Result<Duration, Error> {
        let deadline = self.deadline();
        let request = proto::ExtendClaimRequest {
            cluster_id: self.cluster_id(deadline).await?,
            key: key.to_vec(),
            fence,
            lease_ms: millis(lease),
        };
        let reply = self
            .claim_call(key, deadline, request, |mut client, request| async move {
                client.extend_claim(request).await
            })
            .await?;
        Ok(Duration::from_millis(reply.lease_ms_left))
    }

    /// Runs `effect` at most once per `key` across every process that asks
    /// (rule 20): claims the key (waiting out another holder's lease up to
    /// `options.wait`), runs `effect` with the claim's fence and attempt
    /// while a heartbeat extends the lease, then records its `Ok` bytes
    /// (every later call with the key gets them back without running
    /// anything: [`OnceOutcome::Replayed`]) or releases the key on `Err`
    /// (the next call runs it again). A holder that dies leaves a lease,
    /// not a stuck key: after it, the next call takes over with
    /// `attempt` + 1 and a larger fence.
    pub async fn once<F, Fut, E>(
        &self,
        key: &[u8],
        fingerprint: &[u8],
        options: &OnceOptions,
        effect: F,
    ) -> Result<OnceOutcome, OnceError<E>>
    where
        F: FnOnce(ClaimToken) -> Fut,
        Fut: Future<Output = Result<Vec<u8>, E>>,
    {
        self.once_observed(key, fingerprint, options, |_| {}, effect)
            .await
    }

    /// [`Client::once`], telling `on_in_progress` of every "in progress"
    /// answer met while claiming (with its `retry_after_ms`): a caller
    /// that counts how often it waited for another holder (the HTTP
    /// proxy's metrics) learns it without a claim loop of its own.
    pub async fn once_observed<F, Fut, E, W>(
        &self,
        key: &[u8],
        fingerprint: &[u8],
        options: &OnceOptions,
        on_in_progress: W,
        effect: F,
    ) -> Result<OnceOutcome, OnceError<E>>
    where
        F: FnOnce(ClaimToken) -> Fut,
        Fut: Future<Output = Result<Vec<u8>, E>>,
        W: FnMut(u64),
    {
        let token = match self
            .claim_waiting(key, fingerprint, options, on_in_progress)
            .await
        {
            Ok(Ok(token)) => token,
            Ok(Err(replayed)) => return Ok(replayed),
            Err(error) => return Err(OnceError::Claim(error)),
        };
        // Aborted when the effect ends — or when this future is dropped
        // mid-effect, so that a cancelled caller never leaves a heartbeat
        // extending its lease for ever.
        let heartbeat = AbortOnDrop(self.spawn_heartbeat(&token, options));
        let ran = effect(token.clone()).await;
        drop(heartbeat);
        match ran {
            Ok(result) => match self.complete_claim(key, token.fence, &result).await {
                Ok(_) => Ok(OnceOutcome::Ran {
                    result,
                    fence: token.fence,
                    attempt: token.attempt,
                }),
                Err(error) => Err(OnceError::Record { result, error }),
            },
            Err(error) => {
                let released = self.release_claim(key, token.fence).await;
                Err(OnceError::Failed { error, released })
            }
        }
    }

    /// Claims `key` with one claim id until won or completed, waiting out
    /// "in progress" answers up to `options.wait`: the won claim's token,
    /// or the recorded outcome.
    async fn claim_waiting(
        &self,
        key: &[u8],
        fingerprint: &[u8],
        options: &OnceOptions,
        mut on_in_progress: impl FnMut(u64),
    ) -> Result<Result<ClaimToken, OnceOutcome>, Error> {
        let claim_id = new_claim_id();
        let give_up = Instant::now() + options.wait;
        // Most holders finish long before their lease runs out: look again
        // soon, then less and less often.
        let mut backoff = WAIT_FIRST_PAUSE;
        loop {
            match self
                .claim_as(key, fingerprint, options.lease, claim_id)
                .await?
            {
                ClaimAnswer::Won { fence, attempt, .. } => {
                    return Ok(Ok(ClaimToken {
                        key: key.to_vec(),
                        fence,
                        attempt,
                        fenced: Arc::new(AtomicBool::new(false)),
                    }));
                }
                ClaimAnswer::Completed {
                    result,
                    completed_ms,
                    fence,
                    attempt,
                } => {
                    return Ok(Err(OnceOutcome::Replayed {
                        result,
                        fence,
                        attempt,
                        completed_ms,
                    }));
                }
                ClaimAnswer::InProgress { retry_after_ms, .. } => {
                    on_in_progress(retry_after_ms);
                    let now = Instant::now();
                    if now >= give_up {
                        return Err(Error::ClaimInProgress { retry_after_ms });
                    }
                    // Claim again when the holder's lease would run out, or
                    // sooner to see a completion early (after 25 ms, doubling
                    // to a second), never past the caller's patience.
                    let pause = Duration::from_millis(retry_after_ms.clamp(10, 1_000));
                    tokio::time::sleep(pause.min(backoff).min(give_up - now)).await;
                    backoff = (backoff * 2).min(WAIT_PAUSE_MAX);
                }
            }
        }
    }

    /// Extends the lease every heartbeat while the effect runs; marks the
    /// token fenced if an extend learns another holder took over.
    fn spawn_heartbeat(
        &self,
        token: &ClaimToken,
        options: &OnceOptions,
    ) -> tokio::task::JoinHandle<()> {
        let client = self.clone();
        let token = token.clone();
        let lease = options.lease;
        let every = options
            .heartbeat
            .unwrap_or(lease / 3)
            .max(Duration::from_millis(10));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                // Another failure (unreachable for now, or an unknown
                // outcome — FENCED on a retry proves nothing of the attempt
                // before it, but the next beat's first attempt says it for
                // sure): the next beat tries again, and the lease covers the
                // gap until it runs out.
                if let Err(Error::Fenced { .. }) =
                    client.extend_claim(&token.key, token.fence, lease).await
                {
                    token.fenced.store(true, Ordering::SeqCst);
                    return;
                }
            }
        })
    }

    /// One claim call, retried with the same request until `deadline`
    /// (the retry loop of every call without a session,
    /// [`Client::send_retried`]). A refusal for good is definite only when
    /// no earlier attempt may have reached a leader that applies it, or
    /// when it proves this request did not take effect (KEY_CONFLICT, see
    /// [`final_claim_error`]); any other is an unknown outcome (rule 22),
    /// and so is the deadline — the same request again learns it — unless a
    /// capacity limit refused every attempt before any could have run
    /// (`ResourceExhausted`).
    async fn claim_call<Req, Reply, F, Fut>(
        &self,
        key: &[u8],
        deadline: Instant,
        request: Req,
        call: F,
    ) -> Result<Reply, Error>
    where
        Req: Clone,
        F: Fn(ClientClient<AuthChannel>, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Reply>, tonic::Status>>,
    {
        let key_text = String::from_utf8_lossy(key).into_owned();
        let unknown = |reason: String| Error::KeyOutcomeUnknown {
            key: key_text.clone(),
            reason,
        };
        let sent = self
            .send_retried(deadline, |client, timeout| {
                let mut message = tonic::Request::new(request.clone());
                message.set_timeout(timeout);
                call(client, message)
            })
            .await;
        match sent.keyed_fate(unknown)? {
            Decided::Answered(reply) => Ok(reply.into_inner()),
            Decided::Refused { status, reached } => {
                Err(final_claim_error(&status, &key_text, reached))
            }
        }
    }
}

/// What a refusal for good of a claim call (Claim, CompleteClaim,
/// ReleaseClaim, ExtendClaim) means, given whether an earlier attempt may
/// have reached a leader that applies it (`reached`, rule 22). Before any
/// such attempt, the refusal is itself: nothing was recorded. After one,
/// only `KEY_CONFLICT` stays definite — the key's record holds another
/// fingerprint, and had an attempt of this claim won, its record would
/// answer every retry with that win. Every other refusal tells nothing of
/// the earlier attempt: `FENCED` (a release that was applied lets the next
/// claim take over at once, and the retry then meets the new holder),
/// `INVALID_ARGUMENT` (a lease beyond a `lease_ms_max` lowered since),
/// `LIMIT_EXCEEDED` (a key or result beyond a limit lowered since, judged
/// before the record, nothing recorded for it), `WRONG_CLUSTER`,
/// `PERMISSION_DENIED`, `UNAUTHENTICATED`… each an unknown outcome naming
/// the refusal. A refusal with no registry reason may have followed the
/// log: unknown either way.
fn final_claim_error(status: &tonic::Status, key: &str, reached: bool) -> Error {
    refusal_of_key(status, key, reached, |_| false)
}

/// A claim's answer. The reply came after the claim was sent, so one that
/// cannot be understood (no answer, say, beside a log index: applied) may
/// stand for a claim made: an unknown outcome, never "nothing happened".
fn claim_answer(reply: proto::ClaimReply, key: &[u8]) -> Result<ClaimAnswer, Error> {
    convert::claim_answer_from_proto(reply).map_err(|error| Error::KeyOutcomeUnknown {
        key: String::from_utf8_lossy(key).into_owned(),
        reason: format!("undecodable claim reply: {error}"),
    })
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::final_refusals;
    use oncekv_wire::status::{ErrorReason, error_detail, reason_status};
    use std::collections::VecDeque;
    use std::sync::Mutex;

    /// A reply lost after the leader applied the attempt, as the client
    /// sees it: the attempt may have reached a leader.
    fn lost_reply() -> tonic::Status {
        tonic::Status::cancelled("Timeout expired")
    }

    /// Runs one claim call whose attempts get `script`'s answers in turn
    /// (no node involved: the client's channel is never used).
    async fn scripted(script: Vec<Result<(), tonic::Status>>) -> Result<(), Error> {
        let client = Client::connect(["127.0.0.1:1"]);
        let script = Mutex::new(VecDeque::from(script));
        let deadline = Instant::now() + Duration::from_secs(5);
        client
            .claim_call(b"job", deadline, (), |_client, _request| {
                let next = script
                    .lock()
                    .unwrap()
                    .pop_front()
                    .unwrap_or_else(|| Err(lost_reply()));
                async move { next.map(tonic::Response::new) }
            })
            .await
    }

    /// Rule 22 for claims: the first attempt was applied (a claim won, a
    /// completion or release recorded) but its reply was lost; the retry
    /// with the same request is then refused for good — a lease beyond a
    /// `lease_ms_max` lowered meanwhile, a key beyond a lowered
    /// `claim_key_bytes_max`, FENCED after a release let another holder in.
    /// That proves nothing of the first attempt: the call's outcome is
    /// unknown, never "nothing ran". The same refusal on the first attempt,
    /// or after attempts that cannot have run, is definite.
    #[tokio::test(start_paused = true)]
    async fn a_claim_refusal_after_a_lost_reply_is_an_unknown_outcome() {
        let refusals = [
            reason_status(ErrorReason::InvalidArgument(
                "lease_ms 60000 is outside 1..=1000".into(),
            )),
            reason_status(ErrorReason::LimitExceeded(oncekv_core::LimitExceeded {
                limit: oncekv_core::Limit::ClaimKeyBytes,
                max: 2,
                requested: 3,
            })),
            reason_status(ErrorReason::Fenced { current_fence: 9 }),
            reason_status(ErrorReason::WrongCluster(oncekv_core::ClusterId(0xab))),
            reason_status(ErrorReason::PermissionDenied("role".into())),
        ];
        for refusal in refusals {
            let definite = Error::from_reason(&refusal, 0).expect("a reason");
            let after = scripted(vec![Err(lost_reply()), Err(refusal.clone())]).await;
            match &after {
                Err(Error::KeyOutcomeUnknown { key, reason }) => {
                    assert_eq!(key, "job");
                    assert!(reason.contains(&definite.to_string()), "{reason}");
                }
                other => panic!("{refusal:?} after a lost reply: {other:?}"),
            }
            assert_eq!(
                scripted(vec![Err(refusal.clone())]).await,
                Err(definite.clone()),
                "{refusal:?} on the first attempt"
            );
            // Refused at apply (a capacity limit): that attempt never ran.
            let full = reason_status(ErrorReason::ResourceExhausted(oncekv_core::Limit::Claims));
            assert_eq!(
                scripted(vec![Err(full), Err(refusal.clone())]).await,
                Err(definite),
                "{refusal:?} after an attempt that cannot have run"
            );
        }
        // KEY_CONFLICT is the key's record: definite either way.
        let conflict = reason_status(ErrorReason::KeyConflict);
        assert_eq!(
            scripted(vec![Err(lost_reply()), Err(conflict)]).await,
            Err(Error::KeyConflict { key: "job".into() })
        );
    }

    /// A capacity refusal (only the leader makes one) is retried at the node
    /// that made it, not passed on to the next endpoint, and reported as the
    /// limit when no attempt can have run: the same for every call without
    /// a session ([`Client::send_retried`]).
    #[tokio::test(start_paused = true)]
    async fn a_capacity_refusal_is_retried_at_the_leader() {
        let client = Client::connect(["leader:1", "follower:2"]);
        let asked = Mutex::new(Vec::new());
        let deadline = Instant::now() + Duration::from_secs(2);
        let answer = client
            .claim_call(b"job", deadline, (), |_client, _request| {
                let target = client.inner.follower.target().unwrap_or_default();
                asked.lock().unwrap().push(target.clone());
                async move {
                    Err::<tonic::Response<()>, _>(if target == "leader:1" {
                        reason_status(ErrorReason::ResourceExhausted(oncekv_core::Limit::Claims))
                    } else {
                        reason_status(ErrorReason::NotLeader {
                            leader_id: Some(1),
                            leader_client_addr: Some("leader:1".into()),
                            nothing_proposed: true,
                        })
                    })
                }
            })
            .await;
        assert!(
            matches!(&answer, Err(Error::ResourceExhausted(why)) if why.contains("claims_max")),
            "{answer:?}"
        );
        let asked = asked.lock().unwrap();
        assert!(asked.len() > 3, "{asked:?}");
        assert!(asked.iter().all(|target| target == "leader:1"), "{asked:?}");
    }

    /// The same judgement for every final refusal, before and after an
    /// attempt that may have reached a leader: only KEY_CONFLICT proves a
    /// claim call did not take effect.
    #[test]
    fn only_a_key_conflict_proves_a_claim_call_did_nothing() {
        let mut reasons = final_refusals();
        reasons.push(ErrorReason::Fenced { current_fence: 4 });
        for reason in reasons {
            let status = reason_status(reason.clone());
            let before = final_claim_error(&status, "k", false);
            let after = final_claim_error(&status, "k", true);
            if let ErrorReason::KeyConflict = reason {
                let conflict = Error::KeyConflict { key: "k".into() };
                assert_eq!((&before, &after), (&conflict, &conflict));
                continue;
            }
            assert_eq!(Some(before), Error::from_reason(&status, 0), "{reason:?}");
            assert!(
                matches!(&after, Error::KeyOutcomeUnknown { key, .. } if key == "k"),
                "{reason:?} after a send: {after:?}"
            );
        }
        let internal = tonic::Status::internal("unexpected");
        assert!(error_detail(&internal).is_none());
        assert!(matches!(
            final_claim_error(&internal, "k", false),
            Error::KeyOutcomeUnknown { .. }
        ));
    }

    /// A claim reply that arrived but cannot be understood — no answer
    /// beside a log index: the claim was applied — may stand for a claim
    /// won: an unknown outcome, not an invalid argument ("nothing ran").
    #[test]
    fn an_undecodable_claim_reply_is_an_unknown_outcome() {
        let reply = proto::ClaimReply {
            answer: None,
            log_index: 42,
        };
        let error = claim_answer(reply, b"job").expect_err("no answer");
        assert!(
            matches!(&error, Error::KeyOutcomeUnknown { key, reason }
                if key == "job" && reason.contains("undecodable claim reply")),
            "{error:?}"
        );
        assert_eq!(error.kind(), "outcome_unknown");
        let won = proto::ClaimReply {
            answer: Some(proto::claim_reply::Answer::Won(proto::ClaimWon {
                fence: 3,
                attempt: 1,
                ..proto::ClaimWon::default()
            })),
            log_index: 42,
        };
        assert!(matches!(
            claim_answer(won, b"job"),
            Ok(ClaimAnswer::Won {
                fence: 3,
                attempt: 1,
                ..
            })
        ));
    }
}
