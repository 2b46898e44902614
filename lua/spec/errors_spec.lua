local S = require "spec.support"

describe("conflux errors", function()
  local cfx, rank, size

  local function works(name)
    local a = cfx.allreduce({ rank + 1, 2 }, { op = "sum", name = name })
    assert.are.same({ size * (size + 1) / 2, 2 * size }, a)
  end

  setup(function()
    cfx = S.cfx()
    rank, size = cfx.rank(), cfx.size()
  end)

  it("has one error kind per C status, its cfx_status_name in lower case", function()
    local core = require "conflux_core"
    local count = 0
    while core.cfx_status_name(count + 1) ~= nil do
      count = count + 1
      local kind = core.cfx_status_name(count):lower()
      assert.are.equal(count, cfx.kinds[kind], kind)
    end
    assert.are.equal(core.CFX_STATUS_COUNT - 1, count)
    assert.are.equal("OK", core.cfx_status_name(0))
    assert.are.equal(5, cfx.kinds.mismatch)    -- CFX_ERR_MISMATCH in the header
    assert.are.equal(13, cfx.kinds.peer_lost)  -- CFX_ERR_PEER_LOST
    local n = 0
    for _ in pairs(cfx.kinds) do n = n + 1 end
    assert.are.equal(count, n)
  end)

  it("raises a mismatch on every rank, naming the tensor; the next allreduce works", function()
    local a = cfx.array("float32", rank == 0 and 4 or 5)
    local e = S.conflux_error(cfx.allreduce, a, { name = "bad.shape" })
    assert.are.equal("mismatch", e.kind)
    assert.are.equal(cfx.kinds.mismatch, e.status)
    assert.matches("bad.shape", e.message, 1, true)
    assert.matches("^conflux: mismatch: ", tostring(e))
    works("after.shape")
  end)

  it("raises a dtype mismatch from an async handle, and keeps it on the handle", function()
    local h = cfx.allreduce_async(cfx.array(rank == 0 and "float32" or "float64", 3), { name = "bad.dtype" })
    local e = S.conflux_error(h.wait, h)
    assert.are.equal("mismatch", e.kind)
    assert.matches("bad.dtype", e.message, 1, true)
    assert.is_true(h:poll())
    assert.are.equal("mismatch", S.conflux_error(h.result, h).kind)
    works("after.dtype")
  end)

  it("raises duplicate_name for a name already in flight", function()
    local first
    local a = cfx.array("float32", { rank })
    if rank == 0 then
      first = cfx.allreduce_async(a, { op = "sum", name = "dup" })
      local e = S.conflux_error(cfx.allreduce_async, cfx.array("float32", 1), { name = "dup" })
      assert.are.equal("duplicate_name", e.kind)
      assert.matches("dup", e.message, 1, true)
      local r, why = first:wait(0)
      assert.is_nil(r)
      assert.are.equal("timeout", why)
    end
    cfx.barrier()
    if rank ~= 0 then first = cfx.allreduce_async(a, { op = "sum", name = "dup" }) end
    assert.are.equal(size * (size - 1) / 2, first:wait()[1])
    works("dup")
  end)

  it("rejects bad local arguments with invalid_argument", function()
    local function bad(f, ...)
      local e = S.conflux_error(f, ...)
      assert.are.equal("invalid_argument", e.kind)
      return e
    end
    bad(cfx.array, "float128", 3)
    bad(cfx.array, "float32", -1)
    bad(cfx.array, "int32", { 1, "x" })
    bad(cfx.array, "int32", { 1.5 })
    bad(cfx.allreduce, { 1 }, "median")
    bad(cfx.allreduce, "not data")
    bad(cfx.allreduce, { 1, {} })
    bad(cfx.allreduce, cfx.array("float32", 1), { dtype = "float64" })
    bad(cfx.allreduce, { 1 }, { name = 42 })
    bad(cfx.allreduce, { 1 }, 7)
    bad(cfx.broadcast, { 1 }, -1)
    bad(cfx.broadcast, { 1 }, size)
    bad(cfx.broadcast, { 1 }, 0.5)
    bad(cfx.alltoall, { 1, 2, 3 }, { 1, 2, 3, 4, 5, 6 })
    bad(cfx.init)  -- already initialized
    local h = cfx.allreduce_async({ 1 }, { op = "sum", name = "bad.args.ok" })
    bad(h.wait, h, -1)
    assert.are.same({ size }, h:wait())
    works("after.bad.args")
  end)
end)
