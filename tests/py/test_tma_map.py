"""The tensor map of X the runtime encodes for a kernel whose module
declares one (sf_kernel_args_set): argument checks anywhere; on a Hopper
GPU, a kernel that TMA-loads every box of X through the map (128-byte
swizzle, zeros outside X) and writes it back out unswizzled, for both
layouts and edges that end inside a box."""
import numpy as np
import pytest

from sparseforge import native
from sparseforge.generator.kernel import amalgamate

SOURCE = r"""
#include "sf/tma_sm90.cuh"
SF_DECLARE_X_MAP(LAYOUT, K, 64, ROWS);
// Box (64 x ROWS) (blockIdx.x, blockIdx.y) of X, through the map, into Y
// (X's shape: D0 contiguous, D1 rows); the map is zero where the runtime
// could not encode one, and then Y is left alone.
extern "C" __global__ void tma_copy(const unsigned char* packed, const void* X, void* Y, int N,
                                    const __grid_constant__ sf::sm90::TensorMap map) {
  __shared__ alignas(1024) unsigned short tile[ROWS * 64];
  __shared__ alignas(8) unsigned long long bar;
  const int d0 = LAYOUT == 1 ? N : K, d1 = LAYOUT == 1 ? K : N;
  if (map.v[0] == 0 && map.v[1] == 0 && map.v[2] == 0 && map.v[3] == 0) return;
  const unsigned b = (unsigned)__cvta_generic_to_shared(&bar);
  const unsigned t = (unsigned)__cvta_generic_to_shared(tile);
  const int c0 = blockIdx.x * 64, c1 = blockIdx.y * ROWS;
  if (threadIdx.x == 0) {
    sf::sm90::mbar_init(b, 1);
    sf::sm90::fence_mbar_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    sf::sm90::mbar_arrive_expect(b, ROWS * 128);
    sf::sm90::tma_load_2d(t, &map, c0, c1, b);
  }
  sf::sm90::mbar_wait(b, 0);
  unsigned short* y = static_cast<unsigned short*>(Y);
  for (int i = threadIdx.x; i < ROWS * 64; i += blockDim.x) {
    const int r = i / 64, c = i % 64;
    const int off = r * 64 + (((c / 8) ^ (r & 7)) * 8) + c % 8;
    if (c0 + c < d0 && c1 + r < d1) y[(size_t)(c1 + r) * d0 + c0 + c] = tile[off];
  }
}
"""


@pytest.fixture(scope="module")
def ctx():
    c = native.Context(0)
    yield c
    c.close()


@pytest.mark.gpu
@pytest.mark.parametrize("layout, k, n, rows", [
    (1, 100, 200, 64),     # X is K x N: 100 rows of 200 (N % 8 == 0)
    (2, 136, 77, 32),      # X is N x K: 77 rows of 136
    (2, 64, 300, 128),
])
def test_map_loads_every_box(ctx, layout, k, n, rows):
    info = ctx.device_info()
    if info["arch"] != "sm_90a":
        pytest.skip(f"TMA tests run on sm_90a; this GPU is {info['arch']}")
    src = amalgamate(f"#define LAYOUT {layout}\n#define K {k}\n#define ROWS {rows}\n" + SOURCE)
    mod = ctx.load(ctx.compile(src, name="tma_copy.cu"))
    fn = mod.kernel("tma_copy")
    d0, d1 = (n, k) if layout == 1 else (k, n)
    x = np.random.default_rng(0).integers(1, 60000, size=(d1, d0)).astype(np.uint16)
    xb, yb, pb = ctx.upload(x.tobytes()), ctx.alloc(x.nbytes), ctx.alloc(16)
    ctx.memset(yb, 0)
    args = ctx.kernel_args(fn, pb, xb, yb, n)
    assert args.maps == 1
    ctx.launch(fn, (-(-d0 // 64), -(-d1 // rows), 1), (128, 1, 1), args)
    ctx.synchronize()
    y = np.frombuffer(ctx.download(yb, x.nbytes), np.uint16).reshape(d1, d0)
    np.testing.assert_array_equal(y, x)


@pytest.mark.gpu
def test_unaligned_rows_get_no_map(ctx):
    """X of layout 1 with N % 8 != 0: the fifth argument is there, zero."""
    src = amalgamate("#define LAYOUT 1\n#define K 64\n#define ROWS 64\n" + SOURCE)
    mod = ctx.load(ctx.compile(src, name="tma_copy.cu"))
    fn = mod.kernel("tma_copy")
    xb, yb = ctx.alloc(64 * 77 * 2), ctx.alloc(64 * 77 * 2)
    args = ctx.kernel_args(fn, xb, xb, yb, 77)
    assert args.maps == 1 and not any(args._raw.x_map)
    args = ctx.kernel_args(fn, xb, xb, yb, 80)
    assert any(args._raw.x_map)


@pytest.mark.gpu
def test_kernel_without_a_map_takes_four_arguments(ctx):
    mod = ctx.load(ctx.compile('extern "C" __global__ void k(const unsigned char*, const void*, '
                               'void*, int) {}', name="plain.cu"))
    fn = mod.kernel("k")
    b = ctx.alloc(16)
    args = ctx.kernel_args(fn, b, b, b, 5)
    assert args.maps == 0
    with pytest.raises(native.InvalidArgumentError, match="N = 0 is outside 1..2147483647"):
        ctx.kernel_args(fn, b, b, b, 0)


Y_SOURCE = r"""
#include "sf/mma_sm90.cuh"
#include "sf/tma_sm90.cuh"
SF_DECLARE_Y_MAP(LAYOUT, M, 64, 64);
// Box (blockIdx.x, blockIdx.y) of Y (64 x 64; D0 contiguous, D1 rows),
// staged swizzled as the map's boxes land and written through the map by
// one tensor store: element (r, c) of Y gets 1 + (7 r + 13 c) % 32768.
// The map is zero where the runtime could not encode one: Y is left alone.
extern "C" __global__ void tma_store(const unsigned char* packed, const void* X, void* Y, int N,
                                     const __grid_constant__ sf::sm90::TensorMap map) {
  __shared__ alignas(1024) unsigned short tile[64 * 64];
  if (map.v[0] == 0 && map.v[1] == 0 && map.v[2] == 0 && map.v[3] == 0) return;
  const int c0 = blockIdx.x * 64, c1 = blockIdx.y * 64;
  for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) {
    const int r = i / 64, c = i % 64;
    tile[r * 64 + (((c / 8) ^ (r & 7)) * 8) + c % 8] =
        (unsigned short)(1 + (7 * (c1 + r) + 13 * (c0 + c)) % 32768);
  }
  sf::sm90::fence_proxy_async();
  __syncthreads();
  if (threadIdx.x == 0) {
    sf::sm90::tma_store_2d(&map, c0, c1, (unsigned)__cvta_generic_to_shared(tile));
    sf::sm90::commit_bulk();
    sf::sm90::wait_bulk<0>();
  }
}
"""


@pytest.mark.gpu
@pytest.mark.parametrize("layout, m, n", [
    (1, 100, 200),     # Y is M x N: 100 rows of 200 (N % 8 == 0)
    (2, 136, 77),      # Y is N x M: 77 rows of 136
    (1, 100, 77),      # rows not 16-byte aligned: a zero map, Y untouched
])
def test_map_stores_every_box(ctx, layout, m, n):
    """A module's map of Y (sf_y_map, the fifth argument where there is no
    map of X): every box written, nothing past Y's end."""
    info = ctx.device_info()
    if info["arch"] != "sm_90a":
        pytest.skip(f"TMA tests run on sm_90a; this GPU is {info['arch']}")
    src = amalgamate(f"#define LAYOUT {layout}\n#define M {m}\n" + Y_SOURCE)
    fn = ctx.load(ctx.compile(src, name="tma_store.cu")).kernel("tma_store")
    d0, d1 = (n, m) if layout == 1 else (m, n)
    guard = 4096
    yb, pb = ctx.alloc(2 * d0 * d1 + guard), ctx.alloc(16)
    ctx.memset(yb, 0)
    args = ctx.kernel_args(fn, pb, pb, yb, n)
    assert args.maps == 1 and any(args._raw.y_map) == (layout == 2 or n % 8 == 0)
    ctx.launch(fn, (-(-d0 // 64), -(-d1 // 64), 1), (128, 1, 1), args)
    ctx.synchronize()
    raw = ctx.download(yb, 2 * d0 * d1 + guard)
    y = np.frombuffer(raw[:2 * d0 * d1], np.uint16).reshape(d1, d0)
    r, c = np.meshgrid(np.arange(d1), np.arange(d0), indexing="ij")
    want = (1 + (7 * r + 13 * c) % 32768).astype(np.uint16)
    np.testing.assert_array_equal(y, want if any(args._raw.y_map) else 0)
    assert not any(raw[2 * d0 * d1:])


@pytest.mark.gpu
def test_malformed_y_map_is_refused(ctx):
    src = amalgamate('#include "sf/tma_sm90.cuh"\nSF_DECLARE_Y_MAP(3, 64, 64, 64);\n'
                     'extern "C" __global__ void k(const unsigned char*, const void*, void*, int) {}')
    mod = ctx.load(ctx.compile(src, name="bad.cu"))
    with pytest.raises(native.InvalidArgumentError,
                       match=r"the module's sf_y_map \{3, 64, 64, 64\} is malformed \(layout 1 "
                             r"or 2, M >= 1"):
        mod.kernel("k")
