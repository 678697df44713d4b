"""The aisafety command line: evaluate a classifier's robustness, store it, report it.

One module per command (``add_parser`` and the command function); what they compute lives
in the library. Heavy modules (torch, SQLAlchemy, the plugins) are imported inside the
commands that need them: `aisafety --help` and a cached `aisafety list` start in a fraction
of a second (bench/startup.py; tests/test_startup.py keeps torch out of these imports).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shlex
import sys
import warnings
from collections.abc import Callable, Sequence

from aisafety.cli import check, compare, evaluate, plugins, query, report, serve, verify, zoo
from aisafety.cli import list as list_command
from aisafety.command_clock import command_clock
from aisafety.errors import AISafetyError, AISafetyWarning
from aisafety.store.interruption import end_process_on_hang, terminate_as_interrupt


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aisafety", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    evaluate.add_parser(sub)
    compare.add_parser(sub)
    check.add_parser(sub)  # the release gate (docs/release-gate.md)
    for command in (list_command, plugins, query, report, serve, verify, zoo):
        command.add_parser(sub)
    return parser


def format_warning(message, category, filename, lineno, line=None) -> str:
    """Our own warnings as one ``warning: ...`` line; others as Python prints them."""
    if issubclass(category, AISafetyWarning):
        return f"warning: {message}\n"
    return PYTHON_FORMAT_WARNING(message, category, filename, lineno, line)


PYTHON_FORMAT_WARNING = warnings.formatwarning


def above_bars(show: Callable[..., None]) -> Callable[..., None]:
    """``show`` (a ``warnings.showwarning``) with the open progress bars cleared before and
    drawn again after, as ``tqdm.write`` does for the unit lines: written straight to stderr,
    a warning raised mid-attack landed on the bar's line (session 21, an ImageNet run)."""

    def shown(message, category, filename, lineno, file=None, line=None) -> None:
        from tqdm import tqdm  # here: a command that warns has loaded it (startup stays light)

        with tqdm.external_write_mode(file=file if file is not None else sys.stderr):
            show(message, category, filename, lineno, file, line)

    return shown


def db_option(args: argparse.Namespace) -> str:
    """`` --db URL`` (password masked) for a command to suggest, unless the default: without
    it the suggested command reads ./aisafety.db, not the database the run went to."""
    from aisafety.store import DEFAULT_URL
    from aisafety.store.engine import shown_url

    db = getattr(args, "db", None)
    return "" if db in (None, DEFAULT_URL) else f" --db {shlex.quote(shown_url(db))}"


def output_closed() -> int:
    """141 (128 + SIGPIPE, as a shell's own tools end), and stdout pointed at /dev/null so
    that flushing it at exit does not raise again (Python's docs, "Note on SIGPIPE"). What
    a run had finished is in the database already."""
    with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):  # no descriptor
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 141


def main(argv: Sequence[str] | None = None) -> int:
    warnings.formatwarning = format_warning
    shown = warnings.showwarning
    warnings.showwarning = above_bars(shown)  # it calls the one in place (pytest's recorder)
    try:
        return command(argv)
    finally:
        warnings.showwarning = shown


def command(argv: Sequence[str] | None) -> int:
    """The command's exit status; a user's mistake is one ``error:`` line, no traceback."""
    args = build_parser().parse_args(argv)
    args.whole_process = argv is None  # the console script: this process is the command's
    try:
        # SIGTERM/SIGHUP from the first moment (loading a model can take a while): the
        # command ends as Ctrl-C does, 130 and 'interrupted', not killed with 143
        clock = command_clock(whole_process=args.whole_process)
        with terminate_as_interrupt(), clock, end_process_on_hang():
            return args.func(args)
    except AISafetyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`aisafety query ... | head`): no traceback
        return output_closed()
    except KeyboardInterrupt:
        print(
            "interrupted: finished units are in the database; rerun with --resume", file=sys.stderr
        )
        return 130
    except Exception as exc:
        failed_in = getattr(exc, "failed_in", None)  # set by the runner on a plugin's crash
        if failed_in is None:
            raise
        print(
            f"error: {failed_in} raised {type(exc).__name__}: {exc} (a bug in it, or in the "
            "model; the run is marked failed, and the traceback is stored in unit_failures: "
            f'aisafety query "SELECT error FROM unit_failures"{db_option(args)}; --resume '
            "computes the unit again)",
            file=sys.stderr,
        )
        return 2
