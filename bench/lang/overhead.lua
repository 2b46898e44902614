-- overhead.lua - per-call cost of a 1-element allreduce (enqueue + wait) through require "conflux",
-- on a typed array (zero-copy) and on a table (copied), interleaved in blocks with the same call
-- made from C in this process (cfx_bench_loops.allreduce, bench-only), so that all three see the same conditions.
-- Usage: lua5.4 overhead.lua [iterations] [blocks]. Rank 0 prints "<path> <median_us> <p10> <p90>"
-- for c-in-lua, lua-array and lua-table. See run.sh.
local cfx = require "conflux"
local loops = require "cfx_bench_loops"  -- bench/lang/loops.c, bench-only
local iters, blocks = tonumber(arg[1]) or 5000, tonumber(arg[2]) or 10
local per = iters // blocks
local clock = cfx.clock

local function stats(name, t)
  table.sort(t)
  local n = #t
  return ("%s %.2f %.2f %.2f"):format(name, t[n // 2 + 1], t[n // 10 + 1], t[n * 9 // 10 + 1])
end

cfx.init()
local a = cfx.array("float32", 1)
local opts_a = { op = "sum", name = "ovh" }
local opts_t = { op = "sum", name = "ovh", dtype = "float32" }
local tc, ta, tt = {}, {}, {}
for b = 0, blocks do          -- block 0 warms up and is not counted
  local c = assert(loops.allreduce(cfx._address(), per))
  for i = 1, per do
    a[1] = 1
    local t0 = clock()
    cfx.allreduce(a, opts_a)
    local t1 = clock()
    if b > 0 then ta[#ta + 1] = (t1 - t0) * 1e6 end
  end
  for i = 1, per do
    local t = { 1 }
    local t0 = clock()
    cfx.allreduce(t, opts_t)
    local t1 = clock()
    if b > 0 then tt[#tt + 1] = (t1 - t0) * 1e6 end
  end
  if b > 0 then for _, v in ipairs(c) do tc[#tc + 1] = v end end
end
if cfx.rank() == 0 then
  print(stats("c-in-lua", tc))
  print(stats("lua-array", ta))
  print(stats("lua-table", tt))
end
cfx.shutdown()
