#!/usr/bin/env bash
# The CUDA checks for a session that is lent a GPU (issue 14 point 5), in well under 10 minutes:
# the CUDA tests (tiny models: greedy identity across modes in fp32, lean vs transformers; the
# real-model CUDA test runs where the default models are in the cache), then pass cost by tree size
# on the GPU. Results go to $OUT (the device tool's folder) or benchmarks/results.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results}
python3 -c "import torch; assert torch.cuda.is_available(), f'torch {torch.__version__} sees no CUDA device'; print(torch.__version__, torch.cuda.get_device_name())"
python3 -m pytest -q -rs tests/test_cuda.py tests/test_real_model.py -k cuda 2>&1 | tee "$OUT/gpu-tests.txt"
python3 benchmarks/gpu_pass_cost.py --json "$OUT/gpu-pass-cost.json"
