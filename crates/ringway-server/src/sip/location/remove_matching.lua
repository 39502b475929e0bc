-- ringway: remove the bindings of one address-of-record whose stored value
-- holds a text: the flow of a closed connection, or the Path of an edge
-- proxy that answered 430 (redis.rs builds the text; see remove_flow and
-- remove_path there).
-- KEYS[1] bindings hash, KEYS[2] expiry index (see register.lua).
-- ARGV[1] the text, a part of the binding's JSON exactly as register.lua
-- stored it (the Rust side writes both with one serializer), so a plain
-- substring match finds the bindings without decoding 64-bit numbers into
-- Lua's doubles. JSON strings escape every quote, so a text starting with a
-- quoted field name cannot match inside a Call-ID or a Path value.
-- Returns the number of bindings removed.
local needle = ARGV[1]
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
