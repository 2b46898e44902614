-- mlp_gradient_set.lua - a small data-parallel MLP trainer whose optimizer step goes through
-- cfx.gradient_set (Lua 5.4).
--
-- Every rank generates its own shard of a synthetic problem that no linear model solves (is a point
-- inside a circle?), runs a 2-8-1 tanh/sigmoid network forward and backward on it, writes each
-- layer's gradients straight into the set's arrays as backward produces them (output layer first)
-- and marks them ready; gs:wait() leaves the average over ranks in those arrays, and every rank
-- takes the same SGD step. The first step's averages are checked against an allreduce "average" of
-- copies of this rank's gradients. At the end every rank must hold bit-identical weights (allreduce
-- "min" and "max" equal the local weights byte for byte), the global loss must have fallen to under
-- half its start and the global accuracy must exceed 90%. Exits 1 otherwise.
--
--   LUA_PATH_5_4="build/lua/?.lua;;" LUA_CPATH_5_4="build/lua/?.so;;" \
--     cfxrun -np 3 lua5.4 examples/lua/mlp_gradient_set.lua [steps]

local cfx = require "conflux"

local IN, HIDDEN, SAMPLES = 2, 8, 500
local steps = tonumber(arg and arg[1]) or 400
-- parameters in registration order (the order of the forward pass): name, shape
local PARAMS = { { "fc1.weight", { HIDDEN, IN } }, { "fc1.bias", { HIDDEN } },
                 { "fc2.weight", { 1, HIDDEN } }, { "fc2.bias", { 1 } } }

-- Lua 5.4's math.random (xoshiro256**) gives the same numbers for the same seed on every rank
local function gauss()
  return math.sqrt(-2 * math.log(math.random() + 1e-300)) * math.cos(2 * math.pi * math.random())
end

cfx.init()
local rank, size = cfx.rank(), cfx.size()

-- this rank's shard: points in [-1, 1]^2, label 1 inside the circle of area 1/2
math.randomseed(1000 + rank)
local x, y = {}, {}
for n = 1, SAMPLES do
  local a, b = 2 * math.random() - 1, 2 * math.random() - 1
  x[n] = { a, b }
  y[n] = a * a + b * b < 2 / math.pi and 1 or 0
end

-- the parameters (float32 arrays): the same initial values on every rank (one seed)
math.randomseed(7)
local p = {}
for k, param in ipairs(PARAMS) do
  local n = 1
  for _, d in ipairs(param[2]) do n = n * d end
  p[k] = cfx.array("float32", n)
  if k % 2 == 1 then  -- weights; biases start at zero
    for i = 1, n do p[k][i] = gauss() * (k == 1 and 1 or 0.5) end
  end
end

local gs <close> = cfx.gradient_set { name = "mlp", op = "average" }
local index = {}
for k, param in ipairs(PARAMS) do index[k] = gs:add(param[1], param[2], "float32") end
gs:commit()  -- collective: every rank registered the same names, dtypes and shapes
local grad = {}
for k = 1, #PARAMS do grad[k] = gs:array(index[k]) end

-- marks gradient k ready; with `keep`, a copy of it goes there first (once ready, the array may
-- be reduced in place at any moment)
local function ready(k, keep)
  if keep then keep[k] = grad[k]:copy() end
  gs:ready(index[k])
end

-- forward and backward over this rank's shard (mean binary cross-entropy), output layer first;
-- returns this rank's mean loss
local function backward(keep)
  local w1, b1, w2, b2 = p[1]:totable(), p[2]:totable(), p[3]:totable(), p[4]:totable()  -- plain tables: faster
  local h, delta, loss = {}, {}, 0
  for n = 1, SAMPLES do
    local xn, hn, z = x[n], {}, b2[1]
    for j = 1, HIDDEN do
      local a = w1[(j - 1) * IN + 1] * xn[1] + w1[(j - 1) * IN + 2] * xn[2] + b1[j]
      local e = math.exp(2 * a)
      hn[j] = (e - 1) / (e + 1)
      z = z + w2[j] * hn[j]
    end
    local out = 1 / (1 + math.exp(-z))
    loss = loss - (y[n] == 1 and math.log(out + 1e-12) or math.log(1 - out + 1e-12))
    h[n], delta[n] = hn, (out - y[n]) / SAMPLES
  end
  -- output layer: its gradients are complete first
  local gb2 = 0
  for j = 1, HIDDEN do
    local g = 0
    for n = 1, SAMPLES do g = g + delta[n] * h[n][j] end
    grad[3][j] = g
  end
  for n = 1, SAMPLES do gb2 = gb2 + delta[n] end
  grad[4][1] = gb2
  ready(4, keep)
  ready(3, keep)
  -- hidden layer
  for j = 1, HIDDEN do
    local gw1, gw2, gb, w2j = 0, 0, 0, w2[j]
    for n = 1, SAMPLES do
      local hj = h[n][j]
      local d = delta[n] * w2j * (1 - hj * hj)
      gw1, gw2, gb = gw1 + d * x[n][1], gw2 + d * x[n][2], gb + d
    end
    grad[1][(j - 1) * IN + 1], grad[1][(j - 1) * IN + 2], grad[2][j] = gw1, gw2, gb
  end
  ready(2, keep)
  ready(1, keep)
  return loss / SAMPLES
end

local function accuracy()
  local right = 0
  for n = 1, SAMPLES do
    local z = p[4][1]
    for j = 1, HIDDEN do
      local a = p[1][(j - 1) * IN + 1] * x[n][1] + p[1][(j - 1) * IN + 2] * x[n][2] + p[2][j]
      local e = math.exp(2 * a)
      z = z + p[3][j] * (e - 1) / (e + 1)
    end
    if (z > 0) == (y[n] == 1) then right = right + 1 end
  end
  return right / SAMPLES
end

local function average(name, v)
  return cfx.allreduce({ v }, { op = "average", name = name })[1]
end

-- the set's averages equal an allreduce "average" of every rank's own gradients (to rounding)
local function matches_allreduce(mine)
  for k = 1, #PARAMS do
    local want = cfx.allreduce(mine[k], { op = "average", name = "check." .. PARAMS[k][1] })
    for i = 1, #want do
      if math.abs(grad[k][i] - want[i]) > 1e-6 * (1 + math.abs(want[i])) then
        io.stderr:write(("rank %d: %s[%d] is %.9g after wait, the allreduce gives %.9g\n"):format(
          rank, PARAMS[k][1], i, grad[k][i], want[i]))
        return false
      end
    end
  end
  return true
end

local ok, lr, first, last = true, 1.0, nil, nil
for step = 0, steps - 1 do
  local mine = step == 0 and {} or nil
  local loss = backward(mine)
  gs:wait()  -- grad[k] now holds the average over ranks
  if mine and not matches_allreduce(mine) then ok = false end
  for k = 1, #PARAMS do
    local pk, gk = p[k], grad[k]
    for i = 1, #pk do pk[i] = pk[i] - lr * gk[i] end
  end
  if step == 0 or step == steps - 1 or step % 50 == 0 then
    local global = average("loss", loss)
    first, last = first or global, global
    if rank == 0 then print(("step %3d  loss %.6f"):format(step, global)) end
  end
end

local acc = average("accuracy", accuracy())
local same = true
for k = 1, #PARAMS do
  local lo = cfx.allreduce(p[k]:copy(), { op = "min", name = "min." .. PARAMS[k][1] })
  local hi = cfx.allreduce(p[k]:copy(), { op = "max", name = "max." .. PARAMS[k][1] })
  same = same and lo:tobytes() == p[k]:tobytes() and hi:tobytes() == p[k]:tobytes()
end
same = cfx.allreduce({ same and 1 or 0 }, { op = "min", dtype = "int32", name = "weights.same" })[1] == 1
local falling, accurate = last < 0.5 * first, acc > 0.9
if rank == 0 then
  print(("loss %.6f -> %.6f (%s), accuracy %.3f (%s); weights %s on all %d ranks"):format(first, last,
    falling and "falling" or "NOT falling", acc, accurate and "ok" or "NOT over 0.9",
    same and "bit-identical" or "DIFFER", size))
end
gs:free()
cfx.shutdown()
os.exit(ok and falling and accurate and same and 0 or 1)
