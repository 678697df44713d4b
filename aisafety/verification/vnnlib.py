"""VNN-LIB properties (VNN-COMP): an input box and a disjunction of output violations.

Supported, as in the VNN-COMP 2021 MNIST and CIFAR benchmarks: ``declare-const`` of ``X_i``
and ``Y_j``; ``assert`` of bounds ``(<= X_i c)`` / ``(>= X_i c)`` (possibly inside ``and``);
and output assertions, each atom comparing two outputs or an output and a constant, in one
of two forms: one ``or`` of ``and``s (or one atom), or several asserted atoms (SMT-LIB
conjoins asserts: Marabou's targeted properties ``Y_t >= Y_j`` for every j).

The property is *violated* (``sat``) when, at some input in the box, every atom of some
disjunct holds. Each atom ``g(Y) >= 0`` becomes a spec row ``-g(Y) > 0``; ``read_vnnlib``
returns the common case (every disjunct one atom: all rows must stay positive) as a
``Property``, ``read_disjuncts`` any of the forms as a box and the rows of each disjunct.
Anything else (several input boxes, an ``or`` beside other output asserts) is a
``VerificationError`` naming the file and the construct.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from aisafety.files import GIB, regular_file
from aisafety.verification.graph import VerificationError
from aisafety.verification.property import Property

TOKEN = re.compile(r"\(|\)|[^\s()]+")
VARIABLE = re.compile(r"^([XY])_(\d+)$")
MAX_PROPERTY_BYTES = GIB  # read whole; VNN-COMP's largest properties are tens of MB


def _parse(text: str) -> list:
    """The s-expressions of ``text`` (comments removed) as nested lists of strings."""
    text = "\n".join(line.split(";", 1)[0] for line in text.splitlines())
    stack: list[list] = [[]]
    for token in TOKEN.findall(text):
        if token == "(":
            stack.append([])
        elif token == ")":
            if len(stack) == 1:
                raise ValueError("unbalanced ')'")
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append(token)
    if len(stack) != 1:
        raise ValueError("unbalanced '('")
    return stack[0]


def read_vnnlib(
    path: str | Path, n_inputs: int, n_outputs: int, network: str = "the network"
) -> Property:
    """The property of a ``.vnnlib`` file as a one-sample ``Property`` over flat inputs."""
    box, disjuncts = read_disjuncts(path, n_inputs, n_outputs, network)
    if any(len(rows) != 1 for rows in disjuncts):
        raise VerificationError(
            f"VNN-LIB file {Path(path).name!r}: a conjunction of several output constraints in "
            "one disjunct is not supported here; read it with read_disjuncts"
        )
    spec = torch.stack([rows[0][0] for rows in disjuncts]).unsqueeze(0)
    offset = torch.tensor([[rows[0][1] for rows in disjuncts]], dtype=torch.float64)
    return Property(box[0].unsqueeze(0), box[1].unsqueeze(0), spec, offset)


Row = tuple[torch.Tensor, float]


def read_disjuncts(
    path: str | Path, n_inputs: int, n_outputs: int, network: str = "the network"
) -> tuple[tuple[torch.Tensor, torch.Tensor], list[list[Row]]]:
    """The input box (lower, upper) and, per disjunct, its spec rows (c, d): the property is
    violated where, for some disjunct, ``c.Y + d <= 0`` for all its rows. ``network``: the
    network's name, for the refusal of a property declaring other input or output counts."""
    path = regular_file(path, "VNN-LIB file", MAX_PROPERTY_BYTES)  # not a folder or a FIFO
    try:
        expressions = _parse(path.read_text())
    except UnicodeDecodeError:
        raise VerificationError(
            f"VNN-LIB file {path.name!r} is not text (a binary file: a network given as the "
            "property?); the command is aisafety verify NET.onnx SPEC.vnnlib"
        ) from None
    except ValueError as exc:
        raise VerificationError(f"VNN-LIB file {path.name!r} is malformed: {exc}") from None
    if not any(isinstance(e, list) and e and e[0] == "assert" for e in expressions):
        raise VerificationError(
            f"VNN-LIB file {path.name!r} asserts nothing (empty, or only declarations): a "
            "property bounds every input X_i and asserts the outputs' violation"
        )
    _check_declared(expressions, path.name, {"X": n_inputs, "Y": n_outputs}, network)
    lower = torch.full((n_inputs,), float("-inf"), dtype=torch.float64)
    upper = torch.full((n_inputs,), float("inf"), dtype=torch.float64)
    disjuncts: list[list[Row]] = []
    asserted: list[Row] = []  # top-level atoms, conjoined

    def fail(what: str) -> VerificationError:
        return VerificationError(f"VNN-LIB file {path.name!r}: {what} is not supported")

    def term(token) -> tuple[torch.Tensor, float]:
        """An output term as (coefficients, constant)."""
        coeff = torch.zeros(n_outputs, dtype=torch.float64)
        if isinstance(token, str) and (m := VARIABLE.match(token)) and m[1] == "Y":
            index = int(m[2])
            if index >= n_outputs:
                raise fail(f"output Y_{index} (the network has {n_outputs})")
            coeff[index] = 1.0
            return coeff, 0.0
        try:
            return coeff, float(token)
        except (TypeError, ValueError):
            raise fail(f"the term {token!r}") from None

    def output_atom(atom) -> tuple[torch.Tensor, float]:
        """Spec row (c, d) with c.Y + d > 0 exactly where the violation atom fails."""
        if not (isinstance(atom, list) and len(atom) == 3 and atom[0] in ("<=", ">=")):
            raise fail(f"the output constraint {atom!r}")
        (a, ca), (b, cb) = term(atom[1]), term(atom[2])
        g, g0 = (a - b, ca - cb) if atom[0] == ">=" else (b - a, cb - ca)  # g.Y + g0 >= 0
        return -g, -g0

    def input_bound(atom) -> bool:
        if not (isinstance(atom, list) and len(atom) == 3 and atom[0] in ("<=", ">=")):
            return False
        for var, const, op in ((atom[1], atom[2], atom[0]), (atom[2], atom[1], _flip(atom[0]))):
            if isinstance(var, str) and (m := VARIABLE.match(var)) and m[1] == "X":
                index = int(m[2])
                if index >= n_inputs:
                    raise fail(f"input X_{index} (the network takes {n_inputs})")
                value = float(const)
                if op == "<=":
                    upper[index] = min(float(upper[index]), value)
                else:
                    lower[index] = max(float(lower[index]), value)
                return True
        return False

    for expression in expressions:
        if not isinstance(expression, list) or not expression:
            continue
        if expression[0] == "declare-const":
            continue
        if expression[0] != "assert":
            raise fail(f"the command {expression[0]!r}")
        body = expression[1]
        atoms = body[1:] if isinstance(body, list) and body[0] == "and" else [body]
        if all(input_bound(atom) for atom in atoms):
            continue
        if isinstance(body, list) and body[0] == "or":
            if disjuncts:
                raise fail("more than one 'or' of output constraints")
            for disjunct in body[1:]:
                is_and = isinstance(disjunct, list) and disjunct[0] == "and"
                disjuncts.append([output_atom(a) for a in (disjunct[1:] if is_and else [disjunct])])
        else:
            asserted += [output_atom(atom) for atom in atoms]
    if disjuncts and asserted:
        raise fail("an 'or' of output constraints beside other asserted output constraints")
    if not torch.isfinite(lower).all() or not torch.isfinite(upper).all():
        missing = int((~torch.isfinite(lower) | ~torch.isfinite(upper)).sum())
        raise fail(f"an input box missing bounds on {missing} input(s)")
    if asserted:
        disjuncts = [asserted]
    if not disjuncts or not all(disjuncts):
        raise fail("a property without output constraints")
    return (lower, upper), disjuncts


def _check_declared(expressions: list, name: str, counts: dict[str, int], network: str) -> None:
    """A property declares the variables of the network it was written for: ``Y_0..Y_9`` of
    a 10-class net. Paired with another network of the same input size, its atoms would read
    the first of that network's outputs, and the answer would be about another question; so
    declared counts that differ from the network's are refused. A file declaring none of a
    kind is checked by use only (an index beyond the network's is refused where it is read)."""
    declared: dict[str, set[int]] = {"X": set(), "Y": set()}
    for expression in expressions:
        name_of = expression[1] if isinstance(expression, list) and len(expression) > 1 else None
        is_declaration = isinstance(name_of, str) and expression[0] == "declare-const"
        if is_declaration and (m := VARIABLE.match(name_of)):
            declared[m[1]].add(int(m[2]))
    for kind, what, verb in (("X", "inputs", "takes"), ("Y", "outputs", "has")):
        found, wanted = len(declared[kind]), counts[kind]
        if found and found != wanted:
            raise VerificationError(
                f"VNN-LIB file {name!r} declares {found} {what} ({kind}_0 .. "
                f"{kind}_{max(declared[kind])}), but {network} {verb} {wanted}: the property "
                "was written for another network. Verify it with the network it was written "
                "for (a VNN-COMP benchmark's instances.csv pairs each property with its "
                f"network), or write one with {wanted} {what}"
            )


def _flip(op: str) -> str:
    return "<=" if op == ">=" else ">="
