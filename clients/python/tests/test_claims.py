"""Claims and `once` against a real cluster: the four calls (a lost claim
reply answered with the caller's own win, FENCED after a lease takeover,
KEY_CONFLICT), and `once` as a decorator and a context manager (recorded
value, replay without calling, release on an exception, fence and attempt
after a takeover, heartbeats past the lease, waiting out a holder), and
rule 22 for claim calls: a retry refused after a lost reply is an unknown
outcome."""

import threading
import time

import pytest

import oncekv
from helpers import DropReplies, ThenRun


def claim_until_won(client, key, fingerprint, lease, patience=10.0):
    deadline = time.monotonic() + patience
    while True:
        answer = client.claim(key, fingerprint, lease)
        if isinstance(answer, oncekv.Won):
            return answer
        assert isinstance(answer, oncekv.InProgress), answer
        assert time.monotonic() < deadline, "never won"
        time.sleep(min(max(answer.retry_after_ms, 10), 200) / 1000)


def test_claim_complete_and_replay(client, key):
    job = key("job")
    won = client.claim(job, "send invoice 1", lease=5)
    assert isinstance(won, oncekv.Won) and won.attempt == 1 and not won.duplicate
    busy = client.claim(job, "send invoice 1", lease=5)
    assert isinstance(busy, oncekv.InProgress) and busy.retry_after_ms > 0
    client.complete(job, won.fence, b"sent")
    done = client.claim(job, "send invoice 1", lease=5)
    assert isinstance(done, oncekv.Completed)
    assert (done.result, done.fence, done.attempt) == (b"sent", won.fence, 1)
    with pytest.raises(oncekv.KeyConflict) as conflict:
        client.claim(job, "send invoice 2", lease=5)
    assert not conflict.value.may_have_taken_effect


def test_a_claim_retried_after_a_lost_reply_gets_its_own_win_back(make_client, key):
    dropper = DropReplies("Claim", count=1)
    client = make_client(interceptors=[dropper])
    won = client.claim(key("job"), "f", lease=5)
    assert isinstance(won, oncekv.Won) and won.duplicate, "not 'in progress' against itself"
    assert dropper.dropped[0].won.fence == won.fence


def test_the_old_holder_is_fenced_after_a_lease_takeover(client, key):
    job = key("job")
    first = client.claim(job, "f", lease=0.3)
    second = claim_until_won(client, job, "f", lease=5)
    assert second.fence > first.fence and second.attempt == 2
    for stale_call in (lambda: client.complete(job, first.fence, b"late"),
                       lambda: client.extend(job, first.fence, 5),
                       lambda: client.release(job, first.fence)):
        with pytest.raises(oncekv.Fenced) as fenced:
            stale_call()
        assert fenced.value.current_fence == second.fence
        assert fenced.value.reason == "FENCED" and not fenced.value.may_have_taken_effect
    client.complete(job, second.fence, b"done")
    assert client.claim(job, "f", lease=5).result == b"done"


def test_once_decorator_records_and_replays_without_calling(client, key):
    calls = []

    @client.once(lambda order: key(f"charge-{order['id']}"), lease=5)
    def charge(order, fence, attempt):
        calls.append((order["id"], fence, attempt))
        return {"receipt": f"r-{order['id']}", "cents": order["cents"]}

    first = charge({"id": 1, "cents": 250})
    assert first == {"receipt": "r-1", "cents": 250}
    assert charge({"id": 1, "cents": 250}) == first, "replayed"
    assert charge({"id": 2, "cents": 99})["receipt"] == "r-2"
    assert [call[0] for call in calls] == [1, 2]
    assert calls[0][2] == 1 and calls[0][1] > 0


def test_once_releases_on_an_exception_and_the_next_call_runs_again(client, key):
    attempts = []

    @client.once(key("flaky"), lease=5)
    def flaky(attempt):
        attempts.append(attempt)
        if len(attempts) == 1:
            raise RuntimeError("provider down")
        return "ok"

    with pytest.raises(RuntimeError):
        flaky()
    assert flaky() == "ok"
    assert flaky() == "ok"
    assert len(attempts) == 2 and attempts[1] > attempts[0]


def test_once_after_a_dead_holder_passes_a_larger_fence_and_attempt(make_client, key):
    """A holder claims and dies (never completes); after its lease the next
    `once` takes over and its handler sees attempt 2 and a larger fence."""
    job = key("job")
    dead = make_client()
    fingerprint = "py:reconcile"
    first = dead.claim(job, fingerprint, lease=0.4)
    seen = []
    client = make_client()

    @client.once(job, fingerprint=fingerprint, lease=5, wait=10)
    def reconcile(fence, attempt, claim):
        seen.append((fence, attempt, claim.fence, oncekv.current_claim() is claim))
        return attempt

    assert reconcile() == 2
    fence, attempt, claim_fence, current = seen[0]
    assert fence > first.fence and attempt == 2 and claim_fence == fence and current


def test_once_context_manager(client, key):
    job = key("job")
    with client.once(job, fingerprint="migrate v7", lease=5) as run:
        assert not run.replayed and run.attempt == 1
        run.record({"migrated": 3})
    with client.once(job, fingerprint="migrate v7", lease=5) as run:
        assert run.replayed and run.result == {"migrated": 3}
    with pytest.raises(oncekv.KeyConflict):
        with client.once(job, fingerprint="migrate v8", lease=5):
            pass
    other = key("other")
    with pytest.raises(ValueError):
        with client.once(other, lease=5):
            raise ValueError("boom")
    with client.once(other, lease=5) as run:
        assert not run.replayed and run.attempt == 2, "released: runs again"


def test_heartbeats_hold_the_key_past_the_lease_and_waiters_replay(make_client, key):
    """The handler runs 2.5 leases long; the heartbeat keeps the key, so a
    second caller waits (in progress) and then replays the result: one run."""
    job = key("job")
    runs = []
    started = threading.Event()

    def handler():
        runs.append(1)
        started.set()
        time.sleep(2.0)
        return "slow result"

    holder = make_client()
    results = {}
    thread = threading.Thread(target=lambda: results.setdefault(
        "holder", holder.once(job, lease=0.8, heartbeat=0.1)(handler)()))
    thread.start()
    assert started.wait(10)
    waiter = make_client()
    results["waiter"] = waiter.once(job, lease=0.8, wait=10)(handler)()
    thread.join(10)
    assert results == {"holder": "slow result", "waiter": "slow result"}
    assert len(runs) == 1


def test_in_progress_past_the_wait_is_claim_in_progress(make_client, key):
    job = key("job")
    holder = make_client()
    holder.claim(job, "py:x", lease=5)
    with pytest.raises(oncekv.ClaimInProgress) as busy:
        holder.once(job, fingerprint="py:x", lease=5, wait=0.2)(lambda: "never")()
    assert busy.value.retry_after_ms > 0 and not busy.value.may_have_taken_effect


def test_a_fenced_holder_gets_result_not_recorded(make_client, key):
    """A handler that stalls past its lease without heartbeats is taken
    over; its result is not recorded (FENCED) and the new holder's is."""
    job = key("job")
    slow = make_client()
    other = make_client()

    def stall(claim):
        # Another holder takes over while this one stalls.
        taken = claim_until_won(other, job, "py:stall", lease=5)
        other.complete(job, taken.fence, b'"theirs"')
        return "mine"

    with pytest.raises(oncekv.ResultNotRecorded) as lost:
        slow.once(job, fingerprint="py:stall", lease=0.3, heartbeat=60)(stall)()
    assert lost.value.fenced and lost.value.result == "mine"
    assert lost.value.may_have_taken_effect
    assert slow.once(job, fingerprint="py:stall", lease=5)(stall)() == "theirs"


def test_a_result_beyond_the_grpc_message_limit_is_refused_before_it_is_sent(client, key):
    """A result grpc could not send (over 8 MiB) is a definite
    `LimitExceeded`, not an unknown outcome: the holder still holds the
    key and can complete it with a result that fits; `once` reports it as
    `ResultNotRecorded` with that error."""
    job = key("job")
    won = client.claim(job, "f", lease=30)
    with pytest.raises(oncekv.LimitExceeded) as exceeded:
        client.complete(job, won.fence, b"r" * (9 << 20))
    assert exceeded.value.limit == "grpc_message_bytes_max"
    assert "gRPC message limit" in str(exceeded.value)
    assert not exceeded.value.may_have_taken_effect
    client.complete(job, won.fence, b"fits")
    assert client.claim(job, "f", lease=30).result == b"fits"

    @client.once(key("big"), lease=5)
    def big():
        return "r" * (9 << 20)

    with pytest.raises(oncekv.ResultNotRecorded) as lost:
        big()
    assert isinstance(lost.value.error, oncekv.LimitExceeded), lost.value.error


def test_a_claim_refused_for_claims_max_on_every_attempt_is_resource_exhausted(
        make_client, key, admin_stub):
    """At `claims_max` every attempt of a new claim is refused when its
    entry applies (and a follower first asked proposes nothing): nothing
    can have run, so the call raises `ResourceExhausted` naming the limit
    (not `Unavailable`, not an unknown outcome) — rule 22's proof."""
    from oncekv._proto import oncekv_pb2 as pb

    stub = admin_stub()
    config = stub.GetConfig(pb.GetConfigRequest(), timeout=5).config
    cluster_id = make_client().status().cluster_id

    def set_claims_max(value):
        stub.SetConfig(pb.SetConfigRequest(
            cluster_id=cluster_id, patch=pb.RegistryConfigPatch(claims_max=value)), timeout=5)

    client = make_client(call_timeout=2.0)
    set_claims_max(1)
    try:
        # At most one claim is live under the limit: this one, or another
        # test's, so the next one is refused either way.
        try:
            client.claim(key("first"), b"f", lease=60.0)
        except oncekv.ResourceExhausted:
            pass
        with pytest.raises(oncekv.ResourceExhausted) as refused:
            client.claim(key("second"), b"f", lease=60.0)
        assert "claims_max" in str(refused.value), refused.value
        assert not refused.value.may_have_taken_effect
    finally:
        set_claims_max(config.claims_max)


def test_a_claim_refused_after_its_reply_was_lost_is_an_unknown_outcome(make_client, key,
                                                                        admin_stub):
    """Rule 22 for claims: the leader applied the claim (won, fence N) but
    its reply was lost; before the retry (the same claim id) an operator
    lowered `lease_ms_max` below the lease asked, so the retry is refused
    INVALID_ARGUMENT. That says nothing of the first attempt: the call is
    `KeyOutcomeUnknown`, never "nothing ran" — the key is in fact held, and
    the same claim id gets its own win back once the limit is restored."""
    from oncekv._proto import oncekv_pb2 as pb

    stub = admin_stub()
    config = stub.GetConfig(pb.GetConfigRequest(), timeout=5).config
    cluster_id = make_client().status().cluster_id

    def set_lease_ms_max(value):
        stub.SetConfig(pb.SetConfigRequest(
            cluster_id=cluster_id, patch=pb.RegistryConfigPatch(lease_ms_max=value)), timeout=5)

    job, claim_id = key("job"), b"same-claim-id-16"
    client = make_client(interceptors=[ThenRun("Claim", lambda: set_lease_ms_max(1000))])
    try:
        with pytest.raises(oncekv.KeyOutcomeUnknown) as unknown:
            client.claim(job, "f", lease=30.0, claim_id=claim_id)
        assert unknown.value.may_have_taken_effect
        assert isinstance(unknown.value.cause, oncekv.InvalidArgument), unknown.value.cause
    finally:
        set_lease_ms_max(config.lease_ms_max)
    won = client.claim(job, "f", lease=30.0, claim_id=claim_id)
    assert isinstance(won, oncekv.Won) and won.duplicate, "it had been won: 'nothing ran' was a lie"


def test_a_release_whose_retry_is_fenced_is_an_unknown_outcome(make_client, key):
    """The release was applied but its reply lost; another caller's claim
    then won at once (a release lets the next claim in), so the retry of
    the release is FENCED. That refusal says nothing of the first attempt
    (which did release the key): `KeyOutcomeUnknown`, not `Fenced`
    ("nothing was recorded")."""
    job = key("job")
    holder, other = make_client(), make_client()
    won = holder.claim(job, "f", lease=30.0)
    assert isinstance(won, oncekv.Won)
    taken = []
    releasing = make_client(interceptors=[ThenRun(
        "ReleaseClaim", lambda: taken.append(other.claim(job, "f", lease=30.0)))])
    with pytest.raises(oncekv.KeyOutcomeUnknown) as unknown:
        releasing.release(job, won.fence)
    assert isinstance(unknown.value.cause, oncekv.Fenced), unknown.value.cause
    assert isinstance(taken[0], oncekv.Won) and taken[0].fence > won.fence, "it was released"
