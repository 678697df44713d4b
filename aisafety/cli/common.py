"""What several commands share: the registry (imported on first use), its failed plugins
printed once, and where informational lines go."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from aisafety.errors import PluginLoadWarning


def default_registry():
    """The installed plugins (imported on first use: registering them loads torch)."""
    from aisafety.plugins import default_registry as registry

    return registry()


def print_plugin_failures() -> None:
    """The registry loaded, and one ``warning:`` line per failed plugin on stderr: every
    command that runs plans prints them here, the same text, once per command."""
    from aisafety.plugins import failure_warnings

    for line in failure_warnings(default_registry()):
        print(line, file=sys.stderr)


@contextmanager
def plugin_failures_printed() -> Iterator[None]:
    """Around a command's runs, after ``print_plugin_failures``: each run warns the failures
    again so that they are stored with it (run_warnings keeps what the filters hide), and
    without this a command of N runs printed them N + 1 times."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=PluginLoadWarning)
        yield


@contextmanager
def shown_once_per_command() -> Iterator[None]:
    """Around a command of several runs of one plan (compare's models, check's candidate and
    baseline): a warning is shown once for the command, not once per run (check built two
    Runners per model: its plan's warnings showed 4 times), and every run still stores its
    own. The runs' warning logs nest in this one, which shares what was shown
    (aisafety/warning_log.py); what is raised between runs is shown and not stored, as
    before."""
    from aisafety.warning_log import WarningLog, keeping

    with keeping(WarningLog()):
        yield


def info_printer(fmt: str):
    """Where lines around the data go: stdout for a table (read by a person), stderr for
    csv/json, so that stdout redirected to a file is valid CSV or JSON."""
    stream = sys.stdout if fmt == "table" else sys.stderr
    return lambda line: print(line, file=stream)


def write_output(path: str, text: str, option: str) -> Path:
    """``text`` written to ``path`` (its folder made), or one error naming the path, the
    reason and the option to change: a folder or a read-only place was a traceback."""
    from aisafety.errors import ConfigError

    out = Path(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"cannot write {option} {str(out)!r}: {_why_unwritable(out, exc)}; give the path "
            "of a file in a folder you can write"
        ) from None
    return out


def _why_unwritable(out: Path, exc: OSError) -> str:
    """The reason in the user's terms: mkdir under a file says only 'File exists'."""
    if out.is_dir():
        return "it is a folder"
    blocking = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        return f"{str(blocking)!r} is a file, not a folder"
    return exc.strerror or str(exc)
