"""Two builds of the kernel library side by side in one process, rep by rep (docs/kernels.md
"int4 weights": vectors of 8 one after another, f23fbc7, against pairs of vectors interleaved): the 1.5B's four
layer shapes, 6 layers of random bytes (only the time means anything: each build reads them in its
own order), ms a layer, fastest of 9, each build with its choice of tiles on this CPU (the 512-bit
tiles from 5 rows old, from 3 new). Build and run:

    for c in old new; do mkdir -p /tmp/ab/$c; done   # old: git show f23fbc7:completiond/models/kernels/<file>
    (cd /tmp/ab/old && gcc -O3 -mavx2 -mfma -fopenmp -ffp-contract=off -shared -fPIC -o lib.so \
        int8_mm.c a16_mm.c a8_mm.c w4_mm.c mm.c qwen2_layer.c)                  # the same in /tmp/ab/new
    python -m benchmarks.experiments w4_build_ab 1,2,3,4,5,8 out.json [w4 | w4+avx-vnni | w4+avx512-vnni]

Environment: ZMM_ROWS=OLD,NEW (the 512-bit tiles' first row count of each build, default 5,3),
LAYERS (6), SHAPES=mlp (only the MLP's two shapes, as int4 runs them in the model), OLD / NEW (what
each build is, for the JSON). Int4
groups of 32 / 64: `ZMM_ROWS=3,3 python -m benchmarks.experiments w4_build_ab 1,2,4,8 -` and with `LAYERS=28 SHAPES=mlp`.
"""
import os
import ctypes, time, torch, sys, json
torch.set_num_threads(2)
from completiond.models.kernels import cpu_kernel as ck
libs = {n: ctypes.CDLL(f'/tmp/ab/{n}/lib.so') for n in ('old', 'new')}
for name, lib in libs.items():
    for name_, (args, res) in ck.SIGNATURES.items():
        if hasattr(lib, name_):  # an older build may lack a newer export
            fn = getattr(lib, name_); fn.argtypes, fn.restype = args, res
    zmm_rows = dict(zip(('old', 'new'), map(int, os.environ.get('ZMM_ROWS', '5,3').split(','))))
    lib.completiond_zmm(1); lib.completiond_w4_zmm_rows(zmm_rows[name])
SHAPES = [(2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960)]
if os.environ.get('SHAPES') == 'mlp':
    SHAPES = SHAPES[2:]
g = torch.Generator().manual_seed(0)
L = int(os.environ.get('LAYERS', 6))
mats = []
for _ in range(L):
    for n, k in SHAPES:
        kp = (k + 127) // 128 * 128
        mats.append((torch.randint(0, 256, (n, kp // 2), dtype=torch.uint8, generator=g),
                     torch.rand(n, 2, kp // 32, generator=g).to(torch.bfloat16), n, k))
W4 = ck.KINDS[sys.argv[3] if len(sys.argv) > 3 else "w4+avx512-vnni"]
table = {}
for m in [int(r) for r in sys.argv[1].split(',')]:
    xs = {k: torch.randn(m, k, generator=g) for k in (1536, 8960)}
    ys = {n: torch.empty(m, n) for n in (2048, 1536, 17920)}
    best = {}
    for rep in range(9):
        for name, lib in libs.items():
            t0 = time.perf_counter()
            for packed, scales, n, k in mats:
                lib.completiond_mm(W4, xs[k].data_ptr(), packed.data_ptr(), scales.data_ptr(), ys[n].data_ptr(), m, k, n, 2)
            best[name] = min(best.get(name, 1e9), (time.perf_counter() - t0) * 1000 / L)
    table[str(m)] = {k: round(v, 3) for k, v in best.items()}
    print(m, table[str(m)], flush=True)
if len(sys.argv) > 2 and sys.argv[2] != "-":
    json.dump({'command': 'python ' + ' '.join(sys.argv), 'ms_per_layer_fastest_of_9': table,
               'old': os.environ.get('OLD', 'vectors of 8 one after another (f23fbc7)'),
               'new': os.environ.get('NEW', 'pairs of vectors interleaved'),
               'env': {k: os.environ[k] for k in ('ZMM_ROWS', 'LAYERS', 'SHAPES') if k in os.environ}}, open(sys.argv[2], 'w'), indent=2)
