"""The C library's interface has one hand-written definition, the public
headers: the generated Python and device files are what the generator
writes from them, and every ctypes layout matches the C compiler's."""
import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from sparseforge import _abi
from sparseforge.generator.tools import abi

ROOT = Path(__file__).resolve().parents[2]


def test_generated_files_are_current():
    for path, text in abi.outputs(ROOT).items():
        assert path.read_text() == text, \
            f"{path.relative_to(ROOT)} is stale: run python -m sparseforge.generator.tools.abi"


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                    reason="no C compiler")
def test_every_ctypes_layout_is_the_compilers(tmp_path):
    header = abi.read(ROOT)
    src = tmp_path / "layout.c"
    src.write_text(abi.layout_program(header))
    exe = tmp_path / "layout"
    cc = shutil.which("cc") or shutil.which("gcc")
    subprocess.run([cc, "-std=c11", "-I", str(ROOT / "runtime"), str(src), "-o", str(exe)],
                   check=True)
    seen = 0
    for line in subprocess.run([str(exe)], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        struct, field, *nums = line.split()
        cls = getattr(_abi, struct)
        if field == "-":
            assert ctypes.sizeof(cls) == int(nums[0]), struct
        else:
            offset, size = map(int, nums)
            desc = getattr(cls, field)
            assert (desc.offset, desc.size) == (offset, size), f"{struct}.{field}"
            seen += 1
    assert seen == sum(len(f) for f in header.structs.values()) > 50


def test_the_tables_come_from_the_header():
    text = (ROOT / "runtime" / "sparseforge_runtime.h").read_text()
    for name, value, words in _abi.STATUS:
        assert f"X({name}, {value}, \"{words}\")" in text
    assert [w for _, _, w in _abi.ACTIVATIONS] == ["none", "relu", "gelu"]
    assert [f[0] for f in _abi.LAUNCH_RECORD_FIELDS] == [
        n for n, _ in _abi.sf_launch_record._fields_]


def test_the_parser_refuses_what_it_does_not_read():
    with pytest.raises(abi.AbiError, match="cannot read the declaration"):
        abi.parse(["int (*weird)[3];\n" + (ROOT / "runtime" / "sparseforge_runtime.h").read_text()])
    with pytest.raises(abi.AbiError, match="enum value without an explicit number"):
        abi.parse(["enum { A, B };\n" + (ROOT / "runtime" / "sparseforge_runtime.h").read_text()])
