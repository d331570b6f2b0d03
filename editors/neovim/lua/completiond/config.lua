--- Options for require('completiond').setup(opts): defaults, merging, and the initializationOptions
--- sent to completiond-lsp.
local M = {}

M.defaults = {
  -- How to start the language server (completiond-lsp on PATH, or e.g. { 'python3', '-m', 'completiond_lsp.server' }).
  cmd = { 'completiond-lsp' },
  -- Filetypes to attach to; '*' means every file buffer (minus exclude_filetypes).
  filetypes = { '*' },
  exclude_filetypes = { 'help', 'gitcommit', 'gitrebase', 'hgcommit', 'svn', 'qf', 'netrw', 'TelescopePrompt' },
  -- The workspace root is the nearest directory holding one of these, else the file's directory.
  root_markers = { '.git', 'pyproject.toml', 'setup.py', 'package.json', 'Cargo.toml', 'go.mod', '.hg' },
  -- Wait this long after the last keystroke before asking (the previous request is cancelled at once).
  debounce_ms = 75,
  -- 'extmark': ghost text drawn by this plugin (streams, accept word/line).
  -- 'native': Neovim >= 0.12's vim.lsp.inline_completion (no streaming, accept all only).
  renderer = 'extmark',
  hl_group = 'CompletiondGhost',
  -- Insert-mode keys; set one to false to leave that key alone. Each falls back to its normal
  -- meaning when no suggestion is shown.
  keys = {
    accept = '<Tab>',
    accept_word = '<M-Right>',
    accept_line = '<M-l>',
    dismiss = '<C-]>',
    next = '<M-]>', -- cycle through the suggestions (the greedy one, then the alternatives)
    prev = '<M-[>',
  },
  -- Suggestions per request (1..3): the greedy one and up to two alternatives, decoded in the same
  -- passes; <M-]> / <M-[> cycle through them. 3 costs about 1.1x the time of 1 (docs/alternatives.md).
  suggestions = 1,
  -- Show the daemon's start-up (each phase, its seconds), a lost daemon and the model once ready
  -- in the message area; false: only require('completiond').statusline() and :CompletiondStatus.
  progress = true,
  -- Server settings (initializationOptions).
  mode = 'combined', -- ar | pld | draft | combined
  max_tokens = 64,
  multiline = true,
  streaming = true,
  socket = nil, -- daemon socket (default: $COMPLETIOND_SOCKET or the per-user runtime dir)
  autostart = true, -- start `completiond serve` when no daemon runs
  target = nil, -- models etc. for an autostarted daemon; a named model may carry its weights form: 'qwen2.5-coder-1.5b@int4'
  draft = nil,
  dtype = nil,
  device = nil,
  -- Raw initializationOptions merged last (camelCase, as the server reads them).
  init_options = {},
  -- Next-edit suggestions (lua/completiond/next_edit.lua): { enabled, auto, delay_ms, keys = {
  -- accept, jump, dismiss, request } }; omitted fields take that module's defaults.
  next_edit = {},
}

local MODES = { ar = true, pld = true, draft = true, combined = true }
local RENDERERS = { extmark = true, native = true }

local function list_of_strings(v)
  if not vim.islist(v) then
    return false
  end
  for _, x in ipairs(v) do
    if type(x) ~= 'string' then
      return false
    end
  end
  return true
end

local function key_or_false(v)
  return v == false or type(v) == 'string'
end

-- name -> { validator (a type name or a predicate), what a predicate expects }. Omitted options
-- take their defaults, so only given values are checked.
M.schema = {
  cmd = { function(v) return list_of_strings(v) and #v > 0 end, 'a non-empty list of strings' },
  filetypes = { list_of_strings, 'a list of strings' },
  exclude_filetypes = { list_of_strings, 'a list of strings' },
  root_markers = { list_of_strings, 'a list of strings' },
  debounce_ms = { function(v) return type(v) == 'number' and v >= 0 end, 'a number >= 0' },
  renderer = { function(v) return RENDERERS[v] ~= nil end, "'extmark' or 'native'" },
  hl_group = { 'string' },
  progress = { 'boolean' },
  keys = { 'table' },
  mode = { function(v) return MODES[v] ~= nil end, "one of 'ar', 'pld', 'draft', 'combined'" },
  -- the daemon's cap on max_tokens is 2048
  max_tokens = { function(v) return type(v) == 'number' and v >= 1 and v <= 2048 and v % 1 == 0 end,
                 'an integer from 1 to 2048' },
  multiline = { 'boolean' },
  suggestions = { function(v) return type(v) == 'number' and v >= 1 and v <= 3 and v % 1 == 0 end,
                  'an integer from 1 to 3' },
  streaming = { 'boolean' },
  socket = { 'string' },
  autostart = { 'boolean' },
  target = { 'string' },
  draft = { 'string' },
  dtype = { 'string' },
  device = { 'string' },
  init_options = { 'table' },
  next_edit = { 'table' },
}
M.key_names = { accept = true, accept_word = true, accept_line = true, dismiss = true, next = true, prev = true }

local function sorted_names(t)
  local names = vim.tbl_keys(t)
  table.sort(names)
  return table.concat(names, ', ')
end

--- One vim.validate check, with either signature (the table form is the only one before 0.11).
local function check(name, value, validator, expected)
  if vim.fn.has('nvim-0.11') == 1 then
    vim.validate(name, value, validator, false, expected)
  else
    vim.validate({ [name] = { value, validator, expected } })
  end
end

--- Check the options given to setup(): known names, and each value's type.
---@param opts table|nil
---@return boolean ok, string? message (one line, naming the option)
function M.validate(opts)
  if opts == nil then
    return true
  end
  if type(opts) ~= 'table' then
    return false, ('setup() expects a table of options, got %s'):format(type(opts))
  end
  for name in pairs(opts) do
    if M.schema[name] == nil then
      return false, ('unknown option %s (known: %s)'):format(vim.inspect(name), sorted_names(M.schema))
    end
  end
  local ok, err = pcall(function()
    for name, spec in pairs(M.schema) do
      if opts[name] ~= nil then
        check(name, opts[name], spec[1], spec[2])
      end
    end
    for name, value in pairs(opts.keys or {}) do
      if not M.key_names[name] then
        error(('unknown option keys.%s (known: %s)'):format(tostring(name), sorted_names(M.key_names)), 0)
      end
      check('keys.' .. name, value, key_or_false, 'a key (string) or false')
    end
  end)
  if not ok then
    -- vim.validate may prefix the caller's file:line; the option name is what the user needs
    return false, (tostring(err):gsub('^[^\n]-:%d+: ', ''))
  end
  return true
end

---@param opts table|nil
---@return table
function M.merge(opts)
  local cfg = vim.tbl_deep_extend('force', vim.deepcopy(M.defaults), opts or {})
  if opts and opts.filetypes then
    cfg.filetypes = opts.filetypes -- lists replace, not merge
  end
  if opts and opts.cmd then
    cfg.cmd = opts.cmd
  end
  return cfg
end

---@param cfg table
---@return table initializationOptions for completiond-lsp
function M.init_options(cfg)
  local o = {
    mode = cfg.mode,
    maxTokens = cfg.max_tokens,
    multiline = cfg.multiline,
    suggestions = cfg.renderer ~= 'native' and cfg.suggestions or 1,
    -- The plugin debounces keystrokes itself; a second debounce in the server would only add latency.
    debounceMs = 0,
    streaming = cfg.streaming and cfg.renderer ~= 'native',
    socket = cfg.socket,
    autostart = cfg.autostart,
    target = cfg.target,
    draft = cfg.draft,
    dtype = cfg.dtype,
    device = cfg.device,
  }
  return vim.tbl_extend('force', o, cfg.init_options or {})
end

return M
