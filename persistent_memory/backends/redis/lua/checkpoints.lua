-- Checkpoints (persistent_memory.backends.checkpoints): a session's graph checkpoints.
--
-- Part of the backend's one script (redis.lua includes it); KEYS as listed there.
-- A session's checkpoints live in
--   '{base}~cp'    hash: the entries, named as backends/checkpoints.py says ('c', 'l',
--                  'w', 'b' then '{ns}\31{id}', or '{ns}\31{channel}\31{version}')
--   '{base}~cpi'   sorted set, score 0: '{ns}\31{id}' of every checkpoint, so that a
--                  namespace's are one lexicographic range, oldest id first
-- The session's meta counts the entries' bytes ('cp_bytes': each entry's name and text,
-- as backends/checkpoints.py counts them), which count toward MAX_SESSION_BYTES with its
-- values and messages (fits(), sessions.lua): a write that would go over is refused before
-- anything is written; a removal gives its bytes back.
-- Keys used here: 1 meta and, through sessions.lua, the session's keys and indexes when a
-- put creates it; 17 and 18, those two. Every call on a session declares them (its other
-- operations name them from its base, the same names): every one expires with the
-- session and goes with it (purge_leftovers, touch).

local SEP, LINK_SEP, DELTA_SEP = '\31', '\30', '\29'

local function checkpoint_keys()
  return base .. '~cp', base .. '~cpi'
end

drop_checkpoints = function()
  redis.call('DEL', checkpoint_keys())
end

local function split(text, separator)
  local parts, start = {}, 1
  while true do
    local at = string.find(text, separator, start, true)
    if not at then
      parts[#parts + 1] = string.sub(text, start)
      return parts
    end
    parts[#parts + 1] = string.sub(text, start, at - 1)
    start = at + 1
  end
end

local function namespace_of_key(key)
  return string.match(key, '^(.*)' .. SEP)
end

-- A delta value's base reference and base id (nil: not a delta; see backends/checkpoints.py).
local function delta_base(text)
  if string.sub(text, 1, 2) ~= 'd' .. DELTA_SEP then return nil end
  local parts = split(text, DELTA_SEP)
  return parts[3], parts[4]
end

-- Whether a stored value's text is the whole or delta value ``id``.
local function has_id(text, id)
  if not text then return false end
  local kind = string.sub(text, 1, 1)
  return (kind == 'f' or kind == 'd') and string.sub(text, 2, #id + 3) == DELTA_SEP .. id .. DELTA_SEP
end

-- The entry names of value ``ref`` of namespace ``ns`` and of the values it extends, in
-- turn, up to one in ``known`` (a chain walked already: the rest of it is known too).
local function chain_names(entries, ns, ref, known)
  local names, seen = {}, {}
  known = known or {}
  while ref do
    local name = 'b' .. ns .. SEP .. ref
    if seen[name] or known[name] then break end
    local text = redis.call('HGET', entries, name)
    if not text then break end
    names[#names + 1] = name
    seen[name] = true
    ref = delta_base(text)
  end
  return names
end

-- Bytes of an entry held (0: none): its name's and its text's.
local function entry_size(entries, name)
  local size = redis.call('HSTRLEN', entries, name)
  if size > 0 or redis.call('HEXISTS', entries, name) == 1 then return #name + size end
  return 0
end

-- Bytes of the live session's entries: its meta's count, kept by every checkpoint write;
-- counted here once for a thread stored before the count was kept.
local function checkpoint_bytes_held(entries)
  local counted = tonumber(redis.call('HGET', META, 'cp_bytes'))
  if counted then return counted end
  local total = 0
  for _, name in ipairs(redis.call('HKEYS', entries)) do
    total = total + #name + redis.call('HSTRLEN', entries, name)
  end
  return total
end

-- The error reply (nil: there is room) when the session, its checkpoints at ``after``
-- bytes, would hold more than MAX_SESSION_BYTES; not ``live``: one the call creates (it
-- starts empty).
local function checkpoint_room(live, after)
  if byte_cap <= 0 then return nil end
  if not live then
    if after > byte_cap then return too_big(after) end
    return nil
  end
  local ok, total = fits({}, 0, false, after)
  if not ok then return too_big(total) end
  return nil
end

-- A checkpoint as the client reads it: its key, record, writes (false: none), then each
-- reference and its value (false: missing). nil when it is not stored.
local function checkpoint_reply(entries, key)
  local got = redis.call('HMGET', entries, 'c' .. key, 'l' .. key, 'w' .. key)
  if not got[1] then return nil end
  local reply = {key, got[1], got[3] or false}
  local refs = split(got[2] or '', LINK_SEP)
  if #refs > 1 then
    local ns, names = namespace_of_key(key), {}
    for i = 2, #refs do names[i - 1] = 'b' .. ns .. SEP .. refs[i] end
    local values = redis.call('HMGET', entries, unpack(names))
    for i = 2, #refs do
      reply[#reply + 1] = refs[i]
      reply[#reply + 1] = values[i - 1] or false
    end
  end
  return reply
end

-- Remove checkpoints (their keys), their writes, and values no checkpoint left references;
-- replies how many checkpoints and how many bytes went.
local function remove_checkpoints(entries, index, doomed)
  if #doomed == 0 then return 0, 0 end
  local names, freed = {}, 0
  for _, key in ipairs(doomed) do
    names[#names + 1] = 'c' .. key
    names[#names + 1] = 'l' .. key
    names[#names + 1] = 'w' .. key
  end
  for _, name in ipairs(names) do freed = freed + entry_size(entries, name) end
  call_chunked('HDEL', entries, names)
  call_chunked('ZREM', index, doomed)
  local referenced = {}
  local kept = redis.call('ZRANGE', index, 0, -1)
  for _, key in ipairs(kept) do
    local ns = namespace_of_key(key)
    local refs = split(redis.call('HGET', entries, 'l' .. key) or '', LINK_SEP)
    for i = 2, #refs do
      for _, name in ipairs(chain_names(entries, ns, refs[i], referenced)) do referenced[name] = true end
    end
  end
  local unreferenced = {}
  for _, name in ipairs(redis.call('HKEYS', entries)) do
    if string.sub(name, 1, 1) == 'b' and not referenced[name] then
      unreferenced[#unreferenced + 1] = name
      freed = freed + entry_size(entries, name)
    end
  end
  if #unreferenced > 0 then call_chunked('HDEL', entries, unreferenced) end
  return #doomed, freed
end

-- For snapshot and restore (maintenance.lua): every entry, flat; write entries given as
-- one JSON object text (and their bytes in the meta, created first), replying the keys
-- written.
checkpoints_snapshot = function()
  return redis.call('HGETALL', (checkpoint_keys()))
end

restore_checkpoints = function(blob)
  local entries, index = checkpoint_keys()
  redis.call('DEL', entries, index)
  if blob == '' then return {} end
  local fields, keys, size = {}, {}, 0
  for name, text in pairs(cjson.decode(blob)) do
    fields[#fields + 1] = name
    fields[#fields + 1] = text
    size = size + #name + #text
    if string.sub(name, 1, 1) == 'c' then
      keys[#keys + 1] = 0
      keys[#keys + 1] = string.sub(name, 2)
    end
  end
  if #fields == 0 then return {} end
  call_chunked('HSET', entries, fields)
  if #keys > 0 then call_chunked('ZADD', index, keys) end
  redis.call('HSET', META, 'cp_bytes', size)
  return {entries, index}
end

local function checkpoints_live_or_create(ttl_text, ttl_ms)
  if redis.call('EXISTS', META) == 1 then return nil end
  purge_leftovers()
  if not owner_has_room() then return no_room() end
  create(now, ttl_text, ttl_ms, default_idle_ms)
  return nil
end

-- Store a checkpoint: arg(1) namespace, 2 id, 3 record, 4 link, 5 ttl text, 6 ttl ms,
-- then (reference, value) pairs of the new channel values. Creates the session when
-- it is not live.
on({'cp_put'}, function()
if op == 'cp_put' then
  local entries, index = KEYS[17], KEYS[18]
  local ns, key = arg(1), arg(1) .. SEP .. arg(2)
  -- Every delta extends a value held (or given), checked before anything is written.
  local live, given = redis.call('EXISTS', META) == 1, {}
  for i = 7, #ARGV - 16, 2 do given[arg(i)] = arg(i + 1) end
  for ref, text in pairs(given) do
    local base_ref, base_id = delta_base(text)
    local base = base_ref and (given[base_ref] or (live and redis.call('HGET', entries, 'b' .. ns .. SEP .. base_ref)))
    if base_ref and not has_id(base, base_id) then
      return fail('CHECKPOINT_BASE', "The value of '" .. ref .. "' extends a value this thread does not hold.")
    end
  end
  local fields = {'c' .. key, arg(3), 'l' .. key, arg(4)}
  local i = 7
  while arg(i) do
    fields[#fields + 1] = 'b' .. ns .. SEP .. arg(i)
    fields[#fields + 1] = arg(i + 1)
    i = i + 2
  end
  -- Room for them, checked before anything is written (a new session starts empty).
  local after = live and checkpoint_bytes_held(entries) or 0
  for j = 1, #fields, 2 do
    after = after + #fields[j] + #fields[j + 1] - (live and entry_size(entries, fields[j]) or 0)
  end
  local failure = checkpoint_room(live, after) or checkpoints_live_or_create(arg(5), arg(6))
  if failure then return failure end
  call_chunked('HSET', entries, fields)
  redis.call('HSET', META, 'cp_bytes', after)
  redis.call('ZADD', index, 0, key)
  new_key(entries)
  new_key(index)
  mark_dirty()
  return remember(1)
end
end)

-- Merge a task's writes: arg(1) namespace, 2 id, 3 the writes' JSON list of
-- [task_id, idx, channel, value, task_path] (backends.checkpoints.merge_writes' rule), 4
-- ttl text, 5 ttl ms. Creates the session when it is not live (LangGraph may save a
-- task's writes before the checkpoint they belong to).
on({'cp_writes'}, function()
if op == 'cp_writes' then
  local entries, live = KEYS[17], redis.call('EXISTS', META) == 1
  local name = 'w' .. arg(1) .. SEP .. arg(2)
  local stored = live and redis.call('HGET', entries, name)
  local merged, where = stored and cjson.decode(stored) or {}, {}
  for i, item in ipairs(merged) do where[item[1] .. SEP .. item[2]] = i end
  for _, item in ipairs(cjson.decode(arg(3))) do
    local at = where[item[1] .. SEP .. item[2]]
    if not at then
      merged[#merged + 1] = item
      where[item[1] .. SEP .. item[2]] = #merged
    elseif item[2] < 0 then
      merged[at] = item
    end
  end
  local text = cjson.encode(merged)
  local after = (live and checkpoint_bytes_held(entries) or 0) + #name + #text - (stored and #name + #stored or 0)
  local failure = checkpoint_room(live, after) or checkpoints_live_or_create(arg(4), arg(5))
  if failure then return failure end
  redis.call('HSET', entries, name, text)
  redis.call('HSET', META, 'cp_bytes', after)
  new_key(entries)
  mark_dirty()
  return remember(1)
end
end)

on({'cp_get', 'cp_list', 'cp_entries', 'cp_prune', 'cp_chain'}, function()
if op == 'cp_get' or op == 'cp_list' or op == 'cp_entries' or op == 'cp_prune' or op == 'cp_chain' then
  if redis.call('EXISTS', META) == 0 then
    return 0 -- no thread (or one whose time is up): nothing to read or prune
  end
  if refresh_reads and op ~= 'cp_prune' then touch() end
end
end)

-- One checkpoint: arg(1) namespace, 2 id ('': the newest of the namespace). 0: none.
on({'cp_get'}, function()
if op == 'cp_get' then
  local key = arg(1) .. SEP .. arg(2)
  if arg(2) == '' then
    key = redis.call('ZREVRANGEBYLEX', KEYS[18], '(' .. arg(1) .. ' ', '(' .. arg(1) .. SEP, 'LIMIT', 0, 1)[1]
    if not key then return 0 end
  end
  return checkpoint_reply(KEYS[17], key) or 0
end
end)

-- The value of arg(2) in namespace arg(1) and the values it extends, in turn.
on({'cp_chain'}, function()
if op == 'cp_chain' then
  local entries, texts = KEYS[17], {}
  for _, name in ipairs(chain_names(entries, arg(1), arg(2))) do texts[#texts + 1] = redis.call('HGET', entries, name) end
  return texts
end
end)

-- Checkpoints newest first within a namespace: arg(1) namespace, 2 '1' for every
-- namespace (then 1 is ignored), 3 ids below this only ('': all), 4 offset, 5 count.
on({'cp_list'}, function()
if op == 'cp_list' then
  local entries, index, ns, before = KEYS[17], KEYS[18], arg(1), arg(3)
  local offset, count = tonumber(arg(4)), tonumber(arg(5))
  local keys
  if arg(2) ~= '1' then
    local top = before ~= '' and ('(' .. ns .. SEP .. before) or ('(' .. ns .. ' ')
    keys = redis.call('ZREVRANGEBYLEX', index, top, '(' .. ns .. SEP, 'LIMIT', offset, count)
  elseif before == '' then
    keys = redis.call('ZREVRANGE', index, offset, offset + count - 1)
  else
    keys = {}
    local skipped = 0
    for _, key in ipairs(redis.call('ZREVRANGE', index, 0, -1)) do
      if #keys >= count then break end
      if string.sub(key, #namespace_of_key(key) + 2) < before then
        if skipped < offset then skipped = skipped + 1 else keys[#keys + 1] = key end
      end
    end
  end
  local reply = {}
  for _, key in ipairs(keys) do reply[#reply + 1] = checkpoint_reply(entries, key) end
  return reply
end
end)

-- Every entry, flat (name, value) pairs.
on({'cp_entries'}, function()
if op == 'cp_entries' then
  return redis.call('HGETALL', KEYS[17])
end
end)

-- arg(1) 'latest': keep the newest checkpoint of each namespace; 'runs': remove those of
-- the run ids that follow. Replies how many were removed.
on({'cp_prune'}, function()
if op == 'cp_prune' then
  local entries, index = KEYS[17], KEYS[18]
  local keys, doomed = redis.call('ZRANGE', index, 0, -1), {}
  if arg(1) == 'latest' then
    local newest = {}
    for _, key in ipairs(keys) do newest[namespace_of_key(key)] = key end
    for _, key in ipairs(keys) do
      if newest[namespace_of_key(key)] ~= key then doomed[#doomed + 1] = key end
    end
  else
    local runs, i = {}, 2
    while arg(i) do
      runs[arg(i)] = true
      i = i + 1
    end
    for _, key in ipairs(keys) do
      local link_text = redis.call('HGET', entries, 'l' .. key) or ''
      if runs[split(link_text, LINK_SEP)[1]] then doomed[#doomed + 1] = key end
    end
  end
  local held = checkpoint_bytes_held(entries)
  local removed, freed = remove_checkpoints(entries, index, doomed)
  if removed > 0 then
    redis.call('HSET', META, 'cp_bytes', held - freed)
    mark_dirty()
  end
  return remember(removed)
end
end)

-- Add entries: arg(1) ttl text, 2 ttl ms, 3 'replace' to put them in place of the
-- session's (else ''), then (name, value) pairs. Creates the session when it is not live.
on({'cp_load'}, function()
if op == 'cp_load' then
  local entries, index = KEYS[17], KEYS[18]
  local live, replace = redis.call('EXISTS', META) == 1, arg(3) == 'replace'
  local adding = live and not replace -- to the entries held: those it overwrites give their bytes back
  local after = adding and checkpoint_bytes_held(entries) or 0
  local fields, keys, i = {}, {}, 4
  while arg(i) do
    fields[#fields + 1] = arg(i)
    fields[#fields + 1] = arg(i + 1)
    after = after + #arg(i) + #arg(i + 1) - (adding and entry_size(entries, arg(i)) or 0)
    if string.sub(arg(i), 1, 1) == 'c' then
      keys[#keys + 1] = 0
      keys[#keys + 1] = string.sub(arg(i), 2)
    end
    i = i + 2
  end
  local failure = checkpoint_room(live, after) or checkpoints_live_or_create(arg(1), arg(2))
  if failure then return failure end
  -- Not a DEL of nothing: see purge_leftovers (sessions.lua) on Redis at its maxmemory.
  if replace and redis.call('EXISTS', entries, index) > 0 then redis.call('DEL', entries, index) end
  if #fields > 0 then call_chunked('HSET', entries, fields) end
  redis.call('HSET', META, 'cp_bytes', after)
  if #keys > 0 then call_chunked('ZADD', index, keys) end
  new_key(entries)
  new_key(index)
  mark_dirty()
  return remember(1)
end
end)
