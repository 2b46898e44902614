-- crosslang.lua - the Lua side of the cross-language test (see crosslang.c): the same input and
-- collectives through require "conflux". Usage: lua5.4 crosslang.lua OUT_PREFIX
local cfx = require "conflux"
local N = 1000
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
