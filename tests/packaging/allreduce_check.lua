-- lua5.4 allreduce_check.lua PREFIX NP, under mpirun: require "conflux" finds conflux_core under
-- PREFIX and maps libconflux from there too, the job has NP ranks, and an allreduce of a float32 array gives on every rank the sum of
-- what each rank contributed ((rank + 1) * i at element i), computed here from the ranks' formula.
local prefix, np_want = arg[1], tonumber(arg[2])
local cfx = require "conflux"
local where = package.searchpath("conflux_core", package.cpath)
if not where or where:sub(1, #prefix + 1) ~= prefix .. "/" then
  error(("FAIL: conflux_core found at %s, not under %s"):format(tostring(where), prefix))
end
local mapped = 0
for line in io.lines("/proc/self/maps") do
  local lib = line:match("(/%S*libconflux%.so%S*)")
  if lib then
    mapped = mapped + 1
    if lib:sub(1, #prefix + 1) ~= prefix .. "/" then
      error(("FAIL: libconflux mapped from %s, not from under %s"):format(lib, prefix))
    end
  end
end
if mapped == 0 then error("FAIL: libconflux is not mapped") end
cfx.init()
local rank, size = cfx.rank(), cfx.size()
if size ~= np_want then
  error(("FAIL: rank %d sees a job of %d ranks, not %d"):format(rank, size, np_want))
end
local n = 1000
local x = cfx.array("float32", n)
for i = 1, n do x[i] = (rank + 1) * i end
cfx.allreduce(x, { op = "sum", name = "packaging.check" })
local ranks_sum = 0
for r = 0, size - 1 do ranks_sum = ranks_sum + r + 1 end
for i = 1, n do
  if x[i] ~= ranks_sum * i then
    error(("FAIL: rank %d: element %d is %g, the ranks' sum is %g"):format(rank, i, x[i], ranks_sum * i))
  end
end
print(("rank %d of %d: allreduce ok, conflux %s from %s"):format(rank, size, cfx._VERSION, where))
cfx.shutdown()
