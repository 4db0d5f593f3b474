#!/usr/bin/env python3
"""The layout of proxy/ (docs/architecture.md), checked: run by tests/cli/test_layout.c.

    tests/cli/layout.py OBJDIR [NAME=PART ...] [--interface=NAME,...] [--max-test-lines=N]

OBJDIR is the build's objects of proxy/ (build/obj/proxy). Who calls whom is read from the
objects (nm: what each one defines and what it needs), so the check sees calls, not includes.
NAME=PART pretends a file lives in another part, --interface names other files as the upstream
side's interface ("none": no file), --makers=none takes the worker's leave to make the engines
away, --transport=NAME=TRANSPORT pretends a file is of another transport, --include=FILE=HEADER
that a file includes one more header, --max-test-lines another bound for tests/, --machine
names another file as the request's state machine; the suite uses them to show that the check
can fail. Exits 1 with one line per breach:

  - every source of proxy/ is in a part's folder (or is one of the process's own files at the top);
  - a part calls only the parts below it (MAY_CALL), and a library only from its parts (LIBRARIES);
  - a part includes only headers of the parts it may call (and of config/ and policy/), but for
    a type it names (TYPES_FROM); config/ includes policy/ and config/, policy/ itself only;
  - the request core reaches the upstream side only through its interface: it includes
    proxy/upstream/attempt.h alone and calls its functions alone (CORE_UPSTREAM), but for the
    worker, which makes and frees each transport's engine (CORE_MAKERS); the client side not at
    all (front.h's are pointers); the other parts above upstream/ include of it only what
    UPSTREAM_SEEN says;
  - the upstream transports (TRANSPORTS) neither include nor call each other: what they share is
    below them (the connector, TLS, origins, slots), and the dispatcher (attempt.c) above;
  - the request's state machine (core/retry.c) calls the files that do its work and none of them
    calls it (MACHINE_PARTS; a later event of theirs comes back through a callback it passes down);
  - files that call each other in a circle are of one part, and each says at its top that they
    are one state machine ("one state machine");
  - no include circle between files of proxy/, however far round (a .c and its .h are one file;
    a private header, NAMEint.h, may include its folder's headers);
  - no two headers include each other, however far round (tests/ too);
  - no file of proxy/, policy/ or config/ is over 800 lines, but one whose top says why;
  - no source of tests/ (.c, .h, .py) is over 800 lines, none excepted;
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
# The request core reaches upstream/ through the interface alone (CORE_UPSTREAM: its header is
# the one upstream/ header the core includes). The worker (a thread's context, not on the
# request's way) makes and frees each transport's engine and the slots they share, so it may
# include and call these too.
CORE_UPSTREAM = {'attempt'}
CORE_MAKERS = {'worker': {'connect', 'curlm', 'h2up', 'slots'}}
# What each part above upstream/ includes of it (the core: the interface alone; the worker's
# engines are CORE_MAKERS'), so that no part outside reaches a transport's insides (issue 41).
UPSTREAM_SEEN = {
    'core': CORE_UPSTREAM,
    'http1': {'tunnel_up'},  # an upgrade's connection, the front end's after its 101
    'http2': {'share'},             # a client connection's share of the upstream slots
}
# Headers a part includes for a type it names, from a part it does not call (the call check
# shows it calls nothing there): an endpoint's address (struct dns_addr).
TYPES_FROM = {'upstream': {'proxy/dns/resolve.h'}}
# The upstream transports (docs/architecture.md), which neither include nor call each other.
# What they share is below them (connect, tls, origin, h1resp, slots, share, attempt_int.h) and
# the dispatcher that picks one (attempt.c) above.
TRANSPORTS = {
    'HTTP/1.1 (libcurl)': {'h1up', 'h1up_url', 'curlm'},
    'HTTP/2': {'h2up', 'h2up_conn', 'h2up_int', 'h2up_attempt'},
    'upgrade': {'tunnel_up', 'tunnel_up_attempt'},
}
# Symbols that are no call into a part: recv() is the binary's own (proxy/http1/recv_hook.c
# stands in for libc's, for libmicrohttpd's reads).
NOT_CALLS = {'recv'}
MAX_LINES = 800
# The request's state machine and the files that do what it asks (docs/architecture.md, "One
# request's states"): they return what happened and call nothing of it, so that a request's
# states and every move between them are read in one file.
MACHINE = 'retry'
MACHINE_PARTS = {'req', 'edge', 'keep', 'race', 'durable', 'tally'}
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

def circles(nodes, edges):
    """The nodes on a circle of 'edges' (node -> its successors), as sorted lists, one per group
    that reach each other (Tarjan's strongly connected components)."""
    index, low, stack, on, comps = {}, {}, [], set(), []
    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, {})):
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
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return comps

def transport(name):
    return next((t for t, files in TRANSPORTS.items() if name in files), None)

def stem(path):
    """The file a .c or .h is (a .c and its .h are one)."""
    return path[:-2]

def includes(part, moved, extra):
    """Breaches of the include rules, and include circles between files."""
    bad = []
    srcs = sorted(glob.glob('proxy/**/*.[ch]', recursive=True) + glob.glob('config/*.[ch]') +
                  glob.glob('policy/*.[ch]'))
    edges = collections.defaultdict(dict)  # file -> file -> the line that includes it
    for src in srcs:
        top = src.split('/')[0]
        name = os.path.basename(src)[:-2]
        pa = part.get(name) if top == 'proxy' else top
        named = [m.group(1) for m in re.finditer(r'^#include "([^"]+\.h)"', open(src).read(), re.M)]
        for h in named + extra.get(src, []):
            if not os.path.exists(h):
                continue  # a test's or a library's
            hname = os.path.basename(h)[:-2]
            htop = h.split('/')[0]
            pb = moved.get(hname, os.path.dirname(os.path.relpath(h, 'proxy'))) \
                if htop == 'proxy' else htop
            if top == htop == 'proxy' and stem(h) != stem(src) and not (src.endswith('int.h') and
                                              os.path.dirname(h) == os.path.dirname(src)):
                edges[stem(src)].setdefault(stem(h), f'{src} includes {h}')
            if top == 'policy' and htop != 'policy':
                bad.append(f'{src} includes {h}: policy/ includes nothing of config/ or proxy/')
            elif top == 'config' and htop == 'proxy':
                bad.append(f'{src} includes {h}: config/ includes nothing of proxy/')
            ta, tb = transport(name), transport(hname)
            if top == htop == 'proxy' and ta and tb and ta != tb:
                bad.append(f'{src} ({ta}) includes {h} ({tb}): a transport includes no other')
            if top != 'proxy' or htop != 'proxy' or pa == pb:
                continue
            if pb not in MAY_CALL.get(pa, []) and h not in TYPES_FROM.get(pa, ()):
                bad.append(f'{src} includes {h}: {pa or "proxy/"}/ may include '
                           f'{", ".join(MAY_CALL.get(pa, [])) or "nothing of proxy/"} (and config/, '
                           'policy/)')
            elif (pb == 'upstream' and hname not in UPSTREAM_SEEN.get(pa, ()) and
                  hname not in CORE_MAKERS.get(name, ())):
                seen = ', '.join(f'{x}.h' for x in sorted(UPSTREAM_SEEN.get(pa, ())))
                bad.append(f'{src} includes {h}: of upstream/, {pa or "proxy"}/ may include '
                           f'{seen + " only" if seen else "nothing"}')
    # include circles
    for comp in circles(set(edges) | {w for e in edges.values() for w in e}, edges):
        why = sorted(edges[a][b] for a in comp for b in edges.get(a, {}) if b in comp)
        bad.append(f'an include circle between {", ".join(comp)}: {"; ".join(why)}')
    return bad

def main():
    objdir = sys.argv[1]
    moved = dict(a.split('=', 1) for a in sys.argv[2:] if '=' in a and not a.startswith('-'))
    extra = collections.defaultdict(list)  # --include=FILE=HEADER: a pretended include
    max_test_lines = MAX_LINES
    machine = MACHINE
    for a in sys.argv[2:]:
        opt, _, val = a.partition('=')
        if opt == '--machine':
            machine = val
        elif opt == '--max-test-lines':
            max_test_lines = int(val)
        elif opt == '--interface':
            CORE_UPSTREAM.clear()
            CORE_UPSTREAM.update(x for x in val.split(',') if x != 'none')
        elif opt == '--makers' and val == 'none':
            CORE_MAKERS.clear()
        elif opt == '--transport':
            name, group = val.split('=', 1)
            for files in TRANSPORTS.values():
                files.discard(name)
            TRANSPORTS.setdefault(group, set()).add(name)
        elif opt == '--include':
            src, h = val.split('=', 1)
            extra[src].append(h)
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
            ta, tb = transport(a), transport(b)
            if ta and tb and ta != tb:
                bad.append(f'{a} ({ta}) calls {b} ({tb}): {s}; a transport calls no other')
            if pa is None or pb is None or pa == pb:
                continue
            if pb not in MAY_CALL.get(pa, []):
                bad.append(f'{a} ({pa or "proxy/"}) calls {b} ({pb}): {s}; {pa or "proxy/"} may '
                           f'call {", ".join(MAY_CALL.get(pa, [])) or "nothing"}')
            elif (pa == 'core' and pb == 'upstream' and b not in CORE_UPSTREAM and
                  b not in CORE_MAKERS.get(a, ())):
                bad.append(f'{a} (core) calls {b}: {s}; the core reaches the upstream side only '
                           f'through {", ".join(sorted(CORE_UPSTREAM)) or "nothing"}')
    for a in sorted(MACHINE_PARTS - {machine}):
        if machine in calls.get(a, {}):
            bad.append(f'{a} calls {machine}: {calls[a][machine]}; the request\'s state machine '
                       f'({machine}) calls {", ".join(sorted(MACHINE_PARTS - {machine}))}, never '
                       'the other way (docs/architecture.md, "One request\'s states")')
    bad += includes(part, moved, extra)
    # call circles
    comps = circles(set(calls) | set(defs.values()), calls)
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
    for h in (glob.glob('proxy/**/*.h', recursive=True) + glob.glob('config/*.h') +
              glob.glob('policy/*.h') + glob.glob('tests/**/*.h', recursive=True)):
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
    for src in sorted(glob.glob('tests/**/*.[ch]', recursive=True) +
                      glob.glob('tests/**/*.py', recursive=True)):
        n = open(src, errors='replace').read().count('\n')
        if n > max_test_lines:
            bad.append(f'{src}: {n} lines, over {max_test_lines}: split it by what it covers, '
                       'what the parts share in tests/support/ (docs/testing.md)')
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
