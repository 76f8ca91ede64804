-- Every store operation on Redis, as one script: one EVALSHA is one round trip, and
-- a write, its history entry, its TTL alignment, its summarization and its mark for
-- the ORM mirror happen atomically.
--
-- KEYS, in this order on every call (persistent_memory.backends.redis_layout builds
-- them; a key the operation does not use is given as KEYS[8], so that every key of a
-- call is in one hash slot in the cluster layout):
--   1 the session's meta, 2 its key set, 3 its history, 4 its run index, 5 the set of its
--   conversation names, 6 its namespace's listing by creation time, 7 by name, 8 the
--   node's set of (unowned) session ids, 9 the set of owned ids, 10 the ORM mirror's dirty
--   set, 11 the summarizers' queue, 12 the summarizers' health, 13 the call's idempotency
--   record, 14 the run binding it names, 15 the value key it names, 16 the listing's
--   scratch set, 17-24 the conversation it names ('~c:{name}' and its ':m', ':l', ':t',
--   ':s', ':k', ':o', ':y'), then the keys a maintenance operation is given.
-- Every key a call can name from its arguments is declared there and used as declared.
-- The others are named from what Redis holds (the members of a session's key set, its
-- conversation names, its run index, the ids in a listing), under the root of KEYS[8]:
-- the node's prefix in the node layout, '{prefix}:{bucket tag}' in the cluster layout,
-- whose hash tag puts every key of a bucket's sessions and of its indexes in one slot.
--
-- ARGV: 1 operation, 2 'bound' for an answer whose session came from its run (else ''), 3 storage id of the
-- session ('' when an answer's session comes from its run binding, or for operations on
-- no one session), 4 now (JSON number text), 5 MAX_HISTORY, 6 AUTO_SUMMARIZE ('1'/'0'), 7
-- mark writes dirty ('1'/'0'), 8 sessions per owner ('0': no cap), 9 bytes per session
-- ('0': no cap), 10 messages per conversation (MAX_MESSAGES), 11 the idle TTL of sessions
-- the lanes and appends create (ms, '0': none), 12 whether reads refresh an idle TTL
-- ('1'/'0'), 13 the pending tokens that mark a conversation for a summarizer ('0':
-- summaries are off), 14 '1' when the call has an idempotency record (KEYS[13]), 15 the
-- request's fingerprint, 16 how long the record is kept (ms), then the operation's own
-- arguments, read with arg(i).
--
-- Idle expiry: a session created with an idle TTL has 'idle_ttl_ms' in its meta (and
-- 'deadline_ms', its fixed expiry, when it has a TTL too). Every write (and with 12,
-- every read of its data) pushes the expiry of each of its keys to now plus the idle
-- TTL, never past the deadline (touch()). Sessions without it (the node's) are as before.
-- Auxiliary keys hold '~', which no session id can.
-- Errors come back as "PM_<CODE> message" replies.
--
-- Owned sessions (persistent_memory.owners) have storage ids '~o:{owner}~{id}', so
-- their keys are the node's layout with that id; every owned id is in the set
-- '{root}:~owned', for the operator's view (the node's '__sessions__' holds unowned
-- ones only). Each namespace (an owner's, or the unowned one) has two sorted sets of
-- its ids for the listing: by creation time (score: created_at, seconds) and by name
-- (score 0, for a prefix range): '{root}:~o:{owner}~:sessions' and
-- '{root}:~o:{owner}~:names', or '{root}:~sessions' and '{root}:~names'.
-- A session's run references are in '{root}:{id}:~runs' (score: when the binding
-- expires, server ms), so that deleting it drops its bindings; '~' keeps that name
-- apart from the session's value keys, and it expires with the session.

local op, sid, now = ARGV[1], ARGV[3], ARGV[4]
-- The root every key name below starts with (see above): KEYS[8] is '{root}:__sessions__'.
local root = string.sub(KEYS[8], 1, #KEYS[8] - #':__sessions__')
local max_history, auto_summarize, track_dirty = tonumber(ARGV[5]), ARGV[6] == '1', ARGV[7] == '1'
local owner_cap, byte_cap = tonumber(ARGV[8]), tonumber(ARGV[9])
local arg_max_messages = ARGV[10]
local default_idle_ms, refresh_reads = ARGV[11], ARGV[12] == '1'
local summarize_after = tonumber(ARGV[13])
local NODE_SESSIONS, OWNED, DIRTY = KEYS[8], KEYS[9], KEYS[10]
local base, META, KEYSET, HISTORY, RUNS, BY_TIME
-- Defined by conversations.lua, included below; used by helpers defined before it.
local drop_conversations, conversation_bytes
-- Defined once every key of a session can be named (after the include); nil before, so
-- the fast path below never refreshes (it serves reads and run bindings only).
local touch

local function arg(i)
  return ARGV[16 + i]
end

-- Idempotency keys (persistent_memory.idempotency): a write sent again under a key
-- recorded by this script gets the recorded reply and writes nothing; under a key
-- recorded for another request (fingerprint), an error. Every write's success reply
-- goes out through remember(), which records it; error replies are not recorded
-- (nothing was written, so a retry runs again). Checked before anything else, the
-- fast path below included.
local IDEMPOTENCY = ARGV[14] ~= '' and KEYS[13]

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
    if recorded[1] ~= ARGV[15] then
      return redis.error_reply('PM_IDEMPOTENCY_REUSED This idempotency key was used for a different request.')
    end
    return untagged(recorded[2])
  end
end

-- Keys of the current session this call may have created (or SET, which drops a
-- key's expiry), marked where they are written: they take the session's expiry when the
-- call's reply goes out (align_new_keys). A write to a key that exists keeps its expiry,
-- which every key of a session shares, so the other keys need no command of their own:
-- aligning all of a session's keys on every write was half the commands of a lane's call.
local new_keys = {}

local function new_key(key)
  new_keys[#new_keys + 1] = key
end

-- New keys inherit META's absolute expiry (PEXPIRETIME, Redis 7). Copying the relative
-- PTTL left keys of one session hundreds of ms apart on a loaded machine: Redis 7.0 reads
-- PTTL and sets PEXPIRE against clocks that drift apart while a script waits for the CPU.
local function align_new_keys()
  if #new_keys == 0 then return end
  local command, at = 'PEXPIREAT', redis.pcall('PEXPIRETIME', META)
  if type(at) ~= 'number' then -- Redis 6: relative, as close as it gets
    command, at = 'PEXPIRE', redis.call('PTTL', META)
  end
  if at > 0 then
    for _, key in ipairs(new_keys) do redis.call(command, key, at) end
  end
  new_keys = {}
end

-- Every write's success reply goes out through here: the keys it created expire with
-- its session, and the session's idle expiry moves.
local function remember(reply)
  if IDEMPOTENCY then
    redis.call('SET', IDEMPOTENCY, cjson.encode({ARGV[15], tagged(reply)}), 'PX', ARGV[16])
  end
  align_new_keys()
  if touch and sid ~= '' then
    touch()
  end
  return reply
end

-- '~o:{owner}~' of an owned storage id (or of a prefix that starts with one); nil otherwise.
local function namespace_of(id)
  return string.match(id, '^(~o:[^~]+~)')
end

-- The listing's two sorted sets of the namespace of a storage id (or of a prefix of
-- one): by creation time, and by name.
local function listing_sets(id)
  local namespace = namespace_of(id)
  if namespace then
    return root .. ':' .. namespace .. ':sessions', root .. ':' .. namespace .. ':names'
  end
  return root .. ':~sessions', root .. ':~names'
end

local function use_session(id)
  sid = id
  base = root .. ':' .. id .. ':'
  META, KEYSET, HISTORY = base .. '__meta__', base .. '__keys__', base .. '__history__'
  RUNS = base .. '~runs'
  BY_TIME = listing_sets(id)
end

-- A run reference (persistent_memory.owners.run_ref) holds its owner's namespace; the
-- one the call names is declared (KEYS[14]), those a session's run index holds are not.
local function run_key(ref)
  return root .. ':' .. ref
end

-- A binding's value: the session's storage id, then, when the enrich lane recorded the
-- run's question, the conversation and the question's id (space-separated: none holds one).
local function binding(value)
  if not value then return nil end
  local id, conversation, question = string.match(value, '^(%S+) (%S+) (%S+)$')
  if id then return id, conversation, question end
  return value
end

local function server_ms()
  local clock = redis.call('TIME')
  return tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
end

-- Bind run reference ``ref`` (with its ``question``: "conversation id") to the current
-- (live) session for ``ttl_ms``, never past
-- the session's own expiry, and note it in the session's run index. References whose
-- binding has expired leave the index here, so it holds no more than the live ones.
local function bind(ref, ttl_ms, question)
  local ttl = tonumber(ttl_ms)
  local remaining = redis.call('PTTL', META)
  if remaining > 0 and remaining < ttl then
    ttl = remaining
  end
  local now_ms = server_ms()
  redis.call('SET', run_key(ref), question and (sid .. ' ' .. question) or sid, 'PX', ttl)
  redis.call('ZREMRANGEBYSCORE', RUNS, '-inf', now_ms)
  redis.call('ZADD', RUNS, now_ms + ttl, ref)
  if remaining > 0 then
    redis.call('PEXPIRE', RUNS, remaining)
  end
end

if sid ~= '' then -- the call's session: its keys as declared
  sid = ARGV[3]
  base = string.sub(KEYS[1], 1, #KEYS[1] - #'__meta__')
  META, KEYSET, HISTORY, RUNS, BY_TIME = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6]
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
if (op == 'get_all' or (op == 'enrich' and arg(5) == '')) and not refresh_reads
  and redis.call('EXISTS', META) == 1 then
  if op == 'enrich' and arg(3) ~= '' then
    bind(arg(3), arg(4))
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
  if redis.call('EXISTS', KEYSET, HISTORY, RUNS, base .. '~convs') == 0 then
    return
  end
  for _, member in ipairs(redis.call('SMEMBERS', KEYSET)) do
    redis.call('DEL', base .. member)
  end
  redis.call('DEL', KEYSET, HISTORY)
  drop_runs()
  drop_conversations()
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
-- cap they are dropped first and the index counted again.
local function owner_has_room()
  if owner_cap <= 0 or not namespace_of(sid) or redis.call('ZSCORE', BY_TIME, sid) then
    return true
  end
  if redis.call('ZCARD', BY_TIME) < owner_cap then
    return true
  end
  for _, id in ipairs(redis.call('ZRANGE', BY_TIME, 0, -1)) do
    if redis.call('EXISTS', root .. ':' .. id .. ':__meta__') == 0 then
      unindex(id)
      mark_dirty(id)
    end
  end
  return redis.call('ZCARD', BY_TIME) < owner_cap
end

local function no_room()
  return fail('QUOTA', 'This owner holds its maximum of ' .. owner_cap .. ' sessions.')
end

-- Whether the session's keys and values, and its conversations' messages, stay within
-- the byte cap once the values in ``sizes`` (key -> new length) and ``extra`` bytes of
-- new messages are written: the same count as the memory backend.
local function fits(sizes, extra)
  if byte_cap <= 0 then
    return true
  end
  local total = (extra or 0) + conversation_bytes()
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

-- @include conversations.lua

-- Operations on no one session -------------------------------------------------

-- Live sessions whose id starts with arg(1); 'list_info' adds each one's info. With
-- more than arg(2) ids in the set it declines (PM_TOO_MANY) rather than hold Redis
-- for long: the caller then reads the set in batches.
-- The sets a prefix selects, each with whether it is a sorted set: one owner's
-- listing, the node's set, or (for '') the node's and every owned id.
local function sets_for(wanted)
  if namespace_of(wanted) then
    return {{(listing_sets(wanted)), true}}
  elseif wanted == '' then
    return {{NODE_SESSIONS, false}, {OWNED, false}}
  end
  return {{NODE_SESSIONS, false}}
end

if op == 'list' or op == 'list_info' then
  local wanted = arg(1) or ''
  local sets = sets_for(wanted)
  local total = 0
  for _, set in ipairs(sets) do
    total = total + redis.call(set[2] and 'ZCARD' or 'SCARD', set[1])
  end
  if total > tonumber(arg(2)) then
    return fail('TOO_MANY', 'Too many sessions for one step.')
  end
  local live, stale = {}, {}
  for _, set in ipairs(sets) do
    local ids = set[2] and redis.call('ZRANGE', set[1], 0, -1) or redis.call('SMEMBERS', set[1])
    for _, id in ipairs(ids) do
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

-- Members of ``a`` that ``b`` lacks (sets or sorted sets): ZDIFF (Redis 6.2) in one
-- command, else one by one.
local function only_in(a, b)
  local reply = redis.pcall('ZDIFF', 2, a, b)
  if type(reply) == 'table' and not reply.err then
    return reply
  end
  local function members(key)
    if redis.call('TYPE', key).ok == 'zset' then
      return redis.call('ZRANGE', key, 0, -1)
    end
    return redis.call('SMEMBERS', key)
  end
  local inside, ids = {}, {}
  for _, id in ipairs(members(b)) do inside[id] = true end
  for _, id in ipairs(members(a)) do
    if not inside[id] then ids[#ids + 1] = id end
  end
  return ids
end

-- The original node writes unowned sessions into its set only. The listing indexes
-- those it lacks (and drops what the node deleted) when the set and the index differ
-- in size: a check that costs nothing while the app alone writes.
local function catch_up_unowned()
  local by_time = listing_sets('')
  if redis.call('SCARD', NODE_SESSIONS) == redis.call('ZCARD', by_time) then
    return
  end
  for _, id in ipairs(only_in(NODE_SESSIONS, by_time)) do
    local meta = root .. ':' .. id .. ':__meta__'
    if redis.call('EXISTS', meta) == 1 then
      index(id, redis.call('HGET', meta, 'created_at'))
    else
      unindex(id)
      mark_dirty(id)
    end
  end
  for _, id in ipairs(only_in(by_time, NODE_SESSIONS)) do
    if redis.call('EXISTS', root .. ':' .. id .. ':__meta__') == 1 then
      redis.call('SADD', NODE_SESSIONS, id)
    else
      unindex(id)
      mark_dirty(id)
    end
  end
end

-- One page of one namespace's live sessions, newest first (equal times: greater id
-- first). arg(1) the storage id prefix (a namespace, then the id prefix searched),
-- arg(2) offset, arg(3) limit. Replies the count, then each session's id and info.
--
-- Without a search the page is a range of the time index: O(log N + limit). A
-- search counts its matches in the name index (ZLEXCOUNT, O(log N)), then either
-- walks the time index newest first keeping the ids with the prefix, when the page
-- should come within WALK times the matches' number of ids, or orders the matches
-- by time in a sorted set of the script's own, '{prefix}:~search' (ZRANGESTORE of
-- the lex range, then ZINTERSTORE with the time index), deleted before it returns.
-- A walk that reads past its budget (matches bunched far back) turns to the latter,
-- so a search costs O(log N + matches log matches) at most, and a first page of a
-- wide search far less.
--
-- An id whose session has gone (expired, not yet swept) is dropped from the indexes
-- where the page meets it and the page reads on past it, so it still holds ``limit``
-- sessions; the count leaves out those met.
local WALK = 4

if op == 'page' then
  local wanted, offset, limit = arg(1), tonumber(arg(2)), tonumber(arg(3))
  local namespace = namespace_of(wanted) or ''
  local by_time, by_name = listing_sets(wanted)
  if namespace == '' then
    catch_up_unowned()
  end
  local from, to = '[' .. wanted, '(' .. wanted .. '\255'
  local everyone = redis.call('ZCARD', by_time)
  local total = everyone
  -- Past the end is an empty page; and Lua numbers are doubles, which Redis refuses as
  -- indexes once they are too large to print as integers.
  offset, limit = math.min(offset, everyone), math.min(limit, everyone)
  if #wanted > #namespace then
    total = redis.call('ZLEXCOUNT', by_name, from, to)
  end
  local search = KEYS[16]

  -- The matches ordered by time, in ``search``; their number.
  local function sorted_matches()
    local stored = redis.pcall('ZRANGESTORE', search, by_name, from, to, 'BYLEX') -- Redis 6.2
    if type(stored) ~= 'number' then
      redis.call('DEL', search)
      local scored = {}
      for _, id in ipairs(redis.call('ZRANGEBYLEX', by_name, from, to)) do
        scored[#scored + 1] = 0
        scored[#scored + 1] = id
      end
      if #scored > 0 then
        call_chunked('ZADD', search, scored) -- CHUNK is even: no pair is split
      end
    end
    return redis.call('ZINTERSTORE', search, 2, search, by_time, 'WEIGHTS', 0, 1)
  end

  -- Read ``ordered`` newest first from ``position``, keeping the ids that start with
  -- ``filter`` (nil: all), skipping ``skip`` of them, up to ``limit`` live ones. With
  -- a ``budget``, false when more ids than that were read before the page was full.
  local reply, found = {0}, 0
  local function walk(ordered, filter, position, skip, budget)
    local read = 0
    while found < limit do
      local want = limit - found
      if filter then
        want = math.min(CHUNK, math.ceil((want + skip) * everyone / total) + 16)
      end
      local ids = redis.call('ZREVRANGE', ordered, position, position + want - 1)
      for _, id in ipairs(ids) do
        if found == limit then
          return true
        end
        if filter and string.sub(id, 1, #filter) ~= filter then
          position = position + 1
        elseif skip > 0 then
          skip = skip - 1
          position = position + 1
        else
          use_session(id)
          if redis.call('EXISTS', META) == 1 then
            reply[#reply + 1] = id
            for _, field in ipairs(info()) do reply[#reply + 1] = field end
            found = found + 1
            position = position + 1
          else -- gone: the next id moves up to its place
            unindex(id)
            if ordered == search then
              redis.call('ZREM', search, id)
            end
            mark_dirty(id)
            total = total - 1
          end
        end
      end
      read = read + #ids
      if #ids < want then
        return true
      end
      if budget and read > budget then
        return false
      end
    end
    return true
  end

  if total == 0 then
    return reply
  elseif total == everyone then -- no search, or every id matches
    walk(by_time, nil, offset, 0)
  elseif (offset + limit) * everyone / total <= WALK * total
    and walk(by_time, wanted, 0, offset, WALK * total) then
    -- the page came from the walk
  else
    reply, found = {0}, 0
    total = sorted_matches()
    walk(search, nil, offset, 0)
    redis.call('DEL', search)
  end
  reply[1] = total
  return reply
end

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

-- Keys found by a SCAN (declared, from KEYS[25] on): those of sessions whose meta is gone
-- are removed. arg(1) '1' for a dry run. Replies the leftover keys and run bindings.
if op == 'sweep_keys' then
  local leftovers, runs = 0, 0
  for i = 25, #KEYS do
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

-- Operations that create a missing session -----------------------------------

if op == 'create' then
  if redis.call('EXISTS', META) == 1 then
    return fail('EXISTS', "Session '" .. sid .. "' already exists.")
  end
  if not owner_has_room() then return no_room() end
  local expires, idle = create(now, arg(1), arg(2), arg(3))
  return remember({now, arg(1), 0, 0, expires, idle}) -- as set, not read back (see create)
end

-- arg(1) ttl text, 2 ttl ms, 3 run reference ('' none), 4 its TTL ms; with a question
-- to record (conversations.lua): 5 conversation ('' none), 6 max tokens, 7 max messages
-- ('' no limit), 8-10 the question (id, body, link), 11 '1' for a rolling window, 12 '1'
-- to reserve its summary's tokens. Replies the values' object, and
-- with a question: the question's id, the window's tokens, truncated and texts.
if op == 'enrich' then
  local name, plan = arg(5), nil
  if name ~= '' then -- checked before anything is written
    if redis.call('EXISTS', META) == 0 then
      purge_leftovers() -- of a session gone: what a new one under this id must not see
    end
    local failure
    plan, failure = plan_append(name, nil, 8, 1)
    if not plan then return failure end
    local ok, total = true, new_bytes(plan)
    if redis.call('EXISTS', META) == 1 then
      ok, total = fits({}, total)
    elseif byte_cap > 0 then
      ok = total <= byte_cap
    end
    if not ok then return too_big(total) end
  end
  if redis.call('EXISTS', META) == 0 then
    if not owner_has_room() then return no_room() end
    create(now, arg(1), arg(2), default_idle_ms)
  end
  if arg(3) ~= '' then
    bind(arg(3), arg(4), plan and (name .. ' ' .. arg(8)))
  end
  if not plan then
    return remember(values_object())
  end
  local reply = {values_object(), arg(8)}
  window_reply(reply, name, limit_or_nil(arg(6)), limit_or_nil(arg(7)), arg(11) == '1', arg(12) == '1')
  commit(name, plan)
  return remember(reply)
end

-- arg(1) ttl text, 2 ttl ms, 3 the answer's JSON, 4 run reference ('' none); with a
-- message to record (conversations.lua): 5 conversation ('' none), 6 parent id ('': the
-- run's question, else the head), 7-9 the message (id, body, link).
-- ARGV[2] 'bound': the session was found through the run (the cluster layout's pointer),
-- so it is answered only while the run's binding names it, as without a session.
if op == 'answer' then
  local bound, asked_in, asked = binding(arg(4) ~= '' and redis.call('GET', KEYS[14]))
  if sid == '' or ARGV[2] == 'bound' then
    if not bound or (sid ~= '' and bound ~= sid) then
      return remember({})
    end
    if sid == '' then use_session(bound) end
    if redis.call('EXISTS', META) == 0 then
      -- Deleted or expired since it was bound: the binding goes too, so that it never
      -- recreates the session (or reaches a new one under the same id).
      redis.call('DEL', KEYS[14])
      return remember({})
    end
  end
  local name, plan = arg(5) or '', nil
  if name ~= '' then -- after the run's question when the binding names one here, else the parent given
    if redis.call('EXISTS', META) == 0 then
      purge_leftovers()
    end
    local parent = text_or_nil(arg(6) ~= '' and arg(6))
    local c = conv_key(name)
    if bound == sid and asked_in == name and redis.call('HEXISTS', c .. ':m', asked) == 1 then
      parent = asked
    elseif parent and redis.call('HEXISTS', c .. ':m', parent) == 0 then
      parent = nil
    end
    local failure
    plan, failure = plan_append(name, parent, 7)
    if not plan then return failure end
  end
  local created = redis.call('EXISTS', META) == 0
  if created then
    if not owner_has_room() then return no_room() end
    create(now, arg(1), arg(2), default_idle_ms)
  end
  local count, err = add('answer_count', 1)
  if err then
    if created then
      purge_leftovers()
      redis.call('DEL', META)
      unindex(sid)
    end
    return err
  end
  local ok, total = fits({last_answer = #arg(3), answer_count = #tostring(count)}, plan and new_bytes(plan))
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
  new_key(base .. 'last_answer')
  if count == 1 then new_key(base .. 'answer_count') end
  if redis.call('SADD', KEYSET, 'last_answer', 'answer_count') > 0 then new_key(KEYSET) end
  record(history_entry('put', 'last_answer'))
  record(history_entry('increment', 'answer_count'))
  if plan then
    commit(name, plan)
  end
  return remember({sid, count})
end

-- A whole session as exported: arg(1) '1' to replace a live one, 2 created_at,
-- 3 ttl_seconds text, 4 remaining ms ('0': none), 5 its conversations as one JSON text
-- (see restore_conversations), 6 its idle TTL in ms and the ms left to its fixed
-- deadline, space-separated ('' for no idle TTL; the deadline may be left out), 7
-- number of values, then that many key/JSON pairs, then the history entries.
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
    if left ~= '' then redis.call('HSET', META, 'deadline_ms', server_ms() + tonumber(left)) end
  end
  local n = tonumber(arg(7))
  local keys = restore_conversations(arg(5))
  for i = 0, n - 1 do
    local key = arg(8 + 2 * i)
    keys[#keys + 1] = base .. key
    redis.call('SET', base .. key, arg(9 + 2 * i))
    redis.call('SADD', KEYSET, key)
  end
  local first = 8 + 2 * n
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
  return {info(), all_values(), redis.call('LRANGE', HISTORY, 0, -1), conversations_snapshot()}
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
