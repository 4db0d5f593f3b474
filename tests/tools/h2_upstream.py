#!/usr/bin/python3
"""h2_upstream -- a scripted HTTP/2 upstream for integration tests: cleartext (prior knowledge), or
TLS with ALPN (--tls).

Run with Debian's /usr/bin/python3 (python3-h2). Listens on 127.0.0.1, on a port the kernel
picks (--bind IP:PORT: that IPv4 address and port, 0 for one the kernel picks; 127.0.0.2, .3
stand for the pods of one service), and prints "PORT\\n" on stdout once it accepts. Every
request is recorded as one JSON line in RECORD_FILE (flushed at once) when it is answered: connection and stream number, method,
path, authority, scheme, the fields as received, the trailers as received ("trailers", [] if
none), the body's length and sha256, the scenario and what was done ("action"), and the TCP
segments with data its connection had received by then ("data_segs_in", from TCP_INFO), and the
names of the fields that came as literals never indexed ("never_indexed", RFC 7541 6.2.3). A stream the proxy resets is recorded as "reset-by-client" with its
error code, a new connection as {"conn": N, "event": "accepted"}, a GOAWAY from the proxy as
{"conn": N, "event": "goaway", "error_code": E, "last_stream_id": S}, and the end of a
connection, whoever ended it, as {"conn": N, "event": "closed"}.

What a request gets comes from its fields:
  x-h2-scenario: S   how to answer (default "ok"):
      ok          200, the request body echoed back (or x-h2-body bytes, or "ok\\n")
      refuse      RST_STREAM REFUSED_STREAM as soon as the head is in (recorded "refused")
      goaway      GOAWAY with last_stream_id below the stream, then the connection closes
      rst-mid     200 with content-length (none with x-h2-no-length), half of the body
                  (x-h2-body, 65536 by default), then RST_STREAM INTERNAL_ERROR
      no-status   a response head without :status, then the end of the stream
      rst-no-error-short
                  200 with content-length (x-h2-body, 5000 by default), a fifth of the body,
                  then RST_STREAM NO_ERROR without END_STREAM: a response cut short (a gRPC
                  call: one whole message of x-h2-body bytes, then the reset, no trailers);
                  with x-h2-end-stream: 1, END_STREAM instead of the reset (a body shorter
                  than its content-length)
      head-only   a head alone, ending the stream: status x-h2-status (default 304), a
                  content-length only if x-h2-length gives one
      early-answer
                  200 "early\n" with END_STREAM as soon as the head is in, the upload left
                  unread (no WINDOW_UPDATE for it; RFC 9113 8.1)
      status      as "ok", with status x-h2-status (default 503; any three digits, 600 too)
      trailers    200, the body, then trailers grpc-status (x-h2-grpc-status, else 0) and
                  grpc-message: done; a gRPC call (content-type application/grpc...) answered
                  "ok" gets trailers with grpc-status 0 too
  x-h2-fail: N       only the first N attempts with this x-request-id get the scenario (and
                     the delay); later ones get "ok" at once (attempts counted per x-request-id)
  x-h2-body: N       an "ok" answer's body is N bytes (b"0123456789" repeated), sent as the
                     stream's flow-control window allows, without holding up other streams
  x-h2-delay-ms: M   the answer waits M ms once the request is complete
  x-h2-close-after: 1  once the answer is whole, GOAWAY and close the connection
  x-h2-no-ack: 1     the request's DATA is never acknowledged: its stream's and the connection's
                     windows close (an upstream that reads nothing)
  x-h2-field: NAME:VALUE  an "ok" or "status" answer's head carries this field (VALUE may be
                         empty)
  x-h2-no-trailers: 1  the answer ends with its last DATA frame, without trailers, even on a
                       gRPC call or in "trailers"

With --tls CERT KEY, connections are TLS: the server chooses by ALPN from --alpn (its own order
of preference, comma-separated; default "h2"; "none": no ALPN) and records
{"conn": N, "event": "tls", "alpn": "h2"} (null: none chosen). A connection that did not choose
h2 is spoken to in HTTP/1.1: each request is recorded as {"conn": N, "event": "http1", "method",
"path", "headers", "body_len"} and answered 200 "h1\n" (keep-alive). The "tls" record has the
name the client sent in SNI ("sni", null: none), whether it presented a certificate
("client_cert") and the first DNS name of that certificate ("client_name", null: none). With --client-ca FILE a client certificate is required, verified against the
PEM certificates in FILE; a handshake without one is recorded {"conn": N, "event": "tls",
"error": "..."} and nothing more is read.

Usage: h2_upstream.py RECORD_FILE [--tls CERT KEY] [--alpn LIST] [--client-ca FILE]
[--bind IP:PORT]. Stops on SIGTERM or when stdin closes.
"""
import hashlib
import json
import os
import selectors
import signal
import socket
import ssl
import sys
import threading
import time

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions

PATTERN = b"0123456789"

lock = threading.Lock()
attempts = {}
conn_ids = [0]


def record(out, entry):
    with lock:
        out.write(json.dumps(entry) + "\n")
        out.flush()


def data_segs_in(sock):
    """TCP segments with data the connection has received so far (TCP_INFO tcpi_data_segs_in):
    how many writes the proxy's bytes came in, give or take the kernel's merging."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 160)
        return int.from_bytes(info[152:156], sys.byteorder)
    except OSError:
        return -1


def body_of(n):
    return (PATTERN * (n // len(PATTERN) + 1))[:n]


class Stream:
    def __init__(self, sid, headers):
        self.sid = sid
        self.headers = headers
        self.body = bytearray()
        self.trailers = []
        self.out = b""  # body bytes still to send
        self.end_after = None  # "end", "trailers" or "rst": what follows the body
        self.due = None  # when a delayed answer goes
        self.grpc_status = "0"
        self.early = False  # answered before the upload, which is never read


class Conn:
    def __init__(self, sock, out, cid):
        self.sock = sock
        self.out = out
        self.cid = cid
        cfg = h2.config.H2Configuration(client_side=False, validate_outbound_headers=False,
                                        header_encoding="utf-8")
        self.h2 = h2.connection.H2Connection(config=cfg)
        self.streams = {}
        self.closing = False

    def field(self, st, name, default=None):
        for k, v in st.headers:
            if k == name:
                return v
        return default

    def on_request_complete(self, st):
        rid = self.field(st, "x-request-id", "")
        scenario = self.field(st, "x-h2-scenario", "ok")
        fail = self.field(st, "x-h2-fail")
        with lock:
            attempts[rid] = attempts.get(rid, 0) + 1
            n = attempts[rid]
        if fail is not None and n > int(fail):
            scenario = "ok"
            st.headers = [(k, v) for k, v in st.headers if k != "x-h2-delay-ms"]
        entry = {
            "conn": self.cid, "stream": st.sid, "attempt": n,
            "method": self.field(st, ":method"), "path": self.field(st, ":path"),
            "authority": self.field(st, ":authority"), "scheme": self.field(st, ":scheme"),
            "headers": [[k, v] for k, v in st.headers if not k.startswith(":")],
            "trailers": [[k, v] for k, v in st.trailers],
            "body_len": len(st.body), "body_sha256": hashlib.sha256(st.body).hexdigest(),
            "scenario": scenario, "request_id": rid,
            "data_segs_in": data_segs_in(self.sock),
            "never_indexed": [h[0] for h in st.headers if getattr(h, "indexable", True) is False],
        }
        return scenario, entry

    def answer(self, st, scenario, entry):
        sid = st.sid
        if scenario == "goaway":
            entry["action"] = "goaway"
            record(self.out, entry)
            self.h2.close_connection(error_code=h2.errors.ErrorCodes.NO_ERROR,
                                     last_stream_id=max(sid - 2, 0))
            self.closing = True
            return
        if scenario == "no-status":
            entry["action"] = "no-status"
            record(self.out, entry)
            self.h2.send_headers(sid, [("x-h2-conn", str(self.cid))], end_stream=True)
            return
        if scenario == "rst-mid":
            entry["action"] = "rst-mid"
            record(self.out, entry)
            size = int(self.field(st, "x-h2-body", "65536"))
            head = [(":status", "200")]
            if self.field(st, "x-h2-no-length") is None:
                head.append(("content-length", str(size)))
            self.h2.send_headers(sid, head)
            st.out = memoryview(body_of(size // 2))
            st.end_after = "rst"
            return
        if scenario == "head-only":
            entry["action"] = "head-only"
            record(self.out, entry)
            head = [(":status", self.field(st, "x-h2-status", "304"))]
            if self.field(st, "x-h2-length") is not None:
                head.append(("content-length", self.field(st, "x-h2-length")))
            self.h2.send_headers(sid, head, end_stream=True)
            return
        if scenario == "rst-no-error-short":
            entry["action"] = "rst-no-error-short"
            record(self.out, entry)
            size = int(self.field(st, "x-h2-body", "5000"))
            if self.field(st, "content-type", "").startswith("application/grpc"):
                # one whole message, then the reset where the trailers should be
                self.h2.send_headers(sid, [(":status", "200"),
                                           ("content-type", "application/grpc")])
                st.out = memoryview(b"\0" + size.to_bytes(4, "big") + body_of(size))
            else:
                self.h2.send_headers(sid, [(":status", "200"), ("content-length", str(size))])
                st.out = memoryview(body_of(size // 5))
            st.end_after = "end" if self.field(st, "x-h2-end-stream") else "rst-no-error"
            return
        if st.body:
            data = bytes(st.body)
        elif self.field(st, "x-h2-body") is not None:
            data = body_of(int(self.field(st, "x-h2-body")))
        else:
            data = b"ok\n"
        entry["action"] = "answered"
        record(self.out, entry)
        status = self.field(st, "x-h2-status", "503") if scenario == "status" else "200"
        head = [(":status", status), ("content-length", str(len(data))),
                ("x-h2-conn", str(self.cid)), ("x-h2-stream", str(sid))]
        extra = self.field(st, "x-h2-field")
        if extra is not None:
            name, _, value = extra.partition(":")
            head.append((name, value))
        self.h2.send_headers(sid, head, end_stream=False)
        st.out = memoryview(data)
        grpc = self.field(st, "content-type", "").startswith("application/grpc")
        st.end_after = "trailers" if scenario == "trailers" or grpc else "end"
        if self.field(st, "x-h2-no-trailers") is not None:
            st.end_after = "end"
        st.grpc_status = self.field(st, "x-h2-grpc-status", "0") if scenario == "trailers" else "0"

    def pump(self):
        """Sends what the flow-control windows allow, stream by stream."""
        for sid, st in list(self.streams.items()):
            if st.end_after is None:
                continue
            while st.out:
                try:
                    room = min(self.h2.local_flow_control_window(sid),
                               self.h2.max_outbound_frame_size)
                except Exception:
                    st.out = b""
                    break
                if room <= 0:
                    break
                chunk, st.out = st.out[:room], st.out[room:]  # memoryview: no copy
                self.h2.send_data(sid, bytes(chunk))
            if st.out:
                continue
            if st.end_after == "end":
                self.h2.end_stream(sid)
                if self.field(st, "x-h2-close-after") is not None:
                    self.h2.close_connection(error_code=h2.errors.ErrorCodes.NO_ERROR,
                                             last_stream_id=sid)
                    self.closing = True
            elif st.end_after == "trailers":
                self.h2.send_headers(sid, [("grpc-status", st.grpc_status),
                                           ("grpc-message", "done")], end_stream=True)
            elif st.end_after == "rst":
                self.h2.reset_stream(sid, error_code=h2.errors.ErrorCodes.INTERNAL_ERROR)
            elif st.end_after == "rst-no-error":
                self.h2.reset_stream(sid, error_code=h2.errors.ErrorCodes.NO_ERROR)
            del self.streams[sid]

    def handle(self, ev):
        if isinstance(ev, h2.events.RequestReceived):
            st = Stream(ev.stream_id, list(ev.headers))
            self.streams[ev.stream_id] = st
            if self.field(st, "x-h2-scenario") == "refuse":
                rid = self.field(st, "x-request-id", "")
                fail = self.field(st, "x-h2-fail")
                with lock:
                    seen = attempts.get(rid, 0)
                    if fail is None or seen < int(fail):
                        attempts[rid] = seen + 1
                        refuse = True
                    else:
                        refuse = False
                if refuse:
                    record(self.out, {"conn": self.cid, "stream": ev.stream_id,
                                      "attempt": seen + 1, "scenario": "refuse",
                                      "action": "refused", "request_id": rid,
                                      "method": self.field(st, ":method"),
                                      "path": self.field(st, ":path")})
                    self.h2.reset_stream(ev.stream_id,
                                         error_code=h2.errors.ErrorCodes.REFUSED_STREAM)
                    del self.streams[ev.stream_id]
                    return
                st.headers = [(k, v) for k, v in st.headers if k != "x-h2-scenario"]
            if self.field(st, "x-h2-scenario") == "early-answer":
                self.early_answer(st)
                return
            if ev.stream_ended is not None:
                self.complete(st)
        elif isinstance(ev, h2.events.DataReceived):
            st = self.streams.get(ev.stream_id)
            if st is not None and st.early:
                st.body += ev.data  # counted, never acknowledged: the upload stalls
                return
            if st is None or self.field(st, "x-h2-no-ack") is None:
                self.h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            if st is not None:
                st.body += ev.data
                if ev.stream_ended is not None:
                    self.complete(st)
        elif isinstance(ev, h2.events.TrailersReceived):
            st = self.streams.get(ev.stream_id)
            if st is not None:
                st.trailers = list(ev.headers)
        elif isinstance(ev, h2.events.StreamEnded):
            st = self.streams.get(ev.stream_id)
            if st is not None and st.due is None and st.end_after is None and not st.early:
                self.complete(st)
        elif isinstance(ev, h2.events.StreamReset):
            st = self.streams.pop(ev.stream_id, None)
            if ev.remote_reset:
                record(self.out, {"conn": self.cid, "stream": ev.stream_id,
                                  "action": "reset-by-client", "error_code": int(ev.error_code),
                                  "request_id": self.field(st, "x-request-id", "") if st else ""})
        elif isinstance(ev, h2.events.ConnectionTerminated):
            record(self.out, {"conn": self.cid, "event": "goaway",
                              "error_code": int(ev.error_code),
                              "last_stream_id": ev.last_stream_id})
            self.closing = True

    def early_answer(self, st):
        """200 + END_STREAM before any of the upload is read (recorded with what came so far)."""
        st.early = True
        scenario, entry = self.on_request_complete(st)
        entry["action"] = "early-answer"
        record(self.out, entry)
        self.h2.send_headers(st.sid, [(":status", "200"), ("content-length", "6")])
        self.h2.send_data(st.sid, b"early\n", end_stream=True)

    def complete(self, st):
        if st.due is not None:
            return
        scenario, entry = self.on_request_complete(st)
        delay = int(self.field(st, "x-h2-delay-ms", "0"))
        st.due = (time.monotonic() + delay / 1000.0, scenario, entry)

    def run_due(self):
        now = time.monotonic()
        wait = None
        for st in list(self.streams.values()):
            if st.due is None or st.end_after is not None or st.due[1] is None:
                continue
            when, scenario, entry = st.due
            if when <= now:
                st.due = (when, None, None)
                self.answer(st, scenario, entry)
                if scenario in ("goaway", "no-status", "head-only"):
                    self.streams.pop(st.sid, None)
            else:
                wait = when - now if wait is None else min(wait, when - now)
        return wait

    def flush(self):
        data = self.h2.data_to_send()
        if data:
            self.sock.sendall(data)

    def serve(self):
        self.h2.initiate_connection()
        self.flush()
        self.sock.settimeout(None)
        sel = selectors.DefaultSelector()
        sel.register(self.sock, selectors.EVENT_READ)
        try:
            while True:
                wait = self.run_due()
                self.pump()
                self.flush()
                if self.closing:
                    time.sleep(0.05)
                    break
                # a TLS socket may hold decrypted bytes that select() does not see
                pending = isinstance(self.sock, ssl.SSLSocket) and self.sock.pending()
                if not pending and not sel.select(timeout=wait if wait is not None else 0.5):
                    continue
                data = self.sock.recv(65536)
                if not data:
                    break
                for ev in self.h2.receive_data(data):
                    self.handle(ev)
        except (OSError, h2.exceptions.ProtocolError) as e:
            record(self.out, {"conn": self.cid, "error": repr(e)})
        finally:
            sel.close()
            self.sock.close()
            record(self.out, {"conn": self.cid, "event": "closed"})


def serve_http1(sock, out, cid):
    """A minimal HTTP/1.1 server for a TLS connection whose ALPN did not choose h2."""
    buf = b""
    try:
        while True:
            while b"\r\n\r\n" not in buf:
                data = sock.recv(65536)
                if not data:
                    return
                buf += data
            head, buf = buf.split(b"\r\n\r\n", 1)
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = [[k.strip().lower(), v.strip()] for k, v in
                       (line.split(":", 1) for line in lines[1:])]
            length = int(dict(headers).get("content-length", "0"))
            while len(buf) < length:
                data = sock.recv(65536)
                if not data:
                    return
                buf += data
            buf = buf[length:]
            record(out, {"conn": cid, "event": "http1", "method": method, "path": path,
                         "headers": headers, "body_len": length})
            sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nh1\n")
    except (OSError, ValueError) as e:
        record(out, {"conn": cid, "error": repr(e)})
    finally:
        sock.close()
        record(out, {"conn": cid, "event": "closed"})


def serve_tls(ctx, sock, out, cid):
    try:
        sock = ctx.wrap_socket(sock, server_side=True)
    except (OSError, ssl.SSLError) as e:
        record(out, {"conn": cid, "event": "tls", "error": repr(e)})
        sock.close()
        return
    alpn = sock.selected_alpn_protocol()
    peer = sock.getpeercert() or {}
    names = [v for k, v in peer.get("subjectAltName", ()) if k == "DNS"]
    record(out, {"conn": cid, "event": "tls", "alpn": alpn, "sni": getattr(sock, "sni", None),
                 "client_cert": bool(peer), "client_name": names[0] if names else None})
    if alpn == "h2":
        Conn(sock, out, cid).serve()
    else:
        serve_http1(sock, out, cid)


def main():
    out = open(sys.argv[1], "a")
    ctx = None
    args = sys.argv[2:]
    if "--tls" in args:
        i = args.index("--tls")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args[i + 1], args[i + 2])
        alpn = args[args.index("--alpn") + 1] if "--alpn" in args else "h2"
        if alpn != "none":
            ctx.set_alpn_protocols(alpn.split(","))
        if "--client-ca" in args:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(args[args.index("--client-ca") + 1])

        def on_sni(sock, name, _ctx):
            sock.sni = name

        ctx.sni_callback = on_sni
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ip, port = "127.0.0.1", 0
    if "--bind" in args:
        ip, port = args[args.index("--bind") + 1].rsplit(":", 1)
    ls.bind((ip, int(port)))
    ls.listen(128)
    print(ls.getsockname()[1], flush=True)
    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))

    def stdin_watch():
        sys.stdin.read()
        os._exit(0)

    threading.Thread(target=stdin_watch, daemon=True).start()
    while True:
        s, _ = ls.accept()
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with lock:
            conn_ids[0] += 1
            cid = conn_ids[0]
        record(out, {"conn": cid, "event": "accepted"})
        if ctx:
            threading.Thread(target=serve_tls, args=(ctx, s, out, cid), daemon=True).start()
        else:
            threading.Thread(target=Conn(s, out, cid).serve, daemon=True).start()


if __name__ == "__main__":
    main()
