"""The row-group gather GEMM: the kernel engine of the `bsr` and `shflbw`
families (it registers no family of its own).

Both patterns reduce to the same computation: the rows of W (permuted for
shflbw) fall into groups; group g has a list of k_g columns and a dense
weight tile over them, and

    Y[rows of g, :] = epilogue(W_g . X[cols of g, :])

- shflbw: a group is V consecutive rows of the permuted matrix; its list is
  the group's column support (the union of its rows' supports, so a matrix
  that does not fit exactly still runs, with explicit zeros stored).
- bsr: a group is one block-row of br rows (several block-rows when br < 16,
  to fill one m16 tensor-core tile); its list is the union of its nonzero
  blocks' columns, each block contributing a run of bc columns.

plan.py packs a matrix (xshare.py for the shared-gather path), space.py is
the search space and its constraint table, this module the Family base the
two families derive from.  The device code is
templates/include/sf/rowgroup.cuh; templates/rowgroup.cu.j2 only bakes in
the constants.  Split K (`ks`, sm_90a, few columns of N: decode) gives a
group's chunks to the ks CTAs of a cluster; ranks 1.. push their fp32
partial tiles into rank 0's shared memory, which adds them.  The TMA-fed
path (`tma`, sm_90a, token-major, bsr blocks a multiple of BK wide) packs
each chunk's weights in the shared tile's swizzled order (plan.swizzled)
and reads each chunk's X as one box; persistent CTAs (`pc`: the grid)
take its items in turn.
"""
from __future__ import annotations

import hashlib
import weakref
from typing import Optional

import numpy as np

from ...family import Family, by_regime
from ...kernel import (ConfigError, Kernel, Operation, config_name, make_launch, render,
                       sm_count, smem_limit)
from ...matrix import SparseMatrix
from . import space
from .plan import (ELEM_T, Grouping, RowGroupPlan, build_plan, build_shared_plan,
                   contiguous_runs, cost_classes, round_up, unpack_plan)

SM_SMEM = 228 * 1024     # shared memory of an sm_90 multiprocessor (1 KB of it per CTA is reserved)
TABLE_SOURCE = "generator/families/rowgroup/space.py"


def is_wg(config: dict) -> bool:
    """Whether a configuration takes the wgmma (sm_90a) path."""
    return bool(config.get("wg", 0))


def is_tma(config: dict) -> bool:
    """Whether a configuration takes the TMA-fed wgmma path."""
    return bool(config.get("tma", 0))


def is_xs(config: dict) -> bool:
    """Whether a configuration takes the shared-gather path."""
    return bool(config.get("xr", 0))


def wg_tile_rows(bm: int) -> int:
    """Rows of a wgmma tile: BM rounded up to whole warpgroups (64 rows)."""
    return max(64, round_up(bm, 64))


def problem(bm: int, layout: str, xrun: int = 0) -> dict:
    """The constants of the constraint table that the problem fixes (xrun:
    plan.contiguous_runs)."""
    return {"bm": bm, "tm": int(layout == "tm"), "xrun": xrun}


def device_constants(device: Optional[dict]) -> dict:
    """The constants of the table's device constraints."""
    return {"smem_limit": smem_limit(device),
            "sm90a": int(not device or not device.get("arch") or device["arch"] == "sm_90a")}


def env_of(bm: int, config: dict, layout: str = "fm") -> dict:
    """The table's environment of a configuration: derived sizes (smem,
    tile, threads, ...) included."""
    return space.SPACE.env(config, problem(bm, layout))


def smem_bytes(bm: int, config: dict, layout: str = "fm") -> int:
    """Dynamic shared memory of a configuration (the table's `smem`, which
    the kernel asserts equal to Config::SMEM_BYTES)."""
    return env_of(bm, config, layout)["smem"]


def min_blocks(bm: int, config: dict, layout: str = "fm") -> int:
    """The minimum-CTAs-per-SM hint of __launch_bounds__.  mma.sync paths:
    the most CTAs whose registers fit when each thread gets its
    accumulators, two k-steps of A and B fragments, its prefetched row
    indices and ~88 registers of addressing (each of the SM's 4 schedulers
    has 16K registers); ptxas's own default spills the large warp tiles.
    wgmma: as many as shared memory holds while each thread keeps its
    accumulators and ~56 registers -- asking for them caps the registers
    (without the cap a fused GELU took more than half the register file
    and the SM held one CTA, so nothing hid the epilogue)."""
    e = env_of(bm, config, layout)
    if is_wg(config):
        need = round_up(e["bn"] // e["wn"] // 2 + 56, 8)
        by_smem = SM_SMEM // (e["smem"] + 1024)
        return max(1, min(8, by_smem, 65536 // (e["threads"] * need)))
    regs = e["acc"] + (e["mf"] * 4 + e["nf"] * 2) * 2 + e["b_iters"] + 88
    warps = e["wm"] * e["wn"]
    for blocks in range(8, 0, -1):
        # registers are split over the SM's 4 schedulers (16K each), 8 at a time
        per_scheduler = -(-blocks * warps // 4)
        if min(255, 16384 // (per_scheduler * 32) // 8 * 8) >= regs:
            return blocks
    return 1


class RowGroupFamily(Family):
    """A Family whose kernels are the row-group gather GEMM.  Subclasses
    define the pattern (name, parse_params, tag, spec, _check_params,
    analyze, prune, synth) and `_grouping_uncached`."""
    dtypes = ("fp16", "bf16")
    layouts = ("fm",)
    template = "rowgroup.cu.j2"

    def __init__(self):
        self._cache: dict = {}

    # -- to implement -------------------------------------------------------
    def _grouping_uncached(self, matrix: SparseMatrix, params: dict) -> Grouping:
        raise NotImplementedError

    def _check_params(self, params: dict) -> tuple:
        raise NotImplementedError

    def xrun(self, matrix: SparseMatrix, params: dict) -> int:
        """The aligned runs of columns X's tensor map reads whole (0: none)."""
        return contiguous_runs(self.grouping(matrix, params), matrix.cols)

    # -- grouping, cached per matrix object -----------------------------------
    def grouping(self, matrix: SparseMatrix, params: dict) -> Grouping:
        key = (id(matrix), self._check_params(params), matrix.nnz, matrix.shape)
        hit = self._cache.get(key)
        if hit is not None and hit[0]() is matrix:
            return hit[1]
        g = self._grouping_uncached(matrix, params)
        if len(self._cache) >= 8:
            self._cache.pop(next(iter(self._cache)))
        self._cache[key] = (weakref.ref(matrix), g)
        return g

    def fits(self, matrix: SparseMatrix, params: dict) -> bool:
        return self.grouping(matrix, params).exact

    def dtype_for(self, dtype: str) -> str:
        return dtype if dtype in self.dtypes else "fp16"

    # -- configurations ------------------------------------------------------
    def tile_rows(self, matrix: SparseMatrix, params: dict) -> int:
        """BM of every configuration for this matrix and params."""
        return self.grouping(matrix, params).bm

    def check_config(self, config: dict, matrix: SparseMatrix, op: Operation, params: dict,
                     device: Optional[dict] = None) -> None:
        self._check_params(params)
        self.check_op(op)
        keys = tuple(sorted(config))
        if keys not in space.KEY_SETS:
            raise ConfigError(f"keys: a {self.name} configuration has exactly "
                              f"{space.CONFIG_KEYS} (or those and 'ks' for split K, or 'wg', "
                              f"optionally with 'tn' or 'tma' (and then 'tn' or 'pc'), for the "
                              f"wgmma path, or 'xr' and 'xu' for the shared gather), got {keys}")
        for k_ in keys:
            if not isinstance(config[k_], (int, np.integer)) or isinstance(config[k_], bool):
                raise ConfigError(f"{k_}: must be an integer, got {config[k_]!r}")
        if config.get("tn") == 1:
            raise ConfigError("tn: omit the key for one tile of N per CTA (one configuration, "
                              "one spelling)")
        if config.get("ks") == 1:
            raise ConfigError("ks: omit the key for one CTA per group (one configuration, "
                              "one spelling)")
        if config.get("pc", None) == 0:
            raise ConfigError("pc: omit the key for one item a CTA (one configuration, "
                              "one spelling)")
        space.SPACE.check(config, problem(self.tile_rows(matrix, params), op.layout,
                                          self.xrun(matrix, params)),
                          device_constants(device))

    @staticmethod
    def persistent(config: dict, bm: int, device: Optional[dict]) -> dict:
        """The TMA configuration as persistent CTAs: as many as the device
        holds at once (its multiprocessors x the CTAs one holds; without a
        device, an H100's 132)."""
        return dict(config, pc=sm_count(device) * min_blocks(bm, dict(config, pc=1), "tm"))

    @staticmethod
    def xs_space() -> list[dict]:
        """Every shared-gather configuration shape (unchecked): half and
        three quarters of xr * bk rows of X per chunk."""
        out = []
        for outer in space.XS_SPACE.enumerate(("xr", "bk")):
            xr, bk = outer["xr"], outer["bk"]
            for xu in sorted({round_up(xr * bk // 2, 16), round_up(3 * xr * bk // 4, 16)}):
                for c in space.XS_SPACE.enumerate(("bn", "wn", "stages"), dict(outer, xu=xu)):
                    out.append({k: c[k] for k in ("bk", "bn", "stages")} | {
                        "wm": xr, "wn": c["wn"], "xr": xr, "xu": xu})
        return out

    @staticmethod
    def wg_space(bm: int) -> list[dict]:
        """Every wgmma configuration shape for a tile of bm rows (unchecked)."""
        wm = wg_tile_rows(bm) // 16
        base = [{"bk": c["bk"], "bn": c["n"] * c["wn"], "stages": c["stages"], "wm": wm,
                 "wn": c["wn"], "wg": 1} for c in space.WG_SPACE.enumerate()]
        # streamed tiles: BK = 32 only.  With BK = 64 they spill a few bytes
        # with a fused GELU (sm_90a; over 64-row tiles they also lost in the
        # probe of bench/RESULTS.md), and with BK = 16 half the output tile
        # does not fit a stage.  The TMA-fed path (token-major, bsr) on
        # every shape of the base whose box fits, streamed or not (its
        # output tile has shared memory of its own).
        tma = [dict(c, tma=1) for c in base if c["bn"] <= space.TMA_MAX_BN]
        return base + tma + [dict(c, tn=tn) for tn in space.TN_CHOICES for c in base + tma
                             if c["bk"] == 32 or "tma" in c]

    def search_space(self, matrix: SparseMatrix, op: Operation, params: dict,
                     device: Optional[dict] = None) -> list[dict]:
        """Every valid configuration.  On sm_90a (feature-major) the wgmma
        ones, then the mma.sync decode tiles (at most KS_MAX_BN columns of
        N, and their split K: at 16 tokens 2.4-3.1x cuBLAS on shflbw:64's
        Llama shapes, bench/RESULTS.md); the other mma.sync and
        shared-gather ones join them only when the group is not whole
        warpgroups of rows (the wgmma tile then computes padding rows), as
        on an H200 wgmma was faster on every S1 problem whose groups are
        (the shared gather included: bench/RESULTS.md).
        Elsewhere mma.sync and the shared gather (token-major too: it reads
        each column of X its groups share once, but on an H100 it ran no
        faster than mma.sync on S1's shflbw and 2x slower on BERT-base's
        bsr, so its configurations come after mma.sync's and no hint
        names them: bench/RESULTS.md).  Token-major on sm_90a: the wgmma
        ones (prefill), then mma.sync and its split K (decode)."""
        bm = self.tile_rows(matrix, params)
        fm = op.layout == "fm"
        hopper = bool(device and device.get("arch") == "sm_90a")
        whole = hopper and bm % 64 == 0      # whole warpgroups of rows
        out = self.accepted(self.wg_space(bm), matrix, op, params, device) if hopper else []
        out += self.accepted([self.persistent(c, bm, device) for c in out
                              if c.get("tma") and "tn" not in c], matrix, op, params, device)
        mma = self.accepted(space.MMA_SPACE.enumerate(), matrix, op, params, device)
        # split K (sm_90a): the decode tiles over clusters of 2 or 4 CTAs (the table
        # keeps the few columns of N it serves)
        split = self.accepted([dict(c, ks=ks) for ks in space.KS_CHOICES for c in mma],
                              matrix, op, params, device)
        if fm and whole and out:   # and the decode tiles (at most KS_MAX_BN columns of N)
            return out + [c for c in mma if c["bn"] <= space.KS_MAX_BN] + split
        xs = [] if whole else self.accepted(self.xs_space(), matrix, op, params, device)
        mma += split
        return out + (xs + mma if fm else mma + xs)

    def hint_configs(self, matrix: SparseMatrix, op: Operation, params: dict,
                     device: Optional[dict] = None, n: Optional[int] = None) -> list[dict]:
        """The S1 winners on an H200 (bench/RESULTS.md), the most frequent
        first, that are valid here.  sm_90a, whole warpgroups of rows: the
        wgmma path; sm_90a with smaller groups: mma.sync, then the shared
        gather; elsewhere mma.sync with 64 x 64 warp tiles where BM allows."""
        bm = self.tile_rows(matrix, params)
        sm90a = bool(device and device.get("arch") == "sm_90a")
        hopper = sm90a and op.layout == "fm"
        wm = wg_tile_rows(bm) // 16
        wg = [{"bk": 32, "bn": 256, "stages": 5, "wm": wm, "wn": 1, "wg": 1},
              {"bk": 32, "bn": 128, "stages": 4, "wm": wm, "wn": 1, "wg": 1, "tn": 4},
              {"bk": 32, "bn": 256, "stages": 5, "wm": wm, "wn": 2, "wg": 1},
              {"bk": 32, "bn": 128, "stages": 5, "wm": wm, "wn": 1, "wg": 1},
              {"bk": 64, "bn": 128, "stages": 4, "wm": wm, "wn": 1, "wg": 1},
              {"bk": 32, "bn": 256, "stages": 5, "wm": wm, "wn": 2, "wg": 1, "tn": 2},
              {"bk": 32, "bn": 128, "stages": 4, "wm": wm, "wn": 1, "wg": 1},
              {"bk": 16, "bn": 256, "stages": 5, "wm": wm, "wn": 1, "wg": 1}]
        if hopper and bm % 64 == 0:  # wgmma, and split K's decode tiles
            # feature-major decode (N = 16): H100, shflbw:64 at 25%: bk64
            # wm2 s4 ks4 6.43 us on 4096 x 4096 and 11.68 on 4096 x 11008,
            # bk64 wm4 s4 (or ks2) 12.69 on 11008 x 4096 (bench/RESULTS.md,
            # 2026-11-27); N unknown: wgmma's first
            decode = self.accepted(
                [{"bk": 64, "bn": 16, "stages": 4, "wm": 2, "wn": 1, "ks": 4},
                 {"bk": 64, "bn": 16, "stages": 4, "wm": 4, "wn": 1, "ks": 2},
                 {"bk": 64, "bn": 16, "stages": 4, "wm": 4, "wn": 1}], matrix, op, params, device)
            wg_ok = self.accepted(wg, matrix, op, params, device)
            return wg_ok + decode if n is None else by_regime(decode, wg_ok, n)
        else:
            small = [{"bk": 16, "bn": 256, "stages": 3, "wm": 1, "wn": 2},
                     {"bk": 16, "bn": 128, "stages": 4, "wm": 1, "wn": 2},
                     {"bk": 16, "bn": 256, "stages": 4, "wm": 1, "wn": 2},
                     {"bk": 32, "bn": 128, "stages": 4, "wm": 1, "wn": 4},
                     {"bk": 64, "bn": 128, "stages": 3, "wm": 1, "wn": 4},
                     {"bk": 32, "bn": 128, "stages": 3, "wm": 8, "wn": 1, "xr": 8, "xu": 128}]
            wide = [{"bk": 32, "bn": 256, "stages": 4, "wm": max(1, bm // 64), "wn": 4},
                    {"bk": 32, "bn": 128, "stages": 3, "wm": max(1, bm // 64), "wn": 2},
                    {"bk": 32, "bn": 128, "stages": 3, "wm": 1, "wn": 4},
                    {"bk": 32, "bn": 128, "stages": 3, "wm": 2, "wn": 2}]
            if op.layout == "tm":
                # token-major decode (N of 16 to 64 tokens): 16 or 32
                # columns a CTA and 64 of K a stage, ordered with the
                # prefill tiles by N (by_regime).  H100, shflbw:64 at 75%,
                # N = 16: 4096 x 4096 13.9 us against 33.6 with bk32 bn128;
                # 11008 x 4096 17.8 against 41.2; 4096 x 11008 29.9 against
                # 80.0.  Split K first where clusters exist (sm_90a): over 2
                # CTAs 4096 x 4096 10.3 us, 11008 x 4096 16.3, 4096 x 11008
                # 19.2; over 4, 4096 x 11008 16.9 and bsr:64x64 4096 x 4096
                # 8.0 against 12.1 (bench/RESULTS.md, 2026-11-25)
                split = [{"bk": 64, "bn": 16, "stages": 4, "wm": 4, "wn": 1, "ks": 2},
                         {"bk": 64, "bn": 16, "stages": 4, "wm": 2, "wn": 1, "ks": 4}]
                # (named only for a device that is sm_90a: without a device the
                # table assumes sm_90a, and the default must build anywhere)
                decode = (split if sm90a else []) + [
                          {"bk": 64, "bn": 16, "stages": 4, "wm": 4, "wn": 1},
                          {"bk": 64, "bn": 32, "stages": 4, "wm": 4, "wn": 1},
                          {"bk": 64, "bn": 16, "stages": 3, "wm": 2, "wn": 1},
                          {"bk": 64, "bn": 32, "stages": 3, "wm": 2, "wn": 2}]
                decode = self.accepted(decode, matrix, op, params, device)
                # prefill: on sm_90a the wgmma tiles before mma.sync's.
                # H100, bsr:64x64 at 25%, N = 4096: bk32 bn256 wn2 s5 first
                # on 4096 x 4096 (99.8 us against 139 for mma.sync), 11008 x
                # 4096 and 3072 x 768, bk64 bn128 s4 on 768 x 3072; streamed
                # tiles (tn) no faster, and up to 1.7x slower on 768-row
                # layers (too few CTAs), so no hint names them
                # (bench/RESULTS.md, 2026-11-25)
                # Then (2026-11-26, H100, bsr:64x64 at 25%, N = 4096) the
                # TMA-fed tiles (bsr: a chunk is one box of X) first: on
                # BERT's shapes 768 x 768 12.2 us against 13.0 for the
                # cp.async tile, 3072 x 768 25.3 (persistent CTAs, 3 an SM)
                # against 27.5, 768 x 3072 26.8 (persistent, 2 an SM)
                # against 27.8; 4096 x 4096 stays with bk32 bn256 wn2
                # (99.5 us against 102.9 for the best TMA tile)
                tma = [{"bk": 32, "bn": 128, "stages": 6, "wm": wm, "wn": 1, "wg": 1, "tma": 1},
                       self.persistent({"bk": 32, "bn": 128, "stages": 4, "wm": wm, "wn": 1,
                                        "wg": 1, "tma": 1}, bm, device),
                       self.persistent({"bk": 64, "bn": 128, "stages": 3, "wm": wm, "wn": 1,
                                        "wg": 1, "tma": 1}, bm, device)]
                wg_tm = tma + [
                         {"bk": 32, "bn": 256, "stages": 5, "wm": wm, "wn": 2, "wg": 1},
                         {"bk": 64, "bn": 128, "stages": 4, "wm": wm, "wn": 1, "wg": 1},
                         {"bk": 32, "bn": 256, "stages": 5, "wm": wm, "wn": 1, "wg": 1},
                         {"bk": 64, "bn": 256, "stages": 4, "wm": wm, "wn": 2, "wg": 1},
                         {"bk": 32, "bn": 128, "stages": 5, "wm": wm, "wn": 1, "wg": 1}]
                prefill = self.accepted((wg_tm if sm90a else []) + wide[2:] + wide[:2],
                                        matrix, op, params, device)
                return by_regime(decode, prefill, n)   # (both valid already)
            prefs = (small + wg if hopper else []) + wide
        return self.accepted(prefs, matrix, op, params, device)

    def default_config(self, matrix: SparseMatrix, op: Operation, params: dict,
                       device: Optional[dict] = None) -> dict:
        """A reasonable configuration without tuning: the first hint."""
        hints = self.hint_configs(matrix, op, params, device)
        return hints[0] if hints else super().default_config(matrix, op, params, device)

    # -- plan, unpack, render ------------------------------------------------
    def plan(self, matrix: SparseMatrix, op: Operation, params: dict, config: dict,
             bias: Optional[np.ndarray] = None) -> RowGroupPlan:
        self.check_config(config, matrix, op, params)
        xs = is_xs(config)
        # the packing depends on these alone: every configuration that shares
        # them shares one plan (and one packed bytes object: tuner/worker.py)
        bias_key = None if bias is None else hashlib.blake2b(
            np.ascontiguousarray(bias, dtype=np.float64).tobytes(), digest_size=16).digest()
        key = ("rowgroup.plan", self.name, self._check_params(params), op.dtype,
               op.epilogue.bias, bias_key, config["bk"], config.get("tn", 1),
               (config["xr"], config["xu"]) if xs else None, is_tma(config))
        if xs:
            return matrix.cached(key, lambda: build_shared_plan(
                matrix, op, self.grouping(matrix, params), config["bk"], config["xr"],
                config["xu"], family=self.name, tag=self.tag(params), bias=bias))
        return matrix.cached(key, lambda: build_plan(
            matrix, op, self.grouping(matrix, params), config["bk"], family=self.name,
            tag=self.tag(params), bias=bias, tn=config.get("tn", 1), swizzled=is_tma(config)))

    def unpack(self, plan: RowGroupPlan) -> SparseMatrix:
        return unpack_plan(plan)

    def render(self, plan: RowGroupPlan, op: Operation, config: dict) -> Kernel:
        name = config_name(plan.tag, config, op)
        e = env_of(plan.bm, config, op.layout)
        tile = {k: config[k] for k in space.CONFIG_KEYS}  # the template's names ("wg" is `wg`)
        tn = config.get("tn", 1)
        ks = config.get("ks", 1)
        scale = float(np.float32(op.epilogue.scale))
        xrun = plan.bk if plan.swizzled else 0  # (the packer checked every chunk is one run)
        checks = space.SPACE.static_asserts(config, problem(plan.bm, op.layout, xrun),
                                            TABLE_SOURCE)
        source = render(self.template, name=name, family=plan.family, tag=plan.tag,
                        dtype=plan.dtype, elem_t=ELEM_T[plan.dtype], m=plan.shape[0],
                        k=plan.shape[1], num_slots=plan.num_slots, group_rows=plan.group_rows,
                        bm=e["tile"], am=e["am"], wg=is_wg(config), xr=plan.xr, xu=plan.xu,
                        total_chunks=plan.total_chunks, off=plan.offsets,
                        permuted=plan.permuted, has_bias=plan.has_bias, layout=op.layout,
                        runs8=plan.runs8, act=op.act_code, scale=scale.hex() + "f",
                        smem_bytes=e["smem"], min_blocks=min_blocks(plan.bm, config, op.layout),
                        tn=tn, ks=ks, tma=is_tma(config), pc=config.get("pc", 0),
                        class_ends=cost_classes(plan, tn),
                        constraints=checks,
                        **tile)
        # split K: a cluster of ks CTAs along z per (group, tile of N);
        # persistent: pc CTAs whatever N
        if config.get("pc"):
            launch = make_launch(grid=(config["pc"],), block=(e["threads"],), n_axis=-1,
                                 shared_bytes=e["smem"])
        else:
            launch = make_launch(grid=(max(1, plan.num_slots), 1, ks), block=(e["threads"],),
                                 n_axis=1, n_tile=config["bn"] * tn, shared_bytes=e["smem"])
        return Kernel(name=name, source=source, packed=plan.packed, launch=launch,
                      config=dict(config))

    # -- benchmarks ------------------------------------------------------------
    def gather_bytes(self, matrix: SparseMatrix, params: dict, n: int,
                     config: dict) -> Optional[float]:
        """What a row-group kernel reads out of L2: each group's gathered
        rows of X once per group (nnz / group rows of them, N wide) and its
        weights once per tile of N (fp16/bf16)."""
        rows = self.grouping(matrix, params).group_rows
        return matrix.nnz / rows * n * 2 + matrix.nnz * 2 * -(-n // config["bn"])
