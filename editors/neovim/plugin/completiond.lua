-- completiond: commands. Nothing starts until require('completiond').setup() is called.
if vim.g.loaded_completiond then
  return
end
vim.g.loaded_completiond = true

vim.api.nvim_create_user_command('CompletiondRewrite', function(a)
  require('completiond').rewrite(a.line1, a.line2, a.args)
end, { range = true, nargs = '+', desc = 'Rewrite the selected lines with completiond following an instruction' })

vim.api.nvim_create_user_command('CompletiondToggle', function()
  require('completiond').toggle()
end, { desc = 'Turn completiond suggestions on or off' })

vim.api.nvim_create_user_command('CompletiondStatus', function()
  local c = require('completiond')
  local client = c.client(0)
  local s = client and c.status[client.id]
  print(c.status_line() .. (s and ('\n' .. vim.inspect(s)) or ''))
end, { desc = 'Show the completiond server status' })

vim.api.nvim_create_user_command('CompletiondNextEdit', function()
  require('completiond.next_edit').request()
end, { desc = 'Ask completiond for the next edit (shown in place; <Tab> jumps / applies, <Esc> hides)' })
