-- ringway: the live bindings of one address-of-record, in one round trip.
-- KEYS[1] bindings hash, KEYS[2] expiry index (see register.lua).
-- Returns {0, now_ms, contact, value, contact, value, ...}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. string.format('%.0f', now), '+inf')
local out = {0, now}
if #live > 0 then
  local values = redis.call('HMGET', KEYS[1], unpack(live))
  for i, contact in ipairs(live) do
    out[#out + 1] = contact
    out[#out + 1] = values[i]
  end
end
return out
