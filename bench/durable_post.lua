-- bench/durable_post.lua -- wrk script of bench/durable.sh: every request a POST of a BODY-byte
-- body (wrk's arguments after --: BODY [1024]); counts the statuses, since a durable accept is
-- a 202 and wrk alone would count a 503 store_full with the 2xx; prints one summary line.
local threads = {}

function setup(thread)
    table.insert(threads, thread)
end

function init(args)
    local n = tonumber(args[1] or "1024")
    wrk.method = "POST"
    wrk.body = string.rep("x", n)
    wrk.headers["Content-Type"] = "application/json"
    accepted, other = 0, 0
end

function response(status, headers, body)
    if status == 202 then
        accepted = accepted + 1
    else
        other = other + 1
    end
end

function done(summary, latency, requests)
    local a, o = 0, 0
    for _, t in ipairs(threads) do
        a = a + t:get("accepted")
        o = o + t:get("other")
    end
    -- latency in microseconds, from the request's write to its answer, per wrk's connection
    io.write(string.format("RESULT accepted=%d other=%d errors=%d secs=%.3f p50_us=%d p99_us=%d max_us=%d\n",
        a, o, summary.errors.connect + summary.errors.read + summary.errors.write +
        summary.errors.timeout, summary.duration / 1e6, latency:percentile(50),
        latency:percentile(99), latency.max))
end
