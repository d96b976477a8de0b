-- wrk script for the api scenario (bench/loadgen.py runs it).
-- One connection per wrk thread; thread i talks to replica i mod #ports, so the
-- connections are spread round-robin over the replicas.
-- Environment: WRK_PORTS "p1,p2,p3"; WRK_MODE create|list|get; WRK_TAG (unique per run,
-- for created names); WRK_SEED_PREFIX and WRK_SEEDS (get picks seeded names at random).

local ports = {}
for port in string.gmatch(os.getenv("WRK_PORTS") or "", "%d+") do
  table.insert(ports, tonumber(port))
end
local created = 0

function setup(thread)
  created = created + 1
  local port = ports[((created - 1) % #ports) + 1]
  thread.addr = wrk.lookup("127.0.0.1", tostring(port))[1]
  thread:set("tid", created)
end

function init(args)
  mode = os.getenv("WRK_MODE") or "list"
  tag = os.getenv("WRK_TAG") or "wrk"
  prefix = os.getenv("WRK_SEED_PREFIX") or "seed-"
  seeds = tonumber(os.getenv("WRK_SEEDS") or "1")
  counter = 0
  math.randomseed(os.time() + tid * 7919)
  json = { ["Content-Type"] = "application/json" }
end

function request()
  counter = counter + 1
  if mode == "create" then
    local name = string.format("%s-%d-%d", tag, tid, counter)
    local body = '{"name":"' .. name .. '","schedule":{"kind":"once","at":"2099-01-01T00:00:00Z"},'
      .. '"task":"log","args":{"message":"bench"}}'
    return wrk.format("POST", "/v1/jobs", json, body)
  elseif mode == "get" then
    local name = string.format("%s%05d", prefix, math.random(0, seeds - 1))
    return wrk.format("GET", "/v1/jobs/" .. name)
  end
  return wrk.format("GET", "/v1/jobs?limit=100")
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests": %d, "duration_us": %d, "errors": %d, "non_2xx": %d, '
      .. '"p50_us": %d, "p99_us": %d, "max_us": %d}\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(99), latency.max))
end
