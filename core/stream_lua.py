"""The Lua that core.stream runs inside Redis: each call one atomic round trip. Entry ids
are "<step>-<seq>" (core.stream.EntryId)."""

# KEYS: stream, attempt, cancel. ARGV: attempt, maxlen (0: no trim), live TTL ms, ended
# TTL ms, vouched ("1": a missing fence counts as 0), then (id, data) pairs in id order.
WRITE = """
local stream, attempt_key, cancel_key = KEYS[1], KEYS[2], KEYS[3]
local attempt, maxlen = tonumber(ARGV[1]), ARGV[2]
local fence = redis.call('GET', attempt_key)
if not fence and ARGV[5] ~= '1' then return -3 end
local current = tonumber(fence or '0')
if attempt < current then return -1 end
local function parse(id)
  local step, seq = string.match(id, '^(%d+)-(%d)$')
  return tonumber(step), tonumber(seq)
end
local last_step, last_seq = 0, 0
if redis.call('EXISTS', stream) == 1 then
  local info = redis.call('XINFO', 'STREAM', stream)
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then last_step, last_seq = parse(info[i + 1]) end
  end
end
if last_seq == 3 then return -2 end
local added, ended = 0, false
for i = 6, #ARGV, 2 do
  local step, seq = parse(ARGV[i])
  if seq == 2 and attempt > current then
    -- a new attempt resumes after `step`: what an earlier one wrote past it goes
    redis.call('SET', attempt_key, attempt)
    current = attempt
    if redis.call('EXISTS', stream) == 1 then
      local later = redis.call('XRANGE', stream, string.format('%d-2', step), '+')
      for _, e in ipairs(later) do redis.call('XDEL', stream, e[1]) end
      redis.call('XSETID', stream, string.format('%d-1', step))
      last_step, last_seq = step, 1
    end
  elseif seq == 3 and last_step > step then
    step = last_step
  end
  if step > last_step or (step == last_step and seq > last_seq) then
    local id = string.format('%d-%d', step, seq)
    if maxlen == '0' then
      redis.call('XADD', stream, id, 'data', ARGV[i + 1])
    else
      redis.call('XADD', stream, 'MAXLEN', '~', maxlen, id, 'data', ARGV[i + 1])
    end
    last_step, last_seq, added = step, seq, added + 1
  end
  if seq == 3 then
    ended = true
    break
  end
end
local ttl = ended and ARGV[4] or ARGV[3]
redis.call('PEXPIRE', stream, ttl)
redis.call('PEXPIRE', attempt_key, ttl)
if ended then redis.call('PEXPIRE', cancel_key, ttl) end
return added
"""

# KEYS: attempt. ARGV: attempt, TTL ms. The fence only ever rises; returns the fence now.
RAISE_FENCE = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local attempt = tonumber(ARGV[1])
if attempt > current then
  redis.call('SET', KEYS[1], attempt, 'PX', ARGV[2])
  return attempt
end
return current
"""
