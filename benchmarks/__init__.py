"""Tools that measure completiond, run from the repository root as `python -m benchmarks.NAME ...`
(they import the installed `completiond`; `pip install -e .` makes that this checkout):

  soak, fuzz, lsp_fuzz      a real daemon / language server under storms and malformed input
  startup                   start-up time and memory of a converted model
  keystroke                 latency per keystroke through real daemons, two checkouts side by side
  pass_cost                 target pass cost by tree size (kernels, weights, backends)
  pass_cost_vs_llama_cpp    the same beside llama.cpp on the same GGUF
  checkout_ab               whole passes of two checkouts, alternated
  next_edit                 next-edit quality and latency
  http_latency              /infill against the daemon's own protocol
  gpu_pass_cost, gpu.sh     the CUDA path (gpu.sh: the checks for a lent GPU)

`completiond bench` is the quality-and-latency benchmark (docs/measurements.md). Finished
experiments live in `benchmarks.experiments` (`python -m benchmarks.experiments` lists them).
"""
