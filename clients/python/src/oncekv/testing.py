"""A local oncekv cluster for tests and examples: `oncekv node` processes on
free loopback ports, each in a temporary data directory, started, killed,
paused and restarted as child processes, polled through `Status` — the
Python counterpart of the Rust testkit's `LocalCluster`.

Every process it starts is killed and reaped by `stop()` (and by the
context manager's exit) and at interpreter exit (atexit); on Linux it also
asks the kernel to SIGKILL it when the thread that started it dies
(PR_SET_PDEATHSIG: best effort, some sandboxes ignore it). A caller that
must survive SIGTERM turns it into an exception (the tests' conftest
does). It binds only 127.0.0.1.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Sequence

import grpc

from ._proto import oncekv_pb2 as pb
from ._proto import oncekv_pb2_grpc as pb_grpc

__all__ = ["LocalCluster", "find_binary", "free_ports"]

#: Raft timing for a loaded 2-core machine (the Rust testkit's Timing::TESTS):
#: heartbeat, election timeout min and max, in ms.
TEST_TIMING = (100, 400, 800)

_LIVE: "set[subprocess.Popen]" = set()
_LIVE_LOCK = threading.Lock()


def _kill_all_live() -> None:
    with _LIVE_LOCK:
        processes = list(_LIVE)
        _LIVE.clear()
    for process in processes:
        _kill(process)


atexit.register(_kill_all_live)


def _kill(process: subprocess.Popen) -> None:
    if process.poll() is None:
        try:
            process.kill()
        except ProcessLookupError:
            pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - a process SIGKILL cannot stop
        pass


def _load_prctl():
    """libc's prctl, looked up once here: the child between fork and exec
    (where other threads' locks may be held) only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except Exception:
        return None


_PRCTL = _load_prctl()
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL me when the thread that started me
    dies (Linux; the flag survives exec). Nodes are therefore started from
    a thread that lives as long as the cluster (the main thread)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def find_binary(start: Optional[str] = None) -> str:
    """The `oncekv` binary: $ONCEKV_BIN, else target/debug/oncekv or
    target/release/oncekv of the repository holding `start` (default: the
    current directory), the newer one when both exist."""
    explicit = os.environ.get("ONCEKV_BIN")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise FileNotFoundError(f"ONCEKV_BIN={explicit} is not an executable")
        return os.path.abspath(explicit)
    directory = os.path.abspath(start or os.getcwd())
    while True:
        if os.path.exists(os.path.join(directory, "Cargo.toml")):
            found = [os.path.join(directory, "target", build, "oncekv")
                     for build in ("debug", "release")]
            found = [path for path in found if os.access(path, os.X_OK)]
            if found:
                return max(found, key=os.path.getmtime)
        parent = os.path.dirname(directory)
        if parent == directory:
            raise FileNotFoundError(
                "no oncekv binary: set ONCEKV_BIN, or build it (cargo build --bin oncekv)")
        directory = parent


def free_ports(count: int) -> List[int]:
    """`count` distinct free TCP ports on 127.0.0.1 (held open together while
    they are picked, so none is handed out twice)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class LocalCluster:
    """`nodes` oncekv nodes on free loopback ports.

    Args:
        binary: the `oncekv` executable (default: `find_binary()`).
        directory: where data and logs go (default: a temporary directory,
            removed by `stop()` unless `keep` is set).
        timing: Raft (heartbeat, election min, election max) in ms.
        args: more `oncekv node` flags for every node (`{node}` in a flag is
            replaced by the node's id: "--tls-cert", "pki/node-{node}.pem").
        ca: the cluster CA (PEM path) when the nodes serve TLS: `Status`
            polls then speak TLS (`Status` needs no identity).
    """

    def __init__(self, binary: Optional[str] = None, *, nodes: int = 3,
                 directory: Optional[str] = None, keep: bool = False,
                 timing: Sequence[int] = TEST_TIMING, args: Sequence[str] = (),
                 name: str = "oncekv-py", ca: Optional[str] = None):
        self.binary = binary or find_binary()
        self.ids = list(range(1, nodes + 1))
        self._own_dir = directory is None
        self.directory = directory or tempfile.mkdtemp(prefix=name + "-")
        self.keep = keep
        self.timing = tuple(timing)
        self.args = list(args)
        self.ca = ca
        ports = free_ports(2 * nodes)
        self.client_addrs: Dict[int, str] = {}
        self.peer_addrs: Dict[int, str] = {}
        for index, node in enumerate(self.ids):
            self.client_addrs[node] = f"127.0.0.1:{ports[2 * index]}"
            self.peer_addrs[node] = f"127.0.0.1:{ports[2 * index + 1]}"
        self.processes: Dict[int, subprocess.Popen] = {}
        self._paused: set = set()
        self._channels: Dict[int, grpc.Channel] = {}

    # ---- lifecycle ---------------------------------------------------------

    def __enter__(self) -> "LocalCluster":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def endpoints(self) -> List[str]:
        return [self.client_addrs[node] for node in self.ids]

    def start(self, timeout: float = 60.0) -> "LocalCluster":
        """Starts every node and waits until a leader has applied the
        cluster's bootstrap entry and every node answers."""
        try:
            for node in self.ids:
                self.spawn(node)
            self.wait_ready(timeout)
        except BaseException:
            self.print_logs()
            self.stop()
            raise
        return self

    def spawn(self, node: int) -> None:
        """Starts node `node` (it must not be running)."""
        if node in self.processes and self.processes[node].poll() is None:
            raise RuntimeError(f"node {node} is already running")
        data = os.path.join(self.directory, f"n{node}")
        os.makedirs(data, exist_ok=True)
        heartbeat, election_min, election_max = self.timing
        command = [
            self.binary, "node",
            "--id", str(node),
            "--client-addr", self.client_addrs[node],
            "--peer-addr", self.peer_addrs[node],
            "--data-dir", os.path.join(data, "db"),
            "--worker-threads", "1",
            "--allow-small-memory",
            "--heartbeat-ms", str(heartbeat),
            "--election-timeout-min-ms", str(election_min),
            "--election-timeout-max-ms", str(election_max),
        ] + [arg.replace("{node}", str(node)) for arg in self.args]
        for other in self.ids:
            command += ["--peer", f"{other}={self.peer_addrs[other]}/{self.client_addrs[other]}"]
        if node == self.ids[0]:
            command.append("--initialize")  # ignored once the data dir holds Raft state
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "info")
        log = open(os.path.join(data, "node.log"), "ab")
        try:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                       env=env, start_new_session=True,
                                       preexec_fn=_die_with_parent)
        finally:
            log.close()
        with _LIVE_LOCK:
            _LIVE.add(process)
        self.processes[node] = process
        self._paused.discard(node)

    def kill(self, node: int) -> None:
        """SIGKILLs node `node` and reaps it (a crash: nothing flushed)."""
        process = self.processes.pop(node, None)
        if process is None:
            return
        if node in self._paused:
            self._paused.discard(node)
        _kill(process)
        with _LIVE_LOCK:
            _LIVE.discard(process)
        channel = self._channels.pop(node, None)
        if channel is not None:
            channel.close()

    def restart(self, node: int) -> None:
        self.kill(node)
        self.spawn(node)

    def pause(self, node: int) -> None:
        """SIGSTOPs node `node` (it keeps its sockets: calls to it hang)."""
        self.processes[node].send_signal(signal.SIGSTOP)
        self._paused.add(node)

    def resume(self, node: int) -> None:
        self.processes[node].send_signal(signal.SIGCONT)
        self._paused.discard(node)

    def running(self) -> List[int]:
        return [node for node, process in self.processes.items() if process.poll() is None]

    def stop(self) -> None:
        """Kills and reaps every node; removes the temporary directory."""
        for node in list(self.processes):
            if node in self._paused:
                try:
                    self.processes[node].send_signal(signal.SIGCONT)
                except ProcessLookupError:
                    pass
            self.kill(node)
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        if self._own_dir and not self.keep:
            shutil.rmtree(self.directory, ignore_errors=True)

    # ---- looking ------------------------------------------------------------

    def status(self, node: int, timeout: float = 0.5) -> Optional[pb.StatusReply]:
        """Node `node`'s Status, or None when it does not answer in time."""
        if node not in self.processes or node in self._paused:
            return None
        channel = self._channels.get(node)
        if channel is None:
            options = (
                ("grpc.initial_reconnect_backoff_ms", 50),
                ("grpc.min_reconnect_backoff_ms", 50),
                ("grpc.max_reconnect_backoff_ms", 200),
            )
            if self.ca is not None:
                with open(self.ca, "rb") as pem:
                    credentials = grpc.ssl_channel_credentials(root_certificates=pem.read())
                channel = grpc.secure_channel(self.client_addrs[node], credentials, options=options)
            else:
                channel = grpc.insecure_channel(self.client_addrs[node], options=options)
            self._channels[node] = channel
        try:
            return pb_grpc.ClientStub(channel).Status(pb.StatusRequest(), timeout=timeout)
        except grpc.RpcError:
            return None

    def leader(self) -> Optional[int]:
        """The node that says it leads with the highest term, among those
        running and not paused; None if none does."""
        best = None
        for node in self.running():
            reply = self.status(node)
            if reply is not None and reply.role == "leader" and reply.cluster_id:
                if best is None or reply.term > best[0]:
                    best = (reply.term, node)
        return None if best is None else best[1]

    def wait_leader(self, timeout: float = 30.0, exclude: Sequence[int] = ()) -> int:
        """Waits until a leader (not in `exclude`) is known to every running,
        unpaused node; returns its id."""
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            leader = self.leader()
            if leader is not None and leader not in exclude:
                views = [self.status(node) for node in self.running() if node not in self._paused]
                if all(view is not None and view.leader_id == leader for view in views):
                    return leader
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no leader within {timeout} s")
            time.sleep(0.05)

    def wait_ready(self, timeout: float = 60.0) -> int:
        return self.wait_leader(timeout)

    def _check_alive(self) -> None:
        for node, process in self.processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"node {node} exited with {process.returncode}; see "
                                   f"{os.path.join(self.directory, f'n{node}', 'node.log')}")

    def print_logs(self, lines: int = 30, file=None) -> None:
        file = file or sys.stderr
        for node in self.ids:
            path = os.path.join(self.directory, f"n{node}", "node.log")
            try:
                with open(path, "rb") as log:
                    tail = log.read().decode("utf-8", "replace").splitlines()[-lines:]
            except OSError:
                tail = ["(no log)"]
            print(f"----- node {node}: last {lines} lines of {path} -----", file=file)
            for line in tail:
                print(line, file=file)
