"""Builds libsparseforge with CMake during `pip install .` and ships it inside
the package (sparseforge/lib/), so that the ctypes binding finds it.

The Python parts live in the folders the design names (generator/, tuner/,
templates/) and install as subpackages of `sparseforge`; every folder with
an __init__.py under them is a package, so a new family's package
(generator/families/<name>/) is installed without a line here."""
import os
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildWithCMake(build_py):
    def run(self):
        super().run()
        build_dir = ROOT / "build" / "pip"
        cmake_args = ["-DSF_BUILD_TESTS=OFF", "-DCMAKE_BUILD_TYPE=Release"]
        cmake_args += os.environ.get("SF_CMAKE_ARGS", "").split()
        subprocess.check_call(["cmake", "-S", str(ROOT), "-B", str(build_dir)] + cmake_args)
        subprocess.check_call(["cmake", "--build", str(build_dir), "--target", "sparseforge",
                               "-j", str(os.cpu_count() or 2)])
        dest = Path(self.build_lib) / "sparseforge" / "lib"
        dest.mkdir(parents=True, exist_ok=True)
        for so in build_dir.glob("libsparseforge.so*"):
            if so.is_symlink():
                continue
            shutil.copy2(so, dest / "libsparseforge.so")
        # the driver-only runtime's sources, which `sparseforge export`
        # copies into every deployment bundle
        rt = ROOT / "runtime"
        src = Path(self.build_lib) / "sparseforge" / "runtime_src"
        src.mkdir(parents=True, exist_ok=True)
        lines = (rt / "rt_sources.txt").read_text().splitlines()
        names = [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]
        for name in ["rt_sources.txt", "sparseforge_runtime.h", "internal.h"] + names:
            shutil.copy2(rt / name, src / name)


def packages() -> dict[str, str]:
    """package name -> folder, for sparseforge and its subpackages."""
    out = {"sparseforge": "sparseforge", "sparseforge.templates": "templates"}
    for init in sorted((ROOT / "sparseforge").rglob("__init__.py")):   # sparseforge.torch
        rel = init.parent.relative_to(ROOT)
        out[".".join(rel.parts)] = rel.as_posix()
    for top in ("generator", "tuner"):
        for init in sorted((ROOT / top).rglob("__init__.py")):
            rel = init.parent.relative_to(ROOT)
            out["sparseforge." + ".".join(rel.parts)] = rel.as_posix()
    return out


setup(cmdclass={"build_py": BuildWithCMake}, packages=list(packages()), package_dir=packages())
