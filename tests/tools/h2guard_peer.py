#!/usr/bin/python3
"""h2guard_peer -- HTTP/2 clients that send what libnghttp2 does not bound by itself, frames
built by hand, for tests/integration/test_h2_guard.c (proxy/http2/h2guard.c).

Run with Debian's /usr/bin/python3 (python3-hpack). One scenario per run; it prints one line of
results ("key value" pairs) on stdout:

  empty PORT PATH KIND N     a POST whose body never comes, then N frames carrying nothing:
                             KIND "data" (empty DATA), "padded" (DATA of padding only),
                             "unknown" (a frame type the proxy ignores), "priority"
  bomb PORT PATH N           N requests whose header block refers to one 4 KB table entry
                             16,000 times (an HPACK bomb)
  lower PORT PATH            HEADERS on stream 5, then on stream 3 (never used)
  trailers-lower PORT PATH   a POST on stream 1, a GET on stream 3, then stream 1's trailers

Every line has "goaway" (the GOAWAY code, or "none") and "ms" (from the first attack frame to
the GOAWAY or the end). Every run ends within a few seconds whatever the proxy does.
"""
import socket
import sys
import time

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def frame(ftype, flags, sid, payload=b""):
    n = len(payload)
    return bytes([n >> 16, (n >> 8) & 255, n & 255, ftype, flags]) + sid.to_bytes(4, "big") + payload


def literal(name, value):
    """A field without indexing, no Huffman (short names and values)."""
    return b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value


def hpack_int(v, prefix, first=0):
    top = (1 << prefix) - 1
    if v < top:
        return bytes([first | v])
    out = [first | top]
    v -= top
    while v >= 128:
        out.append((v & 127) | 128)
        v >>= 7
    out.append(v)
    return bytes(out)


def request_block(port, path, method=b"GET"):
    return (literal(b":method", method) + literal(b":path", path.encode()) +
            literal(b":scheme", b"http") + literal(b":authority", b"127.0.0.1:%d" % port))


def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(PREFACE + frame(4, 0, 0))  # SETTINGS
    return s


class Reader:
    """Reads the proxy's frames: the GOAWAY code, the streams' status and resets."""

    def __init__(self, s):
        self.s = s
        self.buf = b""
        self.goaway = None
        self.closed = False
        self.status = {}
        self.reset = {}
        self.dec = hpack.Decoder()

    def poll(self, seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end and not self.closed:
            self.s.settimeout(max(0.01, min(0.2, end - time.monotonic())))
            try:
                b = self.s.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                b = b""
            if not b:
                self.closed = True
                return
            self.buf += b
            while len(self.buf) >= 9:
                ln = int.from_bytes(self.buf[0:3], "big")
                if len(self.buf) < 9 + ln:
                    break
                ftype, sid = self.buf[3], int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF
                payload = self.buf[9:9 + ln]
                self.buf = self.buf[9 + ln:]
                if ftype == 7:
                    self.goaway = int.from_bytes(payload[4:8], "big")
                elif ftype == 3:
                    self.reset[sid] = int.from_bytes(payload[0:4], "big")
                elif ftype == 1:
                    try:
                        for k, v in self.dec.decode(payload):
                            if k in (":status", b":status"):
                                self.status[sid] = int(v)
                    except Exception:
                        pass
            if self.goaway is not None:
                return

    def until(self, cond, seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end and not self.closed and not cond():
            self.poll(min(0.2, end - time.monotonic()))


def send(s, data):
    try:
        s.sendall(data)
        return True
    except OSError:
        return False


def out(r, t0, **kv):
    kv = dict(goaway="none" if r.goaway is None else r.goaway,
              ms=int((time.monotonic() - t0) * 1000), **kv)
    print(" ".join("%s %s" % (k, v) for k, v in kv.items()), flush=True)


def empty(port, path, kind, n):
    s = connect(port)
    r = Reader(s)
    send(s, frame(1, 4, 1, request_block(port, path, b"POST")))  # END_HEADERS
    one = {"data": frame(0, 0, 1), "padded": frame(0, 8, 1, b"\x04" + b"\0" * 4),
           "unknown": frame(0x42, 0, 0), "priority": frame(2, 0, 3, b"\0\0\0\0\x10")}[kind]
    t0 = time.monotonic()
    sent = 0
    batch = one * 1000
    while sent < n and r.goaway is None and not r.closed:
        if not send(s, batch):
            break
        sent += 1000
        r.poll(0)
    r.until(lambda: r.goaway is not None, 3)
    out(r, t0, sent=sent)


def bomb(port, path, n):
    s = connect(port)
    r = Reader(s)
    t0 = time.monotonic()
    # the first request puts the 4 KB entry in the table (literal with incremental indexing)
    entry = b"\x40" + hpack_int(3, 7) + b"x-a" + hpack_int(4000, 7) + b"a" * 4000
    sid = 1
    for i in range(n):
        block = request_block(port, path) + (entry if i == 0 else b"") + b"\xbe" * 16000
        # HEADERS, END_STREAM; the block over one 16 KB frame and a CONTINUATION
        if not send(s, frame(1, 1, sid, block[:16384]) + frame(9, 4, sid, block[16384:])):
            break
        r.poll(0)
        if r.goaway is not None or r.closed:
            break
        sid += 2
    r.until(lambda: r.goaway is not None or len(r.status) + len(r.reset) >= n, 5)
    out(r, t0, sent=(sid + 1) // 2, answered=len(r.status), reset=len(r.reset),
        first=r.status.get(1, "reset" if 1 in r.reset else "none"))


def lower(port, path):
    s = connect(port)
    r = Reader(s)
    t0 = time.monotonic()
    send(s, frame(1, 5, 5, request_block(port, path)))
    r.until(lambda: 5 in r.status, 3)
    send(s, frame(1, 5, 3, request_block(port, path)))
    r.until(lambda: r.goaway is not None, 3)
    out(r, t0, first=r.status.get(5, "none"), second=r.status.get(3, "none"))


def trailers_lower(port, path):
    s = connect(port)
    r = Reader(s)
    t0 = time.monotonic()
    send(s, frame(1, 4, 1, request_block(port, path, b"POST")))
    send(s, frame(0, 0, 1, b"hello"))
    send(s, frame(1, 5, 3, request_block(port, path)))
    r.until(lambda: 3 in r.status, 3)
    send(s, frame(1, 5, 1, literal(b"x-trailer", b"t")))  # END_STREAM | END_HEADERS
    r.until(lambda: 1 in r.status or r.goaway is not None, 5)
    out(r, t0, first=r.status.get(1, "none"), second=r.status.get(3, "none"))


def main():
    a = sys.argv[1:]
    port = int(a[1])
    if a[0] == "empty":
        empty(port, a[2], a[3], int(a[4]))
    elif a[0] == "bomb":
        bomb(port, a[2], int(a[3]))
    elif a[0] == "lower":
        lower(port, a[2])
    elif a[0] == "trailers-lower":
        trailers_lower(port, a[2])
    else:
        sys.exit("unknown scenario " + a[0])


if __name__ == "__main__":
    main()
