--- :checkhealth completiond
local M = {}

local function socket_path(cfg)
  if cfg and cfg.socket then
    return cfg.socket
  end
  local opts = cfg and cfg.init_options or {}
  if opts.socket then
    return opts.socket
  end
  if vim.env.COMPLETIOND_SOCKET and vim.env.COMPLETIOND_SOCKET ~= '' then
    return vim.env.COMPLETIOND_SOCKET
  end
  local runtime = vim.env.XDG_RUNTIME_DIR
  if runtime and vim.fn.isdirectory(runtime) == 1 then
    return runtime .. '/completiond/daemon.sock'
  end
  local tmp = vim.env.TMPDIR or '/tmp'
  return ('%s/completiond-%d/daemon.sock'):format(tmp:gsub('/$', ''), vim.uv.getuid())
end

--- Whether something accepts connections on the Unix socket at path (waits up to 1 s).
local function socket_alive(path)
  local pipe = vim.uv.new_pipe(false)
  if not pipe then
    return false, 'cannot create a pipe'
  end
  local result
  pipe:connect(path, function(err)
    result = err or true
  end)
  vim.wait(1000, function() return result ~= nil end, 10)
  if not pipe:is_closing() then
    pipe:close()
  end
  if result == true then
    return true
  end
  return false, result or 'timed out'
end

--- The `completiond serve` that starts the daemon the plugin would (its socket when one is set, and
--- the target, draft, dtype and device the server passes on), as a hint prints it: it runs as printed.
function M.serve_command(cfg)
  local o = require('completiond.config').init_options(cfg)
  local cmd = { 'completiond', 'serve' }
  for _, key in ipairs({ 'socket', 'target', 'draft', 'dtype', 'device' }) do -- the server's init options
    local v = o[key]
    if v ~= nil and v ~= vim.NIL and v ~= '' then
      vim.list_extend(cmd, { '--' .. key, vim.fn.shellescape(tostring(v)) })
    end
  end
  return table.concat(cmd, ' ')
end

--- A status field as text; '?' when missing or JSON null (vim.NIL).
local function field(s, key)
  local v = s[key]
  if v == nil or v == vim.NIL then
    return '?'
  end
  return tostring(v)
end

function M.check()
  local h = vim.health
  h.start('completiond: Neovim')
  local v = vim.version()
  local vs = ('%d.%d.%d'):format(v.major, v.minor, v.patch)
  if vim.fn.has('nvim-0.10') == 1 then
    h.ok('Neovim ' .. vs)
  else
    h.error('Neovim ' .. vs .. ': completiond needs Neovim >= 0.10 (inline virtual text)')
  end
  if vim.lsp.inline_completion and vim.lsp.inline_completion.enable then
    h.info('vim.lsp.inline_completion is available (renderer = "native" can be used)')
  end

  h.start('completiond: language server')
  local ok, completiond = pcall(require, 'completiond')
  local cfg = ok and completiond.config
  if not cfg then
    h.warn('setup() has not been called', { "Call require('completiond').setup({}) in your config" })
    cfg = require('completiond.config').merge({})
  end
  local exe = cfg.cmd[1]
  if vim.fn.executable(exe) == 1 then
    h.ok(('%s found: %s'):format(exe, vim.fn.exepath(exe)))
  else
    h.error(exe .. ' not found', {
      "install completiond from its checkout: pip install torch==2.13.0 && "
        .. "pip install -e '/path/to/completiond[default-model]' (or pipx install /path/to/completiond);"
        .. ' see "Set up a fresh machine" in its README, or',
      "set cmd = { 'python3', '-m', 'completiond_lsp.server' } in setup()",
    })
  end
  local clients = vim.lsp.get_clients({ name = 'completiond' })
  if #clients == 0 then
    h.info('no completiond-lsp client is running (it starts when a matching buffer opens)')
  end
  for _, client in ipairs(clients) do
    local s = completiond.status and completiond.status[client.id]
    local msg = ('client %d (root %s)'):format(client.id, client.root_dir or '?')
    if s then
      msg = msg .. (': %s; target %s, draft %s, device %s'):format(
        field(s, 'state'), field(s, 'target'), field(s, 'draft'), field(s, 'device'))
      local ms = tonumber(s.lastLatencyMs ~= vim.NIL and s.lastLatencyMs or nil)
      if ms then
        msg = msg .. (', last latency %d ms'):format(math.floor(ms + 0.5))
      end
    end
    if s and s.state ~= 'ready' and s.state ~= 'error' then
      msg = msg .. ' - ' .. field(s, 'message')
    end
    if s and s.state == 'error' then
      h.error(msg .. ' - ' .. field(s, 'message'))
    else
      h.ok(msg)
    end
    if s and s.state == 'ready' then -- the model with its weights form (NAME@FORM), and why that one
      h.info(('model %s: %s'):format(field(s, 'target'), completiond.model_reason(s)))
    end
  end

  h.start('completiond: daemon')
  local path = socket_path(cfg)
  local alive, err = socket_alive(path)
  if alive then
    h.ok('daemon listening on ' .. path)
  elseif cfg.autostart ~= false then
    h.info(('no daemon on %s (%s); completiond-lsp starts one when needed'):format(path, tostring(err)))
  else
    h.warn(('no daemon on %s (%s) and autostart is off'):format(path, tostring(err)),
      { ('Start one with `%s`'):format(M.serve_command(cfg)) })
  end
end

return M
