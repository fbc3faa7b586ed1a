"""``xkernels.patch(model)``: swap a model's linear layers for xkernels modules, fusing the
activation that follows each one where the model's structure says so, and report what changed.

    report = xkernels.patch(model)   # in place; returns a PatchReport
    print(report)
    report.undo()                    # the model's own layers again

Rules, in order:

1. *Fusions*: in an ``nn.Sequential``, a linear layer directly followed by an activation module;
   in a known module class (``data/patch_patterns.json``: BertIntermediate, GPT2MLP, LlamaMLP,
   ViTMLP, ...), its projection and the activation its forward applies to it. The layer becomes
   ``xkernels.nn.Linear`` / ``xkernels.nn.Conv1D`` with ``activation=``, the activation slot
   ``nn.Identity``. Recognised activations (by class): ``nn.ReLU``, ``nn.GELU`` (either
   approximation), ``nn.SiLU``, ``nn.LeakyReLU`` and transformers' GELU / tanh-GELU / SiLU
   classes; any other activation stays as it is (reported) and the layer is swapped unfused.
2. Every other ``nn.Linear`` (exactly that class) and transformers ``Conv1D`` becomes the xkernels
   module without activation.
3. Left, with the reason: subclasses of ``nn.Linear`` (their forward or users may differ), modules
   with hooks (the fused output would change what a hook sees), the root module itself.

Parameters are shared, never copied: ``state_dict`` keys and an optimiser built before the patch
stay valid. Known module classes are looked up only among modules already imported.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from xkernels import nn as xnn

__all__ = ["Left", "PatchReport", "Replaced", "patch"]

PATTERNS = Path(__file__).parent / "data" / "patch_patterns.json"


@dataclass(frozen=True)
class Replaced:
    name: str  # qualified name of the replaced layer
    old: str  # its class
    new: str  # the xkernels module, as its repr's first line
    activation: str | None = None  # the fused activation
    activation_module: str | None = None  # qualified name of the activation slot now nn.Identity


@dataclass(frozen=True)
class Left:
    name: str
    kind: str  # class name
    reason: str


@dataclass
class PatchReport:
    """What :func:`patch` replaced, and what it left with why."""

    replaced: list[Replaced] = field(default_factory=list)
    left: list[Left] = field(default_factory=list)
    #: (parent, attribute, the module patch found there), in the order patch replaced them
    _originals: list[tuple[torch.nn.Module, str, torch.nn.Module]] = field(default_factory=list, repr=False,
                                                                         compare=False)

    def undo(self) -> None:
        """Put back every module ``patch`` replaced, activations included: the model runs its
        own layers again (the xkernels modules shared their parameters, so the weights are the
        ones trained meanwhile). Calling it again does nothing."""
        while self._originals:
            parent, attr, module = self._originals.pop()
            parent._modules[attr] = module

    @property
    def fused(self) -> list[Replaced]:
        return [r for r in self.replaced if r.activation]

    def fused_by_kind(self) -> dict[str, int]:
        """How many fusions ``patch`` made, by fused activation: ``{'gelu': 12}``."""
        return dict(Counter(r.activation for r in self.fused))

    def __str__(self) -> str:
        lines = [f"xkernels.patch: {len(self.replaced)} replaced ({len(self.fused)} with a fused activation), "
                 f"{len(self.left)} left"]
        for r in self.replaced:
            fused = f" + {r.activation_module} fused as {r.activation!r}" if r.activation else ""
            lines.append(f"  replaced {r.name} ({r.old}){fused} -> {r.new}")
        for m in self.left:
            lines.append(f"  left {m.name} ({m.kind}): {m.reason}")
        return "\n".join(lines)


@lru_cache(maxsize=1)
def _patterns() -> dict[str, Any]:
    return json.loads(PATTERNS.read_text())


def _loaded(entries: list[dict[str, Any]]) -> list[tuple[type, dict[str, Any]]]:
    """The entries whose class is defined in an already-imported module."""
    found = []
    for e in entries:
        cls = getattr(sys.modules.get(e["module"]), e["class"], None)
        if isinstance(cls, type):
            found.append((cls, e))
    return found


def activation_of(module: torch.nn.Module) -> tuple[str, float] | str:
    """``(activation name, negative_slope)`` for a recognised activation module, else why not."""
    kind = type(module)
    if kind is torch.nn.ReLU:
        return ("relu", 0.01)
    if kind is torch.nn.SiLU:
        return ("silu", 0.01)
    if kind is torch.nn.LeakyReLU:
        return ("leaky_relu", float(module.negative_slope))
    if kind is torch.nn.GELU:
        return ("gelu" if module.approximate == "none" else "gelu_tanh", 0.01)
    for cls, e in _loaded(_patterns()["activations"]):
        if kind is cls:
            return (e["as"], 0.01)
    return f"{kind.__name__} is not an activation xkernels.ops.linear fuses"


def _looks_like_activation(m: Any) -> bool:
    """A module of torch's or transformers' activation collections (the rest of a Sequential,
    e.g. Dropout or LayerNorm, is not an activation that could have been fused)."""
    return isinstance(m, torch.nn.Module) and (type(m).__module__ in ("torch.nn.modules.activation",
                                                                       "transformers.activations")
                                               or not isinstance(activation_of(m), str))


def _conv1d_classes() -> tuple[type, ...]:
    return tuple(cls for cls, _ in _loaded(_patterns()["conv1d"]))


def _hooked(m: torch.nn.Module) -> bool:
    return bool(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                or getattr(m, "_backward_pre_hooks", None))


def _swap(layer: torch.nn.Module, activation: str | None, slope: float) -> torch.nn.Module:
    if type(layer) is torch.nn.Linear:
        return xnn.Linear.from_linear(layer, activation, negative_slope=slope)
    return xnn.Conv1D.from_conv1d(layer, activation, negative_slope=slope)


def _first_line(m: torch.nn.Module) -> str:
    return "xkernels.nn." + repr(m).splitlines()[0]


def patch(model: torch.nn.Module) -> PatchReport:
    """Replace ``model``'s linear layers in place by xkernels modules (fusing activations as the
    module doc says) and return the :class:`PatchReport`."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"xkernels.patch: 'model' must be a torch.nn.Module, got {type(model)}")
    conv1d = _conv1d_classes()
    swappable = (torch.nn.Linear, *conv1d)
    known = _loaded(_patterns()["modules"])
    supported = set(xnn.linear_activations())
    report = PatchReport()
    names = {id(m): n for n, m in model.named_modules()}
    qual = lambda parent, attr: f"{names[id(parent)]}.{attr}".lstrip(".")
    done: set[tuple[int, str]] = set()  # (id(parent), attr) of slots already handled

    # 1. fusions: (parent, layer slot, activation slot)
    pairs: list[tuple[torch.nn.Module, str, str]] = []
    for parent in model.modules():
        if isinstance(parent, torch.nn.Sequential):
            keys = list(parent._modules)
            for a, b in zip(keys, keys[1:]):
                if type(parent._modules[a]) in swappable and _looks_like_activation(parent._modules[b]):
                    pairs.append((parent, a, b))
        for cls, e in known:
            if type(parent) is cls and type(parent._modules.get(e["linear"])) in swappable:
                pairs.append((parent, e["linear"], e["activation"]))
    for parent, lin, act in pairs:
        layer, act_mod = parent._modules[lin], parent._modules.get(act)
        if (id(parent), lin) in done:
            continue
        found = activation_of(act_mod) if isinstance(act_mod, torch.nn.Module) else "not a module"
        why = (found if isinstance(found, str)
               else f"activation {found[0]!r} is not fused by xkernels.ops.linear in this build" if found[0] not in supported
               else "the activation module has hooks" if _hooked(act_mod) else "")
        if why or _hooked(layer):
            if why:
                report.left.append(Left(qual(parent, act), type(act_mod).__name__, f"{why}; the layer is swapped unfused"))
            continue  # the layer itself is handled by rule 2 / 3
        new = _swap(layer, found[0], found[1])
        report._originals += [(parent, lin, layer), (parent, act, act_mod)]
        parent._modules[lin] = new
        parent._modules[act] = torch.nn.Identity()
        done.add((id(parent), lin))
        report.replaced.append(Replaced(qual(parent, lin), type(layer).__name__, _first_line(new), found[0],
                                        qual(parent, act)))

    # 2. and 3. every other layer
    for parent in list(model.modules()):
        for attr, child in list(parent._modules.items()):
            if child is None or (id(parent), attr) in done or not isinstance(child, swappable + (xnn.Conv1D,)):
                continue
            name = qual(parent, attr)
            if isinstance(child, xnn.Linear | xnn.Conv1D):
                report.left.append(Left(name, type(child).__name__, "already an xkernels module"))
            elif type(child) not in swappable:
                report.left.append(Left(name, type(child).__name__, f"a subclass of {type(child).__mro__[1].__name__}: "
                                                                    "its forward or its users may differ"))
            elif _hooked(child):
                report.left.append(Left(name, type(child).__name__, "has hooks; the replacement would not run them"))
            else:
                new = _swap(child, None, 0.01)
                report._originals.append((parent, attr, child))
                parent._modules[attr] = new
                report.replaced.append(Replaced(name, type(child).__name__, _first_line(new)))
            done.add((id(parent), attr))
    if isinstance(model, swappable) or isinstance(model, xnn.Linear | xnn.Conv1D):
        report.left.append(Left("(root)", type(model).__name__, "the root module cannot be replaced in place; use "
                                                                "xkernels.nn.Linear.from_linear"))
    return report
