"""Test helpers: a reply-dropping interceptor (a lost reply, without any
fault injection in the server)."""

import grpc


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
