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
  },
  -- Server settings (initializationOptions).
  mode = 'combined', -- ar | pld | draft | combined
  max_tokens = 64,
  multiline = true,
  streaming = true,
  socket = nil, -- daemon socket (default: $COMPLETIOND_SOCKET or the per-user runtime dir)
  autostart = true, -- start `completiond serve` when no daemon runs
  target = nil, -- models etc. for an autostarted daemon
  draft = nil,
  dtype = nil,
  device = nil,
  -- Raw initializationOptions merged last (camelCase, as the server reads them).
  init_options = {},
}

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
