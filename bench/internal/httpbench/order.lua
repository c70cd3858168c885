-- order.lua: the wrk script of the HTTP scenarios (lockbench scenario 6, etcdbench scenario 8).
-- Every request creates an order for a uid of its own (and a SKU of the same name), so no two
-- requests share a lock key: the figures are the cost of locking, not of contention.
--
-- Arguments (wrk ... -s order.lua URL -- PREFIX FIRST COUNT): uids are PREFIX..FIRST to
-- PREFIX..(FIRST+COUNT-1), in order, wrapping after COUNT requests; the benchmark seeds them
-- (SKU stock and account balance) before the run and sizes COUNT so that they do not wrap.
-- Run it with one thread (-t 1): each wrk thread has a Lua state of its own and would send
-- the same uids.
--
-- done() prints one line, "LOCKBENCH {json}", with the request count, the errors and the
-- latency percentiles in microseconds.
local prefix, first, count = "u", 0, 1
local n = 0
local headers = { ["Content-Type"] = "application/json" }

function init(args)
  prefix = args[1] or prefix
  first = tonumber(args[2] or first)
  count = tonumber(args[3] or count)
end

function request()
  local id = prefix .. (first + n % count)
  n = n + 1
  return wrk.format("POST", "/api/order/create", headers,
    '{"uid":"' .. id .. '","sku":"' .. id .. '","qty":1}')
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'LOCKBENCH {"requests":%d,"duration_us":%d,"status_errors":%d,"connect_errors":%d,' ..
    '"read_errors":%d,"write_errors":%d,"timeouts":%d,"p50":%d,"p90":%d,"p99":%d,"p999":%d,' ..
    '"max":%d,"mean":%.1f}\n',
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max, latency.mean))
end
