-- Conversations (persistent_memory.backends.conversations): storing a message tree,
-- included into redis.lua where it says so: the lanes use these helpers in the same script, so that recording a
-- question or an answer stays in the lane's one round trip.
--
-- A conversation ``name`` of the current session lives in
--   '{base}~c:{name}'     hash: head, seq (the last one given), tokens, bytes, trimmed
--   '{base}~c:{name}:m'   hash: message id -> stored JSON text (messages.stored_text)
--   '{base}~c:{name}:l'   hash: message id -> link JSON (messages.stored_link)
--   '{base}~c:{name}:t'   list: the current thread's ids, root to head
--   '{base}~c:{name}:s'   sorted set: the current thread's system message ids, by seq
--   '{base}~c:{name}:k'   set: ids of messages with at least one child
--   '{base}~c:{name}:o'   sorted set: every message id, by seq (what a trim removes first)
--   '{base}~c:{name}:y'   hash: anchor id -> rolling summary JSON {text, anchor_seq, tokens},
--                         one per branch that has one (memory.tree.Tree.summaries)
--   '{base}~c:{name}:x'   string: the stored texts of the current thread's newest
--                         messages after their records (the thread's form: forms.lua;
--                         the hash's 'form' field holds their count and totals)
-- and '{base}~convs' is the set of the session's conversation names. The conversation's
-- hash also holds 'anchor', the anchor of the summary that applies to the current
-- thread (the deepest one on it), and 'covered_tokens', those of the stored messages it
-- covers, kept as the thread moves so that an append need not count them. Names follow the
-- key rules and '~' is in no key nor session id, so none of these can be one of the
-- node's keys or another session's. Every one expires with the session.
--
-- Keys used here: 19-27, the conversation the call names (conv_key gives them for that
-- name); 5, the session's conversation names; 11, the summarizers' queue. Other
-- conversations of the session are named from 5's members.

local function conv_key(name)
  return base .. '~c:' .. name
end

local function conv_keys(name)
  local c = conv_key(name)
  return {c, c .. ':m', c .. ':l', c .. ':t', c .. ':s', c .. ':k', c .. ':o', c .. ':y', c .. ':x'}
end

-- The session's conversations go with it (purge_leftovers; declared in redis.lua).
drop_conversations = function()
  local names = base .. '~convs'
  for _, name in ipairs(redis.call('SMEMBERS', names)) do
    redis.call('DEL', unpack(conv_keys(name)))
  end
  redis.call('DEL', names)
end

-- Bytes of every conversation's stored texts (they count toward MAX_SESSION_BYTES).
conversation_bytes = function()
  local total = 0
  for _, name in ipairs(redis.call('SMEMBERS', base .. '~convs')) do
    total = total + (tonumber(redis.call('HGET', conv_key(name), 'bytes')) or 0)
  end
  return total
end

local function link_of(c, id)
  local raw = redis.call('HGET', c .. ':l', id)
  return raw and cjson.decode(raw)
end

-- Where a message is on the current thread (0-based, searched from the end), or nil.
local function thread_position(c, id)
  local position = redis.pcall('LPOS', c .. ':t', id, 'RANK', -1) -- Redis 6.0.6
  if type(position) == 'number' then return position end
  return nil
end

-- Where the anchor of the summary that applies to the current thread is on it
-- (0-based), and that anchor; nil: no summary's anchor is on this thread.
local function anchor_position(c)
  local anchor = redis.call('HGET', c, 'anchor')
  if not anchor then return nil end
  local position = thread_position(c, anchor)
  if position then return position, anchor end
  return nil
end

-- Tokens of the current thread's first ``count`` messages.
local function thread_tokens(c, count)
  local total = 0
  for first = 0, count - 1, 512 do
    local ids = redis.call('LRANGE', c .. ':t', first, math.min(first + 511, count - 1))
    for _, raw in ipairs(redis.call('HMGET', c .. ':l', unpack(ids))) do total = total + window_link(raw).t end
  end
  return total
end

-- Choose the summary that applies to the current thread again (it moved past or off the
-- one that did, or lost it to a trim): the deepest anchor on it (memory.tree.Tree.find_anchor).
local function find_anchor(c)
  local best, deepest = nil, -1
  for _, anchor in ipairs(redis.call('HKEYS', c .. ':y')) do
    local position = thread_position(c, anchor)
    if position and position > deepest then best, deepest = anchor, position end
  end
  if best then
    redis.call('HSET', c, 'anchor', best, 'covered_tokens', thread_tokens(c, deepest + 1))
  else
    redis.call('HDEL', c, 'anchor', 'covered_tokens')
  end
end

-- cjson reads JSON null as cjson.null: nil instead.
local function text_or_nil(value)
  if type(value) == 'string' then
    return value
  end
  return nil
end

-- Tool calls still waiting for results on the thread ending at ``id`` (a set).
local function open_calls(c, id)
  local answered = {}
  local link = id and link_of(c, id)
  while link and link.r == 'tool' do
    answered[link.a] = true
    local parent = text_or_nil(link.p)
    link = parent and link_of(c, parent)
  end
  local open = {}
  if link then
    for _, call in ipairs(link.c) do
      if not answered[call] then open[call] = true end
    end
  end
  return open
end

-- The conversation hash's fields an append reads (commit), in this order.
local APPEND_FIELDS = {'head', 'seq', 'tokens', 'bytes', 'form'}

-- Check an append of the messages given from arg(first) on (id, body, link triples; all
-- the arguments left, or ``count`` of them) after ``parent`` (nil: the head; false: none,
-- a new root; ``checked``: the caller knows it is stored), without writing: each message
-- as it would be stored, and whether it is new. The plan's ``meta`` holds the
-- conversation hash's APPEND_FIELDS as read here, for commit (a caller that writes them
-- in between sets it to nil; one that has read them passes them as ``meta``). Returns nil
-- and an error reply when a check fails.
local function plan_append(name, parent, first, count, checked, meta)
  local c = conv_key(name)
  if parent and not checked and redis.call('HEXISTS', c .. ':m', parent) == 0 then
    return nil, fail('MESSAGE_NOT_FOUND', "The conversation has no message '" .. parent .. "'.")
  end
  meta = meta or redis.call('HMGET', c, unpack(APPEND_FIELDS))
  local previous = parent
  if parent == nil then previous = text_or_nil(meta[1]) end
  if not previous then previous = nil end
  local open
  if previous and previous == meta[1] and meta[5] and select(5, struct.unpack(FORM_HEAD, meta[5])) == 0 then
    open = {} -- the head is a plain message (the form's newest: the thread ends at the head)
  else
    open = open_calls(c, previous)
  end
  local seq = tonumber(meta[2]) or 0
  local plan = {meta = meta}
  local i = first
  local last = count and first + 3 * count - 1 or #ARGV
  while i < last and ARGV[16 + i] do -- arg(i), arg(i + 1), arg(i + 2), without a call each
    local id, body, tail = ARGV[16 + i], ARGV[17 + i], ARGV[18 + i]
    -- A plain message's link (most are) by pattern, not parsed; its fingerprint is read
    -- only to compare with a stored one.
    local given = window_link(tail)
    local stored = link_of(c, id)
    local where = 'messages[' .. #plan .. ']: '
    if stored then
      if stored.f ~= cjson.decode(tail).f then
        return nil, fail('MESSAGE_CONFLICT', where .. "message '" .. id .. "' is already stored with other content.")
      end
      open = open_calls(c, id)
      plan[#plan + 1] = {id = id, text = redis.call('HGET', c .. ':m', id), new = false}
    else
      if given.r == 'tool' then
        if not open[given.a] then
          return nil, fail('ORPHAN_TOOL_RESULT', where .. "tool_call_id '" .. tostring(given.a)
            .. "' answers no call open on this thread (a tool result must follow the assistant message that called it).")
        end
        open[given.a] = nil
      else
        open = {}
        for _, call in ipairs(given.c) do open[call] = true end
      end
      seq = seq + 1
      local parent_json = previous and cjson.encode(previous) or 'null'
      plan[#plan + 1] = {
        id = id, new = true, parent = previous, role = given.r, seq = seq, tokens = given.t,
        text = '{"id": ' .. cjson.encode(id) .. ', "parent_id": ' .. parent_json .. ', "seq": '
          .. seq .. ', ' .. string.sub(body, 2),
        link = '{"p": ' .. parent_json .. ', "s": ' .. seq .. ', ' .. string.sub(tail, 2),
      }
    end
    previous = id
    i = i + 3
  end
  return plan
end

local function new_bytes(plan)
  local total = 0
  for _, entry in ipairs(plan) do
    if entry.new then total = total + #entry.text end
  end
  return total
end

-- Whether nothing but system messages are above a message (a trimmed parent ends the walk).
local function only_system_above(c, link)
  local parent = text_or_nil(link.p)
  while parent do
    local above = link_of(c, parent)
    if not above then return true end
    if above.r ~= 'system' then return false end
    parent = text_or_nil(above.p)
  end
  return true
end

-- The system messages a trim kept before a message whose parent it removed (``first``):
-- older system messages with nothing but system messages above them (the rule of
-- memory.tree.Tree._pinned_before); {seq, id} pairs in seq order.
local function pinned_before(c, first)
  local pinned = {}
  local flat = redis.call('HGETALL', c .. ':l')
  for i = 1, #flat, 2 do
    local link = cjson.decode(flat[i + 1])
    if link.s < first.s and link.r == 'system' and only_system_above(c, link) then
      pinned[#pinned + 1] = {link.s, flat[i]}
    end
  end
  table.sort(pinned, function(a, b) return a[1] < b[1] end)
  return pinned
end

-- Ids from the root (or the newest ``limit``, 0: all) to ``leaf``, oldest first; a thread
-- whose start was trimmed starts with the system messages the trim kept. Also returns
-- the {seq, id} pairs of its system messages.
local function path(c, leaf, limit)
  local ids, systems, first = {}, {}, nil
  local id = leaf
  while id and (limit == 0 or #ids < limit) do
    local link = link_of(c, id)
    if not link then break end
    ids[#ids + 1] = id
    first = link
    if link.r == 'system' then systems[#systems + 1] = {link.s, id} end
    id = text_or_nil(link.p)
  end
  local ordered = {}
  local pinned = {}
  if id and first and (limit == 0 or #ids < limit) then -- walked to a trimmed parent
    pinned = pinned_before(c, first)
    if limit > 0 then
      while #pinned > limit - #ids do table.remove(pinned, 1) end
    end
  end
  for _, pair in ipairs(pinned) do ordered[#ordered + 1] = pair[2] end
  for j = #ids, 1, -1 do ordered[#ordered + 1] = ids[j] end
  for _, pair in ipairs(pinned) do systems[#systems + 1] = pair end
  return ordered, systems
end

-- Make the thread end at ``leaf``: walk up from it (an id off the current thread).
local function rebuild_thread(c, leaf)
  local ordered, systems = path(c, leaf, 0)
  form_stale(c)
  redis.call('DEL', c .. ':t', c .. ':s')
  new_key(c .. ':t')
  new_key(c .. ':s')
  if #ordered > 0 then call_chunked('RPUSH', c .. ':t', ordered) end
  local flat = {}
  for _, pair in ipairs(systems) do
    flat[#flat + 1] = pair[1]
    flat[#flat + 1] = pair[2]
  end
  if #flat > 0 then call_chunked('ZADD', c .. ':s', flat) end
end

-- Make the thread end at ``parent`` (nil: empty): cut it back when the parent is on it
-- (searched from the end, where regenerated answers branch), else walk up from it.
local function move_thread(c, parent)
  if not parent then
    form_stale(c)
    redis.call('DEL', c .. ':t', c .. ':s')
    find_anchor(c)
    return
  end
  if redis.call('LINDEX', c .. ':t', -1) == parent then
    return
  end
  local position = thread_position(c, parent)
  if position then
    form_stale(c)
    redis.call('LTRIM', c .. ':t', 0, position)
    local seq = link_of(c, parent).s
    redis.call('ZREMRANGEBYSCORE', c .. ':s', '(' .. seq, '+inf') -- seqs grow along a thread
    local anchor = redis.call('HGET', c, 'anchor')
    if anchor and link_of(c, anchor).s > seq then find_anchor(c) end -- cut back before it
    return
  end
  rebuild_thread(c, parent)
  find_anchor(c)
end

-- Remove the oldest messages (by seq, on any branch) beyond ``max_messages``, then tool
-- results left without their call; never the head nor the current thread's pinned
-- system messages; a summary whose anchor goes goes with it (the rule of
-- memory.tree.Tree.trim). Returns how many went.
local function trim(c, max_messages)
  local excess = redis.call('HLEN', c .. ':m') - max_messages
  if excess <= 0 then return 0 end
  local kept = {}
  for _, id in ipairs(redis.call('ZRANGE', c .. ':s', 0, -1)) do kept[id] = true end
  kept[redis.call('HGET', c, 'head')] = true
  -- With a summarizer, only what the current thread's summary covers goes (its anchor
  -- excepted): the thread before the anchor. Without, the oldest on any branch.
  local covered_end
  if summarize_after > 0 then
    covered_end = anchor_position(c)
    if not covered_end then return 0 end
  end
  local gone, order, position, done = {}, {}, 0, false
  while not done do
    local ids
    if covered_end then
      ids = position < covered_end and redis.call('LRANGE', c .. ':t', position, math.min(position + 63, covered_end - 1)) or {}
    else
      ids = redis.call('ZRANGE', c .. ':o', position, position + 63)
    end
    if #ids == 0 then break end
    local links = redis.call('HMGET', c .. ':l', unpack(ids))
    for j, id in ipairs(ids) do
      if not kept[id] then
        local link = cjson.decode(links[j])
        if #order >= excess then
          local parent = text_or_nil(link.p)
          local orphan = link.r == 'tool'
            and (not parent or gone[parent] or redis.call('HEXISTS', c .. ':m', parent) == 0)
          if not orphan then
            done = true
            break
          end
        end
        gone[id] = link
        order[#order + 1] = id
      end
    end
    position = position + 64
  end
  if #order == 0 then return 0 end
  local tokens, bytes = 0, 0
  for _, id in ipairs(order) do
    bytes = bytes + redis.call('HSTRLEN', c .. ':m', id)
    tokens = tokens + gone[id].t
  end
  call_chunked('HDEL', c .. ':m', order)
  call_chunked('HDEL', c .. ':l', order)
  call_chunked('ZREM', c .. ':o', order)
  call_chunked('SREM', c .. ':k', order)
  -- Those on the current thread are at its start, after its pinned system messages.
  local pinned = redis.call('ZCARD', c .. ':s')
  local cut = 0
  for _, id in ipairs(redis.call('LRANGE', c .. ':t', 0, #order + pinned)) do
    if gone[id] then cut = cut + redis.call('LREM', c .. ':t', 1, id) end
  end
  -- The form holds the thread's newest texts: untouched unless the cut reached into them.
  if cut > 0 then
    local head = redis.call('HGET', c, 'form')
    if head and redis.call('LLEN', c .. ':t') < struct.unpack(FORM_HEAD, head) + #order + pinned then
      form_stale(c)
    end
  end
  redis.call('HINCRBY', c, 'tokens', -tokens)
  redis.call('HINCRBY', c, 'bytes', -bytes)
  redis.call('HINCRBY', c, 'trimmed', #order)
  local anchors = redis.call('HKEYS', c .. ':y')
  if #anchors > 0 then
    for _, anchor in ipairs(anchors) do
      if gone[anchor] then redis.call('HDEL', c .. ':y', anchor) end
    end
    if covered_end then
      redis.call('HINCRBY', c, 'covered_tokens', -tokens)
    else -- what went may be anywhere: count again
      find_anchor(c)
    end
  end
  return #order
end

-- After conversation ``name`` grew or got a summary: trim it, record what was trimmed,
-- and mark it for a summarizer when its pending tokens pass the threshold (unmark it
-- otherwise) (memory.conversations._settle). ``seq``: the conversation's last seq, when the
-- caller knows it: a conversation holds at most that many messages (each has its own seq,
-- none above it), so at or under the cap it is not counted.
local function settle(name, seq)
  local c = conv_key(name)
  local max_messages = tonumber(arg_max_messages)
  local removed = 0
  if not seq or seq > max_messages then removed = trim(c, max_messages) end
  if removed > 0 then
    record(history_entry('trim_messages', nil, ', "conversation": ' .. cjson.encode(name)
      .. ', "removed": ' .. removed))
  end
  if summarize_after > 0 then
    local totals = redis.call('HMGET', c, 'tokens', 'covered_tokens')
    local pending = (tonumber(totals[1]) or 0) - (tonumber(totals[2]) or 0)
    if pending > summarize_after then
      redis.call('SADD', KEYS[11], sid .. ' ' .. name)
    else
      redis.call('SREM', KEYS[11], sid .. ' ' .. name)
    end
  end
end

-- Store a checked plan in conversation ``name``, trim it, record what was trimmed and
-- mark it for the mirror; the keys it created expire with the session. Returns the head.
-- The conversation's hash is read once and written once: its totals and the form's
-- records move with what the plan adds.
local function commit(name, plan)
  local c = conv_key(name)
  local meta = plan.meta or redis.call('HMGET', c, unpack(APPEND_FIELDS))
  local form, grown = meta[5] or nil, false
  local tokens, bytes, head, seq = 0, 0, nil, nil
  -- The current thread ends at the head (every move of the head moves the thread with
  -- it): an append after the head, as most are, leaves the thread where it is.
  local thread_end = text_or_nil(meta[1])
  for _, entry in ipairs(plan) do
    if entry.new then
      redis.call('HSET', c .. ':m', entry.id, entry.text)
      redis.call('HSET', c .. ':l', entry.id, entry.link)
      redis.call('ZADD', c .. ':o', entry.seq, entry.id)
      -- A parent new to the set may be its first member.
      if entry.parent and redis.call('SADD', c .. ':k', entry.parent) == 1 then new_key(c .. ':k') end
      if not entry.parent or entry.parent ~= thread_end then move_thread(c, entry.parent) end
      if redis.call('RPUSH', c .. ':t', entry.id) == 1 then new_key(c .. ':t') end
      thread_end = entry.id
      local pushed = form_push(c, form, entry)
      if pushed then form, grown = pushed, true end
      if entry.role == 'system' then
        redis.call('ZADD', c .. ':s', entry.seq, entry.id)
        new_key(c .. ':s')
      end
      tokens = tokens + entry.tokens
      bytes = bytes + #entry.text
      head, seq = entry.id, entry.seq
    end
  end
  -- Neither field was there: the conversation is new (a conversation's hash and its name in
  -- the session's set come and go together), and so is each of its keys written here.
  local created = not meta[1] and not meta[2]
  if head then
    if created and redis.call('SADD', base .. '~convs', name) == 1 then new_key(base .. '~convs') end
    local fields = {'head', head, 'seq', seq, 'tokens', (tonumber(meta[3]) or 0) + tokens,
      'bytes', (tonumber(meta[4]) or 0) + bytes}
    if grown and not stale_forms[c] then
      fields[#fields + 1] = 'form'
      fields[#fields + 1] = form
    end
    redis.call('HSET', c, unpack(fields))
    if created then
      for _, key in ipairs(conv_keys(name)) do new_key(key) end
    end
    settle(name, seq)
  end
  mark_dirty()
  return head or text_or_nil(meta[1])
end
