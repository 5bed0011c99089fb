"""Fixtures: one real 3-node cluster for the whole session (started from the
`oncekv` binary of $ONCEKV_BIN, else target/debug or target/release of the
repository), restored to health before each test that needs it; clients
closed after each test; keys unique per test (the cluster is shared)."""

import os
import signal
import uuid

import grpc
import pytest

import oncekv
from oncekv._proto import oncekv_pb2 as pb
from oncekv._proto import oncekv_pb2_grpc as pb_grpc
from oncekv.testing import LocalCluster, find_binary

HERE = os.path.dirname(os.path.abspath(__file__))


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


# A SIGTERM (a CI timeout, `timeout`) interrupts the session like Ctrl-C, so
# that fixture finalizers stop the clusters; atexit (oncekv.testing) is the
# backstop.
signal.signal(signal.SIGTERM, _interrupt)


@pytest.fixture(scope="session")
def binary():
    try:
        return find_binary(HERE)
    except FileNotFoundError as missing:
        pytest.exit(str(missing), returncode=2)


@pytest.fixture(scope="session")
def shared_cluster(binary):
    cluster = LocalCluster(binary, name="oncekv-pytest")
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster(shared_cluster, request):
    """The shared cluster with every node running, none paused, and a
    leader known to all; after a failed test, the nodes' log tails."""
    cluster = shared_cluster
    for node in cluster.ids:
        if node in cluster._paused:
            cluster.resume(node)
        if node not in cluster.running():
            cluster.processes.pop(node, None)
            cluster.spawn(node)
    cluster.wait_leader(30)
    yield cluster
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        cluster.print_logs(lines=8)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, "rep_" + report.when, report)


@pytest.fixture
def make_client(cluster):
    """Makes clients of the cluster, closed after the test."""
    made = []

    def make(**options):
        options.setdefault("call_timeout", 10.0)
        client = oncekv.Client(cluster.endpoints, **options)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


@pytest.fixture
def client(make_client):
    return make_client()


@pytest.fixture
def key(request):
    """Unique key names for this test: key("counter") → "<test>/<random>/counter"."""
    prefix = f"{request.node.name}/{uuid.uuid4().hex[:8]}"
    return lambda name="k": f"{prefix}/{name}"


def admin(cluster, node=None):
    """An Admin stub of `node` (default: the leader)."""
    node = node or cluster.wait_leader(30)
    channel = grpc.insecure_channel(cluster.client_addrs[node])
    return pb_grpc.AdminStub(channel), channel


@pytest.fixture
def admin_stub(cluster):
    channels = []

    def make(node=None):
        stub, channel = admin(cluster, node)
        channels.append(channel)
        return stub

    yield make
    for channel in channels:
        channel.close()

