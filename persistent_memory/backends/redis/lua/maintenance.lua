-- Maintenance: the sweep (sweep_ids, sweep_keys), and whole sessions for export, import
-- and the mirror (restore, snapshot).
--
-- Part of the backend's one script (redis.lua includes it); KEYS as listed there.
-- Keys used here: 6, 8, 9 the sets swept; from 28 on, the keys a sweep was given (ids' metas
-- and listings, or the SCAN results of this bucket and their sessions' metas); restore and
-- snapshot: 1-5, 17-18 and, declared from 28 on, the value and conversation keys restored.

-- The sweep of ids the client read from a set (one SSCAN or ZSCAN step): each id still in
-- the set whose meta is gone is removed from the indexes, checked and removed in one
-- atomic step, so a session created meanwhile is never touched. arg(1) '1' for a dry run,
-- 2 the set's place in KEYS (8 the node's set, 9 the owned set, 6 a listing by time: a
-- sorted set), then the ids; each id's meta and its namespace's listing are declared
-- (from KEYS[28] on). A live session the listing lacks (one the node wrote) is indexed.
-- Over the unowned listing (6) it leaves the ids in the node's set to the pass over that
-- set, so that none is counted twice. Replies how many ids had no live session.
on({'sweep_ids'}, function()
if op == 'sweep_ids' then
  local set, listing = KEYS[tonumber(arg(2))], arg(2) == '6'
  local removed, i = 0, 3
  while arg(i) do
    local id = arg(i)
    local meta = root .. ':' .. id .. ':__meta__'
    local held
    if listing then held = redis.call('ZSCORE', set, id) else held = redis.call('SISMEMBER', set, id) == 1 end
    if not held then
      -- left the set since the client read it
    elseif listing and not namespace_of(id) and redis.call('SISMEMBER', NODE_SESSIONS, id) == 1 then
      -- read by the pass over the node's set
    elseif redis.call('EXISTS', meta) == 0 then
      removed = removed + 1
      if arg(1) ~= '1' then
        unindex(id)
        mark_dirty(id)
      end
    elseif arg(1) ~= '1' and not redis.call('ZSCORE', (listing_sets(id)), id) then
      index(id, redis.call('HGET', meta, 'created_at'))
    end
    i = i + 1
  end
  return removed
end
end)

-- Keys found by a SCAN, KEYS[28] to KEYS[27 + n], each with its kind (arg(2 + i): 'b' a
-- run binding, 'i' a session's run index, 'k' another key of a session, '' none of a
-- session's, such as an idempotency record) and its session's meta at KEYS[27 + n + i]
-- (the client parses the names: persistent_memory.backends.redis.layout.swept). Keys of
-- sessions whose meta is gone are removed; a binding's session is the one it names.
-- arg(1) '1' for a dry run, 2 n. Replies the leftover keys and run bindings.
on({'sweep_keys'}, function()
if op == 'sweep_keys' then
  local leftovers, runs, n = 0, 0, tonumber(arg(2))
  for i = 1, n do
    local key, kind, meta = KEYS[27 + i], arg(2 + i), KEYS[27 + n + i]
    if kind == 'b' then
      -- named from what the binding holds: the documented exception (redis-layout.md)
      local owner = binding(redis.call('GET', key))
      meta = owner and root .. ':' .. owner .. ':__meta__'
    end
    if kind ~= '' and meta and redis.call('EXISTS', meta) == 0 then
      if kind == 'b' then runs = runs + 1 else leftovers = leftovers + 1 end
      if arg(1) ~= '1' then
        redis.call('DEL', key)
      end
    elseif kind == 'i' and arg(1) ~= '1' then
      -- A live session's index: references whose binding has expired go.
      redis.call('ZREMRANGEBYSCORE', key, '-inf', server_ms())
    end
  end
  return {leftovers, runs}
end
end)

-- A whole session as exported: arg(1) '1' to replace a live one, 2 created_at,
-- 3 ttl_seconds text, 4 remaining ms ('0': none), 5 its conversations as one JSON text
-- (see restore_conversations), 6 its idle TTL in ms and the ms left to its fixed
-- deadline, space-separated ('' for no idle TTL; the deadline may be left out), 7 its
-- checkpoint entries as one JSON object text ('': none), 8 number of values, then that
-- many key/JSON pairs, then the history entries.
on({'restore'}, function()
if op == 'restore' then
  if redis.call('EXISTS', META) == 1 and arg(1) ~= '1' then
    return fail('EXISTS', "Session '" .. sid .. "' already exists.")
  end
  if not owner_has_room() then return no_room() end
  redis.call('DEL', META)
  local expires = create(arg(2), arg(3), arg(4))
  if arg(6) ~= '' then
    local idle, left = string.match(arg(6), '^(%d+) ?(%d*)$')
    redis.call('HSET', META, 'idle_ttl_ms', idle)
    -- From the clock the expiry was set from (not a later TIME): a deadline given as the
    -- same time left is the same instant, so expires_by reads as on the source.
    local clock = expires > 0 and expires - tonumber(arg(4)) or server_ms()
    if left ~= '' then redis.call('HSET', META, 'deadline_ms', clock + tonumber(left)) end
  end
  local n = tonumber(arg(8))
  local keys = restore_conversations(arg(5))
  for _, key in ipairs(restore_checkpoints(arg(7))) do keys[#keys + 1] = key end
  for i = 0, n - 1 do
    local key = arg(9 + 2 * i)
    keys[#keys + 1] = base .. key
    redis.call('SET', base .. key, arg(10 + 2 * i))
    redis.call('SADD', KEYSET, key)
  end
  local first = 9 + 2 * n
  local i = first
  while arg(i) do
    redis.call('RPUSH', HISTORY, arg(i))
    i = i + 1
  end
  if expires > 0 then
    keys[#keys + 1] = KEYSET
    keys[#keys + 1] = HISTORY
    for _, key in ipairs(keys) do
      redis.call('PEXPIREAT', key, expires)
    end
  end
  return 1
end
end)

-- Read without side effects, for the mirror: 0 when the session is not live. arg(1)
-- '1': with its checkpoint entries (export and relayout; the mirror has no use for them).
on({'snapshot'}, function()
if op == 'snapshot' then
  if redis.call('EXISTS', META) == 0 then
    return 0
  end
  local reply = {info(), all_values(), redis.call('LRANGE', HISTORY, 0, -1), conversations_snapshot()}
  if arg(1) == '1' then reply[5] = checkpoints_snapshot() end
  return reply
end
end)
