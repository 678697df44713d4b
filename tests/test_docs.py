"""Every command and code block of README.md and docs/*.md runs, so the docs cannot drift.

Shell blocks run in a sandbox that looks like the checkout (its files linked, the shared data
beside it as ``../shared``) with a small results database already in it (a docs/ block of
plain ``aisafety ...`` lines runs them in this process: ``_in_process``); Python blocks run
there too; plan fragments (YAML/TOML/JSON) are validated as plans with every name and config
built; SQL runs read-only against the sandbox's database. ``<!-- docs-test: ... -->``
directives (tests/docs_blocks.py, documented in docs/architecture.md) mark the blocks that
cannot run here or run reduced in the default suite.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from children import run
from docs_blocks import (
    KNOWN,
    REPO,
    Block,
    all_blocks,
    doc_files,
    outside_fences,
    shell_commands,
    with_limit,
)

SHELL = {"bash", "sh", "shell", "console"}
PLAN = {"yaml", "toml", "json"}
NOT_RUN = {"text", "toml-plugin"}  # diagrams and output samples


def _params() -> list:
    params = []
    for block in all_blocks():
        if block.lang in NOT_RUN:
            continue
        marks = []
        if "skip" in block.directives:
            marks.append(pytest.mark.skip(reason=f"docs-test skip: {block.directives['skip']}"))
        if "slow" in block.directives:
            marks.append(pytest.mark.slow)
        params.append(pytest.param(block, False, id=block.id, marks=marks))
        if "limit" in block.directives:  # reduced in the default suite, as written when slow
            params.append(pytest.param(block, True, id=f"{block.id}-as-written",
                                       marks=[*marks, pytest.mark.slow]))  # fmt: skip
    return params


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory) -> Path:
    """A directory that looks like the checkout, with ./aisafety.db holding eight small runs
    (mnist-cnn and mnist-cnn-pgd-at alternating: ids 1-8, as the docs' examples cite) and
    net.pt, the zoo mnist-cnn as TorchScript."""
    import torch

    from aisafety.config import plan_from_dict
    from aisafety.database.zoo import load_zoo_model
    from aisafety.runner import Runner
    from aisafety.store.results import ResultStore

    root = tmp_path_factory.mktemp("docs")
    checkout = root / "checkout"
    checkout.mkdir()
    for entry in REPO.iterdir():
        if entry.name in {".git", ".venv", "build", "dist"} or entry.suffix == ".db":
            continue
        (checkout / entry.name).symlink_to(entry)
    if (REPO.parent / "shared").is_dir():
        (root / "shared").symlink_to(REPO.parent / "shared")
    network = load_zoo_model("mnist-cnn").network  # normalisation inside: net.pt of the docs
    torch.jit.trace(network, torch.zeros(1, 1, 28, 28)).save(str(checkout / "net.pt"))
    store = ResultStore(f"sqlite:///{checkout / 'aisafety.db'}")
    for i in range(8):
        plan = plan_from_dict({
            "model": {"name": "mnist-cnn-pgd-at" if i % 2 else "mnist-cnn"},
            "dataset": {"name": "mnist-embedded", "limit": 20},
            "attacks": [{"name": "pgd-linf", "config": {"steps": 2}, "eps": [0.1, 0.3]}],
            "metrics": ["ca", "aaw", "ass"],
        })  # fmt: skip
        Runner(plan, store, quiet=True).run()
    return checkout


def _require(block: Block, sandbox: Path) -> None:
    for needed in block.directives.get("requires", "").split():
        if not (sandbox / needed).exists():
            pytest.skip(f"docs-test requires {needed}, which is absent here")


@pytest.mark.parametrize(("block", "as_written"), _params())
def test_block(block: Block, as_written: bool, sandbox: Path, monkeypatch, capsys) -> None:
    _require(block, sandbox)
    if block.lang in SHELL:
        if "synopsis" in block.directives:
            _check_synopsis(block)
        elif (argvs := _in_process(block, as_written)) is not None:
            _run_in_process(block, argvs, sandbox, monkeypatch, capsys)
        else:
            _run_shell(block, sandbox, as_written)
    elif block.lang == "python":
        monkeypatch.chdir(sandbox)
        namespace: dict = {"__name__": "docs_block"}
        exec(compile(block.directives.get("setup", ""), f"{block.id}-setup", "exec"), namespace)
        exec(compile(block.body, block.id, "exec"), namespace)
    elif block.lang in PLAN:
        _check_plan(block)
    elif block.lang == "sql":
        _run_sql(block, sandbox)
    else:
        pytest.fail(
            f"{block.id}: no runner for ```{block.lang or '(no language)'}; give the fence a "
            f"language ({', '.join(sorted(SHELL | PLAN | {'python', 'sql'} | NOT_RUN))})"
        )


def _run_shell(block: Block, sandbox: Path, as_written: bool) -> None:
    commands = shell_commands(block.body)
    if "limit" in block.directives and not as_written:
        commands = [with_limit(c, block.directives["limit"]) for c in commands]
    script = "\n".join(["set -euo pipefail", block.directives.get("setup", ""), *commands])
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    # bash and everything it starts form one process group, killed together on a hang
    done = run(["bash", "-c", script], what=f"the shell block {block.id}", cwd=sandbox,
               env=env, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, (
        f"{block.id} failed (exit {done.returncode}):\n{script}\n"
        f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    )


def _in_process(block: Block, as_written: bool) -> list[list[str]] | None:
    """The argument lists of a docs/ block made only of plain ``aisafety ...`` lines (no
    pipe, chain, redirection, variable or unquoted glob), or None. Those run in this process
    (``aisafety.cli.main``), each sparing a fresh interpreter's imports (~2.5 s idle); what
    the process adds (the console script, a fresh interpreter) is checked by README.md's
    blocks, which always run in bash, and by tests/test_packaging.py."""
    if block.path.name == "README.md" or "setup" in block.directives:
        return None
    commands = shell_commands(block.body)
    if "limit" in block.directives and not as_written:
        commands = [with_limit(c, block.directives["limit"]) for c in commands]
    argvs = []
    for command in commands:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        words = list(lexer)
        if (
            not words
            or words[0] != "aisafety"
            or any(set(w) <= set(lexer.punctuation_chars) for w in words)
            or re.search(r"[$`\\]", command)
            or re.search(r"[*?[~]", re.sub(r"\"[^\"]*\"|'[^']*'", "", command))
        ):
            return None
        argvs.append(shlex.split(command)[1:])
    return argvs


def _run_in_process(block: Block, argvs: list[list[str]], sandbox: Path, monkeypatch,
                    capsys) -> None:  # fmt: skip
    """Each command through ``aisafety.cli.main`` in the sandbox, stopping at the first that
    does not exit 0 (as ``set -e`` does)."""
    from aisafety.cli import main

    monkeypatch.chdir(sandbox)
    for argv in argvs:
        try:
            status = main(argv)
        except SystemExit as exc:  # argparse's usage errors
            status = exc.code
        out = capsys.readouterr()
        assert status == 0, (
            f"{block.id}: aisafety {shlex.join(argv)} exited {status}\n"
            f"--- stdout\n{out.out[-3000:]}\n--- stderr\n{out.err[-3000:]}"
        )


def _check_synopsis(block: Block) -> None:
    """Usage lines: each subcommand exists, each option and listed choice is accepted, and
    a list of choices names them all (README's ``aisafety list`` lacked architectures)."""
    from aisafety.cli import build_parser

    for command in shell_commands(block.body):
        words = command.split()
        assert words[0] == "aisafety", f"{block.id}: a synopsis line starts with aisafety"
        parser, rest = build_parser(), words[1:]
        while parser._subparsers is not None and rest:
            (action,) = [a for a in parser._subparsers._group_actions if a.choices]
            assert rest[0] in action.choices, f"{block.id}: no subcommand {rest[0]!r}"
            parser, rest = action.choices[rest[0]], rest[1:]
        options = {o for a in parser._actions for o in a.option_strings}
        for word in rest:
            for option in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", word):
                assert option in options, f"{block.id}: {command!r}: no option {option}"
        kinds = [set(a.choices) for a in parser._actions if not a.option_strings and a.choices]
        for word in re.sub(r"\[[^]]*\]", "", " ".join(rest)).split():  # optional parts dropped
            if "|" in word:
                listed = set(word.split("|"))
                for choice in listed - set().union(*kinds):
                    pytest.fail(f"{block.id}: {command!r}: no choice {choice!r}")
                for missing in [sorted(c - listed) for c in kinds if c & listed and c - listed]:
                    pytest.fail(f"{block.id}: {command!r}: the choices {missing} are not listed")


def _check_plan(block: Block) -> None:
    from aisafety.interfaces import EvaluationPlan

    texts = block.body.splitlines() if "alternatives" in block.directives else [block.body]
    for text in filter(str.strip, texts):
        text = text.split(" #")[0] if "alternatives" in block.directives else text
        raw = {"toml": tomllib.loads, "json": json.loads}.get(block.lang, yaml.safe_load)(text)
        assert isinstance(raw, dict), f"{block.id}: a plan fragment is a mapping"
        unknown = set(raw) - set(EvaluationPlan.model_fields)
        if block.lang == "toml" and unknown:  # e.g. a plugin's pyproject.toml: parsed only
            continue
        assert not unknown, f"{block.id}: {sorted(unknown)} are not plan fields"
        _build(raw, block)


def _build(raw: dict, block: Block) -> None:
    """The plan validated, and every attack, metric and defense built from it."""
    from aisafety.config import plan_from_dict
    from aisafety.plugins import default_registry
    from aisafety.runner import Runner

    plan = plan_from_dict(raw, block.id)
    registry = default_registry()
    for defense in plan.defenses:
        registry.get("defense", defense.name).Config.model_validate(defense.config)
    if plan.metrics and any(s.name in {"cav", "crr", "csr", "ccv", "cos", "mfr"}
                            for s in plan.metrics) and plan.reference_model is None:  # fmt: skip
        plan = plan.model_copy(update={"reference_model": plan.model})
    Runner(plan, store=None, registry=registry)


def _run_sql(block: Block, sandbox: Path) -> None:
    from aisafety.store.read_only import query_read_only, read_only_engine

    engine = read_only_engine(f"sqlite:///{sandbox / 'aisafety.db'}")
    statements = [s for s in block.body.split(";") if re.sub(r"--[^\n]*", "", s).strip()]
    assert statements, f"{block.id}: an empty SQL block"
    for statement in statements:
        query_read_only(engine, statement)


def test_every_block_has_a_runner_and_known_directives() -> None:
    """A new fence without a language, or a misspelt directive, would silently not run."""
    for block in all_blocks():
        assert block.lang, f"{block.id}: give the fence a language (text for a diagram)"
        unknown = set(block.directives) - KNOWN
        assert not unknown, f"{block.id}: unknown docs-test directive(s) {sorted(unknown)}"
        if "skip" in block.directives:
            assert block.directives["skip"], f"{block.id}: docs-test skip needs a reason"


def test_no_untested_command_outside_fences() -> None:
    """An indented (4-space) command block is not run: fence it (```bash)."""
    for path in doc_files():
        for line, text in outside_fences(path):
            assert not re.match(r"^( {4,}|\t)(\$ )?aisafety ", text), (
                f"{path.relative_to(REPO)}:{line}: an indented command; put it in a ```bash "
                "fence so tests/test_docs.py runs it"
            )


def test_readme_states_the_sample_caps_of_full_yaml() -> None:
    """README's account of examples/full.yaml names each metric that runs on fewer images."""
    plan = yaml.safe_load((REPO / "examples" / "full.yaml").read_text())
    caps = {m["name"]: m["config"]["samples"] for m in plan["metrics"]
            if isinstance(m, dict) and "samples" in m.get("config", {})}  # fmt: skip
    readme = " ".join((REPO / "README.md").read_text().split())
    labels = {"mfr": "mFR", "mfp": "mFP", "ebd": "EBD", "ebd2": "EBD-2"}
    assert caps and set(caps) <= set(labels), caps
    for name, samples in caps.items():
        assert re.search(rf"{re.escape(labels[name])}[^.]*? on {samples}\b", readme), (
            name,
            samples,
        )
    assert "on all 1,000 embedded images" not in readme
