"""Faults against the shared cluster (each test leaves it to the `cluster`
fixture to restore): a leader killed during a `once` handler (exactly one
effect), increments across a leader kill (each applied once), the whole
cluster paused (OutcomeUnknown, then the seq fenced: a late copy is
discarded; close() within one attempt timeout), and nothing listening
(Unavailable when the cluster was never reached; once it was, a change
that runs out of time is unknown even if every connection was refused,
as in the Rust client)."""

import threading
import time

import grpc
import pytest

import oncekv
from oncekv._proto import oncekv_pb2 as pb
from oncekv._proto import oncekv_pb2_grpc as pb_grpc
from oncekv.policy import Failure
from oncekv.testing import free_ports
from helpers import FencedLedger


def test_a_leader_killed_during_a_once_handler_leaves_exactly_one_effect(cluster, make_client, key):
    order = key("order-7")
    ledger = FencedLedger()
    calls = []
    leader = cluster.wait_leader()
    client = make_client()

    def charge(fence, attempt):
        calls.append((fence, attempt))
        receipt = ledger.charge(order, 250, fence)
        cluster.kill(leader)  # the leader dies while the effect is in hand
        return {"receipt": receipt}

    first = client.once(order, fingerprint="charge 250", lease=10)(charge)()
    cluster.spawn(leader)  # back while the test goes on (the next one needs it)
    assert first == {"receipt": f"receipt-{order}-{calls[0][0]}"}
    # Recorded through the new leader: every later call replays it, from
    # this client or another, without calling the handler.
    assert client.once(order, fingerprint="charge 250", lease=10)(charge)() == first
    assert make_client().once(order, fingerprint="charge 250", lease=10)(charge)() == first
    assert len(calls) == 1 and ledger.charges == {order: [250]}


def test_increments_across_a_leader_kill_are_each_applied_once(cluster, make_client, key):
    counter = key("counter")
    client = make_client()
    total, done, failures = 40, [], []

    def work():
        try:
            for _ in range(total):
                done.append(client.increment(counter, 1))
        except Exception as error:  # reported below
            failures.append(error)

    thread = threading.Thread(target=work)
    thread.start()
    deadline = time.monotonic() + 10
    while len(done) < 10 and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.005)
    leader = cluster.wait_leader()
    cluster.kill(leader)
    cluster.spawn(leader)  # it restarts while the others elect and the work goes on
    thread.join(60)
    assert not failures, failures
    assert done == list(range(1, total + 1)), "every increment answered once, in order"
    assert client.get(counter) == total


def test_outcome_unknown_when_the_cluster_is_down_and_the_seq_is_fenced(cluster, make_client, key,
                                                                        admin_stub):
    counter, paid = key("counter"), key("paid")
    client = make_client(call_timeout=1.5, attempt_timeout=0.5)
    assert client.increment(counter, 1) == 1
    client_id = client.client_id()
    for node in cluster.ids:
        cluster.pause(node)
    try:
        started = time.monotonic()
        with pytest.raises(oncekv.OutcomeUnknown) as unknown:
            client.increment(counter, 1)
        assert time.monotonic() - started < 5
        assert unknown.value.may_have_taken_effect and unknown.value.seq == 2
        assert not unknown.value.fenced, "nobody could acknowledge the fence"
        with pytest.raises(oncekv.KeyOutcomeUnknown) as keyed:
            client.execute_with_key(key("msg"), oncekv.Increment(paid, 5))
        assert keyed.value.may_have_taken_effect
    finally:
        for node in cluster.ids:
            cluster.resume(node)
    cluster.wait_leader(30)
    client.call_timeout = 10.0
    # The next request carries the fence: seq 2 ran once or never.
    value = client.increment(counter, 10)
    assert value in (11, 12)
    # A late copy of seq 2 is discarded, never executed (rule 7).
    stub = pb_grpc.ClientStub(client._channel(cluster.client_addrs[cluster.wait_leader()]))
    late = pb.ExecuteRequest(cluster_id=client.status().cluster_id, client_id=client_id, seq=2,
                             first_outstanding_seq=2,
                             command=oncekv.Increment(counter, 1).to_proto())
    with pytest.raises(grpc.RpcError) as discarded:
        stub.Execute(late, timeout=5)
    assert Failure.from_rpc_error(discarded.value).reason == "RESPONSE_DISCARDED"
    assert client.get(counter) == value
    # The keyed request's fate is learnt by calling again with the same key.
    again = client.execute_with_key(key("msg"), oncekv.Increment(paid, 5))
    assert again.result == oncekv.Incremented(5)
    assert client.get(paid) == 5


def test_unavailable_when_nothing_listens(make_client):
    dead = [f"127.0.0.1:{port}" for port in free_ports(3)]
    client = oncekv.Client(dead, call_timeout=0.3, attempt_timeout=0.1)
    try:
        for call in (lambda: client.increment("k", 1), lambda: client.get("k"),
                     lambda: client.execute_with_key("m", oncekv.Increment("k", 1)),
                     lambda: client.claim("c", "f", 5)):
            with pytest.raises(oncekv.Unavailable) as unavailable:
                call()
            assert not unavailable.value.may_have_taken_effect
    finally:
        client.close()


def test_close_takes_one_attempt_timeout_when_the_cluster_is_out_of_reach(cluster, make_client,
                                                                           key):
    client = make_client(call_timeout=4.0, attempt_timeout=0.5)
    client.increment(key("counter"), 1)  # a session to end
    for node in cluster.ids:
        cluster.pause(node)
    try:
        started = time.monotonic()
        assert client.close() is False, "nobody could confirm the Unregister"
        assert time.monotonic() - started < 2.0, "one attempt_timeout, not call_timeout"
    finally:
        for node in cluster.ids:
            cluster.resume(node)


def test_every_connection_refused_after_contact_is_unknown_for_changes(cluster, make_client, key):
    """The whole cluster down (every connection refused: nothing was sent)
    after the client knew it. As the Rust client decides it: a change that
    runs out of time is unknown whatever its attempts met — a session's
    seq is fenced (`OutcomeUnknown`), a keyed or claim call can be asked
    again with the same key (`KeyOutcomeUnknown`); `Unavailable` (nothing
    ran) is for reads and `execute_plain`, which cannot learn an outcome."""
    client = make_client(call_timeout=0.6, attempt_timeout=0.2)
    assert client.increment(key("counter"), 1) == 1
    won = client.claim(key("job"), "f", lease=30)
    for node in cluster.ids:
        cluster.kill(node)
    try:
        with pytest.raises(oncekv.OutcomeUnknown) as unknown:
            client.increment(key("counter"), 1)
        assert unknown.value.seq == 2 and not unknown.value.fenced
        for call in (lambda: client.execute_with_key(key("msg"), oncekv.Increment(key("n"), 1)),
                     lambda: client.claim(key("other"), "f", lease=30),
                     lambda: client.extend(key("job"), won.fence, 30),
                     lambda: client.complete(key("job"), won.fence, b"done")):
            with pytest.raises(oncekv.KeyOutcomeUnknown) as keyed:
                call()
            assert keyed.value.may_have_taken_effect
            assert "failed to connect" in str(keyed.value).lower(), keyed.value
        for call in (lambda: client.get(key("counter")),
                     lambda: client.execute_plain(oncekv.Increment(key("n"), 1))):
            with pytest.raises(oncekv.Unavailable):
                call()
    finally:
        for node in cluster.ids:
            cluster.spawn(node)
    cluster.wait_leader(30)
    client.call_timeout = 10.0
    assert client.get(key("counter")) == 1, "nothing ran"
