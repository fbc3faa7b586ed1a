"""``xkernels.patch(model)``: swap a model's linear layers for xkernels modules, fusing the
activation that follows each one where the model's structure says so, and report what changed.

    report = xkernels.patch(model)   # in place; returns a PatchReport
    print(report)
    report.undo()                    # the model's own layers again

Rules, in order:

0. *Block fusions* (``xkernels/blocks.py``): a module whose forward is, statement for statement,
   a known one (Llama's decoder layer, BERT's output block, GPT-2's block, ViT's layer, Llama's
   or Phi-3's gated MLP, a Llama/Gemma RMSNorm, any linear -> activation -> linear MLP, BERT's
   feed-forward chunk), whatever its class is called, gets an equivalent forward on the instance
   that runs the residual add with the norm after it as one pass, the gated MLP as one op, an
   RMSNorm as one kernel, a training step's feed-forward block as one autograd node. The report
   lists them under ``blocks``. An attention module whose forward calls transformers'
   ``rotate_half``-form ``apply_rotary_pos_emb`` gets its own forward with that call running
   ``xkernels.ops.rotary_embedding`` (``xkernels/rotary_fusion.py``), reported as ``rotary embedding``.
1. *Fusions*: in an ``nn.Sequential``, a linear layer directly followed by an activation module;
   in a known module class (``data/patch_patterns.json``: BertIntermediate, GPT2MLP, LlamaMLP,
   ViTMLP, ...), its projection and the activation its forward applies to it; in any other
   module, a linear layer whose forward applies an activation module straight to its output and
   uses neither elsewhere (``xkernels/activation_forms.py``: OPT's ``fc1`` and ``activation_fn``). The layer becomes
   ``xkernels.nn.Linear`` / ``xkernels.nn.Conv1D`` with ``activation=``, the activation slot
   ``nn.Identity``. Recognised activations (by class): ``nn.ReLU``, ``nn.GELU`` (either
   approximation), ``nn.SiLU``, ``nn.LeakyReLU`` and transformers' GELU / tanh-GELU / SiLU
   classes; any other activation stays as it is (reported) and the layer is swapped unfused.
2. Every other ``nn.Linear`` (exactly that class) and transformers ``Conv1D`` becomes the xkernels
   module without activation; so does a subclass of ``nn.Linear`` that only rewrites its forward as
   ``F.linear`` (``xkernels/linear_forms.py``: Falcon's ``FalconLinear``).
3. Left, with the reason: other subclasses of ``nn.Linear`` (their forward or users may differ),
   modules with hooks (the fused output would change what a hook sees), the root module itself.
4. *Attention masks* (``xkernels/attention_masks.py``): a non-causal attention module that passes
   its ``attention_mask`` to transformers' attention function gets a config proxy whose ``sdpa``
   implementation runs a boolean mask with one value per query row (transformers' bidirectional
   masks while ``torch.compile`` traces) as no mask with the masked rows zeroed, so SDPA's fused
   kernels run instead of its float32 math path. Reported under ``blocks`` as
   ``attention mask by rows``.
5. *Mask decisions* (``xkernels/mask_decisions.py``): a module that creates transformers' attention
   masks (a decoder's or encoder's model-level module) gets hooks under which, while a graph is
   traced or captured, transformers decides its masks as in eager mode: positions the module made
   itself are one sequence per row and only ``torch.export`` exports, so a compiled decoder's causal
   mask without padding runs as SDPA's ``is_causal``. Reported as ``attention masks decided as in
   eager mode``.

Parameters are shared, never copied: ``state_dict`` keys and an optimiser built before the patch
stay valid. Known module classes are looked up only among modules already imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from xkernels import attention_masks, blocks, experts_gates, mask_decisions, patch_saving, rotary_fusion
from xkernels import nn as xnn
from xkernels.activation_forms import linear_activation_pairs
from xkernels.block_steps import FeedForwardStep, child_at, hooked
from xkernels.linear_forms import computes_linear
from xkernels.patterns import activation_of, loaded, patterns

__all__ = ["FusedBlock", "Left", "PatchReport", "Replaced", "patch"]



@dataclass(frozen=True)
class Replaced:
    name: str  # qualified name of the replaced layer
    old: str  # its class
    new: str  # the xkernels module, as its repr's first line
    activation: str | None = None  # the fused activation
    activation_module: str | None = None  # qualified name of the activation slot now nn.Identity


@dataclass(frozen=True)
class FusedBlock:
    name: str  # qualified name of the module whose forward now runs fused ops
    kind: str  # its class
    fusion: str  # what is fused (``xkernels.blocks.FUSIONS``)
    note: str = ""  # where the block runs PyTorch's ops instead, if anywhere


#: a FusedBlock's note for a LayerNorm block (``block_steps.NormStep.training_pays``)
LAYER_NORM_TRAINING = ("in eager training, PyTorch's add + LayerNorm where the fused op's host cost outweighs "
                       "the bytes it saves, but under CUDA-graph capture (docs/fused-ops.md)")
#: a FusedBlock's note for a forward whose add + norm sites were rewritten (``block_steps.add_then_norm``)
ADD_NORM_SITES = ("a site whose operands differ in shape (a broadcast, as BERT's position embeddings over a batch) or "
                  "device, or whose sum's dtype is not its norm's parameters' (fp32 under autocast), runs as written")
#: a FusedBlock's note for a forward with pre-norm sites (``block_steps.add_norm_and_sum``)
PRE_NORM_SITES = "its pre-norm sites fuse where a gradient is required or a CUDA graph is captured (docs/patching.md)"
#: a FusedBlock's note for a feed-forward block (``block_steps.FeedForwardStep``)
FEED_FORWARD_TRAINING = ("in training where its layers train through xkernels (xkernels.nn.training_pays; always "
                         "under CUDA-graph capture) and the fused block's plan exists (docs/patching.md); otherwise "
                         "its fused linear layers")
#: a FusedBlock's note for experts whose model runs transformers' eager experts loop
EXPERTS_EAGER = ("the model's experts implementation is 'eager', whose loop computes the gate inline: used under "
                 "'grouped_mm' (transformers' default) or 'batched_mm' (model.set_experts_implementation)")
#: the fusion ``patch()`` reports for an experts module whose forward it set (``xkernels/experts_forward.py``)
EXPERTS_ROUTING = "experts routing"
#: its note
EXPERTS_ROUTED = ("the routed tokens' gather (its backward) and weighted sum, under 'grouped_mm' (transformers' default); "
                  "under another experts implementation, or expert parallelism, the class's forward runs")
#: the report's note on the replaced linear layers (``xkernels.nn.training_pays``)
LINEAR_TRAINING = ("in eager training, PyTorch's F.linear where xkernels' host cost outweighs the GEMM time a kernel "
                   "could save, but under CUDA-graph capture; on a backend that runs no kernels (the cpu backend), "
                   "F.linear always (docs/patching.md)")
#: the report's note on the fused blocks (``block_steps.as_written``)
BLOCKS_AS_WRITTEN = ("each runs the code it replaces while torch.compile traces (but a training call's residual "
                     "add + norm, whose kernels launch from the graph where the add_norm table's compiled rule "
                     "measured them faster and no dropout of the block is active but a BERT output block's own, "
                     "which they apply) and where the input's backend "
                     "runs no kernels (the cpu backend: PyTorch's ops either way)")


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
    blocks: list[FusedBlock] = field(default_factory=list)
    _forwards: list[torch.nn.Module] = field(default_factory=list, repr=False, compare=False)
    #: the attention modules given a config proxy (``xkernels/attention_masks.py``)
    _configs: list[torch.nn.Module] = field(default_factory=list, repr=False, compare=False)
    #: the modules given the mask-decision hooks (``xkernels/mask_decisions.py``)
    _mask_hooks: list[torch.nn.Module] = field(default_factory=list, repr=False, compare=False)
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
        while self._forwards:
            module = self._forwards.pop()
            patch_saving.forget(module)
            blocks.restore(module)
        while self._configs:
            attention_masks.undo(self._configs.pop())
        while self._mask_hooks:
            mask_decisions.undo(self._mask_hooks.pop())

    @property
    def fused(self) -> list[Replaced]:
        return [r for r in self.replaced if r.activation]

    def counts(self) -> dict[str, int]:
        """How many of each fusion ``patch`` made: block fusions by name, plus
        ``"linear + activation"`` and ``"linear"`` (swapped unfused)."""
        out: dict[str, int] = {}
        for b in self.blocks:
            out[b.fusion] = out.get(b.fusion, 0) + 1
        for r in self.replaced:
            kind = "linear + activation" if r.activation else "linear"
            out[kind] = out.get(kind, 0) + 1
        return out

    def __str__(self) -> str:
        lines = [f"xkernels.patch: {len(self.blocks)} blocks fused, {len(self.replaced)} layers replaced "
                 f"({len(self.fused)} with a fused activation), {len(self.left)} left"]
        if self.replaced:
            lines.append(f"  linear layers: {LINEAR_TRAINING}")
        if self.blocks:
            lines.append(f"  fused blocks: {BLOCKS_AS_WRITTEN}")
        for b in self.blocks:
            lines.append(f"  fused {b.name} ({b.kind}): {b.fusion}" + (f"; {b.note}" if b.note else ""))
        for r in self.replaced:
            fused = f" + {r.activation_module} fused as {r.activation!r}" if r.activation else ""
            lines.append(f"  replaced {r.name} ({r.old}){fused} -> {r.new}")
        for m in self.left:
            lines.append(f"  left {m.name} ({m.kind}): {m.reason}")
        return "\n".join(lines)


def _looks_like_activation(m: Any) -> bool:
    """A module of torch's or transformers' activation collections (the rest of a Sequential,
    e.g. Dropout or LayerNorm, is not an activation that could have been fused)."""
    return isinstance(m, torch.nn.Module) and (type(m).__module__ in ("torch.nn.modules.activation",
                                                                       "transformers.activations")
                                               or not isinstance(activation_of(m), str))


def _conv1d_classes() -> tuple[type, ...]:
    return tuple(cls for cls, _ in loaded(patterns()["conv1d"]))


def _swap(layer: torch.nn.Module, activation: str | None, slope: float) -> torch.nn.Module:
    if isinstance(layer, torch.nn.Linear):  # nn.Linear, or a subclass computing F.linear (linear_forms)
        return xnn.Linear.from_linear(layer, activation, negative_slope=slope)
    return xnn.Conv1D.from_conv1d(layer, activation, negative_slope=slope)


def _swappable(m: Any, swappable: tuple[type, ...]) -> bool:
    """``nn.Linear`` or GPT-2's ``Conv1D`` exactly, or a ``Linear`` subclass whose forward is
    ``F.linear``'s (``xkernels.linear_forms``: Falcon's ``FalconLinear``)."""
    return type(m) in swappable or computes_linear(type(m))


def _first_line(m: torch.nn.Module) -> str:
    return "xkernels.nn." + repr(m).splitlines()[0]


def patch(model: torch.nn.Module) -> PatchReport:
    """Replace ``model``'s linear layers in place by xkernels modules (fusing activations as the
    module doc says) and return the :class:`PatchReport`."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"xkernels.patch: 'model' must be a torch.nn.Module, got {type(model)}")
    conv1d = _conv1d_classes()
    swappable = (torch.nn.Linear, *conv1d)
    known = loaded(patterns()["modules"])
    supported = set(xnn.linear_activations())
    report = PatchReport()
    names = {id(m): n for n, m in model.named_modules()}
    qual = lambda parent, attr: f"{names[id(parent)]}.{attr}".lstrip(".")
    done: set[tuple[int, str]] = set()  # (id(parent), attr) of slots already handled
    as_its_class: set[int] = set()  # modules whose forward applies their class's modules as its source does

    # 0. block fusions: a module whose forward is one of xkernels.blocks' known forwards
    for module in list(model.modules()):
        fusion, why = blocks.fusion_for(module)
        if fusion is None:
            continue
        name = names[id(module)] or "(root)"
        if why:
            report.left.append(Left(name, type(module).__name__, f"{fusion.name} not fused: {why}"))
            continue
        blocks.apply(module, fusion)
        patch_saving.keep(module, fusion.name)
        report._forwards.append(module)
        step = module.__dict__.get("_xkernels_block")
        notes = [ADD_NORM_SITES] if fusion.add_norms or fusion.add_norms_summed else []
        if fusion.add_norms_summed:
            notes.append(PRE_NORM_SITES)
        if getattr(step, "layer", False):
            notes.append(LAYER_NORM_TRAINING)
        elif fusion.feed_forward is not None:
            notes.append(FEED_FORWARD_TRAINING)
        implementation = getattr(getattr(module, "config", None), "_experts_implementation", None)
        if (fusion.method == "_apply_gate" and implementation == "eager"
                and not experts_gates.loop_applies_gate(type(module))):
            notes.append(EXPERTS_EAGER)
        report.blocks.append(FusedBlock(name, type(module).__name__, fusion.name, "; ".join(notes)))
        if getattr(step, "routed", None) is not None:  # an experts module's routing passes, with its gate
            report.blocks.append(FusedBlock(name, type(module).__name__, EXPERTS_ROUTING, EXPERTS_ROUTED))
        done.update((id(module), attr) for attr in fusion.consumed)
        if fusion.name in blocks.ADD_NORM_SITE_FUSIONS.values():
            as_its_class.add(id(module))  # its class's source with the sites rewritten: the rest as written
    for module in list(model.modules()):  # attention: the rotary embedding's call bound to the fused op
        found, why = rotary_fusion.fusion_for(module)
        if not found or any(m is module for m in report._forwards):
            continue
        name = names[id(module)] or "(root)"
        if why:
            report.left.append(Left(name, type(module).__name__, f"{rotary_fusion.FUSION} not fused: {why}"))
            continue
        rotary_fusion.apply(module)
        patch_saving.keep(module, rotary_fusion.FUSION)
        report._forwards.append(module)
        report.blocks.append(FusedBlock(name, type(module).__name__, rotary_fusion.FUSION))

    # 1. fusions: (parent, layer slot, activation slot); first those of the feed-forward blocks
    # (whatever their class, the up-projection runs with its activation fused)
    pairs: list[tuple[torch.nn.Module, str, str]] = []
    for module in report._forwards:
        step = module.__dict__.get("_xkernels_block")
        if isinstance(step, FeedForwardStep) and step.up[:-1] == step.act[:-1]:
            pairs.append((child_at(module, step.up[:-1]), step.up[-1], step.act[-1]))
    rewritten = {id(m) for m in report._forwards}
    for parent in model.modules():
        if isinstance(parent, torch.nn.Sequential):
            keys = list(parent._modules)
            for a, b in zip(keys, keys[1:]):
                if _swappable(parent._modules[a], swappable) and _looks_like_activation(parent._modules[b]):
                    pairs.append((parent, a, b))
        for cls, e in known:
            if type(parent) is cls and _swappable(parent._modules.get(e["linear"]), swappable):
                pairs.append((parent, e["linear"], e["activation"]))
        if "forward" not in parent.__dict__ and id(parent) not in rewritten or id(parent) in as_its_class:
            for lin, act in linear_activation_pairs(type(parent)):
                # only an activation xkernels fuses: the module after a layer may be anything (a
                # dropout, a pooler's tanh), which the layer's swap alone (rule 2) serves as well
                act_mod = parent._modules.get(act)
                found = activation_of(act_mod) if isinstance(act_mod, torch.nn.Module) else None
                if (_swappable(parent._modules.get(lin), swappable) and isinstance(found, tuple)
                        and found[0] in supported):
                    pairs.append((parent, lin, act))
    for parent, lin, act in pairs:
        layer, act_mod = parent._modules[lin], parent._modules.get(act)
        if (id(parent), lin) in done:
            continue
        found = activation_of(act_mod) if isinstance(act_mod, torch.nn.Module) else "not a module"
        why = (found if isinstance(found, str)
               else f"activation {found[0]!r} is not fused by xkernels.ops.linear in this build" if found[0] not in supported
               else "the activation module has hooks" if hooked(act_mod) else "")
        if why or hooked(layer):
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
            elif not _swappable(child, swappable):
                report.left.append(Left(name, type(child).__name__, f"a subclass of {type(child).__mro__[1].__name__}: "
                                                                    "its forward or its users may differ"))
            elif hooked(child):
                report.left.append(Left(name, type(child).__name__, "has hooks; the replacement would not run them"))
            else:
                new = _swap(child, None, 0.01)
                report._originals.append((parent, attr, child))
                parent._modules[attr] = new
                report.replaced.append(Replaced(name, type(child).__name__, _first_line(new)))
            done.add((id(parent), attr))
    # 4. attention masks: a boolean mask with one value per query row runs as no mask, its masked rows zeroed
    for name, module in attention_masks.targets(model):
        attention_masks.apply(module)
        report._configs.append(module)
        report.blocks.append(FusedBlock(name or "(root)", type(module).__name__, attention_masks.FUSION,
                                        attention_masks.NOTE))
    # 5. mask decisions: transformers' masks decided while tracing as in an eager call
    for name, module, index in mask_decisions.targets(model):
        mask_decisions.apply(module, index)
        report._mask_hooks.append(module)
        report.blocks.append(FusedBlock(name or "(root)", type(module).__name__, mask_decisions.FUSION,
                                        mask_decisions.NOTE))
    if isinstance(model, swappable) or isinstance(model, xnn.Linear | xnn.Conv1D):
        report.left.append(Left("(root)", type(model).__name__, "the root module cannot be replaced in place; use "
                                                                "xkernels.nn.Linear.from_linear"))
    return report
