-- Operations that create a missing session: create and the pipeline lanes (enrich, answer).
--
-- Part of the backend's one script (redis.lua includes it); KEYS as listed there.
-- Keys used here: 1-10 the session and its bucket's indexes, 13 idempotency record, 14 the run binding
-- named, 19-27 the conversation a lane records into.

-- Operations that create a missing session -----------------------------------

on({'create'}, function()
if op == 'create' then
  if redis.call('EXISTS', META) == 1 then
    return fail('EXISTS', "Session '" .. sid .. "' already exists.")
  end
  if not owner_has_room() then return no_room() end
  local expires, idle = create(now, arg(1), arg(2), arg(3))
  return remember({now, arg(1), 0, 0, expires, idle}) -- as set, not read back (see create)
end
end)

-- arg(1) ttl text, 2 ttl ms, 3 run reference ('' none), 4 its TTL ms; with a question
-- to record (conversations.lua): 5 conversation ('' none), 6 max tokens, 7 max messages
-- ('' no limit), 8-10 the question (id, body, link), 11 '1' for a rolling window, 12 '1'
-- to reserve its summary's tokens. Replies the values' object, and with a question: the
-- question's id, then the window as window_reply gives it.
on({'enrich'}, function()
if op == 'enrich' then
  -- The arguments as locals, read at once: each arg() is a Lua function call.
  local ttl_text, ttl_ms, run_ref, run_ttl, name, max_tokens, max_messages, question, _, _, rolling, reserve =
    unpack(ARGV, 17, 28)
  local plan = nil
  local live = redis.call('EXISTS', META) == 1
  local keys, values -- the session's, read once: for the byte cap and for the reply
  if name ~= '' then -- checked before anything is written
    if not live then
      purge_leftovers() -- of a session gone: what a new one under this id must not see
    end
    local failure
    plan, failure = plan_append(name, nil, 8, 1)
    if not plan then return failure end
    local ok, total = true, new_bytes(plan)
    if live then
      keys, values = stored_values()
      if byte_cap > 0 then
        local sizes = {}
        for i, key in ipairs(keys) do sizes[key] = values[i] and #values[i] or 0 end
        ok, total = fits(sizes, total, true)
      end
    elseif byte_cap > 0 then
      ok = total <= byte_cap
    end
    if not ok then return too_big(total) end
  end
  if not live then
    if not owner_has_room() then return no_room() end
    create(now, ttl_text, ttl_ms, default_idle_ms)
  end
  if run_ref ~= '' then
    bind(run_ref, run_ttl, plan and (name .. ' ' .. question))
  end
  if not plan then
    return remember(values_object(keys, values))
  end
  local reply = {values_object(keys, values), question}
  -- The window is read before the question goes on the thread.
  window_reply(reply, name, limit_or_nil(max_tokens), limit_or_nil(max_messages), rolling == '1', reserve == '1',
    plan.meta[5])
  commit(name, plan)
  return remember(reply)
end
end)

-- arg(1) ttl text, 2 ttl ms, 3 the answer's JSON, 4 run reference ('' none); with a
-- message to record (conversations.lua): 5 conversation ('' none), 6 parent id ('': the
-- run's question, else the head), 7-9 the message (id, body, link).
-- ARGV[2] 'bound': the session was found through the run (the cluster layout's pointer),
-- so it is answered only while the run's binding names it, as without a session.
on({'answer'}, function()
if op == 'answer' then
  local ttl_text, ttl_ms, answer, run_ref, name, parent_given = unpack(ARGV, 17, 22)
  local bound, asked_in, asked = binding(run_ref ~= '' and redis.call('GET', KEYS[14]))
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
  local plan = nil
  name = name or ''
  local created = redis.call('EXISTS', META) == 0
  if name ~= '' then -- after the run's question when the binding names one here, else the parent given
    if created then
      purge_leftovers()
    end
    local parent = text_or_nil(parent_given ~= '' and parent_given)
    local c = conv_key(name)
    local meta = redis.call('HMGET', c, unpack(APPEND_FIELDS))
    -- The head is stored (nothing removes it but a move of the head): the run's question
    -- still at the head, as it mostly is, needs no lookup.
    local head = text_or_nil(meta[1])
    if bound == sid and asked_in == name and (asked == head or redis.call('HEXISTS', c .. ':m', asked) == 1) then
      parent = asked
    elseif parent and parent ~= head and redis.call('HEXISTS', c .. ':m', parent) == 0 then
      parent = nil
    end
    local failure
    plan, failure = plan_append(name, parent, 7, nil, true, meta)
    if not plan then return failure end
  end
  if created then
    if not owner_has_room() then return no_room() end
    create(now, ttl_text, ttl_ms, default_idle_ms)
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
  local ok, total = true, nil
  if byte_cap > 0 then
    ok, total = fits({last_answer = #answer, answer_count = #tostring(count)}, plan and new_bytes(plan))
  end
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
  redis.call('SET', base .. 'last_answer', answer)
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
end)
