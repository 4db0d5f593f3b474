#!/usr/bin/python3
"""h2flow -- HTTP/2 clients for the front end's flow control, whole answers and reset budget
(tests/integration/test_h2_flow.c), on tests/tools/h2peer.py's helpers.

Run with Debian's /usr/bin/python3 (python3-h2). One scenario per run; it prints one line of
results ("key value" pairs) on stdout for the test to check:

  call PORT PATH METHOD SIZE FIELDS  one request (a body of SIZE bytes, FIELDS "name:value;..."),
                                     read whole: its status, body bytes, end or reset, and each
                                     trailer as "t:NAME VALUE"
  stuck-upload PORT PATH FIELDS [N]  a POST whose body is sent until its window stays closed
                                     (or N bytes of it are, without END_STREAM), then waits for
                                     the answer: how long after the answer's end the stream was
                                     reset ("reset_ms", -1 if never)
  cancelled-uploads PORT PATH FIELDS N THEN SIZE
                                     N POSTs to PATH sent until their windows close, then each
                                     reset (CANCEL); then a POST of SIZE bytes to THEN on the
                                     same connection
  many PORT PATH N FIELDS            N GETs on one connection (50 at a time): how many ended,
                                     how many were reset INTERNAL_ERROR, and any GOAWAY
  unread PORT PATH N FAST FIELDS     N GETs of PATH never read (their windows stay closed), then
                                     one of FAST read as it comes: its bytes and time
  hold PORT PATH FIELDS CONNS STREAMS MODE SECONDS
                                     CONNS connections of STREAMS GETs each, never read: MODE
                                     "window" never opens a window again, "zero" opens none
                                     (SETTINGS_INITIAL_WINDOW_SIZE 0), "socket" opens them wide
                                     and never reads the socket. Prints "ready" once they are all
                                     sent and had 2 s to fill, then holds them SECONDS.

Every run ends within a few seconds (SECONDS more for "hold") whatever the proxy does.
"""
import socket
import sys
import time

import h2.events
import h2.exceptions
import h2.settings

from h2peer import Result, connect, fields_of, headers, out, pump


def sendall(s, c, r):
    try:
        s.sendall(c.data_to_send())
    except OSError:
        r.closed = True


def call(port, path, method, size, fields):
    s, c = connect(port)
    r = Result()
    trailers = {}
    c.send_headers(1, headers(port, path, method, fields_of(fields)), end_stream=size == 0)
    sendall(s, c, r)
    left = size
    end = time.monotonic() + 8
    while left > 0 and not r.closed and time.monotonic() < end:
        room = min(c.local_flow_control_window(1), c.max_outbound_frame_size, left)
        if room <= 0:
            pump(s, c, r, 0.1)
            continue
        left -= room
        c.send_data(1, b"\0" * room, end_stream=left == 0)
        sendall(s, c, r)
    # python3-h2 reports trailers as an event of their own: read them here
    orig = c.receive_data

    def receive(b):
        events = orig(b)
        for e in events:
            if isinstance(e, h2.events.TrailersReceived):
                trailers.update(dict(e.headers))
        return events

    c.receive_data = receive
    pump(s, c, r, 8, until=lambda x: 1 in x.ended or 1 in x.reset)
    kv = {"status": r.status.get(1, "none"), "body": r.data.get(1, 0),
          "ended": int(1 in r.ended), "reset": r.reset.get(1, -1)}
    for k, v in trailers.items():
        kv["t:" + k] = v.replace(" ", "_") or "-"
    out(**kv)


def room_of(c, r, sid):
    """What stream 'sid' may send now (0 once it is reset or closed)."""
    if sid in r.reset or sid in r.ended:
        return 0
    try:
        return max(0, min(c.local_flow_control_window(sid), c.max_outbound_frame_size))
    except h2.exceptions.ProtocolError:
        return 0


def fill(s, c, r, sids, quiet=0.5):
    """Sends body bytes on 'sids' until no window opens for 'quiet' seconds; bytes sent."""
    sent = 0
    while not r.closed:
        moved = False
        for sid in sids:
            room = room_of(c, r, sid)
            if room:
                c.send_data(sid, b"u" * room)
                sent += room
                moved = True
        sendall(s, c, r)
        pump(s, c, r, 0.01 if moved else quiet)
        if not moved and not any(room_of(c, r, sid) for sid in sids):
            break
    return sent


def stuck_upload(port, path, fields, limit=None):
    s, c = connect(port)
    r = Result()
    c.send_headers(1, headers(port, path, "POST", fields_of(fields)))
    sendall(s, c, r)
    if limit is None:
        sent = fill(s, c, r, [1])
    else:
        c.send_data(1, b"u" * limit)
        sendall(s, c, r)
        sent = limit
    pump(s, c, r, 10, until=lambda x: 1 in x.ended or 1 in x.reset)
    t_end = time.monotonic()
    pump(s, c, r, 4, until=lambda x: 1 in x.reset)
    reset_ms = int((time.monotonic() - t_end) * 1000) if 1 in r.reset else -1
    out(status=r.status.get(1, "none"), ended=int(1 in r.ended), sent=sent,
        reset=r.reset.get(1, -1), reset_ms=reset_ms)


def cancelled_uploads(port, path, fields, n, then, size):
    s, c = connect(port)
    r = Result()
    sids = [1 + 2 * i for i in range(n)]
    for sid in sids:
        c.send_headers(sid, headers(port, path, "POST", fields_of(fields)))
    sendall(s, c, r)
    held = fill(s, c, r, sids)
    for sid in sids:
        if sid not in r.reset:
            c.reset_stream(sid, 8)  # CANCEL
    sendall(s, c, r)
    pump(s, c, r, 0.5)
    sid = sids[-1] + 2
    c.send_headers(sid, headers(port, then, "POST"))
    sendall(s, c, r)
    left = size
    end = time.monotonic() + 6
    while left > 0 and not r.closed and time.monotonic() < end:
        room = min(c.local_flow_control_window(sid), c.max_outbound_frame_size, left)
        if room <= 0:
            pump(s, c, r, 0.1)
            continue
        left -= room
        c.send_data(sid, b"u" * room, end_stream=left == 0)
        sendall(s, c, r)
    pump(s, c, r, 5, until=lambda x: sid in x.ended or sid in x.reset)
    out(held=held, status=r.status.get(sid, "none"), sent=size - left,
        ended=int(sid in r.ended))


def many(port, path, n, fields):
    s, c = connect(port, window=16 * 1024 * 1024)
    r = Result()
    opened = 0
    sid = 1
    t0 = time.monotonic()
    end = t0 + 30
    while time.monotonic() < end and not r.closed and r.goaway is None:
        done = len(r.ended) + len(r.reset)
        while opened < n and opened - done < 50:
            c.send_headers(sid, headers(port, path, extra=fields_of(fields)), end_stream=True)
            sid += 2
            opened += 1
        sendall(s, c, r)
        if done == n:
            break
        pump(s, c, r, 0.05)
    resets = sum(1 for v in r.reset.values() if v == 2)
    out(ended=len(r.ended), resets=resets, other=len(r.reset) - resets,
        goaway="none" if r.goaway is None else r.goaway, ms=int((time.monotonic() - t0) * 1000))


def unread(port, path, n, fast, fields):
    s, c = connect(port, window=64 * 1024 * 1024)
    r = Result()
    slow = set()
    for i in range(n):
        sid = 1 + 2 * i
        c.send_headers(sid, headers(port, path, extra=fields_of(fields)), end_stream=True)
        slow.add(sid)
    sendall(s, c, r)
    pump(s, c, r, 1.5, ack=lambda x: x not in slow)
    sid = 1 + 2 * n
    t0 = time.monotonic()
    c.send_headers(sid, headers(port, fast, extra=fields_of(fields)), end_stream=True)
    sendall(s, c, r)
    pump(s, c, r, 20, until=lambda x: sid in x.ended or sid in x.reset,
         ack=lambda x: x not in slow)
    out(fast=r.data.get(sid, 0), fast_ended=int(sid in r.ended),
        ms=int((time.monotonic() - t0) * 1000), slow=sum(r.data.get(x, 0) for x in slow),
        goaway="none" if r.goaway is None else r.goaway)


def hold(port, path, fields, conns, streams, mode, seconds):
    held = []
    for _ in range(conns):
        s, c = connect(port, window=2 ** 31 - 1 - 65535)
        if mode == "socket":
            c.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2 ** 31 - 1})
        elif mode == "zero":
            c.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
        for i in range(streams):
            c.send_headers(1 + 2 * i, headers(port, path, extra=fields_of(fields)),
                           end_stream=True)
        s.sendall(c.data_to_send())
        held.append((s, c, Result()))

    def wait(seconds):
        if mode == "socket":
            time.sleep(seconds)
            return
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for s, c, r in held:
                pump(s, c, r, 0.02, ack=lambda sid: False)

    wait(2)
    print("ready", flush=True)
    wait(seconds)
    for s, _, _ in held:
        s.close()
    out(done=1)


def main():
    a = sys.argv[1:]
    port = int(a[1])
    if a[0] == "call":
        call(port, a[2], a[3], int(a[4]), a[5])
    elif a[0] == "stuck-upload":
        stuck_upload(port, a[2], a[3], int(a[4]) if len(a) > 4 else None)
    elif a[0] == "cancelled-uploads":
        cancelled_uploads(port, a[2], a[3], int(a[4]), a[5], int(a[6]))
    elif a[0] == "many":
        many(port, a[2], int(a[3]), a[4])
    elif a[0] == "unread":
        unread(port, a[2], int(a[3]), a[4], a[5])
    elif a[0] == "hold":
        hold(port, a[2], a[3], int(a[4]), int(a[5]), a[6], float(a[7]))
    else:
        sys.exit("unknown scenario " + a[0])


if __name__ == "__main__":
    main()
