"""Writes examples/tiny_model.npz: a small fp16 model whose layers are pruned
to each family (two of them identical, to show they are tuned once), and a
dense layer that tuning lists and skips.  Deterministic (seed 0)."""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from sparseforge.generator.prune import prune  # noqa: E402

rng = np.random.default_rng(0)
layers = {}
w = rng.standard_normal((1024, 512)).astype(np.float32)
layers["ffn.up.weight"] = prune(w, "shflbw:64", 0.75)[0]
layers["ffn.up_copy.weight"] = layers["ffn.up.weight"]
w = rng.standard_normal((512, 1024)).astype(np.float32)
layers["ffn.down.weight"] = prune(w, "nm24", 0.5)[0]
w = rng.standard_normal((512, 512)).astype(np.float32)
layers["attn.q.weight"] = prune(w, "bsr:32x32", 0.75)[0]
arrays = {}
for name, m in layers.items():
    arrays[name] = m.astype("fp16").to_dense().astype(np.float16)
arrays["attn.k.weight"] = rng.standard_normal((512, 512)).astype(np.float16)
out = Path(__file__).resolve().parent / "tiny_model.npz"
np.savez_compressed(out, **arrays)
print(f"wrote {out}")
