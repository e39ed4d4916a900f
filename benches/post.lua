-- wrk script for courier: POSTs a 1 KiB JSON event (same body as courier_bench).
-- Step b (accept only): pause delivery first, then load the ingress:
--   curl -fsS -X POST http://127.0.0.1:9090/v1/destinations/bench/pause
--   wrk -t2 -c64 -d10s -s benches/post.lua http://127.0.0.1:8080/bench
--   curl -fsS -X POST http://127.0.0.1:9090/v1/destinations/bench/resume
local head = '{"kind":"bench","seq":0,"pad":"'
local tail = '"}'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = head .. string.rep("x", 1024 - #head - #tail) .. tail
