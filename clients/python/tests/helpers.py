"""Test helpers: a reply-dropping interceptor (a lost reply, without any
fault injection in the server), and scripted nodes for tests without a
cluster (`Refusal`, `ScriptedNodes`)."""

import time

import grpc

from oncekv._proto import oncekv_pb2 as pb


class LostReply(grpc.RpcError):
    """What a client sees when the network loses a reply: the request was
    sent and executed, the answer never arrived."""

    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "Socket closed (reply lost by the test)"

    def trailing_metadata(self):
        return ()


class DropReplies(grpc.UnaryUnaryClientInterceptor):
    """Lets a call of `method` reach the node and run, waits for its reply,
    then throws the reply away (`count` times): the client must retry the
    same request."""

    def __init__(self, method: str, count: int = 1):
        self.method = method
        self.remaining = count
        self.dropped = []

    def intercept_unary_unary(self, continuation, details, request):
        response = continuation(details, request)
        if details.method.endswith("/" + self.method) and self.remaining > 0:
            try:
                reply = response.result()
            except grpc.RpcError:
                return response
            self.remaining -= 1
            self.dropped.append(reply)
            raise LostReply()
        return response


class FencedLedger:
    """A fake payment provider that keeps the highest fence it accepted per
    order and refuses a lower one (what a downstream does with fences)."""

    def __init__(self):
        self.charges = {}
        self.fences = {}
        self.refused = []

    def charge(self, order, cents, fence):
        if fence < self.fences.get(order, 0):
            self.refused.append((order, fence))
            raise PermissionError(f"stale fence {fence} for {order}")
        self.fences[order] = fence
        self.charges.setdefault(order, []).append(cents)
        return f"receipt-{order}-{fence}"


class Blackhole(grpc.UnaryUnaryClientInterceptor):
    """Fails every call of `method` as a broken connection would, without
    sending it, while `on` is set: to the client the request may have
    reached a leader."""

    def __init__(self, method: str):
        self.method = method
        self.on = True

    def intercept_unary_unary(self, continuation, details, request):
        if self.on and details.method.endswith("/" + self.method):
            raise LostReply()
        return continuation(details, request)


class ThenRun(grpc.UnaryUnaryClientInterceptor):
    """After the first call of `method` ran (its reply dropped), runs
    `action` before the client sees the failure."""

    def __init__(self, method: str, action):
        self.method, self.action, self.done = method, action, False

    def intercept_unary_unary(self, continuation, details, request):
        response = continuation(details, request)
        if not self.done and details.method.endswith("/" + self.method):
            self.done = True
            response.result()
            self.action()
            raise LostReply()
        return response


class Refusal(grpc.RpcError):
    """A node's refusal as grpc raises it: a status code, a message, and the
    `ErrorDetail` with `reason` (and its other fields) in the trailing
    metadata, as a node sends them."""

    def __init__(self, reason, code=grpc.StatusCode.UNAVAILABLE, message="refused", **detail):
        super().__init__(message)
        self._code, self._message = code, message
        self._detail = pb.ErrorDetail(reason=pb.Reason.Value(reason), **detail)

    def code(self):
        return self._code

    def details(self):
        return self._message

    def trailing_metadata(self):
        return (("grpc-status-details-bin", self._detail.SerializeToString()),
                ("oncekv-reason", pb.Reason.Name(self._detail.reason)))


class Timeout(grpc.RpcError):
    """An attempt whose answer did not come in time (it waited `timeout`)."""

    def code(self):
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self):
        return "Deadline Exceeded"

    def trailing_metadata(self):
        return ()


class ScriptedNodes:
    """Stands in for the client's stubs (`client._stub`): every RPC to an
    endpoint calls `answer(endpoint, method, request, timeout)`, which
    returns the reply or raises; `asked` lists (endpoint, method) in
    order. No node, no network."""

    def __init__(self, client, answer):
        self.answer = answer
        self.asked = []
        client._stub = self.stub
        client._cluster_id = b"scripted-cluster"

    def stub(self, endpoint):
        nodes = self

        class Stub:
            def __getattr__(self, method):
                def call(request, timeout=None, metadata=None):
                    nodes.asked.append((endpoint, method))
                    return nodes.answer(endpoint, method, request, timeout)
                return call

        return Stub()

    def endpoints_asked(self, method):
        return [endpoint for endpoint, asked in self.asked if asked == method]


def wait_out(timeout):
    """What a node that never answers costs an attempt."""
    time.sleep(timeout)
    raise Timeout()
