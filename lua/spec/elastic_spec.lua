-- The elastic calls' Lua surface on the MPI world (not elastic): options checked by name, the
-- membership-change kind, and a clear refusal where the context cannot re-form. The elastic worlds
-- themselves run in tests/elastic_examples (cfxrun --elastic).
local S = require "spec.support"

describe("conflux elastic calls", function()
  local cfx, rank, size

  setup(function()
    cfx = S.cfx()
    rank, size = cfx.rank(), cfx.size()
  end)

  it("has the kind membership_changed, a world change like peer_lost, transport and shut_down", function()
    local core = require "conflux_core"
    assert.are.equal(math.tointeger(core.CFX_ERR_MEMBERSHIP_CHANGED), cfx.kinds.membership_changed)
    for _, kind in ipairs { "membership_changed", "peer_lost", "transport", "shut_down" } do
      local e = setmetatable({ kind = kind, status = cfx.kinds[kind], message = "x" }, cfx.Error)
      assert.is_true(cfx.world_changed(e), kind)
    end
    for _, kind in ipairs { "mismatch", "stall", "invalid_argument" } do
      local e = setmetatable({ kind = kind, status = cfx.kinds[kind], message = "x" }, cfx.Error)
      assert.is_false(cfx.world_changed(e), kind)
    end
    assert.is_false(cfx.world_changed("peer_lost"))
  end)

  it("names a bad reform option before anything joins", function()
    local e = S.conflux_error(cfx.reform, { min_sise = 2 })
    assert.are.equal("invalid_argument", e.kind)
    assert.matches("unknown option 'min_sise' (known: min_size max_size timeout_s settle_s)", e.message, 1, true)
    e = S.conflux_error(cfx.reform, { min_size = -1 })
    assert.matches("reform option min_size must be a whole number >= 0, not -1", e.message, 1, true)
    e = S.conflux_error(cfx.reform, { timeout_s = "soon" })
    assert.matches("reform option timeout_s must be a number, not string", e.message, 1, true)
    e = S.conflux_error(cfx.reform, 5)
    assert.matches("reform options must be a table", e.message, 1, true)
    e = S.conflux_error(cfx.elastic_init, { timeout = 5 })
    assert.matches("already initialized", e.message, 1, true)
  end)

  it("refuses to re-form a context not made by elastic_init; the world is untouched", function()
    local e = S.conflux_error(cfx.reform, { min_size = 1, timeout_s = 5 })
    assert.are.equal("unsupported", e.kind)
    assert.matches("cfx_context_reform", e.message, 1, true)
    e = S.conflux_error(cfx.reform, cfx, { min_size = 1 })  -- the ctx:reform{} form
    assert.are.equal("unsupported", e.kind)
    assert.are.equal("unsupported", S.conflux_error(cfx.membership_round).kind)
    assert.are.equal("unsupported", S.conflux_error(cfx.member_id).kind)
    assert.are.equal("unsupported", S.conflux_error(cfx.membership_pending).kind)
    assert.are.equal(size, cfx.size())
    local a = cfx.allreduce({ rank + 1 }, { op = "sum", name = "after.reform.refused" })
    assert.are.same({ size * (size + 1) / 2 }, a)
  end)
end)
