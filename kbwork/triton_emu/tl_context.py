"""TLContext: the ``tl`` object a kernel receives; every call emits commands.

A kernel runs once on the host. ``tl`` validates each call at emit time
(raising :class:`ValidationError` that names the op, the operand and the fix),
lowers the user API to flat :class:`CompositeCmd` / :class:`DmaCmd` and
records them in program order for the scheduler.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from ..config import Topology
from ..errors import ValidationError
from ..memory import Handle, Memory, Space, canonical_dtype
from ..pe.commands import Command, Completion, CompositeCmd, DmaCmd, OpSpec, Scope
from ..pe.ops import OPS
from .tl_recipes import RECIPE_DESCRIPTORS, RecipeDescriptor

_SCOPES = {"kernel": Scope.KERNEL, "k_tile": Scope.K_TILE, "output_tile": Scope.OUTPUT_TILE}
_SCALAR_KEYS = ("value", "factor")


def _scope(value: Any, where: str) -> Scope:
    if isinstance(value, Scope):
        return value
    if isinstance(value, str) and value.lower() in _SCOPES:
        return _SCOPES[value.lower()]
    raise ValidationError(f"{where}: scope {value!r} is unknown; use one of {', '.join(_SCOPES)}.")


def _is_handle(x: Any) -> bool:
    return isinstance(x, Handle)


class TLContext:
    """The kernel language. See DESIGN.md §2 for the surface.

    Attributes:
        commands: the emitted commands, in program order.
        waits: ``(before_cmd, wait_for_cmd)`` pairs from :meth:`wait`.
        names: every named handle the kernel created (for ``Run.read``).
    """

    def __init__(self, topo: Topology, memory: Memory):
        self.topo = topo
        self.mem = memory
        self.commands: list[Command] = []
        self.waits: list[tuple[int, int]] = []
        self.names: dict[str, Handle] = {}
        self._iter = -1
        self._scopes: list[tuple[int, int]] = []
        self._recipe_scratch: dict[tuple, dict[str, Handle]] = {}
        self._recipe_expansions: dict[tuple, tuple] = {}
        self._math_ops: dict[tuple, tuple] = {}
        self._gemm_calls: dict[tuple, tuple] = {}
        # what the last recipe expansion was keyed by, for the caches that outlive a run
        self._last_scratch_key: tuple = ()
        self._last_expansion_key: tuple | None = None

    def __repr__(self) -> str:
        return f"TLContext({len(self.commands)} commands, iter={self._iter}, {len(self._scopes)} open scratch scopes)"

    # --- handles and memory -------------------------------------------------------------
    def ref(self, t: Handle) -> Handle:
        """A handle on HBM data (``space="hbm"``, ``pinned=False``); slice it with ``t[a:b]``.

        Raises:
            ValidationError: ``t`` is not a HBM handle.
        """
        if not _is_handle(t) or t.space != Space.HBM:
            raise ValidationError(f"tl.ref expects a HBM tensor handle, got {t!r}; "
                                  f"place host data with sim.hbm(name, array).")
        return t

    def alloc(self, shape: Sequence[int], dtype: Any = "fp32", *, name: str) -> Handle:
        """Allocate persistent (or scope-local) TCM scratch; returns a pinned TCM handle.

        Raises:
            TcmOverflowError: the TCM cannot hold it.
        """
        h = self.mem.tcm.alloc(name, tuple(shape), canonical_dtype(dtype))
        self.names[name] = h
        return h

    def full(self, shape: Sequence[int], value: float, dtype: Any = "fp32", *, name: str,
             label: str | None = None) -> Handle:
        """``alloc`` plus a MATH ``fill`` command; returns the TCM handle."""
        h = self.alloc(shape, dtype, name=name)
        self.composite(op="math", math_op="fill", out=h, value=value, label=label or f"fill {name}")
        return h

    @contextlib.contextmanager
    def scratch_scope(self) -> Iterator[None]:
        """TCM allocated inside the ``with`` block is released at its exit (ADR-0063)."""
        mark = self.mem.tcm.mark()
        self._scopes.append(mark)
        try:
            yield
        finally:
            self._scopes.pop()
            self.mem.tcm.release(mark)

    def iteration(self, j: int) -> "_Iteration":
        """Label the commands emitted inside ``with tl.iteration(j):`` with loop index ``j`` (op_log ``iter``).

        Raises:
            ValidationError: ``j`` is not a non-negative int.
        """
        if isinstance(j, bool) or not isinstance(j, (int, np.integer)) or j < 0:
            raise ValidationError(f"tl.iteration expects a non-negative int loop index, got {j!r}.")
        return _Iteration(self, int(j))

    # --- DMA ----------------------------------------------------------------------------
    def load(self, src: Handle, *, name: str | None = None, label: str | None = None) -> Handle:
        """DMA ``src`` (HBM) into freshly allocated TCM; returns the pinned TCM handle.

        Raises:
            ValidationError: ``src`` is not in HBM.
            TcmOverflowError: the TCM cannot hold it.
        """
        if not _is_handle(src) or src.space != Space.HBM:
            raise ValidationError(f"tl.load expects a HBM handle, got {src!r}; a TCM handle is already loaded.")
        dst = self.alloc(src.shape, src.dtype, name=name or f"{src.name}_tcm")
        self._emit(DmaCmd(self._next(), src, dst, label or f"dma_load {src.name}", self._iter))
        return dst

    def store(self, src: Handle, dst: Handle, *, label: str | None = None) -> Completion:
        """DMA the TCM handle ``src`` back to the HBM handle ``dst``; returns its completion.

        Raises:
            ValidationError: wrong spaces, or shapes/dtypes that differ (a DMA does not convert).
        """
        if not _is_handle(src) or src.space != Space.TCM:
            raise ValidationError(f"tl.store: source must be a TCM handle, got {src!r}.")
        if not _is_handle(dst) or dst.space != Space.HBM:
            raise ValidationError(f"tl.store: destination must be a HBM handle, got {dst!r}.")
        if src.shape != dst.shape or src.dtype != dst.dtype:
            raise ValidationError(f"tl.store {src.name} -> {dst.name}: shapes/dtypes differ "
                                  f"({src.shape} {src.dtype} vs {dst.shape} {dst.dtype}); a DMA copies bytes, "
                                  f"so allocate the destination with the same shape and dtype.")
        return self._emit(DmaCmd(self._next(), src, dst, label or f"dma_store {src.name}", self._iter))

    def wait(self, completion: Completion) -> None:
        """Stall PE_CPU (before the next command) until ``completion``'s command has completed."""
        if not isinstance(completion, Completion) or not 0 <= completion.cmd < len(self.commands):
            raise ValidationError(f"tl.wait expects the Completion of an emitted command, got {completion!r}.")
        self.waits.append((len(self.commands), completion.cmd))

    # --- composites ---------------------------------------------------------------------
    def composite(self, op: str | None = None, *, a: Handle | None = None, b: Handle | None = None,
                  c: Handle | None = None, out: Handle | None = None, trans_b: bool = False,
                  math_op: str | None = None, value: float | None = None, factor: float | None = None,
                  prologue: Sequence[Mapping[str, Any]] = (), epilogue: Sequence[Mapping[str, Any]] = (),
                  ops: Sequence[OpSpec] | None = None, rw_handles: Sequence[Handle] = (),
                  label: str | None = None) -> Completion:
        """Emit one composite command; returns its :class:`Completion`.

        Legacy form: ``op="gemm"`` (``a``, ``b``, ``out``, ``trans_b``) or
        ``op="math"`` (``math_op``, ``a``/``b``/``c``, ``out``, ``value``/``factor``),
        with ``prologue=[...]`` (recipes or KERNEL-scope MATH ops) and
        ``epilogue=[...]`` (dicts with ``"op"`` and an optional ``"scope"``).
        Flat form: ``ops=[OpSpec, ...]``. Both lower to the same CompositeCmd.

        Raises:
            ValidationError: any invariant of DESIGN.md §3 is broken.
        """
        if op == "math" and ops is None and not prologue and not epilogue and not rw_handles:
            # The common single-op MATH command: a loop emits the same one on the same handles
            # every tile. Reuse its (validated) op tuple; the scheduler then reuses its plan too.
            if trans_b:
                raise ValidationError("tl.composite(op='math') takes no trans_b (it is a GEMM option).")
            key = (math_op, id(a), id(b), id(c), id(out), value, factor)
            hit = self._math_ops.get(key)
            if hit is not None and hit[1] is a and hit[2] is b and hit[3] is c and hit[4] is out:
                flat = hit[0]
            else:
                flat = _math_head_across_runs(math_op, a, b, c, out, value, factor, len(self.commands))
                self._math_ops[key] = (flat, a, b, c, out)  # holding the handles keeps their ids unique
            return self._emit_composite(flat, (), (), label)
        gemm_key = None
        if op == "gemm" and ops is None and not self._scopes and c is None and math_op is None \
                and value is None and factor is None:
            # A loop emits the same GEMM composite every tile with only b (the K/V slice) new.
            # Everything but the GEMM op itself (recipe expansion, epilogue ops, rw handles,
            # scratch) depends on the other arguments, so reuse it and build just the GEMM op.
            try:
                gemm_key = (id(a), id(out), bool(trans_b), tuple([tuple(e.items()) for e in prologue]),
                            tuple([tuple(e.items()) for e in epilogue]), tuple(rw_handles))
                hit = self._gemm_calls.get(gemm_key)
                if hit is None:
                    hit = self._gemm_from_earlier_run(gemm_key, a, out)
            except (TypeError, AttributeError):  # unhashable or malformed entries: the full path says why
                gemm_key = hit = None
            if hit is not None and hit[0] is a and hit[1] is out:
                _, _, pre, post, rw, scratch, prev = hit
                head = prev._with_operand("b", b) if b.__class__ is Handle else None
                if head is not None and head.signature is prev.signature:
                    flat = pre + (head,) + post  # same signature as the validated op tuple
                else:
                    flat = pre + (_gemm_spec(prev.operands["a"], b, out, trans_b, None),) + post
                    validate_ops(flat, where=len(self.commands))
                return self._emit_composite(flat, rw, scratch, label)
        if ops is not None:
            given = [k for k, v in dict(op=op, a=a, b=b, c=c, out=out, math_op=math_op, value=value,
                                         factor=factor).items() if v is not None]
            if given or prologue or epilogue or trans_b:
                raise ValidationError(f"tl.composite: the flat form ops=[...] takes no {', '.join(given) or 'prologue/epilogue/trans_b'}; "
                                      f"put everything into the OpSpecs.")
            flat = tuple(ops)
            for i, o in enumerate(flat):
                if not isinstance(o, OpSpec):
                    raise ValidationError(f"tl.composite(ops=...): item {i} is {type(o).__name__}, not an OpSpec.")
            scratch: tuple[Handle, ...] = ()
            rw = tuple(rw_handles)
        else:
            self._last_expansion_key = None
            flat, rw, scratch = self._lower_legacy(op, a, b, c, out, trans_b, math_op, value, factor,
                                                   prologue, epilogue, tuple(rw_handles))
        validate_ops(flat, where=len(self.commands))
        if gemm_key is not None:
            g = [o.kind for o in flat].index("gemm")
            # holding a and out keeps their ids unique while the entry lives
            entry = (a, out, flat[:g], flat[g + 1:], rw, scratch, flat[g])
            self._gemm_calls[gemm_key] = entry
            exp_key = self._last_expansion_key
            if not scratch or exp_key is not None:  # recipe scratch only if its allocation can be replayed
                _remember(_GEMM_LOWERINGS, (a, out) + gemm_key[2:], entry[2:] + (exp_key,))
        return self._emit_composite(flat, rw, scratch, label)

    # --- internals ----------------------------------------------------------------------
    def _gemm_from_earlier_run(self, gemm_key: tuple, a: Handle | None, out: Handle | None) -> tuple | None:
        """A GEMM composite lowered by an earlier run on equal handles, made this run's (or None).

        Its recipe scratch, if any, is allocated again at the same addresses
        (``_replay_expansion``); when the TCM differs the call takes the full path.
        """
        cached = _GEMM_LOWERINGS.get((a, out) + gemm_key[2:])
        if cached is None:
            return None
        pre, post, rw, scratch, head, exp_key = cached
        if exp_key is not None and self._replay_expansion(exp_key) is None:
            return None
        entry = (a, out, pre, post, rw, scratch, head)
        self._gemm_calls[gemm_key] = entry
        return entry

    def _next(self) -> Completion:
        return Completion(len(self.commands))

    def _emit_composite(self, flat: tuple[OpSpec, ...], rw: tuple[Handle, ...], scratch: tuple[Handle, ...],
                        label: str | None) -> Completion:
        """Append a composite over the (validated) op tuple ``flat``; its label defaults to the op kinds."""
        return self._emit(CompositeCmd(self._next(), flat, rw, True, scratch,
                                       label if label is not None else "+".join(o.kind for o in flat), self._iter))

    def _emit(self, cmd: Command) -> Completion:
        self.commands.append(cmd)
        return cmd.completion

    def _lower_legacy(self, op, a, b, c, out, trans_b, math_op, value, factor, prologue, epilogue, rw):
        if op not in ("gemm", "math"):
            raise ValidationError(f"tl.composite: op={op!r}; use op='gemm' or op='math', or the flat form ops=[...].")
        pre: list[OpSpec] = []
        scratch: list[Handle] = []
        recipe_rw: list[Handle] = []
        bound: dict[str, Handle] = {}
        for i, entry in enumerate(prologue):
            name = _entry_kind(entry, f"prologue[{i}]")
            if name in RECIPE_DESCRIPTORS:
                if recipe_rw or bound:
                    raise ValidationError(f"prologue[{i}]: only one recipe per composite is supported.")
                r_ops, r_rw, r_scratch, r_bound = self._expand_recipe(RECIPE_DESCRIPTORS[name], entry, op,
                                                                     dict(a=a, b=b, c=c))
                pre += r_ops
                recipe_rw += r_rw
                scratch += r_scratch
                bound = r_bound
            else:
                spec = _entry_op(entry, f"prologue[{i}]", default_scope=Scope.KERNEL)
                if spec.scope is not Scope.KERNEL:
                    raise ValidationError(f"prologue[{i}] {name!r}: prologue ops run once before the tile loop; "
                                          f"drop scope={spec.scope.value!r} (or use 'kernel').")
                pre.append(spec)
        a = bound.get("a", a)
        if op == "gemm":
            if math_op is not None or value is not None or factor is not None:
                raise ValidationError("tl.composite(op='gemm'): math_op/value/factor belong to op='math' "
                                      "(use an epilogue {'op': 'scale', 'factor': f} to scale a GEMM).")
            head = _gemm_spec(a, b, out, trans_b, c)
        else:
            head = _math_head(math_op, a, b, c, out, value, factor)
        default_scope = Scope.OUTPUT_TILE if op == "gemm" else Scope.KERNEL
        post = [self._epilogue_op(e, i, default_scope) for i, e in enumerate(epilogue)]
        rw_all = tuple(recipe_rw) + tuple(h for h in rw if h not in recipe_rw)
        return tuple(pre) + (head,) + tuple(post), rw_all, tuple(scratch)

    def _epilogue_op(self, entry: Mapping[str, Any], i: int, default_scope: Scope) -> OpSpec:
        """The OpSpec of an epilogue entry; loops and later runs repeat equal entries, so they are cached."""
        try:
            key = (default_scope._value_, tuple(entry.items()))
            op = _ENTRY_OPS.get(key)
        except (TypeError, AttributeError):  # unhashable or not a dict: _entry_op says what is wrong
            key = op = None
        if op is None:
            op = _entry_op(entry, f"epilogue[{i}]", default_scope)
            if key is not None:
                _remember(_ENTRY_OPS, key, op)
        return op

    def _expand_recipe(self, rd: RecipeDescriptor, entry: Mapping[str, Any], op: str | None,
                       head_kwargs: dict[str, Handle | None]):
        where = f"recipe {rd.name!r}"
        given = {k: v for k, v in entry.items() if k not in ("op", "scope")}
        # A loop expands the same recipe on the same handles again and again; with
        # kernel-scope scratch the result is identical, so reuse it.
        key = None
        if not self._scopes:
            try:
                key = (rd.name, op, tuple(given.items()), tuple(k for k, v in head_kwargs.items() if v is not None))
                self._last_expansion_key = key
                hit = self._recipe_expansions.get(key)
            except TypeError:  # something unhashable: the checks below will name it
                key = hit = None
            if hit is not None:
                return hit
            hit = self._replay_expansion(key)
            if hit is not None:
                return hit
        missing = [n for n in rd.operands if n not in given]
        extra = [n for n in given if n not in rd.operands]
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing operand(s) {', '.join(missing)}")
            if extra:
                parts.append(f"unknown operand(s) {', '.join(extra)}")
            raise ValidationError(f"{where}: {'; '.join(parts)}. It takes exactly "
                                  f"{', '.join(f'{n} ({r})' for n, r in rd.operands.items())}.")
        if entry.get("scope", "kernel") not in ("kernel", Scope.KERNEL):
            raise ValidationError(f"{where}: a recipe runs once before the tile loop; drop scope=.")
        for n, role in rd.operands.items():
            h = given[n]
            if not _is_handle(h):
                raise ValidationError(f"{where}: operand {n!r} must be a tensor handle, got {h!r}.")
            if role == "RW" and not (h.space == Space.TCM and h.pinned):
                raise ValidationError(f"{where}: operand {n}={h.name} has role RW (read and written in place) but "
                                      f"is not writable TCM scratch ({h.space.value}); pass a tl.alloc/tl.full handle.")
            if h.space != Space.TCM:
                raise ValidationError(f"{where}: operand {n}={h.name} is in HBM; recipe operands must be in TCM "
                                      f"(ADR-0065 D6.2/D6.7). tl.load it first, or allocate it with tl.alloc.")
        for n, role in rd.operands.items():
            if role != "RW":
                continue
            for other in rd.operands:
                if other != n and given[n].overlaps(given[other]):
                    raise ValidationError(f"{where}: RW operand {n}={given[n].name} aliases operand "
                                          f"{other}={given[other].name}; writing {n} in place would clobber it. "
                                          f"Give each operand its own buffer.")
        po = rd.primary_out
        if po is not None:
            if op != "gemm":
                raise ValidationError(f"{where} has a primary output ({po.name}) for a head GEMM to consume; "
                                      f"use it with op='gemm'.")
            if head_kwargs.get(po.binds) is not None:
                raise ValidationError(f"{where}: the head GEMM was given {po.binds}={head_kwargs[po.binds].name}, "
                                      f"but the recipe binds {po.binds} to its primary output {po.name} "
                                      f"(ADR-0065 D6.6). Omit {po.binds}=, or drop the recipe.")
        state = self._tcm_state()
        scratch = self._recipe_scratch_for(rd, given)
        env: dict[str, Handle] = dict(given)
        env.update(scratch)
        specs = []
        for step in rd.engine_seq:
            info = OPS[step.kind]
            operands = {port: env[src] for port, src in zip(info.operands, step.srcs)}
            specs.append(OpSpec(step.kind, Scope.KERNEL, operands, {}, env[step.dst]))
        rw = [given[n] for n in rd.rw_operands]
        bound = {po.binds: scratch[po.name]} if po is not None else {}
        result = (specs, rw, list(scratch.values()), bound)
        if key is not None:
            self._recipe_expansions[key] = result
            if state is not None:
                _remember(_EXPANSIONS, key + state, (result, self._last_scratch_key, scratch))
        return result

    # A new run expands the same recipe on equal handles (same names, addresses, shapes) into an
    # equally empty TCM: the expansion, checks included, comes out the same, and only its scratch
    # allocations have to happen again. _EXPANSIONS keeps it across runs keyed by everything it
    # depends on, and a hit re-allocates the recorded scratch at the recorded addresses.
    def _tcm_state(self) -> tuple | None:
        tcm = self.mem.tcm
        return None if self._scopes else (len(self._recipe_scratch), tcm.top, tcm.capacity)

    def _replay_expansion(self, key: tuple) -> tuple | None:
        """The expansion an earlier run recorded for ``key`` in this TCM state, made this run's, or None."""
        state = self._tcm_state()
        cached = _EXPANSIONS.get(key + state) if state is not None else None
        if cached is None:
            return None
        result, scratch_key, scratch = cached
        existing = self._recipe_scratch.get(scratch_key)
        if existing is not None:  # the expansion reused scratch this run already holds
            if existing != scratch:
                return None
        else:
            if not self.mem.tcm.adopt(list(scratch.values())):
                return None
            for h in scratch.values():
                self.names[h.name] = h
            self._recipe_scratch[scratch_key] = scratch
        self._recipe_expansions[key] = result
        return result

    def _recipe_scratch_for(self, rd: RecipeDescriptor, given: Mapping[str, Handle]) -> dict[str, Handle]:
        """Allocate the recipe's scratch in the active scratch scope, or reuse a kernel-scope set.

        Kernel-scope scratch is allocated once per (recipe, RW operands, operand
        shapes), so a loop does not grow the TCM; composites sharing it also
        share their RW operands and are therefore serialized by the hazard rules.
        """
        key = (rd.name,) + tuple((n, h.addr if rd.operands[n] == "RW" else -1, h.shape, h.dtype)
                                 for n, h in given.items())
        self._last_scratch_key = key
        if not self._scopes and key in self._recipe_scratch:
            return self._recipe_scratch[key]
        shapes: dict[str, tuple[tuple[int, ...], str]] = {
            n: (given[like].shape, given[like].dtype) for n, like in rd.scratch_like.items()}
        if rd.primary_out is not None:
            po = rd.primary_out
            shapes[po.name] = (given[po.from_shape].shape, given[po.from_dtype].dtype)
        tag = len(self._recipe_scratch) if not self._scopes else f"s{len(self.commands)}"
        scratch = {n: self.alloc(shape, dtype, name=f"{rd.name}{tag}.{n}") for n, (shape, dtype) in shapes.items()}
        if not self._scopes:
            self._recipe_scratch[key] = scratch
        return scratch


class _Iteration:
    """The context manager behind ``tl.iteration`` (a class: a loop enters one per command group)."""

    __slots__ = ("tl", "j", "prev")

    def __init__(self, tl: TLContext, j: int):
        self.tl, self.j, self.prev = tl, j, -1

    def __enter__(self) -> None:
        self.prev, self.tl._iter = self.tl._iter, self.j

    def __exit__(self, *exc: object) -> None:
        self.tl._iter = self.prev


# --- lowering helpers -------------------------------------------------------------------------
def _entry_kind(entry: Any, where: str) -> str:
    if not isinstance(entry, Mapping) or "op" not in entry:
        raise ValidationError(f"{where}: expected a dict with an 'op' key, e.g. {{'op': 'scale', 'factor': 0.5}}; "
                              f"got {entry!r}.")
    return entry["op"]


def _entry_op(entry: Any, where: str, default_scope: Scope) -> OpSpec:
    kind = _entry_kind(entry, where)
    if kind in RECIPE_DESCRIPTORS:
        raise ValidationError(f"{where}: recipe {kind!r} can only appear in prologue=[...].")
    if kind not in OPS or kind == "gemm":
        raise ValidationError(f"{where}: unknown op {kind!r}; MATH ops are {', '.join(k for k in OPS if k != 'gemm')} "
                              f"and recipes are {', '.join(RECIPE_DESCRIPTORS)}.")
    scope = _scope(entry.get("scope", default_scope), where)
    operands: dict[str, Handle] = {}
    extra: dict[str, Any] = {}
    out = None
    for key, val in entry.items():
        if key in ("op", "scope"):
            continue
        if key == "out":
            out = val
        elif key in _SCALAR_KEYS:
            extra[key] = val
        else:
            operands[key] = val
    return OpSpec(kind, scope, operands, extra, out)


def _gemm_spec(a, b, out, trans_b, c) -> OpSpec:
    if c is not None:
        raise ValidationError("tl.composite(op='gemm') takes a, b and out; c= is for op='math'.")
    for n, h in (("a", a), ("b", b), ("out", out)):
        if not _is_handle(h):
            raise ValidationError(f"tl.composite(op='gemm'): {n}= must be a tensor handle, got {h!r}.")
    if a.ndim != 2 or b.ndim != 2:
        raise ValidationError(f"GEMM operands must be 2-D: a={a!r}, b={b!r}.")
    M, K = a.shape
    N = b.shape[0] if trans_b else b.shape[1]
    return OpSpec("gemm", Scope.KERNEL, {"a": a, "b": b}, {"m": M, "k": K, "n": N, "trans_b": bool(trans_b)}, out)


def _math_head(math_op, a, b, c, out, value, factor) -> OpSpec:
    if math_op not in OPS or math_op == "gemm":
        raise ValidationError(f"tl.composite(op='math'): math_op={math_op!r} is unknown; use one of "
                              f"{', '.join(k for k in OPS if k != 'gemm')}.")
    info = OPS[math_op]
    given = [(n, h) for n, h in (("a", a), ("b", b), ("c", c)) if h is not None]
    if len(given) != len(info.operands):
        raise ValidationError(f"math op {math_op!r} takes {len(info.operands)} operand(s) "
                              f"({', '.join(info.operands) or 'none'}) passed as a=, b=, c=; got "
                              f"{', '.join(n for n, _ in given) or 'none'}.")
    operands = {port: h for port, (_, h) in zip(info.operands, given)}
    extra: dict[str, Any] = {}
    for key, val in (("value", value), ("factor", factor)):
        if val is not None:
            extra[key] = val
    return OpSpec(math_op, Scope.KERNEL, operands, extra, out)


# --- caches that outlive a run ------------------------------------------------------------------
#: Lowered MATH heads, epilogue entries, GEMM composites and recipe expansions by value (handles
#: compare by name, space, address, shape, dtype): a kernel run again emits equal ops on equal
#: handles. Bounded: cleared when full.
_MATH_HEADS: dict[tuple, tuple[OpSpec, ...]] = {}
_ENTRY_OPS: dict[tuple, OpSpec] = {}
_GEMM_LOWERINGS: dict[tuple, tuple] = {}
_EXPANSIONS: dict[tuple, tuple] = {}
_MAX_ENTRIES = 4096


def _remember(cache: dict, key: tuple, value: object) -> None:
    if len(cache) >= _MAX_ENTRIES:
        cache.clear()
    cache[key] = value


def _math_head_across_runs(math_op, a, b, c, out, value, factor, where: int) -> tuple[OpSpec, ...]:
    """The validated one-op tuple of a MATH command, shared with earlier runs on equal handles."""
    try:
        key = (math_op, a, b, c, out, value, factor)
        flat = _MATH_HEADS.get(key)
    except TypeError:  # an unhashable argument: the checks below say what is wrong
        key = flat = None
    if flat is None:
        flat = (_math_head(math_op, a, b, c, out, value, factor),)
        validate_ops(flat, where=where)
        if key is not None:
            _remember(_MATH_HEADS, key, flat)
    return flat


# --- validation (shared by both forms) ----------------------------------------------------------
def _signature(ops: tuple[OpSpec, ...]) -> tuple | None:
    """Everything validity depends on (``OpSpec.signature`` of every op), or None."""
    sig = tuple(o.signature for o in ops)
    return None if None in sig else sig


#: Signatures of op lists that passed validation: a loop emits the same shapes again and again.
_VALID_SIGNATURES: set[tuple] = set()


def validate_ops(ops: tuple[OpSpec, ...], where: str | int = "composite") -> None:
    """Check a flat op list against DESIGN.md §3 invariants.

    Validity depends only on the ops' signature (kinds, scopes, operand
    spaces/shapes/dtypes, scalars), so a signature that passed once is not
    checked again. A check that depends on addresses (aliasing, say) does not
    belong here: it would be skipped on a cache hit.

    Raises:
        ValidationError: naming the op (position and kind), the operand and the fix.
    """
    sig = _signature(ops)
    if sig is not None and sig in _VALID_SIGNATURES:
        return
    _validate_ops(ops, f"command #{where}" if isinstance(where, int) else where)
    if sig is not None:
        _VALID_SIGNATURES.add(sig)


def _validate_ops(ops: tuple[OpSpec, ...], where: str) -> None:
    if not ops:
        raise ValidationError(f"{where}: a composite needs at least one op.")
    gemms = [i for i, o in enumerate(ops) if o.kind == "gemm"]
    if len(gemms) > 1:
        raise ValidationError(f"{where}: {len(gemms)} GEMM ops (at positions {gemms}); a composite holds at most "
                              f"one GEMM (ADR-0065 D6.1). Split it into one composite per GEMM.")
    head = gemms[0] if gemms else 0
    target: Handle | None = None
    for i, o in enumerate(ops):
        w = f"{where} op {i} ({o.kind})"
        info = OPS.get(o.kind)
        if info is None:
            raise ValidationError(f"{w}: unknown op kind {o.kind!r}; known kinds are {', '.join(OPS)}.")
        missing = [n for n in info.operands if n not in o.operands]
        unknown = [n for n in o.operands if n not in info.operands]
        if missing or unknown:
            raise ValidationError(f"{w}: operands {sorted(o.operands)} do not match; {o.kind} takes "
                                  f"{', '.join(info.operands) or 'no operands'}"
                                  + (f" (missing {', '.join(missing)})" if missing else "")
                                  + (f" (unknown {', '.join(unknown)})" if unknown else "") + ".")
        want_scalars = set(info.scalars)
        if set(o.extra) != want_scalars:
            raise ValidationError(f"{w}: scalars {sorted(o.extra)} do not match; {o.kind} takes "
                                  f"{', '.join(info.scalars) or 'none'}.")
        for n, h in o.operands.items():
            if not _is_handle(h):
                raise ValidationError(f"{w}: operand {n!r} must be a tensor handle, got {h!r}.")
        if info.accumulator:
            if o.out is not None:
                raise ValidationError(f"{w}: {o.kind} updates the accumulator in place and takes no out=.")
        elif not _is_handle(o.out):
            raise ValidationError(f"{w}: out= must be a tensor handle, got {o.out!r}.")
        if i != head:
            for n, h in list(o.operands.items()) + ([("out", o.out)] if o.out is not None else []):
                if h.space != Space.TCM:
                    role = "prologue" if i < head else "epilogue"
                    raise ValidationError(f"{w}: {role} operand {n}={h.name} is in HBM; only the head op may "
                                          f"stream from HBM (ADR-0065 D6.7). tl.load it into TCM first.")
        if i < head and o.scope is not Scope.KERNEL:
            raise ValidationError(f"{w}: ops before the GEMM run once (scope 'kernel'), got {o.scope.value!r}.")
        if o.kind == "gemm":
            _check_gemm(o, w)
        elif gemms and i > head and o.scope is not Scope.KERNEL:
            if not info.accumulator:
                raise ValidationError(f"{w}: scope {o.scope.value!r} runs on the accumulator tile, which only "
                                      f"scale and add can do; use scope 'kernel' for a post-loop op.")
            other = o.operands.get("other")
            if other is not None and other.shape != ops[head].out.shape:
                raise ValidationError(f"{w}: other={other.name} has shape {other.shape}, the GEMM output "
                                      f"{ops[head].out.name} has {ops[head].out.shape}; they must match.")
        else:
            if gemms and i > head and info.accumulator and target.space != Space.TCM:
                raise ValidationError(f"{w}: post-loop {o.kind} updates {target.name} in place, but {target.name} "
                                      f"is in HBM; MATH ops work on TCM. Give the GEMM a TCM out (tl.alloc) and "
                                      f"tl.store it, or use scope 'output_tile' to {o.kind} the accumulator.")
            _check_math(o, w, target)
        if o.out is not None:
            target = o.out
        if not gemms and i == 0 and o.out is not None and o.out.space != Space.TCM:
            raise ValidationError(f"{w}: out={o.out.name} is in HBM; MATH ops write TCM. Write to a tl.alloc "
                                  f"handle and tl.store it.")


def _check_gemm(o: OpSpec, w: str) -> None:
    a, b, out = o.operands["a"], o.operands["b"], o.out
    M, K, N, tb = o.extra["m"], o.extra["k"], o.extra["n"], o.extra["trans_b"]
    if a.ndim != 2 or b.ndim != 2 or out.ndim != 2:
        raise ValidationError(f"{w}: a, b and out must be 2-D (a {a.shape}, b {b.shape}, out {out.shape}).")
    want_b = (N, K) if tb else (K, N)
    if a.shape != (M, K) or b.shape != want_b or out.shape != (M, N):
        raise ValidationError(f"{w}: shape mismatch: a={a.name} {a.shape} must be (m, k)=({M}, {K}), "
                              f"b={b.name} {b.shape} must be {want_b}{' (trans_b)' if tb else ''}, "
                              f"out={out.name} {out.shape} must be ({M}, {N}).")


def _check_math(o: OpSpec, w: str, target: Handle | None) -> None:
    info = OPS[o.kind]
    if info.accumulator:
        if target is None:
            raise ValidationError(f"{w}: {o.kind} updates the preceding op's output, but no earlier op has one.")
        other = o.operands.get("other")
        if other is not None and other.shape != target.shape:
            raise ValidationError(f"{w}: other={other.name} {other.shape} must match {target.name} {target.shape}.")
        return
    shapes = [h.shape for h in o.operands.values()]
    if info.reduction:
        a = o.operands["a"]
        want = (a.shape[0], 1)
        if a.ndim != 2 or o.out.shape != want:
            raise ValidationError(f"{w}: {o.kind} reduces each row of a 2-D a={a.name} {a.shape} into out of "
                                  f"shape {want}; out={o.out.name} is {o.out.shape}.")
        return
    if o.kind in ("mul_bcast", "div_bcast"):
        a, b = o.operands["a"], o.operands["b"]
        if b.shape not in ((a.shape[0], 1), a.shape):
            raise ValidationError(f"{w}: b={b.name} {b.shape} must be a per-row column ({a.shape[0]}, 1).")
    try:
        shape = np.broadcast_shapes(*shapes, o.out.shape) if shapes else o.out.shape
    except ValueError:
        shape = None
    if shape != o.out.shape:
        desc = ", ".join(f"{n}={h.name} {h.shape}" for n, h in o.operands.items())
        raise ValidationError(f"{w}: operand shapes ({desc}) do not broadcast to out={o.out.name} {o.out.shape}.")
