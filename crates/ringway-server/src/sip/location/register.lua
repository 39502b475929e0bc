-- ringway: apply one REGISTER to one address-of-record, atomically.
-- KEYS[1]  hash  field = contact URI, value = JSON binding
--                {"i": Call-ID, "s": CSeq, "e": expiry (ms, Redis time),
--                 "u": refresh order, "p": [Path values], "f": flow or null,
--                 "o": {"i": +sip.instance, "r": reg-id} or null}
-- KEYS[2]  zset  member = contact URI, score = expiry (ms): the per-binding
--                expiry index (Redis 7.0 has no per-field TTL)
-- ARGV[1] Call-ID, ARGV[2] CSeq, ARGV[3] most contacts afterwards,
-- ARGV[4] Path as a JSON array, ARGV[5] number of changes, ARGV[6] the flow
-- as JSON (or null), then per change kind ("b" bind, "u" unbind, "*" unbind
-- all), contact, lifetime (s), RFC 5626 outbound as JSON (or null): a bind
-- with the same instance and reg-id as another contact replaces it.
-- Returns {status, now_ms, contact, value, contact, value, ...} of the live
-- bindings afterwards; status 0 applied, 1 out of order (a binding of the
-- same Call-ID has a higher CSeq), 2 too many contacts, 3 a stored value
-- cannot be read. On a status other than 0 nothing was changed.
-- Both keys expire (PEXPIREAT) with their last binding, plus slack.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local call_id = ARGV[1]
local cseq = tonumber(ARGV[2])
local max_contacts = tonumber(ARGV[3])
local path = ARGV[4]
local changes = tonumber(ARGV[5])
local flow = ARGV[6]
local FIRST = 7
local STRIDE = 4
local function num(x) return string.format('%.0f', x) end

-- Expired bindings go first (by the index).
local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', num(now))
for _, contact in ipairs(dead) do redis.call('HDEL', KEYS[1], contact) end
if #dead > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', num(now)) end

local existing = {}
local count = 0
local flat = redis.call('HGETALL', KEYS[1])
for i = 1, #flat, 2 do
  local ok, binding = pcall(cjson.decode, flat[i + 1])
  if not ok or type(binding) ~= 'table' or type(binding.i) ~= 'string'
      or type(binding.s) ~= 'number' then
    return {3, now}
  end
  existing[flat[i]] = binding
  count = count + 1
end

local function out_of_order(contact)
  for c, binding in pairs(existing) do
    if (contact == nil or contact == c) and binding.i == call_id and binding.s > cseq then
      return true
    end
  end
  return false
end

-- The rules (RFC 3261 10.3 steps 7-8), as ringway_sip::registrar::apply_registration.
local known = {}
for c, _ in pairs(existing) do known[c] = true end
local after = count
-- Contacts of the same RFC 5626 flow as this bind's (other contacts).
local function same_flow(contact, outbound)
  local found = {}
  if outbound == 'null' then return found end
  local ok, o = pcall(cjson.decode, outbound)
  if not ok or type(o) ~= 'table' then return found end
  for c, binding in pairs(existing) do
    local bo = binding.o
    if c ~= contact and type(bo) == 'table' and bo.i == o.i and bo.r == o.r then
      found[#found + 1] = c
    end
  end
  return found
end
for k = 0, changes - 1 do
  local kind, contact = ARGV[FIRST + STRIDE * k], ARGV[FIRST + 1 + STRIDE * k]
  local outbound = ARGV[FIRST + 3 + STRIDE * k]
  if kind == 'b' then
    for _, old in ipairs(same_flow(contact, outbound)) do
      if known[old] then
        known[old] = nil
        after = after - 1
      end
    end
  end
  if kind == '*' then
    if out_of_order(nil) then return {1, now} end
    known = {}
    after = 0
  else
    if out_of_order(contact) then return {1, now} end
    if kind == 'b' and not known[contact] then
      known[contact] = true
      after = after + 1
    elseif kind == 'u' and known[contact] then
      known[contact] = nil
      after = after - 1
    end
  end
end
if after > max_contacts then return {2, now} end

for k = 0, changes - 1 do
  local base = FIRST + STRIDE * k
  local kind, contact, lifetime = ARGV[base], ARGV[base + 1], tonumber(ARGV[base + 2])
  local outbound = ARGV[base + 3]
  if kind == '*' then
    redis.call('DEL', KEYS[1], KEYS[2])
  elseif kind == 'u' then
    redis.call('HDEL', KEYS[1], contact)
    redis.call('ZREM', KEYS[2], contact)
  else
    for _, old in ipairs(same_flow(contact, outbound)) do
      redis.call('HDEL', KEYS[1], old)
      redis.call('ZREM', KEYS[2], old)
      existing[old] = nil
    end
    local expires = now + lifetime * 1000
    local value = '{"i":' .. cjson.encode(call_id) .. ',"s":' .. num(cseq)
      .. ',"e":' .. num(expires) .. ',"u":' .. num(now * 100 + k) .. ',"p":' .. path
      .. ',"f":' .. flow .. ',"o":' .. outbound .. '}'
    redis.call('HSET', KEYS[1], contact, value)
    redis.call('ZADD', KEYS[2], num(expires), contact)
  end
end

local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
if #last == 2 then
  local until_ms = num(tonumber(last[2]) + 10000)
  redis.call('PEXPIREAT', KEYS[1], until_ms)
  redis.call('PEXPIREAT', KEYS[2], until_ms)
else
  redis.call('DEL', KEYS[1], KEYS[2])
end

local out = {0, now}
flat = redis.call('HGETALL', KEYS[1])
for i = 1, #flat do out[#out + 1] = flat[i] end
return out
