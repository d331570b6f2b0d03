--- Next-edit suggestions (`completiond/nextEdit`): the edit the user likely makes next, shown in
--- place in namespace 'completiond': the text it removes highlighted, the lines it makes as virtual
--- lines below, and, when it is away from the cursor, a marker at the cursor saying where it is.
---
--- Normal mode keys (buffer-local, each falls back to its normal meaning when nothing is shown):
---   accept  (<Tab>)  jump to the edit when it is away from the cursor, else apply it
---   jump    (<M-j>)  jump to the edit
---   dismiss (<Esc>)  hide it
---   request (<M-n>, normal and insert)  ask now
--- With `auto`, it is asked for `delay_ms` after an edit in normal mode or leaving insert mode;
--- any change to the buffer hides it (it was computed for the text before).
local api = vim.api
local ghost = require('completiond.ghost')

local M = {}

M.ns = ghost.ns
M.defaults = {
  auto = true,
  delay_ms = 400,
  keys = { accept = '<Tab>', jump = '<M-j>', dismiss = '<Esc>', request = '<M-n>' },
}
---@type table<integer, table> bufnr -> { edits, marks, enc, tick, result }
M.states = {}
M.stats = { requests = 0, responses = 0, shown = 0, accepted = 0, errors = 0, stale = 0 }
M.last_error = nil
M.last_result = nil
local inflight = {} -- bufnr -> { client, id }
local timers = {}

local function set_hl()
  api.nvim_set_hl(0, 'CompletiondNextEditDelete', { link = 'DiffDelete', default = true })
  api.nvim_set_hl(0, 'CompletiondNextEditAdd', { link = 'DiffAdd', default = true })
  api.nvim_set_hl(0, 'CompletiondNextEditJump', { link = 'Comment', default = true })
end

local function client_of(bufnr)
  return vim.lsp.get_clients({ bufnr = bufnr, name = 'completiond' })[1]
end

--- Byte column of an LSP character offset on a row (the negotiated encoding).
local function byte_col(bufnr, row, character, enc)
  local line = api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ''
  if enc == 'utf-8' then
    return math.min(character, #line)
  end
  local ok, col = pcall(vim.str_byteindex, line, enc, character, false)
  if ok and col then
    return col
  end
  ok, col = pcall(vim.str_byteindex, line, character, enc == 'utf-16') -- before 0.11
  return ok and col or #line
end

--- Hide the shown edit of bufnr (its extmarks only: ghost text in the same namespace stays).
function M.clear(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and api.nvim_get_current_buf() or bufnr
  local st = M.states[bufnr]
  M.states[bufnr] = nil
  if st and api.nvim_buf_is_valid(bufnr) then
    for _, id in ipairs(st.marks) do
      pcall(api.nvim_buf_del_extmark, bufnr, M.ns, id)
    end
  end
  return st ~= nil
end

--- Whether an edit is shown in bufnr (its marks are still there: ghost text may have cleared them).
function M.visible(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and api.nvim_get_current_buf() or bufnr
  local st = M.states[bufnr]
  if not st or not st.marks[1] then
    return false
  end
  local m = api.nvim_buf_get_extmark_by_id(bufnr, M.ns, st.marks[1], {})
  if not m or not m[1] then
    M.states[bufnr] = nil
    return false
  end
  return true
end

local function away(bufnr, st)
  local row = api.nvim_win_get_cursor(0)[1] - 1
  local e = st.edits[1]
  return api.nvim_get_current_buf() == bufnr and (row < e.srow or row > e.erow)
end

local function draw_jump(bufnr, st)
  if st.jump then
    pcall(api.nvim_buf_del_extmark, bufnr, M.ns, st.jump)
    st.jump = nil
  end
  if api.nvim_get_current_buf() ~= bufnr or not away(bufnr, st) then
    return
  end
  local row = api.nvim_win_get_cursor(0)[1] - 1
  local e = st.edits[1]
  local arrow = e.srow > row and '⇣' or '⇡'
  local key = st.keys.accept or st.keys.jump or ''
  st.jump = api.nvim_buf_set_extmark(bufnr, M.ns, row, 0, {
    virt_text = { { ('  %s next edit at line %d %s'):format(arrow, e.srow + 1, key), 'CompletiondNextEditJump' } },
    virt_text_pos = 'eol', priority = 900,
  })
  st.marks[#st.marks + 1] = st.jump
end

--- Show a `completiond/nextEdit` result in bufnr (ranges in encoding enc). Returns the number of edits shown.
---@param bufnr integer
---@param result table { edits = { { range = Range, text = string } } }
---@param enc string 'utf-8' | 'utf-16' | 'utf-32'
function M.show(bufnr, result, enc)
  bufnr = (bufnr == nil or bufnr == 0) and api.nvim_get_current_buf() or bufnr
  M.clear(bufnr)
  local raw = result and result.edits or {}
  if type(raw) ~= 'table' or #raw == 0 then
    return 0
  end
  set_hl()
  local edits = {}
  for _, e in ipairs(raw) do
    local s, t = e.range.start, e.range['end']
    edits[#edits + 1] = { lsp = e, srow = s.line, erow = t.line, text = e.text,
                          scol = byte_col(bufnr, s.line, s.character, enc),
                          ecol = byte_col(bufnr, t.line, t.character, enc) }
  end
  table.sort(edits, function(a, b) return a.srow < b.srow or (a.srow == b.srow and a.scol < b.scol) end)
  local st = { edits = edits, marks = {}, enc = enc, tick = api.nvim_buf_get_changedtick(bufnr), result = result,
               keys = (M.cfg or M.defaults).keys }
  -- edits on one line group into one set of virtual lines: the line(s) as they will read
  local i = 1
  while i <= #edits do
    local first, last = edits[i], edits[i]
    local j = i
    while j < #edits and edits[j + 1].srow <= last.erow do
      j = j + 1
      last = edits[j]
    end
    local lines = api.nvim_buf_get_lines(bufnr, first.srow, last.erow + 1, false)
    local old = table.concat(lines, '\n')
    local pieces, pos = {}, 1 -- byte offsets into `old` (rows relative to first.srow)
    local function offset(row, col)
      local o = 0
      for r = first.srow, row - 1 do
        o = o + #lines[r - first.srow + 1] + 1
      end
      return o + col
    end
    for k = i, j do
      local e = edits[k]
      local a, b = offset(e.srow, e.scol), offset(e.erow, e.ecol)
      pieces[#pieces + 1] = old:sub(pos, a)
      pieces[#pieces + 1] = e.text
      pos = b + 1
      if a ~= b then -- what it removes
        st.marks[#st.marks + 1] = api.nvim_buf_set_extmark(bufnr, M.ns, e.srow, e.scol, {
          end_row = e.erow, end_col = e.ecol, hl_group = 'CompletiondNextEditDelete', priority = 900 })
      end
    end
    pieces[#pieces + 1] = old:sub(pos)
    local virt = {}
    for _, l in ipairs(vim.split(table.concat(pieces), '\n', { plain = true })) do
      virt[#virt + 1] = { { l, 'CompletiondNextEditAdd' } }
    end
    table.insert(st.marks, 1, api.nvim_buf_set_extmark(bufnr, M.ns, last.erow, 0, {
      virt_lines = virt, priority = 900 }))
    i = j + 1
  end
  M.states[bufnr] = st
  draw_jump(bufnr, st)
  M.stats.shown = M.stats.shown + 1
  return #edits
end

--- Ask the server for the next edit of bufnr (at the cursor, when bufnr is the current buffer).
function M.request(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and api.nvim_get_current_buf() or bufnr
  local client = client_of(bufnr)
  if not client then
    return false
  end
  local old = inflight[bufnr]
  if old then
    pcall(function()
      if vim.fn.has('nvim-0.11') == 1 then old.client:cancel_request(old.id) else old.client.cancel_request(old.id) end
    end)
    inflight[bufnr] = nil
  end
  local params = { textDocument = { uri = vim.uri_from_bufnr(bufnr) } }
  if api.nvim_get_current_buf() == bufnr then
    params.position = vim.lsp.util.make_position_params(0, client.offset_encoding).position
  end
  local tick = api.nvim_buf_get_changedtick(bufnr)
  local enc = client.offset_encoding
  M.stats.requests = M.stats.requests + 1
  local request = vim.fn.has('nvim-0.11') == 1 and function(...) return client:request(...) end or client.request
  local ok, id = request('completiond/nextEdit', params, function(err, result)
    inflight[bufnr] = nil
    M.stats.responses = M.stats.responses + 1
    if err then
      if err.code ~= -32800 and err.code ~= -32801 then -- cancelled / outdated: quietly
        M.stats.errors = M.stats.errors + 1
        M.last_error = err.message
      end
      return
    end
    M.last_result = result
    if not api.nvim_buf_is_valid(bufnr) or api.nvim_buf_get_changedtick(bufnr) ~= tick
        or (result and result.cancelled) then
      M.stats.stale = M.stats.stale + 1
      return
    end
    M.show(bufnr, result, enc)
    api.nvim_exec_autocmds('User', { pattern = 'CompletiondNextEdit', modeline = false,
                                     data = { bufnr = bufnr, edits = #(result.edits or {}) } })
  end, bufnr)
  if ok then
    inflight[bufnr] = { client = client, id = id }
  end
  return ok
end

--- Move the cursor to the start of the shown edit.
function M.jump(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and api.nvim_get_current_buf() or bufnr
  local st = M.visible(bufnr) and M.states[bufnr]
  if not st then
    return false
  end
  local e = st.edits[1]
  api.nvim_win_set_cursor(0, { e.srow + 1, e.scol })
  draw_jump(bufnr, st)
  return true
end

--- Apply the shown edit; the cursor goes to the end of its first change.
function M.accept(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and api.nvim_get_current_buf() or bufnr
  local st = M.visible(bufnr) and M.states[bufnr]
  if not st then
    return false
  end
  M.clear(bufnr)
  local lsp = {}
  for _, e in ipairs(st.edits) do
    lsp[#lsp + 1] = { range = e.lsp.range, newText = e.text }
  end
  vim.lsp.util.apply_text_edits(lsp, bufnr, st.enc)
  local e = st.edits[1]
  local new = vim.split(e.text, '\n', { plain = true })
  local row = e.srow + #new - 1
  local col = (#new == 1 and e.scol or 0) + #new[#new]
  if api.nvim_get_current_buf() == bufnr then
    pcall(api.nvim_win_set_cursor, 0, { row + 1, math.max(col - 1, 0) })
  end
  M.stats.accepted = M.stats.accepted + 1
  return true
end

function M.dismiss(bufnr)
  return M.clear(bufnr)
end

--- The accept key: jump first when the edit is away from the cursor.
function M.tab(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and api.nvim_get_current_buf() or bufnr
  local st = M.visible(bufnr) and M.states[bufnr]
  if not st then
    return false
  end
  if away(bufnr, st) then
    return M.jump(bufnr)
  end
  return M.accept(bufnr)
end

local function map(bufnr, modes, lhs, fn)
  if not lhs then
    return
  end
  vim.keymap.set(modes, lhs, function()
    if fn == 'request' or M.visible(bufnr) then
      return '<Cmd>lua require("completiond.next_edit")._key("' .. fn .. '")<CR>'
    end
    return lhs
  end, { buffer = bufnr, expr = true, replace_keycodes = true, desc = 'completiond next edit: ' .. fn })
end

function M._key(fn)
  local bufnr = api.nvim_get_current_buf()
  if fn == 'accept' then
    M.tab(bufnr)
  elseif fn == 'jump' then
    M.jump(bufnr)
  elseif fn == 'dismiss' then
    M.dismiss(bufnr)
  elseif fn == 'request' then
    M.request(bufnr)
  end
end

local function schedule(bufnr)
  local timer = timers[bufnr]
  if not timer then
    timer = assert(vim.uv.new_timer())
    timers[bufnr] = timer
  end
  timer:stop()
  local tick = api.nvim_buf_get_changedtick(bufnr)
  timer:start((M.cfg or M.defaults).delay_ms, 0, vim.schedule_wrap(function()
    if api.nvim_buf_is_valid(bufnr) and api.nvim_get_current_buf() == bufnr
        and api.nvim_buf_get_changedtick(bufnr) == tick and api.nvim_get_mode().mode == 'n' then
      M.request(bufnr)
    end
  end))
end

--- Keys and autocommands for bufnr (called by require('completiond').attach).
---@param bufnr integer
---@param cfg table? the `next_edit` options (defaults above)
function M.attach(bufnr, cfg)
  M.cfg = vim.tbl_deep_extend('force', vim.deepcopy(M.defaults), cfg or {})
  if M.cfg.enabled == false then
    return
  end
  set_hl()
  local keys = M.cfg.keys
  map(bufnr, 'n', keys.accept, 'accept')
  map(bufnr, 'n', keys.jump, 'jump')
  map(bufnr, 'n', keys.dismiss, 'dismiss')
  map(bufnr, { 'n', 'i' }, keys.request, 'request')
  local group = api.nvim_create_augroup('completiond_next_edit_' .. bufnr, { clear = true })
  api.nvim_create_autocmd({ 'TextChanged', 'TextChangedI', 'InsertEnter' }, {
    group = group, buffer = bufnr,
    callback = function() M.clear(bufnr) end, -- computed for the text before: stale now
  })
  api.nvim_create_autocmd('CursorMoved', {
    group = group, buffer = bufnr,
    callback = function()
      local st = M.states[bufnr]
      if st then
        draw_jump(bufnr, st)
      end
    end,
  })
  if M.cfg.auto then
    api.nvim_create_autocmd({ 'TextChanged', 'InsertLeave' }, {
      group = group, buffer = bufnr,
      callback = function() schedule(bufnr) end,
    })
  end
  api.nvim_create_autocmd('BufWipeout', {
    group = group, buffer = bufnr,
    callback = function()
      M.states[bufnr] = nil
      if timers[bufnr] then
        timers[bufnr]:stop()
        timers[bufnr]:close()
        timers[bufnr] = nil
      end
    end,
  })
end

return M
