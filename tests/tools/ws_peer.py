#!/usr/bin/python3
"""ws_peer -- a WebSocket upstream and client for the upgrade tests (docs/upgrades.md), with
Debian's python3-websockets (10.4, asyncio). Run with /usr/bin/python3.

  ws_peer.py server RECORD_FILE [--refuse STATUS] [--tls CERT KEY [--client-ca FILE]]
                    [--bind IP:PORT]
      Listens on 127.0.0.1 on a port the kernel picks (--bind: that IPv4 address and port, 0
      for one the kernel picks; 127.0.0.2, .3 stand for the pods of one service) and prints
      "PORT\\n" once it accepts.
      Each handshake is recorded as one JSON line {"event": "handshake", "path", "headers"}
      (flushed at once), each connection's end as {"event": "closed", "path", "code",
      "at_ms"} (CLOCK_MONOTONIC milliseconds). With --refuse, every handshake is answered
      STATUS with the body "refused\\n" instead. Otherwise every message is echoed back, except
      "close-me", which the server answers by closing with code 4001. With --tls, connections
      are TLS with that certificate and key (PEM files); with --client-ca too, a client
      certificate that the PEM certificates in FILE verify is required. Stops when stdin
      closes.

  ws_peer.py client URL SCENARIO
      Runs one scenario against URL and prints one JSON line: {"ok": bool, ...}. Scenarios:
        text, binary    a message echoed back unchanged
        big             a 1 MiB binary message echoed back unchanged
        ping            a ping answered by a pong
        close-client    the client closes (code 1000), the close handshake completes
        close-server    the server closes (code 4001), seen by the client
        slow            a message echoed, 2.5 s of silence, another echoed
        vanish          a message echoed, then the process exits without a close (prints
                        "at_ms" just before)
        status          the handshake is refused: "status" is the HTTP status it got
"""
import asyncio
import http
import json
import os
import ssl
import sys
import time

import websockets


def now_ms():
    return int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1000)


def serve(record, refuse, tls, client_ca, bind):
    out = open(record, "a")

    def log(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    async def process_request(path, headers):
        log({"event": "handshake", "path": path, "headers": dict(headers.raw_items())})
        if refuse:
            return (http.HTTPStatus(refuse), [("Content-Type", "text/plain")], b"refused\n")
        return None

    async def handler(ws, path):
        try:
            async for msg in ws:
                if msg == "close-me":
                    await ws.close(code=4001, reason="asked")
                    break
                await ws.send(msg)
        except websockets.ConnectionClosed:
            pass
        log({"event": "closed", "path": path, "code": ws.close_code, "at_ms": now_ms()})

    async def main():
        ctx = None
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(tls[0], tls[1])
            if client_ca:
                ctx.verify_mode = ssl.CERT_REQUIRED
                ctx.load_verify_locations(client_ca)
        ip, port = bind.rsplit(":", 1)
        server = await websockets.serve(handler, ip, int(port), process_request=process_request,
                                        max_size=4 * 1024 * 1024, ping_interval=None, ssl=ctx)
        port = server.sockets[0].getsockname()[1]
        sys.stdout.write("%d\n" % port)
        sys.stdout.flush()
        loop = asyncio.get_running_loop()
        stop = loop.create_future()
        loop.add_reader(sys.stdin.fileno(), lambda: stop.done() or (
            not os.read(sys.stdin.fileno(), 4096) and stop.set_result(None)))
        await stop
        server.close()

    asyncio.run(main())


async def client(url, scenario):
    if scenario == "status":
        try:
            async with websockets.connect(url, open_timeout=10):
                return {"ok": False, "why": "handshake accepted"}
        except websockets.InvalidStatusCode as e:
            return {"ok": True, "status": e.status_code}
    async with websockets.connect(url, max_size=4 * 1024 * 1024, open_timeout=10,
                                  ping_interval=None) as ws:
        if scenario in ("text", "binary", "big"):
            msg = {"text": "hello through the tunnel",
                   "binary": bytes(range(256)) * 4,
                   "big": os.urandom(1024 * 1024)}[scenario]
            await ws.send(msg)
            got = await asyncio.wait_for(ws.recv(), 20)
            return {"ok": got == msg, "len": len(got), "type": type(got).__name__}
        if scenario == "slow":
            await ws.send("one")
            first = await asyncio.wait_for(ws.recv(), 10)
            await asyncio.sleep(2.5)
            await ws.send("two")
            second = await asyncio.wait_for(ws.recv(), 10)
            return {"ok": (first, second) == ("one", "two")}
        if scenario == "ping":
            pong = await ws.ping(b"are you there")
            await asyncio.wait_for(pong, 10)
            return {"ok": True}
        if scenario == "close-client":
            await ws.send("before close")
            await ws.recv()
            await asyncio.wait_for(ws.close(code=1000, reason="bye"), 10)
            return {"ok": ws.close_code == 1000, "code": ws.close_code}
        if scenario == "close-server":
            await ws.send("close-me")
            try:
                await asyncio.wait_for(ws.recv(), 10)
            except websockets.ConnectionClosed:
                pass
            return {"ok": ws.close_code == 4001, "code": ws.close_code}
        if scenario == "vanish":
            await ws.send("last words")
            await ws.recv()
            sys.stdout.write(json.dumps({"ok": True, "at_ms": now_ms()}) + "\n")
            sys.stdout.flush()
            os._exit(0)
    return {"ok": False, "why": "unknown scenario " + scenario}


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "server":
        args, refuse, tls, client_ca, bind = sys.argv[3:], 0, None, None, "127.0.0.1:0"
        while args:
            if args[0] == "--refuse" and len(args) >= 2:
                refuse, args = int(args[1]), args[2:]
            elif args[0] == "--tls" and len(args) >= 3:
                tls, args = (args[1], args[2]), args[3:]
            elif args[0] == "--client-ca" and len(args) >= 2:
                client_ca, args = args[1], args[2:]
            elif args[0] == "--bind" and len(args) >= 2:
                bind, args = args[1], args[2:]
            else:
                sys.stderr.write(__doc__)
                sys.exit(2)
        serve(sys.argv[2], refuse, tls, client_ca, bind)
        return
    if len(sys.argv) == 4 and sys.argv[1] == "client":
        try:
            res = asyncio.run(client(sys.argv[2], sys.argv[3]))
        except Exception as e:  # reported, for the test's message
            res = {"ok": False, "why": "%s: %s" % (type(e).__name__, e)}
        sys.stdout.write(json.dumps(res) + "\n")
        sys.exit(0 if res.get("ok") else 1)
    sys.stderr.write(__doc__)
    sys.exit(2)


if __name__ == "__main__":
    main()
