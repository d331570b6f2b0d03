"""Probe, not product (docs/kernels.md "Round 16"): would the 512-bit int4 tiles read faster if the two
vectors of 8 channels a zmm holds were one stream (their 32-byte pieces interleaved, so each k step is
one aligned 64-byte load) instead of two streams kp / 2 x 8 bytes apart? Timed on random bytes, so only
the time means anything (the PAIRS build reads the weights in the wrong order). Build and run:

    cp -r completiond/models/kernels /tmp/probe && cd /tmp/probe && patch -p0 w4_mm.c < w4-pairs-probe.patch
    SRC="int8_mm.c a16_mm.c a8_mm.c w4_mm.c mm.c qwen2_layer.c"; F="-O3 -mavx2 -mfma -fopenmp -ffp-contract=off -shared -fPIC"
    gcc $F -o base.so $SRC && gcc -DPAIRS $F -o pairs.so $SRC
    python w4_pairs_probe.py 1,3,4,5,6,8,12,16 out.json   # ms per layer of the 1.5B's four shapes, fastest of 7
"""
import json
import ctypes, time, torch, sys
torch.set_num_threads(2)
from completiond.models.kernels import cpu_kernel as ck
libs = {n: ctypes.CDLL(f'./{n}.so') for n in ('base', 'pairs')}
for lib in libs.values():
    for name_, (args, res) in ck.SIGNATURES.items():
        fn = getattr(lib, name_); fn.argtypes, fn.restype = args, res
SHAPES = [(2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960)]
g = torch.Generator().manual_seed(0)
L = 6
mats = []
for _ in range(L):
    for n, k in SHAPES:
        kp = (k + 127) // 128 * 128
        mats.append((torch.randint(0, 256, (n, kp // 2), dtype=torch.uint8, generator=g),
                     torch.rand(n, 2, kp // 32, generator=g).to(torch.bfloat16), n, k))
W4 = ck.KINDS["w4+avx512-vnni"]
rows_list = [int(r) for r in sys.argv[1].split(',')]
table = {}
for m in rows_list:
    xs = {k: torch.randn(m, k, generator=g) for k in (1536, 8960)}
    ys = {n: torch.empty(m, n) for n in (2048, 1536, 17920)}
    best = {}
    for rep in range(7):
        for name, lib, zmm in (('ymm', libs['base'], 0), ('zmm', libs['base'], 1), ('pairs', libs['pairs'], 1)):
            lib.completiond_zmm(zmm); lib.completiond_w4_zmm_rows(1)
            t0 = time.perf_counter()
            for packed, scales, n, k in mats:
                lib.completiond_mm(W4, xs[k].data_ptr(), packed.data_ptr(), scales.data_ptr(), ys[n].data_ptr(), m, k, n, 2)
            best[name] = min(best.get(name, 1e9), (time.perf_counter() - t0) * 1000 / L)
    table[str(m)] = {k: round(v, 3) for k, v in best.items()}
    print(m, table[str(m)], flush=True)
json.dump({'command': 'python w4_pairs_probe.py ' + ' '.join(sys.argv[1:]), 'cpu': ck.cpu_key() if hasattr(ck, 'cpu_key') else '',
           'ms_per_layer_fastest_of_7': table, 'kinds': {'ymm': '256-bit tiles', 'zmm': '512-bit tiles, two streams (shipped)',
           'pairs': '512-bit tiles, one interleaved stream (probe)'}}, open(sys.argv[2], 'w'), indent=2)
