-- Shared by the specs: one context per process (rank); spec files run in name order on every rank
-- and busted runs `it` blocks in order, so blocking collectives line up across ranks.
local cfx = require "conflux"

local S = {}

function S.cfx()
  if not cfx.is_initialized() then
    -- generous deadlines: on a loaded machine ranks may drift apart by seconds between specs
    -- (lifecycle_spec checks a short stall deadline on a context of its own)
    cfx.init { stall_warning_s = 20, stall_timeout_s = 90 }
  end
  return cfx
end

-- Rank r's known contribution to element i (1-based): small integers, so float sums are exact.
function S.value(r, i)
  return (r + 1) * (((i - 1) % 13) + 1)
end

function S.sum_over(size, i)
  local s = 0
  for r = 0, size - 1 do s = s + S.value(r, i) end
  return s
end

function S.sleep(seconds)
  local t = cfx.clock() + seconds
  while cfx.clock() < t do end
end

-- Calls f and returns the conflux error it raised (fails the spec if it raised nothing else).
function S.conflux_error(f, ...)
  local ok, e = pcall(f, ...)
  assert(not ok, "expected a conflux error, got success")
  assert(cfx.is_error(e), "expected a conflux error, got: " .. tostring(e))
  return e
end

return S
