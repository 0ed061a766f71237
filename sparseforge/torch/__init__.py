"""sparseforge for PyTorch models (the optional extra: `pip install .[torch]`;
nothing else in sparseforge imports torch).

    from sparseforge.torch import sparsify
    report = sparsify(model, db="model.db")      # each sparse nn.Linear -> SparseLinear, tuned
    model = torch.compile(model.cuda(), fullgraph=True)

- SparseLinear (linear.py): a drop-in for nn.Linear with a sparse weight;
  its weights, packed buffers and, per GPU architecture, compiled kernels
  are its state_dict; on a GPU it runs the tuned kernels through the
  custom op sparseforge::linear (_op.py), on CPU torch's F.linear.
- sparsify, load_state_dict, Report (convert.py): converting a model,
  loading a sparsified model's state into the dense one.
- _passes.py: the graph pass torch.compile's Inductor runs after its own
  (set when a layer with a feature-major kernel is loaded on a GPU, where
  torch._inductor.config.post_grad_custom_post_pass is empty;
  `combine_pass` joins it to a model's own pass): a norm's output read
  feature-major is transposed by one kernel of sparseforge's.
"""
from ..tuner.resolve import MissingLayersError
from .convert import DEFAULT_N, LayerReport, Report, load_state_dict, sparsify
from .linear import SparseLinear
from ._passes import combine as combine_pass

__all__ = ["SparseLinear", "sparsify", "load_state_dict", "Report", "LayerReport",
           "MissingLayersError", "DEFAULT_N", "combine_pass"]
