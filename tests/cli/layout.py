#!/usr/bin/env python3
"""The layout of proxy/ (docs/architecture.md), checked: run by tests/cli/test_layout.c.

    tests/cli/layout.py OBJDIR [NAME=PART ...] [--interface=NAME,...]

OBJDIR is the build's objects of proxy/ (build/obj/proxy). Who calls whom is read from the
objects (nm: what each one defines and what it needs), so the check sees calls, not includes.
NAME=PART pretends a file lives in another part, --interface names other files as the upstream
side's interface ("none": no file); the suite uses them to show that the check can fail. Exits 1 with
one line per breach:

  - every source of proxy/ is in a part's folder (or is one of the process's own files at the top);
  - a part calls only the parts below it (MAY_CALL), and a library only from its parts (LIBRARIES);
  - the request core reaches the upstream side only through its interface (the functions of
    proxy/upstream/attempt.h, CORE_UPSTREAM), the client side not at all (front.h's are pointers);
  - files that call each other in a circle are of one part, and each says at its top that they
    are one state machine ("one state machine");
  - no two headers include each other, however far round;
  - no file of proxy/, policy/ or config/ is over 800 lines, but one whose top says why;
  - each fuzz target's "fuzz-link:" comment is one line naming sources that are there.
"""
import collections, glob, os, re, subprocess, sys

# What each part may call, besides itself. '' is proxy/ itself: main.c, serve.c, listen.c.
MAY_CALL = {
    'base': [],
    'telemetry': ['base'],
    'http': ['base', 'telemetry'],
    'upstream': ['base', 'telemetry', 'http'],
    'dns': ['base', 'telemetry'],
    'store': ['base', 'telemetry'],
    'core': ['base', 'telemetry', 'http', 'upstream', 'dns', 'store'],
    'delivery': ['base', 'telemetry', 'http', 'core', 'store'],
    'http2': ['base', 'telemetry', 'http', 'core', 'upstream'],
    'http1': ['base', 'telemetry', 'http', 'core', 'upstream', 'http2'],
    'ops': ['base', 'telemetry', 'http', 'core', 'upstream', 'dns', 'store'],
    '': ['base', 'telemetry', 'http', 'core', 'upstream', 'http1', 'http2', 'ops', 'dns', 'store',
         'delivery'],
}
# The request core's files that may call into upstream/ only through the interface. The worker
# (a thread's context) and the runtime (a snapshot as it runs) make the transports, and are not
# on the request's way.
CORE_MAKERS = {'worker', 'runtime'}
CORE_UPSTREAM = {'attempt'}
# Symbols that are no call into a part: recv() is the binary's own (proxy/http1/recv_hook.c
# stands in for libc's, for libmicrohttpd's reads).
NOT_CALLS = {'recv'}
MAX_LINES = 800
# The libraries and the parts that call them (docs/architecture.md, "The parts").
LIBRARIES = {
    'MHD_': {'http1', 'ops'},        # the client port; the admin port's own daemon
    'curl_': {'upstream', ''},       # transfers; the global set-up in serve.c
    'nghttp2_': {'http2', 'upstream'},  # server sessions; client sessions
    'SSL_': {'upstream'},
    'ares_': {'dns'},                # the resolver's channel
    'sqlite3_': {'store'},           # the durable deliveries' file
    'PQ': {'store'},                 # libpq: the shared store (pg.c)
    'EVP_': {'store'},               # libcrypto: the sealed fields of stored requests (seal.c)
    'RAND_': {'store'},
    'json_': {'ops', ''},
    'epoll_': {'base'},
    'inotify_': set(),               # config/watch.c
}

def main():
    objdir = sys.argv[1]
    moved = dict(a.split('=', 1) for a in sys.argv[2:] if '=' in a and not a.startswith('-'))
    for a in sys.argv[2:]:
        if a.startswith('--interface='):
            CORE_UPSTREAM.clear()
            CORE_UPSTREAM.update(x for x in a.split('=', 1)[1].split(',') if x != 'none')
    bad = []
    part = {}
    for src in sorted(glob.glob('proxy/**/*.[ch]', recursive=True)):
        rel = os.path.relpath(src, 'proxy')
        p = os.path.dirname(rel)
        if p not in MAY_CALL:
            bad.append(f'{src}: proxy/{p}/ is no part of the layout (tests/cli/layout.py MAY_CALL)')
        name = os.path.basename(rel)[:-2]
        part[name] = moved.get(name, p)
    # calls
    defs, needs = {}, collections.defaultdict(set)
    objs = sorted(glob.glob(os.path.join(objdir, '**/*.o'), recursive=True))
    if not objs:
        sys.exit(f'layout: no objects under {objdir}')
    for o in objs:
        if not os.path.exists(os.path.join('proxy', os.path.relpath(o, objdir))[:-2] + '.c'):
            continue  # left by a build of sources since moved or removed
        name = os.path.basename(o)[:-2]
        out = subprocess.run(['nm', o], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            f = line.split()
            if len(f) == 3 and f[1] in 'TDBRVWC':
                defs[f[2]] = name
            elif len(f) == 2 and f[0] == 'U' and f[1] not in NOT_CALLS:
                needs[name].add(f[1])
    for a, syms in sorted(needs.items()):
        for pre, parts in LIBRARIES.items():
            s = next((x for x in sorted(syms) if x.startswith(pre)), None)
            if s and part.get(a) not in parts:
                bad.append(f'{a} ({part.get(a) or "proxy/"}) calls {s}: {pre}* is called from '
                           f'{", ".join(sorted(p or "proxy/" for p in parts)) or "config/"} only')
    calls = collections.defaultdict(dict)  # a -> b -> a symbol
    for a, syms in needs.items():
        for s in sorted(syms):
            b = defs.get(s)
            if b and b != a:
                calls[a].setdefault(b, s)
    for a in sorted(calls):
        for b, s in sorted(calls[a].items()):
            pa, pb = part.get(a), part.get(b)
            if pa is None or pb is None or pa == pb:
                continue
            if pb not in MAY_CALL.get(pa, []):
                bad.append(f'{a} ({pa or "proxy/"}) calls {b} ({pb}): {s}; {pa or "proxy/"} may '
                           f'call {", ".join(MAY_CALL.get(pa, [])) or "nothing"}')
            elif pa == 'core' and pb == 'upstream' and a not in CORE_MAKERS and b not in CORE_UPSTREAM:
                bad.append(f'{a} (core) calls {b}: {s}; the core reaches the upstream side only '
                           f'through {", ".join(sorted(CORE_UPSTREAM))}')
    # circles (Tarjan's strongly connected components)
    index, low, stack, on, comps = {}, {}, [], set(), []
    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in calls.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))
    sys.setrecursionlimit(10000)
    for v in sorted(set(calls) | set(defs.values())):
        if v not in index:
            visit(v)
    for comp in comps:
        parts = sorted({part.get(f, '?') for f in comp})
        if len(parts) > 1:
            bad.append(f'a call circle across parts {", ".join(parts)}: {", ".join(comp)}')
            continue
        for f in comp:
            src = next(iter(glob.glob(f'proxy/**/{f}.c', recursive=True)), None)
            text = open(src).read() if src else ''
            top = text[:text.find('*/') + 2]  # the file's first comment
            if 'one state machine' not in ' '.join(re.sub(r'\n\s*\* ?', ' ', top).split()).lower():
                bad.append(f'{src or f}: calls {", ".join(x for x in comp if x != f)} in a circle; '
                           'its top must say they are one state machine')
    # headers that include each other
    inc = collections.defaultdict(set)
    for h in glob.glob('proxy/**/*.h', recursive=True) + glob.glob('config/*.h') + glob.glob('policy/*.h'):
        for m in re.finditer(r'^#include "([^"]+\.h)"', open(h).read(), re.M):
            inc[h].add(m.group(1))
    seen, path = {}, []
    def walk(h):
        seen[h] = 1
        path.append(h)
        for d in sorted(inc.get(h, ())):
            if seen.get(d) == 1:
                bad.append('headers include each other: ' + ' -> '.join(path[path.index(d):] + [d]))
            elif d not in seen:
                walk(d)
        path.pop()
        seen[h] = 2
    for h in sorted(inc):
        if h not in seen:
            walk(h)
    # lengths
    for src in sorted(glob.glob('proxy/**/*.[ch]', recursive=True) + glob.glob('config/*.[ch]') +
                      glob.glob('policy/*.[ch]')):
        text = open(src).read()
        n = text.count('\n')
        if n > MAX_LINES and f'over {MAX_LINES} lines' not in ' '.join(text[:3000].split()):
            bad.append(f'{src}: {n} lines, over {MAX_LINES}, and its top does not say why')
    # the fuzz targets' sources (mk/fuzz.mk reads each "fuzz-link:" comment as one line)
    for fz in sorted(glob.glob('tests/fuzz/*.c')):
        for i, line in enumerate(open(fz), 1):
            if 'fuzz-link:' not in line:
                continue
            if '*/' not in line:
                bad.append(f'{fz}:{i}: a fuzz-link comment must end on its line (mk/fuzz.mk)')
            for src in line.split('fuzz-link:', 1)[1].replace('*/', '').split():
                if not os.path.exists(src):
                    bad.append(f'{fz}:{i}: fuzz-link names {src}, which is not there')
    for b in bad:
        print(b)
    print(f'layout: {len(part)} files, {sum(len(v) for v in calls.values())} calls between files, '
          f'{len(bad)} breaches')
    sys.exit(1 if bad else 0)

main()
