-- logistic_regression.lua - a small data-parallel trainer over Conflux (Lua 5.4).
--
-- Every rank generates its own shard of a synthetic binary classification problem (fixed seeds),
-- computes the full-batch gradient of the logistic loss on it, and averages gradient and loss across
-- ranks with one allreduce per step (a float32 typed array, zero-copy); rank 0 prints the loss. At
-- the end every rank must hold bit-identical weights: allreduce "min" and "max" of the weights must
-- equal the local weights byte for byte. Exits 1 if the loss did not fall or the weights differ.
--
--   LUA_PATH_5_4="build/lua/?.lua;;" LUA_CPATH_5_4="build/lua/?.so;;" \
--     cfxrun -np 3 lua5.4 examples/lua/logistic_regression.lua [steps]

local cfx = require "conflux"

local DIM, SAMPLES = 16, 2000
local steps = tonumber(arg and arg[1]) or 60

-- A small deterministic generator (xorshift64*), identical on every platform and rank.
local function rng(seed)
  local s = seed ~ 0x9E3779B97F4A7C15
  local function u01()
    s = s ~ (s >> 12); s = s ~ (s << 25); s = s ~ (s >> 27)
    return ((s * 0x2545F4914F6CDD1D) >> 11) / 9007199254740992.0
  end
  local function gauss()
    local u, v = u01(), u01()
    return math.sqrt(-2 * math.log(u + 1e-300)) * math.cos(2 * math.pi * v)
  end
  return u01, gauss
end

local function sigmoid(z) return 1 / (1 + math.exp(-z)) end

cfx.init()
local rank, size = cfx.rank(), cfx.size()

-- the true model (same on every rank), then this rank's shard
local _, tgauss = rng(42)
local w_true = {}
for j = 1, DIM + 1 do w_true[j] = tgauss() end
local u01, gauss = rng(1000 + rank)
local x, y = {}, {}
for n = 1, SAMPLES do
  local row, z = {}, w_true[DIM + 1]
  for j = 1, DIM do row[j] = gauss(); z = z + w_true[j] * row[j] end
  x[n] = row
  y[n] = u01() < sigmoid(z) and 1 or 0
end

local w = cfx.array("float32", DIM + 1)   -- weights + bias, zero on every rank
local g = cfx.array("float32", DIM + 2)   -- gradient + loss: one allreduce per step
local lr = 0.5
local first, last
for step = 0, steps - 1 do
  local acc, loss = {}, 0
  for j = 1, DIM + 1 do acc[j] = 0 end
  for n = 1, SAMPLES do
    local row, z = x[n], w[DIM + 1]
    for j = 1, DIM do z = z + w[j] * row[j] end
    local p = sigmoid(z)
    loss = loss - (y[n] == 1 and math.log(p + 1e-12) or math.log(1 - p + 1e-12))
    local err = p - y[n]
    for j = 1, DIM do acc[j] = acc[j] + err * row[j] end
    acc[DIM + 1] = acc[DIM + 1] + err
  end
  for j = 1, DIM + 1 do g[j] = acc[j] / SAMPLES end
  g[DIM + 2] = loss / SAMPLES
  cfx.allreduce(g, { op = "average", name = "grad" })
  for j = 1, DIM + 1 do w[j] = w[j] - lr * g[j] end
  first = first or g[DIM + 2]
  last = g[DIM + 2]
  if rank == 0 and (step % 10 == 0 or step == steps - 1) then
    print(("step %3d  loss %.6f"):format(step, g[DIM + 2]))
  end
end

local lo, hi = w:copy(), w:copy()
cfx.allreduce(lo, { op = "min", name = "weights.min" })
cfx.allreduce(hi, { op = "max", name = "weights.max" })
local same = lo:tobytes() == w:tobytes() and hi:tobytes() == w:tobytes()
local ok = cfx.allreduce({ same and 1 or 0 }, { op = "min", dtype = "int32", name = "weights.same" })[1] == 1
local falling = last < first * 0.9
if rank == 0 then
  print(("loss %.6f -> %.6f (%s); weights %s on all %d ranks"):format(first, last,
    falling and "falling" or "NOT falling", ok and "bit-identical" or "DIFFER", size))
end
if not same then io.stderr:write(("rank %d: weights differ from another rank's\n"):format(rank)) end
cfx.shutdown()
os.exit(falling and ok and 0 or 1)
