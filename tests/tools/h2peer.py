#!/usr/bin/python3
"""h2peer -- an HTTP/2 client that misbehaves on purpose, for tests/integration/test_h2_front.c.

Run with Debian's /usr/bin/python3 (python3-h2). One scenario per run; it prints one line of
results ("key value" pairs) on stdout for the test to check:

  reset-in-backoff PORT PATH ID      a request whose upstream fails, reset (CANCEL) after 0.4 s
  rapid-reset PORT PATH N            N streams opened and reset at once (CVE-2023-44487)
  continuation PORT PATH N           a HEADERS frame followed by N CONTINUATION frames
  drain PORT PATH PID                a request in flight, then SIGTERM to PID (the proxy)
  slow-reader PORT BIG SMALL         BIG (20 MB) never read (no WINDOW_UPDATE), then SMALL
  upload PORT PATH SIZE              a POST of SIZE bytes with no content-length
  idle PORT [SECONDS]                a connection that sends nothing after its SETTINGS
  early-answer PORT PATH             a gRPC POST whose body waits for the whole answer, then
                                     comes without END_STREAM: the stream's reset code after it
  trailers PORT PATH SIZE FIELDS TRAILERS
                                     a POST of SIZE bytes, then trailers; FIELDS and TRAILERS
                                     are "name:value;name:value" lists (either may be "")
  fields PORT PATH FIELDS            a GET with FIELDS ("name:value;..."): the answer's status and
                                     the names of its fields sent as literals never indexed

Every run ends within a few seconds whatever the proxy does.
"""
import os
import signal
import socket
import sys
import time

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import hpack


def connect(port, window=None):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True,
                                                             header_encoding="utf-8"))
    c.initiate_connection()
    if window:
        c.increment_flow_control_window(window)
    s.sendall(c.data_to_send())
    return s, c


def headers(port, path, method="GET", extra=()):
    return [(":method", method), (":path", path), (":scheme", "http"),
            (":authority", "127.0.0.1:%d" % port)] + list(extra)


class Result:
    def __init__(self):
        self.goaway = None
        self.last_stream = None
        self.status = {}
        self.ended = set()
        self.reset = {}
        self.closed = False
        self.data = {}


def recv_some(s, end):
    """Bytes from 's' within 0.2 s (and before 'end'): None when none came, b"" when the
    connection closed or broke."""
    s.settimeout(max(0.01, min(0.2, end - time.monotonic())))
    try:
        return s.recv(65536)
    except socket.timeout:
        return None
    except OSError:
        return b""


def pump(s, c, r, seconds, until=None, ack=None):
    """Reads and handles events for up to 'seconds' or until until(r) holds."""
    end = time.monotonic() + seconds
    while time.monotonic() < end and not r.closed:
        if until and until(r):
            return
        b = recv_some(s, end)
        if b is None:
            continue
        if not b:
            r.closed = True
            return
        try:
            events = c.receive_data(b)
        except h2.exceptions.ProtocolError:
            r.closed = True
            return
        for e in events:
            if isinstance(e, h2.events.ResponseReceived):
                r.status[e.stream_id] = dict(e.headers).get(":status")
            elif isinstance(e, h2.events.DataReceived):
                r.data[e.stream_id] = r.data.get(e.stream_id, 0) + len(e.data)
                if ack is None or ack(e.stream_id):
                    c.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
            elif isinstance(e, h2.events.StreamEnded):
                r.ended.add(e.stream_id)
            elif isinstance(e, h2.events.StreamReset):
                r.reset[e.stream_id] = int(e.error_code)
            elif isinstance(e, h2.events.ConnectionTerminated):
                r.goaway = int(e.error_code)
                r.last_stream = e.last_stream_id
        try:
            s.sendall(c.data_to_send())
        except OSError:
            r.closed = True
            return


def out(**kv):
    print(" ".join("%s %s" % (k, v) for k, v in kv.items()), flush=True)


def reset_in_backoff(port, path, rid):
    s, c = connect(port)
    c.send_headers(1, headers(port, path, extra=[("x-request-id", rid),
                                                 ("x-test-plan", "fail=9")]), end_stream=True)
    s.sendall(c.data_to_send())
    r = Result()
    pump(s, c, r, 0.4)
    c.reset_stream(1, 8)  # CANCEL
    s.sendall(c.data_to_send())
    pump(s, c, r, 0.3)
    out(status=r.status.get(1, "none"), closed=int(r.closed))


def rapid_reset(port, path, n):
    s, c = connect(port)
    r = Result()
    sid = 1
    for _ in range(n):
        try:
            c.send_headers(sid, headers(port, path), end_stream=True)
            c.reset_stream(sid, 8)
        except h2.exceptions.ProtocolError:
            break
        sid += 2
        if sid % 64 == 1:
            try:
                s.sendall(c.data_to_send())
            except OSError:
                break
    try:
        s.sendall(c.data_to_send())
    except OSError:
        pass
    pump(s, c, r, 3, until=lambda x: x.goaway is not None)
    out(goaway="none" if r.goaway is None else r.goaway)


def frame(ftype, flags, sid, payload):
    n = len(payload)
    return bytes([n >> 16, (n >> 8) & 255, n & 255, ftype, flags]) + sid.to_bytes(4, "big") + payload


def continuation(port, path, n):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    enc = hpack.Encoder()
    block = enc.encode(headers(port, path))
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b""))
    s.sendall(frame(1, 1, 1, block))  # HEADERS, END_STREAM, no END_HEADERS
    piece = enc.encode([("x-pad", "a" * 100)])
    sent = 0
    try:
        for _ in range(n):
            s.sendall(frame(9, 0, 1, piece))  # CONTINUATION, no END_HEADERS
            sent += 1
    except OSError:
        pass
    r = {"goaway": "none"}

    def on_frame(ftype, flags, sid, payload):
        if ftype == 7:  # GOAWAY
            r["goaway"] = int.from_bytes(payload[4:8], "big")
        return ftype == 7

    raw_frames(s, 3, on_frame)
    out(goaway=r["goaway"], sent=sent)


def raw_frames(s, seconds, stop):
    """Reads frames off 's' for up to 'seconds', calling stop(type, flags, sid, payload) on
    each until it returns True (python3-h2 refuses every frame after a GOAWAY, graceful or
    not, so the frames that follow one are read here)."""
    buf = b""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        b = recv_some(s, end)
        if b is None:
            continue
        if not b:
            return
        buf += b
        while len(buf) >= 9:
            ln = int.from_bytes(buf[0:3], "big")
            if len(buf) < 9 + ln:
                break
            ftype, flags = buf[3], buf[4]
            sid = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
            if stop(ftype, flags, sid, buf[9:9 + ln]):
                return
            buf = buf[9 + ln:]


def drain(port, path, pid):
    s, c = connect(port)
    c.send_headers(1, headers(port, path, extra=[("x-test-plan", "delay=700")]), end_stream=True)
    s.sendall(c.data_to_send())
    time.sleep(0.3)
    os.kill(pid, signal.SIGTERM)
    dec = hpack.Decoder()
    r = {"goaway": "none", "last": "none", "status": "none", "ended": 0}

    def on_frame(ftype, flags, sid, payload):
        if ftype == 7:  # GOAWAY
            r["last"] = int.from_bytes(payload[0:4], "big") & 0x7FFFFFFF
            r["goaway"] = int.from_bytes(payload[4:8], "big")
        elif ftype == 1:  # HEADERS (the proxy sends neither padding nor priority)
            for k, v in dec.decode(payload):
                if k in (":status", b":status") and sid == 1:
                    r["status"] = v.decode() if isinstance(v, bytes) else v
        if sid == 1 and ftype in (0, 1) and flags & 1:
            r["ended"] = 1
        return r["ended"] and r["goaway"] != "none"

    raw_frames(s, 5, on_frame)
    out(**r)


def idle(port, seconds):
    s, c = connect(port)
    t0 = time.monotonic()
    r = {"goaway": "none"}

    def on_frame(ftype, flags, sid, payload):
        if ftype == 7:  # GOAWAY
            r["goaway"] = int.from_bytes(payload[4:8], "big")
        return False

    raw_frames(s, seconds, on_frame)  # until the proxy closes the connection
    out(goaway=r["goaway"], ms=int((time.monotonic() - t0) * 1000))


def slow_reader(port, big, small):
    s, c = connect(port, window=16 * 1024 * 1024)
    c.send_headers(1, headers(port, big, extra=[("x-test-plan", "body=20000000")]),
                   end_stream=True)
    s.sendall(c.data_to_send())
    r = Result()
    # stream 1's window is never opened again: it stops after 64 KiB
    pump(s, c, r, 1.0, ack=lambda sid: sid != 1)
    t0 = time.monotonic()
    c.send_headers(3, headers(port, small), end_stream=True)
    s.sendall(c.data_to_send())
    pump(s, c, r, 5, until=lambda x: 3 in x.ended, ack=lambda sid: sid != 1)
    out(big=r.data.get(1, 0), small=r.status.get(3, "none"), small_ended=int(3 in r.ended),
        ms=int((time.monotonic() - t0) * 1000))


def upload(port, path, size):
    s, c = connect(port)
    c.send_headers(1, headers(port, path, "POST"))
    s.sendall(c.data_to_send())
    r = Result()
    left = size - send_body(s, c, r, 1, size)
    if left == 0 and 1 not in r.status:
        try:
            c.end_stream(1)
            s.sendall(c.data_to_send())
        except (h2.exceptions.ProtocolError, OSError):
            pass
    pump(s, c, r, 3, until=lambda x: 1 in x.status)
    out(status=r.status.get(1, "none"), sent=size - left)


def early_answer(port, path):
    s, c = connect(port)
    c.send_headers(1, headers(port, path, "POST", [("content-type", "application/grpc")]))
    s.sendall(c.data_to_send())
    r = Result()
    pump(s, c, r, 3, until=lambda x: 1 in x.ended)
    try:
        c.send_data(1, b"\0\0\0\0\0")
        s.sendall(c.data_to_send())
    except (h2.exceptions.ProtocolError, OSError):
        pass
    pump(s, c, r, 3, until=lambda x: 1 in x.reset)
    out(status=r.status.get(1, "none"), ended=int(1 in r.ended), reset=r.reset.get(1, -1))


def fields_of(text):
    return [tuple(f.split(":", 1)) for f in text.split(";") if f]


def send_body(s, c, r, sid, size):
    """Sends 'size' bytes on stream 'sid' as its flow-control windows allow; how many went."""
    left = size
    while left > 0 and not r.closed and sid not in r.status:
        room = min(c.local_flow_control_window(sid), c.max_outbound_frame_size, left)
        if room <= 0:
            pump(s, c, r, 0.2)
            if c.local_flow_control_window(sid) <= 0:
                break
            continue
        c.send_data(sid, b"u" * room)
        left -= room
        s.sendall(c.data_to_send())
        pump(s, c, r, 0.01)
    return size - left


def trailers(port, path, size, fields, tfields):
    s, c = connect(port)
    c.send_headers(1, headers(port, path, "POST", fields_of(fields)))
    s.sendall(c.data_to_send())
    r = Result()
    sent = send_body(s, c, r, 1, size)
    if sent == size and 1 not in r.status:
        c.send_headers(1, fields_of(tfields), end_stream=True)
        s.sendall(c.data_to_send())
    pump(s, c, r, 8, until=lambda x: 1 in x.ended or 1 in x.reset)
    out(status=r.status.get(1, "none"), sent=sent, body=r.data.get(1, 0))


def never_indexed(port, path, fields):
    s, c = connect(port)
    c.send_headers(1, headers(port, path, "GET", fields_of(fields)), end_stream=True)
    s.sendall(c.data_to_send())
    r = Result()
    names = []
    end = time.monotonic() + 5
    while time.monotonic() < end and not r.closed and 1 not in r.status:
        b = recv_some(s, end)
        if b is None:
            continue
        if not b:
            break
        for e in c.receive_data(b):
            if isinstance(e, h2.events.ResponseReceived):
                r.status[1] = dict(e.headers).get(":status")
                names = [h[0] for h in e.headers if getattr(h, "indexable", True) is False]
    out(status=r.status.get(1, "none"), never_indexed=",".join(names) or "-")


def main():
    a = sys.argv[1:]
    port = int(a[1])
    if a[0] == "reset-in-backoff":
        reset_in_backoff(port, a[2], a[3])
    elif a[0] == "rapid-reset":
        rapid_reset(port, a[2], int(a[3]))
    elif a[0] == "continuation":
        continuation(port, a[2], int(a[3]))
    elif a[0] == "drain":
        drain(port, a[2], int(a[3]))
    elif a[0] == "idle":
        idle(port, float(a[2]) if len(a) > 2 else 6.0)
    elif a[0] == "slow-reader":
        slow_reader(port, a[2], a[3])
    elif a[0] == "upload":
        upload(port, a[2], int(a[3]))
    elif a[0] == "early-answer":
        early_answer(port, a[2])
    elif a[0] == "trailers":
        trailers(port, a[2], int(a[3]), a[4], a[5])
    elif a[0] == "fields":
        never_indexed(port, a[2], a[3] if len(a) > 3 else "")
    else:
        sys.exit("unknown scenario " + a[0])


if __name__ == "__main__":
    main()
