"""The Attack base class: configuration at construction, budgets at call time.

Subclasses implement ``perturb(predictor, x, y, eps, call)``; the instance holds only its
configuration, and what varies per call (random streams, clean logits, targets, which samples)
arrives in ``call`` (``aisafety.attack.call.AttackCall``). The base class checks the model's
capabilities and the inputs, computes the clean logits once, hands ``perturb`` only the
samples still to do (query attacks skip those the model already gets wrong), projects
whatever ``perturb`` returns back into the budget and the [0, 1] box, and re-evaluates the
model itself, so no attack can report a success that is over budget or that the model does
not confirm; a sample the model gets wrong clean stays broken (``keep_clean_mistakes``).
With ``precision`` bf16/fp16 (``aisafety.attack.precision``) ``perturb`` searches with an
autocast view of the model; that final evaluation stays fp32. For every attack,
plugins included, ``perturb`` works on its own copies of the inputs (writing into them changes
nothing outside), and its result must have the inputs' shape, dtype and device (nothing is
broadcast), one step count per sample and no NaN or inf: otherwise a ``PluginError`` names
the attack and what is wrong.
"""

from __future__ import annotations

import inspect
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, final

import torch
from pydantic import Field
from tqdm import tqdm

from aisafety import randomness
from aisafety.attack.call import AttackCall
from aisafety.attack.layout import channels_last_view, copy_bytes
from aisafety.attack.precision import (
    ReducedPrecision,
    autocast_applies,
    compute_dtype,
    search_layout,
)
from aisafety.attack.projection import project
from aisafety.attack.result import AttackResult
from aisafety.attack.streams import SampleStreams
from aisafety.attack.threat import THREATS, ThreatModel, threat_model
from aisafety.attack.work import counted
from aisafety.config_base import PluginConfig, build_config
from aisafety.errors import InputError, MemoryBudgetError, PluginError
from aisafety.interfaces import AttackFamily, Capability, Norm, Precision, Seed
from aisafety.memory import reuse_freed_memory
from aisafety.memory_budget import current_budget, fitting
from aisafety.memory_budget import size as size_text
from aisafety.prediction.base import Predictor
from aisafety.prediction.footprint import image_bytes

# On CPU, chunks of 128 were the fastest or within 10 % of it in bench/attacks.py on 2 cores
# (up to 1.2x per image over a batch of 512); on a GPU the whole batch is fastest.
CPU_CHUNK = 128
# copies of the whole input a call holds beside its chunk: the chunks' adversarial examples
# and, while they are concatenated, the result's inputs and examples (AttackResult.concat);
# 3, and measured 3.5 with the heap's fragmentation (FGSM, 192 images at 224x224)
RESULT_COPIES = 4
_ADVICE = (
    "raise 'limits: {memory_gib: ...}' in the plan if the machine has the memory, or run "
    "a smaller model or input size, or fewer images per call (the result holds "
    f"{RESULT_COPIES} copies of them)"
)


class AttackConfig(PluginConfig):
    seed: Seed = 0  # as the plan's: a non-negative integer (seed: -1 was accepted here only)
    chunk_size: int | None = Field(
        default=None,
        gt=0,
        description="split larger batches into chunks of this size; "
        f"default {CPU_CHUNK} on CPU (1024 for Square), the whole batch on GPU",
    )
    precision: Precision = Field(
        default="fp32",
        description="arithmetic of the model passes in the search: fp32, bf16, fp16, or auto "
        "(the fastest the device has); successes are always re-checked in fp32",
    )


class Attack(ABC):
    """An adversarial attack; ``attack(predictor, x, y, eps)`` returns an ``AttackResult``.

    A subclass implements ``perturb(predictor, x, y, eps, call)`` and sets class attributes;
    ``__call__`` is final (the checks live there). The attributes that change what is
    stored, each checked for every registered attack by ``tests/test_contract.py``:

    - ``norm``: the budget's geometry; every result is projected into it (and the box).
    - ``family``: which attack metrics read the results (``AttackMetric.attack_families``).
    - ``requires``: the predictor capability checked before any work.
    - ``chunk_independent``: True promises each sample's result is the same whatever the
      chunking; False makes the runner key its units by the plan's batch size, so another
      batch size is another unit on ``--resume``.
    - ``cpu_chunk``: the chunk size on CPU when neither the call nor ``chunk_size`` says.
    - ``skips_misclassified``: samples the model already gets wrong (all at eps 0) are
      stored clean with 0 steps.
    - ``targeted``: ``perturb`` honours ``call.target``; otherwise a call with targets is an
      ``InputError``.
    """

    name: ClassVar[str]
    family: ClassVar[AttackFamily]
    norm: ClassVar[Norm | None]
    requires: ClassVar[Capability]
    description: ClassVar[str] = ""
    Config: ClassVar[type[AttackConfig]] = AttackConfig
    # default chunk on CPU; query attacks whose samples drop out as they succeed (Square) set
    # a larger one: each chunk runs its own long tail of tiny batches for its hardest samples
    cpu_chunk: ClassVar[int] = CPU_CHUNK
    # whether ``perturb`` honours ``call.target`` (moves each sample towards its target class)
    targeted: ClassVar[bool] = False
    # query attacks spend no query on a sample the model already gets wrong (nor at eps 0):
    # the base class leaves such samples clean with 0 steps
    skips_misclassified: ClassVar[bool] = False
    # whether a sample's result is the same whatever the chunking: true of an attack that
    # draws only from ``call.streams`` (one stream per sample) for exactly the samples it
    # works on. The built-in attacks are; a plugin that says nothing is taken not to be, and
    # the runner keys its units by the batch size (so another chunking is another unit,
    # never mixed with this one)
    chunk_independent: ClassVar[bool] = False
    # plugins written for the older ``perturb(predictor, x, y, eps)`` get no ``call``
    # (deprecated: a DeprecationWarning when such a class is defined)
    _takes_call: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        if "__call__" in vars(cls):
            raise PluginError(
                f"attack class {cls.__module__}.{cls.__qualname__} overrides __call__, which "
                "owns the checks every attack gets (inputs, budget projection, the final fp32 "
                "re-evaluation); implement perturb(predictor, x, y, eps, call) instead"
            )
        parameters = inspect.signature(cls.perturb).parameters
        cls._takes_call = "call" in parameters or len(parameters) > 5
        if not cls._takes_call:
            warnings.warn(
                f"attack class {cls.__module__}.{cls.__qualname__} defines the older "
                "perturb(predictor, x, y, eps); add the fifth parameter, call (an AttackCall: "
                "random streams, clean logits, targets): perturb(predictor, x, y, eps, call). "
                "The four-parameter form will stop working in a later version",
                DeprecationWarning,
                stacklevel=2,
            )

    def __init__(self, config: dict[str, Any] | None = None, **overrides: Any):
        self.config = build_config(
            f"attack {self.name!r}", self.Config, {**(config or {}), **overrides}
        )
        self._check_norm()

    def _check_norm(self) -> None:
        """Every attack declares the norm of its budget, so that the base class can project
        what it returns into that budget (nothing escapes the check)."""
        norm = getattr(self, "norm", None)
        if norm in THREATS:
            return
        raise PluginError(
            f"attack {self.name!r} ({type(self).__module__}.{type(self).__qualname__}) declares "
            f"norm {norm!r}; every attack must declare the norm of its budget, one of "
            f"{', '.join(f'Norm.{n.name}' for n in THREATS)} (from aisafety.interfaces), e.g. "
            "'norm = Norm.LINF' in the class body, so that its results are projected into "
            "the budget"
        )

    @classmethod
    def describe(cls) -> dict[str, Any]:
        return {
            "name": cls.name,
            "family": cls.family.value,
            "norm": cls.norm.value if cls.norm else None,
            "requires": cls.requires.value,
            "targeted": cls.targeted,
            "description": cls.description,
        }

    @property
    def threat(self) -> ThreatModel:
        """The geometry of this attack's budget (projection, random start, ascent)."""
        if self.norm is None:
            raise TypeError(f"attack {self.name!r} declares no norm, so it has no threat model")
        return threat_model(self.norm)

    def random_seed(self) -> int:
        """The seed of each call's random stream."""
        return self.config.seed

    @abstractmethod
    def perturb(
        self,
        predictor: Predictor,
        x: torch.Tensor,
        y: torch.Tensor,
        eps: float,
        call: AttackCall,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return candidate adversarial inputs and the steps (or queries) spent per sample."""

    @final
    def __call__(
        self,
        predictor: Predictor,
        x: torch.Tensor,
        y: torch.Tensor,
        eps: float,
        chunk_size: int | None = None,
        progress: bool = False,
        clean_logits: torch.Tensor | None = None,
        target: torch.Tensor | None = None,
        todo: torch.Tensor | None = None,
        samples: torch.Tensor | None = None,
    ) -> AttackResult:
        """Attack ``x`` at budget ``eps``, in chunks; each sample draws from its own stream.

        ``clean_logits``: the model's logits on ``x`` where the caller has them already (an
        evaluation computes them once for every attack and budget); without them each chunk
        spends one forward pass on the clean batch. ``target``: a class per sample to move
        towards (attacks with ``targeted``); ``todo``: a boolean mask of the samples to attack
        (the others come back unchanged with 0 steps); ``samples``: the index of each input
        in the caller's batch, which seeds its random stream (default ``0..n-1``; an attack
        that runs others on some of its samples passes theirs on).
        """
        self._check_norm()
        predictor.require(self.requires, f"attack {self.name!r}")
        self._check(predictor, x, y, eps)
        self._check_clean_logits(predictor, x, clean_logits)
        self._check_target(predictor, y, target)
        self._check_todo(x, todo)
        self.search_predictor(predictor)  # a precision the device lacks fails before any work
        size = chunk_size or self.config.chunk_size
        if size is None:
            size = self.cpu_chunk if predictor.device.type == "cpu" else len(x)
        held = RESULT_COPIES * x.numel() * max(4, x.element_size())
        held += self.search_copy_bytes(predictor)
        size = self._budget_chunk(predictor, min(size, max(1, len(x))), held)
        generator = randomness.generator(self.random_seed())
        if samples is None:
            samples = torch.arange(len(x))
        elif tuple(samples.shape) != (len(x),):
            raise InputError(
                f"attack {self.name!r}: samples must hold one index per input, shape "
                f"({len(x)},), got {tuple(samples.shape)}"
            )
        samples = samples.cpu()

        def split(values: torch.Tensor | None) -> list[torch.Tensor | None]:
            return list(values.split(size)) if values is not None else [None] * len(x)

        chunks = list(
            zip(
                x.split(size),
                y.split(size),
                samples.split(size),
                split(clean_logits),
                split(target),
                split(todo),
                strict=False,
            )
        )
        with reuse_freed_memory():  # every step frees and allocates the same tensors
            parts = [
                self._attack_chunk(predictor, xc, yc, eps, generator, *rest)
                for xc, yc, *rest in tqdm(
                    (chunks[i] for i in counted("batch", len(chunks))),
                    total=len(chunks), desc=f"{self.name} eps={eps:g}", disable=not progress,
                )
            ]  # fmt: skip
        return parts[0] if len(parts) == 1 else AttackResult.concat(parts)

    def passes_per_image(self) -> tuple[int, int]:
        """(forward-and-backward, forward-only) model passes of one image each input holds at
        once: the memory of one input (a query attack's population counts here)."""
        return (1, 0) if self.requires is Capability.GRADIENTS else (0, 1)

    def image_memory(self, predictor: Predictor) -> int:
        """Estimated bytes one input of a chunk holds at the attack's peak."""
        grad, forward = self.passes_per_image()
        return grad * image_bytes(predictor, True) + forward * image_bytes(predictor, False)

    def _budget_chunk(self, predictor: Predictor, size: int, held: int = 0) -> int:
        """``size``, or fewer images per chunk where that many would not fit the memory
        budget (``memory_budget.py``) beside the ``held`` bytes of the whole call's result;
        refused before any work where one image does not fit, or where a smaller chunk
        would change the results (not ``chunk_independent``)."""
        one = self.image_memory(predictor)
        what = (
            f"attack {self.name!r} on model {predictor.name!r} (one image of shape "
            f"{tuple(predictor.input_shape)})"
        )
        fits = fitting(what, one, size, _ADVICE, predictor.device, fixed=held)
        if fits < size and not self.chunk_independent:
            budget = size_text(current_budget(predictor.device))
            need = size_text(one * size + held)
            raise MemoryBudgetError(
                f"{what}: a chunk of {size} images needs about {need}, over "
                f"the memory budget of {budget}, and this attack's results depend on its "
                f"chunking; set its chunk_size: {fits} (fits), or {_ADVICE}"
            )
        return fits

    def search_predictor(
        self, predictor: Predictor, probe: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> Predictor:
        """The predictor ``perturb`` searches with: ``predictor`` itself, or a view of it
        under autocast when the ``precision`` option asks for a reduced precision (a
        ConfigError where the device has no fast unit for it, or, asked by name, where
        autocast would not reach the model: ONNX Runtime, a server, a float64 network;
        ``autocast_applies``). With ``probe`` (an image and
        its fp32 logits), a convolutional network runs channels-last where
        ``search_layout`` says so and a copy in that layout reproduces the probe."""
        dtype = self._search_dtype(predictor)
        if dtype is None:
            return predictor
        if probe is not None and search_layout(predictor.device, dtype) is torch.channels_last:
            predictor = channels_last_view(predictor, *probe)
        return ReducedPrecision(predictor, dtype)

    def _search_dtype(self, predictor: Predictor) -> torch.dtype | None:
        """The autocast dtype of the search on ``predictor`` (None: fp32, the predictor itself)."""
        precision = getattr(self.config, "precision", "fp32")
        owner = f"attack {self.name!r}"
        dtype = compute_dtype(precision, predictor.device, owner)
        if dtype is None or not autocast_applies(precision, predictor, owner):
            return None
        return dtype

    def search_copy_bytes(self, predictor: Predictor) -> int:
        """Bytes of the network copy each chunk's search runs beside the predictor's own
        (channels-last, ``layout.py``): held on the model's device while the chunk is
        attacked, so counted in the call's budget; 0 where the search runs the model."""
        dtype = self._search_dtype(predictor)
        if dtype is None or search_layout(predictor.device, dtype) is not torch.channels_last:
            return 0
        return copy_bytes(predictor)

    def _attack_chunk(
        self,
        predictor: Predictor,
        x: torch.Tensor,
        y: torch.Tensor,
        eps: float,
        generator: torch.Generator,
        samples: torch.Tensor,
        clean_logits: torch.Tensor | None,
        target: torch.Tensor | None,
        todo: torch.Tensor | None,
    ) -> AttackResult:
        started = time.perf_counter()
        x, y, clean_logits = self._chunk_inputs(predictor, x, y, clean_logits)
        device = predictor.device
        if target is not None:
            target = target.to(device, torch.long)
        # the attack's own copies: whatever it writes into them stays there
        streams = SampleStreams(self.random_seed(), samples, device)
        call = AttackCall(generator, samples.to(device), clean_logits.clone(), target, streams)
        todo = None if todo is None else todo.to(device)
        searcher = self.search_predictor(predictor, probe=(x[:1], clean_logits[:1]))
        candidate, steps = self.perturb_todo(searcher, x.clone(), y.clone(), eps, call, todo)
        candidate, steps = self._checked_output(candidate, steps, x)
        x_adv, adv_logits = self._final_check(predictor, candidate.detach(), x, eps)
        x_adv, adv_logits = keep_clean_mistakes(x, y, clean_logits, x_adv, adv_logits)
        return AttackResult(
            attack=self.name,
            eps=eps,
            norm=self.norm,
            x=x,
            x_adv=x_adv,
            y=y,
            clean_logits=clean_logits,
            adv_logits=adv_logits,
            success=adv_logits.argmax(1) != y,
            steps=steps.to(torch.long),
            seconds=time.perf_counter() - started,
            target=target,
        )

    @staticmethod
    def _chunk_inputs(
        predictor: Predictor, x: torch.Tensor, y: torch.Tensor, clean_logits: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A chunk's inputs on the predictor's device, with its clean logits (one forward
        pass where the caller has none)."""
        device = predictor.device
        x, y = x.to(device), y.to(device, torch.long)
        with torch.no_grad():
            if clean_logits is None:
                clean_logits = forward(predictor, x)
            clean_logits = clean_logits.to(device)
        return x, y, clean_logits

    def _final_check(
        self, predictor: Predictor, candidate: torch.Tensor, x: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The candidate put into the budget and its logits, always with the fp32 predictor:
        a candidate found under reduced precision counts only where the model in fp32
        misclassifies it too."""
        x_adv = project(candidate, x, eps, self.norm)
        with torch.inference_mode():
            return x_adv, forward(predictor, x_adv)

    def perturb_todo(
        self,
        predictor: Predictor,
        x: torch.Tensor,
        y: torch.Tensor,
        eps: float,
        call: AttackCall,
        todo: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``perturb`` on the samples still to do; the others stay clean with 0 steps.

        The samples to do are those in ``todo`` (all by default) and, for an attack that
        ``skips_misclassified``, only those the model classifies correctly (none at eps 0).
        """
        if self.skips_misclassified:
            correct = call.clean_logits.argmax(1) == y
            if eps == 0:
                correct = torch.zeros_like(correct)
            todo = correct if todo is None else todo & correct
        if todo is None:
            return self._perturb(predictor, x, y, eps, call)
        rows = torch.nonzero(todo).squeeze(1)
        x_adv = x.clone()
        steps = torch.zeros(len(x), dtype=torch.long, device=x.device)
        if len(rows):
            part, used = self._perturb(predictor, x[rows], y[rows], eps, call.select(rows))
            x_adv[rows] = part.to(x_adv.dtype)
            steps[rows] = used.to(torch.long)
        return x_adv, steps

    def _perturb(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float, call: AttackCall
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self._takes_call:
            return self.perturb(predictor, x, y, eps, call)
        return self.perturb(predictor, x, y, eps)  # type: ignore[call-arg]

    def _checked_output(
        self, candidate: Any, steps: Any, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The result of ``perturb``, or a PluginError naming the attack and what is wrong."""
        where = f"attack {self.name!r} returned"
        if not isinstance(candidate, torch.Tensor) or not isinstance(steps, torch.Tensor):
            raise PluginError(
                f"{where} {type(candidate).__name__} and {type(steps).__name__}; perturb must "
                "return two tensors: the adversarial inputs and the steps per sample"
            )
        if tuple(candidate.shape) != tuple(x.shape):
            raise PluginError(
                f"{where} inputs of shape {tuple(candidate.shape)} for a batch of shape "
                f"{tuple(x.shape)}; perturb must return one adversarial input per input"
            )
        if candidate.dtype != x.dtype or candidate.device != x.device:
            raise PluginError(
                f"{where} inputs of dtype {candidate.dtype} on {candidate.device} for a batch "
                f"of dtype {x.dtype} on {x.device}; return them like the inputs"
            )
        if tuple(steps.shape) != (len(x),) or steps.is_complex():
            raise PluginError(
                f"{where} steps of shape {tuple(steps.shape)}; perturb must return one step "
                f"(or query) count per sample, shape ({len(x)},)"
            )
        bad = ~torch.isfinite(candidate.detach()).flatten(1).all(1)
        if steps.is_floating_point():
            bad |= ~torch.isfinite(steps)
        if bool(bad.any()):
            raise PluginError(
                f"{where} NaN or inf for {int(bad.sum())} of {len(x)} samples (first: sample "
                f"{int(bad.nonzero()[0])}); an attack must return finite inputs and steps"
            )
        return candidate, steps.to(device=x.device, dtype=torch.long)

    def generator(self, device: torch.device) -> torch.Generator:
        """For plugins with the older four-argument ``perturb``: a generator seeded with
        ``config.seed`` (new attacks draw from ``call``'s streams instead)."""
        return randomness.generator(self.random_seed())

    def run_budgets(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, budgets: Sequence[float]
    ) -> list[AttackResult]:
        return [self(predictor, x, y, eps) for eps in budgets]

    def _check_clean_logits(
        self, predictor: Predictor, x: torch.Tensor, clean_logits: torch.Tensor | None
    ) -> None:
        expected = (x.shape[0], predictor.num_classes)
        if clean_logits is not None and tuple(clean_logits.shape) != expected:
            raise InputError(
                f"attack {self.name!r}: clean_logits must have shape {expected} (one row of "
                f"logits per input), got {tuple(clean_logits.shape)}; or leave them out"
            )

    def supports_targets(self) -> bool:
        return self.targeted and self._takes_call

    def _check_target(
        self, predictor: Predictor, y: torch.Tensor, target: torch.Tensor | None
    ) -> None:
        if target is None:
            return
        if not self.supports_targets():
            raise InputError(
                f"attack {self.name!r} is untargeted only: it cannot move samples towards a "
                "target class; leave target out, or use an attack that supports targets "
                "(`aisafety attacks --json` lists them as targeted: true)"
            )
        if target.dtype == torch.bool or target.is_floating_point() or target.is_complex():
            raise InputError(
                f"attack {self.name!r}: targets must be integer class indices, got dtype "
                f"{target.dtype}; use target.long()"
            )
        if tuple(target.shape) != tuple(y.shape):
            raise InputError(
                f"attack {self.name!r}: targets must have shape {tuple(y.shape)} (one class "
                f"per sample), got {tuple(target.shape)}"
            )
        if target.numel() and (target.min() < 0 or target.max() >= predictor.num_classes):
            raise InputError(
                f"attack {self.name!r}: targets must lie in 0..{predictor.num_classes - 1}, "
                f"got {int(target.min())}..{int(target.max())}"
            )
        if bool((target.to(y.device) == y).any()):
            raise InputError(
                f"attack {self.name!r}: a target equals the sample's true label (sample "
                f"{int((target.to(y.device) == y).nonzero()[0])}); a target must be another class"
            )

    def _check_todo(self, x: torch.Tensor, todo: torch.Tensor | None) -> None:
        if todo is not None and (todo.dtype != torch.bool or tuple(todo.shape) != (len(x),)):
            raise InputError(
                f"attack {self.name!r}: todo must be a boolean mask of shape ({len(x)},), got "
                f"dtype {todo.dtype} and shape {tuple(todo.shape)}"
            )

    def _check(self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float) -> None:
        predictor.check_input(x)
        if y.dtype == torch.bool or y.is_floating_point() or y.is_complex():
            raise InputError(
                f"attack {self.name!r}: labels must be integer class indices, got dtype "
                f"{y.dtype}; use y.long()"
            )
        if y.dim() != 1 or y.shape[0] != x.shape[0]:
            raise InputError(
                f"attack {self.name!r}: labels must have shape ({x.shape[0]},), "
                f"got {tuple(y.shape)}"
            )
        if y.numel() and (y.min() < 0 or y.max() >= predictor.num_classes):
            raise InputError(
                f"attack {self.name!r}: labels must lie in 0..{predictor.num_classes - 1}, "
                f"got {int(y.min())}..{int(y.max())}"
            )
        if not eps >= 0:
            raise InputError(f"attack {self.name!r}: budget eps={eps} must be >= 0")


def keep_clean_mistakes(
    x: torch.Tensor,
    y: torch.Tensor,
    clean_logits: torch.Tensor,
    x_adv: torch.Tensor,
    adv_logits: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The checked points, with the clean input (and its logits) wherever the model gets the
    clean input wrong but the point right: a clean mistake is its own adversarial example at
    distance 0, so no attack turns it into a robust sample and robust accuracy never exceeds
    clean accuracy (AutoAttack attacks such samples not at all). Without this, random
    noise's last draw, PGD-l2/l1, APGD and FGSM returned clean mistakes classified correctly
    (testkit/attack_fuzz.py: robust accuracy 0.5 against a clean accuracy of 0.17)."""
    undone = (clean_logits.argmax(1) != y) & (adv_logits.argmax(1) == y)
    if not bool(undone.any()):
        return x_adv, adv_logits
    keep = undone.view(-1, *([1] * (x.dim() - 1)))
    return torch.where(keep, x, x_adv), torch.where(undone[:, None], clean_logits, adv_logits)


def forward(predictor: Predictor, x: torch.Tensor) -> torch.Tensor:
    """Logits of a chunk, in as many passes as the memory budget needs (one, unless the
    chunk's forward passes would not fit: an attack whose own memory is small, such as a
    corruption, takes larger chunks than its model pass could)."""
    per_pass = fitting(
        f"a forward pass of model {predictor.name!r} (one image of shape "
        f"{tuple(predictor.input_shape)})",
        image_bytes(predictor, grad=False),
        max(1, len(x)),
        _ADVICE,
        predictor.device,
    )
    if per_pass >= len(x):
        return predictor.logits(x)
    return torch.cat([predictor.logits(part) for part in x.split(per_pass)])
