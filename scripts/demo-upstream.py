#!/usr/bin/env python3
"""A stand-in for your service behind `oncekv proxy` (docs/proxy.md): every
POST or PATCH is an effect, numbered from 1, answered 201 with
{"order": N}; anything else 200 with {}. Loopback only.

    python3 scripts/demo-upstream.py [PORT]      # default 9000
"""
import http.server
import itertools
import json
import sys

effects = itertools.count(1)


class Service(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self, status, document):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        body = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.answer(201, {"order": next(effects)})

    do_PATCH = do_POST

    def do_GET(self):
        self.answer(200, {})

    def log_message(self, *args):
        pass


port = int(sys.argv[1]) if len(sys.argv) > 1 else 9000
http.server.ThreadingHTTPServer(("127.0.0.1", port), Service).serve_forever()
