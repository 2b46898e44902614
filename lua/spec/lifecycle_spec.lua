local S = require "spec.support"

describe("conflux lifecycle", function()
  it("shuts down (pending handles fail with shut_down), raises afterwards, and re-inits", function()
    local cfx = S.cfx()
    local rank, size = cfx.rank(), cfx.size()
    local orphan = rank == 0 and cfx.allreduce_async({ 1 }, { name = "orphan" }) or nil
    local detached = cfx.allreduce_async({ 1 }, { name = "detached" })
    detached:release()
    cfx.barrier()
    cfx.shutdown()
    assert.is_false(cfx.is_initialized())
    assert.is_false(cfx.is_running())
    if orphan then
      assert.are.equal("shut_down", S.conflux_error(orphan.wait, orphan).kind)
    end
    assert.are.equal("not_initialized", S.conflux_error(cfx.rank).kind)
    assert.are.equal("not_initialized", S.conflux_error(cfx.allreduce, { 1 }).kind)
    cfx.shutdown()  -- a no-op now

    -- init options are set by name in C (bindings/bind.h): a bad one fails here, before joining
    local e = S.conflux_error(cfx.init, { no_such_option = 1 })
    assert.are.equal("invalid_argument", e.kind)
    assert.matches("unknown option 'no_such_option' (known: transport", e.message, 1, true)
    e = S.conflux_error(cfx.init, { cache_capacity = -3 })
    assert.matches("init option cache_capacity must be a whole number >= 0, not -3", e.message, 1, true)
    e = S.conflux_error(cfx.init, { stall_timeout_s = "soon" })
    assert.matches("init option stall_timeout_s must be a number, not string", e.message, 1, true)
    assert.is_false(cfx.is_initialized())

    cfx.init { cycle_time_ms = 2.5, deterministic = true, cache_capacity = 64 }
    assert.are.equal(size, cfx.size())
    do
      local h <close> = cfx.allreduce_async({ 2 }, { op = "sum", name = "after.reinit" })
      assert.are.same({ 2 * size }, h:wait())
    end
    cfx.shutdown()
  end)

  it("turns a tensor only some ranks submit into a stall error (own context, 4 s deadline)", function()
    local cfx = require "conflux"
    cfx.init { stall_warning_s = 2, stall_timeout_s = 4 }
    local rank, size = cfx.rank(), cfx.size()
    if rank == 0 then
      local e = S.conflux_error(cfx.allreduce, { 1 }, { name = "stalled" })
      assert.are.equal("stall", e.kind)
      assert.matches("stalled", e.message, 1, true)
    else
      -- enter the barrier after the 4 s deadline: rank 0 is there by then (or soon after), so
      -- the barrier cannot stall, however loaded the machine
      S.sleep(5)
    end
    cfx.barrier()
    assert.are.same({ size }, cfx.allreduce({ 1 }, { op = "sum", name = "after.stall" }))
    cfx.shutdown()
  end)
end)
