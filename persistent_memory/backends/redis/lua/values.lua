-- Operations on a live session: info, delete, values, history.
--
-- Part of the backend's one script (redis.lua includes it); KEYS as listed there.
-- Keys used here: 1-4 the session, 15 the value key named (put, get, increment, clear of one key); a
-- whole-session clear or delete names its value keys from 2's members.

-- Operations on a live session -----------------------------------------------

on(function()
local err = check_live()
if err then return err end

if op == 'info' then
  return info()
elseif op == 'delete' then
  -- A key written over by hand (not of its type) goes first, so that the rest can be
  -- read; what only it named (a key set's value keys) the caller clears ('~damaged').
  local damaged = false
  for _, expected in ipairs({{KEYSET, 'set'}, {RUNS, 'zset'}, {base .. '~convs', 'set'}}) do
    local kind = redis.call('TYPE', expected[1]).ok
    if kind ~= expected[2] and kind ~= 'none' then
      redis.call('DEL', expected[1])
      damaged = true
    end
  end
  local keys = redis.call('SMEMBERS', KEYSET)
  purge_leftovers()
  redis.call('DEL', META)
  unindex(sid)
  mark_dirty()
  if damaged then
    keys[#keys + 1] = '~damaged'
  end
  return remember(keys)
elseif op == 'put' then
  local key = arg(1)
  local ok, total = fits({[key] = #arg(2)})
  if not ok then return too_big(total) end
  redis.call('SET', base .. key, arg(2))
  new_key(base .. key)
  if redis.call('SADD', KEYSET, key) > 0 then new_key(KEYSET) end
  record(history_entry('put', key))
  return remember(1)
elseif op == 'get' then
  if refresh_reads then touch() end
  local value = redis.call('GET', base .. arg(1))
  if not value then
    return fail('KEY_NOT_FOUND', "Session '" .. sid .. "' has no key '" .. arg(1) .. "'.")
  end
  return value
elseif op == 'get_all' then
  if refresh_reads then touch() end
  return values_object()
elseif op == 'keys' then
  return redis.call('SMEMBERS', KEYSET)
elseif op == 'increment' then
  local key = arg(1)
  local before = redis.call('GET', base .. key)
  local result, failure = add(key, arg(2))
  if failure then return failure end
  local ok, total = fits({[key] = redis.call('STRLEN', base .. key)})
  if not ok then
    restore_value(key, before)
    return too_big(total)
  end
  if not before then new_key(base .. key) end
  if redis.call('SADD', KEYSET, key) > 0 then new_key(KEYSET) end
  record(history_entry('increment', key))
  -- The stored text, not ``result``: a Lua number is a double, which above 2^53 is
  -- not the integer INCRBY stored.
  return remember(redis.call('GET', base .. key))
elseif op == 'clear' then
  local key = arg(1)
  local cleared
  if key == '' then
    cleared = redis.call('SMEMBERS', KEYSET)
    table.sort(cleared, bytewise)
    for _, member in ipairs(cleared) do
      redis.call('DEL', base .. member)
    end
    redis.call('DEL', KEYSET)
    record(history_entry('clear', nil, ', "cleared": ' .. json_list(cleared)))
  else
    cleared = {}
    if redis.call('DEL', base .. key) == 1 then
      cleared[1] = key
    end
    redis.call('SREM', KEYSET, key)
    record(history_entry('clear', key))
  end
  return remember(cleared)
elseif op == 'history' then
  local limit = tonumber(arg(1))
  if limit > 0 then
    return redis.call('LRANGE', HISTORY, -limit, -1)
  end
  return redis.call('LRANGE', HISTORY, 0, -1)
elseif op == 'summarize' then
  local folded = fold(tonumber(arg(1)))
  if folded > 0 then
    mark_dirty()
  end
  return remember(folded)
end

return fail('BAD_OPERATION', 'Unknown operation ' .. tostring(op))
end)
