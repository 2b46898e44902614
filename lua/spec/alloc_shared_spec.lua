local S = require "spec.support"

-- Shared tensor memory (cfx.shared_array / cfx.free_shared). Specs that call collectives run on
-- every rank in the same order; the others are local.
describe("conflux shared arrays", function()
  local cfx, rank, size

  setup(function()
    cfx = S.cfx()
    rank, size = cfx.rank(), cfx.size()
  end)

  -- Bytes of this process's pool in use, read from the message of an allocation it cannot hold.
  local function pool_use()
    local e = S.conflux_error(cfx.shared_array, "uint8", 1 << 62)
    return tonumber(e.message:match("%((%d+) of %d+ bytes in use"))
  end

  local function fill(a)
    for i = 1, #a do a[i] = S.value(rank, i) end
    return a
  end

  local function assert_sums(a, scale)
    for i = 1, #a do
      local want = S.sum_over(size, i) * (scale or 1)
      if a[i] ~= want then error(("element %d: %s ~= %s"):format(i, a[i], want)) end
    end
  end

  it("allreduces a shared float32 array larger than 1 MiB in place (sum)", function()
    local a = fill(cfx.shared_array("float32", 300000))  -- 1.2 MB: several pipeline chunks
    assert.are.equal(a, cfx.allreduce(a, { op = "sum", name = "shared.f32.large" }))
    assert_sums(a)
    cfx.free_shared(a)
  end)

  it("allreduces small shared arrays in place, blocking and async", function()
    local d = fill(cfx.shared_array("float64", 7))
    local l = cfx.shared_array("int64", 3)
    for i = 1, 3 do l[i] = S.value(rank, i) << 33 end  -- beyond 32 bits
    local h = cfx.allreduce_async(l, { op = "sum", name = "shared.i64.small" })
    assert.are.equal(d, cfx.allreduce(d, { op = "sum", name = "shared.f64.small" }))
    assert.are.equal(l, h:wait())
    assert_sums(d)
    for i = 1, 3 do assert.are.equal(S.sum_over(size, i) << 33, l[i]) end
    cfx.free_shared(d)
    cfx.free_shared(l)
  end)

  it("lets ranks mix shared and private arrays", function()
    local a = fill((rank % 2 == 0 and cfx.shared_array or cfx.array)("float32", 1000))
    cfx.allreduce(a, { op = "sum", name = "shared.mixed" })
    assert_sums(a)
  end)

  it("refuses to free an array in flight, and frees it once complete", function()
    local a = fill(cfx.shared_array("float32", 5))
    if rank == 0 then
      -- the other ranks submit only after the barrier, so this one cannot have completed
      local h = cfx.allreduce_async(a, { op = "sum", name = "shared.in.flight" })
      local e = S.conflux_error(cfx.free_shared, a)
      assert.are.equal("invalid_argument", e.kind)
      assert.matches("in flight", e.message)
      cfx.barrier()
      h:wait()
    else
      cfx.barrier()
      cfx.allreduce(a, { op = "sum", name = "shared.in.flight" })
    end
    assert_sums(a)
    cfx.free_shared(a)
  end)

  it("makes zeroed shared arrays that behave like cfx.array", function()
    local a = cfx.shared_array("float32", 4)
    assert.are.same({ 0, 0, 0, 0 }, a:totable())
    a[2] = 1.5
    assert.are.equal(1.5, a[2])
    assert.are.equal(4, #a)
    assert.are.equal("float32", a:dtype())
    assert.is_true(cfx.is_array(a))
    assert.is_true(cfx.is_shared(a))
    assert.matches("conflux.array%(float32, 4, shared%)", tostring(a))
    local c = a:copy()
    assert.is_false(cfx.is_shared(c))         -- copies are private
    assert.are.same(a:totable(), c:totable())
    assert.are.same({ 1, 2, 3 }, cfx.shared_array("int32", { 1, 2, 3 }):totable())
    assert.are.equal(0, #cfx.shared_array("int8", 0))
    assert.is_false(cfx.is_shared(cfx.array("float32", 1)))
    assert.is_false(cfx.is_shared({}))
  end)

  it("refuses to free twice or to free what is not shared; a freed array raises on use", function()
    local function bad(pattern, f, ...)
      local e = S.conflux_error(f, ...)
      assert.are.equal("invalid_argument", e.kind)
      assert.matches(pattern, e.message)
    end
    local a = cfx.shared_array("float64", 3)
    cfx.free_shared(a)
    assert.is_false(cfx.is_shared(a))
    assert.is_true(cfx.is_array(a))
    assert.matches("conflux.array%(float64, 3, freed%)", tostring(a))
    bad("already freed", cfx.free_shared, a)
    bad("was freed", cfx.allreduce, a)
    assert.has_error(function() return a[1] end)
    assert.has_error(function() a[1] = 1 end)
    assert.has_error(function() return #a end)
    bad("private array", cfx.free_shared, cfx.array("float64", 3))
    bad("got table", cfx.free_shared, { 1 })
    bad("got nil", cfx.free_shared, nil)
    bad("unknown dtype", cfx.shared_array, "float128", 3)
    bad("negative", cfx.shared_array, "float32", -1)
    bad("element 2", cfx.shared_array, "int32", { 1, "x" })
  end)

  it("reports a full pool as out_of_memory with the library's message", function()
    local e = S.conflux_error(cfx.shared_array, "uint8", 1 << 62)
    assert.are.equal("out_of_memory", e.kind)
    assert.matches("no room for %d+ bytes in the shared pool", e.message)
    assert.are.equal("out_of_memory", S.conflux_error(cfx.shared_array, "float64", 1 << 62).kind)  -- size_t overflow
  end)

  it("collects unreferenced shared arrays when the pool is full", function()
    -- lua/CMakeLists.txt runs the specs with a 256 MiB pool: 384 MiB of arrays nobody references
    -- overflow it long before the GC would run on its own
    for _ = 1, 12 do cfx.shared_array("uint8", 32 << 20) end
  end)

  it("gives the memory back on free_shared and on collection", function()
    collectgarbage()
    collectgarbage()
    local before = pool_use()
    local a = cfx.shared_array("float64", 100000)
    assert.is_true(pool_use() >= before + 800000)
    cfx.free_shared(a)
    assert.are.equal(before, pool_use())
    -- made in a call of its own, so that no dead register of this function still holds it
    local function drop() cfx.shared_array("float64", 100000) end
    drop()
    collectgarbage()
    collectgarbage()
    assert.are.equal(before, pool_use())
  end)
end)
