"""The pure parts, without a cluster: seq numbering and the floor, leader
following, what each failure means (retry, final, may have reached a
leader), one error class per wire reason, and the request limits."""

import time

import grpc
import pytest

import oncekv
from oncekv import errors
from oncekv._proto import oncekv_pb2 as pb
from oncekv.policy import LEARNT_ENDPOINTS_MAX, Backoff, Failure, Failures, Leader
from oncekv.seqs import Seqs
from helpers import LostReply, Refusal, ScriptedNodes, wait_out


def failure(reason=None, code=grpc.StatusCode.UNAVAILABLE, message="m", **detail):
    if reason is None:
        return Failure(code=code, message=message)
    return Failure(code=code, message=message,
                   detail=pb.ErrorDetail(reason=pb.Reason.Value(reason), **detail))


def test_floor_follows_the_lowest_unanswered_seq_in_any_order():
    seqs = Seqs(16)
    assert [seqs.try_begin() for _ in range(5)] == [1, 2, 3, 4, 5]
    assert not seqs.finish(3) and not seqs.finish(5)
    assert seqs.first_outstanding() == 1
    assert seqs.finish(1) and seqs.first_outstanding() == 2
    assert seqs.finish(2) and seqs.first_outstanding() == 4
    assert seqs.finish(4) and seqs.first_outstanding() == 6


def test_window_bounds_new_seqs():
    seqs = Seqs(3)
    assert [seqs.try_begin() for _ in range(3)] == [1, 2, 3]
    assert seqs.try_begin() is None
    seqs.finish(3)
    assert seqs.try_begin() is None, "seq 4 >= floor 1 + window 3"
    seqs.finish(1)
    assert seqs.try_begin() == 4


def test_floor_stays_within_a_window_of_the_confirmed_floor():
    """Requests given up during an outage never move the floor more than a
    window past the confirmed one; a confirmation lets it move on."""
    seqs = Seqs(2)
    given_up = []
    while True:
        seq = seqs.try_begin()
        if seq is None:
            break
        seqs.finish(seq)
        given_up.append(seq)
        assert seqs.first_outstanding() <= 3
    assert given_up == [1, 2, 3, 4]
    assert seqs.fence_pending() and seqs.first_outstanding() == 3
    assert seqs.confirm(3)
    assert seqs.first_outstanding() == 5 and not seqs.fence_pending()


def test_hints_are_followed_and_learnt_endpoints_bounded():
    leader = Leader(["a", "b"])
    assert leader.target() == "a"
    assert leader.follow("c") and leader.target() == "c"
    assert not leader.follow("c"), "the same target: back off"
    for number in range(100):
        assert leader.follow(f"learnt-{number}")
        assert len(leader.endpoints) <= 2 + LEARNT_ENDPOINTS_MAX
    assert leader.endpoints[:2] == ["a", "b"]
    visited = set()
    for _ in range(len(leader.endpoints)):
        assert not leader.follow(None)
        visited.add(leader.target())
    assert visited == set(leader.endpoints), "rotation visits every endpoint"


def test_backoff_is_jittered_capped_and_within_the_deadline():
    backoff = Backoff(base=0.01, cap=0.1)
    assert [backoff.ceiling(n) for n in range(5)] == [0.01, 0.02, 0.04, 0.08, 0.1]
    assert backoff.delay(10, remaining=0.005, unit=0.9) == 0.005
    assert 0 <= backoff.delay(3, remaining=1.0) <= 0.08


def test_verdicts_follow_the_error_table():
    assert failure("NOT_LEADER", leader_client_addr="h:1").retry_hint() == (True, "h:1")
    assert failure("NOT_LEADER").retry_hint() == (True, None)
    for reason in ("UNAVAILABLE", "TOO_MANY_OUTSTANDING", "RESOURCE_EXHAUSTED"):
        assert failure(reason).retry_hint() == (True, None), reason
    for reason in ("SESSION_EXPIRED", "WRONG_CLUSTER", "SEQ_CONFLICT", "RESPONSE_DISCARDED",
                   "INVALID_ARGUMENT", "LIMIT_EXCEEDED", "UNAUTHENTICATED",
                   "PERMISSION_DENIED", "KEY_CONFLICT", "FENCED"):
        assert failure(reason).retry_hint() == (False, None), reason
    for code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                 grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN):
        assert failure(code=code).retry_hint() == (True, None)
    assert failure(code=grpc.StatusCode.UNIMPLEMENTED).retry_hint() == (False, None)


def test_only_proof_says_an_attempt_did_not_reach_a_leader():
    """Rule 22: a refusal at apply (window, capacity), a NOT_LEADER from a
    node that proposed nothing and a connection that could not be made
    prove nothing was applied; anything else may have reached a leader,
    any other NOT_LEADER included."""
    assert not failure("TOO_MANY_OUTSTANDING").may_have_reached()
    assert not failure("RESOURCE_EXHAUSTED").may_have_reached()
    refused = failure(message="failed to connect to all addresses; last error: UNKNOWN: "
                              "ipv4:127.0.0.1:1: Failed to connect to remote host: "
                              "Connection refused")
    assert refused.never_sent() and not refused.may_have_reached()
    assert failure("NOT_LEADER").may_have_reached()
    assert not failure("NOT_LEADER", nothing_proposed=True).may_have_reached()
    assert failure("UNAVAILABLE").may_have_reached()
    assert failure(code=grpc.StatusCode.DEADLINE_EXCEEDED).may_have_reached()
    assert failure(message="Socket closed").may_have_reached()


def test_a_capacity_limit_that_refused_every_attempt_is_said_as_such():
    """Out of time after capacity refusals, none of which can have run
    (with NOT_LEADER hops that proposed nothing between them): the limit
    (`ResourceExhausted`), not "unknown"; after any attempt that may have
    reached a leader, nothing is said; with time left for another
    attempt, nothing is decided yet."""
    failures = Failures()
    failures.note(failure("NOT_LEADER", nothing_proposed=True))
    failures.note(failure("RESOURCE_EXHAUSTED", limit="claims_max"))
    failures.note(failure("NOT_LEADER", nothing_proposed=True))
    exhausted = failures.exhausted_before_any_reach(reached=False)
    assert isinstance(exhausted, errors.ResourceExhausted), exhausted
    assert failures.exhausted_before_any_reach(reached=True) is None
    assert failures.exhausted_and_out_of_time(False, deadline=10.0, now=9.995) is not None
    assert failures.exhausted_and_out_of_time(False, deadline=10.0, now=9.0) is None
    assert Failures().exhausted_before_any_reach(reached=False) is None


def test_out_of_time_counts_the_slowest_attempt():
    """Too little time left is under MIN_ATTEMPT_TIME or under twice the
    slowest attempt measured, whichever is more."""
    failures = Failures()
    failures.note(failure("RESOURCE_EXHAUSTED", limit="keys_max"))
    now = time.monotonic()
    assert failures.exhausted_and_out_of_time(False, deadline=now + 10, now=now) is None
    time.sleep(0.06)
    failures.note(failure("RESOURCE_EXHAUSTED", limit="keys_max"))
    now = time.monotonic()
    assert failures.exhausted_and_out_of_time(False, deadline=now + 0.1, now=now) is not None
    assert failures.exhausted_and_out_of_time(False, deadline=now + 0.5, now=now) is None


def test_every_wire_reason_has_its_own_exception_class():
    # NOT_CAUGHT_UP answers only the Admin service, which this client
    # does not call.
    names = [name for name in pb.Reason.keys()
             if name not in ("REASON_UNSPECIFIED", "NOT_CAUGHT_UP")]
    classes = {name: type(failure(name).error()) for name in names}
    assert sorted(classes) == sorted(errors.REASON_ERRORS)
    assert len(set(classes.values())) == len(names), "one class per reason"
    for name, cls in classes.items():
        assert cls.reason == name
        assert issubclass(cls, oncekv.OncekvError)
        assert cls.may_have_taken_effect is False
    assert errors.OutcomeUnknown("x").may_have_taken_effect
    assert errors.KeyOutcomeUnknown("x").may_have_taken_effect
    assert errors.ResultNotRecorded("x").may_have_taken_effect
    assert not errors.ClaimInProgress("x").may_have_taken_effect
    fenced = failure("FENCED", code=grpc.StatusCode.FAILED_PRECONDITION, current_fence=7).error()
    assert isinstance(fenced, oncekv.Fenced) and fenced.current_fence == 7
    exceeded = failure("LIMIT_EXCEEDED", limit="value_bytes_max", limit_max=4,
                       limit_requested=5).error()
    assert (exceeded.limit, exceeded.limit_max, exceeded.limit_requested) == (
        "value_bytes_max", 4, 5)


def test_request_limits_are_checked_before_sending():
    limits = pb.RequestLimits(key_bytes_max=4, value_bytes_max=10, list_elements_max=2)
    oncekv.Put("abcd", b"x" * 10).check_limits(limits)
    with pytest.raises(oncekv.LimitExceeded) as key:
        oncekv.Put("abcde", b"x").check_limits(limits)
    assert key.value.limit == "key_bytes_max"
    with pytest.raises(oncekv.LimitExceeded) as value:
        oncekv.Put("k", b"x" * 11).check_limits(limits)
    assert (value.value.limit_max, value.value.limit_requested) == (10, 11)
    with pytest.raises(oncekv.LimitExceeded):
        oncekv.Append("k", b"xxx").check_limits(limits)  # 3 + 8 bytes
    oncekv.Delete("a-very-long-key").check_limits(limits)  # never refused


def test_bad_input_is_invalid_argument():
    """Every argument of a public call is checked before anything is sent:
    a wrong type or a value out of range is `InvalidArgument` (also a
    `ValueError`), never a built-in exception from deeper down, nor sent as
    something else (a fence of None as 0)."""
    client = oncekv.Client("127.0.0.1:1", call_timeout=0.2, attempt_timeout=0.1)
    nodes = ScriptedNodes(client, lambda endpoint, method, request, timeout: wait_out(timeout))
    for bad in (lambda: oncekv.Put("", b"v"), lambda: oncekv.Increment("k", 2**63),
                lambda: oncekv.Increment("k", True), lambda: oncekv.Put("k", 1.5),
                lambda: client.execute_plain("put"), lambda: client.execute("put"),
                lambda: client.execute_with_key("m", "put"),
                lambda: client.put("\udcff", b"v"), lambda: client.get(b""),
                lambda: client.complete("job", "1", b"r"), lambda: client.complete("job", -1, b"r"),
                lambda: client.extend("job", 2**64, 5), lambda: client.release("job", None),
                lambda: client.release("job", 1.0),
                lambda: client.claim("job", "f", 5, claim_id="0123456789abcdef"),
                lambda: client.claim("job", "f", 5, claim_id=b"short"),
                lambda: client.claim("job", "f", float("nan")),
                lambda: client.claim("job", "f", float("inf")),
                lambda: client.claim("job", "f", 10**400), lambda: client.claim("job", "f", -1),
                lambda: client.extend("job", 1, "5"), lambda: client.once("job", wait="x"),
                lambda: client.once("job", heartbeat=0), lambda: client.once("job", lease=None),
                lambda: oncekv.Client(None), lambda: oncekv.Client([7101]),
                lambda: oncekv.Client(""), lambda: oncekv.Client("h:1", token=5),
                lambda: oncekv.Client("h:1", token="t\u00f6k\u00e9n"),
                lambda: oncekv.Client("h:1", token="two words"),
                lambda: oncekv.Client("h:1", call_timeout=0),
                lambda: oncekv.Client("h:1", attempt_timeout=-1)):
        with pytest.raises(oncekv.InvalidArgument):
            bad()
    assert nodes.asked == [], "nothing was sent"
    assert issubclass(oncekv.InvalidArgument, ValueError)
    oncekv.Client(("a:1", " b:2 "), token="printable-ASCII_token.1", call_timeout=1)


def test_a_call_waiting_for_room_in_the_window_wakes_when_a_seq_finishes():
    import threading
    import time

    from oncekv.client import _Session

    client = oncekv.Client("127.0.0.1:1")
    session = _Session(pb.RegisterReply(client_id=1, window=2, session_ttl_ms=60000))
    first = client._take_seq(session, time.monotonic() + 5)
    assert client._take_seq(session, time.monotonic() + 5) == 2
    got = []
    waiter = threading.Thread(target=lambda: got.append(client._take_seq(session, time.monotonic() + 5)))
    waiter.start()
    time.sleep(0.1)
    assert got == [], "no room: seq 3 >= floor 1 + window 2"
    started = time.monotonic()
    session.finish(first)
    waiter.join(5)
    assert got == [3] and time.monotonic() - started < 1


def sessions_full():
    return Refusal("RESOURCE_EXHAUSTED", code=grpc.StatusCode.RESOURCE_EXHAUSTED,
                   message="replicated limit sessions_max reached", limit="sessions_max")


def test_registering_at_sessions_max_is_resource_exhausted_not_unavailable():
    """The leader refuses a registration for `sessions_max`: the client
    retries it there (never moving on to a follower, which answers late or
    NOT_LEADER) and at the deadline raises `ResourceExhausted` naming the
    limit — not `Unavailable` ("not the leader", a timeout) after the last
    endpoint it happened to try."""
    for endpoints in (["leader:1", "follower:2"], ["follower:2", "leader:1"]):
        client = oncekv.Client(endpoints, call_timeout=0.5, attempt_timeout=0.3)

        def answer(endpoint, method, request, timeout):
            if endpoint == "leader:1":
                raise sessions_full()
            if ("follower:2", method) in nodes.asked[:-1]:
                wait_out(timeout)  # cut off now: the deadline would pass here
            raise Refusal("NOT_LEADER", message="not the leader", leader_client_addr="leader:1")

        nodes = ScriptedNodes(client, answer)
        with pytest.raises(oncekv.ResourceExhausted) as refused:
            client.client_id()
        assert refused.value.limit == "sessions_max", refused.value
        assert "sessions_max" in str(refused.value)
        assert not refused.value.may_have_taken_effect
        asked = nodes.endpoints_asked("Register")
        assert asked.count("follower:2") == (endpoints[0] == "follower:2"), asked
        assert asked.count("leader:1") > 2, "retried at the leader until the deadline"


def test_a_call_on_the_leader_reports_its_most_informative_failure():
    """Out of time, a call on the leader reports the most telling failure it
    met (a capacity limit over NOT_LEADER over a timeout), not merely the
    last; a final refusal ends it at once, whichever node made it."""
    client = oncekv.Client(["a:1", "b:2"], call_timeout=0.6, attempt_timeout=0.1)
    calls = []

    def answer(endpoint, method, request, timeout):
        calls.append(endpoint)
        if endpoint == "a:1" and len(calls) == 1:
            raise sessions_full()  # once; then the leader is gone
        if endpoint == "a:1":
            raise Refusal("NOT_LEADER", message="not the leader", leader_client_addr="b:2")
        wait_out(timeout)

    ScriptedNodes(client, answer)
    with pytest.raises(oncekv.ResourceExhausted) as refused:
        client.client_id()
    assert refused.value.limit == "sessions_max"

    client = oncekv.Client(["a:1", "b:2"], call_timeout=5.0)

    def denied(endpoint, method, request, timeout):
        if endpoint == "a:1":
            raise Refusal("NOT_LEADER", message="not the leader", leader_client_addr="b:2")
        raise Refusal("PERMISSION_DENIED", code=grpc.StatusCode.PERMISSION_DENIED,
                      message="role client may not")

    nodes = ScriptedNodes(client, denied)
    started = time.monotonic()
    with pytest.raises(oncekv.PermissionDenied):
        client.client_id()
    assert nodes.endpoints_asked("Register") == ["a:1", "b:2"]
    assert time.monotonic() - started < 1, "a final refusal ends the call at once"

    client = oncekv.Client(["a:1"], call_timeout=0.3, attempt_timeout=0.1)
    ScriptedNodes(client, lambda endpoint, method, request, timeout: wait_out(timeout))
    with pytest.raises(oncekv.Unavailable):
        client.get("k")


def claim_client(script):
    """A client whose claim calls get `script`'s answers in turn."""
    client = oncekv.Client(["leader:1"], call_timeout=5.0)
    script = list(script)

    def answer(endpoint, method, request, timeout):
        step = script.pop(0) if script else LostReply()
        if isinstance(step, BaseException):
            raise step
        return step

    ScriptedNodes(client, answer)
    return client


def test_a_claim_refusal_after_a_lost_reply_is_an_unknown_outcome():
    """Rule 22 for claims: the first attempt was applied (a claim won, a
    release recorded) but its reply was lost; the retry is refused for good
    — a lease beyond a lease_ms_max lowered meanwhile, a key beyond a
    lowered claim_key_bytes_max, FENCED after the release let another
    holder in, another cluster. That says nothing of the first attempt:
    `KeyOutcomeUnknown` (may have taken effect), the refusal as `.cause`.
    The same refusal on the first attempt, or after attempts that cannot
    have run (refused for a capacity limit), is definite; KEY_CONFLICT is
    definite always."""
    refusals = [
        (lambda: Refusal("INVALID_ARGUMENT", code=grpc.StatusCode.INVALID_ARGUMENT,
                         message="lease_ms 30000 is outside 1..=1000"), oncekv.InvalidArgument),
        (lambda: Refusal("LIMIT_EXCEEDED", code=grpc.StatusCode.INVALID_ARGUMENT,
                         message="claim key too long", limit="claim_key_bytes_max",
                         limit_max=2, limit_requested=3), oncekv.LimitExceeded),
        (lambda: Refusal("FENCED", code=grpc.StatusCode.FAILED_PRECONDITION,
                         message="fenced", current_fence=9), oncekv.Fenced),
        (lambda: Refusal("WRONG_CLUSTER", code=grpc.StatusCode.FAILED_PRECONDITION,
                         message="another cluster"), oncekv.WrongCluster),
    ]
    calls = [
        lambda client: client.claim("job", "f", lease=30, claim_id=b"c" * 16),
        lambda client: client.complete("job", 3, b"done"),
        lambda client: client.release("job", 3),
        lambda client: client.extend("job", 3, 30),
    ]
    full = lambda: Refusal("RESOURCE_EXHAUSTED", code=grpc.StatusCode.RESOURCE_EXHAUSTED,
                           message="replicated limit claims_max reached", limit="claims_max")
    for refusal, definite in refusals:
        for call in calls:
            with pytest.raises(oncekv.KeyOutcomeUnknown) as unknown:
                call(claim_client([LostReply(), refusal()]))
            assert unknown.value.may_have_taken_effect and unknown.value.key == b"job"
            assert isinstance(unknown.value.cause, definite), unknown.value.cause
            with pytest.raises(definite) as first:
                call(claim_client([refusal()]))
            assert not first.value.may_have_taken_effect
            with pytest.raises(definite):
                call(claim_client([full(), refusal()]))
    conflict = Refusal("KEY_CONFLICT", code=grpc.StatusCode.ALREADY_EXISTS, message="conflict")
    with pytest.raises(oncekv.KeyConflict):
        calls[0](claim_client([LostReply(), conflict]))


def test_a_capacity_refusal_is_retried_at_the_leader_by_every_call():
    """A capacity refusal (only the leader makes one) is retried at the node
    that made it, not passed on to the next endpoint — by a claim (any call
    without a session) as by a session's request — and reported as the
    limit when no attempt can have run."""
    client = oncekv.Client(["leader:1", "follower:2"], call_timeout=0.5)

    def answer(endpoint, method, request, timeout):
        if method == "Register":
            return pb.RegisterReply(client_id=1, window=8, session_ttl_ms=60000)
        if method == "KeepAlive":
            return pb.KeepAliveReply(floor=request.first_outstanding_seq)
        if endpoint == "leader:1":
            raise Refusal("RESOURCE_EXHAUSTED", code=grpc.StatusCode.RESOURCE_EXHAUSTED,
                          message="replicated limit claims_max reached", limit="claims_max")
        raise Refusal("NOT_LEADER", message="not the leader", leader_client_addr="leader:1",
                      nothing_proposed=True)

    nodes = ScriptedNodes(client, answer)
    with pytest.raises(oncekv.ResourceExhausted):
        client.claim("job", "f", lease=30)
    with pytest.raises(oncekv.ResourceExhausted):
        client.increment("n", 1)
    for method in ("Claim", "Execute"):
        asked = nodes.endpoints_asked(method)
        assert len(asked) > 2 and set(asked) == {"leader:1"}, (method, asked)
    client.close()


def test_an_undecodable_reply_after_a_send_is_an_unknown_outcome():
    """A reply that came but cannot be understood stands for a request that
    was applied: unknown, never "nothing ran"."""
    client = claim_client([pb.ClaimReply(log_index=7)])
    with pytest.raises(oncekv.KeyOutcomeUnknown) as unknown:
        client.claim("job", "f", lease=30)
    assert unknown.value.may_have_taken_effect
    client = claim_client([pb.ExecuteReply(log_index=7)])
    with pytest.raises(oncekv.PlainOutcomeUnknown):
        client.execute_plain(oncekv.Increment("n", 1))
