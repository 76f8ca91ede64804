-- The conversation operations (messages, read_messages, context, conversations, head,
-- clear_messages, pop, thread, summary_source, commit_summary).
--
-- Part of the backend's one script (redis.lua includes it); KEYS as listed there.
-- Keys used here: 1 meta, 2 the key set, 5 conversation names, 15 the value key named
-- (thread), 19-27 the conversation named; through sessions.lua, the session's keys and
-- indexes when an append creates it.

-- The conversation operations: arg(1) is the conversation's name (but for 'conversations').

-- Before an append that may create the session: nil when the session (live, or created
-- now with that TTL) has room for the plan and the values in ``sizes`` (key -> new
-- length), else the error reply (nothing written).
local function make_room(live, sizes, plan, ttl_text, ttl_ms)
  local ok, total = true, new_bytes(plan)
  if live then
    ok, total = fits(sizes, total)
  else
    for key, size in pairs(sizes) do total = total + #key + size end
    ok = byte_cap <= 0 or total <= byte_cap
  end
  if not ok then return too_big(total) end
  if not live then
    if not owner_has_room() then return no_room() end
    create(now, ttl_text, ttl_ms, default_idle_ms)
  end
end

-- Append (add_messages): arg(2) parent id ('': the head), 3 ttl text, 4 ttl ms, then
-- (id, body, link) triples. Creates the session when it is not live. Replies the head,
-- then the batch's stored texts.
on({'messages'}, function()
if op == 'messages' then
  local name = arg(1)
  local live = redis.call('EXISTS', META) == 1
  if not live then
    purge_leftovers() -- of a session gone: what a new one under this id must not see
  end
  local plan, failure = plan_append(name, text_or_nil(arg(2) ~= '' and arg(2)), 5)
  if not plan then return failure end
  failure = make_room(live, {}, plan, arg(3), arg(4))
  if failure then return failure end
  local reply = {commit(name, plan) or ''}
  for _, entry in ipairs(plan) do reply[#reply + 1] = entry.text end
  return remember(reply)
end
end)

on({'read_messages', 'context', 'conversations', 'head', 'clear_messages', 'pop'}, function()
if op == 'read_messages' or op == 'context' or op == 'conversations' or op == 'head'
  or op == 'clear_messages' or op == 'pop' then
  local err = check_live()
  if err then return err end
end
end)

-- The thread ending at arg(2) ('': the head), its newest arg(3) messages ('0': all):
-- the head ('' for none), then the texts, oldest first (add_texts). The current thread's
-- come from its form when it holds them.
on({'read_messages', 'context'}, function()
if (op == 'read_messages' or op == 'context') and refresh_reads then
  touch()
end
end)

on({'read_messages'}, function()
if op == 'read_messages' then
  local c = conv_key(arg(1))
  local leaf, limit = text_or_nil(arg(2) ~= '' and arg(2)), tonumber(arg(3))
  local reply = {redis.call('HGET', c, 'head') or ''}
  if leaf then
    if redis.call('HEXISTS', c .. ':m', leaf) == 0 then
      return fail('MESSAGE_NOT_FOUND', "Conversation '" .. arg(1) .. "' has no message '" .. leaf .. "'.")
    end
    return add_texts(reply, c, (path(c, leaf, limit)))
  end
  local length = redis.call('LLEN', c .. ':t')
  local count = limit > 0 and math.min(limit, length) or length
  local held = form_of(c, length)
  if held and count <= held then
    local first = held - count + 1
    return add_texts(reply, c, {}, form_records(c, math.max(1, first - 1), held), first, held)
  end
  return add_texts(reply, c, redis.call('LRANGE', c .. ':t', length - count, -1))
end
end)

-- The window: arg(2) max tokens, 3 max messages ('': no limit). Replies tokens,
-- truncated (1/0), then the texts.
-- arg(4) '1': rolling, 5 '1': reserve the summary's tokens.
on({'context'}, function()
if op == 'context' then
  return window_reply({}, arg(1), limit_or_nil(arg(2)), limit_or_nil(arg(3)), arg(4) == '1', arg(5) == '1')
end
end)

-- Flat name, head ('' for none), message count, tokens, branch count, trimmed.
on({'conversations'}, function()
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
end)

-- Move the head to arg(2).
on({'head'}, function()
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
end)

-- Remove the conversation; reply how many messages it held.
on({'clear_messages'}, function()
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
end)

-- Take the head off the current thread (pop_message): arg(1) conversation, 2 the head it
-- must still be, then the replacement's (id, body, link) triples, appended after its
-- parent. The head is removed unless another branch goes on from it; a summary anchored
-- there goes with it; a conversation left empty goes as a clear takes it. Replies the
-- removed text, the head after ('' for none), then the replacement's stored texts.
on({'pop'}, function()
if op == 'pop' then
  local name = arg(1)
  local c = conv_key(name)
  local head = redis.call('HGET', c, 'head')
  if not head then
    return fail('MESSAGE_NOT_FOUND', "Conversation '" .. name .. "' has no messages.")
  end
  if head ~= arg(2) then
    return fail('HEAD_MOVED', "The head of conversation '" .. name .. "' is no longer '" .. arg(2) .. "'.")
  end
  local link = link_of(c, head)
  local parent = text_or_nil(link.p)
  if parent and redis.call('HEXISTS', c .. ':m', parent) == 0 then parent = nil end -- trimmed
  local plan, failure = plan_append(name, parent or false, 3)
  if not plan then return failure end
  for _, entry in ipairs(plan) do
    if entry.id == head then
      return fail('MESSAGE_CONFLICT', "The replacement reuses the id '" .. head .. "' of the message it takes.")
    end
  end
  local ok, total = fits({}, new_bytes(plan))
  if not ok then return too_big(total) end
  local removed = redis.call('HGET', c .. ':m', head)
  redis.call('RPOP', c .. ':t') -- the head ends the current thread
  form_stale(c)
  redis.call('ZREM', c .. ':s', head)
  if parent then redis.call('HSET', c, 'head', parent) else redis.call('HDEL', c, 'head') end
  if redis.call('SISMEMBER', c .. ':k', head) == 0 then
    redis.call('HDEL', c .. ':m', head)
    redis.call('HDEL', c .. ':l', head)
    redis.call('ZREM', c .. ':o', head)
    redis.call('HINCRBY', c, 'tokens', -link.t)
    redis.call('HINCRBY', c, 'bytes', -#removed)
    if parent then
      local pattern = '"p": ' .. cjson.encode(parent) .. ','
      local siblings = false
      for _, raw in ipairs(redis.call('HVALS', c .. ':l')) do
        if string.find(raw, pattern, 1, true) then
          siblings = true
          break
        end
      end
      if not siblings then redis.call('SREM', c .. ':k', parent) end
    end
    redis.call('HDEL', c .. ':y', head)
  end
  if redis.call('HGET', c, 'anchor') == head then find_anchor(c) end
  if redis.call('HLEN', c .. ':m') == 0 then
    redis.call('DEL', unpack(conv_keys(name)))
    redis.call('SREM', base .. '~convs', name)
  end
  record(history_entry('pop_message', nil, ', "conversation": ' .. cjson.encode(name)
    .. ', "removed": ' .. cjson.encode(head)))
  plan.meta = nil -- the hash changed since the plan read it
  local reply = {removed, commit(name, plan) or ''}
  for _, entry in ipairs(plan) do reply[#reply + 1] = entry.text end
  return remember(reply)
end
end)

-- A compare-and-set of a conversation and the record kept beside it (write_thread):
-- arg(1) conversation, 2 the record's key (a session value, KEYS[15]), 3 the revision it
-- must hold ('': no record and no such conversation), 4 its new JSON text ('': remove the
-- record and the conversation, and the session when nothing else is left in it), 5 the
-- messages' parent ('': a new root), 6 the head after ('': none), 7 ttl text, 8 ttl ms,
-- then (id, body, link) triples. Creates the session when it is not live. Replies the
-- messages' stored texts.
on({'thread'}, function()
if op == 'thread' then
  local name, key, expected, value = arg(1), arg(2), arg(3), arg(4)
  local c = conv_key(name)
  local live = redis.call('EXISTS', META) == 1
  if not live then purge_leftovers() end
  local stored = live and redis.call('GET', base .. key)
  local matches
  if expected == '' then
    matches = not stored and redis.call('EXISTS', c) == 0
  elseif stored then
    local parsed, record = pcall(cjson.decode, stored)
    matches = parsed and type(record) == 'table' and record.revision == expected
  end
  if not matches then
    return fail('REVISION_CONFLICT', "The record of conversation '" .. name .. "' has another revision.")
  end
  if value == '' then
    local count = redis.call('HLEN', c .. ':m')
    redis.call('DEL', base .. key, unpack(conv_keys(name)))
    redis.call('SREM', KEYSET, key)
    redis.call('SREM', base .. '~convs', name)
    if redis.call('EXISTS', KEYSET, base .. '~convs', base .. '~cp') == 0 then
      purge_leftovers() -- as a delete leaves it
      redis.call('DEL', META)
      unindex(sid)
    else
      record(history_entry('clear', key))
      if count > 0 then
        record(history_entry('clear_messages', nil, ', "conversation": ' .. cjson.encode(name)
          .. ', "removed": ' .. count))
      end
    end
    mark_dirty()
    return remember({})
  end
  local plan, failure = plan_append(name, text_or_nil(arg(5) ~= '' and arg(5)) or false, 9)
  if not plan then return failure end
  local head = text_or_nil(arg(6) ~= '' and arg(6))
  if head and redis.call('HEXISTS', c .. ':m', head) == 0 then
    local planned = false
    for _, entry in ipairs(plan) do planned = planned or entry.id == head end
    if not planned then
      return fail('MESSAGE_NOT_FOUND', "Conversation '" .. name .. "' has no message '" .. head .. "'.")
    end
  end
  failure = make_room(live, {[key] = #value}, plan, arg(7), arg(8))
  if failure then return failure end
  commit(name, plan)
  if not head then
    if redis.call('EXISTS', c) == 1 then
      move_thread(c, nil)
      redis.call('HDEL', c, 'head')
    end
  elseif redis.call('HEXISTS', c .. ':m', head) == 1 then -- not trimmed by the append
    move_thread(c, head)
    redis.call('HSET', c, 'head', head)
  end
  redis.call('SET', base .. key, value)
  new_key(base .. key)
  if redis.call('SADD', KEYSET, key) > 0 then new_key(KEYSET) end
  record(history_entry('put', key))
  local reply = {}
  for _, entry in ipairs(plan) do reply[#reply + 1] = entry.text end
  return remember(reply)
end
end)

-- The summary (text, anchor, anchor seq, tokens, covered tokens: false when none applies
-- to the current thread), then the current thread's stored texts after its anchor.
on({'summary_source'}, function()
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
  return add_texts(reply, c, ids)
end
end)

-- Compare-and-set of a summary: arg(1) conversation, 2 the anchor it continues ('' for
-- none: the current thread had no summary), 3 text, 4 anchor, 5 its seq, 6 tokens, 7
-- covered tokens (counted again here). 1 when stored as the current thread's summary
-- (those anchored on the thread before it, which it continues, go; those of other
-- branches stay; then trimmed and marked as an append would be), 0 when the thread's
-- anchor moved or the new one is no longer on the thread.
on({'commit_summary'}, function()
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
end)
