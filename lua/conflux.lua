--- conflux: data-parallel collectives for Lua 5.4 over the Conflux C ABI.
--
--   local cfx = require "conflux"
--   cfx.init()
--   local g = cfx.array("float32", n)          -- typed array: zero-copy, 1-based, #g
--   cfx.allreduce(g, { op = "average", name = "grad" })
--   local t = cfx.allreduce({ 1, 2, 3 }, "sum") -- tables work too (copied in and out)
--   local s = cfx.shared_array("float32", n)   -- in shared tensor memory: reduced without copies
--   cfx.shutdown()
--
-- Every collective has a blocking form (`allreduce`) and an async form (`allreduce_async`) that
-- returns a handle with :poll(), :wait([timeout_s]), :result(), :splits(), :release().
-- allreduce and broadcast work in place and return their data; allgather, alltoall and
-- reducescatter return new data of the same kind (table in, table out; array in, array out).
--
-- Failures raise a conflux error: a table with `kind` ("mismatch", "stall", "shut_down", ...),
-- `status` (the C code) and `message` (the C message, which names the tensor); tostring() gives
-- "conflux: <kind>: <message>". cfx.is_error(e) tells it apart from other errors.
--
-- Thread model: the background thread never touches the Lua state; completion is observed by
-- poll/wait on the Lua thread. See docs/lua.md.

local core = require "conflux_core"

local M = {}

M._VERSION = core.cfx_version_string()

-- ---- errors -------------------------------------------------------------------------------------

-- The error kinds are the C library's status names in lower case (cfx_status_name: "MISMATCH" ->
-- "mismatch"), read from it once at load, so a status added there has its kind here.
local KIND = {}
M.kinds = {}
do
  local code = 1
  local name = core.cfx_status_name(code)
  while name ~= nil do
    KIND[code] = name:lower()
    M.kinds[KIND[code]] = code
    code = code + 1
    name = core.cfx_status_name(code)
  end
end

local Error = {}
Error.__index = Error
Error.__name = "conflux.error"
Error.__tostring = function(e) return "conflux: " .. e.kind .. ": " .. e.message end
M.Error = Error

local function new_error(status, message)
  return setmetatable({ kind = KIND[status] or "unknown", status = status,
                        message = message or core.cfx_status_string(status) }, Error)
end

local function raise(status, message, level)
  error(new_error(status, message), (level or 1) + 1)
end

local function argerror(message, level)
  raise(1, message, (level or 1) + 1)
end

--- True when `e` is an error raised by conflux.
function M.is_error(e)
  return getmetatable(e) == Error
end

-- ---- enums --------------------------------------------------------------------------------------

local DTYPE = {}
for code = 0, 10 do DTYPE[core.cfx_dtype_name(code)] = code end
local function C(name) return math.tointeger(core[name]) end
local OP = { sum = C "CFX_OP_SUM", average = C "CFX_OP_AVERAGE", min = C "CFX_OP_MIN",
             max = C "CFX_OP_MAX", product = C "CFX_OP_PRODUCT", adasum = C "CFX_OP_ADASUM" }
local COMPRESSION = core.compression_names()  -- name -> code, the names every binding accepts
local TRANSPORT = { auto = C "CFX_TRANSPORT_AUTO", mpi = C "CFX_TRANSPORT_MPI",
                    ["local"] = C "CFX_TRANSPORT_LOCAL" }
local ERR_TIMEOUT = C "CFX_ERR_TIMEOUT"
local ERR_OUT_OF_MEMORY = C "CFX_ERR_OUT_OF_MEMORY"
M.compressions = {}  -- the names in code order: "none", "fp16", ...
for name, code in pairs(COMPRESSION) do M.compressions[code + 1] = name end
M.dtypes = {}
for name in pairs(DTYPE) do M.dtypes[#M.dtypes + 1] = name end
table.sort(M.dtypes)

local function dtype_code(name, level)
  local c = DTYPE[name]
  if not c then argerror("unknown dtype " .. tostring(name), level + 1) end
  return c
end

-- The default op is "average" for allreduce and reducescatter, as in every binding (docs/bindings.md).
local DEFAULT_OP = "average"

local function op_code(name, level)
  local c = OP[name or DEFAULT_OP]
  if not c then argerror("unknown reduction op " .. tostring(name), level + 1) end
  return c
end

-- A compression by name ("fp16", case-insensitive) or by its code (cfx.compressions[name]).
local function compression_code(z, level)
  if z == nil then return COMPRESSION.none end
  local c = type(z) == "string" and COMPRESSION[z:lower()] or nil
  if math.type(z) == "integer" and z >= 0 and z < #M.compressions then c = z end
  if not c then
    argerror("unknown compression " .. tostring(z) .. "; use one of: " .. table.concat(M.compressions, ", "), level + 1)
  end
  return c
end

-- ---- typed arrays -------------------------------------------------------------------------------

--- cfx.array(dtype, n) -> a zeroed typed array of n elements; cfx.array(dtype, table) -> a copy of
-- the table's elements 1..#t. Elements are owned by the array; collectives use them in place.
function M.array(dtype, n_or_table)
  local a, st, msg = core.array_new(dtype_code(dtype, 2), n_or_table)
  if not a then raise(st, msg, 2) end
  return a
end

M.is_array = core.is_array

--- cfx.shared_array(dtype, n | table): like cfx.array, with the elements in shared tensor memory,
-- which the other ranks on this host map: a CPU allreduce whose data lies in it on every local
-- rank is reduced straight from every rank's array, without the copies through the engine's
-- shared-memory slots (results are the same either way; ranks may mix). Not tied to a context: it
-- may be made before cfx.init() and outlive cfx.shutdown(). Freed by the GC, or at once by
-- cfx.free_shared(a). a:copy() and the results of allgather etc. are private arrays.
function M.shared_array(dtype, n_or_table)
  local code = dtype_code(dtype, 2)
  local a, st, msg = core.shared_array_new(code, n_or_table)
  if not a and st == ERR_OUT_OF_MEMORY then
    -- the GC does not see the pool, so arrays nobody references may be what fills it; a full
    -- collection runs their __gc before it returns
    collectgarbage()
    a, st, msg = core.shared_array_new(code, n_or_table)
  end
  if not a then raise(st, msg, 2) end
  return a
end

--- True for an array from cfx.shared_array that was not freed.
function M.is_shared(a)
  return core.array_state(a) == "shared"
end

-- ---- context ------------------------------------------------------------------------------------

local ctx = nil        -- the SWIG context pointer while initialized
local pending = {}     -- handle -> true: keeps data reachable until completion is observed
local detached = {}    -- handles released while pending: reaped once complete
local leaked = {}      -- handles the engine never completed at shutdown (see M.shutdown)

local function context(level)
  if not ctx then raise(2, "conflux is not initialized: call conflux.init() first", level + 1) end
  return ctx
end

--- cfx.init([opts]) joins the job (collective across ranks). opts: transport ("auto", "mpi",
-- "local"), fusion_threshold_bytes, cycle_time_ms, cache_capacity, log_level, deterministic
-- (boolean), stall_warning_s, stall_timeout_s, chunk_bytes. Unset fields come from CFX_* variables.
-- SWIG hands C ints to Lua as floats; ranks and sizes are integers.
local function int(x) return math.tointeger(x) or x end

-- The init options as C sets them by name (bindings/bind.h), the transport as its code.
local function init_options(opts, level)
  if ctx then raise(1, "conflux is already initialized", level + 1) end
  if opts ~= nil and type(opts) ~= "table" then argerror("init options must be a table", level + 1) end
  local byname = {}
  for k, v in pairs(opts or {}) do byname[k] = v end
  if byname.transport ~= nil then
    byname.transport = TRANSPORT[opts.transport]
    if not byname.transport then argerror("unknown transport " .. tostring(opts.transport), level + 1) end
  end
  return byname
end

function M.init(opts)
  local c, st, msg = core.init(init_options(opts, 2))
  if not c then raise(st, msg, 2) end
  ctx = c
  return M
end

-- ---- elastic worlds (docs/elastic.md) ------------------------------------------------------------

local function reform_options(opts, level)
  if opts ~= nil and type(opts) ~= "table" then argerror("reform options must be a table", level + 1) end
  return opts
end

--- cfx.elastic_init([reform_opts [, init_opts]]) joins an elastic job (cfxrun --elastic;
-- cfx_elastic_init): the first membership round not yet decided, so a process started late joins
-- the running job at its next round. reform_opts: min_size, max_size (0: no limit), timeout_s
-- (the round's deadline), settle_s; unset ones come from the CFX_ELASTIC_* variables cfxrun
-- --elastic gives its workers. init_opts as for cfx.init. Returns the module, as cfx.init does.
function M.elastic_init(ropts, opts)
  local byname = init_options(opts, 2)
  local c, st, msg = core.elastic_init(reform_options(ropts, 2), byname)
  if not c then raise(st, msg, 2) end
  ctx = c
  return M
end

--- cfx.reform([reform_opts]) (also ctx:reform{...} on the module init returned) forms the elastic
-- world again, in place (cfx_context_reform): on every surviving rank after a collective failed
-- with an error for which cfx.world_changed(e) is true, or on every rank together to let
-- newcomers in (cfx.membership_pending()). Pending collectives of the old world fail first (kind
-- "membership_changed", or the "peer_lost" that ended it); cfx.rank() and cfx.size() give the new
-- world's afterwards. Gradient sets of the old world are left detached: free them and make them
-- again. Raises "membership_changed" naming the members missing when fewer than min_size came by
-- the deadline: the job cannot go on here.
function M.reform(self_or_opts, opts)
  if self_or_opts ~= M then opts = self_or_opts end
  local c = context(2)
  local ok, st, msg = core.reform(c, reform_options(opts, 2))
  if not ok then raise(st, msg, 2) end
  return M
end

local WORLD_CHANGED = { peer_lost = true, transport = true, shut_down = true, membership_changed = true }

--- True when `e` is a conflux error saying the world this rank was in is gone (kinds peer_lost,
-- transport, shut_down, membership_changed): in an elastic job the survivors cfx.reform() and
-- go on.
function M.world_changed(e)
  return M.is_error(e) and WORLD_CHANGED[e.kind] == true
end

local function elastic_query(fn, level)
  local v = int(core[fn](context(level + 1)))
  if v < 0 then raise(C "CFX_ERR_UNSUPPORTED", core.cfx_last_error(), level + 1) end
  return v
end

--- The membership round this world was formed in (1 for the first world).
function M.membership_round() return elastic_query("cfx_membership_round", 2) end

--- This process's member id in the elastic job (CFX_ELASTIC_ID): it keeps it across rounds.
function M.member_id() return elastic_query("cfx_member_id", 2) end

--- How many newcomers wait to join the next round: a local look at the store, so ranks may see
-- different counts; agree with a collective (an allreduce "max") before reforming together.
function M.membership_pending()
  local n, st, msg = core.membership_pending(context(2))
  if not n then raise(st, msg, 2) end
  return n
end


function M.is_initialized() return ctx ~= nil end
function M.is_running() return ctx ~= nil and int(core.cfx_is_running(ctx)) == 1 end
function M.rank() return int(core.cfx_rank(context(2))) end
function M.size() return int(core.cfx_size(context(2))) end
function M.local_rank() return int(core.cfx_local_rank(context(2))) end
function M.local_size() return int(core.cfx_local_size(context(2))) end
function M.cross_rank() return int(core.cfx_cross_rank(context(2))) end
function M.cross_size() return int(core.cfx_cross_size(context(2))) end

--- "1.4.0"
function M.version() return core.cfx_version_string() end
--- MAJOR * 10000 + MINOR * 100 + PATCH
function M.version_number() return int(core.cfx_version()) end

--- { mpi = true, cuda = false, nccl = false, cuda_device = false, ["local"] = true, bits = n }
function M.features()
  local bits = int(core.cfx_features())
  return {
    mpi = bits & core.CFX_FEATURE_MPI ~= 0, cuda = bits & core.CFX_FEATURE_CUDA ~= 0,
    nccl = bits & core.CFX_FEATURE_NCCL ~= 0, cuda_device = bits & core.CFX_FEATURE_CUDA_DEVICE ~= 0,
    ["local"] = bits & core.CFX_FEATURE_LOCAL ~= 0, bits = bits,
  }
end

-- ---- handles ------------------------------------------------------------------------------------

local Handle = {}
Handle.__index = Handle
Handle.__name = "conflux.handle"

-- The outcome of a completed collective: result, splits (or nil, error object). Releases the C handle.
local function collect(kind, c, id, status, message, array, tbl)
  local result, splits, err = nil, nil, nil
  if status ~= 0 then
    err = new_error(status, message)
  elseif kind == "allreduce" or kind == "broadcast" then
    if tbl then array:totable(tbl) end
    result = tbl or array
  elseif kind == "allgather" or kind == "alltoall" or kind == "reducescatter" then
    local out, st, msg = core.output(c, id, 0)
    if not out then
      err = new_error(st, msg)
    else
      result = tbl and out:totable() or out
      if kind ~= "reducescatter" then
        splits, st, msg = core.splits(c, id, 0)
        if not splits then err = new_error(st, msg) end
      end
    end
  elseif kind == "join" then
    local st, msg
    result, st, msg = core.join_rank(c, id)
    if not result then err = new_error(st, msg) end
  else
    result = true
  end
  core.release(c, id)
  if err then return nil, err end
  return result, splits
end

local function finish(h, status, message)
  local result, extra = collect(h.kind, h._ctx, h._id, status, message, h._array, h._table)
  if result == nil then h._error = extra else h._result, h._splits = result, extra end
  h._done = true
  h._array, h._table = nil, nil
  pending[h] = nil
end

local function outcome(h, level)
  if h._error then
    -- a fresh error object per raise, with the same fields
    local e = h._error
    error(setmetatable({ kind = e.kind, status = e.status, message = e.message }, Error), level + 1)
  end
  return h._result
end

--- True once the collective completed (successfully or not). Never blocks.
function Handle:poll()
  if self._done then return true end
  local done, st, msg = core.poll(self._ctx, self._id)
  if done == nil then
    finish(self, st, msg)
    return true
  end
  if done then
    finish(self, core.wait(self._ctx, self._id, 0))
    return true
  end
  return false
end

--- Waits (at most timeout_s seconds when given) and returns the result. On timeout returns
-- nil, "timeout" and the handle stays pending. Raises the collective's error if it failed.
function Handle:wait(timeout_s)
  if not self._done then
    if timeout_s ~= nil and (type(timeout_s) ~= "number" or timeout_s < 0) then
      argerror("timeout must be a number >= 0", 2)
    end
    local st, msg = core.wait(self._ctx, self._id, timeout_s or -1)
    if st == ERR_TIMEOUT then return nil, "timeout" end
    finish(self, st, msg)
  end
  return outcome(self, 2)
end

--- The result (waiting without limit).
function Handle:result()
  if not self._done then self:wait() end
  return outcome(self, 2)
end

--- Per-rank row counts of an allgather (rows each rank gave) or alltoall (rows received).
function Handle:splits()
  self:result()
  return self._splits
end

--- Detaches a pending handle (the collective still runs; its data stays referenced until it
-- completes). A no-op once complete. Also called by `local h <close> = ...`.
function Handle:release()
  if not self._done and not self._detached then
    self._detached = true
    detached[#detached + 1] = self
  end
end
Handle.__close = Handle.release

function Handle:__tostring()
  return string.format("conflux.handle(%s%s, %s)", self.kind, self.name and (" '" .. self.name .. "'") or "",
                       self._done and (self._error and "failed" or "done") or "pending")
end

local function sweep()
  if #detached == 0 then return end
  local keep = {}
  for _, h in ipairs(detached) do
    if not h:poll() then keep[#keep + 1] = h end
  end
  detached = keep
end

local function new_handle(kind, id, name, array, tbl)
  local h = setmetatable({ kind = kind, name = name, _id = id, _ctx = ctx, _array = array,
                           _table = tbl, _done = false }, Handle)
  pending[h] = true
  return h
end

-- ---- collectives --------------------------------------------------------------------------------

-- opts may be a table, or a string: the op for reductions, the name otherwise.
local function options(opts, string_is, level)
  if opts == nil then return {} end
  if type(opts) == "string" then return { [string_is] = opts } end
  if type(opts) ~= "table" then argerror("options must be a table or a string", level + 1) end
  return opts
end

-- The typed array to run on: `data` itself, or a copy of a table (then also returns the table).
local function operand(data, opts, level)
  local state = core.array_state(data)
  if state == "freed" then argerror("the shared array was freed", level + 1) end
  if state then
    if opts.dtype ~= nil and opts.dtype ~= data:dtype() then
      argerror("the array holds " .. data:dtype() .. ", not " .. tostring(opts.dtype), level + 1)
    end
    return data, nil
  end
  if type(data) ~= "table" then
    argerror("data must be a conflux.array or a table of numbers, got " .. type(data), level + 1)
  end
  local a, st, msg = core.array_new(dtype_code(opts.dtype or "float64", level + 1), data)
  if not a then raise(st, msg, level + 1) end
  return a, data
end

local function check_name(opts, level)
  if opts.name ~= nil and type(opts.name) ~= "string" then argerror("name must be a string", level + 1) end
  return opts.name
end

-- Each collective has a `start` that checks arguments, submits, and returns
-- (kind, id, name, array, table); the async form wraps that in a handle, the blocking form waits on
-- the stack (the data stays referenced by the call itself, so no registration is needed).
local start = {}

-- The blocking allreduce and broadcast run in one C call (core.run: submit, wait, copy a table's
-- result back, release), with no handle and no array made for a table: the per-call path of the
-- small collectives scripts make most. Arguments that are all valid take the inline checks below
-- (a Lua function call costs ~50 ns here, and this path is ~0.2 µs in all); anything else goes the
-- checked way, which raises the error that names what was wrong.
local run = core.run
local NO_COMPRESSION, NO_OPTIONS = COMPRESSION.none, {}

local function checked_run(kind, data, arg, opts)
  local c = context(3)
  local op, pre, post, z = arg, 1.0, 1.0, NO_COMPRESSION
  if kind == 0 then
    opts = options(opts, "op", 3)
    op, z = op_code(opts.op, 3), compression_code(opts.compression, 3)
    pre, post = opts.prescale or 1.0, opts.postscale or 1.0
  else
    if math.type(arg) ~= "integer" then argerror("root must be an integer rank", 3) end
    opts = options(opts, "name", 3)
  end
  local name = check_name(opts, 3)
  local dtype = opts.dtype ~= nil and dtype_code(opts.dtype, 3) or nil
  sweep()
  local ok, st, msg = run(c, kind, name, data, op, pre, post, z, dtype)
  if not ok then raise(st, msg, 3) end
  return data
end

function M.allreduce(data, opts)
  local c, o = ctx, opts
  if o == nil then o = NO_OPTIONS end
  if c and type(o) == "table" and detached[1] == nil then
    local name, dtype = o.name, o.dtype
    local op, z = OP[o.op or DEFAULT_OP], COMPRESSION[o.compression or "none"]
    local code = dtype ~= nil and DTYPE[dtype] or nil
    if op and z and (name == nil or type(name) == "string") and (code or dtype == nil) then
      local ok, st, msg = run(c, 0, name, data, op, o.prescale or 1.0, o.postscale or 1.0, z, code)
      if not ok then raise(st, msg, 2) end
      return data
    end
  end
  return checked_run(0, data, nil, opts)
end

function M.broadcast(data, root, opts)
  return checked_run(1, data, root, opts)
end

function start.allreduce(level, data, opts)
  local c = context(level + 1)
  opts = options(opts, "op", level + 1)
  local name = check_name(opts, level + 1)
  local op = op_code(opts.op, level + 1)
  local z = compression_code(opts.compression, level + 1)
  local a, t = operand(data, opts, level + 1)
  sweep()
  local id, st, msg = core.allreduce(c, name, a, op, opts.prescale or 1.0, opts.postscale or 1.0, z)
  if not id then raise(st, msg, level + 1) end
  return id, name, a, t
end

function start.allgather(level, data, opts)
  local c = context(level + 1)
  opts = options(opts, "name", level + 1)
  local name = check_name(opts, level + 1)
  local a, t = operand(data, opts, level + 1)
  sweep()
  local id, st, msg = core.allgather(c, name, a)
  if not id then raise(st, msg, level + 1) end
  return id, name, a, t
end

function start.broadcast(level, data, root, opts)
  local c = context(level + 1)
  if math.type(root) ~= "integer" then argerror("root must be an integer rank", level + 1) end
  opts = options(opts, "name", level + 1)
  local name = check_name(opts, level + 1)
  local a, t = operand(data, opts, level + 1)
  sweep()
  local id, st, msg = core.broadcast(c, name, a, root)
  if not id then raise(st, msg, level + 1) end
  return id, name, a, t
end

function start.alltoall(level, data, splits, opts)
  local c = context(level + 1)
  if splits ~= nil and type(splits) ~= "table" then argerror("splits must be a table or nil", level + 1) end
  opts = options(opts, "name", level + 1)
  local name = check_name(opts, level + 1)
  local a, t = operand(data, opts, level + 1)
  sweep()
  local id, st, msg = core.alltoall(c, name, a, splits)
  if not id then raise(st, msg, level + 1) end
  return id, name, a, t
end

function start.reducescatter(level, data, opts)
  local c = context(level + 1)
  opts = options(opts, "op", level + 1)
  local name = check_name(opts, level + 1)
  local op = op_code(opts.op, level + 1)
  if opts.compression ~= nil and opts.compression ~= "none" then
    argerror("compression applies to allreduce (and gradient sets), not reducescatter", level + 1)
  end
  local a, t = operand(data, opts, level + 1)
  sweep()
  local id, st, msg = core.reducescatter(c, name, a, op, opts.prescale or 1.0, opts.postscale or 1.0)
  if not id then raise(st, msg, level + 1) end
  return id, name, a, t
end

function start.barrier(level)
  local c = context(level + 1)
  sweep()
  local id, st, msg = core.barrier(c)
  if not id then raise(st, msg, level + 1) end
  return id
end

function start.join(level)
  local c = context(level + 1)
  sweep()
  local id, st, msg = core.join(c)
  if not id then raise(st, msg, level + 1) end
  return id
end

for _, kind in ipairs { "allreduce", "allgather", "broadcast", "alltoall", "reducescatter", "barrier", "join" } do
  local begin = start[kind]
  M[kind .. "_async"] = function(...)
    local id, name, a, t = begin(2, ...)
    return new_handle(kind, id, name, a, t)
  end
  M[kind] = M[kind] or function(...)
    local id, _, a, t = begin(2, ...)
    local c = ctx
    local st, msg = core.wait(c, id, -1)
    local result, extra = collect(kind, c, id, st, msg, a, t)
    if result == nil then
      error(extra, 2)
    end
    return result
  end
end

-- ---- subsets ------------------------------------------------------------------------------------

local Subset = {}
Subset.__index = Subset
Subset.__name = "conflux.subset"
local subsets = setmetatable({}, { __mode = "k" })  -- live subsets: closed before the context goes
M.Subset = Subset

-- Completes every pending handle of context c after its shutdown (they complete at once; one
-- that does not is failed after a bounded wait and its data kept for good), and forgets c's
-- detached handles: nothing may touch c once it is freed.
local function settle(c)
  for h in pairs(pending) do
    if h._ctx == c then
      local st, msg = core.wait(c, h._id, 30)
      if st == ERR_TIMEOUT then
        h._error, h._done = new_error(3, tostring(h) .. " did not complete at shutdown"), true
        pending[h] = nil
        leaked[#leaked + 1] = h  -- keeps its array alive for good
      else
        finish(h, st, msg)
      end
    end
  end
  local keep = {}
  for _, h in ipairs(detached) do
    if h._ctx ~= c then keep[#keep + 1] = h end
  end
  detached = keep
end

--- cfx.subset{ r1, r2, ... } -> a subset of the job's ranks (Horovod's process sets): collective
-- over all ranks, every rank passing the same ranks (any order, no duplicates), in the same order
-- as its other subsets. Members get an object with the module's collectives as methods
-- (s:allreduce(data, opts), s:allgather_async(...), ..., s:barrier(), s:join()) over the members
-- only, with its own negotiation, cache and data path (subsets that overlap run at the same time),
-- s:rank() and s:size() (members numbered in ascending order of their rank), s.ranks, and
-- s:close() (on every member; also `local s <close> = ...`). Other ranks get nil. A bad list
-- (a rank out of range, twice, or lists that differ) raises invalid_argument on every rank.
-- cfx.shutdown() closes every subset first.
function M.subset(ranks)
  local c = context(2)
  if type(ranks) ~= "table" then argerror("cfx.subset takes a table of ranks", 2) end
  local sub, st, msg = core.subset(c, ranks)
  if sub == nil then raise(st, msg, 2) end
  if sub == false then return nil end
  local sorted = {}
  for i, r in ipairs(ranks) do sorted[i] = r end
  table.sort(sorted)
  local self = setmetatable({ _ctx = sub, ranks = sorted }, Subset)
  subsets[self] = true
  return self
end

local function subset_ctx(self, level)
  if not self._ctx then raise(3, "the subset was closed", level + 1) end
  return self._ctx
end

-- Runs a module function with the subset's context as the current one (the Lua state is one
-- thread, and nothing between the swap and the restore yields).
local function within(self, fn, ...)
  local saved = ctx
  ctx = subset_ctx(self, 3)
  local r = table.pack(pcall(fn, ...))
  ctx = saved
  if not r[1] then error(r[2], 0) end
  return table.unpack(r, 2, r.n)
end

for _, kind in ipairs { "allreduce", "allgather", "broadcast", "alltoall", "reducescatter", "barrier", "join" } do
  for _, name in ipairs { kind, kind .. "_async" } do
    local fn = M[name]
    Subset[name] = function(self, ...) return within(self, fn, ...) end
  end
end

function Subset:rank() return int(core.cfx_rank(subset_ctx(self, 2))) end
function Subset:size() return int(core.cfx_size(subset_ctx(self, 2))) end

--- s:close(): shuts the subset down (pending collectives on it fail with kind "shut_down", on the
-- other members too) and frees it. Idempotent.
function Subset:close()
  local c = self._ctx
  if not c then return end
  self._ctx = nil
  subsets[self] = nil
  core.cfx_shutdown(c)
  settle(c)
  core.cfx_context_free(c)
end
Subset.__close = Subset.close

function Subset:__tostring()
  return "conflux.subset{" .. table.concat(self.ranks, ", ") .. "}" .. (self._ctx and "" or " (closed)")
end

--- The blocking forms take the same arguments as the async ones and return the result:
--   allreduce(data [, opts]) with opts { op = "sum"|"average"|"min"|"max"|"product"|"adasum", name = string,
--     prescale = n, postscale = n, dtype = string (tables; default "float64"),
--     compression = "none"|"fp16"|"bf16"|"fp16_everywhere"|"bf16_everywhere" (float32 and float64
--     only; docs/lua.md "Compression") } or opts = an op name; in place: the result is `data`.
--   allgather(data [, opts]) with opts { name =, dtype = } or a name: every rank's data concatenated
--     in rank order (lengths may differ); h:splits() gives each rank's length.
--   broadcast(data, root [, opts]): root's data into `data` on every rank, in place.
--   alltoall(data [, splits [, opts]]): splits[j] elements (in order) go to rank j-1; nil splits
--     divides equally. The result holds what every rank sent here; h:splits() their counts.
--   reducescatter(data [, opts]) (opts as for allreduce): reduces, then returns this rank's block
--     (the first #data % size ranks get one more element).
--   barrier() -> true once every rank reached it; join() -> the rank that joined last.

--- start_timeline(path [, mark_cycles]): writes this rank's timeline (Chrome trace-event JSON of
-- every tensor's phases) to `path` with the rank inserted ("%r" in the path, else ".rank<r>" before
-- the extension); mark_cycles adds the background thread's cycles. Not collective.
function M.start_timeline(path, mark_cycles)
  local c = context(2)
  if type(path) ~= "string" or path == "" then argerror("timeline path must be a non-empty string", 2) end
  local st = int(core.cfx_timeline_start(c, path, mark_cycles and 1 or 0))
  if st ~= 0 then raise(st, core.cfx_last_error(), 2) end
end

--- stop_timeline(): stops the timeline and completes its file; a no-op when none runs.
function M.stop_timeline()
  local st = int(core.cfx_timeline_stop(context(2)))
  if st ~= 0 then raise(st, core.cfx_last_error(), 2) end
end

--- Wall-clock seconds (for timing; os.clock() is CPU time).
M.clock = core.clock

-- ---- shared tensor memory -----------------------------------------------------------------------

--- cfx.free_shared(a): gives the memory of a shared array back now instead of at its collection;
-- the array is unusable afterwards (using it raises). Refused (invalid_argument, nothing freed) for
-- an array that is not shared, already freed, or in flight in a collective: the engine and the
-- other ranks may still read and write it, so wait for its handle first.
function M.free_shared(a)
  local state = core.array_state(a)
  if state == "freed" then argerror("the shared array was already freed", 2) end
  if state ~= "shared" then
    argerror("free_shared takes an array from cfx.shared_array, got " ..
             (state and "a private array (cfx.array)" or type(a)), 2)
  end
  for h in pairs(pending) do
    -- poll() may finish h and clear pending[h]: allowed while traversing
    if h._array == a and not h:poll() then argerror("the shared array is in flight in " .. tostring(h), 2) end
  end
  for _, h in ipairs(leaked) do
    if h._array == a then argerror("the shared array is held by " .. tostring(h) .. " for good", 2) end
  end
  local ok, st, msg = core.shared_array_free(a)
  if not ok then raise(st, msg, 2) end
end

-- ---- shutdown -----------------------------------------------------------------------------------

--- cfx.shutdown() leaves the job (collective): pending handles fail with kind "shut_down", the
-- context is freed, and cfx.init() may be called again. A no-op when not initialized.
-- ---- gradient sets -------------------------------------------------------------------------------

local GradientSet = {}
GradientSet.__index = GradientSet
GradientSet.__name = "conflux.gradient_set"
local gradsets = setmetatable({}, { __mode = "k" })  -- live sets: freed before the context goes

local function gs_native(self, level)
  if not self._set then raise(1, "gradient set '" .. self.name .. "' was freed", level + 1) end
  if not ctx then raise(2, "conflux is not initialized: call conflux.init() first", level + 1) end
  return self._set
end

--- cfx._address([gs]): the C pointer of this context (or of gradient set gs) as an integer, for
-- native code that calls the C ABI on them (bench/lang's loops).
function M._address(gs)
  if gs ~= nil then return core.address(gs_native(gs, 2)) end
  return core.address(context(2))
end

--- cfx.gradient_set{ name = ..., op = "average", bucket_bytes = 0, accumulate_steps = 1,
-- prescale = 1, postscale = 1, owned = true, compression = "none", error_feedback = false }: a set
-- of gradients registered once and reduced together every step (docs/lua.md "Gradient sets").
-- compression as for allreduce; error_feedback (with a compression) carries what the rounding took
-- from this rank's values into the next step's.
function M.gradient_set(opts)
  if type(opts) ~= "table" or type(opts.name) ~= "string" then
    argerror("cfx.gradient_set{ name = ... } needs a name (the same on every rank)", 2)
  end
  local c = context(2)
  local owned = opts.owned
  if owned == nil then owned = true end
  local ef = opts.error_feedback
  if ef ~= nil and type(ef) ~= "boolean" then argerror("error_feedback must be a boolean", 2) end
  local set, st, msg = core.gradset_new(c, opts.name, op_code(opts.op or "average", 2),
                                        opts.bucket_bytes, opts.accumulate_steps, opts.prescale,
                                        opts.postscale, owned,
                                        compression_code(opts.compression, 2), ef)
  if not set then raise(st, msg, 2) end
  local self = setmetatable({ name = opts.name, owned = owned, _set = set, _index = {},
                              _count = 0 }, GradientSet)
  gradsets[self] = true
  return self
end

--- gs:add(name, shape, dtype) (owned) or gs:add(name, array [, shape]) (borrowed) -> index (1-based).
-- shape: an integer or a table of integers; dtype defaults to "float32".
function GradientSet:add(name, shape, dtype)
  local set = gs_native(self, 2)
  if type(name) ~= "string" then argerror("a gradient needs a name", 2) end
  local array = nil
  if core.is_array(shape) then
    array, shape, dtype = shape, dtype or { #shape }, shape:dtype()
  end
  if math.type(shape) == "integer" then shape = { shape } end
  if type(shape) ~= "table" then argerror("add('" .. name .. "') needs a shape", 2) end
  local i, st, msg = core.gradset_add(set, name, dtype_code(dtype or "float32", 2), shape, array)
  if not i then raise(st, "gradient '" .. name .. "': " .. msg, 2) end
  self._index[name] = i
  self._count = math.max(self._count, i)
  return i
end

--- gs:commit(): collective; checks every rank's registration (a "mismatch" error naming the
-- gradient on every rank) and plans the buckets; owned storage starts zeroed.
function GradientSet:commit()
  local ok, st, msg = core.gradset_commit(gs_native(self, 2))
  if not ok then raise(st, msg, 2) end
  self._committed = true
  return self
end

local function gs_index(self, i, level)
  if type(i) == "string" then
    local k = self._index[i]
    if not k then argerror("gradient set '" .. self.name .. "' has no gradient '" .. i .. "'", level + 1) end
    return k
  end
  if math.type(i) ~= "integer" or i < 1 or i > self._count then
    argerror("gradient set '" .. self.name .. "' has " .. self._count .. " gradients; index " ..
             tostring(i) .. " is out of range", level + 1)
  end
  return i
end

--- gs:array(i | name) -> the gradient's cfx.array (owned: a view of the set's storage, after
-- commit; it raises "freed" once the set is freed). Shaped gradients are flat (row-major).
function GradientSet:array(i)
  local set = gs_native(self, 2)
  local a = core.gradset_array(set, gs_index(self, i, 2))
  if not a then raise(1, "gradient set '" .. self.name .. "' is not committed; its storage exists after commit()", 2) end
  return a
end

--- gs:ready(i | name): the gradient was produced for this pass.
function GradientSet:ready(i)
  local set = gs_native(self, 2)
  local ok, st, msg = core.gradset_ready(set, gs_index(self, i, 2))
  if not ok then raise(st, msg, 2) end
end

--- gs:wait([timeout_s]): ends the step; the results are in place. A "timeout" error leaves the
-- step pending (call again).
function GradientSet:wait(timeout_s)
  local st, msg = core.gradset_wait(gs_native(self, 2), timeout_s or -1)
  if st ~= 0 then raise(st, msg, 2) end
end

--- gs:free(): releases the set on this rank (every rank must); its owned arrays become unusable.
function GradientSet:free()
  if self._set then
    core.gradset_free(self._set)
    self._set = nil
    gradsets[self] = nil
  end
end
GradientSet.__close = GradientSet.free

function GradientSet:__tostring()
  return string.format("conflux.gradient_set('%s', %d gradients%s)", self.name, self._count,
                       not self._set and ", freed" or self._committed and ", committed" or "")
end

function M.shutdown()
  if not ctx then return end
  for sub in pairs(subsets) do sub:close() end  -- their handles belong to their own contexts
  core.cfx_shutdown(ctx)
  -- after shutdown every handle completes at once; should one not, fail it after a bounded wait
  -- and keep (leak) its data rather than free memory a collective might still write
  settle(ctx)
  detached = {}
  for gs in pairs(gradsets) do gs:free() end  -- a set must not outlive its context
  core.cfx_context_free(ctx)
  ctx = nil
end

return M
