"""Launch records: an op's repeated call launched by one C call with the tensors.

Triton's own C launcher takes ~20 Python arguments per launch (grid, stream, function, metadata,
hooks, then every kernel argument) and parses them with ``PyArg_ParseTuple``. For a hot entry
(``Op.__call__``) all of that is fixed except the data pointers, so ``record`` packs it once into
a ``Record`` (``direct_launch.c``): calling the record with the tensors reads their pointers,
fetches the current stream, and calls ``cuLaunchKernel``.

The C source is compiled on first use with Triton's own builder (``compile_module_from_src``, the
one that builds Triton's launchers, cached in Triton's cache dir), so it works wherever Triton's
launcher does. It needs no CUDA header or library at build time (the driver is opened with
``dlopen``). Where it cannot be built or the kernel uses something it does not pack (tensor
descriptors, clusters, cooperative or PDL launches, scratch memory), ``record`` returns ``None``
and the caller keeps Triton's launcher. ``XKERNELS_DIRECT_LAUNCH=0`` turns it off.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

_SOURCE = Path(__file__).with_name("direct_launch.c")
_module: Any = None
_reason: str | None = None

#: How each scalar type of a Triton signature is packed into its 8-byte parameter slot
#: (as Triton's launcher does: fp16 by IEEE rounding, bf16 by truncating the fp32 bits).
_PACK = {"i1": "<b", "i8": "<b", "i16": "<h", "i32": "<i", "i64": "<q", "u1": "<B", "u8": "<B",
         "u16": "<H", "u32": "<I", "u64": "<Q", "fp16": "<e", "fp32": "<f", "f32": "<f", "fp64": "<d"}


def module() -> Any:
    """The compiled extension, or ``None`` (see ``unavailable_reason``)."""
    global _module, _reason
    if _module is not None or _reason is not None:
        return _module
    if os.environ.get("XKERNELS_DIRECT_LAUNCH", "1") == "0":
        _reason = "XKERNELS_DIRECT_LAUNCH=0"
        return None
    try:
        from triton.runtime.build import compile_module_from_src

        _module = compile_module_from_src(src=_SOURCE.read_text(), name="xkernels_direct_launch")
    except Exception as exc:  # no compiler, no Python headers, another Triton: keep Triton's launcher
        _reason = f"could not build {_SOURCE.name}: {type(exc).__name__}: {exc}"[:300]
    return _module


def is_record(fn: Any) -> bool:
    """Whether ``fn`` is a ``Record`` (which also takes data pointers as ints where it takes
    tensors). Builds nothing: a record exists only once the module is built."""
    return _module is not None and isinstance(fn, _module.Record)


def unavailable_reason() -> str | None:
    """Why ``module()`` is ``None``; ``None`` when it is built."""
    module()
    return _reason


def pack_slot(ty: str, value: Any) -> bytes:
    """One kernel parameter of signature type ``ty`` as its 8-byte slot."""
    if ty.startswith("*"):
        raw = struct.pack("<Q", value)
    elif ty == "bf16":
        raw = struct.pack("<f", value)[2:]
    else:
        raw = struct.pack(_PACK[ty], value)
    return raw.ljust(8, b"\0")


def pack_slots(signature: dict[str, str], values: tuple[Any, ...],
               ptrs: int | tuple[int, ...]) -> tuple[bytes, tuple[int, ...]] | None:
    """Slots of every non-constexpr parameter in order (the values at positions ``ptrs``, the
    first ``ptrs`` when an int, are the tensors, packed as 0 for now) plus the two scratch
    pointers Triton 3.6 appends, and the slot index of each tensor. ``None`` where a type is not
    packable here."""
    tensor_at = set(range(ptrs)) if isinstance(ptrs, int) else set(ptrs)
    types = list(signature.values())
    if len(types) != len(values):
        return None
    slots, ptr_slots = [], []
    for i, (ty, v) in enumerate(zip(types, values)):
        if ty == "constexpr":
            if i in tensor_at:
                return None
            continue
        if i in tensor_at:
            if not ty.startswith("*"):
                return None
            ptr_slots.append(len(slots))
            v = 0
        elif not ty.startswith("*") and ty not in _PACK and ty != "bf16":
            return None  # tensor descriptors, tuples
        slots.append(pack_slot(ty, v))
    slots += [pack_slot("*i8", 0)] * 2  # global_scratch, profile_scratch (kernels without scratch only)
    return b"".join(slots), tuple(ptr_slots)


def record(compiled: Any, grid: tuple[int, int, int], values: tuple[Any, ...], ptrs: int | tuple[int, ...],
           get_device: Any, get_stream: Any, enter_hook: Any, exit_hook: Any) -> Any:
    """A ``Record`` launching ``compiled`` on ``grid`` with ``values`` (all kernel arguments,
    constexprs included; those at positions ``ptrs`` (the first ``ptrs`` when an int) are replaced
    by the record's call arguments, in order), or
    ``None`` where it does not apply (see the module doc)."""
    mod = module()
    run = getattr(compiled, "run", None)
    if mod is None or run is None or getattr(compiled, "function", None) is None:
        return None
    if (getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1)
            or getattr(run, "launch_cooperative_grid", True) or getattr(run, "launch_pdl", True)):
        return None
    try:
        num_warps, num_ctas, shared = compiled.packed_metadata
        signature = dict(compiled.src.signature)
    except (AttributeError, TypeError, ValueError):
        return None
    if num_ctas != 1:
        return None
    try:
        packed = pack_slots(signature, values, ptrs)
    except (struct.error, TypeError, KeyError):
        return None
    if packed is None:
        return None
    slots, ptr_slots = packed
    return mod.Record(compiled.function, *grid, 32 * num_warps, shared, slots, ptr_slots,
                      get_device, get_stream, enter_hook, exit_hook)
