-- ringway: remove the bindings of one address-of-record registered
-- through one Path (an edge proxy on it answered 430 Flow Failed: the flow
-- its token names is gone, RFC 5626 section 7).
-- KEYS[1] bindings hash, KEYS[2] expiry index (see register.lua).
-- ARGV[1] the Path as a JSON array, exactly as register.lua stored it
-- after "p": (the Rust side writes both with one serializer), followed in
-- the stored value by ',"f":', so a plain substring match finds exactly
-- the bindings of that Path (not a longer one). JSON strings escape every
-- quote, so the match cannot start inside a Call-ID or a Path value.
-- Returns the number of bindings removed.
local needle = '"p":' .. ARGV[1] .. ',"f":'
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
