"""TLS and authentication: a one-node cluster with TLS on its ports and
bearer tokens on its client port (certificates from `oncekv certs`). The
client's `ca=` and `token=` get through; no token or a wrong one is a
definite UNAUTHENTICATED."""

import os
import subprocess

import pytest

import oncekv
from oncekv.testing import LocalCluster


@pytest.fixture(scope="module")
def tls_cluster(binary, tmp_path_factory):
    pki = str(tmp_path_factory.mktemp("pki"))
    subprocess.run([binary, "certs", "--dir", pki, "--node", "1", "--admin", "admin",
                    "--client", "client"], check=True, stdout=subprocess.DEVNULL)
    cluster = LocalCluster(binary, nodes=1, name="oncekv-pytest-tls", ca=os.path.join(pki, "ca.pem"),
                           args=["--tls-cert", os.path.join(pki, "node-{node}.pem"),
                                 "--tls-key", os.path.join(pki, "node-{node}-key.pem"),
                                 "--tls-ca", os.path.join(pki, "ca.pem"),
                                 "--token-file", os.path.join(pki, "tokens")])
    cluster.start()
    token = open(os.path.join(pki, "client.token")).read().strip()
    try:
        yield cluster, os.path.join(pki, "ca.pem"), token
    finally:
        cluster.stop()


def test_tls_with_a_token_gets_through_and_bad_credentials_are_final(tls_cluster):
    cluster, ca, token = tls_cluster
    with oncekv.Client(cluster.endpoints, ca=ca, token=token) as client:
        assert client.increment("tls-counter", 3) == 3
        assert client.get("tls-counter") == 3
        assert client.once("tls-job", lease=5)(lambda: "done")() == "done"
    for bad in (None, "not-a-token"):
        with oncekv.Client(cluster.endpoints, ca=ca, token=bad, call_timeout=2) as client:
            with pytest.raises(oncekv.Unauthenticated) as refused:
                client.increment("tls-counter", 1)
            assert not refused.value.may_have_taken_effect and refused.value.final
    with oncekv.Client(cluster.endpoints, ca=ca, token=token) as client:
        assert client.get("tls-counter") == 3, "the refused increments did not run"
