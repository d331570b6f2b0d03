--- Ghost text: one extmark in namespace 'completiond' at the cursor. The first line of the
--- suggestion is inline virtual text (it pushes the rest of the line right), the other lines are
--- virtual lines below.
local api = vim.api

local M = {}

M.ns = api.nvim_create_namespace('completiond')

---@param bufnr integer
function M.clear(bufnr)
  if api.nvim_buf_is_valid(bufnr) then
    api.nvim_buf_clear_namespace(bufnr, M.ns, 0, -1)
  end
end

--- Inline virtual text shows a tab as one cell: expand tabs to the next tab stop, counting from
--- display column vcol.
---@param s string
---@param vcol integer
---@param tabstop integer
function M.expand_tabs(s, vcol, tabstop)
  if not s:find('\t', 1, true) then
    return s
  end
  local out = {}
  for ch in s:gmatch('[^\128-\191][\128-\191]*') do
    if ch == '\t' then
      local n = tabstop - vcol % tabstop
      out[#out + 1] = string.rep(' ', n)
      vcol = vcol + n
    else
      out[#out + 1] = ch
      vcol = vcol + vim.fn.strdisplaywidth(ch)
    end
  end
  return table.concat(out)
end

---@param bufnr integer
---@param row integer 0-based
---@param col integer 0-based byte column
---@param text string the suggestion still to insert
---@param hl string highlight group
function M.show(bufnr, row, col, text, hl)
  M.clear(bufnr)
  if text == '' then
    return
  end
  local lines = vim.split(text, '\n', { plain = true })
  local opts = { hl_mode = 'combine', priority = 1000, right_gravity = true }
  if lines[1] ~= '' then
    local prefix = api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ''
    opts.virt_text = { { M.expand_tabs(lines[1], vim.fn.strdisplaywidth(prefix:sub(1, col)), vim.bo[bufnr].tabstop), hl } }
    opts.virt_text_pos = 'inline'
  end
  if #lines > 1 then
    opts.virt_lines = {} -- (virtual lines expand tabs themselves)
    for i = 2, #lines do
      opts.virt_lines[#opts.virt_lines + 1] = { { lines[i], hl } }
    end
  end
  api.nvim_buf_set_extmark(bufnr, M.ns, row, col, opts)
end

--- The ghost text now drawn in bufnr, as {row, col, text} (text as drawn), or nil.
---@param bufnr integer
function M.get(bufnr)
  local marks = api.nvim_buf_get_extmarks(bufnr, M.ns, 0, -1, { details = true })
  local m = marks[1]
  if not m then
    return nil
  end
  local d = m[4]
  local parts = { d.virt_text and d.virt_text[1] and d.virt_text[1][1] or '' }
  for _, l in ipairs(d.virt_lines or {}) do
    parts[#parts + 1] = l[1] and l[1][1] or ''
  end
  return { row = m[2], col = m[3], text = table.concat(parts, '\n') }
end

return M
