"""Writes the binary interface of the C library as Python and device code,
from the public headers (runtime/sparseforge_runtime.h, runtime/sparseforge.h):

- sparseforge/_abi.py: every struct as a ctypes Structure, every callback
  type, every function's signature, the status, activation and launch-record
  tables and every enum and numeric #define;
- templates/include/sf/abi.cuh: the activation codes for the device code.

The headers are the only hand-written definition of these records and
codes; both outputs are checked in, and tests/py/test_abi.py fails when
they differ from what this script writes or when a ctypes layout differs
from the C compiler's.

    python -m sparseforge.generator.tools.abi [--check]

The parser reads the C subset the headers are written in: `typedef struct
NAME {...} NAME;`, `typedef enum NAME {...} NAME;`, anonymous enums,
`typedef struct NAME NAME;` (opaque handles), `typedef T NAME;`, callback
typedefs, `SF_API` prototypes, numeric `#define`s and the X-macro tables
SF_STATUS_TABLE, SF_ACTIVATION_TABLE and SF_LAUNCH_RECORD_FIELDS.  Anything
else it meets in a declaration it refuses, naming it.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

HEADERS = ("runtime/sparseforge_runtime.h", "runtime/sparseforge.h")
PY_OUT = "sparseforge/_abi.py"
CUH_OUT = "templates/include/sf/abi.cuh"

# C scalar types and their ctypes names
_SCALARS = {
    "int": "c_int", "unsigned": "c_uint", "unsigned int": "c_uint", "char": "c_char",
    "unsigned char": "c_ubyte", "double": "c_double", "float": "c_float",
    "int32_t": "c_int32", "uint32_t": "c_uint32", "int64_t": "c_int64", "uint64_t": "c_uint64",
    "size_t": "c_size_t", "void": "None",
}


class AbiError(ValueError):
    """The header holds something this parser does not read."""


@dataclass
class Field:
    name: str
    ctype: str          # C type, e.g. "const char *"
    count: int = 0      # array length; 0 for a scalar
    text: str = ""      # the table's description, where it has one


@dataclass
class Header:
    defines: dict = field(default_factory=dict)      # name -> int
    enums: dict = field(default_factory=dict)        # enum type -> [(name, value)]
    aliases: dict = field(default_factory=dict)      # typedef name -> C type
    opaque: list = field(default_factory=list)       # opaque struct names
    structs: dict = field(default_factory=dict)      # name -> [Field] (declaration order)
    callbacks: dict = field(default_factory=dict)    # name -> (return C type, [C types])
    functions: dict = field(default_factory=dict)    # name -> (return C type, [C types])
    status: list = field(default_factory=list)       # (name, value, text)
    activations: list = field(default_factory=list)  # (name, value, word)
    launch_fields: list = field(default_factory=list)  # [Field]


# ---- reading -----------------------------------------------------------------

def _strip_comments(text: str) -> str:
    """The text without /* */ and // comments (string literals kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                raise AbiError("unterminated comment")
            out.append(" ")
            i = j + 2
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        else:
            out.append(c)
            i += 1
    return "".join(out)


_TABLE_ROW = re.compile(r'X\(\s*(\w+)\s*,\s*(-?\d+)\s*,\s*"([^"]*)"\s*\)')
_LAUNCH_ROW = re.compile(r'(S|A)\(\s*([\w ]+?)\s*,\s*(\w+)\s*,\s*(?:(\d+)\s*,\s*)?"([^"]*)"\s*\)')


def _read_defines(text: str, h: Header) -> str:
    """Takes the #define lines (tables and numbers) out of `text`; returns
    the rest."""
    rest = []
    for line in text.split("\n"):
        s = line.strip()
        if not s.startswith("#"):
            rest.append(line)
            continue
        m = re.match(r"#\s*define\s+(\w+)(\([^)]*\))?\s*(.*)", s)
        if not m:
            continue   # #include, #if, #endif, #undef, ...
        name, params, body = m.group(1), m.group(2), m.group(3)
        if name == "SF_STATUS_TABLE":
            h.status = [(a, int(b), c) for a, b, c in _TABLE_ROW.findall(body)]
        elif name == "SF_ACTIVATION_TABLE":
            h.activations = [(a, int(b), c) for a, b, c in _TABLE_ROW.findall(body)]
        elif name == "SF_LAUNCH_RECORD_FIELDS":
            for kind, ctype, fname, count, desc in _LAUNCH_ROW.findall(body):
                if (kind == "A") != bool(count):
                    raise AbiError(f"SF_LAUNCH_RECORD_FIELDS: {fname}: S takes no count, A one")
                h.launch_fields.append(Field(fname, ctype, int(count or 0), desc))
        elif params is None and re.fullmatch(r"-?(0x[0-9A-Fa-f]+|\d+)", body):
            h.defines[name] = int(body, 0)
    return "\n".join(rest)


def _split_decl(decl: str) -> tuple[str, str, int]:
    """'const char *name[3]' -> ('const char *', 'name', 3)."""
    decl = " ".join(decl.split())
    m = re.fullmatch(r"(.*?)(\w+)\s*(?:\[\s*(\d+)\s*\])?", decl)
    if not m or not m.group(1).strip():
        raise AbiError(f"cannot read the declaration {decl!r}")
    ctype = re.sub(r"\s*\*\s*", " *", m.group(1).strip()).replace("* *", "**").strip()
    return ctype, m.group(2), int(m.group(3) or 0)


def _params(text: str) -> list[str]:
    text = text.strip()
    if text in ("", "void"):
        return []
    out = []
    for p in text.split(","):
        ctype, _, count = _split_decl(p)
        out.append(ctype + (f"[{count}]" if count else ""))
    return out


def parse(texts: list[str]) -> Header:
    """Reads the headers' declarations, in order."""
    h = Header()
    for text in texts:
        body = _read_defines(_strip_comments(text.replace("\\\n", " ")), h)
        body = re.sub(r'extern\s+"C"\s*\{|^\s*\}\s*$', " ", body, flags=re.M)
        for stmt in (s.strip() for s in _statements(body)):
            if stmt:
                _statement(stmt, h)
    if not h.status or not h.activations or not h.launch_fields:
        raise AbiError("a table (SF_STATUS_TABLE, SF_ACTIVATION_TABLE, "
                       "SF_LAUNCH_RECORD_FIELDS) is missing")
    return h


def _statements(body: str):
    """Top-level statements: up to a ';' outside braces."""
    depth, start = 0, 0
    for i, c in enumerate(body):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == ";" and depth == 0:
            yield body[start:i]
            start = i + 1
    if body[start:].strip():
        raise AbiError(f"text after the last declaration: {body[start:].strip()[:60]!r}")


def _statement(s: str, h: Header) -> None:
    s = " ".join(s.split())
    m = re.fullmatch(r"typedef (struct|enum) (\w+) \{(.*)\} (\w+)", s)
    if m:
        kind, tag, inner, name = m.groups()
        if tag != name:
            raise AbiError(f"typedef {kind} {tag} names itself {name}")
        if kind == "enum":
            h.enums[name] = _enum_values(inner, h)
        elif "SF_LAUNCH_RECORD_FIELDS" in inner:
            h.structs[name] = list(h.launch_fields)
        else:
            h.structs[name] = _struct_fields(inner, name)
        return
    m = re.fullmatch(r"enum \{(.*)\}", s)
    if m:
        h.enums[""] = h.enums.get("", []) + _enum_values(m.group(1), h)
        return
    m = re.fullmatch(r"typedef struct (\w+) (\w+)", s)
    if m:
        h.opaque.append(m.group(2))
        return
    m = re.fullmatch(r"typedef (.+?) \(\*(\w+)\)\((.*)\)", s)
    if m:
        h.callbacks[m.group(2)] = (_norm(m.group(1)), _params(m.group(3)))
        return
    m = re.fullmatch(r"typedef ([\w ]+) (\w+)", s)
    if m:
        h.aliases[m.group(2)] = m.group(1)
        return
    m = re.fullmatch(r"SF_API (.+?)\b(\w+)\((.*)\)(?: __attribute__.*)?", s)
    if m:
        h.functions[m.group(2)] = (_norm(m.group(1)), _params(m.group(3)))
        return
    raise AbiError(f"cannot read the declaration {s[:80]!r}")


def _norm(ctype: str) -> str:
    return re.sub(r"\s*\*\s*", " *", ctype.strip()).replace("* *", "**").strip()


def _enum_values(inner: str, h: Header) -> list:
    if "SF_STATUS_TABLE" in inner:
        return [(n, v) for n, v, _ in h.status]
    if "SF_ACTIVATION_TABLE" in inner:
        return [(n, v) for n, v, _ in h.activations]
    out = []
    for item in (i.strip() for i in inner.split(",")):
        if not item:
            continue
        m = re.fullmatch(r"(\w+) = (-?(?:0x[0-9A-Fa-f]+|\d+))", item)
        if not m:
            raise AbiError(f"an enum value without an explicit number: {item!r}")
        out.append((m.group(1), int(m.group(2), 0)))
    return out


def _struct_fields(inner: str, name: str) -> list:
    fields = []
    for decl in (d.strip() for d in inner.split(";")):
        if not decl:
            continue
        first, *more = decl.split(",")
        ctype, fname, count = _split_decl(first)
        fields.append(Field(fname, ctype, count))
        base = ctype.rstrip(" *")   # `int a, *b`: each declarator brings its stars
        for extra in more:
            ct, fn, cnt = _split_decl(base + " " + extra.strip())
            fields.append(Field(fn, ct, cnt))
    return fields


# ---- ctypes ------------------------------------------------------------------

def _ctypes(ctype: str, h: Header, where: str) -> str:
    """The ctypes expression of a C type (a field's or a parameter's)."""
    arr = re.fullmatch(r"(.*)\[(\d+)\]", ctype)
    if arr:
        return f"{_ctypes(arr.group(1), h, where)} * {arr.group(2)}"
    t = re.sub(r"\bconst\b", "", ctype).replace(" ", "")
    stars = t.count("*")
    base = t.replace("*", "")
    base = {"unsignedint": "unsigned int", "unsignedchar": "unsigned char"}.get(base, base)
    while base in h.aliases:
        base = h.aliases[base]
    if base in h.opaque:
        if stars == 0:
            raise AbiError(f"{where}: an opaque {base} by value")
        return "c_void_p" if stars == 1 else "POINTER(c_void_p)"
    if base in h.enums:
        base = "int"
    if base in h.callbacks:
        if stars:
            raise AbiError(f"{where}: a pointer to a callback")
        return base
    if base == "char" and stars == 1:
        return "c_char_p"
    if base == "char" and stars == 2:
        # const char *const * is an array of strings in; char ** a string out
        return "POINTER(c_char_p)" if "const" in ctype else "POINTER(c_void_p)"
    if base == "void":
        return "None" if stars == 0 else ("c_void_p" if stars == 1 else "POINTER(c_void_p)")
    py = base if base in h.structs else _SCALARS.get(base)
    if py is None:
        raise AbiError(f"{where}: unknown type {ctype!r}")
    for _ in range(stars):
        py = f"POINTER({py})"
    return py


def python_module(h: Header) -> str:
    """sparseforge/_abi.py."""
    out = ['"""The C library\'s binary interface: GENERATED from runtime/sparseforge_runtime.h',
           'and runtime/sparseforge.h by generator/tools/abi.py; edit the headers and run',
           '`python -m sparseforge.generator.tools.abi`, not this file."""',
           "IMPORTS",
           "",
           "# SF_STATUS_TABLE: (name, value, description)",
           "STATUS = ("]
    out += [f"    ({n!r}, {v}, {t!r})," for n, v, t in h.status] + [")", ""]
    out += ["# SF_ACTIVATION_TABLE: (name, value, word)", "ACTIVATIONS = ("]
    out += [f"    ({n!r}, {v}, {t!r})," for n, v, t in h.activations] + [")", ""]
    out += ["# SF_LAUNCH_RECORD_FIELDS: (name, C type, count (0: one value), description)",
            "LAUNCH_RECORD_FIELDS = ("]
    out += [f"    ({f.name!r}, {f.ctype!r}, {f.count}, {f.text!r})," for f in h.launch_fields]
    out += [")", "", "# every enum value and numeric #define", "CONSTANTS = {"]
    consts = dict(h.defines)
    for values in h.enums.values():
        consts.update(values)
    out += [f"    {k!r}: {v}," for k, v in consts.items()] + ["}", ""]
    for name, fields in h.structs.items():
        out.append("")
        out.append(f"class {name}(Structure):")
        out.append("    _fields_ = [")
        for f in fields:
            ct = f.ctype + (f"[{f.count}]" if f.count else "")
            out.append(f"        ({f.name!r}, {_ctypes(ct, h, f'{name}.{f.name}')}),")
        out.append("    ]")
        out.append("")
    out.append("")
    for name, (ret, params) in h.callbacks.items():
        args = ", ".join([_ctypes(ret, h, name)] + [_ctypes(p, h, name) for p in params])
        out.append(f"{name} = CFUNCTYPE({args})")
    out += ["", "# name -> (restype, argtypes)", "PROTOTYPES = {"]
    for name, (ret, params) in h.functions.items():
        args = ", ".join(_ctypes(p, h, name) for p in params)
        out.append(f"    {name!r}: ({_ctypes(ret, h, name)}, [{args}]),")
    out += ["}", ""]
    text = "\n".join(out)
    used = sorted(set(re.findall(r"\b(CFUNCTYPE|POINTER|Structure|c_[a-z0-9_]+)\b",
                                 text.split("IMPORTS", 1)[1])))
    lines, line = [], "from ctypes import ("
    for i, name in enumerate(used):
        piece = name + (")" if i == len(used) - 1 else ", ")
        if len(line) + len(piece.rstrip()) > 99:
            lines.append(line.rstrip())
            line = "                    "
        line += piece
    lines.append(line)
    return text.replace("IMPORTS", "\n".join(lines), 1)


def device_header(h: Header) -> str:
    """templates/include/sf/abi.cuh."""
    rows = ", ".join(f"{n.removeprefix('SF_')} = {v}" for n, v, _ in h.activations)
    return ("// abi.cuh -- the codes the device code shares with the C library: GENERATED\n"
            "// from runtime/sparseforge_runtime.h by generator/tools/abi.py; edit the header\n"
            "// (SF_ACTIVATION_TABLE), not this file.\n"
            "#pragma once\n\n"
            "namespace sf {\n\n"
            "// The fused epilogue's activation (sf_activation).\n"
            f"enum Activation {{ {rows} }};\n\n"
            "}  // namespace sf\n")


def layout_program(h: Header) -> str:
    """A C program printing `struct field offset size` for every field and
    `struct - sizeof` for every struct, to hold the ctypes layouts against
    the compiler's."""
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "sparseforge.h"',
             "int main(void) {"]
    for name, fields in h.structs.items():
        lines.append(f'  printf("{name} - %zu\\n", sizeof({name}));')
        for f in fields:
            lines.append(f'  printf("{name} {f.name} %zu %zu\\n", offsetof({name}, {f.name}), '
                         f"sizeof((({name} *)0)->{f.name}));")
    lines += ["  return 0;", "}", ""]
    return "\n".join(lines)


# ---- the command -------------------------------------------------------------

def checkout_root() -> Path:
    """The source checkout this module sits in (generator/tools/ -> root)."""
    return Path(__file__).resolve().parent.parent.parent


def read(root: Path) -> Header:
    missing = [p for p in HEADERS if not (root / p).exists()]
    if missing:
        raise AbiError(f"{root} is not a sparseforge checkout: {', '.join(missing)} missing")
    return parse([(root / p).read_text() for p in HEADERS])


def outputs(root: Path) -> dict[Path, str]:
    h = read(root)
    return {root / PY_OUT: python_module(h), root / CUH_OUT: device_header(h)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if a checked-in file differs")
    ap.add_argument("--root", type=Path, default=checkout_root(), help="the checkout")
    args = ap.parse_args(argv)
    stale = []
    for path, text in outputs(args.root).items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print("out of date (run python -m sparseforge.generator.tools.abi): " + ", ".join(stale),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
