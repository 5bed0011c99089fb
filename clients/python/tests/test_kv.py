"""The key-value calls against a real 3-node cluster: sessions (typed
results, a retry after a lost reply answered with the original response
and the same seq), idempotency keys (duplicates, KEY_CONFLICT), limits
refused before sending (the replicated ones and gRPC's 8 MiB message
limit), and SESSION_EXPIRED as a definite refusal."""

import pytest

import oncekv
from oncekv._proto import oncekv_pb2 as pb
from helpers import DropReplies


def test_kv_calls_return_typed_results(client, key):
    counter, name, items = key("counter"), key("name"), key("items")
    assert client.increment(counter, 5) == 5
    assert client.increment(counter, -2) == 3
    assert client.get(counter) == 3
    client.put(name, "ada")
    assert client.get(name) == b"ada"
    assert client.compare_and_swap(name, "ada", 7) == (True, 7)
    assert client.compare_and_swap(name, "ada", 8) == (False, 7), "failed swap shows the value"
    assert client.append(items, b"a") == 1 and client.append(items, "b") == 2
    assert client.get(items) == [b"a", b"b"]
    assert client.compare_and_swap(key("absent"), None, b"x") == (True, b"x")
    assert client.delete(name) is True and client.delete(name) is False
    assert client.get(name) is None
    with pytest.raises(oncekv.WrongType) as wrong:
        client.increment(items, 1)
    assert wrong.value.actual == "list" and not wrong.value.may_have_taken_effect
    client.put(counter, 2**63 - 1)
    with pytest.raises(oncekv.IncrementOverflow):
        client.increment(counter, 1)


def test_a_retry_after_a_lost_reply_gets_the_original_answer_under_the_same_seq(make_client, key):
    """The first reply of an increment is lost after the node executed it:
    the client retries the same (client id, seq), the registry answers from
    its cache (duplicate), and the value moved once."""
    events = []
    dropper = DropReplies("Execute", count=1)
    client = make_client(interceptors=[dropper], observer=events.append)
    counter = key("counter")
    assert client.increment(counter, 10) == 10
    assert len(dropper.dropped) == 1 and dropper.dropped[0].duplicate is False
    answered = [event for event in events if event.outcome == "answered"]
    retried = [event for event in events if event.outcome == "retry"]
    # The lost reply sends the client to the next endpoint (no hint), which
    # may point it back at the leader (NOT_LEADER): every attempt carries
    # the same seq.
    assert len(answered) == 1 and retried and retried[0].reason == "UNAVAILABLE"
    assert {event.seq for event in events} == {answered[0].seq}, "every retry reuses the seq"
    assert answered[0].duplicate, "the registry answered the retry from its cache"
    assert answered[0].attempt >= 1
    assert client.get(counter) == 10, "executed once"
    # A compare-and-swap that failed replays as failed, even though the
    # data would let it swap now.
    name = key("name")
    client.put(name, "bob")
    dropper.remaining = 1
    assert client.compare_and_swap(name, "ada", "eve") == (False, b"bob")
    client.put(name, "ada")
    assert client.get(name) == b"ada"


def test_idempotency_keys_replay_and_refuse_another_command(client, key):
    paid, order = key("paid"), key("order-1")
    first = client.execute_with_key(order, oncekv.Increment(paid, 5))
    assert first.result == oncekv.Incremented(5) and not first.duplicate
    again = client.execute_with_key(order, oncekv.Increment(paid, 5))
    assert again.result == oncekv.Incremented(5) and again.duplicate
    with pytest.raises(oncekv.KeyConflict) as conflict:
        client.execute_with_key(order, oncekv.Increment(paid, 6))
    assert conflict.value.reason == "KEY_CONFLICT"
    assert not conflict.value.may_have_taken_effect and conflict.value.final
    assert client.get(paid) == 5


def test_a_keyed_retry_after_a_lost_reply_is_a_duplicate(make_client, key):
    dropper = DropReplies("ExecuteKeyed", count=1)
    client = make_client(interceptors=[dropper])
    reply = client.execute_with_key(key("msg-1"), oncekv.Append(key("inbox"), b"hello"))
    assert reply.duplicate and reply.result == oncekv.Appended(1)
    assert client.get(key("inbox")) == [b"hello"]


def test_a_request_breaking_a_limit_is_refused_before_it_is_sent(make_client, key):
    events = []
    client = make_client(observer=events.append)
    client.put(key("small"), b"x")  # registers: the session learns the limits
    events.clear()
    with pytest.raises(oncekv.LimitExceeded) as exceeded:
        client.put(key("big"), b"x" * (64 * 1024 + 1))
    assert exceeded.value.limit == "value_bytes_max"
    assert exceeded.value.limit_requested == 64 * 1024 + 1
    assert events == [], "nothing was sent"
    with pytest.raises(oncekv.InvalidArgument):
        client.put("", b"x")


def test_a_request_beyond_the_grpc_message_limit_is_refused_before_it_is_sent(make_client, key):
    """grpc refuses to send a message over 8 MiB: the client refuses it
    first, as a definite `LimitExceeded` — never "outcome unknown", and
    for a session without taking (and fencing) a seq; the key stays
    unused."""
    events = []
    client = make_client(observer=events.append)
    huge = b"x" * (9 << 20)
    client.put(key("small"), b"x")  # seq 1
    events.clear()
    calls = [
        # Within value_bytes_max (only `new` is charged), beyond 8 MiB encoded.
        lambda: client.compare_and_swap(key("cas"), huge, b"y"),
        lambda: client.execute_with_key(key("msg"), oncekv.Put(key("keyed"), huge)),
        lambda: client.execute_plain(oncekv.Put(key("plain"), huge)),
    ]
    for call in calls:
        with pytest.raises(oncekv.LimitExceeded) as exceeded:
            call()
        assert exceeded.value.limit == "grpc_message_bytes_max"
        assert exceeded.value.limit_max == 8 << 20 and exceeded.value.limit_requested > 9 << 20
        assert "gRPC message limit" in str(exceeded.value)
        assert not exceeded.value.may_have_taken_effect
    assert events == [], "nothing was sent"
    assert client.increment(key("counter"), 1) == 1
    assert {event.seq for event in events} == {2}, "no seq was taken by the refused request"
    reply = client.execute_with_key(key("msg"), oncekv.Put(key("keyed"), b"small"))
    assert not reply.duplicate, "the key was never used"


def test_session_expired_is_definite_and_the_next_call_gets_a_new_session(client, key, admin_stub):
    """An operator expires the session: the next request is refused with
    SESSION_EXPIRED on its first attempt (nothing executed), and the call
    after it registers a new session; nothing is re-sent."""
    counter = key("counter")
    assert client.increment(counter, 1) == 1
    old_id = client.client_id()
    status = client.status()
    admin_stub().ExpireSession(pb.ExpireSessionRequest(cluster_id=status.cluster_id,
                                                       client_id=old_id), timeout=5)
    with pytest.raises(oncekv.SessionExpired) as expired:
        client.increment(counter, 1)
    assert not expired.value.may_have_taken_effect
    assert client.increment(counter, 1) == 2, "the refused increment did not execute"
    assert client.client_id() != old_id


def test_close_confirms_a_session_already_gone(make_client, key, admin_stub):
    """close() is true when the Unregister applied, and also when the
    cluster no longer knows the session (its first attempt applied with the
    reply lost, or the session expired): SESSION_EXPIRED shows it gone."""
    confirmed = make_client()
    confirmed.increment(key("counter"), 1)
    assert confirmed.close() is True
    gone = make_client()
    gone.increment(key("counter"), 1)
    status = gone.status()
    admin_stub().ExpireSession(pb.ExpireSessionRequest(cluster_id=status.cluster_id,
                                                       client_id=gone.client_id()), timeout=5)
    assert gone.close() is True, "the session is gone: close must say so"
