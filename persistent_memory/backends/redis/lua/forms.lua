-- The thread's form (below): the current thread's newest texts kept where a read takes
-- them without walking the thread, included into redis.lua before conversations.lua,
-- whose appends and moves of a thread keep it.
--
-- Part of the backend's one script (redis.lua includes it); KEYS as listed there.
-- Keys used here: 19-27, the conversation the call names (its hash '~c:{name}', its
-- ':m', ':l' and ':t' read to write the form again, and ':x', the form).

-- A link as the window reads it: a plain message's (no tool call, no result: most of
-- them) with one pattern, which costs a fraction of parsing it; cjson for the others.
-- The link's fields come in the order messages.stored_link writes them.
local NO_CALLS = {}
local PLAIN_LINK = '"t": (%d+), "r": "(%a+)", "c": %[%], "a": null, '
local function window_link(raw)
  local tokens, role = string.match(raw, PLAIN_LINK)
  if tokens then
    return {t = tonumber(tokens), r = role, c = NO_CALLS}
  end
  return cjson.decode(raw)
end

-- The thread's form: the current thread's newest texts in one string, ':x', after a
-- region of FORM_MAX fixed-size records, one a text: the running totals, from the form's
-- first text, of the tokens, of the bytes (where the text ends after the region) and of
-- the messages that are not plain (system messages, tool calls and their results). The
-- conversation's hash field 'form' holds how many texts it holds, their totals and the
-- newest one's kind (FORM_HEAD). A read finds what a window or the newest messages hold from a few records
-- (windows.lua, form_window) and answers their texts with one GETRANGE, one reply item
-- however many texts it holds: Redis turns every item a script reads or answers into a
-- Lua value and back, which cost more than the rest of a read, and every byte it reads
-- costs the script's garbage collector, so an append writes its record in place
-- (SETRANGE) and its text at the end (APPEND) without reading the form. When it holds
-- FORM_MAX texts, or whatever else changes the thread, it is marked stale and remember()
-- writes the newest FORM texts again before the reply goes out.
local FORM, FORM_MAX = 128, 256
local RECORD, RECORD_SIZE, FORM_HEAD = '>I4I4I4', 12, '>I4I4I4I4B'
local REGION = FORM_MAX * RECORD_SIZE
local stale_forms = {}

local function form_stale(c)
  stale_forms[c] = true
end

-- A record's kind: 0 for a plain message (what the window takes alone), 1 otherwise.
local function special(role, link)
  if role == 'system' or role == 'tool' or not string.find(link, PLAIN_LINK) then return 1 end
  return 0
end

-- Records ``from`` to ``to`` (1-based) of the form of conversation ``c``, read for record_at.
local function form_records(c, from, to)
  local records = to >= from and redis.call('GETRANGE', c .. ':x', (from - 1) * RECORD_SIZE,
    to * RECORD_SIZE - 1) or ''
  return {records = records, from = from}
end

-- The totals of record ``i`` (1-based; within what ``form`` read, or before the first,
-- whose totals are zeros).
local function record_at(form, i)
  if i < 1 then return 0, 0, 0 end
  local tokens, bytes, specials = struct.unpack(RECORD, form.records, (i - form.from) * RECORD_SIZE + 1)
  return tokens, bytes, specials
end

local function form_rebuild(c)
  redis.call('DEL', c .. ':x')
  local ids = redis.call('LRANGE', c .. ':t', -FORM, -1)
  if #ids == 0 then
    redis.call('HDEL', c, 'form')
    return
  end
  local texts = redis.call('HMGET', c .. ':m', unpack(ids))
  local links = redis.call('HMGET', c .. ':l', unpack(ids))
  local records, tokens, bytes, specials, kind = {}, 0, 0, 0, 0
  for i, text in ipairs(texts) do
    local link = window_link(links[i])
    kind = special(link.r, links[i])
    tokens, bytes, specials = tokens + link.t, bytes + #text, specials + kind
    records[i] = struct.pack(RECORD, tokens, bytes, specials)
  end
  redis.call('SET', c .. ':x', table.concat(records) .. string.rep('\0', REGION - #ids * RECORD_SIZE)
    .. table.concat(texts))
  new_key(c .. ':x')
  redis.call('HSET', c, 'form', struct.pack(FORM_HEAD, #ids, tokens, bytes, specials, kind))
end

-- Add a new head's text to the form, whose 'form' field was read as ``head`` (false: none);
-- returns the field to write in the conversation's hash (nil: nothing to write).
local function form_push(c, head, entry)
  if stale_forms[c] then return nil end
  local held, tokens, bytes, specials = 0, 0, 0, 0
  if head then held, tokens, bytes, specials = struct.unpack(FORM_HEAD, head) end
  if not head or held >= FORM_MAX then
    form_stale(c)
    return nil
  end
  local kind = special(entry.role, entry.link)
  tokens, bytes, specials = tokens + entry.tokens, bytes + #entry.text, specials + kind
  redis.call('SETRANGE', c .. ':x', held * RECORD_SIZE, struct.pack(RECORD, tokens, bytes, specials))
  redis.call('APPEND', c .. ':x', entry.text)
  return struct.pack(FORM_HEAD, held + 1, tokens, bytes, specials, kind)
end

settle_tails = function()
  for c in pairs(stale_forms) do form_rebuild(c) end
  stale_forms = {}
end

