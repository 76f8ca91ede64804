-- Listing: the operations on no one session that read a bucket's indexes (list, list_info,
-- page, bucket_page).
--
-- Part of the backend's one script (redis.lua includes it); KEYS as listed there.
-- Keys used here: 6-7 the listing of the namespace searched, 8 node set, 9 owned set, 10 dirty set, 16 the
-- scratch set of a search; each listed id's meta, named from the index.

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

-- The current session's info (its meta a hash); nil when another of its keys is not
-- of its type.
local function info_if_sound()
  local ok, fields = pcall(info)
  if ok then
    return fields
  end
end

on({'list', 'list_info'}, function()
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
        local kind = redis.call('TYPE', META).ok
        if kind == 'none' then
          stale[#stale + 1] = id
          mark_dirty(id)
        elseif op == 'list' then -- a damaged one too: its id, for an operator to delete it
          live[#live + 1] = id
        elseif op == 'list_info' then
          local fields = kind == 'hash' and info_if_sound()
          if fields then -- else damaged (see 'page'): left out
            live[#live + 1] = id
            for _, field in ipairs(fields) do live[#live + 1] = field end
          end
        end
      end
    end
  end
  for _, id in ipairs(stale) do unindex(id) end
  return live
end
end)

-- How many live sessions the namespace of KEYS[6] (an owner's listing) holds in this
-- bucket, once the ids of those gone are dropped: for an owner's cap in the cluster layout.
on({'owner_count'}, function()
if op == 'owner_count' then
  BY_TIME = KEYS[6]
  prune_owner_index()
  return redis.call('ZCARD', BY_TIME)
end
end)

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
-- arg(2) offset, arg(3) limit, arg(4) and arg(5) a position to start after (a creation
-- time, as text, and an id: the last session of the page before; '' for the start),
-- arg(6) '1' for ids and creation times alone (no info). Replies the count, how many
-- sessions were skipped as damaged, then each session's id and info (or creation time).
--
-- Without a search the page is a range of the time index: O(log N + limit), from the
-- start or from a position (its rank counted with ZCOUNT and ZREVRANK, both O(log N)),
-- so a page deep in the listing costs what the first one costs. A search counts its
-- matches in the name index (ZLEXCOUNT, O(log N)), then either walks the time index
-- newest first keeping the ids with the prefix, when the page should come within WALK
-- times the matches' number of ids, or orders the matches by time in a sorted set of
-- the script's own, '{prefix}:~search' (ZRANGESTORE of the lex range, then ZINTERSTORE
-- with the time index), deleted before it returns. A walk that reads past its budget
-- (matches bunched far back) turns to the latter, so a search costs O(log N + matches
-- log matches) at most, and a first page of a wide search far less.
--
-- An id whose session has gone (expired, not yet swept) is dropped from the indexes
-- where the page meets it and the page reads on past it, so it still holds ``limit``
-- sessions; the count leaves out those met. A session whose keys are not of their type
-- (written over by hand: the meta not a hash, ...) is skipped and counted apart, so
-- that one damaged session does not fail its owner's listing; it stays indexed, and
-- deleting it removes its keys.
local WALK = 4

-- How many entries of ``ordered`` (newest first) come before the one after the
-- position ``at`` (a creation time's text) and ``after`` (an id): O(log N), plus the
-- ids of equal times when ``after`` has left the set.
local function rank_after(ordered, at, after)
  local rank = redis.call('ZCOUNT', ordered, '(' .. at, '+inf')
  local score = redis.call('ZSCORE', ordered, after)
  if score and tonumber(score) == tonumber(at) then
    return redis.call('ZREVRANK', ordered, after) + 1
  end
  if redis.call('ZCOUNT', ordered, at, at) == 0 then
    return rank
  end
  local first = 0
  while true do
    local ties = redis.call('ZREVRANGEBYSCORE', ordered, at, at, 'LIMIT', first, CHUNK)
    for _, id in ipairs(ties) do
      if not bytewise(after, id) then
        return rank
      end
      rank = rank + 1
    end
    if #ties < CHUNK then
      return rank
    end
    first = first + CHUNK
  end
end

on({'page'}, function()
if op == 'page' then
  local wanted, offset, limit = arg(1), tonumber(arg(2)), tonumber(arg(3))
  local at, after, ids_only = arg(4) or '', arg(5) or '', arg(6) == '1'
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

  -- Where a walk of ``ordered`` starts: after the position given, else at the top.
  local function start_of(ordered)
    if at == '' then
      return 0
    end
    return rank_after(ordered, at, after)
  end

  -- Read ``ordered`` newest first from ``position``, keeping the ids that start with
  -- ``filter`` (nil: all), skipping ``skip`` of them, up to ``limit`` live ones. With
  -- a ``budget``, false when more ids than that were read before the page was full.
  local reply, found = {0, 0}, 0
  local function walk(ordered, filter, position, skip, budget)
    local read = 0
    while found < limit do
      local want = limit - found
      if filter then
        want = math.min(CHUNK, math.ceil((want + skip) * everyone / total) + 16)
      end
      local ids = redis.call('ZREVRANGE', ordered, position, position + want - 1, 'WITHSCORES')
      for i = 1, #ids, 2 do
        local id = ids[i]
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
          local kind = redis.call('TYPE', META).ok
          local fields = kind == 'hash' and (ids_only or info_if_sound())
          if fields then
            reply[#reply + 1] = id
            if ids_only then
              reply[#reply + 1] = ids[i + 1]
            else
              for _, field in ipairs(fields) do reply[#reply + 1] = field end
            end
            found = found + 1
            position = position + 1
          elseif kind ~= 'none' then -- damaged: skipped, kept indexed
            reply[2] = reply[2] + 1
            total = total - 1
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
      read = read + #ids / 2
      if #ids / 2 < want then
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
    walk(by_time, nil, start_of(by_time) + offset, 0)
  elseif (offset + limit) * everyone / total <= WALK * total
    and walk(by_time, wanted, start_of(by_time), offset, WALK * total) then
    -- the page came from the walk
  else
    reply, found = {0, 0}, 0
    total = sorted_matches()
    walk(search, nil, start_of(search) + offset, 0)
    redis.call('DEL', search)
  end
  reply[1] = total
  return reply
end
end)

-- One bucket's part of a page in the cluster layout, whose 64 buckets
-- RedisBackend._merged_page asks at once and merges. arg(1) the storage id prefix,
-- arg(2) the part of the page this bucket should hold, with a margin (a number of
-- sessions, not always whole), arg(3) the most sessions it returns, arg(4) and arg(5) a
-- position to start after (as for 'page'; '' for the top), arg(6) '1' for ids and
-- creation times alone, as index positions (an offset counts those, as in the node
-- layout: no session is checked). Replies the count (before this call met any session
-- gone or damaged), how many sessions were skipped as damaged, how many were dropped as
-- gone, the position (time, id) of the last id examined, or '' '' when the bucket holds
-- nothing after it, then the sessions as 'page' gives them.
--
-- A bucket examines as many ids as should hold its part (the part times its ids per
-- match: the time index walked newest first from the position, ids without the prefix
-- passed over), or, when it holds far fewer matches than that, every match
-- (ZRANGEBYLEX, then their times) ordered in Lua, which costs about LEX_COST times as
-- much a match as the walk an id. The client asks again, from the position returned,
-- only a bucket whose position is still above the merged page's end: a search of
-- 10,000 among a million sessions examines ~160 ids a bucket.
local LEX_COST = 4

on({'bucket_page'}, function()
if op == 'bucket_page' then
  local wanted, part, at, after = arg(1), tonumber(arg(2)), arg(4), arg(5)
  local ids_only = arg(6) == '1'
  local by_time, by_name = listing_sets(wanted)
  local namespace = namespace_of(wanted) or ''
  if namespace == '' then
    catch_up_unowned()
  end
  local searching = #wanted > #namespace
  local from, to = '[' .. wanted, '(' .. wanted .. '\255'
  local everyone = redis.call('ZCARD', by_time)
  local total = searching and redis.call('ZLEXCOUNT', by_name, from, to) or everyone
  local reply = {total, 0, 0, '', ''}
  local keep, found, last_at, last_id = math.min(tonumber(arg(3)), total), 0, nil, nil

  -- Whether the session ``id`` (at ``score``, false when not read) went on the page or
  -- was passed as damaged; false when it has gone (dropped from the indexes: the next id
  -- moves up to its place).
  local function take(id, score)
    last_at, last_id = score, id
    if ids_only then
      reply[#reply + 1], reply[#reply + 2] = id, score
      found = found + 1
      return true
    end
    use_session(id)
    local kind = redis.call('TYPE', META).ok
    local fields = kind == 'hash' and info_if_sound()
    if fields then
      reply[#reply + 1] = id
      for _, field in ipairs(fields) do reply[#reply + 1] = field end
      found = found + 1
    elseif kind ~= 'none' then -- damaged: skipped, kept indexed (see 'page')
      reply[2] = reply[2] + 1
    else
      last_at = last_at or redis.call('ZSCORE', by_time, id) -- the position, before it goes
      unindex(id)
      mark_dirty(id)
      reply[3] = reply[3] + 1
      return false
    end
    return true
  end

  local reach = math.min(everyone, math.max(keep, math.ceil(part * everyone / math.max(total, 1))))
  local exhausted = false
  if keep == 0 then
    exhausted = true
  elseif searching and total * LEX_COST <= reach then -- every match, ordered by time here
    local matches = redis.call('ZRANGEBYLEX', by_name, from, to)
    local ok, scores = pcall(call_chunked, 'ZMSCORE', by_time, matches) -- Redis 6.2
    local start, entries = tonumber(at), {}
    for i, id in ipairs(matches) do
      local text = ok and scores[i]
      if not ok then
        text = redis.call('ZSCORE', by_time, id)
      end
      local score = text and tonumber(text)
      if score and (not start or score < start or (score == start and bytewise(id, after))) then
        entries[#entries + 1] = {score, id, text}
      end
    end
    table.sort(entries, function(a, b)
      if a[1] ~= b[1] then return a[1] > b[1] end
      return bytewise(b[2], a[2])
    end)
    exhausted = true
    for _, entry in ipairs(entries) do
      if found == keep then
        exhausted = false
        break
      end
      take(entry[2], entry[3])
    end
  else -- the time index from the position, as many ids as should hold the part
    -- Times only where the reply needs them: reading them costs as much as the ids.
    local position, budget, step = at == '' and 0 or rank_after(by_time, at, after), reach, ids_only and 2 or 1
    while budget > 0 and found < keep do
      local asked = budget
      local range = {'ZREVRANGE', by_time, position, position + asked - 1, ids_only and 'WITHSCORES' or nil}
      local ids = redis.call(unpack(range))
      for i = 1, #ids, step do
        if found == keep then
          break
        end
        local id, score = ids[i], ids_only and ids[i + 1]
        budget = budget - 1
        if searching and string.sub(id, 1, #wanted) ~= wanted then
          last_at, last_id, position = score, id, position + 1
        elseif take(id, score) then
          position = position + 1
        else
          budget = budget + 1 -- a gone id is not examined: its place is read again
        end
      end
      if #ids / step < asked and found < keep then -- every id up to the index's end examined
        exhausted = true
        break
      end
    end
  end
  if not exhausted and last_id then
    reply[4], reply[5] = last_at or redis.call('ZSCORE', by_time, last_id), last_id
  end
  return reply
end
end)
