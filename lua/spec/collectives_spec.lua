local S = require "spec.support"

describe("conflux collectives", function()
  local cfx, rank, size

  setup(function()
    cfx = S.cfx()
    rank, size = cfx.rank(), cfx.size()
  end)

  it("reports the topology and the version", function()
    local env = os.getenv("OMPI_COMM_WORLD_SIZE")
    if env then
      assert.are.equal(tonumber(env), size)
      assert.are.equal(tonumber(os.getenv("OMPI_COMM_WORLD_RANK")), rank)
    end
    assert.is_true(rank >= 0 and rank < size)
    assert.are.equal("integer", math.type(rank))
    assert.are.equal("integer", math.type(size))
    assert.is_true(cfx.local_rank() < cfx.local_size())
    assert.are.equal(size, cfx.local_size() * cfx.cross_size())
    assert.is_true(cfx.cross_rank() < cfx.cross_size())
    assert.is_true(cfx.is_running())
    assert.are.equal("1.4.0", cfx.version())
    assert.are.equal(10400, cfx.version_number())
    assert.is_true(cfx.features().mpi)
    assert.is_true(cfx.features()["local"])
  end)

  it("has typed arrays with indexing, length and conversions", function()
    local a = cfx.array("float32", 4)
    assert.are.equal(4, #a)
    assert.are.equal("float32", a:dtype())
    assert.are.equal(0, a[1])
    a[2] = 1.5
    a[4] = 3
    assert.are.same({ 0, 1.5, 0, 3 }, a:totable())
    assert.are.equal(16, #a:tobytes())
    local i = cfx.array("int64", { 1, 2, 3 })
    assert.are.equal(3, i[3])
    assert.are.equal("integer", math.type(i[3]))
    assert.is_nil(a[5])                        -- reads past the end are nil, as for tables
    local seen = 0
    for k, v in ipairs(a) do seen = seen + 1; assert.are.equal(a[k], v) end
    assert.are.equal(4, seen)
    assert.has_error(function() a[5] = 1 end)  -- writes past the end raise
    assert.has_error(function() a[0] = 1 end)
    assert.has_error(function() i[1] = 1.5 end)
    local h = cfx.array("float16", { 1, 0.5, 65504, 1e-8 })
    assert.are.same({ 1, 0.5, 65504, 0 }, h:totable())
    local b = cfx.array("bfloat16", { 1, -2, 3.5 })
    assert.are.same({ 1, -2, 3.5 }, b:totable())
    local f = cfx.array("bool", 3):fill(true)
    assert.are.same({ true, true, true }, f:totable())
    assert.matches("conflux.array%(float32, 4%)", tostring(a))
    assert.is_true(cfx.is_array(a))
    assert.is_false(cfx.is_array({}))
  end)

  it("allreduces a float32 array in place (sum)", function()
    local n = 1000
    local a = cfx.array("float32", n)
    for i = 1, n do a[i] = S.value(rank, i) end
    local r = cfx.allreduce(a, { op = "sum", name = "l.f32.sum" })
    assert.are.equal(a, r)
    for i = 1, n do
      if a[i] ~= S.sum_over(size, i) then
        error(("element %d: %s ~= %s"):format(i, a[i], S.sum_over(size, i)))
      end
    end
  end)

  it("combines with Adasum: orthogonal contributions to their sum, identical ones to themselves", function()
    local o = cfx.array("float32", 8)
    for i = 1, 8 do o[i] = 0 end
    o[rank + 1] = rank + 1
    cfx.allreduce(o, { op = "adasum", name = "l.adasum.orthogonal" })
    for i = 1, 8 do
      assert.are.equal(i <= size and i or 0, o[i])
    end
    local same = {}
    for i = 1, 8 do same[i] = 0.5 * i - 1 end
    cfx.allreduce(same, { op = "adasum", name = "l.adasum.identical" })
    for i = 1, 8 do
      assert.is_true(math.abs(same[i] - (0.5 * i - 1)) < 1e-12, ("element %d: %s"):format(i, same[i]))
    end
  end)

  it("allreduces a table (copied in and back, float64 by default)", function()
    local t = {}
    for i = 1, 100 do t[i] = S.value(rank, i) + 0.25 end
    local r = cfx.allreduce(t, "average")
    assert.are.equal(t, r)
    for i = 1, 100 do
      assert.is_true(math.abs(t[i] - (S.sum_over(size, i) / size + 0.25)) < 1e-12)
    end
    local m = cfx.allreduce({ rank, -rank, rank * 10 }, { op = "max", dtype = "int32", name = "l.t.max" })
    assert.are.same({ size - 1, 0, (size - 1) * 10 }, m)
    assert.are.equal("integer", math.type(m[1]))
    local p = cfx.allreduce({ rank + 1 }, { op = "product", dtype = "int64" })
    local want = 1
    for r2 = 1, size do want = want * r2 end
    assert.are.equal(want, p[1])
    local mn = cfx.allreduce(cfx.array("float64", { rank * 0.5 }), "min")
    assert.are.equal(0, mn[1])
  end)

  it("stores float16 and bfloat16 elements rounded to nearest even, as the engine does", function()
    local h = cfx.array("float16", { 1 + 2 ^ -11, 1 + 3 * 2 ^ -11, 2 ^ -24, 65520, -1 / 3 })
    assert.are.same({ 1.0, 1 + 2 ^ -9, 2 ^ -24, math.huge, -0.333251953125 }, h:totable())
    local b = cfx.array("bfloat16", { 1 + 2 ^ -8, 1 + 3 * 2 ^ -8, -1 / 3 })
    assert.are.same({ 1.0, 1 + 2 ^ -6, -0.333984375 }, b:totable())
    cfx.allreduce(h, { op = "sum", name = "l.f16.round" })  -- every rank the same values: size times
    assert.are.same({ size * 1.0, size * (1 + 2 ^ -9), size * 2 ^ -24, math.huge, nil }, { h[1], h[2], h[3], h[4] })
  end)

  it("averages by default (allreduce and reducescatter), as every binding does", function()
    local t = {}
    for i = 1, 5 do t[i] = S.value(rank, i) end
    cfx.allreduce(t, { name = "l.default.op" })
    for i = 1, 5 do assert.are.equal(S.sum_over(size, i) / size, t[i], "element " .. i) end
    local h = cfx.allreduce_async(cfx.array("float64", { rank + 1, 2 }), { name = "l.default.op.async" })
    assert.are.same({ (size + 1) / 2, 2 }, h:wait():totable())
    local rows = cfx.array("float64", size)
    for i = 1, size do rows[i] = S.value(rank, i) end
    local mine = cfx.reducescatter(rows, { name = "l.default.op.rs" })
    assert.are.equal(S.sum_over(size, rank + 1) / size, mine[1])
  end)

  it("stages tables on either side of the blocking call's stack limit (512 bytes)", function()
    for _, n in ipairs { 1, 64, 65 } do
      local t = {}
      for i = 1, n do t[i] = S.value(rank, i) end
      cfx.allreduce(t, { op = "sum", name = "l.stage." .. n })
      for i = 1, n do assert.are.equal(S.sum_over(size, i), t[i], n .. " elements, element " .. i) end
      local b = {}
      for i = 1, n do b[i] = rank * 1000 + i end
      cfx.broadcast(b, size - 1, { name = "l.stage.bc." .. n })
      for i = 1, n do assert.are.equal((size - 1) * 1000 + i, b[i], n .. " elements, element " .. i) end
    end
    local e = S.conflux_error(cfx.allreduce, cfx.array("float32", 1), { dtype = "float64" })
    assert.matches("the array holds float32, not float64", e.message, 1, true)
  end)

  it("applies prescale and postscale", function()
    local a = cfx.array("float64", { 1, 2, 3 })
    cfx.allreduce(a, { op = "sum", prescale = 2, postscale = 0.25, name = "l.scaled" })
    assert.are.same({ size * 0.5, size * 1.0, size * 1.5 }, a:totable())
  end)

  it("runs async handles submitted in a different order on each rank", function()
    local n, hs, arrs = 8, {}, {}
    for j = 1, n do
      local k = rank % 2 == 1 and (n + 1 - j) or j
      local a = cfx.array("float32", 10 + k)
      for i = 1, #a do a[i] = S.value(rank, i + k) end
      arrs[k] = a
      hs[k] = cfx.allreduce_async(a, { op = "sum", name = "l.async." .. k })
    end
    for k = 1, n do
      local h = hs[k]
      if k % 2 == 0 then
        while not h:poll() do end
      else
        assert.are.equal(arrs[k], h:wait(60))
      end
      local r = h:result()
      for i = 1, #r do assert.are.equal(S.sum_over(size, i + k), r[i]) end
      assert.matches("done", tostring(h))
    end
  end)

  it("allgathers different lengths per rank (array and table)", function()
    local mine = cfx.array("int32", rank + 1)
    for j = 1, rank + 1 do mine[j] = rank * 10 + j end
    local h = cfx.allgather_async(mine, "l.ag")
    local all = h:wait()
    assert.is_true(cfx.is_array(all))
    local want, splits = {}, {}
    for r = 0, size - 1 do
      splits[#splits + 1] = r + 1
      for j = 1, r + 1 do want[#want + 1] = r * 10 + j end
    end
    assert.are.same(want, all:totable())
    assert.are.same(splits, h:splits())
    local t = cfx.allgather({ rank + 0.5 }, "l.ag.t")
    local tw = {}
    for r = 0, size - 1 do tw[r + 1] = r + 0.5 end
    assert.are.same(tw, t)
  end)

  it("broadcasts from the last rank", function()
    local root = size - 1
    local a = cfx.array("float64", 5)
    for i = 1, 5 do a[i] = rank == root and i * i or -1 end
    cfx.broadcast(a, root, "l.bc")
    assert.are.same({ 1, 4, 9, 16, 25 }, a:totable())
    local t = { rank == 0 and 42 or 0 }
    cfx.broadcast(t, 0, { name = "l.bc.t", dtype = "int64" })
    assert.are.same({ 42 }, t)
  end)

  it("alltoalls with equal and uneven splits", function()
    local x = cfx.array("int32", 2 * size)
    for dst = 0, size - 1 do
      for j = 1, 2 do x[2 * dst + j] = 100 * rank + 10 * dst + j end
    end
    local got = cfx.alltoall(x, nil, "l.a2a.eq")
    for src = 0, size - 1 do
      for j = 1, 2 do assert.are.equal(100 * src + 10 * rank + j, got[2 * src + j]) end
    end
    local splits, y = {}, {}
    for dst = 0, size - 1 do
      splits[dst + 1] = dst + 1
      for j = 1, dst + 1 do y[#y + 1] = rank * 1000 + dst * 10 + j end
    end
    local h = cfx.alltoall_async(y, splits, { name = "l.a2a.uneven" })
    local r = h:wait()
    assert.are.equal(size * (rank + 1), #r)
    for src = 0, size - 1 do
      assert.are.equal(rank + 1, h:splits()[src + 1])
      for j = 1, rank + 1 do
        assert.are.equal(src * 1000 + rank * 10 + j, r[src * (rank + 1) + j])
      end
    end
  end)

  it("reducescatters blocks (first n % size ranks get one more)", function()
    local n = 2 * size + 1
    local a = cfx.array("float32", n)
    for i = 1, n do a[i] = S.value(rank, i) end
    local mine = cfx.reducescatter(a, { op = "sum", name = "l.rs" })
    local base, extra = n // size, n % size
    local len = base + (rank < extra and 1 or 0)
    local start = rank * base + math.min(rank, extra)
    assert.are.equal(len, #mine)
    for i = 1, len do assert.are.equal(S.sum_over(size, start + i), mine[i]) end
  end)

  it("writes a timeline", function()
    local dir = os.tmpname()
    os.remove(dir)
    local path = dir .. ".tl.json"
    cfx.start_timeline(path, true)
    cfx.allreduce(cfx.array("float32", 8), { name = "l.timeline" })
    cfx.stop_timeline()
    cfx.stop_timeline()  -- a no-op now
    local file = dir .. ".tl.rank" .. rank .. ".json"
    local f = assert(io.open(file, "rb"))
    local text = f:read("a")
    f:close()
    os.remove(file)
    assert.truthy(text:find("l.timeline", 1, true))
    assert.truthy(text:match("%]%s*$"))
    assert.are.equal("invalid_argument", S.conflux_error(cfx.start_timeline, "").kind)
  end)

  it("barriers and joins", function()
    assert.is_true(cfx.barrier())
    local h = cfx.barrier_async()
    assert.is_true(h:wait())
    local last = cfx.join()
    assert.is_true(last >= 0 and last < size)
    local a = cfx.allreduce({ rank }, "sum")
    assert.are.equal(size * (size - 1) / 2, a[1])
  end)
end)
