-- Sessions and values: creating, indexing, checking and summarizing a session's history.
--
-- Part of the backend's one script (redis.lua includes it); KEYS as listed there.
-- Keys used here: 1 meta, 2 key set, 3 history, 4 run index, 6-7 its namespace's listing (as BY_TIME and from
-- listing_sets), 8 node set, 9 owned set, 10 dirty set; value keys named from the key set's
-- members, and a run index's bindings, under the declared root.

-- Lua's < on strings follows the server's locale (strcoll); Python sorts by code
-- point, which for UTF-8 is byte order. Sorts that end up in stored data use this.
local function bytewise(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x < y
    end
  end
  return #a < #b
end

local function fail(code, message)
  return redis.error_reply('PM_' .. code .. ' ' .. message)
end

-- The mirror syncs the sessions in this set (once per session and call is enough).
local marked = {}
local function mark_dirty(id)
  id = id or sid
  if track_dirty and not marked[id] then
    redis.call('SADD', DIRTY, id)
    marked[id] = true
  end
end

-- ``created_at`` is the meta's text (the node writes str(time.time())).
local function index(id, created_at)
  local by_time, by_name = listing_sets(id)
  redis.call('ZADD', by_time, tonumber(created_at) or 0, id)
  redis.call('ZADD', by_name, 0, id)
  if namespace_of(id) then
    redis.call('SADD', OWNED, id)
  else
    redis.call('SADD', NODE_SESSIONS, id)
  end
end

-- 1 when the id was indexed.
local function unindex(id)
  local by_time, by_name = listing_sets(id)
  redis.call('ZREM', by_name, id)
  local was = redis.call('ZREM', by_time, id)
  if namespace_of(id) then
    redis.call('SREM', OWNED, id)
    return was
  end
  return math.max(was, redis.call('SREM', NODE_SESSIONS, id))
end

-- The current session's run bindings go with it (a reference since bound to another
-- session is left alone), so that no answer reaches a session created later under
-- the same id through a run of the one before.
local function drop_runs()
  for _, ref in ipairs(redis.call('ZRANGE', RUNS, 0, -1)) do
    if binding(redis.call('GET', run_key(ref))) == sid then
      redis.call('DEL', run_key(ref))
    end
  end
  redis.call('DEL', RUNS)
end

-- Keys of a session whose meta is gone (expired, deleted, or left by a crash) are
-- removed so that a session created again under the same id starts empty.
local function purge_leftovers()
  -- Nothing left, no DEL: Redis at its maxmemory (noeviction) refuses a script's first
  -- write that needs memory, but lets every write through once the script has written
  -- anything, and a DEL of nothing counts: a new session would then be created while
  -- every other write answers OOM.
  if redis.call('EXISTS', KEYSET, HISTORY, RUNS, base .. '~convs', base .. '~cp') == 0 then
    return
  end
  for _, member in ipairs(redis.call('SMEMBERS', KEYSET)) do
    redis.call('DEL', base .. member)
  end
  redis.call('DEL', KEYSET, HISTORY)
  drop_runs()
  drop_conversations()
  drop_checkpoints()
end

-- Whether any index holds the id (what unindex would remove), by reads alone.
local function indexed(id)
  local by_time, by_name = listing_sets(id)
  if redis.call('ZSCORE', by_time, id) or redis.call('ZSCORE', by_name, id) then
    return true
  end
  return redis.call('SISMEMBER', namespace_of(id) and OWNED or NODE_SESSIONS, id) == 1
end

-- nil when the session is live, else the error reply to return.
local function check_live()
  if redis.call('EXISTS', META) == 1 then
    return nil
  end
  if read_only and not indexed(sid) then -- nothing to clean up: a read stays a read
    return fail('NOT_FOUND', "Session '" .. sid .. "' not found.")
  end
  if unindex(sid) == 1 then
    purge_leftovers()
    mark_dirty()
    return fail('EXPIRED', "Session '" .. sid .. "' has expired.")
  end
  return fail('NOT_FOUND', "Session '" .. sid .. "' not found.")
end

-- How info() reports an idle TTL: "{idle ms} {fixed deadline, epoch ms, or nothing}".
local function idle_spec(idle, deadline)
  return string.format('%d', idle) .. ' ' .. (deadline and string.format('%d', deadline) or '')
end

-- Returns when the new session expires, in epoch ms (-1: never). The expiry is set
-- as an absolute time and reported from it, not read back: a 1 ms TTL may be over
-- before the next command of this script runs. ``idle_ms`` ('0' or nil: none) is the
-- idle TTL; the session then expires at whichever comes first. Also returns the idle
-- TTL as info() reports it.
local function create(created_at, ttl_text, ttl_ms, idle_ms)
  purge_leftovers()
  index(sid, created_at)
  redis.call('HSET', META, 'created_at', created_at, 'ttl_seconds', ttl_text)
  mark_dirty()
  local at, clock = -1, server_ms()
  if tonumber(ttl_ms) > 0 then
    at = clock + tonumber(ttl_ms)
  end
  local idle, spec = tonumber(idle_ms) or 0, ''
  if idle > 0 then
    redis.call('HSET', META, 'idle_ttl_ms', idle)
    spec = idle_spec(idle, at > 0 and at or nil)
    if at > 0 then
      redis.call('HSET', META, 'deadline_ms', at)
    end
    if at < 0 or clock + idle < at then
      at = clock + idle
    end
  end
  if at > 0 then
    redis.call('PEXPIREAT', META, at)
  end
  return at, spec
end

-- Whether the owner of the current (owned) session may hold it: an id already in its
-- index keeps its place. Ids of expired sessions stay indexed until swept, so at the
-- cap they are dropped first and the index counted again. In the cluster layout an
-- owner's sessions are in many buckets: ``owner_elsewhere`` is how many are in the
-- others, and when the client has not counted them (nil) a call that would create a
-- session asks it to (PM_ROOM_CHECK, see no_room) before anything is written.
local function prune_owner_index()
  for _, id in ipairs(redis.call('ZRANGE', BY_TIME, 0, -1)) do
    if redis.call('EXISTS', root .. ':' .. id .. ':__meta__') == 0 then
      unindex(id)
      mark_dirty(id)
    end
  end
end

local function owner_has_room()
  if owner_cap <= 0 or not namespace_of(sid) or redis.call('ZSCORE', BY_TIME, sid) then
    return true
  end
  if not owner_elsewhere then
    return false
  end
  local limit = owner_cap - owner_elsewhere
  if redis.call('ZCARD', BY_TIME) < limit then
    return true
  end
  prune_owner_index()
  return redis.call('ZCARD', BY_TIME) < limit
end

local function no_room()
  if not owner_elsewhere then
    return fail('ROOM_CHECK', 'Count the owner\'s sessions in the other buckets.')
  end
  return fail('QUOTA', 'This owner holds its maximum of ' .. owner_cap .. ' sessions (MAX_SESSIONS_PER_OWNER).')
end

-- Whether the session's keys and values, its conversations' messages and its checkpoints'
-- entries stay within the byte cap once the values in ``sizes`` (key -> new length) and
-- ``extra`` bytes of new messages are written: the same count as the memory backend.
-- ``complete``: ``sizes`` holds every key's (values the call has read anyway), so none is
-- looked up. ``checkpoints``: the checkpoints' bytes after the call (nil: as its meta
-- counts them now, see checkpoints.lua).
local function fits(sizes, extra, complete, checkpoints)
  if byte_cap <= 0 then
    return true
  end
  checkpoints = checkpoints or tonumber(redis.call('HGET', META, 'cp_bytes')) or 0
  local total = (extra or 0) + conversation_bytes() + checkpoints
  for key, size in pairs(sizes) do
    total = total + #key + size
  end
  if not complete then
    for _, key in ipairs(redis.call('SMEMBERS', KEYSET)) do
      if not sizes[key] then
        total = total + #key + redis.call('STRLEN', base .. key)
      end
    end
  end
  return total <= byte_cap, total
end

-- Put back a value as it was before this call (false: it did not exist).
local function restore_value(key, before)
  if before then
    redis.call('SET', base .. key, before, 'KEEPTTL')
  else
    redis.call('DEL', base .. key)
  end
end

local function too_big(total)
  return fail('QUOTA', 'The session would hold ' .. string.format('%d', total)
    .. ' bytes, over MAX_SESSION_BYTES (' .. string.format('%d', byte_cap) .. ').')
end

local function json_list(items)
  if #items == 0 then
    return '[]' -- cjson would write an empty table as {}
  end
  local parts = {}
  for i, item in ipairs(items) do
    parts[i] = cjson.encode(item)
  end
  return '[' .. table.concat(parts, ', ') .. ']'
end

local function history_entry(entry_op, key, extra)
  local key_json = key and cjson.encode(key) or 'null'
  return '{"op": "' .. entry_op .. '", "key": ' .. key_json .. (extra or '') .. ', "timestamp": ' .. now .. '}'
end

-- The rule of persistent_memory.history.fold, kept in step with it. ``length`` is
-- the history's length when the caller knows it.
local function fold(max_entries, length)
  length = length or redis.call('LLEN', HISTORY)
  if length <= max_entries then
    return 0
  end
  local keep = math.floor(max_entries / 2)
  local count, op_counts, touched = 0, {}, {}
  for _, raw in ipairs(redis.call('LRANGE', HISTORY, 0, length - keep - 1)) do
    local ok, item = pcall(cjson.decode, raw)
    if not ok or type(item) ~= 'table' then
      item = {}
    end
    if item.op == 'summary' then
      count = count + (tonumber(item.summarized_count) or 1)
      if type(item.op_counts) == 'table' then
        for name, n in pairs(item.op_counts) do
          op_counts[name] = (op_counts[name] or 0) + (tonumber(n) or 0)
        end
      end
      if type(item.keys_touched) == 'table' then
        for _, key in ipairs(item.keys_touched) do
          if type(key) == 'string' then touched[key] = true end
        end
      end
    else
      count = count + 1
      local name = type(item.op) == 'string' and item.op or 'unknown'
      op_counts[name] = (op_counts[name] or 0) + 1
      if type(item.key) == 'string' and item.key ~= '' then touched[item.key] = true end
    end
  end
  local names, keys = {}, {}
  for name in pairs(op_counts) do names[#names + 1] = name end
  for key in pairs(touched) do keys[#keys + 1] = key end
  table.sort(names, bytewise)
  table.sort(keys, bytewise)
  local counts = {}
  for i, name in ipairs(names) do
    counts[i] = cjson.encode(name) .. ': ' .. string.format('%d', op_counts[name])
  end
  local summary = '{"op": "summary", "summarized_count": ' .. string.format('%d', count)
    .. ', "op_counts": {' .. table.concat(counts, ', ') .. '}, "keys_touched": ' .. json_list(keys)
    .. ', "timestamp": ' .. now .. '}'
  if keep > 0 then
    redis.call('LTRIM', HISTORY, length - keep, -1)
  else
    redis.call('DEL', HISTORY)
    new_key(HISTORY)
  end
  redis.call('LPUSH', HISTORY, summary)
  return length - keep
end

-- Append to the history, summarize when the rule says so, mark for the mirror.
local function record(entry)
  local length = redis.call('RPUSH', HISTORY, entry)
  if length == 1 then new_key(HISTORY) end
  if auto_summarize then
    fold(max_history, length)
  end
  mark_dirty()
end

-- When the session expires, in epoch milliseconds (-1: never). PEXPIRETIME is
-- Redis 7; on older servers server time plus PTTL gives the same number.
local function expire_time()
  local at = redis.pcall('PEXPIRETIME', META)
  if type(at) == 'number' then
    return at
  end
  local remaining = redis.call('PTTL', META)
  if remaining < 0 then
    return -1
  end
  return server_ms() + remaining
end

local function info()
  local meta = redis.call('HMGET', META, 'created_at', 'ttl_seconds', 'idle_ttl_ms', 'deadline_ms')
  local idle = meta[3] and idle_spec(tonumber(meta[3]), tonumber(meta[4])) or ''
  return {meta[1], meta[2], redis.call('SCARD', KEYSET), redis.call('LLEN', HISTORY), expire_time(), idle}
end

-- Flat key, value pairs.
local function all_values()
  local keys, values = stored_values()
  local flat = {}
  for i, key in ipairs(keys) do
    if values[i] then
      flat[#flat + 1] = key
      flat[#flat + 1] = values[i]
    end
  end
  return flat
end

-- INCRBY that reports a non-integer as an error reply instead of raising; it writes
-- nothing when it fails.
local function add(key, amount)
  local result = redis.pcall('INCRBY', base .. key, amount)
  if type(result) == 'table' and result.err and string.sub(result.err, 1, 4) == 'OOM ' then
    return nil, redis.error_reply(result.err) -- out of memory: not the value's fault
  end
  if type(result) == 'table' and result.err then
    return nil, fail('NOT_A_NUMBER', "The value under '" .. key .. "' is not an integer (" .. result.err .. ').')
  end
  return result
end
