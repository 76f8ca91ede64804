-- Conversations (persistent_memory.backends.conversations), included into redis.lua
-- where it says so: the lanes use these helpers in the same script, so that recording a
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
--                         one per branch that has one (memory_tree.Tree.summaries)
-- and '{base}~convs' is the set of the session's conversation names. The conversation's
-- hash also holds 'anchor', the anchor of the summary that applies to the current
-- thread (the deepest one on it), and 'covered_tokens', those of the stored messages it
-- covers, kept as the thread moves so that an append need not count them. Names follow the
-- key rules and '~' is in no key nor session id, so none of these can be one of the
-- node's keys or another session's. Every one expires with the session.

local function conv_key(name)
  return base .. '~c:' .. name
end

local function conv_keys(name)
  local c = conv_key(name)
  return {c, c .. ':m', c .. ':l', c .. ':t', c .. ':s', c .. ':k', c .. ':o', c .. ':y'}
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

-- A link as the window reads it: a plain message's (no tool call, no result: most of
-- them) with one pattern, which costs a fraction of parsing it; cjson for the others.
-- The link's fields come in the order messages.stored_link writes them.
local NO_CALLS = {}
local function window_link(raw)
  local tokens, role = string.match(raw, '"t": (%d+), "r": "(%a+)", "c": %[%], "a": null, ')
  if tokens then
    return {t = tonumber(tokens), r = role, c = NO_CALLS}
  end
  return cjson.decode(raw)
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
-- one that did, or lost it to a trim): the deepest anchor on it (memory_tree.Tree.find_anchor).
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

-- Check an append of the messages given from arg(first) on (id, body, link triples; all
-- the arguments left, or ``count`` of them) after
-- ``parent`` (nil: the head), without writing: each message as it would be stored, and
-- whether it is new. Returns nil and an error reply when a check fails.
local function plan_append(name, parent, first, count)
  local c = conv_key(name)
  if parent and redis.call('HEXISTS', c .. ':m', parent) == 0 then
    return nil, fail('MESSAGE_NOT_FOUND', "The conversation has no message '" .. parent .. "'.")
  end
  local previous = parent or text_or_nil(redis.call('HGET', c, 'head'))
  local open = open_calls(c, previous)
  local seq = tonumber(redis.call('HGET', c, 'seq')) or 0
  local plan = {}
  local i = first
  local last = count and first + 3 * count - 1 or #ARGV
  while i < last and arg(i) do
    local id, body, tail = arg(i), arg(i + 1), arg(i + 2)
    local given = cjson.decode(tail)
    local stored = link_of(c, id)
    local where = 'messages[' .. #plan .. ']: '
    if stored then
      if stored.f ~= given.f then
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
-- memory_tree.Tree._pinned_before); {seq, id} pairs in seq order.
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
    redis.call('DEL', c .. ':t', c .. ':s')
    find_anchor(c)
    return
  end
  if redis.call('LINDEX', c .. ':t', -1) == parent then
    return
  end
  local position = thread_position(c, parent)
  if position then
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
-- memory_tree.Tree.trim). Returns how many went.
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
  for _, id in ipairs(redis.call('LRANGE', c .. ':t', 0, #order + redis.call('ZCARD', c .. ':s'))) do
    if gone[id] then redis.call('LREM', c .. ':t', 1, id) end
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
-- otherwise) (memory_conversations._settle).
local function settle(name)
  local c = conv_key(name)
  local removed = trim(c, tonumber(arg_max_messages))
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
local function commit(name, plan)
  local c = conv_key(name)
  local tokens, bytes, head, seq = 0, 0, nil, nil
  for _, entry in ipairs(plan) do
    if entry.new then
      redis.call('HSET', c .. ':m', entry.id, entry.text)
      redis.call('HSET', c .. ':l', entry.id, entry.link)
      redis.call('ZADD', c .. ':o', entry.seq, entry.id)
      -- A parent new to the set may be its first member.
      if entry.parent and redis.call('SADD', c .. ':k', entry.parent) == 1 then new_key(c .. ':k') end
      move_thread(c, entry.parent)
      if redis.call('RPUSH', c .. ':t', entry.id) == 1 then new_key(c .. ':t') end
      if entry.role == 'system' then
        redis.call('ZADD', c .. ':s', entry.seq, entry.id)
        new_key(c .. ':s')
      end
      tokens = tokens + entry.tokens
      bytes = bytes + #entry.text
      head, seq = entry.id, entry.seq
    end
  end
  if head then
    if redis.call('SADD', base .. '~convs', name) == 1 then new_key(base .. '~convs') end
    -- Both fields new: so is the conversation, and each of its keys written above.
    if redis.call('HSET', c, 'head', head, 'seq', seq) == 2 then
      for _, key in ipairs(conv_keys(name)) do new_key(key) end
    end
    redis.call('HINCRBY', c, 'tokens', tokens)
    redis.call('HINCRBY', c, 'bytes', bytes)
    settle(name)
  end
  mark_dirty()
  return text_or_nil(redis.call('HGET', c, 'head'))
end

-- The window (the rule of persistent_memory.conversations.window, kept in step with it):
-- its ids in order, its tokens, and whether older messages were left out.
-- With ``after`` (a thread position: the summary's anchor), of the messages after it
-- only; the walk then ends there without leaving anything out.
local function window(name, max_tokens, max_messages, after)
  local c = conv_key(name)
  local lowest = after and after + 1 or 0
  local token_room = max_tokens or math.huge
  local message_room = max_messages or math.huge
  local pinned, used, truncated = {}, 0, false
  for _, id in ipairs(redis.call('ZRANGE', c .. ':s', 0, -1)) do
    local link = link_of(c, id)
    local tokens = link.t
    if tokens > token_room or message_room < 1 then
      truncated = true
      break
    end
    link.id = id
    pinned[#pinned + 1] = link
    used = used + tokens
    token_room = token_room - tokens
    message_room = message_room - 1
  end
  local groups, results = {}, {}
  local full, reached_start = truncated, false
  local position = redis.call('LLEN', c .. ':t') - 1
  local chunk = math.min(128, (max_messages or 31) + 1) -- the window in one read, mostly
  while not full do
    if position < lowest then
      reached_start = true
      break
    end
    local first = math.max(lowest, position - chunk + 1)
    local ids = redis.call('LRANGE', c .. ':t', first, position)
    local links = redis.call('HMGET', c .. ':l', unpack(ids))
    for j = #ids, 1, -1 do
      local link = window_link(links[j])
      link.id = ids[j]
      if link.r == 'tool' then
        results[#results + 1] = link
      elseif link.r ~= 'system' then
        local group, skip = {link}, false
        if #link.c > 0 then
          local answered = {}
          for k = #results, 1, -1 do
            group[#group + 1] = results[k]
            answered[results[k].a] = true
          end
          for _, call in ipairs(link.c) do
            if not answered[call] and #groups > 0 then skip = true end
          end
        elseif #results > 0 then
          truncated = true -- results whose call is gone (trimmed): left out
        end
        results = {}
        if not skip then
          local tokens = 0
          for _, member in ipairs(group) do tokens = tokens + member.t end
          if tokens > token_room or #group > message_room then
            truncated, full = true, true
            break
          end
          used = used + tokens
          token_room = token_room - tokens
          message_room = message_room - #group
          groups[#groups + 1] = group
        end
      end
    end
    position = first - 1
    chunk = chunk * 2
  end
  if reached_start and not truncated then
    if #results > 0 then
      truncated = true
    elseif not after then -- the thread's first message after the pinned ones lost its parent to trimming
      local head = redis.call('LRANGE', c .. ':t', 0, redis.call('ZCARD', c .. ':s'))
      for _, id in ipairs(head) do
        local link = link_of(c, id)
        if link.r ~= 'system' then
          local parent = text_or_nil(link.p)
          truncated = parent ~= nil and redis.call('HEXISTS', c .. ':m', parent) == 0
          break
        end
      end
    end
  end
  local members = pinned
  for g = #groups, 1, -1 do
    for _, member in ipairs(groups[g]) do members[#members + 1] = member end
  end
  return members, used, truncated
end

-- The stored texts of ``ids`` (in order).
local function texts_of(name, ids)
  if #ids == 0 then return {} end
  return call_chunked('HMGET', conv_key(name) .. ':m', ids)
end

-- A window as the reply's tail: tokens, truncated (1/0), the summary (false: none), its
-- tokens, the summarizers' state (false unless ``rolling``), then the texts. With
-- ``rolling``, a summary whose anchor is on the thread comes first and the window holds
-- the messages after its anchor, within the budget less the summary's tokens (all of it
-- unless ``reserve``: the client shortens the summary to what is left).
local function window_reply(reply, name, max_tokens, max_messages, rolling, reserve)
  local c = conv_key(name)
  local after, summary, summary_tokens, state = nil, false, 0, false
  if rolling then
    state = redis.call('HGET', KEYS[12], 'state') or 'healthy'
    local anchor
    after, anchor = anchor_position(c)
    if after then
      local held = cjson.decode(redis.call('HGET', c .. ':y', anchor))
      summary, summary_tokens = held.text, held.tokens
      if max_tokens and reserve then max_tokens = math.max(0, max_tokens - summary_tokens) end
    end
  end
  local members, used, truncated = window(name, max_tokens, max_messages, after)
  reply[#reply + 1] = used
  reply[#reply + 1] = truncated and 1 or 0
  reply[#reply + 1] = summary
  reply[#reply + 1] = summary_tokens
  reply[#reply + 1] = state
  local ids = {}
  for i, member in ipairs(members) do ids[i] = member.id end
  for _, text in ipairs(texts_of(name, ids)) do reply[#reply + 1] = text end
  return reply
end

local function limit_or_nil(text)
  if text == nil or text == '' then return nil end
  return tonumber(text)
end

-- The summary anchored at ``anchor``: {text, anchor, anchor seq, tokens, covered tokens}
-- (those given, else counted from the stored messages it covers).
local function summary_fields(c, anchor, covered)
  local held = cjson.decode(redis.call('HGET', c .. ':y', anchor))
  if not covered then
    covered = 0
    local ids = path(c, anchor, 0)
    if #ids > 0 then
      for _, raw in ipairs(call_chunked('HMGET', c .. ':l', ids)) do covered = covered + window_link(raw).t end
    end
  end
  return {held.text, anchor, held.anchor_seq, held.tokens, covered}
end

-- Every conversation of the session, for the mirror and export: flat name, head ('' for
-- none), seq, trimmed, the list of its stored texts (any order), then the list of its
-- summaries (each as summary_fields gives it, any order).
local function conversations_snapshot()
  local flat = {}
  for _, name in ipairs(redis.call('SMEMBERS', base .. '~convs')) do
    local c = conv_key(name)
    local meta = redis.call('HMGET', c, 'head', 'seq', 'trimmed')
    flat[#flat + 1] = name
    flat[#flat + 1] = meta[1] or ''
    flat[#flat + 1] = tonumber(meta[2]) or 0
    flat[#flat + 1] = tonumber(meta[3]) or 0
    flat[#flat + 1] = redis.call('HVALS', c .. ':m')
    local summaries = {}
    for _, anchor in ipairs(redis.call('HKEYS', c .. ':y')) do
      summaries[#summaries + 1] = summary_fields(c, anchor)
    end
    flat[#flat + 1] = summaries
  end
  return flat
end

-- Write conversations given as the JSON text of a list of {name, head, seq, trimmed,
-- tokens, bytes, thread: [ids], system: [[seq, id]], parents: [ids], messages: [[id,
-- text, link, seq]], summaries: [{text, anchor, anchor_seq, tokens}]} (the restore op;
-- the client derives the thread and the rest). Message
-- texts are JSON strings inside it, so they come back byte for byte. Returns the keys
-- written, for their expiry.
local function restore_conversations(blob)
  local keys = {}
  if blob == '' then return keys end
  for _, conversation in ipairs(cjson.decode(blob)) do
    local name = conversation.name
    local c = conv_key(name)
    redis.call('DEL', unpack(conv_keys(name)))
    local head = text_or_nil(conversation.head)
    redis.call('HSET', c, 'seq', conversation.seq, 'trimmed', conversation.trimmed,
      'tokens', conversation.tokens, 'bytes', conversation.bytes)
    if head then redis.call('HSET', c, 'head', head) end
    local texts, links, order = {}, {}, {}
    for _, message in ipairs(conversation.messages) do
      texts[#texts + 1] = message[1]
      texts[#texts + 1] = message[2]
      links[#links + 1] = message[1]
      links[#links + 1] = message[3]
      order[#order + 1] = message[4]
      order[#order + 1] = message[1]
    end
    if #texts > 0 then
      call_chunked('HSET', c .. ':m', texts)
      call_chunked('HSET', c .. ':l', links)
      call_chunked('ZADD', c .. ':o', order)
    end
    if #conversation.thread > 0 then call_chunked('RPUSH', c .. ':t', conversation.thread) end
    local systems = {}
    for _, pair in ipairs(conversation.system) do
      systems[#systems + 1] = pair[1]
      systems[#systems + 1] = pair[2]
    end
    if #systems > 0 then call_chunked('ZADD', c .. ':s', systems) end
    if #conversation.parents > 0 then call_chunked('SADD', c .. ':k', conversation.parents) end
    for _, summary in ipairs(conversation.summaries) do
      if redis.call('HEXISTS', c .. ':m', summary.anchor) == 1 then
        redis.call('HSET', c .. ':y', summary.anchor,
          cjson.encode({text = summary.text, anchor_seq = summary.anchor_seq, tokens = summary.tokens}))
      end
    end
    find_anchor(c)
    redis.call('SADD', base .. '~convs', name)
    for _, key in ipairs(conv_keys(name)) do keys[#keys + 1] = key end
  end
  keys[#keys + 1] = base .. '~convs'
  return keys
end

-- Push the idle expiry of every key of the current session to now plus its idle TTL
-- (never past its fixed deadline); nothing for a session without one. Skipped while
-- the expiry is within 1% of the idle TTL (at most a second) of where it would go, so
-- a busy session is not rewritten on every call; all its keys keep one expiry.
touch = function()
  local spec = redis.call('HMGET', META, 'idle_ttl_ms', 'deadline_ms')
  local idle = tonumber(spec[1])
  if not idle then return end
  local at = server_ms() + idle
  local deadline = tonumber(spec[2])
  if deadline and deadline < at then at = deadline end
  local current = expire_time()
  if current > 0 and at - current < math.min(1000, idle / 100) then return end
  local keys = {META, KEYSET, HISTORY, RUNS, base .. '~convs'}
  for _, key in ipairs(redis.call('SMEMBERS', KEYSET)) do keys[#keys + 1] = base .. key end
  for _, name in ipairs(redis.call('SMEMBERS', base .. '~convs')) do
    for _, key in ipairs(conv_keys(name)) do keys[#keys + 1] = key end
  end
  for _, key in ipairs(keys) do redis.call('PEXPIREAT', key, at) end
end

-- The conversation operations: arg(1) is the conversation's name (but for 'conversations').

-- Append (add_messages): arg(2) parent id ('': the head), 3 ttl text, 4 ttl ms, then
-- (id, body, link) triples. Creates the session when it is not live. Replies the head,
-- then the batch's stored texts.
if op == 'messages' then
  local name = arg(1)
  local live = redis.call('EXISTS', META) == 1
  if not live then
    purge_leftovers() -- of a session gone: what a new one under this id must not see
  end
  local plan, failure = plan_append(name, text_or_nil(arg(2) ~= '' and arg(2)), 5)
  if not plan then return failure end
  local ok, total = true, new_bytes(plan)
  if live then
    ok, total = fits({}, total)
  elseif byte_cap > 0 then
    ok = total <= byte_cap
  end
  if not ok then return too_big(total) end
  if not live then
    if not owner_has_room() then return no_room() end
    create(now, arg(3), arg(4), default_idle_ms)
  end
  local reply = {commit(name, plan) or ''}
  for _, entry in ipairs(plan) do reply[#reply + 1] = entry.text end
  return remember(reply)
end

if op == 'read_messages' or op == 'context' or op == 'conversations' or op == 'head'
  or op == 'clear_messages' then
  local err = check_live()
  if err then return err end
end

-- The thread ending at arg(2) ('': the head), its newest arg(3) messages ('0': all):
-- the head ('' for none), then the texts, oldest first.
if (op == 'read_messages' or op == 'context') and refresh_reads then
  touch()
end

if op == 'read_messages' then
  local c = conv_key(arg(1))
  local leaf, limit = text_or_nil(arg(2) ~= '' and arg(2)), tonumber(arg(3))
  local reply = {redis.call('HGET', c, 'head') or ''}
  local ids
  if leaf then
    if redis.call('HEXISTS', c .. ':m', leaf) == 0 then
      return fail('MESSAGE_NOT_FOUND', "Conversation '" .. arg(1) .. "' has no message '" .. leaf .. "'.")
    end
    ids = path(c, leaf, limit)
  elseif limit > 0 then
    ids = redis.call('LRANGE', c .. ':t', -limit, -1)
  else
    ids = redis.call('LRANGE', c .. ':t', 0, -1)
  end
  for _, text in ipairs(texts_of(arg(1), ids)) do reply[#reply + 1] = text end
  return reply
end

-- The window: arg(2) max tokens, 3 max messages ('': no limit). Replies tokens,
-- truncated (1/0), then the texts.
-- arg(4) '1': rolling, 5 '1': reserve the summary's tokens.
if op == 'context' then
  return window_reply({}, arg(1), limit_or_nil(arg(2)), limit_or_nil(arg(3)), arg(4) == '1', arg(5) == '1')
end

-- Flat name, head ('' for none), message count, tokens, branch count, trimmed.
if op == 'conversations' then
  local reply = {}
  for _, name in ipairs(redis.call('SMEMBERS', base .. '~convs')) do
    local c = conv_key(name)
    local meta = redis.call('HMGET', c, 'head', 'tokens', 'trimmed')
    local count = redis.call('HLEN', c .. ':m')
    reply[#reply + 1] = name
    reply[#reply + 1] = meta[1] or ''
    reply[#reply + 1] = count
    reply[#reply + 1] = tonumber(meta[2]) or 0
    reply[#reply + 1] = count - redis.call('SCARD', c .. ':k')
    reply[#reply + 1] = tonumber(meta[3]) or 0
  end
  return reply
end

-- Move the head to arg(2).
if op == 'head' then
  local c = conv_key(arg(1))
  if redis.call('HEXISTS', c .. ':m', arg(2)) == 0 then
    return fail('MESSAGE_NOT_FOUND', "Conversation '" .. arg(1) .. "' has no message '" .. arg(2) .. "'.")
  end
  move_thread(c, arg(2))
  redis.call('HSET', c, 'head', arg(2))
  mark_dirty()
  return remember(arg(2))
end

-- Remove the conversation; reply how many messages it held.
if op == 'clear_messages' then
  local name = arg(1)
  local c = conv_key(name)
  local count = redis.call('HLEN', c .. ':m')
  if redis.call('EXISTS', c) == 0 then
    return remember(0)
  end
  redis.call('DEL', unpack(conv_keys(name)))
  redis.call('SREM', base .. '~convs', name)
  record(history_entry('clear_messages', nil, ', "conversation": ' .. cjson.encode(name)
    .. ', "removed": ' .. count))
  return remember(count)
end


-- The summary (text, anchor, anchor seq, tokens, covered tokens: false when none applies
-- to the current thread), then the current thread's stored texts after its anchor.
if op == 'summary_source' then
  local err = check_live()
  if err then return err end
  local c = conv_key(arg(1))
  local after, anchor = anchor_position(c)
  local reply = {false, false, 0, 0, 0}
  if after then
    reply = summary_fields(c, anchor, tonumber(redis.call('HGET', c, 'covered_tokens')))
  end
  local ids = redis.call('LRANGE', c .. ':t', after and after + 1 or 0, -1)
  for _, text in ipairs(texts_of(arg(1), ids)) do reply[#reply + 1] = text end
  return reply
end

-- Compare-and-set of a summary: arg(1) conversation, 2 the anchor it continues ('' for
-- none: the current thread had no summary), 3 text, 4 anchor, 5 its seq, 6 tokens, 7
-- covered tokens (counted again here). 1 when stored as the current thread's summary
-- (those anchored on the thread before it, which it continues, go; those of other
-- branches stay; then trimmed and marked as an append would be), 0 when the thread's
-- anchor moved or the new one is no longer on the thread.
if op == 'commit_summary' then
  if redis.call('EXISTS', META) == 0 then return 0 end
  local name = arg(1)
  local c = conv_key(name)
  if redis.call('EXISTS', c) == 0 then return 0 end
  local position = thread_position(c, arg(4))
  local after, current = anchor_position(c)
  if not position or (current or '') ~= arg(2) or position <= (after or -1) then return 0 end
  for _, anchor in ipairs(redis.call('HKEYS', c .. ':y')) do
    if thread_position(c, anchor) then redis.call('HDEL', c .. ':y', anchor) end -- all before it
  end
  redis.call('HSET', c .. ':y', arg(4),
    cjson.encode({text = arg(3), anchor_seq = tonumber(arg(5)), tokens = tonumber(arg(6))}))
  new_key(c .. ':y')
  -- What it covers, counted here: a trim between the read and this commit changed it.
  redis.call('HSET', c, 'anchor', arg(4), 'covered_tokens', thread_tokens(c, position + 1))
  settle(name)
  mark_dirty()
  align_new_keys() -- not remember(): a summary does not keep an idle session alive
  return 1
end
