--- completiond for Neovim: starts completiond-lsp for the configured filetypes and shows its
--- inline completions as ghost text (namespace 'completiond').
---
---   require('completiond').setup({ ... })   -- options: lua/completiond/config.lua
local api = vim.api
local config = require('completiond.config')
local suggest = require('completiond.suggest')

local M = {}

M.name = 'completiond'
---@type table? merged options, set by setup()
M.config = nil
---@type table<integer, table> last `completiond/status` per client id
M.status = {}

--- The value, or nil when the server sent JSON null (vim.NIL, a truthy userdata in Lua).
local function present(v)
  if v == vim.NIL then
    return nil
  end
  return v
end

--- One line for the message area: the daemon's phase while it starts (each new phase is kept in
--- :messages, the seconds ticking in between are not), the model once it is ready.
local function show_progress(prev, s)
  if not (M.config and M.config.progress) then
    return
  end
  local msg = tostring(s.message or '')
  -- one screen line at most: a longer echo would stop the editor at a hit-enter prompt
  local room = math.max((vim.v.echospace or 80) - 1, 20)
  if vim.fn.strdisplaywidth(msg) > room then
    msg = vim.fn.strcharpart(msg, 0, room - 1) .. '…'
  end
  if s.state == 'loading' or s.state == 'restarting' then
    local new_phase = not prev or prev.state ~= s.state or prev.phase ~= s.phase
    M.progress_message = msg
    api.nvim_echo({ { msg, 'MoreMsg' } }, new_phase, {})
  elseif s.state == 'ready' and (not prev or prev.state ~= 'ready' or prev.target ~= s.target) then
    M.progress_message = msg
    api.nvim_echo({ { msg, 'MoreMsg' } }, true, {})
  end
end

local function on_status(_, params, ctx)
  if type(params) ~= 'table' then
    return
  end
  -- Fields are null until known (lastLatencyMs before the first completion, draft with none):
  -- drop them so readers can test `if s.field`.
  for k, v in pairs(params) do
    if v == vim.NIL then
      params[k] = nil
    end
  end
  local prev = M.status[ctx.client_id]
  M.status[ctx.client_id] = params
  if params.state == 'error' and (not prev or prev.message ~= params.message) then
    vim.notify('completiond: ' .. (tostring(params.message):gsub('^completiond: ', '')), vim.log.levels.WARN)
  elseif params.state == 'restarting' and (not prev or prev.state ~= 'restarting') then
    -- a lost daemon: said at once, not found out on the next keystroke
    vim.notify(tostring(params.message), vim.log.levels.WARN)
  else
    show_progress(prev, params)
  end
  api.nvim_exec_autocmds('User', { pattern = 'CompletiondStatus', modeline = false, data = params })
end

local function wanted(bufnr)
  local cfg = M.config
  if not cfg or vim.bo[bufnr].buftype ~= '' or api.nvim_buf_get_name(bufnr) == '' then
    return false
  end
  local ft = vim.bo[bufnr].filetype
  if vim.tbl_contains(cfg.exclude_filetypes, ft) then
    return false
  end
  return vim.tbl_contains(cfg.filetypes, '*') and ft ~= '' or vim.tbl_contains(cfg.filetypes, ft)
end

local function root_dir(bufnr)
  local fname = api.nvim_buf_get_name(bufnr)
  return vim.fs.root(bufnr, M.config.root_markers) or vim.fs.dirname(vim.fs.normalize(fname))
end

local function map(bufnr, lhs, fn, fallback_key)
  if not lhs then
    return
  end
  vim.keymap.set('i', lhs, function()
    if suggest.visible(bufnr) then
      return '<Cmd>lua require("completiond")._key("' .. fn .. '")<CR>'
    end
    return fallback_key or lhs
  end, { buffer = bufnr, expr = true, replace_keycodes = true, desc = 'completiond: ' .. fn })
end

--- Called from the insert-mode mappings (through <Cmd>, so the buffer may change).
function M._key(fn)
  if fn == 'dismiss' then
    suggest.dismiss()
  elseif fn == 'next' or fn == 'prev' then
    suggest.cycle(fn == 'next' and 1 or -1)
  else
    suggest.accept(fn)
  end
end

local function set_keys(bufnr)
  local keys = M.config.keys
  if M.config.renderer == 'native' then
    if keys.accept then
      vim.keymap.set('i', keys.accept, function()
        if not vim.lsp.inline_completion.get() then
          return keys.accept
        end
      end, { buffer = bufnr, expr = true, replace_keycodes = true, desc = 'completiond: accept' })
    end
    return
  end
  map(bufnr, keys.accept, 'all')
  map(bufnr, keys.accept_word, 'word')
  map(bufnr, keys.accept_line, 'line')
  map(bufnr, keys.dismiss, 'dismiss')
  map(bufnr, keys.next, 'next')
  map(bufnr, keys.prev, 'prev')
end

--- Tell the server where the cursor rests (`completiond/cursor`, debounced): LSP itself has no such
--- message, and the daemon warms the prompt of a completion there before the user types.
local cursor_timers = {}
local function follow_cursor(bufnr, client_id)
  local group = api.nvim_create_augroup('completiond_cursor_' .. bufnr, { clear = true })
  api.nvim_create_autocmd({ 'BufEnter', 'CursorMoved', 'InsertEnter' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      local timer = cursor_timers[bufnr]
      if not timer then
        timer = assert(vim.uv.new_timer())
        cursor_timers[bufnr] = timer
      end
      timer:stop()
      timer:start(150, 0, vim.schedule_wrap(function()
        local client = vim.lsp.get_client_by_id(client_id)
        if not client or api.nvim_get_current_buf() ~= bufnr then
          return
        end
        local p = vim.lsp.util.make_position_params(0, client.offset_encoding)
        local notify = vim.fn.has('nvim-0.11') == 1 and function(...) return client:notify(...) end or client.notify
        notify('completiond/cursor', { textDocument = p.textDocument, position = p.position })
      end))
    end,
  })
  api.nvim_create_autocmd({ 'BufWipeout' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      local timer = cursor_timers[bufnr]
      if timer then
        timer:stop()
        timer:close()
        cursor_timers[bufnr] = nil
      end
    end,
  })
end

--- Start (or reuse) the language server for bufnr and attach the ghost-text renderer.
---@param bufnr? integer
---@return integer? client_id
function M.attach(bufnr)
  bufnr = bufnr or api.nvim_get_current_buf()
  if not wanted(bufnr) then
    return nil
  end
  local cfg = M.config
  if vim.fn.executable(cfg.cmd[1]) ~= 1 then
    if not M._warned_cmd then
      M._warned_cmd = true
      vim.notify(('completiond: %s not found (see :checkhealth completiond)'):format(cfg.cmd[1]),
        vim.log.levels.WARN)
    end
    return nil
  end
  local client_id = vim.lsp.start({
    name = M.name,
    cmd = cfg.cmd,
    root_dir = root_dir(bufnr),
    init_options = config.init_options(cfg),
    handlers = {
      ['completiond/partial'] = suggest.on_partial,
      ['completiond/status'] = on_status,
    },
  }, { bufnr = bufnr })
  if not client_id then
    return nil
  end
  if M.status[client_id] == nil then -- a new server: say so now, its own status follows in a second or two
    M.status[client_id] = { state = 'loading', phase = 'starting the language server',
                            message = 'completiond: starting the language server' }
    show_progress(nil, M.status[client_id])
  end
  if cfg.renderer == 'native' then
    vim.lsp.inline_completion.enable(true, { bufnr = bufnr })
  else
    suggest.attach(bufnr, client_id)
  end
  set_keys(bufnr)
  follow_cursor(bufnr, client_id)
  require('completiond.next_edit').attach(bufnr, cfg.next_edit)
  return client_id
end

--- The completiond client attached to bufnr (or any), if one runs.
function M.client(bufnr)
  local clients = vim.lsp.get_clients({ name = M.name, bufnr = bufnr })
  return clients[1]
end

--- The suggestion shown in the current buffer (text still to insert), or nil.
function M.visible()
  return suggest.visible()
end

--- Whether a completion request for the current buffer is debouncing or in flight.
function M.busy()
  return suggest.busy()
end

--- Accept the shown suggestion: 'all' (default), 'word' or 'line'. Returns false if none is shown.
function M.accept(what)
  return suggest.accept(what or 'all')
end

function M.dismiss()
  return suggest.dismiss()
end

--- Show the next (1) or previous (-1) suggestion of the request. Returns false with fewer than two.
function M.cycle(dir)
  return suggest.cycle(dir or 1)
end

--- Turn automatic suggestions on or off (all buffers).
function M.enable(on)
  suggest.enabled = on ~= false
  if not suggest.enabled then
    for bufnr in pairs(suggest.states) do
      suggest.reset(bufnr)
    end
  end
end

function M.toggle()
  M.enable(not suggest.enabled)
  vim.notify('completiond ' .. (suggest.enabled and 'enabled' or 'disabled'))
end

--- The daemon's background switch to the larger default while it runs, e.g. 'converting
--- qwen2.5-coder-1.5b@int4 42%' (nil when none runs).
function M.upgrade_text(s)
  local up = present(s.upgrade)
  if type(up) ~= 'table' then
    return nil
  end
  local phase, model = present(up.phase), tostring(present(up.model) or '?')
  if phase == 'converting' then
    local pct = tonumber(present(up.progress))
    return ('converting %s%s'):format(model, pct and (' %d%%'):format(math.floor(pct * 100 + 0.5)) or '')
  elseif phase == 'loading' then
    return 'loading ' .. model
  end
  return nil
end

--- A short status for a statusline: the server's state (the daemon's phase while it starts), the
--- last latency, and a background upgrade's progress while it runs.
function M.statusline()
  local client = M.client(api.nvim_get_current_buf())
  local s = client and M.status[client.id]
  if not s then
    return ''
  end
  local ms = tonumber(present(s.lastLatencyMs))
  local upgrade = s.state == 'ready' and M.upgrade_text(s)
  if upgrade then
    return ('completiond%s (%s)'):format(ms and (' %dms'):format(math.floor(ms + 0.5)) or '', upgrade)
  end
  if s.state == 'ready' and ms then
    return ('completiond %dms'):format(math.floor(ms + 0.5))
  end
  if (s.state == 'loading' or s.state == 'restarting') and present(s.message) then
    return (tostring(s.message):gsub('^completiond: ', 'completiond '))
  end
  return 'completiond ' .. tostring(present(s.state) or '?')
end

--- Why the daemon runs this target in this weights form (NAME@FORM): its own choice for this
--- machine (the daemon's default_reason), or the one the settings or `serve --target` named.
function M.model_reason(s)
  local why = present(s.defaultReason)
  if why then
    return 'why: ' .. tostring(why)
  end
  return 'why: named (setup target or serve --target)'
end

--- One line saying what the server is doing: state, message, model and device, and why that model.
function M.status_line()
  local client = M.client(api.nvim_get_current_buf())
  local s = client and M.status[client.id]
  if not s then
    return 'completiond: no status yet (no server attached to this buffer)'
  end
  local state = tostring(s.state or '?')
  -- the message without its "completiond: " and a repeat of the state ("ready: ready: ..." before)
  local msg = tostring(s.message or ''):gsub('^completiond: ', '')
  if msg:sub(1, #state + 2) == state .. ': ' then
    msg = msg:sub(#state + 3)
  end
  local line = ('completiond: %s: %s'):format(state, msg)
  if s.state == 'ready' then
    line = line .. (' (target %s, draft %s, device %s'):format(tostring(s.target or '?'),
      tostring(s.draft or 'none'), tostring(s.device or '?'))
    local ms = tonumber(present(s.lastLatencyMs))
    line = line .. (ms and (', last latency %d ms)'):format(math.floor(ms + 0.5)) or ')')
    line = line .. '; ' .. M.model_reason(s)
    local up = present(s.upgrade)
    if type(up) == 'table' and present(up.why) then
      line = line .. ('; upgrade %s: %s'):format(tostring(present(up.phase) or '?'), tostring(up.why))
    end
  end
  return line
end

--- Rewrite lines line1..line2 (1-based, inclusive) of the current buffer following instruction.
function M.rewrite(line1, line2, instruction)
  local bufnr = api.nvim_get_current_buf()
  local client = M.client(bufnr)
  if not client then
    vim.notify('completiond: no language server attached to this buffer', vim.log.levels.ERROR)
    return
  end
  local lines = api.nvim_buf_get_lines(bufnr, line1 - 1, line2, true)
  local last = lines[#lines]
  local range = {
    start = { line = line1 - 1, character = 0 },
    ['end'] = { line = line2 - 1,
                character = vim.lsp.util.character_offset(bufnr, line2 - 1, #last, client.offset_encoding) },
  }
  local params = { command = 'completiond.rewrite',
                   arguments = { { uri = vim.uri_from_bufnr(bufnr), range = range, instruction = instruction } } }
  local request = vim.fn.has('nvim-0.11') == 1 and function(...) return client:request(...) end or client.request
  request('workspace/executeCommand', params, function(err, result)
    if err then
      vim.notify('completiond rewrite: ' .. tostring(err.message), vim.log.levels.ERROR)
    elseif result and result.applied == false then
      vim.notify('completiond rewrite: the edit was not applied', vim.log.levels.WARN)
    elseif result and result.text == table.concat(lines, '\n') then -- applied, and nothing shows it
      vim.notify('completiond rewrite: the model left the selection as it was', vim.log.levels.INFO)
    end
  end, bufnr)
end

--- Start completiond with opts (lua/completiond/config.lua). Bad options are reported with
--- vim.notify (one line naming the option) and nothing starts; returns whether setup went ahead.
---@param opts table?
---@return boolean
function M.setup(opts)
  local valid, problem = config.validate(opts)
  if not valid then
    vim.notify('completiond: ' .. problem, vim.log.levels.ERROR)
    return false
  end
  if not vim.g.loaded_completiond then
    vim.cmd.runtime('plugin/completiond.lua') -- the commands, when the plugin was put on 'rtp' late
  end
  M.config = config.merge(opts)
  suggest.cfg = M.config
  if M.config.renderer == 'native' and not (vim.lsp.inline_completion and vim.lsp.inline_completion.enable) then
    vim.notify('completiond: renderer "native" needs Neovim >= 0.12; using extmarks', vim.log.levels.WARN)
    M.config.renderer = 'extmark'
  end
  api.nvim_set_hl(0, 'CompletiondGhost', { link = 'Comment', default = true })
  local group = api.nvim_create_augroup('completiond', { clear = true })
  api.nvim_create_autocmd('FileType', {
    group = group,
    callback = function(ev) M.attach(ev.buf) end,
  })
  api.nvim_create_autocmd('ColorScheme', {
    group = group,
    callback = function() api.nvim_set_hl(0, 'CompletiondGhost', { link = 'Comment', default = true }) end,
  })
  for _, bufnr in ipairs(api.nvim_list_bufs()) do
    if api.nvim_buf_is_loaded(bufnr) and vim.bo[bufnr].filetype ~= '' then
      M.attach(bufnr)
    end
  end
  return true
end

return M
