#!/usr/bin/env bash
# The CUDA checks for a session that is lent a GPU (issue 14 point 5, issue 37), in well under 10
# minutes: the CUDA tests (tiny models: greedy identity across modes in fp32 with passes replayed
# from CUDA graphs, graph replays vs eager passes, lean vs transformers; the real-model CUDA test
# runs where the default models are in the cache), the fixed-shape tests, then pass cost by tree
# size on the GPU (graphs, eager lean, transformers) and how often a bf16 verify pass and one-token
# passes pick different tokens. Results go to $OUT (the device tool's folder)
# or benchmarks/results.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results}
python3 -c "import torch; assert torch.cuda.is_available(), f'torch {torch.__version__} sees no CUDA device'; print(torch.__version__, torch.cuda.get_device_name())" || exit 1
status=0
timeout 240 python3 -m pytest -q -rs -p no:cacheprovider tests/test_cuda.py tests/test_graphs.py 2>&1 | tee "$OUT/gpu-tests.txt" || status=1
timeout 120 python3 -m pytest -q -rs -p no:cacheprovider tests/test_real_model.py -k cuda 2>&1 | tee -a "$OUT/gpu-tests.txt" || status=1
timeout 240 python3 benchmarks/gpu_pass_cost.py --json "$OUT/gpu-pass-cost.json" || status=1
timeout 180 python3 benchmarks/gpu_agreement.py --json "$OUT/gpu-agreement.json" || status=1
exit $status
