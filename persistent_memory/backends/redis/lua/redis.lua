-- Every store operation on Redis, as one function library (FUNCTION LOAD; on Redis < 7
-- the same chunk as a script, see persistent_memory.backends.redis.functions): one FCALL
-- is one round trip, and a write, its history entry, its TTL alignment, its summarization
-- and its mark for the ORM mirror happen atomically. This file holds the call's arguments,
-- idempotency, expiry alignment, run bindings, the fast path of the commonest reads and,
-- at its end, entry(), which runs a call; the files it includes (by concern) hold the rest,
-- in that order. The chunk runs once, when Redis loads the library: what depends on the
-- call is in entry() and in the handlers the included files register with on().
--
-- KEYS, in this order on every call (persistent_memory.backends.redis.layout builds
-- them; a key the operation does not use is given as KEYS[8], so that every key of a
-- call is in one hash slot in the cluster layout):
--   1 the session's meta, 2 its key set, 3 its history, 4 its run index, 5 the set of its
--   conversation names, 6 its namespace's listing by creation time, 7 by name, 8 the
--   node's set of (unowned) session ids, 9 the set of owned ids, 10 the ORM mirror's dirty
--   set, 11 the summarizers' queue, 12 the summarizers' health, 13 the call's idempotency
--   record, 14 the run binding it names, 15 the value key it names, 16 the listing's
--   scratch set, 17-18 the session's checkpoints ('~cp' and '~cpi'), then, when the call
--   names a conversation (or is given keys), 19-27 that conversation ('~c:{name}' and its
--   ':m', ':l', ':t', ':s', ':k', ':o', ':y', ':x'), then from 28 on the keys an operation
--   is given (the sweep's, a restore's, the values an answer writes).
-- Every key a call touches, reads included, is declared there, but those named from what
-- Redis holds, which no call can know before it runs (docs/reference/redis-layout.md):
-- the members of a session's key set (its values), of its conversation names, of its
-- run index (its bindings); the sessions an index holds that a listing page, an owner's
-- count or cap meets; the session a run binding names (the sweep of bindings, and in the
-- node layout an answer given only a run id: one server, no slot to agree on; the
-- cluster layout finds the session first, see redis/layout.py). All are under the root of
-- KEYS[8]: the node's prefix in the node layout, '{prefix}:{bucket tag}' in the cluster
-- layout, whose hash tag puts every key of a bucket's sessions and indexes in one slot.
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

-- The call's KEYS and ARGV, and what is read from them: set by entry() at the end of this
-- file on every call. The library defines its functions once, when Redis loads it; a
-- call only assigns these (a function may assign the library's locals, not globals).
local KEYS, ARGV
-- Whether the call is a read's (FCALL_RO: it may not write).
local read_only
local op, sid, now, root
local max_history, auto_summarize, track_dirty
-- ARGV[8] is the cap alone, or in the cluster layout '{cap}?' (not counted yet) or
-- '{cap}+{sessions of the owner in the other buckets}' (see owner_has_room).
local owner_cap, owner_elsewhere
local byte_cap, arg_max_messages, default_idle_ms, refresh_reads, summarize_after
local NODE_SESSIONS, OWNED, DIRTY
local base, META, KEYSET, HISTORY, RUNS, BY_TIME
-- Defined by conversations.lua, included below; used by helpers defined before it.
local drop_conversations, conversation_bytes
-- Defined by conversations.lua: writes the thread tails a call left stale (before the reply).
local settle_tails
-- Defined by checkpoints.lua, included below.
local drop_checkpoints, checkpoints_snapshot, restore_checkpoints
-- Defined by windows.lua, once every key of a session can be named.
local touch

-- The operations of the included files, in order, each with the operations it serves
-- (none named: every one): of those that serve a call's operation, each runs when the one
-- before did not return (see entry()). A call runs only its operation's: a Lua function
-- call costs more in Redis than some commands, and an operation at the end of the list
-- would otherwise call every handler before it (a lane call, 30 of them).
local handlers, served = {}, {}
local function on(ops, handler)
  if handler == nil then ops, handler = nil, ops end
  local serves = false
  if ops then
    serves = {}
    for i = 1, #ops do
      serves[ops[i]] = true
      served[#served + 1] = ops[i]
    end
  end
  handlers[#handlers + 1] = {serves = serves, run = handler}
end

local function arg(i)
  return ARGV[16 + i]
end

-- Idempotency keys (persistent_memory.idempotency): a write sent again under a key
-- recorded by this script gets the recorded reply and writes nothing; under a key
-- recorded for another request (fingerprint), an error. Every write's success reply
-- goes out through remember(), which records it; error replies are not recorded
-- (nothing was written, so a retry runs again). Checked before anything else, the
-- fast path below included.
local IDEMPOTENCY

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
local function remember(reply, untouched)
  if IDEMPOTENCY then
    redis.call('SET', IDEMPOTENCY, cjson.encode({ARGV[15], tagged(reply)}), 'PX', ARGV[16])
  end
  if settle_tails then settle_tails() end
  align_new_keys()
  if sid ~= '' and not untouched then
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

-- One JSON object text of every value (those given, else read): one reply the client
-- decodes in one call.
-- Built by one concatenation (no string per value); a key of the key rules
-- (persistent_memory.validation) is its own JSON text between quotes.
local function values_object(keys, values)
  if not keys then keys, values = stored_values() end
  local parts, n = {'{'}, 1
  for i, key in ipairs(keys) do
    local value = values[i]
    if value then
      local name = string.find(key, '^[%w_.-]+$') and key or string.sub(cjson.encode(key), 2, -2)
      parts[n + 1], parts[n + 2], parts[n + 3], parts[n + 4] = '"', name, '": ', value
      parts[n + 5] = ', '
      n = n + 5
    end
  end
  parts[n > 1 and n or 2] = '}'
  return table.concat(parts, '', 1, n > 1 and n or 2)
end

-- The reads most calls are, answered first: a live session's values, for get_all and
-- for enrich (binding its run first, which moves no idle expiry). Anything else goes on
-- to the operations of the included files.
on({'get_all', 'enrich'}, function()
-- An enrich's arg(5) is the conversation to record into, its arg(3) and arg(4) the run.
if (op == 'get_all' or (op == 'enrich' and ARGV[21] == '')) and not refresh_reads
  and redis.call('EXISTS', META) == 1 then
  if op == 'enrich' and ARGV[19] ~= '' then
    bind(ARGV[19], ARGV[20])
  end
  return remember(values_object(), true)
end
end)

-- @include sessions.lua
-- @include indexes.lua
-- @include forms.lua
-- @include conversations.lua
-- @include windows.lua
-- @include checkpoints.lua
-- @include conversation_ops.lua
-- @include maintenance.lua
-- @include lanes.lua
-- @include values.lua

-- Per call ---------------------------------------------------------------------

-- The handlers a call of each operation runs, in order (built once, when the library loads,
-- from what on() was given: nothing a call changes); an operation no handler names runs
-- those that serve every one.
local routes, every = {}, {}
for i = 1, #handlers do
  if not handlers[i].serves then every[#every + 1] = handlers[i].run end
end
for i = 1, #served do
  local name = served[i]
  if not routes[name] then
    local route = {}
    for j = 1, #handlers do
      local serves = handlers[j].serves
      if not serves or serves[name] then route[#route + 1] = handlers[j].run end
    end
    routes[name] = route
  end
end

-- Whether a handler returned (a reply, even nil) or fell through to the next one.
local function returned(...)
  return select('#', ...) > 0, ...
end

-- One call: its state from KEYS and ARGV (the state a call before left, reset), the
-- idempotency record, then the first of its operation's handlers that returns.
local function entry(keys, argv, reading)
  KEYS, ARGV, read_only = keys, argv, reading == true
  op, sid, now = ARGV[1], ARGV[3], ARGV[4]
  -- The root every key name starts with (see above): KEYS[8] is '{root}:__sessions__'.
  root = string.sub(KEYS[8], 1, #KEYS[8] - #':__sessions__')
  max_history, auto_summarize, track_dirty = tonumber(ARGV[5]), ARGV[6] == '1', ARGV[7] == '1'
  local cap, elsewhere = string.match(ARGV[8], '^(%d+)(.*)$')
  owner_cap, owner_elsewhere = tonumber(cap), elsewhere ~= '?' and (tonumber(string.sub(elsewhere, 2)) or 0)
  byte_cap, arg_max_messages = tonumber(ARGV[9]), ARGV[10]
  default_idle_ms, refresh_reads = ARGV[11], ARGV[12] == '1'
  summarize_after = tonumber(ARGV[13])
  NODE_SESSIONS, OWNED, DIRTY = KEYS[8], KEYS[9], KEYS[10]
  IDEMPOTENCY = ARGV[14] ~= '' and KEYS[13]
  new_keys, marked, stale_forms = {}, {}, {}
  if sid ~= '' then -- the call's session: its keys as declared
    base = string.sub(KEYS[1], 1, #KEYS[1] - #'__meta__')
    META, KEYSET, HISTORY, RUNS, BY_TIME = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6]
  else
    base, META, KEYSET, HISTORY, RUNS, BY_TIME = nil, nil, nil, nil, nil, nil
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
  local route = routes[op] or every
  for i = 1, #route do
    local done, reply = returned(route[i]())
    if done then return reply end
  end
end

-- A read's call (FCALL_RO, a function flagged no-writes): an operation that finds it
-- must write after all (a read of a session that has just expired cleans it up) is
-- refused its first write, having written nothing, and answers PM_WRITE_NEEDED: the
-- client sends it again as a write.
local function read_entry(keys, argv)
  local ok, reply = pcall(entry, keys, argv, true)
  if ok then return reply end
  local message = type(reply) == 'table' and reply.err or tostring(reply)
  if string.find(message, 'Write commands are not allowed', 1, true) then
    return redis.error_reply('PM_WRITE_NEEDED A read found it must write.')
  end
  error(reply, 0)
end
