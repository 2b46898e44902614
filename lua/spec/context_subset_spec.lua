local S = require "spec.support"

-- Subsets (cfx.subset): membership and numbering, collectives over the members only (subsets that
-- overlap, at the same time), repeated creation, bad lists; every result checked against the
-- members' known contributions (S.value), summed here.
describe("conflux subsets", function()
  local cfx, rank, size

  setup(function()
    cfx = S.cfx()
    rank, size = cfx.rank(), cfx.size()
  end)

  -- 0 .. size-1 without `skip`
  local function all_but(skip)
    local out = {}
    for r = 0, size - 1 do
      if r ~= skip then out[#out + 1] = r end
    end
    return out
  end

  local function index_of(list, r)
    for i, v in ipairs(list) do
      if v == r then return i - 1 end
    end
    return nil
  end

  local function sum_over(members, i)
    local s = 0
    for _, r in ipairs(members) do s = s + S.value(r, i) end
    return s
  end

  local function mine(n)
    local t = {}
    for i = 1, n do t[i] = S.value(rank, i) end
    return t
  end

  it("gives members a numbered subset and the other ranks nil", function()
    local evens = {}
    for r = size - 1, 0, -1 do
      if r % 2 == 0 then evens[#evens + 1] = r end  -- descending: any order works
    end
    local sub <close> = cfx.subset(evens)
    if rank % 2 == 1 then
      assert.is_nil(sub)
      return
    end
    table.sort(evens)
    assert.are.same(evens, sub.ranks)
    assert.are.equal(rank // 2, sub:rank())
    assert.are.equal(#evens, sub:size())
    local x = sub:allreduce(mine(11), { op = "sum", name = "sub.evens" })
    for i = 1, 11 do assert.are.equal(sum_over(evens, i), x[i]) end
    local g = sub:allgather({ rank, rank })
    local want = {}
    for _, r in ipairs(evens) do want[#want + 1] = r; want[#want + 1] = r end
    assert.are.same(want, g)
    local b = sub:broadcast({ rank }, #evens - 1)  -- the subset's last rank
    assert.are.equal(evens[#evens], b[1])
    assert.is_true(sub:barrier())
  end)

  it("runs subsets that overlap at the same time", function()
    local lists = { all_but(size - 1), all_but(0) }
    local subs, handles = {}, {}
    for k, l in ipairs(lists) do
      subs[k] = cfx.subset(l)
      assert.are.equal(index_of(l, rank) ~= nil, subs[k] ~= nil)
      if subs[k] then
        assert.are.equal(index_of(l, rank), subs[k]:rank())
        handles[#handles + 1] = { l, subs[k]:allreduce_async(mine(7), { op = "sum", name = "sub.both" }) }
      end
    end
    local all = cfx.allreduce({ rank }, "sum")
    assert.are.equal(size * (size - 1) // 2, all[1])
    for k = #handles, 1, -1 do
      local l, h = handles[k][1], handles[k][2]
      local r = h:wait()
      for i = 1, 7 do assert.are.equal(sum_over(l, i), r[i]) end
    end
    for _, s in pairs(subs) do s:close() end
  end)

  it("is created and closed again and again", function()
    for round = 0, 4 do
      local members = all_but(round % size)
      local sub = cfx.subset(members)
      assert.are.equal(round % size == rank, sub == nil)
      if sub then
        local x = sub:allreduce({ rank + 1 }, { op = "sum", name = "sub.again" })
        local want = 0
        for _, r in ipairs(members) do want = want + r + 1 end
        assert.are.equal(want, x[1])
        sub:close()
        sub:close()  -- idempotent
        local e = S.conflux_error(sub.allreduce, sub, { 1 })
        assert.are.equal("shut_down", e.kind)
        assert.matches("closed", e.message)
      end
    end
  end)

  it("refuses bad lists on every rank", function()
    local e = S.conflux_error(cfx.subset, { 0, size + 5 })
    assert.are.equal("invalid_argument", e.kind)
    assert.matches(tostring(size + 5), e.message)
    assert.are.equal("invalid_argument", S.conflux_error(cfx.subset, { 0, 0 }).kind)
    assert.are.equal("invalid_argument", S.conflux_error(cfx.subset, {}).kind)
    assert.has_error(function() cfx.subset(3) end)
    assert.has_error(function() cfx.subset { "x" } end)
    local x = cfx.allreduce({ 1 }, "sum")  -- the context goes on
    assert.are.equal(size, x[1])
  end)

  it("closes open subsets at shutdown", function()
    local sub = cfx.subset(all_but(size - 1))
    cfx.barrier()
    cfx.shutdown()
    if sub then
      local e = S.conflux_error(sub.allreduce, sub, { 1 })
      assert.are.equal("shut_down", e.kind)
    end
    S.cfx()  -- the later specs get a context again
  end)
end)
