-- Every store operation on Redis, as one script: one EVALSHA is one round trip, and
-- a write, its history entry, its TTL alignment, its summarization and its mark for
-- the ORM mirror happen atomically.
--
-- ARGV: 1 operation, 2 key prefix, 3 storage id of the session ('' when an answer's
-- session comes from its run binding, or for operations on no one session), 4 now
-- (JSON number text), 5 MAX_HISTORY, 6 AUTO_SUMMARIZE ('1'/'0'), 7 mark writes dirty
-- ('1'/'0'), 8 sessions per owner ('0': no cap), 9 bytes per session ('0': no cap),
-- 10 the write's idempotency record below the prefix ('' for none), 11 the request's
-- fingerprint, 12 how long the record is kept (ms), then the operation's own
-- arguments, read with arg(i). Keys are built here from the prefix in the node's
-- layout; auxiliary keys hold '~', which no session id can.
-- Errors come back as "PM_<CODE> message" replies.
--
-- Owned sessions (persistent_memory.owners) have storage ids '~o:{owner}~{id}', so
-- their keys are the node's layout with that id; each owner's ids are in the set
-- '{prefix}:~o:{owner}~:sessions' (the node's '__sessions__' holds unowned ones only)
-- and every owned id also in '{prefix}:~owned', for the operator's view.

local op, prefix, sid, now = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local max_history, auto_summarize, track_dirty = tonumber(ARGV[5]), ARGV[6] == '1', ARGV[7] == '1'
local owner_cap, byte_cap = tonumber(ARGV[8]), tonumber(ARGV[9])
local NODE_SESSIONS = prefix .. ':__sessions__'
local OWNED = prefix .. ':~owned'
local DIRTY = prefix .. ':~dirty'
local base, META, KEYSET, HISTORY, SESSIONS

local function arg(i)
  return ARGV[12 + i]
end

-- Idempotency keys (persistent_memory.idempotency): a write sent again under a key
-- recorded by this script gets the recorded reply and writes nothing; under a key
-- recorded for another request (fingerprint), an error. Every write's success reply
-- goes out through remember(), which records it; error replies are not recorded
-- (nothing was written, so a retry runs again). Checked before anything else, the
-- fast path below included.
local IDEMPOTENCY = ARGV[10] ~= '' and prefix .. ':' .. ARGV[10]

-- A reply as a JSON-able value that gives it back exactly: cjson would turn integers
-- into doubles, so strings are kept as 's..', integers as 'i..', nil as 'n'.
local function tagged(reply)
  local kind = type(reply)
  if kind == 'table' then
    local items = {}
    for i, item in ipairs(reply) do items[i] = tagged(item) end
    return items
  elseif kind == 'number' then
    return 'i' .. string.format('%d', reply)
  elseif kind == 'boolean' then
    return reply and 'i1' or 'n'
  end
  return 's' .. reply
end

local function untagged(value)
  if type(value) == 'table' then
    local items = {}
    for i, item in ipairs(value) do items[i] = untagged(item) end
    return items
  end
  local kind = string.sub(value, 1, 1)
  if kind == 'i' then
    return tonumber(string.sub(value, 2))
  elseif kind == 'n' then
    return false
  end
  return string.sub(value, 2)
end

if IDEMPOTENCY then
  local recorded = redis.call('GET', IDEMPOTENCY)
  if recorded then
    recorded = cjson.decode(recorded)
    if recorded[1] ~= ARGV[11] then
      return redis.error_reply('PM_IDEMPOTENCY_REUSED This idempotency key was used for a different request.')
    end
    return untagged(recorded[2])
  end
end

local function remember(reply)
  if IDEMPOTENCY then
    redis.call('SET', IDEMPOTENCY, cjson.encode({ARGV[11], tagged(reply)}), 'PX', ARGV[12])
  end
  return reply
end

-- '~o:{owner}~' of an owned storage id (or of a prefix that starts with one); nil otherwise.
local function namespace_of(id)
  return string.match(id, '^(~o:[^~]+~)')
end

-- The set a session's id is kept in.
local function sessions_set(id)
  local namespace = namespace_of(id)
  if namespace then
    return prefix .. ':' .. namespace .. ':sessions'
  end
  return NODE_SESSIONS
end

local function use_session(id)
  sid = id
  base = prefix .. ':' .. id .. ':'
  META, KEYSET, HISTORY = base .. '__meta__', base .. '__keys__', base .. '__history__'
  SESSIONS = sessions_set(id)
end

-- A run reference (persistent_memory.owners.run_ref) holds its owner's namespace.
local function run_key(ref)
  return prefix .. ':' .. ref
end

if sid ~= '' then
  use_session(sid)
end

-- Lua's unpack() takes at most a few thousand items: call in chunks.
local CHUNK = 1000
local function call_chunked(command, key, items)
  local replies = {}
  for first = 1, #items, CHUNK do
    local args = {}
    for i = first, math.min(first + CHUNK - 1, #items) do
      args[#args + 1] = items[i]
    end
    local reply
    if key then
      reply = redis.call(command, key, unpack(args))
    else
      reply = redis.call(command, unpack(args))
    end
    if type(reply) == 'table' then
      for _, item in ipairs(reply) do replies[#replies + 1] = item end
    end
  end
  return replies
end

-- The session's keys and their values (false where a value is missing). Unsorted:
-- Lua compares strings by the server's locale; the client sorts by code point.
local function stored_values()
  local keys = redis.call('SMEMBERS', KEYSET)
  if #keys == 0 then
    return keys, {}
  end
  local data_keys = {}
  for i, key in ipairs(keys) do data_keys[i] = base .. key end
  if #data_keys <= CHUNK then
    return keys, redis.call('MGET', unpack(data_keys))
  end
  return keys, call_chunked('MGET', nil, data_keys)
end

-- One JSON object text of every value: one reply the client decodes in one call.
local function values_object()
  local keys, values = stored_values()
  local parts = {}
  for i, key in ipairs(keys) do
    if values[i] then
      parts[#parts + 1] = cjson.encode(key) .. ': ' .. values[i]
    end
  end
  return '{' .. table.concat(parts, ', ') .. '}'
end

-- The reads most calls are, answered before the helpers below are built (that
-- costs a tenth of a small call): a live session's values, for get_all and for
-- enrich (binding its run first). Anything else goes on to the full path.
if (op == 'get_all' or op == 'enrich') and redis.call('EXISTS', META) == 1 then
  if op == 'enrich' and arg(3) ~= '' then
    redis.call('SET', run_key(arg(3)), sid, 'PX', arg(4))
  end
  return remember(values_object())
end

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

local function index(id)
  redis.call('SADD', sessions_set(id), id)
  if namespace_of(id) then
    redis.call('SADD', OWNED, id)
  end
end

-- 1 when the id was in its set.
local function unindex(id)
  if namespace_of(id) then
    redis.call('SREM', OWNED, id)
  end
  return redis.call('SREM', sessions_set(id), id)
end

-- Keys of a session whose meta is gone (expired, or left by a crash) are removed so
-- that a session created again under the same id starts empty.
local function purge_leftovers()
  for _, member in ipairs(redis.call('SMEMBERS', KEYSET)) do
    redis.call('DEL', base .. member)
  end
  redis.call('DEL', KEYSET, HISTORY)
end

-- nil when the session is live, else the error reply to return.
local function check_live()
  if redis.call('EXISTS', META) == 1 then
    return nil
  end
  if unindex(sid) == 1 then
    purge_leftovers()
    mark_dirty()
    return fail('EXPIRED', "Session '" .. sid .. "' has expired.")
  end
  return fail('NOT_FOUND', "Session '" .. sid .. "' not found.")
end

local function server_ms()
  local clock = redis.call('TIME')
  return tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
end

-- Returns when the new session expires, in epoch ms (-1: never). The expiry is set
-- as an absolute time and reported from it, not read back: a 1 ms TTL may be over
-- before the next command of this script runs.
local function create(created_at, ttl_text, ttl_ms)
  purge_leftovers()
  index(sid)
  redis.call('HSET', META, 'created_at', created_at, 'ttl_seconds', ttl_text)
  mark_dirty()
  if tonumber(ttl_ms) > 0 then
    local at = server_ms() + tonumber(ttl_ms)
    redis.call('PEXPIREAT', META, at)
    return at
  end
  return -1
end

-- Whether the owner of the current (owned) session may hold it: an id already in its
-- set keeps its place. Ids of expired sessions stay in the set until swept, so at the
-- cap they are dropped first and the set counted again.
local function owner_has_room()
  if owner_cap <= 0 or not namespace_of(sid) or redis.call('SISMEMBER', SESSIONS, sid) == 1 then
    return true
  end
  if redis.call('SCARD', SESSIONS) < owner_cap then
    return true
  end
  for _, id in ipairs(redis.call('SMEMBERS', SESSIONS)) do
    if redis.call('EXISTS', prefix .. ':' .. id .. ':__meta__') == 0 then
      unindex(id)
      mark_dirty(id)
    end
  end
  return redis.call('SCARD', SESSIONS) < owner_cap
end

local function no_room()
  return fail('QUOTA', 'This owner holds its maximum of ' .. owner_cap .. ' sessions.')
end

-- Whether the session's keys and values stay within the byte cap once the values
-- in ``sizes`` (key -> new length) are written: the same count as the memory backend.
local function fits(sizes)
  if byte_cap <= 0 then
    return true
  end
  local total = 0
  for key, size in pairs(sizes) do
    total = total + #key + size
  end
  for _, key in ipairs(redis.call('SMEMBERS', KEYSET)) do
    if not sizes[key] then
      total = total + #key + redis.call('STRLEN', base .. key)
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

-- Every key of a session expires with its meta: later keys inherit what is left.
local function align(...)
  local remaining = redis.call('PTTL', META)
  if remaining > 0 then
    for _, key in ipairs({...}) do
      redis.call('PEXPIRE', key, remaining)
    end
  end
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
  end
  redis.call('LPUSH', HISTORY, summary)
  return length - keep
end

-- Append to the history, summarize when the rule says so, mark for the mirror.
local function record(entry)
  local length = redis.call('RPUSH', HISTORY, entry)
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
  local meta = redis.call('HMGET', META, 'created_at', 'ttl_seconds')
  return {meta[1], meta[2], redis.call('SCARD', KEYSET), redis.call('LLEN', HISTORY), expire_time()}
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

-- Operations on no one session -------------------------------------------------

-- Live sessions whose id starts with arg(1); 'list_info' adds each one's info. With
-- more than arg(2) ids in the set it declines (PM_TOO_MANY) rather than hold Redis
-- for long: the caller then reads the set in batches.
-- The sets a prefix selects: one owner's, the node's, or (for '') both kinds.
local function sets_for(wanted)
  if namespace_of(wanted) then
    return {sessions_set(wanted)}
  elseif wanted == '' then
    return {NODE_SESSIONS, OWNED}
  end
  return {NODE_SESSIONS}
end

if op == 'list' or op == 'list_info' then
  local wanted = arg(1) or ''
  local sets = sets_for(wanted)
  local total = 0
  for _, set in ipairs(sets) do total = total + redis.call('SCARD', set) end
  if total > tonumber(arg(2)) then
    return fail('TOO_MANY', 'Too many sessions for one step.')
  end
  local live, stale = {}, {}
  for _, set in ipairs(sets) do
    for _, id in ipairs(redis.call('SMEMBERS', set)) do
      if wanted == '' or string.sub(id, 1, #wanted) == wanted then
        use_session(id)
        if redis.call('EXISTS', META) == 0 then
          stale[#stale + 1] = id
          mark_dirty(id)
        else
          live[#live + 1] = id
          if op == 'list_info' then
            for _, field in ipairs(info()) do live[#live + 1] = field end
          end
        end
      end
    end
  end
  for _, id in ipairs(stale) do unindex(id) end
  return live
end

-- The sweep, one batch of SCAN results at a time: check and remove in one atomic
-- step, so a session created meanwhile is never touched. arg(1) '1' for a dry run.
if op == 'sweep_ids' then
  local removed = 0
  local i = 2
  while arg(i) do
    local id = arg(i)
    if redis.call('EXISTS', prefix .. ':' .. id .. ':__meta__') == 0 then
      removed = removed + 1
      if arg(1) ~= '1' then
        unindex(id)
        mark_dirty(id)
      end
    end
    i = i + 1
  end
  return removed
end

if op == 'sweep_keys' then
  local leftovers, runs = 0, 0
  local i = 2
  while arg(i) do
    local key = arg(i)
    local rest = string.sub(key, #prefix + 2)
    -- Only keys of this deployment's layout: "{id}:{key}" (id unowned or owned) or a
    -- run binding, "~run:{run id}" or "~o:{owner}~:run:{run id}". Anything else (another
    -- deployment whose prefix starts with ours) is not ours to touch. Idempotency
    -- records, "~idem:{key}" and "~o:{owner}~:idem:{key}", belong to no session and
    -- expire on their own: never leftovers.
    local idempotency_record = string.match(rest, '^~idem:') or string.match(rest, '^~o:[^~]+~:idem:')
    local owner
    local run_id = string.match(rest, '^~run:([%w_%-]+)$') or string.match(rest, '^~o:[^~]+~:run:([%w_%-]+)$')
    if run_id then
      owner = redis.call('GET', key)
    elseif not idempotency_record then
      local id, name = string.match(rest, '^(.+):([%w_%.%-]+)$')
      if id and name ~= '__sessions__'
        and (string.match(id, '^[%w_%-]+$') or string.match(id, '^~o:[^~]+~[%w_%-]+$')) then
        owner = id
      end
    end
    if owner and redis.call('EXISTS', prefix .. ':' .. owner .. ':__meta__') == 0 then
      if run_id then runs = runs + 1 else leftovers = leftovers + 1 end
      if arg(1) ~= '1' then
        redis.call('DEL', key)
      end
    end
    i = i + 1
  end
  return {leftovers, runs}
end

-- Operations that create a missing session -----------------------------------

if op == 'create' then
  if redis.call('EXISTS', META) == 1 then
    return fail('EXISTS', "Session '" .. sid .. "' already exists.")
  end
  if not owner_has_room() then return no_room() end
  local expires = create(now, arg(1), arg(2))
  return remember({now, arg(1), 0, 0, expires})
end

if op == 'enrich' then
  if redis.call('EXISTS', META) == 0 then
    if not owner_has_room() then return no_room() end
    create(now, arg(1), arg(2))
  end
  if arg(3) ~= '' then
    redis.call('SET', run_key(arg(3)), sid, 'PX', arg(4))
  end
  return remember(values_object())
end

if op == 'answer' then
  if sid == '' then
    local bound = redis.call('GET', run_key(arg(4)))
    if not bound then
      return remember({})
    end
    use_session(bound)
    if redis.call('EXISTS', META) == 0 then
      -- Deleted or expired since it was bound: the binding goes too, so that it never
      -- recreates the session (or reaches a new one under the same id).
      redis.call('DEL', run_key(arg(4)))
      return remember({})
    end
  end
  local created = redis.call('EXISTS', META) == 0
  if created then
    if not owner_has_room() then return no_room() end
    create(now, arg(1), arg(2))
  end
  local count, err = add('answer_count', 1)
  if err then return err end
  local ok, total = fits({last_answer = #arg(3), answer_count = #tostring(count)})
  if not ok then -- undo, so that nothing of this call stays
    if count == 1 and redis.call('SISMEMBER', KEYSET, 'answer_count') == 0 then
      redis.call('DEL', base .. 'answer_count')
    else
      redis.call('DECRBY', base .. 'answer_count', 1)
    end
    if created then
      purge_leftovers()
      redis.call('DEL', META)
      unindex(sid)
    end
    return too_big(total)
  end
  redis.call('SET', base .. 'last_answer', arg(3))
  redis.call('SADD', KEYSET, 'last_answer', 'answer_count')
  record(history_entry('put', 'last_answer'))
  record(history_entry('increment', 'answer_count'))
  align(base .. 'last_answer', base .. 'answer_count', KEYSET, HISTORY)
  return remember({sid, count})
end

-- A whole session as exported: arg(1) '1' to replace a live one, 2 created_at,
-- 3 ttl_seconds text, 4 remaining ms ('0': none), 5 number of values, then that
-- many key/JSON pairs, then the history entries.
if op == 'restore' then
  if redis.call('EXISTS', META) == 1 and arg(1) ~= '1' then
    return fail('EXISTS', "Session '" .. sid .. "' already exists.")
  end
  if not owner_has_room() then return no_room() end
  redis.call('DEL', META)
  local expires = create(arg(2), arg(3), arg(4))
  local n = tonumber(arg(5))
  local keys = {}
  for i = 0, n - 1 do
    local key = arg(6 + 2 * i)
    keys[#keys + 1] = base .. key
    redis.call('SET', base .. key, arg(7 + 2 * i))
    redis.call('SADD', KEYSET, key)
  end
  local first = 6 + 2 * n
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

-- Read without side effects, for the mirror: 0 when the session is not live.
if op == 'snapshot' then
  if redis.call('EXISTS', META) == 0 then
    return 0
  end
  return {info(), all_values(), redis.call('LRANGE', HISTORY, 0, -1)}
end

-- Operations on a live session -----------------------------------------------

local err = check_live()
if err then return err end

if op == 'info' then
  return info()
elseif op == 'delete' then
  local keys = redis.call('SMEMBERS', KEYSET)
  purge_leftovers()
  redis.call('DEL', META)
  unindex(sid)
  mark_dirty()
  return remember(keys)
elseif op == 'put' then
  local key = arg(1)
  local ok, total = fits({[key] = #arg(2)})
  if not ok then return too_big(total) end
  redis.call('SET', base .. key, arg(2))
  redis.call('SADD', KEYSET, key)
  record(history_entry('put', key))
  align(base .. key, KEYSET, HISTORY)
  return remember(1)
elseif op == 'get' then
  local value = redis.call('GET', base .. arg(1))
  if not value then
    return fail('KEY_NOT_FOUND', "Session '" .. sid .. "' has no key '" .. arg(1) .. "'.")
  end
  return value
elseif op == 'get_all' then
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
  redis.call('SADD', KEYSET, key)
  record(history_entry('increment', key))
  align(base .. key, KEYSET, HISTORY)
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
  align(HISTORY)
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
  align(HISTORY)
  return remember(folded)
end

return fail('BAD_OPERATION', 'Unknown operation ' .. tostring(op))
