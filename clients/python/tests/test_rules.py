"""The client's side of rules 7 and 22 against a real cluster: a request
given up at its deadline is fenced, so a late copy never executes; and a
final refusal of a retry after an attempt that may have run is an unknown
outcome, not a definite error; and a registration refused for
`sessions_max` says so (`ResourceExhausted`), not "unavailable"."""

import grpc
import pytest

import oncekv
from oncekv._proto import oncekv_pb2 as pb
from oncekv._proto import oncekv_pb2_grpc as pb_grpc
from oncekv.policy import Failure
from helpers import Blackhole, ThenRun


def test_a_request_given_up_is_fenced_and_its_late_copy_never_executes(cluster, make_client, key):
    """Every attempt of seq 2 fails as if its connection broke (it may have
    reached a leader): at the deadline the call is OutcomeUnknown and the
    floor is moved past it (fenced). A late copy of seq 2 arriving after
    that is RESPONSE_DISCARDED: it never executes (rule 7)."""
    counter = key("counter")
    blackhole = Blackhole("Execute")
    blackhole.on = False
    client = make_client(interceptors=[blackhole], call_timeout=0.5, attempt_timeout=0.2)
    assert client.increment(counter, 1) == 1
    blackhole.on = True
    with pytest.raises(oncekv.OutcomeUnknown) as unknown:
        client.increment(counter, 100)
    assert unknown.value.seq == 2 and unknown.value.may_have_taken_effect
    assert unknown.value.fenced, "the cluster acknowledged the fence"
    # The late copy of seq 2, as a network might deliver it now.
    late = pb.ExecuteRequest(cluster_id=client.status().cluster_id, client_id=client.client_id(),
                             seq=2, first_outstanding_seq=2,
                             command=oncekv.Increment(counter, 100).to_proto())
    stub = pb_grpc.ClientStub(grpc.insecure_channel(cluster.client_addrs[cluster.wait_leader()]))
    with pytest.raises(grpc.RpcError) as discarded:
        stub.Execute(late, timeout=5)
    assert Failure.from_rpc_error(discarded.value).reason == "RESPONSE_DISCARDED"
    blackhole.on = False
    assert client.get(counter) == 1, "seq 2 never executed"
    assert client.increment(counter, 1) == 2, "the session goes on"


def test_a_final_refusal_after_a_lost_reply_is_an_unknown_outcome(cluster, make_client, key,
                                                                  admin_stub):
    """Rule 22: the first attempt executed but its reply was lost; before the
    retry an operator expired the session. The retry's SESSION_EXPIRED
    proves nothing about the first attempt (which did run): the call must
    say OutcomeUnknown, never SessionExpired ("nothing executed")."""
    counter = key("counter")
    client = None

    def expire():
        admin_stub().ExpireSession(pb.ExpireSessionRequest(
            cluster_id=client.status().cluster_id, client_id=client.client_id()), timeout=5)

    client = make_client(interceptors=[ThenRun("Execute", expire)])
    with pytest.raises(oncekv.OutcomeUnknown) as unknown:
        client.increment(counter, 7)
    assert unknown.value.may_have_taken_effect
    assert isinstance(unknown.value.cause, oncekv.SessionExpired)
    assert client.get(counter) == 7, "it did run: 'nothing executed' would have been a lie"
    assert client.increment(counter, 1) == 8, "a new session for new calls"


def test_registering_at_sessions_max_is_resource_exhausted(cluster, make_client, key,
                                                           admin_stub):
    """With the cluster at `sessions_max`, the leader refuses a new session
    RESOURCE_EXHAUSTED naming the limit. The client retries it there until
    its deadline and raises `ResourceExhausted` with that limit — not
    `Unavailable` ("not the leader") from a follower it moved on to."""
    stub = admin_stub()
    config = stub.GetConfig(pb.GetConfigRequest(), timeout=5).config
    first = make_client()
    first.client_id()  # at least one live session: a limit of one is reached
    cluster_id = first.status().cluster_id

    def set_sessions_max(value):
        stub.SetConfig(pb.SetConfigRequest(
            cluster_id=cluster_id, patch=pb.RegistryConfigPatch(sessions_max=value)), timeout=5)

    set_sessions_max(1)
    try:
        late = make_client(call_timeout=2.0)
        with pytest.raises(oncekv.ResourceExhausted) as refused:
            late.increment(key("n"), 1)
        assert refused.value.limit == "sessions_max", refused.value
        assert not refused.value.may_have_taken_effect
    finally:
        set_sessions_max(config.sessions_max)
    assert first.increment(key("n"), 1) == 1, "nothing ran"
