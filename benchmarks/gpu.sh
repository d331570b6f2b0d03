#!/usr/bin/env bash
# The CUDA checks for a session that is lent a GPU, in well under 10
# minutes: the CUDA tests (tiny models: greedy identity across modes in fp32 with passes replayed
# from CUDA graphs, graph replays vs eager passes, lean vs transformers; the real-model CUDA test
# runs where the default models are in the cache), the fixed-shape tests, then pass cost by tree
# size on the GPU (graphs, eager lean, transformers) and how often a bf16 verify pass and one-token
# passes pick different tokens, a profile of one pass, and the real pair's bench where its models
# are installed. Results go to $OUT (the device tool's folder) or a temporary folder.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}  # not benchmarks/results: results there are the cited ones
mkdir -p "$OUT"; echo "gpu.sh: results in $OUT"
python3 -c "import torch; assert torch.cuda.is_available(), f'torch {torch.__version__} sees no CUDA device'; print(torch.__version__, torch.cuda.get_device_name())" || exit 1
status=0
timeout 240 python3 -m pytest -q -rs -p no:cacheprovider tests/test_cuda.py tests/test_graphs.py 2>&1 | tee "$OUT/gpu-tests.txt" || status=1
timeout 120 python3 -m pytest -q -rs -p no:cacheprovider tests/test_real_model.py -k cuda 2>&1 | tee -a "$OUT/gpu-tests.txt" || status=1
timeout 240 python3 -m benchmarks.gpu_pass_cost --json "$OUT/gpu-pass-cost.json" || status=1
timeout 180 python3 -m benchmarks.experiments gpu_agreement --json "$OUT/gpu-agreement.json" || status=1
timeout 120 python3 -m benchmarks.experiments gpu_profile --json "$OUT/gpu-profile.json" > "$OUT/gpu-profile.txt" 2>&1 || status=1
# The real pair, where its parts are installed (a lent machine cannot fetch them): the stdlib's json
# package as the repository, nothing to download.
if python3 -c "from completiond.models.catalog import CODER_05B, CODER_15B, installed
raise SystemExit(not (installed(CODER_15B) and installed(CODER_05B)))"; then
  timeout 420 python3 -m completiond bench --repo "$(python3 -c 'import json, os; print(os.path.dirname(json.__file__))')" \
    --positions 16 --targets qwen2.5-coder-1.5b,qwen2.5-coder-0.5b --modes ar,combined --device cuda \
    --json "$OUT/gpu-bench.json" || status=1
else
  echo "gpu.sh: the [coder] models are not installed here: no real-model bench"
fi
exit $status
