"""The torch.compile graph pass of sparseforge.torch (_passes.py), without a
GPU: each feature-major layer whose input comes from a norm gets it from
one sparseforge::transpose shared by the layers that read it; an input
from a pointwise op, or a graph without the op, is left alone; the result
is unchanged; install() fills an empty slot only, combine() runs both
passes.  The ops get CPU implementations here, for these tests alone (a
matrix product standing for each layer's kernel).  Skipped where torch is
missing (scripts/test.sh installs it)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install .[torch])")
from torch import nn  # noqa: E402

from sparseforge.torch import _passes  # noqa: E402

K, N = 64, 16
WEIGHTS = {}            # layer key -> its weight, for the CPU stand-ins of the kernels


@pytest.fixture
def cpu_ops():
    """CPU implementations of linear_fm and transpose, removed afterwards;
    the transposes they run, counted."""
    from sparseforge.torch import _op
    calls = {"transpose": 0, "linear_fm": 0}

    def linear_fm(xt, packed, layer, out_features):
        calls["linear_fm"] += 1
        return WEIGHTS[layer].to(xt.dtype) @ xt

    def transpose(x, layer):
        calls["transpose"] += 1
        return x.t().contiguous()

    def rms_norm_t(x, yt, w, eps, round_first, layer):
        calls["rms_norm_t"] = calls.get("rms_norm_t", 0) + 1
        return _op.rms_norm_t_reference(x, yt, w, eps, round_first)

    lib = torch.library.Library("sparseforge", "IMPL")
    lib.impl("linear_fm", linear_fm, "CPU")
    lib.impl("transpose", transpose, "CPU")
    lib.impl("rms_norm_t", rms_norm_t, "CPU")
    yield calls
    lib._destroy()


class Layers(nn.Module):
    """x -> (a norm or a GELU) -> three feature-major layers reading it ->
    their sum; layer keys 1 to 3."""

    def __init__(self, norm: bool, norm_after: bool = False):
        super().__init__()
        self.norm, self.norm_after = norm, norm_after
        torch.manual_seed(0)
        for key in (1, 2, 3):
            WEIGHTS[key] = torch.randn(32, K)
        self.w = nn.Parameter(torch.rand(K) + 0.5)

    def forward(self, x):
        if self.norm:
            v = x.float()
            h = (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w).to(x.dtype)
        else:
            h = torch.nn.functional.gelu(x)
        out = 0
        for key in (1, 2, 3):
            xt = h.reshape(-1, K).t().contiguous()
            yt = torch.ops.sparseforge.linear_fm(xt, [torch.zeros(4, dtype=torch.uint8)], key, 32)
            out = out + yt.t().contiguous().reshape(*h.shape[:-1], 32)
        if self.norm_after:       # a reduction reads the layers' outputs
            out = out * torch.rsqrt(out.float().pow(2).mean(-1, keepdim=True) + 1e-6)
        return out


def run_pass(model, x, graph_pass):
    """model(x) compiled through AOT autograd with Inductor's
    decompositions (the post-grad graph's ops), `graph_pass(graph)`
    applied to the graph; returns (the result, the pass's answer, the
    graph)."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._inductor.decomposition import select_decomp_table

    got = {}

    def compiler(gm, example_inputs):
        got["answer"] = graph_pass(gm.graph)
        gm.recompile()
        got["graph"] = gm.graph
        return gm

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=compiler,
                                     decompositions=select_decomp_table())

    torch._dynamo.reset()
    with torch.no_grad():
        y = torch.compile(model, backend=backend, fullgraph=True, dynamic=False)(x)
    return y, got["answer"], got["graph"]


def run_rewritten(model, x):
    """run_pass with rewrite: (the result, rewrite's count, the graph)."""
    return run_pass(model, x, _passes.rewrite)


def _packet_of_input(node) -> str:
    return _passes._packet(node.args[0])


def targets(graph, name: str) -> list:
    return [n for n in graph.nodes if n.op == "call_function" and _passes._packet(n) == name]


def test_a_norms_readers_share_one_transpose(cpu_ops):
    model = Layers(norm=True)
    x = torch.randn(2, N // 2, K)
    with torch.no_grad():
        want = model(x)
    cpu_ops.update(transpose=0, linear_fm=0)
    y, moved, graph = run_rewritten(model, x)      # traced on fake tensors, run once
    assert moved == 3
    (t,) = targets(graph, "transpose")                 # one, for the three layers
    fms = targets(graph, "linear_fm")
    assert len(fms) == 3 and all(f.args[0] is t for f in fms)
    assert t.args[1] == 1 and _passes.reduction_fed(t.args[0])
    assert not any(_packet_of_input(f) == "clone" for f in fms)
    assert cpu_ops == {"transpose": 1, "linear_fm": 3}
    torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-4)


def test_outputs_a_reduction_reads_come_from_the_transpose_op(cpu_ops):
    model = Layers(norm=False, norm_after=True)
    x = torch.randn(N, K)
    with torch.no_grad():
        want = model(x)
    cpu_ops.update(transpose=0, linear_fm=0)
    y, moved, graph = run_rewritten(model, x)
    assert moved == 3                                   # the three Y, not the GELU's X
    ts = targets(graph, "transpose")
    fms = targets(graph, "linear_fm")
    assert sorted(t.args[0].name for t in ts) == sorted(f.name for f in fms)
    assert all(_packet_of_input(f) == "clone" for f in fms)   # X^T: Inductor's
    assert cpu_ops == {"transpose": 3, "linear_fm": 3}
    torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-4)


def test_a_pointwise_producer_keeps_inductors_transpose(cpu_ops):
    model = Layers(norm=False)
    x = torch.randn(N, K)
    with torch.no_grad():
        want = model(x)
    y, moved, graph = run_rewritten(model, x)
    assert moved == 0 and not targets(graph, "transpose")
    assert cpu_ops["transpose"] == 0
    torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-4)


def test_a_graph_without_the_op_is_untouched():
    g = torch.fx.Graph()
    a = g.placeholder("a")
    m = g.call_function(torch.ops.aten.mean.dim, (a, [-1], True))
    p = g.call_function(torch.ops.aten.permute.default, (m, [1, 0]))
    c = g.call_function(torch.ops.aten.clone.default, (p,))
    g.output(c)
    before = str(g)
    assert _passes.rewrite(g) == 0 and str(g) == before


def test_reduction_fed_looks_through_pointwise_ops_and_views_only():
    g = torch.fx.Graph()
    a = g.placeholder("a")
    mean = g.call_function(torch.ops.aten.mean.dim, (a, [-1], True))
    r = g.call_function(torch.ops.aten.rsqrt.default, (mean,))
    mul = g.call_function(torch.ops.aten.mul.Tensor, (a, r))
    view = g.call_function(torch.ops.aten.view.default, (mul, [N, K]))
    mm = g.call_function(torch.ops.aten.mm.default, (view, a))       # not pointwise
    gelu = g.call_function(torch.ops.aten.gelu.default, (mm,))
    assert _passes.reduction_fed(view) and _passes.reduction_fed(mul)
    assert not _passes.reduction_fed(gelu)        # the walk stops at the matrix product
    assert not _passes.reduction_fed(a)


def test_install_fills_an_empty_slot_only_and_combine_runs_both():
    from torch._inductor import config
    with config.patch(post_grad_custom_post_pass=None):
        assert _passes.install() and config.post_grad_custom_post_pass is _passes.the_pass()
        assert _passes.install() and config.post_grad_custom_post_pass is _passes.the_pass()

    ran = []

    class Other(_passes._base()):
        def __call__(self, graph):
            ran.append("other")

        def uuid(self):
            return b"other"

    other = Other()
    with config.patch(post_grad_custom_post_pass=other):
        assert not _passes.install() and config.post_grad_custom_post_pass is other
    both = _passes.combine(other)
    with config.patch(post_grad_custom_post_pass=both):
        assert _passes.installed()
    both(torch.fx.Graph())
    assert ran == ["other"] and both.uuid() not in (None, other.uuid(), _passes.the_pass().uuid())


def test_importing_sparseforge_torch_leaves_inductor_alone():
    """Importing the module neither imports Inductor (a second or more)
    nor sets its pass: loading a layer with a feature-major kernel on a GPU
    does (_op.load; tests/py/test_torch_gpu.py)."""
    import subprocess
    import sys
    code = ("import sys, sparseforge.torch; from sparseforge.torch import _passes; "
            "assert 'torch._inductor' not in sys.modules, 'Inductor imported'; "
            "assert _passes.install() and _passes.installed()")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("dynamic", [False, True])
def test_inductor_runs_the_pass_and_lowers_the_transpose(cpu_ops, dynamic):
    """torch.compile's default backend with the pass installed (Inductor on
    the CPU), static shapes or dynamic: one transpose of X for the three
    layers, one of each Y (a norm reads their sum), the result unchanged,
    for each token count."""
    from torch._inductor import config
    model = Layers(norm=True, norm_after=True)
    with torch.no_grad(), config.patch(post_grad_custom_post_pass=_passes.the_pass()):
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, dynamic=dynamic)
        for n in ((N, 24, 5) if dynamic else (N,)):
            x = torch.randn(2, n, K)
            want = model(x)
            cpu_ops.update(transpose=0, linear_fm=0)
            y = compiled(x)
            assert cpu_ops == {"transpose": 4, "linear_fm": 3}, n   # X^T once, each Y once
            torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-4)


def test_reductions_by_name_where_ops_carry_no_reduction_tag(monkeypatch):
    """(torch versions whose ops have no `reduction` tag)"""
    g = torch.fx.Graph()
    a = g.placeholder("a")
    mean = g.call_function(torch.ops.aten.mean.dim, (a, [-1], True))
    mul = g.call_function(torch.ops.aten.mul.Tensor, (a, mean))
    monkeypatch.setattr(_passes, "_REDUCTION_TAG", None)
    assert _passes.reduction_fed(mul) and _passes.reduction_read(a)
    assert not _passes.reduction_read(mul)


# ---- RMSNorm and X^T in one op ------------------------------------------------------------

class RMSNorm(nn.Module):
    """A 16-bit model's RMSNorm, either way it is commonly written."""

    def __init__(self, round_first: bool, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(K) + 0.5)
        self.round_first, self.eps = round_first, eps

    def forward(self, x):
        xf = x.float()
        r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.round_first:
            return (xf * r).to(x.dtype) * self.weight
        return (xf * r * self.weight.float()).to(x.dtype)


class Decoder(nn.Module):
    """x -> norm1 -> two feature-major layers (keys 1, 2) -> residual sum
    with layer 1 -> norm2 -> layer 3 -> residual; `extra`: norm1's output
    also read by a pointwise op."""

    def __init__(self, round_first: bool, extra: bool = False):
        super().__init__()
        torch.manual_seed(1)
        for key in (1, 2, 3):
            WEIGHTS[key] = torch.randn(K, K) / 8
        self.n1, self.n2 = RMSNorm(round_first, 1e-6), RMSNorm(round_first, 1e-5)
        self.extra = extra

    @staticmethod
    def fm(h, key):
        xt = h.reshape(-1, K).t().contiguous()
        yt = torch.ops.sparseforge.linear_fm(xt, [torch.zeros(4, dtype=torch.uint8)], key, K)
        return yt.t().contiguous().reshape(h.shape)

    def forward(self, x):
        h = self.n1(x)
        x = x + self.fm(h, 1)
        g = self.fm(h, 2)
        if self.extra:
            g = g + torch.tanh(h)
        x = x + self.fm(self.n2(x), 3)
        return x + g


@pytest.fixture
def norm_device(monkeypatch):
    """rms_norm_t's device test passed on the CPU (its kernel needs sm_90)."""
    monkeypatch.setattr(_passes, "_device_ok",
                        lambda x, w: x.dtype in (torch.float16, torch.bfloat16) and
                        w.dtype == x.dtype)


@pytest.mark.parametrize("round_first", [True, False])
def test_rms_norms_and_their_transposes_become_one_op(cpu_ops, norm_device, round_first):
    """Each RMSNorm read only by feature-major layers becomes rms_norm_t
    (its eps and rounding kept); the second, whose x is the residual sum
    with layer 1's Y, takes that Y^T and returns the sum for the later
    residual; no transpose is left; the result is unchanged."""
    model = Decoder(round_first).half()
    x = torch.randn(2, N // 2, K).half()
    with torch.no_grad():
        want = model(x)
    cpu_ops.update(transpose=0, linear_fm=0)
    y, moved, graph = run_rewritten(model, x)
    norms = targets(graph, "rms_norm_t")
    assert len(norms) == 2 and not targets(graph, "transpose")
    assert [n.args[3] for n in norms] == [1e-6, 1e-5]
    assert all(n.args[4] is round_first for n in norms)
    assert norms[0].args[1] is None
    assert _passes._packet(norms[1].args[1]) == "linear_fm" and norms[1].args[1].args[2] == 1
    assert cpu_ops == {"transpose": 0, "linear_fm": 3, "rms_norm_t": 2}
    torch.testing.assert_close(y, want, rtol=0, atol=0)


def test_a_norm_read_elsewhere_or_in_32_bits_keeps_the_transpose(cpu_ops, norm_device):
    """norm1's output read by a pointwise op too, or x in fp32: no fusion
    there (the transpose of the pass as before)."""
    model = Decoder(True, extra=True).half()
    x = torch.randn(N, K).half()
    with torch.no_grad():
        want = model(x)
    y, moved, graph = run_rewritten(model, x)
    norms = targets(graph, "rms_norm_t")
    assert len(norms) == 1 and norms[0].args[1] is not None     # norm2 only
    assert len(targets(graph, "transpose")) == 1                  # norm1's X^T
    torch.testing.assert_close(y, want, rtol=0, atol=0)
    y, moved, graph = run_rewritten(Decoder(True).float(), torch.randn(N, K))
    assert not targets(graph, "rms_norm_t") and targets(graph, "transpose")


def test_without_an_sm90_gpu_norms_stay_unfused(cpu_ops):
    """On a device rms_norm_t's kernel cannot run (here the CPU), the pass
    leaves the norms to Inductor and their X^T to the transpose op."""
    y, moved, graph = run_rewritten(Decoder(True).half(), torch.randn(N, K).half())
    assert not targets(graph, "rms_norm_t") and len(targets(graph, "transpose")) == 3


def out_node(fn, w_dtype=torch.float16):
    """The node of fn(x, w)'s result (x fp16 4 x K, w (K,)) in its graph
    with Inductor's decompositions."""
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx
    gm = make_fx(fn, decomposition_table=select_decomp_table())(
        torch.randn(4, K, dtype=torch.float16), torch.rand(K, dtype=w_dtype))
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    return out[0] if isinstance(out, (tuple, list)) else out


def test_match_rms_norm_takes_rms_norms_only():
    """The RMSNorm as written here and as Hugging Face's LlamaRMSNorm
    writes it are matched; a LayerNorm-like mean-centred norm, or a norm
    without a weight, is not."""

    def rms(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w

    def centred(x, w):
        xf = x.float() - x.float().mean(-1, keepdim=True)
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w

    def no_weight(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * 2

    def hf(x, w):              # Hugging Face's LlamaRMSNorm
        hs = x.to(torch.float32)
        hs = hs * torch.rsqrt(hs.pow(2).mean(-1, keepdim=True) + 1e-6)
        return w * hs.to(x.dtype)

    for fn in (rms, hf):
        m = _passes.match_rms_norm(out_node(fn))
        assert m is not None and m["round_first"] and m["eps"] == 1e-6, fn
        assert m["x"].op == "placeholder" and m["w"].op == "placeholder"
    assert _passes.match_rms_norm(out_node(centred)) is None
    assert _passes.match_rms_norm(out_node(no_weight)) is None


def test_inductor_lowers_the_fused_norm(cpu_ops, norm_device):
    """torch.compile's default backend with the pass (Inductor on the
    CPU): the two norms run as rms_norm_t, nothing else transposes, the
    result within fp16 rounding of eager (Inductor keeps the residual sum
    in fp32 where eager rounds it)."""
    from torch._inductor import config
    model = Decoder(True).half()
    with torch.no_grad(), config.patch(post_grad_custom_post_pass=_passes.the_pass()):
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, dynamic=False)
        x = torch.randn(N, K).half()
        want = model(x)
        cpu_ops.update(transpose=0, linear_fm=0)
        y = compiled(x)
    assert cpu_ops == {"transpose": 0, "linear_fm": 3, "rms_norm_t": 2}
    torch.testing.assert_close(y.float(), want.float(), rtol=1e-2, atol=1e-2)


@pytest.mark.skipif(not hasattr(torch.nn, "RMSNorm"), reason="this torch has no nn.RMSNorm")
def test_torchs_own_rms_norm_fuses_too(cpu_ops, norm_device):
    """torch.nn.RMSNorm in a 16-bit model (its weight promoted, not cast):
    one rms_norm_t, the result unchanged."""
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            WEIGHTS[1] = torch.randn(K, K) / 8
            self.norm = nn.RMSNorm(K, eps=1e-6)

        def forward(self, x):
            return Decoder.fm(self.norm(x), 1)

    model = Model().half()
    x = torch.randn(N, K).half()
    with torch.no_grad():
        want = model(x)
    y, moved, graph = run_rewritten(model, x)
    (norm,) = targets(graph, "rms_norm_t")
    assert norm.args[4] is False and not targets(graph, "transpose")
    torch.testing.assert_close(y, want, rtol=0, atol=0)


def test_a_mean_over_every_dim_is_not_an_rms_norm():
    """mean(x ** 2) over all of x (dim None) is not a norm a token: not
    matched, and nothing raises."""
    def whole(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(None, keepdim=True) + 1e-6)).to(x.dtype) * w

    assert _passes.match_rms_norm(out_node(whole)) is None


def test_a_norm_cast_to_another_dtype_is_not_matched():
    """fp16 x normalized and cast to bf16: the op rounds to x's dtype, so
    it is not matched."""
    def other(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16) * w

    assert _passes.match_rms_norm(out_node(other, torch.bfloat16)) is None


# ---- an activation in the layer's epilogue (fuse_activations) --------------------------

ACT_KEY = 7


@pytest.fixture
def act_ops():
    """CPU stand-ins of linear and linear_act (the activation applied as
    the kernels do: GELU's tanh form), removed afterwards; the calls,
    counted by op and activation."""
    calls = []

    def linear(x, packed, layer, out_features):
        calls.append(("linear",))
        return x @ WEIGHTS[layer].to(x.dtype).t()

    def linear_act(x, packed, layer, out_features, act):
        calls.append(("linear_act", act))
        y = x @ WEIGHTS[layer].to(x.dtype).t()
        return torch.relu(y) if act == "relu" else torch.nn.functional.gelu(y, approximate="tanh")

    lib = torch.library.Library("sparseforge", "IMPL")
    lib.impl("linear", linear, "CPU")
    lib.impl("linear_act", linear_act, "CPU")
    yield calls
    lib._destroy()


class ActModel(nn.Module):
    """linear (key ACT_KEY) -> [a view] -> an activation [-> + the layer's
    output: a second reader]."""

    def __init__(self, act: str, approximate: str = "tanh", view: bool = False,
                 shared: bool = False):
        super().__init__()
        self.act, self.approximate, self.view, self.shared = act, approximate, view, shared
        torch.manual_seed(1)
        WEIGHTS[ACT_KEY] = torch.randn(32, K)

    def forward(self, x):
        y = torch.ops.sparseforge.linear(x, [torch.zeros(4, dtype=torch.uint8)], ACT_KEY, 32)
        v = y.reshape(-1, 32) if self.view else y
        if self.act == "gelu":
            z = torch.nn.functional.gelu(v, approximate=self.approximate)
        elif self.act == "relu":
            z = torch.relu(v)
        else:
            z = torch.sigmoid(v)
        return z + v if self.shared else z


def run_fused(model, x, allow=True):
    """run_pass with fuse_activations, its fuse callback recording what it
    was asked and answering `allow`; (result, fused count, the asks,
    graph)."""
    asked = []

    def fuse(key, act):
        asked.append((key, act))
        return allow

    y, fused, graph = run_pass(model, x, lambda g: _passes.fuse_activations(g, fuse=fuse))
    return y, fused, asked, graph


@pytest.mark.parametrize("act, approximate, view, dtype", [
    ("gelu", "tanh", False, torch.float32), ("gelu", "tanh", True, torch.float16),
    ("gelu", "none", False, torch.float16), ("gelu", "none", True, torch.bfloat16),
    ("relu", "none", True, torch.float32)])
def test_an_activation_reading_a_layer_alone_joins_its_kernels(act_ops, act, approximate, view,
                                                               dtype):
    """Found in the post-grad graph, where Inductor's decompositions have
    taken GELU apart (with casts around it in 16-bit models)."""
    model = ActModel(act, approximate, view)
    x = torch.randn(2, N // 2, K).to(dtype)
    with torch.no_grad():
        want = model(x)
    act_ops.clear()
    y, fused, asked, graph = run_fused(model, x)
    word = "gelu_erf" if (act, approximate) == ("gelu", "none") else act
    assert fused == 1 and asked == [(ACT_KEY, word)]
    (node,) = targets(graph, "linear_act")
    assert node.args[2] == ACT_KEY and node.args[4] == word
    assert not targets(graph, "linear") and not targets(graph, "tanh") and \
        not targets(graph, "erf") and not targets(graph, "relu")
    assert act_ops == [("linear_act", word)]
    # the stand-in computes GELU's tanh form: an erf GELU differs by at most 4.7e-4
    tol = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}[dtype]
    torch.testing.assert_close(y.reshape(want.shape).float(), want.float(), rtol=tol,
                               atol=tol if approximate == "tanh" else tol + 5e-4)


def test_a_refused_or_shared_or_other_activation_stays_unfused(act_ops):
    x = torch.randn(N, K)
    for model, allow, asks in ((ActModel("gelu", "none"), False, 1),   # the layer said no
                               (ActModel("gelu", shared=True), True, 0),  # two readers
                               (ActModel("sigmoid"), True, 0)):          # not in the kernels
        with torch.no_grad():
            want = model(x)
        act_ops.clear()
        y, fused, asked, graph = run_fused(model, x, allow)
        assert fused == 0 and len(asked) == asks and not targets(graph, "linear_act")
        assert act_ops == [("linear",)]
        torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-4)


def test_fusable_follows_the_module_and_its_release():
    """_op's registry: a layer's fuser is held weakly; GELU's tanh form and
    ReLU are fusable, erf only where the module allows it; nothing once
    the layer is released or its module gone."""
    from sparseforge.torch import _op

    class Module:
        approximate_gelu = False

        def _where(self):
            return "SparseLinear 'w'"

    assert _op.fused_act("gelu", "tanh") == "gelu" and _op.fused_act("gelu") == "gelu_erf"
    assert _op.fused_act("relu") == "relu" and _op.fused_act("silu") is None
    m = Module()
    _op.register_fuser(991, m)
    assert _op.fusable(991, "gelu") and _op.fusable(991, "relu")
    assert not _op.fusable(991, "gelu_erf") and not _op.fusable(991, "silu")
    with pytest.raises(RuntimeError, match="does not allow an exact GELU"):
        _op.fused_layer(991, "gelu_erf")      # a cached graph that fused one: refused
    m.approximate_gelu = True
    assert _op.fusable(991, "gelu_erf")
    _op.release(991)
    assert not _op.fusable(991, "gelu")
    _op.register_fuser(992, Module())           # its module is gone at once
    assert not _op.fusable(992, "relu")
    with pytest.raises(RuntimeError, match="not loaded or cannot be rebuilt"):
        _op.fused_layer(992, "relu")
    _op.release(992)


def test_inductor_lowers_the_fused_op(act_ops):
    """The pass as Inductor's post-grad pass, on the CPU: Inductor lowers
    the op it puts in (its arguments as the graph's metadata gives them)
    and the compiled model computes the layer and its GELU."""
    from torch._inductor import config

    class Fusing(_passes._base()):
        def __call__(self, graph):
            _passes.fuse_activations(graph, fuse=lambda key, act: True)

        def uuid(self):
            return None              # no FX graph cache: the pass runs every time

    model = ActModel("gelu", "tanh")
    x = torch.randn(N, K)
    with torch.no_grad():
        want = model(x)
    act_ops.clear()
    torch._dynamo.reset()
    with config.patch(post_grad_custom_post_pass=Fusing()), torch.no_grad():
        y = torch.compile(model, fullgraph=True, dynamic=False)(x)
    assert act_ops == [("linear_act", "gelu")]
    torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-4)
