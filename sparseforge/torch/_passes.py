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

`install()` puts the pass in torch._inductor.config.post_grad_custom_post_pass
where that slot is empty: _op.load does it when it loads a layer that has
a feature-major kernel on a GPU (importing Inductor takes a second or
more, which a model that never runs one need not pay); a slot holding
another pass is left alone, and `combine(pass)` gives one that runs both.
The pass only rewrites graphs that call sparseforge::linear_fm.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Optional

import torch

_MAX_WALK = 64     # nodes visited looking up from v for a reduction

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
        graph.lint()
    return moved


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
