local S = require "spec.support"

-- Compression (the `compression` option of allreduce and of cfx.gradient_set, error_feedback):
-- results checked against the exact sum of every rank's contribution computed here, bitwise the
-- same on every rank, error feedback on a quadratic, and the engine's errors for bad input.
--
-- The spec runs twice. In the lua.busted runs the ranks share a host and the shared-memory
-- reduction carries every allreduce: nothing is compressed, so each result must equal the
-- uncompressed one bit for bit. The lua.compress runs set CFX_SHM=0 (the MPI path, where the
-- _everywhere values compress on one host) and CFX_TEST_EXPECT_COMPRESSED=1: each result must lie
-- within the rounding the engine documents (every contribution rounded once to the 16-bit form,
-- every combine once) of the exact sum, and an unscaled sum must be a value of the 16-bit form
-- (proof that it travelled compressed).
describe("conflux compression", function()
  local cfx, rank, size
  local expect = os.getenv("CFX_TEST_EXPECT_COMPRESSED")
  local compressed = expect == "1"

  setup(function()
    assert(expect == nil or expect == "0" or expect == "1",
           "CFX_TEST_EXPECT_COMPRESSED=" .. tostring(expect) .. " is neither 0 nor 1")
    cfx = S.cfx()
    rank, size = cfx.rank(), cfx.size()
  end)

  teardown(function()
    cfx.shutdown()  -- the later specs open a context again (S.cfx)
  end)

  -- rank r's value of element i of tensor t: spread over [-8, 8], rarely a 16-bit value
  local function value(r, t, i)
    local h = (r + 1) * 0x9E3779B97F4A7C15 ~ (t + 7) * 0xC2B2AE3D27D4EB4F ~ i * 0x165667B19E3779F9
    h = h ~ (h >> 29)
    h = h * 0xBF58476D1CE4E5B9
    h = h ~ (h >> 32)
    return (h % 20001 - 10000) / 1234.567
  end

  local function as_float32(v) return (string.unpack("f", string.pack("f", v))) end

  local function is_bf16(c) return c == "bf16" or c == "bf16_everywhere" end

  -- whether v is exactly a value of the 16-bit form (binary16 with subnormals, or bfloat16)
  local function representable(c, v)
    if v == 0 or v ~= v or v == math.huge or v == -math.huge then return true end
    if as_float32(v) ~= v then return false end
    local bits = string.unpack("I4", string.pack("f", v))
    if is_bf16(c) then return bits & 0xFFFF == 0 end
    local a = math.abs(v)
    if a > 65504 then return false end
    local e = ((bits >> 23) & 0xFF) - 127  -- a = m 2^e, m in [1, 2)
    local scaled = e >= -14 and a * 2.0 ^ (10 - e) or a * 2.0 ^ 24
    return scaled == math.floor(scaled)
  end

  -- k = { t = tensor, dtype =, n =, op =, pre =, post = }: rank r's contribution to element i
  local function contribution(k, r, i)
    local v = value(r, k.t, i)
    return k.dtype == "float32" and as_float32(v) or v
  end

  local function input(k)
    local a = cfx.array(k.dtype, k.n)
    for i = 1, k.n do a[i] = contribution(k, rank, i) end
    return a
  end

  local function options(k, name, c)
    return { name = name, op = k.op or "sum", prescale = k.pre, postscale = k.post, compression = c }
  end

  -- got against the exact postscale * op(prescale * x_r) over every rank's contribution: within
  -- the documented rounding when `travelled`, else bit for bit the uncompressed result `plain`
  local function check(what, k, c, travelled, got, plain)
    local u = is_bf16(c) and 2.0 ^ -8 or 2.0 ^ -11
    local pre, post = k.pre or 1, k.post or 1
    local bad, unrepresentable, first = 0, 0, {}
    for i = 1, k.n do
      local exact, mag = 0, 0
      for r = 0, size - 1 do
        exact = exact + pre * contribution(k, r, i)
        mag = mag + math.abs(pre * contribution(k, r, i))
      end
      local f = k.op == "average" and post / size or post
      exact, mag = exact * f, mag * math.abs(f)
      local v, ok = got[i], nil
      if travelled then
        ok = math.abs(v - exact) <= u * size * mag + 1e-6 * mag
        if (k.op or "sum") == "sum" and pre == 1 and post == 1 and not representable(c, v) then
          unrepresentable = unrepresentable + 1
        end
      else
        ok = v == plain[i] and math.abs(v - exact) <= 2.0 ^ -22 * size * mag
      end
      if not ok then
        bad = bad + 1
        if bad <= 3 then
          first[#first + 1] = ("[%d] %.9g, exact %.9g, uncompressed %.9g"):format(i, v, exact, plain[i])
        end
      end
    end
    if bad > 0 then
      error(("%s (%s, %s): %d of %d elements off: %s"):format(what, c, travelled and "compressed" or
            "not compressed", bad, k.n, table.concat(first, "; ")), 2)
    end
    if unrepresentable > 0 then
      error(("%s: %d of %d sums are no %s values: the data did not travel compressed"):format(
            what, unrepresentable, k.n, is_bf16(c) and "bfloat16" or "float16"), 2)
    end
  end

  -- every rank's result bytes are this rank's
  local function identical(what, a)
    local all = cfx.allgather(a, "lz.same." .. what):tobytes()
    local mine = a:tobytes()
    for r = 0, size - 1 do
      if all:sub(r * #mine + 1, (r + 1) * #mine) ~= mine then
        error(("%s: rank %d's result differs from rank %d's"):format(what, r, rank), 2)
      end
    end
  end

  local CASES = {
    { t = 0, dtype = "float32", n = 4000 },
    { t = 1, dtype = "float64", n = 1001 },
    { t = 2, dtype = "float32", n = 17, op = "average", pre = 0.5, post = 3 },
    { t = 3, dtype = "float64", n = 1, pre = 2, post = 0.25 },
  }

  it("sums within the 16-bit rounding of the exact sum (the _everywhere values)", function()
    for _, c in ipairs { "fp16_everywhere", "bf16_everywhere" } do
      for _, k in ipairs(CASES) do
        local name = "lz." .. c .. "." .. k.t
        local plain = cfx.allreduce(input(k), options(k, name .. ".plain", "none"))
        local got = cfx.allreduce(input(k), options(k, name, c))
        check(name, k, c, compressed, got, plain)
        identical(name, got)
      end
    end
  end)

  it("leaves one host exact with the cross-host values, tables and async handles alike", function()
    local k = CASES[1]
    local plain = cfx.allreduce(input(k), options(k, "lz.host.plain", "none"))
    for _, c in ipairs { "fp16", "bf16" } do
      check("lz.host." .. c, k, c, false, cfx.allreduce(input(k), options(k, "lz.host." .. c, c)), plain)
    end
    -- a table (copied in and out, float64 by default) and the async form
    local kt = CASES[2]
    local t = input(kt):totable()
    local h = cfx.allreduce_async(t, options(kt, "lz.table", "fp16_everywhere"))
    local tp = cfx.allreduce(input(kt), options(kt, "lz.table.plain", "none"))
    assert.are.equal(t, h:wait())
    check("lz.table", kt, "fp16_everywhere", compressed, t, tp)
  end)

  it("reduces a compressed gradient set within the rounding of the exact sum", function()
    local grads = { { t = 10, dtype = "float32", n = 6000, shape = { 100, 60 } },
                    { t = 11, dtype = "float64", n = 513, shape = { 513 } } }
    local c = "bf16_everywhere"
    local gs <close> = cfx.gradient_set { name = "lz.set", op = "sum", compression = c }
    local index = {}
    for g = 2, 1, -1 do index[g] = gs:add("g" .. g, grads[g].shape, grads[g].dtype) end
    gs:commit()
    for step = 0, 1 do
      local inputs = {}
      for g = 1, 2 do
        local k = grads[g]
        k.t = 10 + 2 * step + g
        inputs[g] = input(k)
        local a = gs:array(index[g])
        for i = 1, k.n do a[i] = inputs[g][i] end
      end
      gs:ready(index[1])
      gs:ready(index[2])
      gs:wait(60)
      for g = 1, 2 do
        local k = grads[g]
        local plain = cfx.allreduce(inputs[g], { op = "sum", name = "lz.set.plain" .. g })
        check("lz.set g" .. g .. " step " .. step, k, c, compressed, gs:array(index[g]), plain)
        identical("lz.set" .. step .. "." .. g, gs:array(index[g]))
      end
    end
  end)

  -- SGD on sum_i (w_i - t_i)^2 / 2 through a gradient set: every rank's gradient is w - t plus an
  -- offset that cancels over the ranks but is large enough that the 16-bit rounding of each rank's
  -- value swallows w - t once w nears t. Returns the mean |w - t| at the end.
  local function quadratic(c, feedback)
    local n, steps = 256, 1000
    local gs <close> = cfx.gradient_set { name = feedback and "lz.quadratic.ef" or "lz.quadratic",
                                          compression = c, error_feedback = feedback }
    local idx = gs:add("w", n, "float32")
    gs:commit()
    local g = gs:array(idx)
    local w, t = cfx.array("float64", n), {}
    local big = is_bf16(c) and 200 or 1000
    local offset = rank < size - 1 and big or -big * (size - 1)
    for i = 1, n do t[i] = value(0, 99, i) / 8 end
    for k = 0, steps - 1 do
      for i = 1, n do g[i] = w[i] - t[i] + offset end
      gs:ready(idx)
      gs:wait(60)
      local lr = 0.5 / (1 + k / 20)
      for i = 1, n do w[i] = w[i] - lr * g[i] end  -- the average: every rank takes the same step
    end
    identical(feedback and "quadratic.ef" or "quadratic", w)
    local err = 0
    for i = 1, n do err = err + math.abs(w[i] - t[i]) / n end
    return err
  end

  it("brings the quadratic closer to its minimum with error feedback than without", function()
    local plain = quadratic("fp16_everywhere", false)
    local fed = quadratic("fp16_everywhere", true)
    local got = ("mean |w - t|: %.4g without error feedback, %.4g with"):format(plain, fed)
    if compressed then
      assert(plain > 0.05, got .. ": the rounding did not stall plain SGD, so this shows nothing")
      assert(fed < 0.02 and fed < plain / 3, got)
    else
      assert(plain < 0.02 and fed < 0.02, got .. " (uncompressed: both should converge)")
    end
  end)

  it("takes a compression by name (any case) or by its code, alike", function()
    assert.are.same({ "none", "fp16", "bf16", "fp16_everywhere", "bf16_everywhere" }, cfx.compressions)
    local k = { t = 9, dtype = "float32", n = 33 }
    for code, name in ipairs(cfx.compressions) do
      local by_name = cfx.allreduce(input(k), { op = "sum", name = "lz.byname." .. name, compression = name })
      local by_upper = cfx.allreduce(input(k), { op = "sum", name = "lz.byupper." .. name, compression = name:upper() })
      local by_code = cfx.allreduce(input(k), { op = "sum", name = "lz.bycode." .. name, compression = code - 1 })
      assert.are.same(by_name:totable(), by_upper:totable(), name)
      assert.are.same(by_name:totable(), by_code:totable(), name)
      for i = 1, k.n do  -- within bfloat16's rounding of the exact sum, compressed or not
        local exact, mag = 0, 0
        for r = 0, size - 1 do
          exact, mag = exact + contribution(k, r, i), mag + math.abs(contribution(k, r, i))
        end
        assert(math.abs(by_name[i] - exact) <= 2.0 ^ -8 * size * mag + 1e-6, name .. " element " .. i)
      end
    end
  end)

  it("raises the engine's invalid_argument for bad input, naming the tensor", function()
    local e = S.conflux_error(cfx.allreduce, cfx.array("int32", 3),
                              { name = "lz.int", compression = "fp16_everywhere" })
    assert.are.equal("invalid_argument", e.kind)
    assert.matches("tensor 'lz.int'", e.message, 1, true)
    assert.matches("compression takes float32 and float64 tensors, not int32", e.message, 1, true)
    e = S.conflux_error(cfx.allreduce, cfx.array("float32", 4),
                        { name = "lz.adasum", op = "adasum", compression = "bf16" })
    assert.are.equal("invalid_argument", e.kind)
    assert.matches("lz.adasum", e.message, 1, true)
    e = S.conflux_error(cfx.allreduce, cfx.array("float32", 4), { compression = "fp8" })
    assert.matches("unknown compression fp8; use one of: none, fp16, bf16, fp16_everywhere, bf16_everywhere",
                   e.message, 1, true)
    e = S.conflux_error(cfx.reducescatter, cfx.array("float32", 4), { compression = "fp16" })
    assert.matches("compression", e.message, 1, true)
    local gs <close> = cfx.gradient_set { name = "lz.halfset", compression = "fp16" }
    e = S.conflux_error(gs.add, gs, "h", 4, "float16")
    assert.are.equal("invalid_argument", e.kind)
    assert.matches("gradient 'h'", e.message, 1, true)
    e = S.conflux_error(cfx.gradient_set, { name = "lz.ef.none", error_feedback = true })
    assert.are.equal("invalid_argument", e.kind)
    assert.matches("error_feedback", e.message, 1, true)
    e = S.conflux_error(cfx.gradient_set, { name = "lz.ef.one", compression = "fp16", error_feedback = 1 })
    assert.matches("error_feedback must be a boolean", e.message, 1, true)
    -- only local checks above: no rank may go on (and shut down) while another makes them
    cfx.barrier()
  end)

  it("raises a mismatch on every rank when ranks disagree on compression", function()
    local mine = rank == 0 and "fp16" or "none"
    local e = S.conflux_error(cfx.allreduce, cfx.array("float32", 8), { name = "lz.mismatched", compression = mine })
    assert.are.equal("mismatch", e.kind)
    assert.matches("lz.mismatched", e.message, 1, true)
    assert.matches("compression", e.message, 1, true)
    assert.matches("fp16", e.message, 1, true)
    local gs <close> = cfx.gradient_set { name = "lz.mixed",
                                          compression = rank == size - 1 and "bf16" or "none" }
    gs:add("w", 8, "float32")
    e = S.conflux_error(gs.commit, gs)
    assert.are.equal("mismatch", e.kind)
    assert.matches("lz.mixed", e.message, 1, true)
    assert.matches("bf16", e.message, 1, true)
    assert.are.equal(size, cfx.allreduce({ 1 }, "sum")[1])
  end)
end)
