"""Runs sparseforge.torch's own kernels (templates/transpose.cu: the
feature-major route's transposes and, on sm_90, rms_norm_t's RMSNorm
writing X^T) once on awkward shapes, each result checked against torch,
so that compute-sanitizer can watch them:
    compute-sanitizer --tool memcheck python3 bench/sanitize_torch_ops.py
    compute-sanitizer --tool racecheck python3 bench/sanitize_torch_ops.py
Needs torch (pip install .[torch]) and a GPU; exits non-zero if any
result is wrong."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from sparseforge import native  # noqa: E402
from sparseforge.torch import _op  # noqa: E402


def main() -> int:
    ctx, _ = _op.context(0)
    mod = ctx.load(native.Binary.from_bytes(_op.transpose_cubin(ctx.device_info()["arch"])))
    stream = torch.cuda.current_stream().cuda_stream
    bad = 0
    # the transposes: 2- and 4-byte elements, tiles cut at both edges
    for dt, size in ((torch.float16, 2), (torch.float32, 4)):
        fn = mod.kernel(f"sf_transpose_{size}")
        for rows, cols in ((1, 1), (16, 4096), (77, 130), (300, 64)):
            x = torch.randn(rows, cols, device="cuda").to(dt)
            out = x.new_empty((cols, rows))
            _op.launch_transpose(ctx, fn, x.data_ptr(), out.data_ptr(), rows, cols, stream)
            ok = torch.equal(out, x.t())
            bad += not ok
            print(f"transpose {dt} {rows} x {cols}: {'ok' if ok else 'WRONG'}", flush=True)
    if torch.cuda.get_device_capability()[0] < 9:
        print("rms_norm_t: not run (its kernel runs 8-block clusters: sm_90)")
    else:
        fn = mod.kernel("sf_rmsnorm_t_2")
        for dt in (torch.float16, torch.bfloat16):
            for n, k in ((1, 64), (17, 1000), (16, 4096), (40, 8192)):
                x = torch.randn(n, k, device="cuda").to(dt)
                yt = torch.randn(k, n, device="cuda").to(dt)
                w = (torch.rand(k, device="cuda") + 0.5).to(dt)
                for use_yt in (False, True):
                    h = torch.empty_like(x) if use_yt else None
                    xt = x.new_empty((k, n))
                    _op.launch_rms_norm_t(ctx, fn, x.data_ptr(), yt.data_ptr() if use_yt else 0,
                                          w.data_ptr(), h.data_ptr() if use_yt else 0,
                                          xt.data_ptr(), n, k, 1e-6,
                                          _op.norm_flags(dt, True, n), stream)
                    rh, rxt = _op.rms_norm_t_reference(x, yt if use_yt else None, w, 1e-6, True)
                    ok = torch.allclose(xt.float(), rxt.float(), rtol=1e-2, atol=1e-2) and \
                        (not use_yt or torch.equal(h, rh))
                    bad += not ok
                    print(f"rms_norm_t {dt} {n} x {k}{' + Y^T' if use_yt else ''}: "
                          f"{'ok' if ok else 'WRONG'}", flush=True)
    torch.cuda.synchronize()
    print(f"{bad} wrong")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
