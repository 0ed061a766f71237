"""Whole models through sparseforge.torch, beside the dense model, each
forward captured in a CUDA graph.

The models are plain PyTorch with seeded random weights (nn.Linear's own
initialization), every Linear pruned by sparseforge (generator/prune.py)
to the pattern, tuned and converted with sparseforge.torch.sparsify, and
run in the same process as the dense model holding the same pruned
weights:

- bert: a BERT-base encoder, 12 layers, hidden 768, 12 heads, FFN 3072
  (GELU), post-LayerNorm, biases; prefill of 8 sequences x 512 tokens
  (hidden states in: no embeddings).
- llama: a Llama-style decoder stack, 4 layers, hidden 4096, 32 heads,
  FFN 11008 gated by SiLU, RMSNorm, rotary positions, no biases; prefill
  of 2048 tokens, and decode of 16 tokens: one forward of 16 new tokens
  of that sequence over its 2048-token KV cache (as a speculative
  decoder's verification step).  The cache is static, as in a decoder
  captured in a CUDA graph: buffers of 2048 + 16 positions into which the
  forward writes the new tokens' keys and values in place.

bert-fused and llama-fused: the same models with the projections that
read one input held as one Linear layer, as serving engines hold them
(BERT's query, key and value as one 768 -> 2304 layer; the Llama-style
stack's q, k and v as one 4096 -> 12288 layer, gate and up as one
4096 -> 22016 layer; the outputs split by views), dense and sparse alike;
each fused weight is pruned as one matrix.

Patterns (PATTERN[@SPARSITY]): shflbw:64@0.75, bsr:64x64@0.75, nm24 and
csr@0.5, csr@0.7.  The model computes in fp16 where the family has fp16
kernels, else in the family's own dtype; a family without
token-major kernels is reported as skipped, with the reason.

For each model, phase and pattern: the time of all Linear layers (a CUDA
graph of the model's Linear calls, in order, on inputs of their shapes)
and of the whole forward (a CUDA graph of it; with --compile also of the
forward under torch.compile(fullgraph=True), whose fused elementwise
kernels leave the Linear layers a larger share), dense and sparse (median of
--reps rounds, CUDA events, each round replaying every one of the two
models' graphs in turn, so that clock and temperature drift fall on
both alike), the speedups, the output's relative error
(Frobenius) against the dense pruned model, the tuning time
(sparsify's wall time against --db: empty, a first run; the pruning is
not in it), and how many layers run the phase's tokens on the
feature-major route (X and Y transposed around the feature-major kernel,
where sparsify found it faster than the token-major kernel).  With
--compile --kernels, the compiled forwards' kernel time split by
torch.profiler between the Linear layers' ops and everything else (where
the sparse model's transposes and its fused norms are).

    python3 bench/torch_models.py --model bert --results bench/RESULTS.md    # on a GPU
    python3 bench/torch_models.py --dry-run --model bert --layers 1

--dry-run (no GPU): builds and prunes the models, converts them (kernels
compiled untuned for --arch), runs both forwards on the CPU for a few
tokens and checks that they agree; no timing.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import math
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from tune_model import parse_pruning  # noqa: E402  (PATTERN[@SPARSITY])

PATTERNS = "shflbw:64@0.75,bsr:64x64@0.75,nm24,csr@0.5,csr@0.7"
FP16_ERROR_TARGET = 1e-2


# ---- the models ----------------------------------------------------------------------------

@dataclass
class Config:
    layers: int
    hidden: int
    heads: int
    ffn: int
    phases: dict = field(default_factory=dict)   # phase -> (batch, tokens, past tokens)
    fused: bool = False      # the projections that read one input as one Linear layer


MODELS = {
    "bert": Config(12, 768, 12, 3072, {"prefill 8x512": (8, 512, 0)}),
    "llama": Config(4, 4096, 32, 11008, {"prefill 2048": (1, 2048, 0),
                                         "decode 16": (1, 16, 2048)}),
}
MODELS.update({f"{k}-fused": replace(c, fused=True) for k, c in list(MODELS.items())})


def attention(q, k, v, heads: int, causal: bool, past=None):
    """Multi-head attention of (B, T, H) projections.  `past`: the layer's
    KV cache, (k, v) buffers of (B, P + T, H) whose first P positions hold
    the earlier tokens; the new tokens' k and v are written in place at
    [P, P + T) and every new token attends to the earlier ones and to the
    new ones up to itself (a static cache, as a decoder captured in a CUDA
    graph keeps it: nothing is concatenated or reallocated per step)."""
    b, t, h = q.shape
    split = lambda z: z.view(b, z.shape[1], heads, h // heads).transpose(1, 2)  # noqa: E731
    mask = None
    if past is not None:
        kc, vc = past
        p = kc.shape[1] - t
        kc[:, p:].copy_(k)
        vc[:, p:].copy_(v)
        k, v = kc, vc
        mask = torch.ones(t, p + t, dtype=torch.bool, device=q.device).tril(diagonal=p)
    out = F.scaled_dot_product_attention(split(q), split(k), split(v), attn_mask=mask,
                                         is_causal=causal and mask is None)
    return out.transpose(1, 2).reshape(b, t, h)


class BertLayer(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.heads, self.hidden = c.heads, c.hidden
        if c.fused:
            self.qkv = nn.Linear(c.hidden, 3 * c.hidden)
        else:
            self.query, self.key, self.value = (nn.Linear(c.hidden, c.hidden) for _ in range(3))
        self.attn_out = nn.Linear(c.hidden, c.hidden)
        self.ln1 = nn.LayerNorm(c.hidden)
        self.intermediate = nn.Linear(c.hidden, c.ffn)
        self.output = nn.Linear(c.ffn, c.hidden)
        self.ln2 = nn.LayerNorm(c.hidden)
        # the dense peer --dense-gelu-epilogue times: the GELU in cuBLASLt's
        # epilogue (torch._addmm_activation; its tanh form)
        self.lt_gelu = False

    def forward(self, x):
        if hasattr(self, "qkv"):
            q, k, v = self.qkv(x).split(self.hidden, dim=-1)
        else:
            q, k, v = self.query(x), self.key(x), self.value(x)
        a = attention(q, k, v, self.heads, causal=False)
        x = self.ln1(x + self.attn_out(a))
        if self.lt_gelu:
            i = self.intermediate
            h = torch._addmm_activation(i.bias, x.reshape(-1, x.shape[-1]), i.weight.t(),
                                        use_gelu=True).view(*x.shape[:-1], -1)
        else:
            h = F.gelu(self.intermediate(x))
        return self.ln2(x + self.output(h))


class Bert(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.layers = nn.ModuleList(BertLayer(c) for _ in range(c.layers))

    def forward(self, x, past=None):
        for layer in self.layers:
            x = layer(x)
        return x


class RMSNorm(nn.Module):
    def __init__(self, h: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.weight


def rotary(x, pos0: int, heads: int):
    """Rotary positions for (B, T, H) from position pos0."""
    b, t, h = x.shape
    d = h // heads
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = torch.arange(pos0, pos0 + t, device=x.device, dtype=torch.float32)[:, None] * inv
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    z = x.view(b, t, heads, d // 2, 2)
    r0, r1 = z[..., 0], z[..., 1]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack([r0 * cos - r1 * sin, r0 * sin + r1 * cos], dim=-1).view(b, t, h)


class LlamaLayer(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.heads, self.hidden, self.ffn = c.heads, c.hidden, c.ffn
        if c.fused:
            self.qkv_proj = nn.Linear(c.hidden, 3 * c.hidden, bias=False)
            self.gate_up_proj = nn.Linear(c.hidden, 2 * c.ffn, bias=False)
        else:
            self.q_proj, self.k_proj, self.v_proj = (
                nn.Linear(c.hidden, c.hidden, bias=False) for _ in range(3))
            self.gate_proj = nn.Linear(c.hidden, c.ffn, bias=False)
            self.up_proj = nn.Linear(c.hidden, c.ffn, bias=False)
        self.o_proj = nn.Linear(c.hidden, c.hidden, bias=False)
        self.down_proj = nn.Linear(c.ffn, c.hidden, bias=False)
        self.norm1, self.norm2 = RMSNorm(c.hidden), RMSNorm(c.hidden)

    def forward(self, x, past=None):
        p = past[0].shape[1] - x.shape[1] if past is not None else 0
        h = self.norm1(x)
        if hasattr(self, "qkv_proj"):
            q, k, v = self.qkv_proj(h).split(self.hidden, dim=-1)
        else:
            q, k, v = self.q_proj(h), self.k_proj(h), self.v_proj(h)
        q, k = rotary(q, p, self.heads), rotary(k, p, self.heads)
        x = x + self.o_proj(attention(q, k, v, self.heads, True, past))
        h = self.norm2(x)
        if hasattr(self, "gate_up_proj"):
            gate, up = self.gate_up_proj(h).split(self.ffn, dim=-1)
        else:
            gate, up = self.gate_proj(h), self.up_proj(h)
        return x + self.down_proj(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.layers = nn.ModuleList(LlamaLayer(c) for _ in range(c.layers))

    def forward(self, x, past=None):
        for i, layer in enumerate(self.layers):
            x = layer(x, past[i] if past is not None else None)
        return x


def build(name: str, c: Config, seed: int = 0) -> nn.Module:
    """The model with seeded weights (nn.Linear's initialization), fp32, CPU."""
    torch.manual_seed(seed)
    return {"bert": Bert, "llama": Llama}[name.removesuffix("-fused")](c)


def prune_model(model: nn.Module, pattern: str, sparsity, dtype: str) -> float:
    """Prunes every Linear weight in place (sparseforge's magnitude pruning,
    seeded, the layers in worker processes where they are large); returns
    the seconds it took."""
    from sparseforge.generator.prune import auto_jobs, prune_many
    t0 = time.perf_counter()
    mods = [m for m in model.modules() if type(m) is nn.Linear]
    with torch.no_grad():
        jobs = auto_jobs(sum(m.weight.numel() for m in mods), len(mods))
        pruned = prune_many((m.weight.float().numpy() for m in mods), pattern,
                            0.5 if sparsity is None else sparsity, seed=range(len(mods)),
                            dtype=dtype, jobs=jobs)
        for i, (mat, _) in enumerate(pruned):
            mods[i].weight.copy_(torch.from_numpy(mat.to_dense()))
    return time.perf_counter() - t0


def family_dtype(pattern: str) -> tuple[str, str]:
    """(the model's dtype for the pattern, why it is skipped or "")."""
    from sparseforge.generator.families import family_of
    fam, _ = family_of(pattern)
    if "tm" not in fam.layouts:
        return "", f"no token-major kernel yet (its kernels take {', '.join(fam.layouts)})"
    return ("fp16" if "fp16" in fam.dtypes else fam.dtypes[0]), ""


TORCH_DTYPE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


# ---- inputs and timing -----------------------------------------------------------------------

def inputs(c: Config, phase: tuple, dtype, device, seed: int = 1):
    """(x, past) of a phase: x (B, T, H); past: per layer the (k, v) cache
    buffers of (B, P + T, H), the first P positions holding the earlier
    tokens (the last T are written by the forward), or None."""
    b, t, p = phase
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, c.hidden, generator=g).to(device, dtype)
    past = None
    if p:
        def cache():
            z = torch.zeros(b, p + t, c.hidden, dtype=dtype, device=device)
            z[:, :p] = torch.randn(b, p, c.hidden, generator=g).to(device, dtype)
            return z
        past = [(cache(), cache()) for _ in range(c.layers)]
    return x, past


def linear_calls(model: nn.Module, x, past) -> list:
    """(module, its input) of every Linear-like call of one forward, in
    order, the inputs cloned (static buffers for a graph)."""
    calls = []
    from sparseforge.torch import SparseLinear
    mods = [m for m in model.modules() if type(m) in (nn.Linear, SparseLinear)]
    hooks = [m.register_forward_pre_hook(lambda m, a: calls.append((m, a[0].clone())))
             for m in mods]
    try:
        with torch.no_grad():
            model(x, past)
    finally:
        for h in hooks:
            h.remove()
    return calls


def capture(fn):
    """`fn` captured as a CUDA graph, after a warm-up on a side stream."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        fn()
    return g


def alternating_medians(graphs: dict, reps: int) -> dict:
    """Median ms of each graph (key -> graph): 3 warm-up replays each, then
    `reps` rounds, each replaying every graph once in turn between two
    events."""
    for g in graphs.values():
        for _ in range(3):
            g.replay()
    times: dict = {k: [] for k in graphs}
    for _ in range(reps):
        for k, g in graphs.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            times[k].append(a.elapsed_time(b))
    return {k: sorted(t)[len(t) // 2] for k, t in times.items()}


def graph_time(fn, reps: int) -> float:
    """Median ms of `fn` replayed as a CUDA graph (alternating_medians of it alone)."""
    g = capture(fn)
    ms = alternating_medians({0: g}, reps)[0]
    del g
    return ms


# the ops whose kernels are a Linear layer's: a dense layer under torch.compile is
# an mm (or addmm) of its 2-D view; a converted one is the custom op, eager or
# feature-major
LINEAR_OPS = frozenset({"aten::mm", "aten::addmm", "aten::linear", "aten::_addmm_activation",
                        "sparseforge::linear", "sparseforge::linear_act",
                        "sparseforge::linear_fm"})


MARK = "sparseforge_bench_forward"
TOP_OTHERS = 10


def kernel_split(fn, runs: int = 5) -> dict:
    """Device time of `fn`'s kernels a call (us), by torch.profiler over
    `runs` calls (after a warm-up): "linear_us", the kernels launched
    under one of LINEAR_OPS (the innermost op of a launch, or one around
    it), and "other_us", every other kernel; "others": the other kernels
    by name, (calls, us) a call of `fn`.  Kernel durations alone: the gaps
    between kernels are not in either."""
    from torch.profiler import ProfilerActivity, profile, record_function
    with torch.no_grad():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(runs):
                with record_function(MARK):
                    fn()
            torch.cuda.synchronize()
    from torch.autograd import DeviceType
    events = prof.events()
    linear = other = 0.0
    by_name: dict = {}
    # the device's events: kernels, copies and sets, not the annotations that
    # span a record_function's range on the GPU's timeline
    total = sum(e.time_range.elapsed_us() for e in events
                if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
                and e.name != MARK)
    for e in events:
        if e.device_type != DeviceType.CPU or not e.kernels:
            continue
        up, is_linear = e, False
        while up is not None and not is_linear:
            is_linear = up.name in LINEAR_OPS
            up = up.cpu_parent
        t = sum(k.duration for k in e.kernels)
        if is_linear:
            linear += t
        else:
            other += t
            for k in e.kernels:
                c, us = by_name.get(k.name, (0, 0.0))
                by_name[k.name] = (c + 1, us + k.duration)
    if total == 0:
        raise RuntimeError("the profiler saw no kernels")
    if linear + other < 0.99 * total:     # kernels the profiler tied to no op
        print(f"torch_models: {total - linear - other:.1f} of {total:.1f} us of kernels "
              "belong to no op; counted with the others", file=sys.stderr)
    return {"linear_us": linear / runs, "other_us": (total - linear) / runs,
            "others": {name: (c / runs, us / runs) for name, (c, us) in by_name.items()}}


def measure(models: dict, x, past, reps: int, compiled: dict, per_shape: bool = False,
            kernels: bool = False) -> dict:
    """Linear and forward times of each model of `models` (name -> model),
    its graphs replayed in rounds that take every model's in turn (so that
    clocks and temperature drift alike for all: medians of `reps` rounds);
    `compiled`: model -> the model under torch.compile, whose forward is
    timed too (compiled on the warm-up); `per_shape`: also each weight
    shape's Linear calls alone, in a graph ("per_shape": (out, in) ->
    (calls, ms)).  Returns name -> times."""
    graphs, keep, out = {}, [], {}
    for name, model in models.items():
        calls = linear_calls(model, x, past)
        keep.append(calls)                         # the graphs read these inputs
        out[name] = {"linears": len(calls)}
        graphs[(name, "linear_ms")] = capture(lambda calls=calls: [m(xi) for m, xi in calls])
        graphs[(name, "forward_ms")] = capture(lambda model=model: model(x, past))
        c = compiled.get(model)
        if c is not None:
            graphs[(name, "compiled_ms")] = capture(lambda c=c: c(x, past))
        if per_shape:
            groups: dict = {}
            for m, xi in calls:
                groups.setdefault((m.out_features, m.in_features), []).append((m, xi))
            out[name]["per_shape"] = {s: [len(g), math.nan] for s, g in groups.items()}
            for s, g in groups.items():
                graphs[(name, s)] = capture(lambda g=g: [m(xi) for m, xi in g])
    for (name, key), ms in alternating_medians(graphs, reps).items():
        if isinstance(key, tuple):
            out[name]["per_shape"][key][1] = ms
        else:
            out[name][key] = ms
    del graphs, keep
    for name, model in models.items():
        if per_shape:
            out[name]["per_shape"] = {s: tuple(v) for s, v in out[name]["per_shape"].items()}
        if kernels and compiled.get(model) is not None:
            out[name]["compiled_kernels"] = kernel_split(lambda c=compiled[model]: c(x, past))
    torch.cuda.empty_cache()
    return out


def relative_error(y, ref) -> float:
    return float((y.float() - ref.float()).norm() / ref.float().norm())


# ---- one model and pattern -------------------------------------------------------------------

def chosen_phases(c: Config, wanted) -> dict:
    """The model's phases whose names contain one of `wanted` (all of them
    when `wanted` is empty)."""
    return {k: v for k, v in c.phases.items() if not wanted or any(f in k for f in wanted)}


def run(args, name: str, c: Config, spec: str) -> list:
    """The rows of one model and pattern: one per phase."""
    from sparseforge.torch import sparsify
    pattern, sparsity = parse_pruning(spec)
    phases = chosen_phases(c, args.phases)
    dtype, why = family_dtype(pattern)
    if why:
        return [{"model": name, "phase": ph, "pattern": spec, "skipped": f"{pattern}: {why}"}
                for ph in phases]
    tdt = TORCH_DTYPE[dtype]
    model = build(name, c, args.seed)
    prune_s = prune_model(model, pattern, sparsity, dtype)
    dense = model.to(tdt).eval()
    sparse = copy.deepcopy(dense)
    tokens = sorted({b * t for b, t, _ in phases.values()})
    t0 = time.perf_counter()
    report = sparsify(sparse, db=args.db, pattern=pattern,
                      n=tokens,
                      budget=args.budget, quick=args.quick, archs=args.arch,
                      feature_major=not args.no_route, progress=not args.quiet,
                      approximate_gelu=getattr(args, "approximate_gelu", False),
                      **min_speedup_arg(args))
    tune_s = time.perf_counter() - t0
    print(report, file=sys.stderr)
    device = "cpu" if args.dry_run else "cuda"
    dense, sparse = dense.to(device), sparse.eval().to(device)
    rows = []
    compiled = {}
    if args.compile:      # static shapes: each phase compiles its own graph
        compiled = {m: torch.compile(m, fullgraph=True, dynamic=False) for m in (dense, sparse)}
    lt = None             # the dense peer with the GELU in cuBLASLt's epilogue, compiled
    if getattr(args, "dense_gelu_epilogue", False) and args.compile and any(
            isinstance(m, BertLayer) for m in dense.modules()):
        peer = copy.deepcopy(dense)
        for m in peer.modules():
            if isinstance(m, BertLayer):
                m.lt_gelu = True
        lt = torch.compile(peer, fullgraph=True, dynamic=False)
    for phase_name, phase in phases.items():
        if args.dry_run:      # a few tokens, the past shortened alike
            phase = (1, args.dry_tokens, min(phase[2], args.dry_tokens))
        x, past = inputs(c, phase, tdt, device)
        with torch.no_grad():
            err = relative_error(sparse(x, past), dense(x, past))
        n = phase[0] * phase[1]
        row = {"model": name, "phase": phase_name, "pattern": spec, "dtype": dtype,
               "converted": len(report.converted), "linears": len(report.layers),
               "fm_compiled": sum(r.buckets.get(n, {}).get("layout") == "fm"
                                  or "compiled" in r.buckets.get(n, {}) for r in report.converted),
               "fm_route": sum(r.buckets.get(n, {}).get("layout") == "fm"
                               for r in report.converted),
               "cublas": sum(r.buckets.get(n, {}).get("layout") == "dense"
                             for r in report.converted),
               "error": err, "tune_s": tune_s, "prune_s": prune_s}
        if compiled:
            t0 = time.perf_counter()
            with torch.no_grad():
                row["compiled_error"] = relative_error(compiled[sparse](x, past),
                                                       compiled[dense](x, past))
            row["compile_s"] = time.perf_counter() - t0
        if lt is not None:
            with torch.no_grad():
                row["lt_error"] = relative_error(lt(x, past), dense(x, past))
            if not args.dry_run:
                row["dense_lt_compiled_ms"] = graph_time(lambda: lt(x, past), args.reps)
        if not args.dry_run:
            both = measure({"dense": dense, "sparse": sparse}, x, past, args.reps, compiled,
                           args.per_shape, args.kernels)
            d, s = both["dense"], both["sparse"]
            row.update(dense_linear_ms=d["linear_ms"], sparse_linear_ms=s["linear_ms"],
                       dense_forward_ms=d["forward_ms"], sparse_forward_ms=s["forward_ms"])
            if compiled:
                row.update(dense_compiled_ms=d["compiled_ms"], sparse_compiled_ms=s["compiled_ms"])
                if args.kernels:
                    row["kernels"] = (d["compiled_kernels"], s["compiled_kernels"])
            if args.per_shape:
                row["per_shape"] = {k: (n, ms, s["per_shape"][k][1])
                                    for k, (n, ms) in d["per_shape"].items()}
        rows.append(row)
        print(row, file=sys.stderr)
    del dense, sparse
    lt = None             # noqa: F841 - its compiled graphs go with it
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


def min_speedup_arg(args) -> dict:
    """sparsify's min_speedup from --min-speedup (its default where not given)."""
    v = getattr(args, "min_speedup", None)
    if v is None:
        return {}
    return {"min_speedup": None if v.lower() == "none" else float(v)}


def _f(v, spec: str, unit: str = "") -> str:
    return format(v, spec) + unit if isinstance(v, float) and math.isfinite(v) else "-"


def table(rows: list, gpu: str, commit: str, args) -> str:
    tuning = "quick" if args.quick else "default"
    lines = [f"## PyTorch models through sparseforge.torch: {datetime.date.today()}, {gpu}, "
             f"commit {commit}", "",
             f"Every forward a CUDA graph; medians of {args.reps} rounds, each replaying "
             "the dense and the sparse model's graphs in turn.  Linear: the "
             "model's Linear calls alone, in a graph.  Error: relative (Frobenius) against "
             f"the dense pruned model.  Tuning: sparsify from {args.db_note} "
             f"({tuning} timing{', budget ' + args.budget if args.budget else ''}).  "
             "Pruning: the model's Linear weights pruned to the pattern (worker processes, "
             "a matrix each, where they are large).", "",
             "Compiled: the forward under torch.compile(fullgraph=True, dynamic=False), "
             "dense and sparse alike, then captured the same way" +
             ("; its error: the compiled sparse model against the compiled dense one."
              if args.compile else ": not run (--compile).") +
             (" An exact GELU that alone reads a sparse layer's output runs in that layer's "
              "kernels as GELU's tanh form (--approximate-gelu; sparsify's approximate_gelu)."
              if getattr(args, "approximate_gelu", False) else ""), "",
             "Feature-major route: the converted layers whose bucket for the phase's tokens "
             "runs the feature-major kernel between two transposes (sparseforge/torch/"
             "convert.py)" + (": not tried (--no-route)." if args.no_route else
                              "; with --compile, eager / under torch.compile (where the "
                              "transposes are Inductor's)." if args.compile else "."), "",
             "Converted: the Linear layers sparsify replaced; \"k on cuBLAS\": those whose "
             "bucket for the phase's tokens runs cuBLAS, its kernels having lost to it when "
             "tuned (sparsify's min_speedup" +
             (f" = {args.min_speedup}" if getattr(args, "min_speedup", None) else ", 1.0") +
             "; a layer that lost at every N stays an nn.Linear).", "",
             "| model | phase | pattern | dtype | converted | feature-major route "
             "| Linear dense ms | Linear sparse ms "
             "| Linear speedup | forward dense ms | forward sparse ms | forward speedup "
             "| compiled dense ms | compiled sparse ms | compiled speedup "
             "| error | compiled error | tuning s | pruning s |",
             "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
             "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['model']} | {r['phase']} | {r['pattern']} | | skipped: "
                         f"{r['skipped']} | | | | | | | | | | | | | | |")
            continue
        ls = r.get("dense_linear_ms", math.nan) / r.get("sparse_linear_ms", math.nan)
        fs = r.get("dense_forward_ms", math.nan) / r.get("sparse_forward_ms", math.nan)
        cs = r.get("dense_compiled_ms", math.nan) / r.get("sparse_compiled_ms", math.nan)
        lines.append(
            f"| {r['model']} | {r['phase']} | {r['pattern']} | {r['dtype']} | "
            f"{r['converted']}/{r['linears']}"
            f"{', %d on cuBLAS' % r['cublas'] if r.get('cublas') else ''} | {r['fm_route']}"
            f"{' / %d' % r.get('fm_compiled', 0) if args.compile else ''} | "
            f"{_f(r.get('dense_linear_ms'), '.3f')} | "
            f"{_f(r.get('sparse_linear_ms'), '.3f')} | {_f(ls, '.2f', 'x')} | "
            f"{_f(r.get('dense_forward_ms'), '.3f')} | {_f(r.get('sparse_forward_ms'), '.3f')} | "
            f"{_f(fs, '.2f', 'x')} | {_f(r.get('dense_compiled_ms'), '.3f')} | "
            f"{_f(r.get('sparse_compiled_ms'), '.3f')} | {_f(cs, '.2f', 'x')} | "
            f"{r['error']:.2e} | {_f(r.get('compiled_error'), '.2e')} | {r['tune_s']:.0f} | "
            f"{_f(r.get('prune_s'), '.0f')} |")
    peered = [r for r in rows if r.get("dense_lt_compiled_ms")]
    if peered:
        lines += ["", "A dense peer (--dense-gelu-epilogue): the dense model with its FFN's "
                  "GELU in cuBLASLt's epilogue (torch._addmm_activation, GELU's tanh form), "
                  "compiled and captured as above; its error against the dense model, and the "
                  "compiled sparse model's speedup over it:", "",
                  "| model | phase | pattern | compiled dense, GELU in the epilogue, ms "
                  "| its error | compiled sparse ms | compiled speedup over it |",
                  "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
        for r in peered:
            lt, sp = r["dense_lt_compiled_ms"], r.get("sparse_compiled_ms", math.nan)
            lines.append(f"| {r['model']} | {r['phase']} | {r['pattern']} | {lt:.3f} | "
                         f"{r['lt_error']:.2e} | {_f(sp, '.3f')} | {_f(lt / sp, '.2f', 'x')} |")
    shaped = [r for r in rows if r.get("per_shape")]
    if shaped:
        lines += ["", "Each weight shape's Linear calls alone, in a graph (--per-shape):", "",
                  "| model | phase | pattern | out x in | calls | dense ms | sparse ms | speedup |",
                  "| --- | --- | --- | --- | ---: | ---: | ---: | ---: |"]
        for r in shaped:
            for (o, i), (n, d, s) in r["per_shape"].items():
                lines.append(f"| {r['model']} | {r['phase']} | {r['pattern']} | {o} x {i} | {n} "
                             f"| {d:.3f} | {s:.3f} | {d / s:.2f}x |")
    profiled = [r for r in rows if r.get("kernels")]
    if profiled:
        lines += ["", "The compiled forward's kernels (--kernels; torch.profiler over 5 "
                  "forwards, not in a graph, us a forward): Linear, the kernels launched "
                  "by a Linear layer's op (an mm of the dense model, the custom op of the "
                  "sparse one, with the activation where the op holds it: "
                  "sparseforge::linear_act); other, every other kernel, where the sparse model's "
                  "transposes are (fused into the ops around the layers, or kernels of "
                  "their own). Kernel durations only: the gaps between kernels, which the "
                  "graph times above include, are in neither; a kernel launched as a "
                  "programmatic dependent (sparseforge's, on sm_90) starts before the kernel "
                  "before it ends, and its duration counts that overlap.", "",
                  "| model | phase | pattern | Linear dense us | Linear sparse us "
                  "| Linear speedup | other dense us | other sparse us | all dense us "
                  "| all sparse us | all speedup |",
                  "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in profiled:
            d, s = r["kernels"]
            ad, as_ = d["linear_us"] + d["other_us"], s["linear_us"] + s["other_us"]
            lines.append(f"| {r['model']} | {r['phase']} | {r['pattern']} | "
                         f"{d['linear_us']:.1f} | {s['linear_us']:.1f} | "
                         f"{_f(d['linear_us'] / s['linear_us'] if s['linear_us'] else math.nan, '.2f', 'x')} | "
                         f"{d['other_us']:.1f} | {s['other_us']:.1f} | {ad:.1f} | {as_:.1f} | "
                         f"{ad / as_:.2f}x |")
        lines += ["", f"The other kernels of each compiled forward, the {TOP_OTHERS} longest "
                  "(us a forward, names cut at 70 characters):", "",
                  "| model | phase | pattern | model's | kernel | calls | us |",
                  "| --- | --- | --- | --- | --- | ---: | ---: |"]
        for r in profiled:
            for which, k in zip(("dense", "sparse"), r["kernels"]):
                top = sorted(k.get("others", {}).items(), key=lambda kv: -kv[1][1])[:TOP_OTHERS]
                for name, (calls, us) in top:
                    lines.append(f"| {r['model']} | {r['phase']} | {r['pattern']} | {which} | "
                                 f"`{name[:70].replace('|', '/')}` | {calls:g} | {us:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="bert,llama",
                    help="comma-separated: bert, llama, bert-fused, llama-fused (the fused "
                         "projections' layout)")
    ap.add_argument("--patterns", default=PATTERNS, help="comma-separated PATTERN[@SPARSITY]")
    ap.add_argument("--layers", type=int, help="transformer layers (default: the model's)")
    ap.add_argument("--db", default="/tmp/sparseforge-torch-bench.db",
                    help="the database sparsify tunes into (an empty one: a first run)")
    ap.add_argument("--budget", help="the tuner's --budget (default: its own)")
    ap.add_argument("--quick", action="store_true", help="the tuner's shorter timing protocol")
    ap.add_argument("--reps", type=int, default=50, help="timed graph replays")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--results", help="append the table to this markdown file")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    ap.add_argument("--no-route", action="store_true",
                    help="keep every bucket token-major: no feature-major route is tuned or "
                         "timed (sparsify(..., feature_major=False))")
    ap.add_argument("--min-speedup", default=None,
                    help="sparsify's min_speedup: a bucket whose kernels ran below this "
                         "speedup over cuBLAS when tuned runs cuBLAS, and a layer where that "
                         "is every bucket stays dense (default: sparsify's, 1.0; 'none': the "
                         "sparse kernels everywhere)")
    ap.add_argument("--phases", type=lambda v: [p.strip() for p in v.split(",") if p.strip()],
                    help="only the phases whose names contain one of these (comma-separated: "
                         "prefill, decode); tuning covers their tokens alone")
    ap.add_argument("--compile", action="store_true",
                    help="also time both forwards under torch.compile(fullgraph=True) (the "
                         "sparse one through the custom op), captured like the others")
    ap.add_argument("--approximate-gelu", action="store_true",
                    help="sparsify(..., approximate_gelu=True): under --compile, an exact GELU "
                         "that alone reads a sparse layer's output runs in its kernels as "
                         "GELU's tanh form")
    ap.add_argument("--dense-gelu-epilogue", action="store_true",
                    help="with --compile, also time a dense peer whose FFN GELU is in "
                         "cuBLASLt's epilogue (torch._addmm_activation; BERT)")
    ap.add_argument("--kernels", action="store_true",
                    help="with --compile: also split the compiled forwards' kernel time "
                         "between the Linear layers and the rest (torch.profiler)")
    ap.add_argument("--per-shape", action="store_true",
                    help="also time each weight shape's Linear calls alone, in a graph")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: build, prune, convert (kernels compiled untuned), CPU forwards")
    ap.add_argument("--dry-tokens", type=int, default=8, help="--dry-run: tokens per forward")
    ap.add_argument("--arch", default=None,
                    help="--dry-run: the architectures compiled for (default sm_80,sm_90a)")
    args = ap.parse_args(argv)
    if args.dry_run and args.compile:
        ap.error("--compile times the compiled forwards on a GPU; --dry-run has none")
    if args.kernels and not args.compile:
        ap.error("--kernels profiles the compiled forwards: it needs --compile")
    if args.dry_run:
        args.budget = args.budget or "1"
    else:
        from sparseforge import native
        ok, why = native.gpu_available()
        if not ok or not torch.cuda.is_available():
            print(f"torch_models: no GPU ({why if not ok else 'torch sees none'}); --dry-run "
                  "runs everything but the timing without one", file=sys.stderr)
            return 1
    args.db_note = "an empty database" if not Path(args.db).exists() else f"the database {args.db}"
    rows = []
    for name in [m.strip() for m in args.model.split(",") if m.strip()]:
        if name not in MODELS:
            ap.error(f"unknown model {name!r}; expected {', '.join(MODELS)}")
        c = copy.deepcopy(MODELS[name])
        if not chosen_phases(c, args.phases):
            ap.error(f"--phases {','.join(args.phases)}: {name} has none of them "
                     f"(its phases: {', '.join(c.phases)})")
        if args.layers:
            c.layers = args.layers
        for spec in [p.strip() for p in args.patterns.split(",") if p.strip()]:
            rows += run(args, name, c, spec)
    for r in rows:
        for key in ("error", "compiled_error"):
            if key in r and r.get("dtype") == "fp16" and r[key] > FP16_ERROR_TARGET:
                print(f"torch_models: {r['model']} {r['phase']} {r['pattern']}: "
                      f"{key.replace('_', ' ')} {r[key]:.2e} over {FP16_ERROR_TARGET:g}",
                      file=sys.stderr)
    if args.dry_run:
        print(table(rows, "none (dry run: no timing)", "-", args))
        return 0
    from s1 import commit_id, publish
    publish(table(rows, torch.cuda.get_device_name(), commit_id(), args), args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
