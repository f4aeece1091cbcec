"""TLContext: the ``tl`` object a kernel receives; every call emits commands.

A kernel runs once on the host. ``tl`` validates each call at emit time
(raising :class:`ValidationError` that names the op, the operand and the fix),
lowers the user API to flat :class:`CompositeCmd` / :class:`DmaCmd` and
records them in program order for the scheduler.

Lowering is pure: a call becomes commands and nothing is remembered across
calls or runs except what the program itself owns (its commands, its TCM and
its kernel-scope recipe scratch). The one cache of the simulator sits at the
scheduler boundary (``pe.templates.PlanCache``), keyed by flat-op content.

Handle lifetimes (DESIGN.md §2): every handle a call names must have been
made by this run's memories — ``sim.hbm`` tensors of this simulator, TCM
allocated by this run — and, if it was allocated inside a
``tl.scratch_scope()``, that scope must still be open. Anything else is a
:class:`ValidationError` naming the handle and where it came from.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..config import Topology
from ..errors import TraceError, ValidationError
from ..memory import DTYPES, Arena, CommandName, Handle, LoopHandle, Memory, Ring, Space
from ..pe.commands import Command, Completion, CompositeCmd, DmaCmd, OpSpec, Scope
from ..pe.program import Loop, Plain, Trace, loop_period
from ..symbolic import FIX, Index, LoopVar
from .binding import unwrap, unwrap_entries
from .tl_recipes import RECIPE_DESCRIPTORS, RecipeDescriptor
from .validate import (_NO_OPS, At, _check_list, _entry_kind, _entry_op, _gemm_spec, _is_handle, _is_int,
                       _made_by_recipe, _math_head, _recipe_notes, _validate_ops, check_scalar)

#: The most commands one launch may hold once its tl.range loops are instantiated. The steady state can time
#: far more, but the op_log and everything read from it have a row per stage: a bound that an op_log can be
#: built under (decode's largest run, 2**18 tiles of opt3, is about 2.6 M commands).
MAX_COMMANDS = 1 << 26
_DTYPE_NAMES = frozenset(DTYPES)


class TLContext:
    """The kernel language. See DESIGN.md §2 for the surface and §13 for ``tl.range``.

    Attributes:
        commands: the emitted commands, in program order (a lazy sequence: loops are
            instantiated when read; :meth:`trace` is the launch as data).
        waits: ``(before_cmd, wait_for_cmd)`` pairs from :meth:`wait` outside loops.
        names: every handle the kernel named, by name (for ``Run.read``): a list per
            name, since a name may be given more than once.
    """

    Index = Index

    def __init__(self, topo: Topology, memory: Memory):
        self.topo = topo
        self.mem = memory
        self.hbm: Arena = memory.hbm
        #: this run's TCM; a bare TLContext owns whatever TCM its memory holds when it is made
        self.tcm: Arena = memory.tcm
        self.waits: list[tuple[int, int]] = []
        self.names: dict[str, list[Handle]] = {}
        self._segments: list[Plain | Loop] = []
        self._plain: list[Command] = []     # the run of plain commands being emitted
        self._plain_first = 0
        self._ncmd = 0                       # the id the next command gets (iteration 0's, in a body)
        self._loop: _OpenLoop | None = None  # the tl.range body being traced
        self._n_loops = 0
        self._broken: str | None = None
        self._iter: int | Index = -1
        self._scopes: list[tuple[int, int]] = []
        #: kernel-scope recipe scratch, by (recipe, RW operand addresses, operand shapes and dtypes)
        self._recipe_scratch: dict[tuple, dict[str, Handle]] = {}
        #: marks the completions this run hands out
        self._token = object()
        #: TCM buffers named after their source (``tl.load`` without ``name=``): ``id(buffer) -> (buffer, source,
        #: suffix)``, so that a trace bound to other tensors names them after its own (``binding``)
        self.named_after: dict[int, tuple[Handle, Handle, str]] = {}

    def __repr__(self) -> str:
        it = self._iter.text if isinstance(self._iter, Index) else self._iter
        return f"TLContext({self._ncmd} commands, iter={it}, {len(self._scopes)} open scratch scopes)"

    # --- the trace -----------------------------------------------------------------------
    def trace(self) -> Trace:
        """The launch traced so far, as data (:class:`~kbwork.pe.program.Trace`).

        Raises:
            TraceError: a ``tl.range`` body was left by ``break`` or ``return``, or is still open.
        """
        self._check_open()
        if self._loop is not None:
            raise TraceError("the kernel ended inside a tl.range body; a body must run to its end.")
        return Trace(self._segments + ([Plain(self._plain_first, tuple(self._plain))] if self._plain else []),
                     list(self.waits))

    @property
    def commands(self):
        """Every command emitted so far, in program order (a lazy sequence)."""
        if self._loop is None:
            return self.trace().commands
        # inside a body: the commands before it (the body's own are not instantiated yet)
        return Trace(self._segments + [Plain(self._plain_first, tuple(self._plain))], list(self.waits)).commands

    def _check_open(self) -> None:
        if self._broken is not None:
            raise TraceError(self._broken)

    # --- loops (DESIGN.md §13) -------------------------------------------------------------
    def range(self, *args: int) -> "_Range":
        """``for j in tl.range(stop)`` / ``tl.range(start, stop[, step])``: a loop whose body is traced once.

        Yields one symbolic :class:`~kbwork.symbolic.Index` ``j``; the Python
        code of the body runs once (side effects happen once, as in JAX), and
        the program is the body instantiated for every ``j`` in the range. An
        empty range emits nothing, but its body is still traced, so its errors
        show. Like Python's ``range``, the object may be iterated again: each
        ``for`` over it is a loop of its own.

        Raises:
            TraceError: a ``tl.range`` inside a body (flatten it), or bounds that are indices.
            ValidationError: bounds that are not ints, or a zero step.
        """
        return _Range(self, args)

    def _trace_loop(self, *args: int) -> Iterator[Index]:
        """One ``for`` over ``tl.range(*args)``: opens the loop, yields its index once, closes it."""
        self._check_open()
        if self._loop is not None:
            raise TraceError("tl.range inside a tl.range body: loops do not nest; flatten the two into one "
                             "tl.range (j = outer * n_inner + inner) or unroll the inner one in Python.")
        if not 1 <= len(args) <= 3:
            raise ValidationError(f"tl.range takes (stop), (start, stop) or (start, stop, step); got {len(args)} "
                                  f"arguments.")
        for a in args:
            if isinstance(a, Index):
                raise TraceError(f"tl.range({a.text}): a loop bound that is another loop's index; loops do not "
                                 f"nest, and bounds are ints.")
            if not _is_int(a):
                raise ValidationError(f"tl.range bounds must be ints, got {a!r} ({type(a).__name__}).")
        start, stop, step = (0, int(args[0]), 1) if len(args) == 1 else (int(args[0]), int(args[1]),
                                                                          int(args[2]) if len(args) == 3 else 1)
        if step == 0:
            raise ValidationError("tl.range: step must not be zero.")
        n = max(0, -(-(stop - start) // step)) if step > 0 else max(0, -(-(start - stop) // -step))
        var = LoopVar(self._n_loops, n, start, step)
        self._n_loops += 1
        self._loop = _OpenLoop(var, self._ncmd, len(self._scopes), self._iter)
        if not n:
            # an empty range: the body is traced (its errors show), but what it allocates -- recipe scratch
            # above all -- is undone when it closes, as a Python loop of no iterations allocates nothing
            self._loop.undo = (self.tcm.mark(note="the body of an empty tl.range (0 iterations)"),
                               len(self._recipe_scratch))
        if self._plain:
            self._segments.append(Plain(self._plain_first, tuple(self._plain)))
            self._plain = []
        j = Index(var, step, start)
        try:
            yield j
        except GeneratorExit:
            # the for statement left the body early (break, return or an exception): what follows is not
            # the body, and the loop cannot be instantiated
            var.closed = True
            self._loop = None
            self._broken = ("a tl.range body was left early (break, return or an exception inside it); a body runs "
                            "to its end, once, for every iteration. Peel the iterations that differ out of the loop.")
            raise
        self._close_loop()

    def _close_loop(self) -> None:
        lp = self._loop
        var = lp.var
        var.closed = True
        var.body_len = len(lp.body)
        self._loop = None
        if lp.undo is not None:
            mark, n_sets = lp.undo
            self.tcm.release(mark, closed_at="when it had been traced")
            for key in list(self._recipe_scratch)[n_sets:]:
                del self._recipe_scratch[key]
        if lp.deferred:
            self._allocate_deferred(lp)
        self._iter = lp.outer_iter
        loop = Loop(var.number, lp.first, tuple(lp.body), var.iterations, tuple(lp.iters), tuple(lp.waits),
                    loop_period(var), var)
        if loop.end_cmd > MAX_COMMANDS:
            raise ValidationError(f"a tl.range of {var.iterations:,} iterations with {len(lp.body)} command(s) in "
                                  f"its body makes the launch {loop.end_cmd:,} commands; a launch holds at most "
                                  f"{MAX_COMMANDS:,} (the op_log has a row per stage). Use fewer iterations "
                                  f"(larger tiles), or split the work over several launches.")
        self._segments.append(loop)
        self._ncmd = loop.end_cmd
        n = len(lp.body)
        if var.iterations:
            # a tl.wait at the end of the body: after the last iteration it holds the loop's next command
            last = lp.first + (var.iterations - 1) * n
            self.waits += [(self._ncmd, last + t if rel else t) for k, t, rel in lp.waits if k == n]
        self._plain_first = self._ncmd

    def ring(self, n: int, shape: Sequence[int] | int, dtype: Any = "fp32", *, name: str) -> Ring:
        """``n`` kernel-scope TCM buffers a loop indexes cyclically: ``S[j + c]`` is slot ``(j + c) mod n``.

        Raises:
            ValidationError: a bad count, name, shape or dtype.
            TraceError: called inside a tl.range body (allocate before the loop).
            TcmOverflowError: the TCM cannot hold it.
        """
        if isinstance(n, Index):
            raise TraceError(f"tl.ring({n.text}, ...): the number of slots must be an int; {FIX}.")
        if not _is_int(n) or n < 1:
            raise ValidationError(f"tl.ring: n must be a positive int (the number of buffers), got {n!r}.")
        if not isinstance(name, str) or not name:
            raise ValidationError(f"tl.ring: name must be a non-empty string, got {name!r}.")
        slots = tuple(self.alloc(shape, dtype, name=f"{name}{i}") for i in range(int(n)))
        return Ring(name, slots)

    # --- handles and memory -------------------------------------------------------------
    def ref(self, t: Handle) -> Handle:
        """A handle on HBM data (``space="hbm"``, ``pinned=False``); slice it with ``t[a:b]``.

        Raises:
            ValidationError: ``t`` is not a HBM handle of this simulator.
        """
        h = unwrap(t)
        if not _is_handle(h) or h.space != Space.HBM:
            raise ValidationError(f"tl.ref expects a HBM tensor handle, got {t!r}; "
                                  f"place host data with sim.hbm(name, array).")
        self._own(h, "tl.ref")
        return t

    def alloc(self, shape: Sequence[int] | int, dtype: Any = "fp32", *, name: str) -> Handle:
        """Allocate persistent (or scope-local) TCM scratch; returns a pinned TCM handle.

        Raises:
            ValidationError: a bad name, shape or dtype.
            TraceError: inside a tl.range body, outside a scratch scope opened in the body.
            TcmOverflowError: the TCM cannot hold it.
        """
        self._check_open()
        lp = self._loop
        if lp is not None and len(self._scopes) <= lp.scope_depth:
            raise TraceError(f"TCM allocation {name!r} inside a tl.range body: the body is traced once, so it would "
                             f"allocate once for every iteration. Allocate it before the loop (a tl.ring for a "
                             f"buffer per iteration), or inside a tl.scratch_scope() opened in the body.")
        if isinstance(shape, Index) or (isinstance(shape, (tuple, list)) and Index in map(type, shape)):
            raise TraceError(f"TCM allocation {name!r}: a shape that depends on the loop index; shapes are "
                             f"constant ({FIX}).")
        h = self.tcm.alloc(name, shape, dtype)
        self._name(h)
        return h

    def full(self, shape: Sequence[int] | int, value: float, dtype: Any = "fp32", *, name: str,
             label: str | None = None) -> Handle:
        """``alloc`` plus a MATH ``fill`` command; returns the TCM handle.

        Raises:
            ValidationError: a bad shape, dtype or value (see :func:`check_scalar`).
            TcmOverflowError: the TCM cannot hold it.
        """
        check_scalar(f"tl.full(name={name!r})", "value", value)
        h = self.alloc(shape, dtype, name=name)
        self.composite(op="math", math_op="fill", out=h, value=value, label=label or f"fill {name}")
        return h

    @contextlib.contextmanager
    def scratch_scope(self) -> Iterator[None]:
        """TCM allocated inside the ``with`` block is released at its exit (ADR-0063).

        Handles allocated inside die with the scope: naming one in a later
        command is a ValidationError. Commands still in flight that use the
        released bytes are protected by the hazard rules (DESIGN.md §5).
        """
        mark = self.tcm.mark()
        self._scopes.append(mark)
        try:
            yield
        finally:
            self._scopes.pop()
            n = self._ncmd
            self.tcm.release(mark, closed_at=f"after command #{n - 1}" if n else "before any command")

    def iteration(self, j: int | Index) -> "_Iteration":
        """Label the commands emitted inside ``with tl.iteration(j):`` with loop index ``j`` (op_log ``iter``).

        In a ``tl.range`` body ``j`` may be its index or an affine image of it
        (``tl.iteration(j + 1)``); each iteration's commands carry its value.

        Raises:
            ValidationError: ``j`` is not a non-negative int (at the loop's first and last iteration).
            TraceError: an index of a loop whose body is not being traced.
        """
        if isinstance(j, Index):
            lp = self._loop
            if lp is None or j.var is not lp.var:
                raise TraceError(f"tl.iteration({j.text}): the index of a tl.range loop labels commands of its own "
                                 f"body only.")
            n = lp.var.iterations
            for i, which in ((0, "first"), (n - 1, "last")) if n else ():
                if j.at(i) < 0:
                    raise ValidationError(f"tl.iteration({j.text}) is {j.at(i)} at the {which} iteration "
                                          f"(j = {lp.var.j_at(i)}); loop labels are non-negative ints.")
            return _Iteration(self, j)
        if not _is_int(j) or j < 0:
            raise ValidationError(f"tl.iteration expects a non-negative int loop index, got {j!r}.")
        return _Iteration(self, int(j))

    # --- DMA ----------------------------------------------------------------------------
    def load(self, src: Handle, *, name: str | None = None, label: str | None = None) -> Handle:
        """DMA ``src`` (HBM) into freshly allocated TCM; returns the pinned TCM handle.

        Raises:
            ValidationError: ``src`` is not a HBM handle of this simulator.
            TcmOverflowError: the TCM cannot hold it.
        """
        src = unwrap(src)
        if not _is_handle(src) or src.space != Space.HBM:
            raise ValidationError(f"tl.load expects a HBM handle, got {src!r}; a TCM handle is already loaded.")
        self._own(src, "tl.load")
        dst = self.alloc(src.shape, src.dtype, name=f"{src.name}_tcm" if name is None else name)
        if name is None:  # named after its source: a trace bound to other tensors names it after theirs
            if isinstance(src, LoopHandle):  # a source that differs per iteration
                dst = LoopHandle.named(dst, src, "_tcm")
            else:
                self.named_after[id(dst)] = (dst, src, "_tcm")
        self._emit(self._dma(src, dst, label, "dma_load "))
        return dst

    def _dma(self, src: Handle, dst: Handle, label: str | None, verb: str) -> DmaCmd:
        auto = verb if label is None else None  # a default label names the source: made again where it moves
        return DmaCmd(self._next(), src, dst, self._label(label, verb + src.name), self._iter, auto)

    def store(self, src: Handle, dst: Handle, *, label: str | None = None) -> Completion:
        """DMA the TCM handle ``src`` back to the HBM handle ``dst``; returns its completion.

        Raises:
            ValidationError: wrong spaces, handles not of this run, or shapes/dtypes that differ
                (a DMA does not convert).
        """
        src, dst = unwrap(src), unwrap(dst)
        if not _is_handle(src) or src.space != Space.TCM:
            raise ValidationError(f"tl.store: source must be a TCM handle, got {src!r}.")
        if not _is_handle(dst) or dst.space != Space.HBM:
            raise ValidationError(f"tl.store: destination must be a HBM handle, got {dst!r}.")
        self._own(src, "tl.store source")
        self._own(dst, "tl.store destination")
        if src.shape != dst.shape or src.dtype != dst.dtype:
            raise ValidationError(f"tl.store {src.name} -> {dst.name}: shapes/dtypes differ "
                                  f"({src.shape} {src.dtype} vs {dst.shape} {dst.dtype}); a DMA copies bytes, "
                                  f"so allocate the destination with the same shape and dtype.")
        return self._emit(self._dma(src, dst, label, "dma_store "))

    def wait(self, completion: Completion) -> None:
        """Stall PE_CPU (before the next command) until ``completion``'s command has completed.

        A hand-built ``Completion(k)`` means command k of this run. In a
        ``tl.range`` body, the completion of a command of the same body means
        that command in the same iteration.

        Raises:
            ValidationError: not a Completion, one handed out by another run, or a command not yet emitted.
            TraceError: the completion of a tl.range body's command, waited on outside that body.
        """
        self._check_open()
        if not isinstance(completion, Completion):
            raise ValidationError(f"tl.wait expects the Completion of an emitted command, got {completion!r}.")
        if completion.origin is not None and completion.origin is not self._token:
            raise ValidationError(f"tl.wait: {completion!r} was returned by another run (or another kernel "
                                  f"context); a completion means a command of the run that emitted it. Wait on "
                                  f"a command of this kernel.")
        k = completion.cmd
        lp = self._loop
        if isinstance(k, Index):
            raise TraceError(f"tl.wait(Completion({k.text})): a command id that is a tl.range index needs a "
                             f"concrete value; wait on the Completion a command of this body returned (that command, in "
                             f"each iteration), or {FIX}.")
        if completion.loop is not None and (lp is None or completion.loop is not lp.var):
            raise TraceError(f"tl.wait({completion!r}): that command belongs to a tl.range body, so it is a "
                             f"different command in every iteration; wait on it inside its body, or {FIX}.")
        if not _is_int(k) or not 0 <= k < self._ncmd:
            raise ValidationError(f"tl.wait: {completion!r} names no emitted command (this run has emitted "
                                  f"{self._ncmd}); wait on an earlier command's Completion.")
        if lp is not None:
            rel = completion.loop is lp.var
            lp.waits.append((self._ncmd - lp.first, int(k) - lp.first if rel else int(k), rel))
        else:
            self.waits.append((self._ncmd, int(k)))

    # --- composites ---------------------------------------------------------------------
    def composite(self, op: str | None = None, *, a: Handle | None = None, b: Handle | None = None,
                  c: Handle | None = None, out: Handle | None = None, trans_b: bool = False,
                  math_op: str | None = None, value: float | None = None, factor: float | None = None,
                  prologue: Sequence[Mapping[str, Any]] | None = (),
                  epilogue: Sequence[Mapping[str, Any]] | None = (),
                  ops: Sequence[OpSpec] | None = None, rw_handles: Sequence[Handle] | None = (),
                  label: str | None = None) -> Completion:
        """Emit one composite command; returns its :class:`Completion`.

        Legacy form: ``op="gemm"`` (``a``, ``b``, ``out``, ``trans_b``) or
        ``op="math"`` (``math_op``, ``a``/``b``/``c``, ``out``, ``value``/``factor``),
        with ``prologue=[...]`` (a recipe or KERNEL-scope MATH ops) and
        ``epilogue=[...]`` (dicts with ``"op"`` and an optional ``"scope"``).
        ``op="math"`` with a recipe in ``prologue`` and no ``math_op`` is a
        MATH-only composite made of the recipe alone. Flat form:
        ``ops=[OpSpec, ...]``, where an OpSpec whose kind names a recipe is
        expanded in place. Both lower to the same CompositeCmd. ``None`` for
        any keyword means "not given". If a recipe has a primary output, the
        completion's ``primary_out`` is that (pinned TCM) handle.

        Raises:
            ValidationError: any invariant of DESIGN.md §3 is broken, a scalar is
                not a real number, or a handle is not valid in this run.
        """
        self._check_open()
        args = (op, unwrap(a), unwrap(b), unwrap(c), unwrap(out), trans_b, math_op, value, factor,
                unwrap_entries(prologue), unwrap_entries(epilogue), unwrap_entries(ops), unwrap_entries(rw_handles),
                label)
        cmd, recipe = self._lower_composite(args, self._where(), self._iter)
        return self._emit(cmd)

    def _where(self) -> "At":
        """How errors name the command about to be emitted (``command #9 (in a tl.range body)``), written only
        when an error needs it."""
        return At(self._ncmd, self._loop is not None)

    def _lower_composite(self, args: tuple, where: str, iter_: int | Index) -> tuple[CompositeCmd, tuple | None]:
        """Lower one ``tl.composite`` call (``args`` in the order of its parameters) to its command.

        The handles' ownership is checked, the recipe's scratch found or allocated, the completion made.

        Returns:
            The command, and where its recipe is (``((part, index), descriptor, scratch)``, or ``None``).
        """
        op, a, b, c, out, trans_b, math_op, value, factor, prologue, epilogue, ops, rw_handles, label = args
        label = self._label(label, None)
        prologue = () if prologue is None else prologue
        epilogue = () if epilogue is None else epilogue
        rw_handles = () if rw_handles is None else rw_handles
        for what, seq in (("prologue", prologue), ("epilogue", epilogue), ("rw_handles", rw_handles)):
            if seq.__class__ is not list and seq.__class__ is not tuple:
                _check_list(seq, f"tl.composite: {what}=")
        if trans_b is None:
            trans_b = False
        if ops is not None:
            given_args = [k for k, v in dict(op=op, a=a, b=b, c=c, out=out, math_op=math_op, value=value,
                                              factor=factor).items() if v is not None]
            if given_args or prologue or epilogue or trans_b:
                raise ValidationError(f"tl.composite: the flat form ops=[...] takes no "
                                      f"{', '.join(given_args) or 'prologue/epilogue/trans_b'}; put everything into "
                                      f"the OpSpecs.")
            flat, rw, scratch, primary, notes, recipe = self._lower_flat(ops, rw_handles, where)
        else:
            flat, rw, scratch, primary, notes, recipe = self._lower_legacy(
                op, a, b, c, out, trans_b, math_op, value, factor, prologue, epilogue, rw_handles, where)
        for h in rw:
            if not _is_handle(h):
                raise ValidationError(f"{where}: rw_handles holds {h!r}, which is not a tensor handle.")
            if not self._owns(h):
                self._own(h, f"{where} rw_handles")
        made = _made_by_recipe(notes)
        self._check_ops(flat, where, made)
        _validate_ops(flat, where, notes, made)
        completion = self._next(primary)
        return CompositeCmd(completion, flat, rw, True, scratch,
                            label if label is not None else "+".join(o.kind for o in flat), iter_), recipe

    # --- internals ----------------------------------------------------------------------
    def _owns(self, h: Handle) -> bool:
        """Whether this run's memories made ``h``, its scratch scope (if any) is still open, and, for a handle
        made in a ``tl.range`` body, that body is the one being traced."""
        o = h.origin
        return (o is not None and o._arena() is (self.hbm if h.space is Space.HBM else self.tcm) and o.alive
                and (h.__class__ is not LoopHandle or h.var is None or not h.var.closed))

    def _own(self, h: Handle, where: str) -> None:
        """Refuse ``h`` unless :meth:`_owns` it. (Where ``where`` is an f-string, hot paths test ``_owns``
        first, so the message is built only for a handle that fails.)

        Raises:
            ValidationError: a handle of another run or simulator, or of a scratch scope that has closed.
            TraceError: a handle made in the body of a ``tl.range`` loop that has ended.
        """
        if not self._owns(h):
            arena = self.hbm if h.space is Space.HBM else self.tcm
            problem = arena.check(h)
            if problem is None and isinstance(h, LoopHandle):
                n = h.var.iterations
                last = (f"the last iteration's is {h.name_at(n - 1)}" if n else
                        "that loop ran no iteration, so it names none")
                raise TraceError(f"{where}: {h.name} was made in the body of a tl.range loop that has ended; it is "
                                 f"a different tensor in every iteration, so after its loop it names none of them "
                                 f"({last}). Use it inside the body, or name the tensor you mean ({FIX}).")
            raise ValidationError(f"{where}: {problem}")

    def _check_ops(self, flat: tuple[OpSpec, ...], where: str, made: range = _NO_OPS) -> None:
        """Refuse an op's handle this run does not own. The ops at ``made`` are a recipe's expansion: their
        handles are the recipe's operands, which the expansion checked, and scratch it allocated."""
        for i, o in enumerate(flat):
            if i in made:
                continue
            for h in (*o.operands.values(), o.out):
                if isinstance(h, Handle) and not self._owns(h):
                    self._own(h, f"{where} op {i} ({o.kind})")

    def _name(self, h: Handle) -> None:
        """Record ``h`` under its name for ``Run.read``; handles whose scope closed are dropped on the way."""
        same = self.names.get(h.name)
        if same is None:
            self.names[h.name] = [h]
        else:
            same[:] = [x for x in same if x.origin is None or x.origin.alive]
            same.append(h)

    def _next(self, primary: Handle | None = None) -> Completion:
        return Completion(self._ncmd, primary, self._token, None if self._loop is None else self._loop.var)

    @staticmethod
    def _label(label: Any, default: str | None) -> str | None:
        if label is None:
            return default
        if isinstance(label, Index):
            raise TraceError(f"label={label.text}: a label is text, the same in every iteration of a tl.range body; "
                             f"the op_log's iter column says which iteration a command belongs to.")
        if not isinstance(label, str):
            raise ValidationError(f"label= must be a string, got {label!r}.")
        return label

    def _emit(self, cmd: Command) -> Completion:
        if self._broken is not None:
            raise TraceError(self._broken)
        lp = self._loop
        if lp is None:
            self._plain.append(cmd)
        else:
            lp.body.append(cmd)
            lp.iters.append(self._iter)
        self._ncmd += 1
        return cmd.completion

    def _lower_flat(self, ops: Sequence[OpSpec], rw_handles: Sequence[Handle], where: str):
        _check_list(ops, "tl.composite(ops=...): ops")
        flat: list[OpSpec] = []
        rw: list[Handle] = []
        scratch: tuple[Handle, ...] = ()
        primary: Handle | None = None
        binds: str | None = None  # the head-GEMM port the recipe's primary output binds to
        notes: list[tuple[int, int, str, str]] = []
        recipe: tuple | None = None
        for i, o in enumerate(ops):
            if not isinstance(o, OpSpec):
                raise ValidationError(f"tl.composite(ops=...): item {i} is {type(o).__name__}, not an OpSpec.")
            rd = RECIPE_DESCRIPTORS.get(o.kind)
            if rd is not None:
                if scratch:
                    raise ValidationError(f"{where}: only one recipe per composite is supported (op {i}).")
                if o.out is not None:
                    raise ValidationError(f"{where} op {i}: recipe {o.kind!r} writes its own scratch; give it no out=.")
                entry = {"scope": o.scope, **o.operands, **o.extra}
                specs, r_rw, scratch_set, primary = self._expand_recipe(rd, entry, f"{where} op {i}")
                scratch = tuple(scratch_set.values())
                recipe = (("ops", i), rd, scratch_set)
                notes.append(_recipe_notes(rd, f"ops[{i}]", len(flat)))
                flat += specs
                rw += r_rw
                binds = rd.primary_out.binds if rd.primary_out is not None else None
                continue
            if o.kind == "gemm" and binds is not None and binds not in o.operands:
                # the flat form of the auto-binding: a GEMM after the recipe that leaves the port open
                o = OpSpec(o.kind, o.scope, {binds: primary, **o.operands}, o.extra, o.out)
            flat.append(o)
        rw += [h for h in rw_handles if h not in rw]
        return tuple(flat), tuple(rw), scratch, primary, notes, recipe

    def _lower_legacy(self, op, a, b, c, out, trans_b, math_op, value, factor, prologue, epilogue, rw, where):
        if op not in ("gemm", "math"):
            raise ValidationError(f"tl.composite: op={op!r}; use op='gemm' or op='math', or the flat form ops=[...].")
        pre: list[OpSpec] = []
        scratch: tuple[Handle, ...] = ()
        recipe_rw: list[Handle] = []
        primary: Handle | None = None
        binds: str | None = None
        notes: list[tuple[int, int, str, str]] = []
        recipe: tuple | None = None
        for i, entry in enumerate(prologue):
            kind = _entry_kind(entry, f"prologue[{i}]")
            rd = RECIPE_DESCRIPTORS.get(kind)
            if rd is not None:
                if scratch:
                    raise ValidationError(f"prologue[{i}]: only one recipe per composite is supported.")
                specs, recipe_rw, scratch_set, primary = self._expand_recipe(rd, entry, f"{where} prologue[{i}]")
                scratch = tuple(scratch_set.values())
                recipe = (("prologue", i), rd, scratch_set)
                notes.append(_recipe_notes(rd, f"prologue[{i}]", len(pre)))
                pre += specs
                binds = rd.primary_out.binds if rd.primary_out is not None else None
                prologue_recipe = rd.name
            else:
                spec = _entry_op(entry, f"prologue[{i}]", default_scope=Scope.KERNEL)
                if spec.scope is not Scope.KERNEL:
                    raise ValidationError(f"prologue[{i}] {kind!r}: prologue ops run once before the tile loop; "
                                          f"drop scope={spec.scope.value!r} (or use 'kernel').")
                pre.append(spec)
        head: OpSpec | None
        if op == "gemm":
            if math_op is not None or value is not None or factor is not None:
                raise ValidationError("tl.composite(op='gemm'): math_op/value/factor belong to op='math' "
                                      "(use an epilogue {'op': 'scale', 'factor': f} to scale a GEMM).")
            if primary is not None and binds is not None:
                given = {"a": a, "b": b}.get(binds)
                if given is not None:
                    raise ValidationError(f"{where}: recipe {prologue_recipe!r} binds the head GEMM's {binds} to its "
                                          f"primary output {primary.name}, but the call also gives "
                                          f"{binds}={getattr(given, 'name', given)} (ADR-0065 D6.6). Omit {binds}=, "
                                          f"or drop the recipe.")
                if binds == "a":
                    a = primary
                else:
                    b = primary
            head = _gemm_spec(a, b, out, trans_b, c)
        else:
            if trans_b:
                raise ValidationError("tl.composite(op='math') takes no trans_b (it is a GEMM option).")
            if math_op is None:
                if not scratch:
                    raise ValidationError(f"{where}: tl.composite(op='math') needs math_op=..., or a recipe in "
                                          f"prologue=[...] to make a MATH-only composite of the recipe alone.")
                extra_args = [n for n, v in (("a", a), ("b", b), ("c", c), ("out", out), ("value", value),
                                             ("factor", factor)) if v is not None]
                if extra_args:
                    raise ValidationError(f"{where}: a MATH-only recipe composite is the recipe's ops alone; it takes "
                                          f"no {', '.join(extra_args)} (give math_op= for a head op).")
                head = None
            else:
                head = _math_head(math_op, a, b, c, out, value, factor)
        default_scope = Scope.OUTPUT_TILE if op == "gemm" else Scope.KERNEL
        post = [_entry_op(e, f"epilogue[{i}]", default_scope) for i, e in enumerate(epilogue)]
        flat = tuple(pre) + ((head,) if head is not None else ()) + tuple(post)
        rw_all = tuple(recipe_rw) + tuple(h for h in rw if h not in recipe_rw)
        return flat, rw_all, scratch, primary, notes, recipe

    def _expand_recipe(self, rd: RecipeDescriptor, entry: Mapping[str, Any], where: str):
        """Expand one recipe entry: ``(ops, rw handles, scratch set by name, primary output or None)``."""
        where = f"{where}: recipe {rd.name!r}"
        if entry.get("scope", "kernel") not in ("kernel", Scope.KERNEL):
            raise ValidationError(f"{where}: a recipe runs once before the tile loop; drop scope=.")
        given = {k: v for k, v in entry.items() if k not in ("op", "scope")}
        missing = [n for n in rd.operands if n not in given]
        unknown = [n for n in given if n not in rd.operands and n not in rd.params]
        if missing or unknown:
            parts = []
            if missing:
                parts.append(f"missing operand(s) {', '.join(missing)}")
            if unknown:
                parts.append(f"unknown operand(s) {', '.join(map(str, unknown))}")
            params = (f"; params {', '.join(f'{p} (default {d})' for p, d in rd.params.items())}"
                      if rd.params else "")
            raise ValidationError(f"{where}: {'; '.join(parts)}. It takes operands "
                                  f"{', '.join(f'{n} ({r})' for n, r in rd.operands.items())}{params}.")
        operands: dict[str, Handle] = {}
        for n, role in rd.operands.items():
            h = given[n]
            if not _is_handle(h):
                raise ValidationError(f"{where}: operand {n!r} must be a tensor handle, got {h!r}.")
            if not self._owns(h):
                self._own(h, f"{where} operand {n!r}")
            if h.space != Space.TCM:
                raise ValidationError(f"{where}: operand {n}={h.name} is in HBM (a {role} operand); recipe operands must "
                                      f"be in TCM (ADR-0065 D6.2/D6.7). tl.load it first, or allocate it with tl.alloc.")
            operands[n] = h
        for n, other in rd.alias_pairs:
            if operands[n].overlaps(operands[other]):
                raise ValidationError(f"{where}: RW operand {n}={operands[n].name} aliases operand "
                                      f"{other}={operands[other].name}; writing {n} in place would clobber it. "
                                      f"Give each operand its own buffer.")
        params: dict[str, Any] = {}
        for p, default in rd.params.items():
            v = given.get(p, default)
            if v is None and p not in given:
                raise ValidationError(f"{where}: param {p!r} has no default; pass it, e.g. {{..., {p!r}: 1e-6}}.")
            check_scalar(where, p, v)
            params[p] = v
        scratch = self._recipe_scratch_for(rd, operands, where)
        env: dict[str, Handle] = {**operands, **scratch}
        specs = []
        for kind, ports, srcs, dst, scalars in rd.steps:
            extra = {k: params[v] if isinstance(v, str) else v for k, v in scalars.items()} if scalars else {}
            specs.append(OpSpec.built(kind, Scope.KERNEL, {port: env[x] for port, x in zip(ports, srcs)}, extra,
                                      env[dst]))
        rw = [operands[n] for n in rd.rw_operands]
        primary = scratch[rd.primary_out.name] if rd.primary_out is not None else None
        return specs, rw, scratch, primary

    def _recipe_scratch_for(self, rd: RecipeDescriptor, operands: Mapping[str, Handle],
                            where: str) -> dict[str, Handle]:
        """The recipe's scratch: fresh in the innermost open scratch scope, else a kernel-scope set.

        Kernel-scope scratch is allocated once per (recipe, RW operand
        addresses, operand shapes and dtypes), so a loop does not grow the TCM.
        Composites sharing it are ordered by the hazard rules: scratch counts
        as written by every composite that expands the recipe (DESIGN.md §5).
        Scope scratch is named after the command it serves (``softmax_merges9.P``
        for command #9); in a ``tl.range`` body, after that command's instance
        in each iteration, as the same kernel written with a Python loop names it.

        Raises:
            TraceError: in a tl.range body whose innermost open scratch scope was opened outside the body
                (the scratch would be allocated there once for every iteration), or kernel-scope scratch for
                an RW operand that is a different buffer in every iteration.
        """
        if not self._scopes:
            keys = self._kernel_scratch_keys(rd, operands, where)
            first = self._kernel_scratch(rd, keys[0], operands)
            if all(k == keys[0] for k in keys):  # the same set in every iteration (always, outside a body)
                return first
            return self._per_iteration_scratch(rd, keys, first, operands)
        lp = self._loop
        if lp is not None and len(self._scopes) <= lp.scope_depth:
            raise TraceError(f"{where} allocates its scratch in a tl.scratch_scope() opened outside the "
                             f"tl.range body: the body is traced once, so it would allocate that scratch "
                             f"once for every iteration. Open the scratch scope inside the body, or expand the "
                             f"recipe outside any scratch scope (kernel-scope scratch, reused by every "
                             f"expansion).")
        # named after this command's instance in each iteration of the body being traced
        per_iter = CommandName(lp.var, f"{rd.name}s", self._ncmd) if lp is not None else None
        dtypes = _DTYPE_NAMES
        scratch: dict[str, Handle] = {}
        for s in rd.scratch:
            shape, dtype = s.resolve(operands, dtypes)
            h = scratch[s.name] = self.tcm.alloc(f"{rd.name}s{self._ncmd}.{s.name}", shape, dtype)
            self._name(h)
            if per_iter is not None:
                scratch[s.name] = LoopHandle.named(h, per_iter, f".{s.name}")
        return scratch

    def _kernel_scratch_keys(self, rd: RecipeDescriptor, operands: Mapping[str, Handle], where: str) -> list[tuple]:
        """The key of the recipe's kernel-scope scratch set in each iteration of the open ``tl.range`` body, up to
        the period with which its RW operands repeat (one key outside a body): the recipe, the RW operands'
        addresses, every operand's shape and dtype -- what a plain Python loop keys it by in that iteration."""
        lp = self._loop
        n_keys = 1
        if lp is not None:
            period = 1
            for n, h in operands.items():
                if rd.operands[n] != "RW" or not isinstance(h, LoopHandle):
                    continue
                p = _address_period(h)
                if p is None:
                    if lp.var.iterations > 1:
                        raise TraceError(
                            f"{where} updates {n}={h.name} in place, a different TCM buffer in every iteration: a "
                            f"plain Python loop would allocate the recipe's kernel-scope scratch anew in each one "
                            f"(it is kept per RW operand address, DESIGN.md §3), which a body traced once cannot. "
                            f"Open a tl.scratch_scope() inside the body around this composite (scratch per "
                            f"command), or update a fixed buffer or a tl.ring slot (S[j]).")
                    p = 1
                period = math.lcm(period, p)
            n_keys = max(1, min(lp.var.iterations, period))

        def key(i: int) -> tuple:
            return (rd.name,) + tuple(
                (n, (h.at(i).addr if isinstance(h, LoopHandle) else h.addr) if rd.operands[n] == "RW" else -1,
                 h.shape, h.dtype) for n, h in operands.items())
        return [key(i) for i in range(n_keys)]

    def _kernel_scratch(self, rd: RecipeDescriptor, key: tuple, operands: Mapping[str, Handle]) -> dict[str, Handle]:
        """The kernel-scope scratch set of ``key``: the one allocated before, else a new one."""
        hit = self._recipe_scratch.get(key)
        if hit is not None:
            return hit
        tag = len(self._recipe_scratch)
        dtypes = _DTYPE_NAMES
        scratch = {}
        for s in rd.scratch:
            shape, dtype = s.resolve(operands, dtypes)
            # not self.alloc: kernel-scope scratch is allocated on a recipe's first expansion, in a tl.range
            # body as anywhere (DESIGN.md §13), and reused by every later one. It comes from the top end of the
            # TCM, so it never takes bytes a scratch scope released: a scope of a body then lies where it lay in
            # iteration 0 in every iteration, in a Python loop as in the traced body
            h = scratch[s.name] = self.tcm.alloc(f"{rd.name}{tag}.{s.name}", shape, dtype, from_top=True)
            self._name(h)
        self._recipe_scratch[key] = scratch
        return scratch

    def _per_iteration_scratch(self, rd: RecipeDescriptor, keys: list[tuple], first: dict[str, Handle],
                               operands: Mapping[str, Handle]) -> dict[str, Handle]:
        """Kernel-scope scratch of an RW operand that cycles through buffers (a ring slot): a set per key, as a
        Python loop allocates them, each handle a :class:`LoopHandle` whose slot ``i mod len(keys)`` is
        iteration ``i``'s set. Iteration 0's set is ``first``; the others are allocated when the body closes
        (:meth:`_close_loop`), iteration by iteration and in body order, where the Python loop's iterations
        1, 2, ... allocate them (after everything iteration 0 allocated)."""
        lp = self._loop
        known = lp.deferred.get(tuple(keys))
        if known is not None:
            return known[3]
        moving = ", ".join(f"{n}={h.name}" for n, h in operands.items()
                           if rd.operands[n] == "RW" and isinstance(h, LoopHandle))
        slots = {n: [h] for n, h in first.items()}  # filled by _close_loop
        step = Index(lp.var, 1, 0)
        handles = {n: LoopHandle(f"{rd.name}[{moving}].{n}", h.space, h.addr, h.shape, h.dtype, h.pinned, h.origin,
                                 h.channel, var=lp.var, kind="ring", slots=slots[n], slot=step)
                   for n, h in first.items()}
        lp.deferred[tuple(keys)] = (rd, keys, dict(operands), handles, slots)
        return handles

    def _allocate_deferred(self, lp: "_OpenLoop") -> None:
        """Allocate the later iterations' kernel-scope scratch sets of ``lp``'s body (see
        :meth:`_per_iteration_scratch`) in the order a Python loop would: iteration by iteration, in body order."""
        entries = list(lp.deferred.values())
        for i in range(1, max((len(e[1]) for e in entries), default=0)):
            for rd, keys, operands, _, slots in entries:
                if i < len(keys):
                    got = self._kernel_scratch(rd, keys[i], operands)
                    for n, lst in slots.items():
                        lst.append(got[n])


def _address_period(h: LoopHandle) -> int | None:
    """After how many iterations ``h``'s address repeats: 1 for a fixed buffer, a ring's period for a ring slot,
    None for a handle that moves every iteration (a row slice with a symbolic start)."""
    if any(isinstance(x, Index) and x.a for lo, hi in h.chain for x in (lo, hi)):
        return None
    if h.kind == "ring":
        n = len(h.slots)
        return n // math.gcd(h.slot.a, n) if h.slot.a else 1
    return 1


class _Range:
    """What ``tl.range(...)`` returns: an iterable, like Python's ``range``; each ``for`` over it traces a loop."""

    __slots__ = ("tl", "args")

    def __init__(self, tl: TLContext, args: tuple):
        self.tl, self.args = tl, args

    def __iter__(self) -> Iterator[Index]:
        return self.tl._trace_loop(*self.args)

    def __repr__(self) -> str:
        return f"tl.range({', '.join(map(repr, self.args))})"


class _OpenLoop:
    """A ``tl.range`` body being traced: its commands so far, their iter labels and waits."""

    __slots__ = ("var", "first", "scope_depth", "outer_iter", "body", "iters", "waits", "undo", "deferred")

    def __init__(self, var: LoopVar, first: int, scope_depth: int, outer_iter: int | Index):
        self.var, self.first, self.scope_depth, self.outer_iter = var, first, scope_depth, outer_iter
        #: an empty range: the TCM mark and the number of kernel-scope recipe scratch sets to return to
        self.undo: tuple | None = None
        self.body: list[Command] = []
        self.iters: list[int | Index] = []
        self.waits: list[tuple[int, int, bool]] = []
        #: kernel-scope recipe scratch of later iterations, allocated when the body closes (keys -> what to allocate)
        self.deferred: dict[tuple, tuple] = {}


class _Iteration:
    """The context manager behind ``tl.iteration`` (a class: a loop enters one per command group)."""

    __slots__ = ("tl", "j", "prev")

    def __init__(self, tl: TLContext, j: int | Index):
        self.tl, self.j, self.prev = tl, j, -1

    def __enter__(self) -> None:
        self.prev, self.tl._iter = self.tl._iter, self.j

    def __exit__(self, *exc: object) -> None:
        self.tl._iter = self.prev


