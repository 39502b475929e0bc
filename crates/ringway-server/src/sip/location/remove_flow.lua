-- ringway: remove the bindings of one address-of-record registered over
-- one flow (its connection closed, or its keepalives went unanswered).
-- KEYS[1] bindings hash, KEYS[2] expiry index (see register.lua).
-- ARGV[1] the flow as JSON, exactly as register.lua stored it after "f":
-- (transport, address, connection and node; the Rust side writes both
-- with one serializer), so a plain substring match finds its bindings
-- without decoding 64-bit numbers into Lua's doubles. JSON strings escape
-- every quote, so the match cannot start inside a Call-ID or a Path.
-- Returns the number of bindings removed.
local needle = '"f":' .. ARGV[1] .. ','
local removed = 0
local flat = redis.call('HGETALL', KEYS[1])
for i = 1, #flat, 2 do
  if string.find(flat[i + 1], needle, 1, true) then
    redis.call('HDEL', KEYS[1], flat[i])
    redis.call('ZREM', KEYS[2], flat[i])
    removed = removed + 1
  end
end
if removed > 0 and redis.call('HLEN', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[1], KEYS[2])
end
return removed
