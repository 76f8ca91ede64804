-- Conversation windows, summaries, snapshots and restores, and the idle expiry of a session.
--
-- Part of the backend's one script (redis.lua includes it); KEYS as listed there.
-- Keys used here: 19-27 (the conversation named), 12 the summarizers' health, 1-5 and 17-18
-- (touch: every key of the session, its value and conversation keys named from 2's and 5's
-- members).

-- How many texts the thread's form (conversations.lua) holds when they are the current
-- thread's newest (nil: none yet, written before it was kept, or stale in this call).
-- ``known``: its 'form' field as the call read it (false: none), else nil.
local function form_of(c, length, known)
  if stale_forms[c] then return nil end
  local head = known
  if head == nil then head = redis.call('HGET', c, 'form') end
  if not head then return nil end
  local held = struct.unpack(FORM_HEAD, head)
  if held > length then return nil end
  return held
end

-- The window's messages from the form's ``held`` records, the thread being ``length``
-- long, as the walk below would take them: the first record taken, the tokens taken,
-- whether an older message was left out, whether the walk reached ``lowest``, and the
-- records read. The running totals find the oldest record the budgets let in by
-- bisection, in the records the budgets may reach (one GETRANGE). Nil when the walk must
-- decide: a message that is not plain (a system message, a tool call or result) is
-- among those it would meet, or the window reaches further back than the form.
local function form_window(c, held, length, lowest, token_room, message_room)
  local offset = length - held -- the thread position of the form's first record
  if lowest < offset then
    offset = nil
  end
  local low = offset and lowest - offset + 1 or 1
  local first = math.max(low, held - message_room + 1)
  local form = form_records(c, math.max(1, first - 2), held)
  local all_tokens, _, all_specials = record_at(form, held)
  local lo, hi = first, held + 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if all_tokens - record_at(form, mid - 1) <= token_room then hi = mid else lo = mid + 1 end
  end
  first = lo
  local taken = all_tokens - record_at(form, first - 1)
  if first > low then -- the walk stops at the record before the first, if that one is plain
    local _, _, specials = record_at(form, first - 2)
    if all_specials - specials > 0 then return nil end
    return first, taken, true, false, form
  end
  local _, _, specials = record_at(form, first - 1)
  if not offset or all_specials - specials > 0 then return nil end
  return first, taken, false, true, form
end

-- The window (the rule of persistent_memory.chat.window, kept in step with it):
-- its message ids in order, its tokens, and whether older messages were left out; then,
-- when the form found the window, the form and the first and last of its records that
-- follow those ids (the pinned system messages) in the window.
-- With ``after`` (a thread position: the summary's anchor), of the messages after it
-- only; the walk then ends there without leaving anything out. ``known`` as for form_of.
local function window(name, max_tokens, max_messages, after, known)
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
  local length = redis.call('LLEN', c .. ':t')
  local position = length - 1
  local held = not full and form_of(c, length, known)
  local form, first_record
  if held then
    local taken
    first_record, taken, truncated, reached_start, form =
      form_window(c, held, length, lowest, token_room, message_room)
    if first_record then
      used, full = used + taken, true
    else
      truncated, reached_start = false, false
    end
  end
  -- The first read: what the budgets let in, by the conversation's mean message size (a
  -- link costs more to read than the message count suggests: read few, then double).
  local chunk = math.min(128, (max_messages or 31) + 1)
  if max_tokens and not full then
    local tokens = tonumber(redis.call('HGET', c, 'tokens'))
    local count = redis.call('HLEN', c .. ':m')
    if tokens and tokens > 0 and count > 0 then
      chunk = math.max(8, math.min(chunk, math.floor(token_room * count / tokens * 1.25) + 4))
    end
  end
  while not full do
    if position < lowest then
      reached_start = true
      break
    end
    local first = math.max(lowest, position - chunk + 1)
    local ids = redis.call('LRANGE', c .. ':t', first, position)
    local links = redis.call('HMGET', c .. ':l', unpack(ids))
    for j = #ids, 1, -1 do
      -- A plain message (most are) with no tool results waiting is a group of its own:
      -- taken without building its link (the walk's cost is per message read).
      local plain, role = string.match(links[j], PLAIN_LINK)
      if plain and #results == 0 and role ~= 'tool' and role ~= 'system' then
        local tokens = tonumber(plain)
        if tokens > token_room or message_room < 1 then
          truncated, full = true, true
          break
        end
        used = used + tokens
        token_room = token_room - tokens
        message_room = message_room - 1
        groups[#groups + 1] = ids[j]
      else
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
  local ids = {}
  for i, member in ipairs(pinned) do ids[i] = member.id end
  for g = #groups, 1, -1 do
    local group = groups[g]
    if type(group) == 'string' then
      ids[#ids + 1] = group
    else
      for _, member in ipairs(group) do ids[#ids + 1] = member.id end
    end
  end
  if first_record then return ids, used, truncated, form, first_record, held end
  return ids, used, truncated
end

-- Texts as a read answers them, after the items it answers before them: a list of the
-- stored texts of ``ids``; then, with ``form`` (records as form_records read them), the
-- texts of records ``first`` to ``last`` as two items: the texts back to back (one GETRANGE) and their records, whose
-- byte totals tell the client where each one ends.
local function add_texts(reply, c, ids, form, first, last)
  reply[#reply + 1] = #ids > 0 and call_chunked('HMGET', c .. ':m', ids) or {}
  if form then
    local _, start = record_at(form, first - 1)
    local _, finish = record_at(form, last)
    reply[#reply + 1] = finish > start and redis.call('GETRANGE', c .. ':x', REGION + start, REGION + finish - 1) or ''
    reply[#reply + 1] = string.sub(form.records, (first - form.from) * RECORD_SIZE + 1, (last - form.from + 1) * RECORD_SIZE)
  end
  return reply
end

-- A window as the reply's tail: tokens, truncated (1/0), the summary (false: none), its
-- tokens, the summarizers' state (false unless ``rolling``), then the texts (add_texts).
-- With ``rolling``, a summary whose anchor is on the thread comes first and the window
-- holds the messages after its anchor, within the budget less the summary's tokens (all
-- of it unless ``reserve``: the client shortens the summary to what is left). ``known``
-- as for form_of.
local function window_reply(reply, name, max_tokens, max_messages, rolling, reserve, known)
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
  local ids, used, truncated, form, first, last = window(name, max_tokens, max_messages, after, known)
  reply[#reply + 1] = used
  reply[#reply + 1] = truncated and 1 or 0
  reply[#reply + 1] = summary
  reply[#reply + 1] = summary_tokens
  reply[#reply + 1] = state
  return add_texts(reply, c, ids, form, first, last)
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
    form_rebuild(c)
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
  local keys = {META, KEYSET, HISTORY, RUNS, base .. '~convs', base .. '~cp', base .. '~cpi'}
  for _, key in ipairs(redis.call('SMEMBERS', KEYSET)) do keys[#keys + 1] = base .. key end
  for _, name in ipairs(redis.call('SMEMBERS', base .. '~convs')) do
    for _, key in ipairs(conv_keys(name)) do keys[#keys + 1] = key end
  end
  for _, key in ipairs(keys) do redis.call('PEXPIREAT', key, at) end
end
