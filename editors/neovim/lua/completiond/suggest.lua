--- The suggestion state machine for one buffer: debounced textDocument/inlineCompletion requests
--- (the previous one cancelled on every keystroke), streamed `completiond/partial` text, typing
--- that matches the suggestion consumed locally, and accepting all / a word / a line.
---
--- Invariant: a suggestion is shown only while the buffer's changedtick and cursor equal the
--- state's (tick, row, col), i.e. every change since was either typed-and-matched or accepted
--- through this module. Anything else clears it.
local api = vim.api
local ghost = require('completiond.ghost')

local M = {}

local METHOD = 'textDocument/inlineCompletion'
local HAS_011 = vim.fn.has('nvim-0.11') == 1

---@class completiond.State
---@field bufnr integer
---@field client_id integer
---@field uri string
---@field req? {id?: integer, version: integer, line: integer, character: integer, done: boolean}
---@field typed string text typed or accepted since the request's position
---@field text? string the suggestion still to insert (what is shown), nil when nothing is shown
---@field items? string[] the request's suggestions in full (greedy first), once it answered
---@field index? integer which of items is shown
---@field row integer cursor row (0-based) the state is consistent with
---@field col integer cursor byte column
---@field tick integer changedtick the state is consistent with
---@field line string the cursor line at (tick)
---@field nlines integer
---@field timer? uv.uv_timer_t

---@type table<integer, completiond.State>
M.states = {}
M.stats = { requests = 0, cancels = 0, partials = 0 }
---@type table set by completiond.setup
M.cfg = nil

local function client_call(client, name, ...)
  if HAS_011 then
    return client[name](client, ...)
  end
  return client[name](...)
end

local function in_insert()
  return api.nvim_get_mode().mode:sub(1, 1) == 'i'
end

local function cursor()
  local pos = api.nvim_win_get_cursor(0)
  return pos[1] - 1, pos[2]
end

--- Record the buffer as it is now as the state's consistent point.
local function snapshot(st)
  st.row, st.col = cursor()
  st.tick = api.nvim_buf_get_changedtick(st.bufnr)
  st.line = api.nvim_buf_get_lines(st.bufnr, st.row, st.row + 1, false)[1] or ''
  st.nlines = api.nvim_buf_line_count(st.bufnr)
end

local function render(st)
  if st.text and st.text ~= '' then
    ghost.show(st.bufnr, st.row, st.col, st.text, M.cfg.hl_group)
  else
    st.text = nil
    ghost.clear(st.bufnr)
  end
end

local function stop_timer(st)
  if st.timer then
    st.timer:stop()
    if not st.timer:is_closing() then
      st.timer:close()
    end
    st.timer = nil
  end
end

--- Forget the request (cancelling it in the server if it still runs) and the shown text.
local function drop(st)
  local req = st.req
  st.req, st.text, st.typed, st.items, st.index = nil, nil, '', nil, nil
  if req and req.id and not req.done then
    local client = vim.lsp.get_client_by_id(st.client_id)
    if client then
      client_call(client, 'cancel_request', req.id)
      M.stats.cancels = M.stats.cancels + 1
    end
  end
  ghost.clear(st.bufnr)
end

--- The full suggestion for st.req arrived or grew: show what the user has not typed yet.
local function on_text(st, full)
  if api.nvim_get_current_buf() ~= st.bufnr or not in_insert() then
    return
  end
  local row, col = cursor()
  if api.nvim_buf_get_changedtick(st.bufnr) ~= st.tick or row ~= st.row or col ~= st.col then
    return -- the buffer moved on; the autocmd that follows will ask again
  end
  if full:sub(1, #st.typed) ~= st.typed then
    st.text = nil -- the user typed something else than this suggestion
  else
    st.text = full:sub(#st.typed + 1)
  end
  render(st)
end

local schedule

local function send(st)
  local client = vim.lsp.get_client_by_id(st.client_id)
  if not client or api.nvim_get_current_buf() ~= st.bufnr or not in_insert() then
    return
  end
  if not client.initialized then
    return schedule(st) -- still starting: try again after another debounce
  end
  drop(st)
  snapshot(st)
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
  params.context = { triggerKind = 2 } -- Automatic
  local req = {
    version = vim.lsp.util.buf_versions[st.bufnr] or st.tick,
    line = params.position.line,
    character = params.position.character,
    done = false,
  }
  st.req, st.typed = req, ''
  local ok, id = client_call(client, 'request', METHOD, params, function(err, result)
    req.done = true
    if st.req ~= req or err or not result then
      return
    end
    local items = {}
    for _, item in ipairs(result.items or result) do
      local text = item.insertText
      if type(text) == 'table' then
        text = text.value -- a snippet string; completiond sends plain text
      end
      if type(text) == 'string' then
        items[#items + 1] = text
      end
    end
    if #items > 0 then
      st.items, st.index = items, 1
      on_text(st, items[1])
    end
  end, st.bufnr)
  if ok then
    req.id = id
    M.stats.requests = M.stats.requests + 1
  else
    st.req = nil
  end
end

--- Ask again once the user pauses for debounce_ms.
function schedule(st)
  stop_timer(st)
  local timer = assert(vim.uv.new_timer())
  st.timer = timer
  local tick = st.tick
  timer:start(M.cfg.debounce_ms, 0, vim.schedule_wrap(function()
    if st.timer ~= timer then
      return
    end
    stop_timer(st)
    if M.states[st.bufnr] == st and st.tick == tick and M.enabled then
      send(st)
    end
  end))
end

--- If the change since the snapshot is exactly the start of the shown suggestion typed on the
--- same line, return what was typed.
local function typed_prefix(st, row, col)
  if not st.text or row ~= st.row or col <= st.col or api.nvim_buf_line_count(st.bufnr) ~= st.nlines then
    return nil
  end
  local line = api.nvim_buf_get_lines(st.bufnr, row, row + 1, false)[1] or ''
  local typed = line:sub(st.col + 1, col)
  if st.line:sub(1, st.col) .. typed .. st.line:sub(st.col + 1) ~= line then
    return nil
  end
  if st.text:sub(1, #typed) ~= typed or #typed >= #st.text then
    return nil -- a different character, or the whole suggestion typed out
  end
  return typed
end

--- TextChangedI / CursorMovedI (and InsertEnter).
function M.on_event(bufnr)
  local st = M.states[bufnr]
  if not st or not in_insert() or api.nvim_get_current_buf() ~= bufnr then
    return
  end
  local row, col = cursor()
  local tick = api.nvim_buf_get_changedtick(bufnr)
  if tick == st.tick and row == st.row and col == st.col then
    return -- nothing new (e.g. CursorMovedI after the TextChangedI of the same key)
  end
  local typed = tick ~= st.tick and typed_prefix(st, row, col)
  if typed then
    st.typed = st.typed .. typed
    st.text = st.text:sub(#typed + 1)
    snapshot(st)
    render(st) -- the request keeps running: more streamed text may follow
    return
  end
  drop(st)
  snapshot(st)
  if M.enabled then
    schedule(st)
  end
end

--- InsertEnter fires before the mode changes: ask once the user pauses (send() re-reads the cursor).
function M.on_insert_enter(bufnr)
  local st = M.states[bufnr]
  if st and M.enabled then
    drop(st)
    snapshot(st)
    schedule(st)
  end
end

function M.reset(bufnr)
  local st = M.states[bufnr]
  if st then
    stop_timer(st)
    drop(st)
  end
end

--- `completiond/partial` notification: {uri, version, position, text}.
function M.on_partial(_, params)
  if type(params) ~= 'table' then
    return
  end
  M.stats.partials = M.stats.partials + 1
  for _, st in pairs(M.states) do
    local req = st.req
    if st.uri == params.uri and req and not req.done and params.version == req.version
        and params.position and params.position.line == req.line
        and params.position.character == req.character and type(params.text) == 'string' then
      on_text(st, params.text)
      return
    end
  end
end

local function first_word(s)
  local w = s:match('^[ \t]*[%w_\128-\255]+') or s:match('^[ \t]*[^%w_\128-\255%s]+')
    or s:match('^[ \t]*\r?\n[ \t]*') or s:match('^%s+')
  return w or s
end

local function first_line(s)
  if s:sub(1, 1) == '\n' then
    return '\n' .. (s:sub(2):match('^[^\n]*') or '')
  end
  return s:match('^[^\n]*')
end

--- The suggestion shown in the current buffer (the text still to insert), or nil.
function M.visible(bufnr)
  bufnr = bufnr or api.nvim_get_current_buf()
  local st = M.states[bufnr]
  if not st or not st.text or api.nvim_get_current_buf() ~= bufnr then
    return nil
  end
  local row, col = cursor()
  if api.nvim_buf_get_changedtick(bufnr) ~= st.tick or row ~= st.row or col ~= st.col then
    return nil -- shown for a buffer state that has moved on (its autocmd has not run yet)
  end
  return st.text
end

--- Whether a request for bufnr is waiting for its debounce or its answer.
function M.busy(bufnr)
  local st = M.states[bufnr or api.nvim_get_current_buf()]
  return st ~= nil and (st.timer ~= nil or (st.req ~= nil and not st.req.done))
end

--- Insert all / the first word / the first line of the shown suggestion at the cursor.
---@param what? 'all'|'word'|'line'
---@return boolean accepted
function M.accept(what)
  local bufnr = api.nvim_get_current_buf()
  local st = M.states[bufnr]
  if not st or not st.text then
    return false
  end
  local row, col = cursor()
  if api.nvim_buf_get_changedtick(bufnr) ~= st.tick or row ~= st.row or col ~= st.col then
    drop(st)
    return false
  end
  local chunk = st.text
  if what == 'word' then
    chunk = first_word(chunk)
  elseif what == 'line' then
    chunk = first_line(chunk)
  end
  local rest = st.text:sub(#chunk + 1)
  local lines = vim.split(chunk, '\n', { plain = true })
  api.nvim_buf_set_text(bufnr, row, col, row, col, lines)
  local end_row = row + #lines - 1
  local end_col = (#lines == 1 and col or 0) + #lines[#lines]
  api.nvim_win_set_cursor(0, { end_row + 1, end_col })
  st.typed = st.typed .. chunk
  st.text = rest ~= '' and rest or nil
  snapshot(st)
  if st.text then
    render(st)
  else
    drop(st) -- all of it taken: ask for what comes next
    if M.enabled then
      schedule(st)
    end
  end
  return true
end

--- Show the next (dir 1) or previous (-1) of the request's suggestions that still fits what was
--- typed or accepted since it was asked for. Returns false when there is none to switch to.
function M.cycle(dir)
  local bufnr = api.nvim_get_current_buf()
  local st = M.states[bufnr]
  if not st or not st.items or #st.items < 2 or not M.visible(bufnr) then
    return false
  end
  local n = #st.items
  for step = 1, n - 1 do
    local i = (st.index - 1 + dir * step) % n + 1
    local full = st.items[i]
    if full:sub(1, #st.typed) == st.typed and #full > #st.typed then
      st.index, st.text = i, full:sub(#st.typed + 1)
      render(st)
      return true
    end
  end
  return false
end

function M.dismiss()
  local st = M.states[api.nvim_get_current_buf()]
  if not st or not st.text then
    return false
  end
  stop_timer(st)
  drop(st)
  return true
end

function M.attach(bufnr, client_id)
  if M.states[bufnr] then
    M.states[bufnr].client_id = client_id
    return
  end
  local st = { bufnr = bufnr, client_id = client_id, uri = vim.uri_from_bufnr(bufnr), typed = '',
               row = -1, col = -1, tick = -1, line = '', nlines = 0 }
  M.states[bufnr] = st
  local group = api.nvim_create_augroup('completiond_buf_' .. bufnr, { clear = true })
  api.nvim_create_autocmd({ 'TextChangedI', 'CursorMovedI' }, {
    group = group, buffer = bufnr, callback = function() M.on_event(bufnr) end,
  })
  api.nvim_create_autocmd('InsertEnter', {
    group = group, buffer = bufnr, callback = function() M.on_insert_enter(bufnr) end,
  })
  -- the popup menu changes text without TextChangedI: hide the ghost until typing resumes
  api.nvim_create_autocmd({ 'InsertLeave', 'BufLeave', 'TextChangedP' }, {
    group = group, buffer = bufnr, callback = function() M.reset(bufnr) end,
  })
  api.nvim_create_autocmd({ 'BufWipeout', 'BufUnload' }, {
    group = group, buffer = bufnr, callback = function() M.detach(bufnr) end,
  })
  if in_insert() and api.nvim_get_current_buf() == bufnr then
    M.on_insert_enter(bufnr)
  end
end

function M.detach(bufnr)
  local st = M.states[bufnr]
  if not st then
    return
  end
  stop_timer(st)
  drop(st)
  M.states[bufnr] = nil
  pcall(api.nvim_del_augroup_by_name, 'completiond_buf_' .. bufnr)
end

M.enabled = true
M._first_word = first_word
M._first_line = first_line

return M
