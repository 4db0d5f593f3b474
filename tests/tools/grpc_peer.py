#!/usr/bin/python3
"""grpc_peer -- a real gRPC server and client (Debian's python3-grpcio) for the integration
tests of gRPC through retryproxy (tests/integration/test_grpc_e2e.c, docs/grpc.md).

  grpc_peer.py server --record FILE [--tls CERT KEY] [--bind IP:PORT]
                                          serves on 127.0.0.1 (a port the kernel picks, printed
                                          as "port N" once ready) until stdin closes; with
                                          --tls over TLS (h2 by ALPN), with that PEM pair;
                                          with --bind on that IPv4 address and port (0: one
                                          the kernel picks): 127.0.0.2, .3 for the pods of one
                                          service
  grpc_peer.py call --target HOST:PORT --method /svc.Svc/Echo [--kind unary|server|bidi]
                    [--message TEXT]... [--metadata KEY=VALUE]... [--timeout SECONDS]
                    [--first] [--repeat N]
                                          one call; prints one JSON object: code, details,
                                          messages received, trailing metadata; with --first
                                          (a server stream) the call is cancelled once its
                                          first message came, and "first_ms" says when; with
                                          --repeat, N unary calls one after another on one
                                          channel (so one connection), "codes" counting how
                                          each ended, the other members the last one's

Generic handlers, no generated code: messages are raw bytes. The server's methods:

  /test.Echo/Unary        echoes the request message
  /test.Echo/Server       answers each request with len(message) messages "0".."N-1"...
  /test.Echo/Bidi         echoes each request message as it comes (a ping-pong needs this)
  /test.Echo/Slow         sleeps x-sleep-ms, then echoes
  /test.Echo/Watch        a server stream: one message "event", then x-sleep-ms of nothing,
                          then the end (OK, or x-fail's status in the trailers)

A call whose metadata says x-fail: N,CODE,WHERE fails its first N attempts (counted per
x-request-id) with gRPC status CODE: WHERE "headers" is a Trailers-Only answer, "trailers" one
message first and then the status in the trailers. Every attempt is recorded as one JSON line:
method, its metadata, the sha256 of each request message, and what it answered.
"""
import argparse
import hashlib
import json
import sys
import threading
import time
from concurrent import futures

import grpc


def parse_fail(md):
    v = md.get("x-fail")
    if not v:
        return 0, grpc.StatusCode.OK, "headers"
    n, code, where = v.split(",")
    status = next(s for s in grpc.StatusCode if s.value[0] == int(code))
    return int(n), status, where


class Recorder:
    def __init__(self, path):
        self.path = path
        self.lock = threading.Lock()
        self.attempts = {}

    def attempt(self, md):
        key = md.get("x-request-id", "")
        with self.lock:
            self.attempts[key] = self.attempts.get(key, 0) + 1
            return self.attempts[key]

    def write(self, rec):
        with self.lock, open(self.path, "a") as f:
            f.write(json.dumps(rec, sort_keys=True) + "\n")


def serve(args):
    rec = Recorder(args.record)

    def begin(method, context):
        md = {k: v for k, v in context.invocation_metadata() if isinstance(v, str)}
        n, code, where = parse_fail(md)
        attempt = rec.attempt(md)
        return md, attempt, (code, where) if attempt <= n else None

    def log(method, md, attempt, requests, answered, remaining=None):
        rec.write({"method": method, "metadata": md, "attempt": attempt,
                   "requests": [hashlib.sha256(r).hexdigest() for r in requests],
                   "sizes": [len(r) for r in requests], "answered": answered,
                   "time_remaining": remaining})

    def unary(request, context, method="/test.Echo/Unary"):
        md, attempt, fail = begin(method, context)
        remaining = context.time_remaining()
        if method == "/test.Echo/Slow":
            time.sleep(int(md.get("x-sleep-ms", "0")) / 1000.0)
        log(method, md, attempt, [request], fail[0].name if fail else "OK", remaining)
        if fail:
            context.abort(fail[0], "injected failure %d" % attempt)
        return request

    def server_stream(request, context):
        md, attempt, fail = begin("/test.Echo/Server", context)
        log("/test.Echo/Server", md, attempt, [request], fail[0].name if fail else "OK")
        if fail and fail[1] == "headers":
            context.abort(fail[0], "injected failure %d" % attempt)
        if fail:
            yield b"partial"
            context.abort(fail[0], "injected failure %d" % attempt)
        for i in range(len(request)):
            yield str(i).encode()

    def watch(request, context):
        md, attempt, fail = begin("/test.Echo/Watch", context)
        log("/test.Echo/Watch", md, attempt, [request], "OK")
        yield b"event"
        time.sleep(int(md.get("x-sleep-ms", "0")) / 1000.0)
        if fail:
            context.abort(fail[0], "injected failure %d" % attempt)

    def bidi(request_iterator, context):
        md, attempt, fail = begin("/test.Echo/Bidi", context)
        seen = []
        for r in request_iterator:
            seen.append(r)
            yield r
        log("/test.Echo/Bidi", md, attempt, seen, "OK")

    def unary_of(name):
        return lambda req, ctx: unary(req, ctx, name)

    handler = grpc.method_handlers_generic_handler("test.Echo", {
        "Unary": grpc.unary_unary_rpc_method_handler(unary_of("/test.Echo/Unary")),
        "Slow": grpc.unary_unary_rpc_method_handler(unary_of("/test.Echo/Slow")),
        "Server": grpc.unary_stream_rpc_method_handler(server_stream),
        "Watch": grpc.unary_stream_rpc_method_handler(watch),
        "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
    })
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers((handler,))
    if args.tls:
        with open(args.tls[0], "rb") as c, open(args.tls[1], "rb") as k:
            creds = grpc.ssl_server_credentials([(k.read(), c.read())])
        port = server.add_secure_port(args.bind, creds)
    else:
        port = server.add_insecure_port(args.bind)
    server.start()
    print("port %d" % port, flush=True)
    sys.stdin.read()  # until the test closes our stdin (or goes away)
    server.stop(0)


def call(args):
    md = [tuple(kv.split("=", 1)) for kv in args.metadata]
    msgs = [m.encode() for m in args.message] or [b""]
    with grpc.insecure_channel(args.target) as ch:
        codes = {}
        for _ in range(args.repeat):
            out = call_once(args, ch, md, msgs)
            codes[out["code"]] = codes.get(out["code"], 0) + 1
    if args.repeat > 1:
        out["codes"] = codes
    print(json.dumps(out, sort_keys=True), flush=True)


def call_once(args, ch, md, msgs):
    out = {"messages": [], "code": "OK", "details": "", "trailers": {}}
    try:
        if args.kind == "unary":
            fut = ch.unary_unary(args.method).with_call(msgs[0], timeout=args.timeout,
                                                        metadata=md)
            resp, c = fut
            out["messages"].append(resp.decode(errors="replace"))
        elif args.kind == "server":
            t0 = time.monotonic()
            c = ch.unary_stream(args.method)(msgs[0], timeout=args.timeout, metadata=md)
            for m in c:
                out["messages"].append(m.decode(errors="replace"))
                if args.first:
                    out["first_ms"] = int((time.monotonic() - t0) * 1000)
                    c.cancel()
                    break
        else:
            # a ping-pong: the next message goes only once the last one's echo came
            gate = threading.Semaphore(0)

            def requests():
                for m in msgs:
                    yield m
                    if not gate.acquire(timeout=args.timeout):
                        return
            c = ch.stream_stream(args.method)(requests(), timeout=args.timeout, metadata=md)
            for m in c:
                out["messages"].append(m.decode(errors="replace"))
                gate.release()
        out["trailers"] = {k: v for k, v in (c.trailing_metadata() or ())
                           if isinstance(v, str)}
    except grpc.RpcError as e:
        out["code"] = e.code().name
        out["details"] = e.details() or ""
        out["trailers"] = {k: v for k, v in (e.trailing_metadata() or ())
                           if isinstance(v, str)}
    return out


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("server")
    s.add_argument("--record", required=True)
    s.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
    s.add_argument("--bind", default="127.0.0.1:0")
    c = sub.add_parser("call")
    c.add_argument("--target", required=True)
    c.add_argument("--method", required=True)
    c.add_argument("--kind", default="unary", choices=["unary", "server", "bidi"])
    c.add_argument("--message", action="append", default=[])
    c.add_argument("--metadata", action="append", default=[])
    c.add_argument("--timeout", type=float, default=10.0)
    c.add_argument("--first", action="store_true")
    c.add_argument("--repeat", type=int, default=1)
    args = p.parse_args()
    serve(args) if args.cmd == "server" else call(args)


if __name__ == "__main__":
    main()
