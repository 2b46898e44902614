-- gradient_step.lua - one gradient-set step through cfx.gradient_set (every parameter of a
-- workload registered once, owned storage, each step gs:ready in reverse registration order, then
-- gs:wait), interleaved in blocks with the same step on the same set issued from C in this process
-- (cfx_bench_loops.gradset, bench-only), so that both see the same set, the same buckets and the same load. The
-- result of one step of each kind is checked first against the sum of what every rank put in.
-- Usage: lua5.4 gradient_step.lua WORKLOAD.tsv [steps] [blocks]. Rank 0 prints
-- "<path> <median_us> <p10> <p90> <min>" for c-gradset-in-lua and lua-gradset (the step), and
-- c-ready-in-lua and lua-ready (its ready calls alone: what the binding adds per step). See run.sh.
local cfx = require "conflux"
local loops = require "cfx_bench_loops"  -- bench/lang/loops.c, bench-only
local path = assert(arg[1], "usage: gradient_step.lua WORKLOAD.tsv [steps] [blocks]")
local steps, blocks = tonumber(arg[2]) or 40, tonumber(arg[3]) or 4
local per = math.max(1, steps // blocks)
local clock = cfx.clock

local function stats(name, t)
  table.sort(t)
  local n = #t
  return ("%s %.2f %.2f %.2f %.2f"):format(name, t[n // 2 + 1], t[n // 10 + 1], t[n * 9 // 10 + 1], t[1])
end

cfx.init()
local rank, size = cfx.rank(), cfx.size()
local gs = cfx.gradient_set { name = "bench.lang.lua", op = "sum" }
local n = 0
for line in io.lines(path) do
  if line ~= "" and line:sub(1, 1) ~= "#" then
    local name, dims = line:match("^(%S+)\t(%S+)$")
    local shape = {}
    for d in dims:gmatch("%d+") do shape[#shape + 1] = math.tointeger(d) end
    gs:add(name, shape, "float32")
    n = n + 1
  end
end
gs:commit()

-- the step being measured is this, then gs:wait()
local function ready()
  for i = n, 1, -1 do gs:ready(i) end
end

-- fills every gradient with a rank-dependent value, runs one step, checks the sums against what
-- every rank put in (byte for byte), then zeroes the storage for the timed steps (as
-- bench/conflux_bench.c)
local function check_once(what, run)
  for g = 1, n do gs:array(g):fill((rank + 1) * (g % 7 + 1)) end
  run()
  for g = 1, n do
    local a = gs:array(g)
    local want = size * (size + 1) // 2 * (g % 7 + 1)
    if a:tobytes() ~= string.pack("f", want):rep(#a) then
      error(("%s: gradient %d is not %s everywhere"):format(what, g, want))
    end
    a:fill(0)
  end
end

check_once("lua-gradset", function() ready(); gs:wait() end)
check_once("c-gradset-in-lua", function() assert(loops.gradset(cfx._address(gs), gs._count, 1)) end)

local tc, tl, rc, rl = {}, {}, {}, {}
-- block 0 warms up and is not counted; even blocks run the C steps last, so that neither path
-- always follows the other
for b = 0, blocks do
  local c, cr
  if b % 2 == 1 or b == 0 then c, cr = assert(loops.gradset(cfx._address(gs), gs._count, per)) end
  for _ = 1, per do
    local t0 = clock()
    ready()
    local tr = clock()
    gs:wait()
    local t1 = clock()
    if b > 0 then tl[#tl + 1], rl[#rl + 1] = (t1 - t0) * 1e6, (tr - t0) * 1e6 end
  end
  if not c then c, cr = assert(loops.gradset(cfx._address(gs), gs._count, per)) end
  if b > 0 then
    for i, v in ipairs(c) do tc[#tc + 1], rc[#rc + 1] = v, cr[i] end
  end
end
if rank == 0 then
  print(stats("c-gradset-in-lua", tc))
  print(stats("lua-gradset", tl))
  print(stats("c-ready-in-lua", rc))
  print(stats("lua-ready", rl))
end
gs:free()
cfx.shutdown()
