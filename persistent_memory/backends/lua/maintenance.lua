-- Maintenance: the sweep (sweep_ids, sweep_keys), and whole sessions for export, import
-- and the mirror (restore, snapshot).
--
-- Part of the backend's one script (redis.lua includes it); KEYS as listed there.
-- Keys used here: 6, 8, 9 the sets swept; 26 on, the keys a sweep was given (SCAN results of this
-- bucket); restore and snapshot: 1-5 and, declared from 26 on, the value, conversation
-- and checkpoint keys restored.

-- The sweep of a set of ids, one SSCAN (ZSCAN) step at a time, read here so that the ids
-- come from Redis, not from the caller: check and remove in one atomic step, so a
-- session created meanwhile is never touched. arg(1) '1' for a dry run, 2 the set's
-- place in KEYS (8 the node's set, 9 the owned set, 6 a listing by time: a sorted set),
-- 3 the cursor, 4 the COUNT, 5 a MATCH pattern ('': all). A live session the listing
-- lacks (one the node wrote) is indexed. Over the unowned listing (6) it leaves the ids
-- in the node's set to the pass over that set, so that none is counted twice. Replies
-- the next cursor and how many ids had no live session.
if op == 'sweep_ids' then
  local set, listing = KEYS[tonumber(arg(2))], arg(2) == '6'
  local command = {listing and 'ZSCAN' or 'SSCAN', set, arg(3), 'COUNT', arg(4)}
  if arg(5) ~= '' then
    command[#command + 1] = 'MATCH'
    command[#command + 1] = arg(5)
  end
  local scanned = redis.call(unpack(command))
  local removed = 0
  for j, id in ipairs(scanned[2]) do
    local meta = root .. ':' .. id .. ':__meta__'
    if listing and j % 2 == 0 then
      -- a score
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
  end
  return {scanned[1], removed}
end

-- Keys found by a SCAN (declared, from KEYS[26] on): those of sessions whose meta is gone
-- are removed. arg(1) '1' for a dry run. Replies the leftover keys and run bindings.
if op == 'sweep_keys' then
  local leftovers, runs = 0, 0
  for i = 26, #KEYS do
    local key = KEYS[i]
    local rest = string.sub(key, #root + 2)
    -- Only keys of this deployment's layout: "{id}:{key}" (id unowned or owned) or a
    -- run binding, "~run:{run id}" or "~o:{owner}~:run:{run id}". Anything else (another
    -- deployment whose prefix starts with ours) is not ours to touch. Idempotency
    -- records, "~idem:{key}" and "~o:{owner}~:idem:{key}", belong to no session and
    -- expire on their own: never leftovers. A session's run index, "{id}:~runs", is
    -- one of its keys too.
    local idempotency_record = string.match(rest, '^~idem:') or string.match(rest, '^~o:[^~]+~:idem:')
    local owner, name
    local run_id = string.match(rest, '^~run:([%w_%-]+)$') or string.match(rest, '^~o:[^~]+~:run:([%w_%-]+)$')
    if run_id then
      owner = binding(redis.call('GET', key))
    elseif not idempotency_record then
      local id
      id, name = string.match(rest, '^(.+):([%w_%.%-]+)$')
      if not id then
        id, name = string.match(rest, '^(.+):(~runs)$')
      end
      if not id then -- a session's checkpoints: '{id}:~cp' and '{id}:~cpi'
        id, name = string.match(rest, '^(.+):(~cpi?)$')
      end
      -- A conversation's keys: '{id}:~convs' and '{id}:~c:{name}' with ':m' and the like.
      local conversation_of = string.match(rest, '^(~o:[^~]+~[%w_%-]+):~c')
        or string.match(rest, '^([%w_%-]+):~c')
      if conversation_of then
        id, name = conversation_of, '~conversation'
      end
      if id and name ~= '__sessions__'
        and (string.match(id, '^[%w_%-]+$') or string.match(id, '^~o:[^~]+~[%w_%-]+$')) then
        owner = id
      end
    end
    if owner and redis.call('EXISTS', root .. ':' .. owner .. ':__meta__') == 0 then
      if run_id then runs = runs + 1 else leftovers = leftovers + 1 end
      if arg(1) ~= '1' then
        redis.call('DEL', key)
      end
    elseif owner and name == '~runs' and arg(1) ~= '1' then
      -- A live session's index: references whose binding has expired go.
      redis.call('ZREMRANGEBYSCORE', key, '-inf', server_ms())
    end
  end
  return {leftovers, runs}
end

-- A whole session as exported: arg(1) '1' to replace a live one, 2 created_at,
-- 3 ttl_seconds text, 4 remaining ms ('0': none), 5 its conversations as one JSON text
-- (see restore_conversations), 6 its idle TTL in ms and the ms left to its fixed
-- deadline, space-separated ('' for no idle TTL; the deadline may be left out), 7 its
-- checkpoint entries as one JSON object text ('': none), 8 number of values, then that
-- many key/JSON pairs, then the history entries.
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

-- Read without side effects, for the mirror: 0 when the session is not live. arg(1)
-- '1': with its checkpoint entries (export and relayout; the mirror has no use for them).
if op == 'snapshot' then
  if redis.call('EXISTS', META) == 0 then
    return 0
  end
  local reply = {info(), all_values(), redis.call('LRANGE', HISTORY, 0, -1), conversations_snapshot()}
  if arg(1) == '1' then reply[5] = checkpoints_snapshot() end
  return reply
end
