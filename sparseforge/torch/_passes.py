"""A graph pass for torch.compile (Inductor's post-grad custom pass): where
a feature-major layer's X^T would be written by a reduction, or its Y
read inside one, the transpose is the op sparseforge::transpose instead,
one for all the layers that read the same x.

Under torch.compile a bucket with a feature-major kernel runs
`linear_fm(x^T)` (_op.py), and SparseLinear.forward leaves the transpose
`x.t().contiguous()` in the graph for Inductor to fuse into the op that
produces x.  That is free after a pointwise op (Inductor tiles the store)
but not after a norm: the reduction's kernel runs a row of x (a token) a
program and stores its X^T column by column, each 2-byte element its own
sector (an H100, torch 2.11, 16 x 4096 tokens by features: the RMSNorm
writing X^T 5.4 to 21 us from one compile to the next, against 1.7 us
writing x, bench/RESULTS.md 2026-11-27; the transpose kernel 1.6 us).

The pass finds each `linear_fm` whose input is `clone(permute(v, [1, 0]))`
where v is computed from a reduction through pointwise ops and views (a
norm), and gives it `transpose(v)`: Inductor then stores v as the norm
writes it, and templates/transpose.cu turns it in 64 x 64 tiles.  The
layers that read one v (q, k and v; gate and up) share one transpose (a
custom op is not merged by torch.compile's common subexpressions, so the
pass does it).  Other inputs stay with Inductor.  Likewise on the output
side: where a reduction reads the layer's Y through pointwise ops (the
residual sum a norm reads: Inductor would read Y^T across its columns
inside the reduction, and splits it in three kernels), Y comes from
`transpose(Y^T)`.

Where the norm is an RMSNorm (match_rms_norm: as 16-bit models write
it) whose output only those layers read, on an sm_90 GPU, the norm and
its transpose become one op, `sparseforge::rms_norm_t` (fuse_norms),
which writes X^T from the norm's own kernel; where the norm's input is
the residual sum with a layer's Y that the pass's Y side transposed, the
op takes that Y^T and returns the sum too (for the residual after it).
One kernel then stands for three (the Y transpose, the sum and norm, the
X transpose).

Activations (fuse_activations): where a token-major layer's output
(`sparseforge::linear`, through views) is read by a GELU or ReLU alone,
the two become `sparseforge::linear_act`, the layer with the activation
in its kernels' epilogue (built here, _op.fused_layer).  Inductor would
run the activation as a kernel of its own that reads and writes the
whole output (BERT-base's FFN, 4096 x 3072 fp16: 23 us on an H100,
against 2 us more in the fused epilogue; bench/RESULTS.md 2026-11-27).
The kernels compute the tanh form of GELU: a GELU with
approximate="tanh" is fused, an exact (erf) one only where the layer's
module allows it (SparseLinear.approximate_gelu; sparsify's argument of
that name): the two differ by at most 4.7e-4.

`install()` puts the pass in torch._inductor.config.post_grad_custom_post_pass
where that slot is empty: _op.load does it when it loads a layer on a GPU
(importing Inductor takes a second or more, which a model that never
loads one need not pay); a slot holding another pass is left alone, and
`combine(pass)` gives one that runs both.  The pass only rewrites graphs
that call sparseforge's ops.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Optional

import torch

_MAX_WALK = 64     # nodes visited looking up from v for a reduction
_RESHAPES = ("view", "reshape", "_unsafe_view")   # a tensor's elements in another shape

_VIEWS = {"view", "reshape", "_unsafe_view", "unsqueeze", "squeeze", "expand", "permute",
          "slice", "select", "alias"}
# reductions by name where this torch's ops carry no `reduction` tag
_REDUCTIONS = {"mean", "sum", "var_mean", "var", "std", "amax", "amin", "prod", "max", "min",
               "logsumexp", "norm", "linalg_vector_norm"}
_REDUCTION_TAG = getattr(torch.Tag, "reduction", None)


def _packet(node) -> str:
    target = node.target
    return getattr(getattr(target, "overloadpacket", None), "__name__", "") or ""


def _tags(node) -> tuple:
    return tuple(getattr(node.target, "tags", ()) or ())


def _is_reduction(node) -> bool:
    if _REDUCTION_TAG is not None:
        return _REDUCTION_TAG in _tags(node)
    return _packet(node) in _REDUCTIONS


def _reaches_reduction(node, up: bool, limit: int) -> bool:
    seen, todo = set(), list(node.all_input_nodes if up else node.users)
    while todo and len(seen) < limit:
        n = todo.pop()
        if n in seen or getattr(n, "op", None) != "call_function":
            continue
        seen.add(n)
        if _is_reduction(n):
            return True
        if torch.Tag.pointwise in _tags(n) or _packet(n) in _VIEWS:
            todo.extend(n.all_input_nodes if up else n.users)
    return False


def reduction_fed(node, limit: int = _MAX_WALK) -> bool:
    """Whether `node` is computed from a reduction (a norm's mean or
    variance) through pointwise ops and views only: then Inductor fuses
    a transposed store of it into the reduction's kernel."""
    return _reaches_reduction(node, True, limit) or (
        getattr(node, "op", None) == "call_function" and _is_reduction(node))


def reduction_read(node, limit: int = _MAX_WALK) -> bool:
    """Whether a reduction reads `node` through pointwise ops and views
    only (a residual sum, then a norm): then Inductor reads it transposed
    inside the reduction's kernel, row by row across columns."""
    return _reaches_reduction(node, False, limit)


def _transposed_source(node):
    """v where `node` is clone(permute(v, [1, 0])) of a 2-D v, else None."""
    if getattr(node, "op", None) != "call_function" or _packet(node) != "clone":
        return None
    perm = node.args[0] if node.args else None
    if getattr(perm, "op", None) != "call_function" or _packet(perm) != "permute":
        return None
    if len(perm.args) < 2 or list(perm.args[1]) != [1, 0]:
        return None
    return perm.args[0]


def _freeze(a):
    if isinstance(a, (list, tuple)):
        return tuple(_freeze(b) for b in a)
    if isinstance(a, dict):
        return tuple(sorted((k, _freeze(b)) for k, b in a.items()))
    return a


def _same(v):
    """The key of v for sharing: a view by its op and arguments (each
    layer's forward reshapes x again: equal views of one node), anything
    else by itself."""
    if _packet(v) in _VIEWS:
        key = (v.target, _freeze(v.args), _freeze(v.kwargs))
        try:
            hash(key)
        except TypeError:            # a symbolic size held as a value: not shared
            return v
        return key
    return v


def rewrite(graph: torch.fx.Graph) -> int:
    """The pass on `graph` (in place); returns how many transposes of the
    layers' X^T and Y^T it moved to sparseforge::transpose."""
    linear_fm = getattr(getattr(torch.ops, "sparseforge", None), "linear_fm", None)
    if linear_fm is None:
        return 0
    target, transpose = linear_fm.default, torch.ops.sparseforge.transpose.default
    shared: dict = {}                  # _same(v) -> its transpose node
    moved = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not target:
            continue
        moved += _x_side(graph, node, transpose, shared) + _y_side(graph, node, transpose)
    if moved:
        fuse_norms(graph)
        graph.lint()
    return moved


# ---- an activation in the layer's epilogue ----------------------------------------------
# Inductor's decompositions have taken GELU apart by the post-grad graph
# (0.5 x (1 + tanh(...)) or 0.5 x (1 + erf(x / sqrt 2)), with casts in
# 16-bit models), so an activation is found by what it computes: the
# pointwise nodes above the layer's output that read nothing else, with
# one node read outside them, evaluated (in float64) on a probe of values.

_PROBE_N = 193
_IDENTITY = {"convert_element_type", "clone", "alias"}   # the math of a cast or copy: x


def _pointwise(node) -> bool:
    tag = getattr(torch.Tag, "pointwise", None)
    return node.op == "call_function" and (
        (tag is not None and tag in _tags(node)) or _packet(node) in _IDENTITY)


def _activation_of(x) -> Optional[tuple]:
    """(act, approximate, out, nodes) where `nodes` (each after its
    inputs), the pointwise nodes that read `x` and each other alone, compute act(x)
    ("gelu" with "tanh" or "none", or "relu") and `out`, one of them, is
    the only one read outside them; else None."""
    inside, order, todo = {x}, [], list(x.users)
    while todo and len(order) < _MAX_WALK:
        n = todo.pop(0)
        if n in inside or not _pointwise(n):
            continue
        if not all(a in inside for a in n.all_input_nodes):
            continue
        inside.add(n)
        order.append(n)
        todo.extend(n.users)
    outs = [n for n in order if any(u not in inside for u in n.users)]
    if len(outs) != 1 or any(u not in inside for u in x.users) or not order:
        return None
    out = outs[0]
    if _val_dtype(out) != _val_dtype(x) or _val_shape(out) != _val_shape(x):
        return None
    with _real_tensors():          # the pass runs under Inductor's fake tensor mode
        return _evaluated(x, order, out)


def _real_tensors():
    try:
        from torch._subclasses.fake_tensor import unset_fake_temporarily
        return unset_fake_temporarily()
    except ImportError:               # pragma: no cover - older torch
        import contextlib
        return contextlib.nullcontext()


def _evaluated(x, order: list, out) -> Optional[tuple]:
    """_activation_of's answer for the nodes `order` above x: what they
    compute on the probe, in float64 (casts and copies as the identity)."""
    probe = torch.linspace(-6.0, 6.0, _PROBE_N, dtype=torch.float64)
    vals = {x: probe}
    try:
        for n in order:
            if _packet(n) in _IDENTITY:
                vals[n] = vals[n.args[0]]
                continue
            args = [vals[a] if isinstance(a, torch.fx.Node) else a for a in n.args]
            vals[n] = n.target(*args, **n.kwargs).to(torch.float64)
    except Exception:  # noqa: BLE001 - not something this pass evaluates
        return None
    got = vals[out]
    if tuple(got.shape) != tuple(probe.shape):
        return None
    f = torch.nn.functional
    for act, approximate, want in (("gelu", "tanh", f.gelu(probe, approximate="tanh")),
                                   ("gelu", "none", f.gelu(probe)),
                                   ("relu", "none", torch.relu(probe))):
        if torch.allclose(got, want, rtol=1e-9, atol=1e-12):
            return act, approximate, out, order
    return None


def _val_dtype(node):
    v = _val(node)
    return getattr(v, "dtype", None)


def _val_shape(node):
    v = _val(node)
    return tuple(v.shape) if hasattr(v, "shape") else None


def fuse_activations(graph: torch.fx.Graph, fuse=None) -> int:
    """`linear` whose output (through single-user views) only a GELU or
    ReLU reads becomes `linear_act` (in place); returns how many.
    `fuse(key, act) -> bool` (act: the op's word, _op.fused_act) builds
    the fused layer and says whether it may be used (default: _op's
    fusable, then fused_layer; a layer that cannot be rebuilt stays as it
    was, with a warning)."""
    from . import _op
    ops = getattr(torch.ops, "sparseforge", None)
    if ops is None or not hasattr(ops, "linear_act"):
        return 0
    linear, linear_act = ops.linear.default, ops.linear_act.default
    fuse = fuse or _fuse
    done = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not linear:
            continue
        top = node
        while len(top.users) == 1:
            (user,) = top.users
            if _packet(user) not in _RESHAPES or user.args[0] is not top:
                break
            top = user
        found = _activation_of(top)
        if found is None:
            continue
        act, approximate, out, nodes = found
        word = _op.fused_act(act, approximate)
        if word is None or not fuse(node.args[2], word):
            continue
        with graph.inserting_before(node):
            fused = graph.call_function(linear_act, (*node.args, word))
        fused.meta = dict(node.meta)
        if "eager_input_vals" in node.meta:   # what Inductor lowers the op's arguments by
            args, kwargs = node.meta["eager_input_vals"]
            fused.meta["eager_input_vals"] = ((*args, word), kwargs)
        node.replace_all_uses_with(fused)
        out.replace_all_uses_with(fused if top is node else top)
        for n in reversed(nodes):       # the activation's nodes, read by nothing now
            graph.erase_node(n)
        graph.erase_node(node)
        done += 1
    if done:
        graph.lint()
    return done


def _fuse(key: int, act: str) -> bool:
    from . import _op
    if not _op.fusable(key, act):
        return False
    try:
        _op.fused_layer(key, act)
    except Exception as e:  # noqa: BLE001 - the layer runs unfused
        import warnings
        warnings.warn(f"sparseforge: layer {key} runs without its {act} fused: {e}")
        return False
    return True


# ---- RMSNorm and X^T in one kernel (sm_90) ----------------------------------------------

def _only_user(node, user) -> bool:
    return list(node.users) == [user]


def _is(node, name: str) -> bool:
    return getattr(node, "op", None) == "call_function" and _packet(node) == name


def _strip_views(node, user=None):
    """(the node under a chain of single-user views, the views top down)."""
    views = []
    while _packet(node) in _RESHAPES and getattr(node, "op", None) == \
            "call_function" and (user is None or _only_user(node, user)):
        views.append(node)
        user, node = node, node.args[0]
    return node, views


def _val(node):
    return node.meta.get("val") if hasattr(node, "meta") else None


def _to_dtype(node):
    """(input, dtype) of a dtype conversion node, else None."""
    if _is(node, "convert_element_type") and len(node.args) >= 2:
        return node.args[0], node.args[1]
    return None


def _pair(node, name: str, test_a, test_b):
    """(a, b) of binary op `name` whose arguments pass test_a and test_b in
    either order, else None."""
    if not _is(node, name) or len(node.args) != 2 or node.kwargs:
        return None
    for a, b in (node.args, node.args[::-1]):
        if test_a(a) and test_b(b):
            return a, b
    return None


def match_rms_norm(v) -> Optional[dict]:
    """The RMSNorm that computes v, as written by models in 16 bits:
    `(xf * rsqrt(mean(xf ** 2, -1, keepdim) + eps)).to(dtype) * w` (round
    first; Hugging Face's LlamaRMSNorm) or `(xf * rsqrt(...) *
    w.float()).to(dtype)` (torch.nn.RMSNorm: w promoted), xf = x.float();
    dict(x, w, eps, round_first, nodes: the chain from v down, each read
    only inside it), else None."""
    is_node = lambda n: hasattr(n, "op")
    out = {}
    rsqrt_of = {}

    def normed(m):            # m = xf * r: records xf and r
        ab = _pair(m, "mul", lambda a: _to_dtype(a) is not None and
                   _to_dtype(a)[1] == torch.float32, lambda b: _is(b, "rsqrt"))
        if ab is None:
            return False
        rsqrt_of["xf"], rsqrt_of["r"] = ab
        return True

    # round first: v = c1 * w, c1 = (xf * r).to(dtype)
    ab = _pair(v, "mul", lambda a: _to_dtype(a) is not None and normed(_to_dtype(a)[0]),
               lambda b: is_node(b))
    if ab is not None:
        c1, w = ab
        out.update(round_first=True, w=w, nodes=[v, c1, _to_dtype(c1)[0]], cast=_to_dtype(c1)[1])
    else:             # v = (m * wf).to(dtype), wf = w.float() or w (promoted)
        cv = _to_dtype(v)
        if cv is None:
            return None
        ab = _pair(cv[0], "mul", lambda a: normed(a), lambda b: is_node(b))
        if ab is None:
            return None
        m, wf = ab
        out["cast"] = cv[1]
        if _to_dtype(wf) is not None:
            if _to_dtype(wf)[1] != torch.float32:
                return None
            out.update(round_first=False, w=_to_dtype(wf)[0], nodes=[v, cv[0], m, wf])
        else:         # (torch.nn.RMSNorm: the 16-bit weight times fp32, promoted)
            out.update(round_first=False, w=wf, nodes=[v, cv[0], m])
    xf, r = rsqrt_of["xf"], rsqrt_of["r"]
    add = r.args[0] if r.args else None
    if not _is(add, "add") or len(add.args) != 2 or not isinstance(add.args[1], float):
        return None
    mean = add.args[0]
    if not _is(mean, "mean") or len(mean.args) < 3 or mean.args[2] is not True:
        return None
    sq = mean.args[0]
    if not ((_is(sq, "pow") and sq.args[0] is xf and sq.args[1] in (2, 2.0)) or
            (_is(sq, "mul") and list(sq.args) == [xf, xf])):
        return None
    x = _to_dtype(xf)[0]
    xv = _val(x)
    dims = mean.args[1]
    if xv is None or not isinstance(dims, (list, tuple)) or list(dims) not in ([-1],
                                                                              [xv.dim() - 1]):
        return None
    if out.pop("cast") != xv.dtype:   # (the norm rounds to x's own dtype)
        return None
    out.update(x=x, eps=add.args[1], nodes=out["nodes"] + [r, add, mean, sq, xf])
    chain = set(out["nodes"])
    # every node of the chain is read inside it only (v: by its transpose's views)
    for n in out["nodes"][1:]:
        if any(u not in chain for u in n.users):
            return None
    return out


def _device_ok(x, w) -> bool:
    from ._op import norm_fusable
    return norm_fusable(x, w)


def fuse_norms(graph: torch.fx.Graph) -> int:
    """Where sparseforge::transpose(v) reads an RMSNorm's v (match_rms_norm)
    that nothing else reads, the norm and the transpose become one
    sparseforge::rms_norm_t; where the norm's x is a residual sum with a
    transpose of a feature-major layer's Y^T (the pass's Y side), the sum
    moves in too.  16-bit x, static shapes, an sm_90 GPU; returns how many
    norms it fused."""
    import operator
    norm_op = getattr(getattr(torch.ops, "sparseforge", None), "rms_norm_t", None)
    if norm_op is None:
        return 0
    norm_op, transpose = norm_op.default, torch.ops.sparseforge.transpose.default
    fused = 0
    for t in [n for n in graph.nodes if n.op == "call_function" and n.target is transpose]:
        v, views = _strip_views(t.args[0], t)     # (each view read by the next alone)
        if not _only_user(v, views[-1] if views else t):
            continue
        m = match_rms_norm(v)
        if m is None:
            continue
        x, w = m["x"], m["w"]
        xv, wv = _val(x), _val(w)
        if xv is None or wv is None or not _device_ok(xv, wv):
            continue
        if not all(isinstance(d, int) for d in xv.shape):
            continue                  # (dynamic shapes: not fused)
        k = int(xv.shape[-1])
        fake = torch._guards.detect_fake_mode([xv])
        # the residual sum: x = a + view(transpose(Y^T)), the transpose read by it alone
        a, yt, ynodes = x, None, []
        if _is(x, "add") and len(x.args) == 2 and not x.kwargs:
            for p, q in (x.args, x.args[::-1]):
                base, qviews = _strip_views(q, x) if hasattr(q, "op") else (q, [])
                pv = _val(p) if hasattr(p, "op") else None
                # (Y^T of a feature-major layer, k x n, as the pass's Y side transposed it)
                if (pv is not None and tuple(pv.shape) == tuple(xv.shape) and
                        pv.dtype == xv.dtype and pv.is_contiguous() and
                        getattr(base, "op", None) == "call_function" and base.target is transpose and
                        _only_user(base, qviews[-1] if qviews else x) and
                        _is(base.args[0], "linear_fm") and _val(base.args[0]) is not None and
                        tuple(_val(base.args[0]).shape) == (k, pv.numel() // k)):
                    a, yt, ynodes = p, base.args[0], qviews + [base]
                    break
        if not _val(a).is_contiguous():
            continue
        # after x and the op's inputs, before any reader of x or of X^T
        order = {n: i for i, n in enumerate(graph.nodes)}
        at = max((n for n in (x, a, yt, w) if n is not None), key=order.__getitem__)
        with graph.inserting_before(at.next):     # (in order, unlike inserting_after)
            a2 = graph.call_function(torch.ops.aten.view.default, (a, [-1, k]))
            node = graph.call_function(norm_op, (a2, yt, w, m["eps"], m["round_first"],
                                                 t.args[1]))
            h2 = graph.call_function(operator.getitem, (node, 0))
            xt = graph.call_function(operator.getitem, (node, 1))
        if fake is not None:
            from ._op import _rms_norm_t_fake
            with fake:
                a2.meta["val"] = _val(a).view(-1, k)
                node.meta["val"] = _rms_norm_t_fake(a2.meta["val"], _val(yt) if yt is not None else None,
                                                    wv, m["eps"], m["round_first"], t.args[1])
                h2.meta["val"], xt.meta["val"] = node.meta["val"]
        t.replace_all_uses_with(xt)
        dead = [t] + views + m["nodes"]
        if yt is not None:
            with graph.inserting_after(xt):
                h = graph.call_function(torch.ops.aten.view.default, (h2, list(xv.shape)))
            if fake is not None:
                with fake:
                    h.meta["val"] = h2.meta["val"].view(*xv.shape)
            x.replace_all_uses_with(h)
            dead += [x] + ynodes
        for n in dead:
            if not n.users:
                graph.erase_node(n)
        fused += 1
    return fused


def _x_side(graph: torch.fx.Graph, fm, transpose, shared: dict) -> int:
    """X^T of layer node `fm` by sparseforge::transpose (the one of an
    equal input in `shared`) where a reduction computes X; 1 if moved."""
    xt = fm.args[0]
    v = _transposed_source(xt)
    if v is None or not reduction_fed(v):
        return 0
    t = shared.get(_same(v))
    if t is None:
        with graph.inserting_after(v):
            t = graph.call_function(transpose, (v, fm.args[2]))
        if "val" in xt.meta:
            t.meta["val"] = xt.meta["val"]
        shared[_same(v)] = t
    fm.replace_input_with(xt, t)
    # the transpose left without readers, and a view of its own (only
    # these: a graph may hold mutations that dead-code elimination must
    # not judge)
    perm = xt.args[0]
    for dead in (xt, perm) + ((v,) if v is not t.args[0] and _packet(v) in _VIEWS else ()):
        if not dead.users:
            graph.erase_node(dead)
    return 1


def _y_side(graph: torch.fx.Graph, fm, transpose) -> int:
    """Y = (Y^T)^T of layer node `fm` by sparseforge::transpose where a
    reduction reads Y (the residual sum a norm reads); 1 if moved."""
    for c in [c for p in list(fm.users) for c in list(p.users)]:
        if _transposed_source(c) is not fm or not reduction_read(c):
            continue
        with graph.inserting_after(c):
            t = graph.call_function(transpose, (fm, fm.args[2]))
        if "val" in c.meta:
            t.meta["val"] = c.meta["val"]
        c.replace_all_uses_with(t)
        perm = c.args[0]
        graph.erase_node(c)
        if not perm.users:
            graph.erase_node(perm)
        return 1
    return 0


def _base() -> type:
    """Inductor's CustomGraphPass (torch >= 2.6: a pass with a uuid keeps
    the FX graph cache), else object (a plain callable); imported when a
    pass is first made."""
    try:
        from torch._inductor.custom_graph_pass import CustomGraphPass
        return CustomGraphPass
    except ImportError:               # pragma: no cover - older torch
        return object


_made: dict = {}   # "pass": sparseforge's pass (one instance), "both": combine's class


def _make() -> dict:
    """The pass and combine's class, made on first use (their base is
    Inductor's, imported then)."""
    if not _made:
        base = _base()

        class XtPass(base):
            """rewrite() as an Inductor custom graph pass."""

            def __call__(self, graph: torch.fx.Graph) -> None:
                rewrite(graph)
                fuse_activations(graph)

            def uuid(self) -> Optional[bytes]:
                return hashlib.sha256(Path(__file__).read_bytes()).digest()

        class Both(base):
            """Two passes run in turn (combine)."""

            def __init__(self, first, second):
                self.first, self.second = first, second

            def __call__(self, graph: torch.fx.Graph) -> None:
                self.first(graph)
                self.second(graph)

            def uuid(self) -> Optional[bytes]:
                ids = []
                for p in (self.first, self.second):
                    u = p.uuid() if hasattr(p, "uuid") else None
                    if u is None:
                        return None    # one without a uuid: Inductor bypasses its cache
                    ids.append(repr(u).encode())
                return hashlib.sha256(b"|".join(ids)).digest()

        _made.update({"pass": XtPass(), "both": Both})
    return _made


def the_pass():
    """sparseforge's pass (one instance)."""
    return _make()["pass"]


def combine(other):
    """A pass that runs `other`, then sparseforge's: for a model that
    sets its own post_grad_custom_post_pass."""
    return _make()["both"](other, the_pass())


def installed() -> bool:
    """Whether Inductor's post-grad custom pass runs sparseforge's."""
    from torch._inductor import config
    p = getattr(config, "post_grad_custom_post_pass", None)
    if p is None or not _made:
        return False
    return p is the_pass() or (isinstance(p, _made["both"]) and p.second is the_pass())


def install() -> bool:
    """Sets the pass where Inductor's slot is empty; True when it runs."""
    try:
        from torch._inductor import config
    except ImportError:                # pragma: no cover - a torch without Inductor
        return False
    if not hasattr(config, "post_grad_custom_post_pass"):
        return False                   # pragma: no cover - torch too old for the slot
    if config.post_grad_custom_post_pass is None:
        config.post_grad_custom_post_pass = the_pass()
    return installed()
