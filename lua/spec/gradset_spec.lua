local S = require "spec.support"

-- Gradient sets (cfx.gradient_set): every rank registers the same gradients in an order of its
-- own, marks them ready in another, and checks each result against the reduction of what every
-- rank put in, recomputed here.
describe("conflux gradient sets", function()
  local cfx, rank, size

  -- name, shape, dtype: several buckets at bucket_bytes = 64
  local GRADS = {
    { "conv.weight", { 4, 3 }, "float32" },
    { "conv.bias", { 4 }, "float32" },
    { "fc.weight", { 5, 2 }, "float64" },
    { "fc.bias", { 5 }, "float64" },
    { "emb", { 30 }, "float32" },
  }

  setup(function()
    cfx = S.cfx()
    rank, size = cfx.rank(), cfx.size()
  end)

  -- rank r's value of gradient g's element i in a step and pass: small integers (exact sums)
  local function value(r, g, i, step, pass)
    return (r + 1) * (((i + g + 3 * step + 5 * (pass or 0)) % 7) + 1)
  end

  -- this rank's registration order: rotated by the rank, reversed on odd ranks
  local function order(r)
    local o = {}
    for k = 0, #GRADS - 1 do o[#o + 1] = ((k + r) % #GRADS) + 1 end
    if r % 2 == 1 then
      local rev = {}
      for k = #o, 1, -1 do rev[#rev + 1] = o[k] end
      o = rev
    end
    return o
  end

  local function register(gs)
    local index = {}
    for _, g in ipairs(order(rank)) do
      index[g] = gs:add(GRADS[g][1], GRADS[g][2], GRADS[g][3])
    end
    return index
  end

  local function fill(a, g, step, pass, add)
    for i = 1, #a do a[i] = (add and a[i] or 0) + value(rank, g, i, step, pass) end
  end

  -- average (or sum) over ranks of the passes' sum, times scale
  local function check(gs, index, step, opts)
    opts = opts or {}
    for g = 1, #GRADS do
      local a = gs:array(index[g])
      local n = 1
      for _, d in ipairs(GRADS[g][2]) do n = n * d end
      assert.are.equal(n, #a)
      for i = 1, #a do
        local want = 0
        for r = 0, size - 1 do
          for p = 0, (opts.passes or 1) - 1 do want = want + value(r, g, i, step, p) end
        end
        want = want * (opts.scale or 1) / (opts.sum and 1 or size)
        if math.abs(a[i] - want) > 1e-5 * math.abs(want) then
          error(("%s[%d] step %d: %s ~= %s"):format(GRADS[g][1], i, step, a[i], want))
        end
      end
    end
  end

  it("averages owned gradients registered and marked ready in any order", function()
    local gs = cfx.gradient_set { name = "lua.orders", bucket_bytes = 64 }
    local index = register(gs)
    assert.has_error(function() gs:array(1) end)  -- no storage before commit
    gs:commit()
    assert.are.equal(0, gs:array("emb")[1])         -- zeroed
    for step = 0, 2 do
      local o = order(rank + step + 1)
      for _, g in ipairs(o) do
        fill(gs:array(index[g]), g, step)
        if g % 2 == 0 then gs:ready(GRADS[g][1]) else gs:ready(index[g]) end
      end
      gs:wait(60)
      check(gs, index, step)
    end
    local view = gs:array(1)
    gs:free()
    gs:free()  -- a no-op
    assert.has_error(function() return view[1] end)  -- its storage went with the set
    assert.has_error(function() gs:ready(1) end)
  end)

  it("sums borrowed arrays with scales", function()
    local gs = cfx.gradient_set { name = "lua.borrowed", op = "sum", owned = false,
                                  prescale = 2, postscale = 0.25 }
    local arrays, index = {}, {}
    for _, g in ipairs(order(rank)) do
      local n = 1
      for _, d in ipairs(GRADS[g][2]) do n = n * d end
      arrays[g] = cfx.array(GRADS[g][3], n)
      index[g] = gs:add(GRADS[g][1], arrays[g], GRADS[g][2])
    end
    gs:commit()
    for step = 0, 1 do
      for g = #GRADS, 1, -1 do
        fill(arrays[g], g, step)
        gs:ready(index[g])
      end
      gs:wait()
      check(gs, index, step, { sum = true, scale = 0.5 })
      assert.are.equal(arrays[1], gs:array(index[1]))
    end
    gs:free()
  end)

  it("accumulates passes before one reduction", function()
    local gs = cfx.gradient_set { name = "lua.accumulate", accumulate_steps = 2, prescale = 0.5 }
    local index = register(gs)
    gs:commit()
    for step = 0, 1 do
      for pass = 0, 1 do
        for g = #GRADS, 1, -1 do
          fill(gs:array(index[g]), g, step, pass, pass > 0)
          gs:ready(index[g])
        end
      end
      local e = S.conflux_error(gs.ready, gs, index[1])
      assert.are.equal("invalid_argument", e.kind)
      assert.matches("marked ready", e.message, 1, true)
      gs:wait(60)
      check(gs, index, step, { passes = 2, scale = 0.5 })
    end
    gs:free()
  end)

  it("reduces gradients never marked ready as they are", function()
    local gs = cfx.gradient_set { name = "lua.unused", bucket_bytes = 64 }
    local index = register(gs)
    gs:commit()
    for step = 0, 1 do
      for g = 1, #GRADS do
        fill(gs:array(index[g]), g, step)
        if (step == 0 and g ~= (rank % #GRADS) + 1) or (step == 1 and g == 1) then
          gs:ready(index[g])
        end
      end
      gs:wait(60)
      check(gs, index, step)
    end
    gs:free()
  end)

  it("fails a mismatched registration on every rank, naming the gradient", function()
    local gs = cfx.gradient_set { name = "lua.mismatch" }
    gs:add("fc.bias", 3)
    gs:add("fc.weight", rank == size - 1 and { 4, 2 } or { 2, 4 })
    local e = S.conflux_error(gs.commit, gs)
    assert.are.equal("mismatch", e.kind)
    assert.matches("'fc.weight' is float32 [2, 4]", e.message, 1, true)
    assert.matches(("float32 [4, 2] on rank %d"):format(size - 1), e.message, 1, true)
    gs:free()
  end)

  it("rejects bad local arguments with clear errors", function()
    local gs = cfx.gradient_set { name = "lua.errors" }
    local i = gs:add("w", 4)
    local e = S.conflux_error(gs.add, gs, "w", 2)
    assert.are.equal("duplicate_name", e.kind)
    e = S.conflux_error(gs.add, gs, "a", cfx.array("float32", 2))
    assert.matches("owns its storage", e.message, 1, true)
    e = S.conflux_error(gs.add, gs, "d", 2, "complex")
    assert.matches("unknown dtype", e.message, 1, true)
    gs:commit()
    e = S.conflux_error(gs.ready, gs, "nope")
    assert.matches("no gradient 'nope'", e.message, 1, true)
    e = S.conflux_error(gs.ready, gs, 7)
    assert.matches("out of range", e.message, 1, true)
    gs:ready(i)
    gs:wait()
    gs:free()
    e = S.conflux_error(gs.ready, gs, i)
    assert.matches("was freed", e.message, 1, true)
    local b = cfx.gradient_set { name = "lua.errors.borrowed", owned = false }
    e = S.conflux_error(b.add, b, "x", 2)
    assert.matches("needs an array", e.message, 1, true)
    b:free()
    e = S.conflux_error(cfx.gradient_set, { name = "lua.errors.op", op = "mean" })
    assert.matches("unknown reduction op", e.message, 1, true)
  end)
end)
