"""The checked-in wgmma header is what its generator writes, and each
wrapper names every accumulator register once."""
import re

from sparseforge.generator.tools import wgmma_header


def test_checked_in_header_is_current():
    assert wgmma_header.target().read_text() == wgmma_header.header(), \
        "run: python -m sparseforge.generator.tools.wgmma_header"


def test_every_wrapper_lists_its_accumulators():
    text = wgmma_header.header()
    for n in wgmma_header.N_CHOICES:
        for _, ptx in wgmma_header.TYPES:
            m = re.search(rf"m64n{n}k16\.f32\.{ptx}\.{ptx} \"\s*\"\{{\"(.*?)\"\}}, %(\d+), %(\d+), p",
                          text, re.S)
            assert m, (n, ptx)
            regs = re.findall(r"%(\d+)", m.group(1))
            assert [int(r) for r in regs] == list(range(n // 2))
            assert int(m.group(2)) == n // 2 and int(m.group(3)) == n // 2 + 1


def test_every_register_a_wrapper_lists_its_accumulators_and_a():
    text = wgmma_header.header()
    for n in wgmma_header.N_CHOICES:
        for elem, ptx in wgmma_header.TYPES:
            body = text.split(f"struct MmaRegA<{elem}, {n}, TRANS_B>")[1].split("};")[0]
            m = re.search(rf"m64n{n}k16\.f32\.{ptx}\.{ptx} \"\s*\"\{{\"(.*?)\"\}}, "
                          rf"\{{%(\d+), %(\d+), %(\d+), %(\d+)\}}, %(\d+), p, 1, 1, %(\d+);", body, re.S)
            assert m, (n, ptx)
            regs = re.findall(r"%(\d+)", m.group(1))
            assert [int(r) for r in regs] == list(range(n // 2))
            assert [int(m.group(i)) for i in range(2, 8)] == list(range(n // 2, n // 2 + 6))
            assert f"setp.ne.b32 p, %{n // 2 + 6}, 0" in body
