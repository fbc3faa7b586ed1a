"""Launch records: an op's repeated call launched by one C call with the tensors.

Triton's own C launcher takes ~20 Python arguments per launch (grid, stream, function, metadata,
hooks, then every kernel argument) and parses them with ``PyArg_ParseTuple``. For a hot entry
(``Op.__call__``) all of that is fixed except the data pointers, so ``record`` packs it once into
a ``Record`` (``cuda_launch.c``): calling the record with the tensors reads their pointers,
fetches the current stream, and calls ``cuLaunchKernel``.

The C source is compiled on first use with Triton's own builder (``compile_module_from_src``, the
one that builds Triton's launchers, cached in Triton's cache dir), so it works wherever Triton's
launcher does. It needs no CUDA header or library at build time (the driver is opened with
``dlopen``). Where it cannot be built or the kernel uses something it does not pack (tensor
clusters, cooperative or PDL launches, scratch memory), ``record`` returns ``None`` and the
caller keeps Triton's launcher. ``XKERNELS_DIRECT_LAUNCH=0`` turns it off.

Tensor descriptors (the TMA kernel): Triton's launcher encodes each descriptor's 128-byte
``CUtensorMap`` on the host per launch (``fill_tma_descriptor``), through two Python layers. A
record given the descriptors' shapes, strides and Triton's per-descriptor metadata (swizzle,
element type, the block it was lowered to) encodes them itself per call from the base pointers
(``cuTensorMapEncodeTiled``, the same arguments) and launches: the TMA kernel's repeated calls
then cost the host what a pointer kernel's do (H100, 2026-11-23: 19-20 us per call through
Triton's launcher against 14.6-15.6 for ``F.linear``; 17-19 us through the record).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any, NamedTuple

_SOURCE = Path(__file__).with_name("cuda_launch.c")
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

        _module = compile_module_from_src(src=_SOURCE.read_text(), name="xkernels_cuda_launch")
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


#: Triton's tensor-map element types as the driver numbers them (Triton 3.6's
#: ``TMA_DTYPE_DEVICE_TO_HOST``: the device-side enum differs in three places)
_TMA_DTYPE_TO_DRIVER = {**{i: i for i in range(16)}, 8: 10, 9: 8, 10: 9}


class Descriptor(NamedTuple):
    """A tensor-descriptor argument as the record encodes it per call: its global shape and
    strides (elements, outermost first, the last stride 1) and padding (``"zero"`` or ``"nan"``)."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    padding: str = "zero"


class Packed(NamedTuple):
    """``pack_slots``' answer: the parameter slots, the slot of each call argument (``-1 - k``
    for the base pointer of tensor map ``k``) and the tensor maps' specs (``Record``'s ``maps``)."""

    slots: bytes
    ptr_slots: tuple[int, ...]
    maps: tuple[tuple[Any, ...], ...]


def pack_slots(signature: dict[str, str], values: tuple[Any, ...], ptrs: int | tuple[int, ...],
               descriptors: dict[int, Descriptor] | None = None,
               tensordesc_meta: list[dict[str, Any]] | None = None) -> Packed | None:
    """Slots of every non-constexpr parameter in order (the values at positions ``ptrs``, the
    first ``ptrs`` when an int, are the call's tensors, packed as 0 for now; a tensor elsewhere is
    fixed: its pointer is packed, and whoever keeps the record keeps it alive) plus the two scratch
    pointers Triton 3.6 appends. A ``tensordesc`` parameter at position ``i`` (one of ``ptrs``:
    the call passes its base) expands as Triton lowers it: the 128-byte tensor map (a
    placeholder slot here, encoded per call), its shape as i32s and strides as i64s; it needs
    ``descriptors[i]`` and the kernel's ``tensordesc_meta``. ``None`` where something is not
    packable here (a descriptor kernel not lowered to tensor maps, fp4 padding, a tuple)."""
    tensor_at = set(range(ptrs)) if isinstance(ptrs, int) else set(ptrs)
    order = sorted(tensor_at)
    types = list(signature.values())
    if len(types) != len(values):
        return None
    slots, where, maps = [], {}, []
    n_desc = 0
    for i, (ty, v) in enumerate(zip(types, values)):
        if ty == "constexpr":
            if i in tensor_at:
                return None
            continue
        if ty.startswith("tensordesc"):
            meta = (tensordesc_meta or [])[n_desc] if tensordesc_meta and n_desc < len(tensordesc_meta) else None
            n_desc += 1
            desc = (descriptors or {}).get(i)
            if i not in tensor_at or meta is None or desc is None or meta.get("fp4_padded") or desc.strides[-1] != 1:
                return None
            where[i] = -1 - len(maps)
            maps.append((len(slots), _TMA_DTYPE_TO_DRIVER[int(meta["elem_type"])], int(meta["swizzle"]),
                         int(meta["elem_size"]), tuple(desc.shape), tuple(desc.strides),
                         tuple(meta["block_size"]), 1 if desc.padding == "nan" else 0))
            slots.append(bytes(8))  # the map's placeholder: the record points this parameter at the map
            slots += [pack_slot("i32", d) for d in desc.shape] + [pack_slot("i64", st) for st in desc.strides]
            continue
        if i in tensor_at:
            if not ty.startswith("*"):
                return None
            where[i] = len(slots)
            v = 0
        elif ty.startswith("*") and hasattr(v, "data_ptr"):
            v = v.data_ptr()  # a fixed tensor (e.g. a plan's filler for absent operands): its owner keeps it alive
        elif not ty.startswith("*") and ty not in _PACK and ty != "bf16":
            return None  # tuples
        slots.append(pack_slot(ty, v))
    slots += [pack_slot("*i8", 0)] * 2  # global_scratch, profile_scratch (kernels without scratch only)
    return Packed(b"".join(slots), tuple(where[i] for i in order), tuple(maps))


def record(compiled: Any, grid: tuple[int, int, int], values: tuple[Any, ...], ptrs: int | tuple[int, ...],
           get_device: Any, get_stream: Any, enter_hook: Any, exit_hook: Any,
           descriptors: dict[int, Descriptor] | None = None) -> Any:
    """A ``Record`` launching ``compiled`` on ``grid`` with ``values`` (all kernel arguments,
    constexprs included; those at positions ``ptrs`` (the first ``ptrs`` when an int) are replaced
    by the record's call arguments, in order: tensors, or a tensor descriptor's base tensor where
    ``descriptors`` describes that position), or ``None`` where it does not apply (see the
    module doc)."""
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
    meta = getattr(compiled.metadata, "tensordesc_meta", None)
    try:
        packed = pack_slots(signature, values, ptrs, descriptors, list(meta) if meta else None)
    except (struct.error, TypeError, KeyError, ValueError):
        return None
    if packed is None:
        return None
    if packed.maps and not mod.encode_available():
        return None
    return mod.Record(compiled.function, *grid, 32 * num_warps, shared, packed.slots, packed.ptr_slots,
                      get_device, get_stream, enter_hook, exit_hook, packed.maps)
