-- elastic_trainer.lua - an elastic trainer over Conflux (Lua 5.4): it goes on when a worker is lost.
--
-- Logistic regression with SGD over EPOCHS x BATCHES global batches of ROWS rows each, generated
-- from (epoch, batch) seeds (splitmix64, so Java's example and the test's reference draw the same
-- numbers). Each rank takes the rows i with i % size == rank and adds its share of the batch's mean
-- gradient; one allreduce "sum" gives the full mean. So the weights depend only on which batches
-- were applied, never on the world's size.
--
-- The state (epoch, next batch, weights) is committed in memory every COMMIT_EVERY batches. When a
-- collective fails because the world changed (a peer lost: cfx.world_changed(e)), every survivor
-- rolls back to its last commit, forms the world again (cfx.reform), and syncs: the newest commit
-- among the members (an allreduce "max" of the commit counts) is broadcast from the lowest rank
-- holding it, so a newcomer never overwrites the survivors. Training then goes on. Newcomers (a
-- host the driver's discovery script added) are let in at a commit: when any rank sees one waiting
-- (cfx.membership_pending, agreed by an allreduce "max"), all re-form together and sync, the
-- newcomer receiving the state.
--
--   LUA_PATH_5_4="build/lua/?.lua;;" LUA_CPATH_5_4="build/lua/?.so;;" \
--     cfxrun --elastic -np 3 --min-np 2 -H localhost:2,127.0.0.1:1 lua5.4 examples/lua/elastic_trainer.lua
--
-- Knobs (environment): ELASTIC_KILL="rank:epoch:batch": that rank of the first world SIGKILLs
-- itself at the start of that batch (writing the time to $ELASTIC_OUT.lost first);
-- ELASTIC_GROW="hosts-file:line": in the first world rank 0 appends `line` to the discovery
-- script's hosts file at epoch 1, batch 0, and at the commit after batch 1 the ranks wait (up to
-- 120 s, agreeing every 0.2 s) for the newcomer the driver starts there; ELASTIC_OUT:
-- each rank that finishes writes its result to $ELASTIC_OUT.<member id> (size, round, the time it
-- trained again after the last loss, the weights). Exits 1 when the job cannot go on (fewer than
-- the minimum) or the ranks' final weights differ.

local cfx = require "conflux"

local EPOCHS, BATCHES, ROWS, DIM, LR, COMMIT_EVERY = 3, 8, 12, 4, 0.5, 2
-- The rule behind the labels: y = 1 when x . TRUE_W + NOISE * e > 0 (e uniform in -1..1).
local TRUE_W, NOISE = { 1, -2, 3, -4 }, 0.5

-- splitmix64 (Lua's integers wrap and >> is a logical shift, as Java's >>>): a uniform double in
-- [0, 1) with 53 random bits, exact in every language.
local function rng(seed)
  local s = seed
  return function()
    s = s + 0x9E3779B97F4A7C15
    local z = s
    z = (z ~ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ~ (z >> 27)) * 0x94D049BB133111EB
    z = z ~ (z >> 31)
    return (z >> 11) * 0x1p-53
  end
end

-- Global batch (epoch, b): ROWS rows of DIM features, their labels.
local function batch(epoch, b)
  local u = rng(1000 * epoch + b)
  local x, y = {}, {}
  for i = 1, ROWS do
    local row, z = {}, 0.0
    for j = 1, DIM do
      row[j] = 2 * u() - 1
      z = z + row[j] * TRUE_W[j]
    end
    z = z + NOISE * (2 * u() - 1)
    x[i], y[i] = row, z > 0 and 1.0 or 0.0
  end
  return x, y
end

-- The state: epoch, the next batch, how many commits led here (the newest state has the most), and
-- the weights (then the bias) as one float64 array.
local function new_state()
  return { epoch = 0, batch = 0, commits = 0, w = cfx.array("float64", DIM + 1) }
end

local function copy(s)
  return { epoch = s.epoch, batch = s.batch, commits = s.commits, w = s.w:copy() }
end

local kill = {}
for v in (os.getenv("ELASTIC_KILL") or ""):gmatch("[^:]+") do kill[#kill + 1] = math.tointeger(tonumber(v)) end
local out = os.getenv("ELASTIC_OUT")
local grow_file, grow_line = (os.getenv("ELASTIC_GROW") or ""):match("^([^:]+):(.+)$")

-- The test's failure: ELASTIC_KILL's rank SIGKILLs itself at its batch, in the first world only.
local function maybe_die(epoch, b)
  if #kill ~= 3 or cfx.membership_round() ~= 1 or cfx.rank() ~= kill[1] or epoch ~= kill[2] or b ~= kill[3] then
    return
  end
  if out then
    local f = assert(io.open(out .. ".lost", "w"))
    f:write(("%d"):format(math.floor(cfx.clock() * 1000)))
    f:close()
  end
  io.stderr:write(("member %d: killing myself (SIGKILL) at epoch %d batch %d\n"):format(cfx.member_id(), epoch, b))
  os.execute("kill -KILL $PPID")  -- the shell's parent: this Lua process
  os.execute("sleep 60")          -- the signal ends the process before this does
end

-- The test's new host: ELASTIC_GROW's line goes into the hosts file, once, from rank 0.
local function maybe_add_host(epoch, b)
  if grow_file and cfx.membership_round() == 1 and cfx.rank() == 0 and epoch == 1 and b == 0 then
    local f = assert(io.open(grow_file, "a"))
    f:write(grow_line, "\n")
    f:close()
  end
end

-- Whether newcomers wait to join: what any rank saw, so all ranks decide alike. With the
-- ELASTIC_GROW knob the ranks wait for theirs at the commit after epoch 1, batch 1.
local function newcomers_waiting(live)
  local pace = grow_file and cfx.membership_round() == 1 and live.epoch == 1 and live.batch == 2
  local deadline = cfx.clock() + 120
  while true do
    local seen = cfx.allreduce({ cfx.membership_pending() }, { op = "max", dtype = "int32", name = "commit.newcomers" })[1]
    if seen > 0 or not pace or cfx.clock() > deadline then return seen > 0 end
    os.execute("sleep 0.2")
  end
end

-- Every member takes the newest commit among them, from the lowest rank that holds it.
local function sync(live)
  local newest = cfx.allreduce({ live.commits }, { op = "max", dtype = "int64", name = "sync.commits" })[1]
  local mine = live.commits == newest and cfx.rank() or cfx.size()
  local root = cfx.allreduce({ mine }, { op = "min", dtype = "int32", name = "sync.root" })[1]
  local packed = cfx.array("float64", DIM + 4)
  packed[1], packed[2], packed[3] = live.epoch, live.batch, live.commits
  for j = 1, DIM + 1 do packed[3 + j] = live.w[j] end
  cfx.broadcast(packed, root, { name = "sync.state" })
  live.epoch, live.batch = math.tointeger(packed[1]), math.tointeger(packed[2])
  live.commits = math.tointeger(packed[3])
  for j = 1, DIM + 1 do live.w[j] = packed[3 + j] end
end

-- Runs the remaining batches; commits into `committed` (a table the caller holds) every COMMIT_EVERY.
local function train(live, committed)
  local g = cfx.array("float64", DIM + 1)
  while live.epoch < EPOCHS do
    while live.batch < BATCHES do
      maybe_die(live.epoch, live.batch)
      maybe_add_host(live.epoch, live.batch)
      local x, y = batch(live.epoch, live.batch)
      local w = live.w
      g:fill(0)
      for i = cfx.rank() + 1, ROWS, cfx.size() do
        local row, z = x[i], w[DIM + 1]
        for j = 1, DIM do z = z + w[j] * row[j] end
        local err = 1.0 / (1.0 + math.exp(-z)) - y[i]
        for j = 1, DIM do g[j] = g[j] + err * row[j] / ROWS end
        g[DIM + 1] = g[DIM + 1] + err / ROWS
      end
      cfx.allreduce(g, { op = "sum", name = "grad" })
      for j = 1, DIM + 1 do w[j] = w[j] - LR * g[j] end
      live.batch = live.batch + 1
      if live.batch % COMMIT_EVERY == 0 then
        live.commits = live.commits + 1
        committed.state = copy(live)  -- (epoch, BATCHES) restores to the next epoch's start
        if newcomers_waiting(live) then
          cfx.reform()  -- every rank together: the newcomers join this round
          io.stderr:write(("member %d: newcomers let in: round %d, rank %d of %d\n"):format(cfx.member_id(),
            cfx.membership_round(), cfx.rank(), cfx.size()))
          sync(live)  -- they get the state just committed
        end
      end
    end
    live.epoch, live.batch = live.epoch + 1, 0
  end
end

cfx.elastic_init()  -- min/max size and deadlines from cfxrun --elastic
local live = new_state()
local committed = { state = copy(live) }
local resumed_at = 0
while true do
  local ok, e = pcall(function()
    sync(live)
    committed.state = copy(live)
    train(live, committed)
  end)
  if ok then break end
  if not cfx.world_changed(e) then error(e, 0) end
  -- Roll back to the last commit and form the world again; below the minimum cfx.reform raises a
  -- "membership_changed" error naming who is missing, and the job ends.
  io.stderr:write(("member %d: %s; back to epoch %d batch %d\n"):format(cfx.member_id(), tostring(e),
    committed.state.epoch, committed.state.batch))
  live = copy(committed.state)
  cfx.reform()
  resumed_at = math.floor(cfx.clock() * 1000)
  io.stderr:write(("member %d: round %d, rank %d of %d\n"):format(cfx.member_id(), cfx.membership_round(),
    cfx.rank(), cfx.size()))
end

-- Every rank must hold the same weights; each writes its result for the test.
local lo, hi = live.w:copy(), live.w:copy()
cfx.allreduce(lo, { op = "min", name = "final.min" })
cfx.allreduce(hi, { op = "max", name = "final.max" })
local same = lo:tobytes() == live.w:tobytes() and hi:tobytes() == live.w:tobytes()
if out then
  local f = assert(io.open(out .. "." .. cfx.member_id(), "w"))
  f:write(("size %d\nround %d\nresumed %d\nweights"):format(cfx.size(), cfx.membership_round(), resumed_at))
  for j = 1, DIM + 1 do f:write((" %.17g"):format(live.w[j])) end
  f:write("\n")
  f:close()
end
if cfx.rank() == 0 then
  print(("trained %d epochs on %d ranks (round %d); weights %s"):format(EPOCHS, cfx.size(),
    cfx.membership_round(), same and "identical on every rank" or "DIFFER between ranks"))
end
cfx.shutdown()
os.exit(same and 0 or 1)
