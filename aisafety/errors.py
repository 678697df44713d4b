"""Errors that name the thing, the value and the fix.

Every error the platform raises on purpose derives from ``AISafetyError`` so a caller can
tell "you asked for something impossible" apart from a bug.
"""

from __future__ import annotations

from collections.abc import Iterable


class AISafetyError(Exception):
    """Base class of every deliberate error of the platform."""


class ConfigError(AISafetyError, ValueError):
    """A configuration value is wrong; the message says which and how to fix it."""


class UnknownNameError(ConfigError, KeyError):
    """A name (attack, metric, model, ...) is not registered."""

    def __init__(self, kind: str, name: str, known: Iterable[str]):
        self.kind, self.name, self.known = kind, name, sorted(known)
        super().__init__(
            f"unknown {kind} {name!r}; known {kind}s: {', '.join(self.known) or '(none)'}"
        )

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return self.args[0]


class CapabilityError(AISafetyError):
    """An algorithm needs a predictor capability the model does not offer."""


class InputError(AISafetyError, ValueError):
    """A tensor handed to the platform has the wrong shape, range or values."""


class PluginError(AISafetyError):
    """A plugin is broken or clashes with another one."""


class IntegrityError(AISafetyError):
    """A shipped or downloaded file does not match its recorded checksum."""


class TamperingError(AISafetyError):
    """A model or plugin changed what the run shares (weights, data, cached results)."""


class StoreError(AISafetyError):
    """The results database cannot be read or written (busy, missing, read-only)."""


class ModelOutputError(AISafetyError):
    """A model returned scores of the wrong shape, or NaN/inf scores."""


class AISafetyWarning(UserWarning):
    """A result that would mislead if read at face value; the command line prints it as one
    ``warning: ...`` line on stderr."""


class PluginLoadWarning(AISafetyWarning):
    """A plugin that failed to load, or a class of one that was skipped (a clash, a wrong
    base): the run goes on without it, and the warning is stored with the run."""


class GradientMaskingWarning(AISafetyWarning):
    """An evaluation whose gradient attacks see an obfuscated gradient (defense/obfuscation.py)."""


# The clean pass's checks of the model (evaluation/clean_pass_checks.py), each its own class
# so a stored warning says its kind (run_warnings.category; the report's badge counts them by
# kind); subclasses, so a filter or handler of AISafetyWarning still takes them.
class ClassCountWarning(AISafetyWarning):
    """A model with another number of outputs than the dataset's classes (class_count.py)."""


class NotRepeatableWarning(AISafetyWarning):
    """A model whose outputs differ between two passes of one batch (repeatable.py)."""


class ProbabilityOutputWarning(AISafetyWarning):
    """A model that returns probabilities rather than logits (probabilities.py)."""


class AtChanceWarning(AISafetyWarning):
    """A model whose clean accuracy is at chance: its robust numbers mean little (chance.py)."""


class NormalisedTwiceWarning(AISafetyWarning):
    """A network that normalises its own input, given a mean/std too: it is fed inputs
    normalised twice (prediction/own_normalisation.py)."""


class MemoryBudgetError(AISafetyError):
    """A computation's estimated peak memory is over its budget; raised before any work,
    naming the estimate, the budget and what would fit."""
