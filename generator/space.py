"""A family's search space as data: the choices of each configuration key,
named quantities derived from a configuration, and a table of constraints,
each written once as an expression that Python evaluates to filter the
space and that the generator writes into every kernel's source as a
`static_assert`.  So a configuration the search space rejects is one the
compiler rejects too, and the reverse can be tested (tests/py/test_space.py).

Expressions are in a small shared subset of Python and C++ over
non-negative integers and booleans:

    names         configuration keys, problem constants, derived names
    + - * // %    (// is C++'s / on non-negative integers)
    & | << >>     == != < <= > >=   and or not   a if c else b
    x in (1, 2)   cdiv(a, b) (rounding up)   min(a, b)   max(a, b)

A constraint may be marked `device=True`: it depends on the GPU (shared
memory, threads per block) and is checked in Python only, since one kernel
source is compiled for several GPUs.
"""
from __future__ import annotations

import ast
import itertools
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional

_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "/", ast.Mod: "%",
           ast.BitAnd: "&", ast.BitOr: "|", ast.LShift: "<<", ast.RShift: ">>"}
_CMPOPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">",
           ast.GtE: ">="}
_FUNCS = {"cdiv": 2, "min": 2, "max": 2}
# what an expression sees besides its names (built once: a search space
# evaluates tens of thousands of configurations)
_GLOBALS = {"__builtins__": {}, "cdiv": lambda a, b: -(-a // b), "min": min, "max": max}


class ConfigError(ValueError):
    """A configuration that breaks a family's constraints."""


class Expr:
    """One expression of the shared subset, parsed once."""

    def __init__(self, text: str):
        self.text = text
        try:
            self.tree = ast.parse(text, mode="eval").body
        except SyntaxError as e:
            raise ValueError(f"expression {text!r}: {e.msg}") from None
        self.names = set()
        self._check(self.tree)
        self._code = compile(ast.Expression(self.tree), f"<{text}>", "eval")

    def _check(self, n: ast.AST) -> None:
        if isinstance(n, ast.Name):
            self.names.add(n.id)
        elif isinstance(n, ast.Constant):
            if not isinstance(n.value, (bool, int)):
                raise ValueError(f"expression {self.text!r}: only integer constants")
        elif isinstance(n, ast.BinOp) and type(n.op) in _BINOPS:
            self._check(n.left)
            self._check(n.right)
        elif isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.USub, ast.Not)):
            self._check(n.operand)
        elif isinstance(n, ast.BoolOp):
            for v in n.values:
                self._check(v)
        elif isinstance(n, ast.IfExp):
            for v in (n.test, n.body, n.orelse):
                self._check(v)
        elif isinstance(n, ast.Compare) and len(n.ops) == 1:
            self._check(n.left)
            if isinstance(n.ops[0], (ast.In, ast.NotIn)):
                if not (isinstance(n.comparators[0], ast.Tuple) and all(
                        isinstance(e, ast.Constant) for e in n.comparators[0].elts)):
                    raise ValueError(f"expression {self.text!r}: `in` takes a tuple of constants")
            elif type(n.ops[0]) in _CMPOPS:
                self._check(n.comparators[0])
            else:
                raise ValueError(f"expression {self.text!r}: unsupported comparison")
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and \
                _FUNCS.get(n.func.id) == len(n.args) and not n.keywords:
            for a in n.args:
                self._check(a)
        else:
            raise ValueError(f"expression {self.text!r}: {ast.dump(n)[:40]} is outside the "
                             "subset shared with C++")

    def eval(self, env: Mapping) -> int:
        if not self.names <= env.keys():
            raise KeyError(f"expression {self.text!r} needs {sorted(self.names - env.keys())}")
        return eval(self._code, _GLOBALS, env)

    def cpp(self) -> str:
        return self._cpp(self.tree)

    def _cpp(self, n: ast.AST) -> str:
        c = self._cpp
        if isinstance(n, ast.Name):
            return n.id
        if isinstance(n, ast.Constant):
            return ("true" if n.value else "false") if isinstance(n.value, bool) else str(n.value)
        if isinstance(n, ast.BinOp):
            return f"({c(n.left)} {_BINOPS[type(n.op)]} {c(n.right)})"
        if isinstance(n, ast.UnaryOp):
            return f"({'-' if isinstance(n.op, ast.USub) else '!'}{c(n.operand)})"
        if isinstance(n, ast.BoolOp):
            op = " && " if isinstance(n.op, ast.And) else " || "
            return "(" + op.join(c(v) for v in n.values) + ")"
        if isinstance(n, ast.IfExp):
            return f"({c(n.test)} ? {c(n.body)} : {c(n.orelse)})"
        if isinstance(n, ast.Compare):
            left, op = c(n.left), n.ops[0]
            if isinstance(op, (ast.In, ast.NotIn)):
                alts = " || ".join(f"{left} == {c(e)}" for e in n.comparators[0].elts)
                return f"({alts})" if isinstance(op, ast.In) else f"(!({alts}))"
            return f"({left} {_CMPOPS[type(op)]} {c(n.comparators[0])})"
        if isinstance(n, ast.Call):
            a, b = (c(x) for x in n.args)
            if n.func.id == "cdiv":
                return f"(({a} + {b} - 1) / {b})"
            return f"({a} {'<' if n.func.id == 'min' else '>'} {b} ? {a} : {b})"
        raise AssertionError(ast.dump(n))


@dataclass
class Constraint:
    """`rule` must hold (when `when` holds); `message` says what it means."""
    rule: str
    message: str
    when: str = ""
    device: bool = False      # depends on the GPU: Python only

    def __post_init__(self):
        self._rule = Expr(self.rule)
        self._when = Expr(self.when) if self.when else None

    def holds(self, env: Mapping) -> bool:
        return (self._when is not None and not self._when.eval(env)) or bool(self._rule.eval(env))

    def cpp(self) -> str:
        test = self._rule.cpp()
        if self._when is not None:
            test = f"!{self._when.cpp()} || {test}"
        text = f"{self.rule}: {self.message}".replace("\\", "\\\\").replace('"', '\\"')
        return f'static_assert({test}, "{text}");'


@dataclass
class Space:
    """Choices per key, derived quantities and the constraint table of one
    family (or one compute path of a family).

    `choices`: key -> the values the search enumerates (a key absent from a
    configuration takes `defaults[key]`).  `derived`: name -> expression,
    in order (each may use the ones before).  A configuration is checked in
    an environment of the problem's constants (shape, tile rows, layout...),
    the configuration and the derived names."""
    choices: dict
    constraints: list
    derived: dict = field(default_factory=dict)
    defaults: dict = field(default_factory=dict)
    # key -> its words: a key whose values are words (e.g. csr's tables) is
    # the word's index in expressions, and each word is a constant
    # <key>_<word> (tables_imm == 2)
    enums: dict = field(default_factory=dict)

    def __post_init__(self):
        self._derived = [(name, Expr(text)) for name, text in self.derived.items()]
        self._enum_consts = {f"{key}_{word}": i for key, words in self.enums.items()
                             for i, word in enumerate(words)}

    def _value(self, key: str, v):
        if key in self.enums:
            if v not in self.enums[key]:
                raise ConfigError(f"{key}: must be one of {self.enums[key]}, got {v!r}")
            return self.enums[key].index(v)
        return int(v) if isinstance(v, bool) else v

    def env(self, config: Mapping, problem: Mapping, device: Optional[Mapping] = None) -> dict:
        env = dict(problem)
        env.update(self._enum_consts)
        env.update(self.defaults)
        env.update({k: self._value(k, v) for k, v in config.items()})
        for name, expr in self._derived:
            try:
                env[name] = expr.eval(env)
            except ZeroDivisionError:
                raise ConfigError(f"{name} = {expr.text} divides by zero "
                                  f"({', '.join(f'{k}={v}' for k, v in sorted(config.items()))})"
                                  ) from None
        env.update(device or {})
        return env

    def violations(self, config: Mapping, problem: Mapping,
                   device: Optional[Mapping] = None) -> list:
        """The constraints `config` breaks; the device ones only when the
        device's constants are given."""
        return list(self._broken(config, problem, device))

    def _broken(self, config: Mapping, problem: Mapping, device: Optional[Mapping]):
        env = self.env(config, problem, device)
        return (c for c in self.constraints
                if (device is not None or not c.device) and not c.holds(env))

    def check(self, config: Mapping, problem: Mapping, device: Optional[Mapping] = None) -> None:
        """Raises ConfigError naming the first broken constraint."""
        c = next(self._broken(config, problem, device), None)   # (the rest unevaluated)
        if c is not None:
            shown = ", ".join(f"{k}={v}" for k, v in sorted(config.items()))
            raise ConfigError(f"{c.rule}: {c.message} ({shown})")

    def enumerate(self, keys: Optional[Iterable[str]] = None, fixed: Optional[Mapping] = None):
        """Every combination of the choices of `keys` (default: all), with
        `fixed` values added: unchecked configurations."""
        keys = list(keys if keys is not None else self.choices)
        fixed = dict(fixed or {})
        for values in itertools.product(*(self.choices[k] for k in keys)):
            cfg = dict(zip(keys, values))
            cfg.update(fixed)
            yield cfg

    def static_asserts(self, config: Mapping, problem: Mapping, source: str) -> str:
        """C++ that restates the configuration, the problem's constants and
        the derived quantities as constants and asserts every constraint that
        is not a device one (the source must not depend on the GPU);
        `source` names the table in the comment."""
        env = self.env(config, problem)
        names = list(problem) + list(self._enum_consts) + \
            [k for k in self.defaults if k not in problem] + \
            [k for k in config if k not in problem and k not in self.defaults]
        lines = [f"// The configuration's constraints, GENERATED from {source}: the search",
                 "// space filters with the same table, so what it emits compiles and what it",
                 "// rejects does not.",
                 "struct sf_constraints {"]
        for name in names:
            lines.append(f"  static constexpr long long {name} = {int(env[name])};")
        for name, expr in self._derived:
            lines.append(f"  static constexpr long long {name} = {expr.cpp()};")
        for c in self.constraints:
            if not c.device:
                lines.append("  " + c.cpp())
        lines.append("};")
        return "\n".join(lines)
