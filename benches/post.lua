-- wrk script of courier_bench: POSTs a 1 KiB JSON event (the same body as
-- tests/support's json_body(1024, 0)) and, when the run ends, prints one
-- `courier_bench:` line that the bench parses (wrk's own --latency output
-- stops at p99). By hand, accept only (pause delivery first):
--   curl -fsS -X POST http://127.0.0.1:9090/v1/destinations/bench/pause
--   wrk -t2 -c50 -d10s --latency -s benches/post.lua http://127.0.0.1:8080/bench
--   curl -fsS -X POST http://127.0.0.1:9090/v1/destinations/bench/resume
local head = '{"kind":"bench","seq":0,"pad":"'
local tail = '"}'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = head .. string.rep("x", 1024 - #head - #tail) .. tail

-- Step l: with COURIER_BENCH_KEYS=N, each request carries an Ordering-Key
-- header, k0 .. k(N-1) in turn. Each wrk thread counts on its own, from
-- half a round apart (else the two threads would send each key twice
-- at once, which no app does on purpose).
local keys = tonumber(os.getenv("COURIER_BENCH_KEYS") or "")
local threads = 0
function setup(thread)
  thread:set("start", threads)
  threads = threads + 1
end
if keys then
  local n = nil
  request = function()
    n = (n or start * math.floor(keys / 2)) + 1
    wrk.headers["Ordering-Key"] = "k" .. (n % keys)
    return wrk.format()
  end
end

-- Step m: with COURIER_BENCH_ENDPOINTS=N:PORT, each request names its
-- endpoint in Courier-Endpoint: http://127.1.x.y:PORT/ for the N
-- addresses of courier_bench/endpoints.rs, in turn, the two threads half
-- a round apart. The N requests are formatted once, in each thread's
-- init: formatting one per request cost wrk 5 us of CPU a request, taken
-- from courier and the receiver on a small machine (step b's requests are
-- formatted once too).
local endpoints = os.getenv("COURIER_BENCH_ENDPOINTS")
if endpoints then
  local count, port = endpoints:match("^(%d+):(%d+)$")
  count = tonumber(count)
  local requests = nil
  local n = nil
  init = function()
    requests = {}
    for i = 0, count - 1 do
      wrk.headers["Courier-Endpoint"] = string.format(
        "http://127.1.%d.%d:%s/", math.floor(i / 250), i % 250 + 1, port)
      requests[i] = wrk.format()
    end
  end
  request = function()
    n = ((n or start * math.floor(count / 2)) + 1) % count
    return requests[n]
  end
end

-- Step r: with COURIER_BENCH_TRACEPARENT set, every request carries it as
-- its W3C traceparent (one app span, sampled), as an instrumented app's do.
local traceparent = os.getenv("COURIER_BENCH_TRACEPARENT")
if traceparent then
  wrk.headers["traceparent"] = traceparent
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "courier_bench: requests=%d duration_us=%d non_2xx=%d socket_errors=%d p50_us=%d p99_us=%d p999_us=%d\n",
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9)))
end
