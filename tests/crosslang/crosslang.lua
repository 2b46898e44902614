-- crosslang.lua - the Lua side of the cross-language test (see crosslang.c): the same input and
-- collectives through require "conflux". Usage: lua5.4 crosslang.lua [gradset] OUT_PREFIX
-- (gradset: the mixed job's gradient set, see crosslang.c; registered here in canonical order
-- rotated by 2 + rank, ready in the order k = 0, 1, ...)
local cfx = require "conflux"
local N = 1000

if arg[1] == "gradset" then
  local grads = { { "xg.w", "float32", { 3, 4 }, 12 }, { "xg.b", "float64", { 5 }, 5 },
                  { "xg.n", "int32", { 6 }, 6 }, { "xg.v", "float32", { 2, 3, 2 }, 12 } }
  cfx.init()
  local rank, size = cfx.rank(), cfx.size()
  local ranksum = 0
  for q = 0, size - 1 do ranksum = ranksum + q + 1 end
  local gs = cfx.gradient_set { name = "xl.gs", op = "sum", bucket_bytes = 64 }
  local index, arrays, out = {}, {}, {}
  for j = 0, 3 do
    local k = (j + 2 + rank) % 4
    local g = grads[k + 1]
    index[k] = gs:add(g[1], g[3], g[2])
  end
  gs:commit()
  for k = 0, 3 do arrays[k] = gs:array(index[k]) end
  for s = 0, 2 do
    for k = 0, 3 do
      local g, a = grads[k + 1], arrays[k]
      for i = 0, g[4] - 1 do
        local v = (rank + 1) * (k + 1) + 3 * i + 7 * s - 20
        a[i + 1] = g[2] == "int32" and v or v / 4
      end
    end
    for k = 0, 3 do
      if k ~= s then gs:ready(index[k]) end
    end
    gs:wait(60)
    for k = 0, 3 do
      local g, a = grads[k + 1], arrays[k]
      if #a ~= g[4] then error(("rank %d %s has %d elements"):format(rank, g[1], #a)) end
      for i = 0, g[4] - 1 do
        local want = ranksum * (k + 1) + size * (3 * i + 7 * s - 20)
        local got = g[2] == "int32" and a[i + 1] or a[i + 1] * 4
        if got ~= want then
          error(("crosslang.lua: rank %d step %d %s[%d] = %s, expected %s"):format(
            rank, s, g[1], i, tostring(a[i + 1]), tostring(g[2] == "int32" and want or want / 4)))
        end
      end
      out[#out + 1] = a:tobytes()
    end
  end
  gs:free()
  local f = assert(io.open(arg[2] .. "." .. rank .. ".bin", "wb"))
  f:write(table.concat(out))
  f:close()
  cfx.shutdown()
  return
end
cfx.init()
local rank = cfx.rank()
local x = cfx.array("float32", N)
for i = 1, N do x[i] = math.sin((i - 1) * 0.1 + rank) end
local sum = cfx.allreduce(x:copy(), { op = "sum", name = "xl.sum" })            -- typed array (zero-copy)
local t = x:totable()
local avg = cfx.allreduce(t, { op = "average", name = "xl.avg", dtype = "float32" }) -- table (copied)
local f = assert(io.open(arg[1] .. "." .. rank .. ".bin", "wb"))
f:write(x:tobytes(), sum:tobytes(), cfx.array("float32", avg):tobytes())
f:close()
cfx.shutdown()
