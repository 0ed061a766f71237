"""The DLMC subset in every family it converts to, on the GPU: csr as it is
(fp32; the csr family's own test), bsr 32x32 and shflbw V=32 by storing the
zeros their blocks and groups need (fp16), nm24 after 2:4 magnitude pruning
(fp16).  Values are drawn from a seeded generator (DLMC has none)."""
import pytest

from sparseforge.generator import io
from sparseforge.generator.families import get_family, parse_pattern
from sparseforge.generator.kernel import Operation
from sparseforge.generator.prune import prune
from sparseforge.tuner.execute import verify

CONVERSIONS = ["bsr:32x32", "shflbw:32", "nm24"]


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", CONVERSIONS)
def test_dlmc_runs_in_converted_families(pattern, dlmc_files):
    fam_name, params = parse_pattern(pattern)
    fam = get_family(fam_name)
    for path in dlmc_files:
        (name, m), = io.load(str(path))
        m = m.astype("fp16")
        if fam_name == "nm24":
            m = prune(m.to_dense(), "nm24", 0.5)[0].astype("fp16")
        op = Operation("fp16", "fm")
        cfg = fam.search_space(m, op, params)[0]
        res = verify(fam, m, op, params, cfg, 256, seed=7)
        assert res["ok"], (path.name, pattern, res)
