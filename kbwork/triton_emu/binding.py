"""A launch is a trace times a binding (DESIGN.md §19): a kernel traced once per abstract signature.

A device run calls a kernel once per *signature* — the kernel, each tensor argument's space, shape and
dtype (arguments may be nested in tuples, lists and dicts, as JAX's pytrees: the key holds the nesting),
each scalar argument's type and value, and which tensor arguments are the same tensor — and binds that one
trace to every launch of the signature.

While it is traced, the kernel sees each tensor argument as a :class:`Param`: its ``name``, ``shape``,
``dtype`` and row slices work as a handle's, but its address, channel and contents are the launch's, not
the signature's, and reading one is a :class:`~kbwork.errors.TraceError` naming the argument and the
property. Every ``tl`` call takes a Param where it takes a handle (:func:`unwrap`); lowering then uses the
first launch's tensors.

Binding the trace to another launch (:class:`Binder`) is a substitution: every handle the trace holds that
was made from a tensor argument (the argument itself, a row slice of it, a ``tl.range`` slice, a TCM buffer
``tl.load`` named after it) is made again from the launch's own tensor, the same way — its address moved
from the traced tensor to the bound one, its channel the bound tensor's, its name rendered from the bound
tensor's name. Nothing is parsed out of text.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import TraceError
from ..memory import CommandName, Handle, LoopHandle, Space
from ..pe.commands import Completion, CompositeCmd, DmaCmd, OpSpec
from ..pe.program import Loop, Plain, Trace, commands_of, handles_of

_SCALARS = (str, int, float, bool, complex, type(None))


# --- the signature of a call -------------------------------------------------------------------------------
def signature(kernel: Callable[..., Any], args: tuple, kwargs: dict) -> tuple[Any, list[tuple[tuple, Handle]]]:
    """The key a launch is traced under, and its tensor arguments in pytree order, each with its path (the
    argument's position or keyword, then the indices into it: ``(2,)``, ``("kv", 1, 0)``).

    Tensors are keyed by space, shape and dtype, and by which earlier tensor argument of the call is the same
    tensor (aliasing changes what a kernel's calls lower to); two tensor arguments that overlap without being
    the same make the call a key of its own. Scalars are keyed by type and value (``-0.0`` is not ``0.0``, a
    float is not an int). Anything else (an object of the caller's) is keyed by its identity: its launch is
    traced for itself."""
    leaves: list[tuple[tuple, Handle]] = []
    key = [kernel, tuple([_walk(a, (i,), leaves) for i, a in enumerate(args)]),
           tuple([(k, _walk(v, (k,), leaves)) for k, v in kwargs.items()])]
    alias = []
    seen: dict[tuple, int] = {}
    spans = []
    for i, (_, h) in enumerate(leaves):
        at = (h.space is Space.TCM, h.addr, h.nbytes)
        first = seen.setdefault(at, i)
        alias.append(first)
        if first == i:
            spans.append((at, i))
    if _overlap([s for s, _ in spans]):
        alias.append(("overlapping tensors", id(args)))  # traced for itself
    key.append(tuple(alias))
    try:
        hash(tuple(key))
    except TypeError:  # a dict key or scalar that does not hash: traced for itself
        return ("object", id(args)), leaves
    return tuple(key), leaves


def _walk(x: Any, where: tuple, leaves: list) -> Any:
    """``x``'s part of a signature key; its tensors appended to ``leaves`` with their paths. (A function of the
    module, not a closure: a closure calling itself would be a reference cycle.)"""
    c = x.__class__
    if isinstance(x, Handle):
        leaves.append((where, x))
        return ("T", x.space is Space.TCM, c is LoopHandle, x.shape, x.dtype)
    if c is float or c is np.float64 or c is np.float32:
        return (c, float(x).hex())
    if c in _SCALARS or isinstance(x, (np.integer, np.bool_)):
        return (c, x)
    if c is tuple or c is list:
        return (c, tuple([_walk(y, where + (i,), leaves) for i, y in enumerate(x)]))
    if c is dict:
        try:
            return (dict, tuple([(k, _walk(v, where + (k,), leaves)) for k, v in x.items()]))
        except TypeError:
            return ("object", id(x))
    return ("object", id(x))


def _overlap(spans: list[tuple[bool, int, int]]) -> bool:
    """Whether two of the distinct byte ranges ``(tcm, addr, nbytes)`` overlap."""
    last_end: dict[bool, int] = {}
    for tcm, addr, n in sorted(spans):
        if n and addr < last_end.get(tcm, -1):
            return True
        last_end[tcm] = max(last_end.get(tcm, -1), addr + n)
    return False


def path_text(path: tuple, positional: list[str]) -> str:
    """A tensor argument's path as the kernel names it (``k``, ``kv[1][0]``), ``positional`` the names of the
    kernel's positional parameters (:func:`_argument_names`)."""
    first = path[0]
    text = (positional[first] if first < len(positional) else f"argument {first + 1}") if isinstance(first, int) \
        else first
    return text + "".join(f"[{p!r}]" for p in path[1:])


class ArgName:
    """How an error names a tensor argument (``kv[1][0]``, ``k[0:128]``): its path and the slices taken of it,
    put into words only when an error needs them (the kernel's signature is read then)."""

    __slots__ = ("kernel", "n_args", "path", "keys")

    def __init__(self, kernel: Callable[..., Any], n_args: int, path: tuple, keys: tuple = ()):
        self.kernel, self.n_args, self.path, self.keys = kernel, n_args, path, keys

    def sliced(self, key: Any) -> "ArgName":
        return ArgName(self.kernel, self.n_args, self.path, self.keys + (key,))

    def __str__(self) -> str:
        return path_text(self.path, _argument_names(self.kernel, self.n_args)) + "".join(
            f"[{_key_text(k)}]" for k in self.keys)


def _argument_names(kernel: Callable[..., Any], n_args: int) -> list[str]:
    """The names of the kernel's positional parameters after ``tl`` (``*args`` as ``args[i]``), for messages."""
    import inspect

    try:
        params = list(inspect.signature(kernel).parameters.values())[1:]
    except (TypeError, ValueError):
        return []
    out = []
    for p in params:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            out.append(p.name)
        elif p.kind is p.VAR_POSITIONAL:
            out += [f"{p.name}[{i}]" for i in range(n_args - len(out))]
            break
    return out


# --- what the kernel sees ------------------------------------------------------------------------------------
class Param:
    """A tensor argument of a kernel being traced: what may differ from launch to launch of one trace is not
    readable. ``name``, ``shape``, ``dtype``, ``space``, ``ndim``, ``size``, ``nbytes`` and row slices (which
    are Params too) work as a handle's; ``addr``, ``end``, ``span``, ``channel``, ``origin`` and the contents
    raise :class:`~kbwork.errors.TraceError`."""

    __slots__ = ("_h", "_what", "_reg")

    def __init__(self, h: Handle, what: ArgName, reg: dict[int, tuple]):
        self._h, self._what, self._reg = h, what, reg

    name = property(lambda self: self._h.name)
    shape = property(lambda self: self._h.shape)
    dtype = property(lambda self: self._h.dtype)
    space = property(lambda self: self._h.space)
    pinned = property(lambda self: self._h.pinned)
    ndim = property(lambda self: self._h.ndim)
    size = property(lambda self: self._h.size)
    nbytes = property(lambda self: self._h.nbytes)

    def _concrete(self, what: str) -> TraceError:
        return TraceError(
            f"the kernel reads the {what} of tensor argument {str(self._what)!r} ({self._h.name}) while it is traced. A "
            f"kernel is traced once per signature (its tensors' shapes and dtypes, its scalars' values) and the "
            f"trace is bound to every launch's own tensors, so the {what} of a tensor argument is not known when "
            f"it runs (DESIGN.md §19). Pass what the kernel must branch on as a scalar argument (part of the key).")

    addr = property(lambda self: _raise(self._concrete("address")))
    end = property(lambda self: _raise(self._concrete("address")))
    span = property(lambda self: _raise(self._concrete("address")))
    channel = property(lambda self: _raise(self._concrete("channel")))
    origin = property(lambda self: _raise(self._concrete("origin (which memory made it)")))

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._concrete("contents")

    def overlaps(self, other: Any) -> bool:
        raise self._concrete("address")

    def __getitem__(self, key: Any) -> "Param":
        child = self._h[key]
        if child.__class__ is Handle:  # a plain row slice: bound by slicing the bound parent the same way
            self._reg[id(child)] = (child, self._h, key)
        return Param(child, self._what.sliced(key), self._reg)

    def __len__(self) -> int:
        return self._h.shape[0]

    def __repr__(self) -> str:
        shape = "x".join(map(str, self._h.shape))
        return f"Param({str(self._what)}: {self._h.name}, {self._h.space.value} {shape} {self._h.dtype})"


def _raise(e: Exception) -> Any:
    raise e


def _key_text(key: Any) -> str:
    if isinstance(key, slice):
        lo = "" if key.start is None else getattr(key.start, "text", key.start)
        hi = "" if key.stop is None else getattr(key.stop, "text", key.stop)
        return f"{lo}:{hi}"
    return repr(key)


def params(kernel: Callable[..., Any], args: tuple, kwargs: dict, leaves: Sequence[tuple[tuple, Handle]],
           reg: dict) -> tuple[tuple, dict]:
    """``args`` and ``kwargs`` with every tensor argument (``leaves``, in pytree order) as a :class:`Param`."""
    it = iter(leaves)
    made = (kernel, len(args), it, reg)
    return tuple([_wrap(a, made) for a in args]), {k: _wrap(v, made) for k, v in kwargs.items()}


def _wrap(x: Any, made: tuple) -> Any:
    """``x`` with its tensors as :class:`Param` s (``made``: the kernel, its number of positional arguments, the
    iterator over the leaves, the registry). A function of the module, not a closure (see :func:`_walk`)."""
    c = x.__class__
    if isinstance(x, Handle):
        kernel, n_args, it, reg = made
        path, h = next(it)
        return Param(h, ArgName(kernel, n_args, path), reg)
    if c is tuple or c is list:
        return c([_wrap(y, made) for y in x])
    if c is dict:
        return {k: _wrap(v, made) for k, v in x.items()}
    return x


def unwrap(x: Any) -> Any:
    """``x`` with a :class:`Param` replaced by its handle (a plain value otherwise)."""
    return x._h if x.__class__ is Param else x


def unwrap_entries(seq: Any) -> Any:
    """A ``prologue``/``epilogue`` list (dicts) or an ``ops``/``rw_handles`` list (OpSpecs, handles) with every
    Param in it replaced by its handle; ``seq`` itself when it holds none (the common case: no copy)."""
    c = seq.__class__
    if c is not list and c is not tuple:
        return seq
    out = None
    for i, e in enumerate(seq):
        ec = e.__class__
        if ec is Param:
            new = e._h
        elif ec is dict and any(v.__class__ is Param for v in e.values()):
            new = {k: unwrap(v) for k, v in e.items()}
        elif ec is OpSpec and (e.out.__class__ is Param or any(v.__class__ is Param for v in e.operands.values())):
            new = OpSpec(e.kind, e.scope, {k: unwrap(v) for k, v in e.operands.items()}, e.extra, unwrap(e.out))
        else:
            continue
        if out is None:
            out = list(seq)
        out[i] = new
    return seq if out is None else c(out)


# --- a trace and its bindings ---------------------------------------------------------------------------------
@dataclass(eq=False)
class Traced:
    """One signature's trace: the first launch's trace, the tensor arguments it was traced with, what its
    context named, and how its handles were made from the arguments.

    Attributes:
        id: the trace's number in its run (what the device's reductions compare launches by).
        trace: the first launch's :class:`~kbwork.pe.program.Trace`.
        leaves: the first launch's tensor arguments, in pytree order.
        names: the names the kernel's ``tl`` calls gave (``TLContext.names``).
        derived: ``id(slice) -> (slice, parent, key)`` for row slices the kernel made of an argument.
        named_after: ``id(buffer) -> (buffer, source, suffix)`` for TCM buffers named after a source.
    """

    id: int
    trace: Trace
    leaves: tuple[Handle, ...]
    names: dict[str, list[Handle]]
    derived: dict[int, tuple]
    named_after: dict[int, tuple]
    #: what the device works out once per trace (its uses relative to its arguments, ``device.device``)
    memo: dict = field(default_factory=dict)
    #: how many launches were bound to it (a trace bound once is used as it is, never moved)
    bound: int = 0

    def bind(self, leaves: Sequence[Handle]) -> tuple[Trace, dict[str, list[Handle]]]:
        """The trace bound to a launch whose tensor arguments are ``leaves`` (of this signature): the launch's
        trace (its :attr:`~kbwork.pe.program.Trace.binding` says from what) and the names its context gave."""
        leaves = tuple(leaves)
        tr = self.trace
        self.bound += 1
        if all(a is b for a, b in zip(self.leaves, leaves)):
            return Trace(tr.all_segments, tr.plain_waits, Binding(self, leaves)), self.names
        b = Binder(self, leaves)
        fixed, moving = self._names_split
        names = dict(fixed)  # (the lists are shared: a run's names extend lists of their own)
        for h in moving:
            g = b.handle(h)
            names.setdefault(g.name, []).append(g)
        # its commands are substituted when first read: a launch the device replicates is never read
        return Trace(b.segments, tr.plain_waits, Binding(self, leaves), n_commands=tr.n_commands), names

    @functools.cached_property
    def _names_split(self) -> tuple[dict[str, list[Handle]], list[Handle]]:
        """:attr:`names` as the names no binding changes (name -> handles) and the handles made from a tensor
        argument (which a binding makes again, named after its own tensors)."""
        leaf = {id(x) for x in self.leaves}
        fixed: dict[str, list[Handle]] = {}
        moving: list[Handle] = []
        for n, hs in self.names.items():
            for h in hs:
                if self._made_from(h, leaf):
                    moving.append(h)
                else:
                    fixed.setdefault(n, []).append(h)
        return fixed, moving

    @functools.cached_property
    def _handles(self) -> tuple[Any, ...]:
        """Every handle of the trace once (its commands share them), in the order :func:`handles_of` first
        meets them: what :attr:`constants`, :attr:`fixed_texts` and :attr:`taken_stems` read, walked once."""
        seen: dict[int, Any] = {}
        for h in handles_of(self.trace):
            seen.setdefault(id(h), h)
        return tuple(seen.values())

    @functools.cached_property
    def constants(self) -> tuple[Handle, ...]:
        """The HBM tensors the trace uses that no tensor argument made (a kernel's own, from its closure): the
        same in every binding."""
        leaf = {id(h) for h in self.leaves}
        out: dict[int, Handle] = {}
        for h in self._handles:
            if h.space is not Space.HBM:
                continue
            base = h
            while True:
                if base.__class__ is LoopHandle and base.kind == "rows":
                    base = base.root
                    continue
                d = self.derived.get(id(base))
                if d is None:
                    break
                base = d[1]
            if id(base) not in leaf:
                out.setdefault(id(base), base)
        return tuple(out.values())

    @functools.cached_property
    def fixed_texts(self) -> tuple[str, ...]:
        """Every name and label the trace holds that no binding changes: its own buffers' names, the labels
        its kernel wrote (what a replica's names must not be mistaken for)."""
        leaf = {id(x) for x in self.leaves}
        texts = {h.name for h in self._handles if not self._made_from(h, leaf)}
        texts |= {c.label for c in commands_of(self.trace) if c.__class__ is not DmaCmd or c.auto_label is None}
        return tuple(texts)

    @functools.cached_property
    def taken_names(self) -> frozenset[str]:
        """The tensor names a name or label this trace fixes (:attr:`fixed_texts`) could be taken for one made
        from: a tensor named ``n`` names its slices ``n[...]`` and ``tl.load`` its buffer ``n_tcm``, and a label
        names a DMA's source after ``dma_load `` or ``dma_store ``; ``|`` joins a fetch's two names. A replica
        whose tensor arguments bear none of these names is named by its binding without a mistake."""
        out: set[str] = set()
        for f in self.fixed_texts:
            for piece in f.split("|"):
                for verb in ("dma_load ", "dma_store "):
                    if piece.startswith(verb):
                        piece = piece[len(verb):]
                        break
                base = piece.partition("[")[0]
                out.add(base)
                at = base.find("_tcm")
                while at >= 0:
                    out.add(base[:at])
                    at = base.find("_tcm", at + 1)
        return frozenset(out)

    @functools.cached_property
    def taken_stems(self) -> tuple[str, ...]:
        """The stems of the names a buffer takes after the command it serves in each iteration of a loop
        (``softmax_merges`` of ``softmax_merges9.P``, ``softmax_merges13.P``, ...): a tensor argument whose name
        starts with one could be taken for such a buffer's name in some iteration."""
        return tuple(sorted({h.prefix.stem for h in self._handles
                             if h.__class__ is LoopHandle and isinstance(h.prefix, CommandName)}))

    def _made_from(self, h: Handle, leaf: set[int]) -> bool:
        """Whether ``h`` was made from a tensor argument (``leaf``: their ids)."""
        seen = [h]
        while seen:
            x = seen.pop()
            if id(x) in leaf:
                return True
            if x.__class__ is LoopHandle:
                seen += [y for y in (x.root, x.prefix) if isinstance(y, Handle)] + list(x.slots)
            else:
                d = self.derived.get(id(x)) or self.named_after.get(id(x))
                if d is not None:
                    seen.append(d[1])
        return False


@dataclass(frozen=True, eq=False)
class Binding:
    """A launch's trace as a binding of a signature's trace (:class:`Traced`) to the launch's tensor arguments."""

    traced: Traced
    leaves: tuple[Handle, ...]

    @property
    def trace_id(self) -> int:
        return self.traced.id

    def tensors(self) -> tuple[Handle, ...]:
        """The HBM tensors the launch's commands may move bytes of: its tensor arguments, then the trace's
        constants."""
        return self.leaves + self.traced.constants

    def layout(self) -> tuple | None:
        """Which of :meth:`tensors` are the same tensor (each as the index of the first that is); None when two
        different ones overlap (their relation is then not described by this)."""
        seen: dict[tuple, int] = {}
        out = []
        spans = []
        for i, h in enumerate(self.tensors()):
            at = (h.space is Space.TCM, h.addr, h.nbytes)
            first = seen.setdefault(at, i)
            out.append(first)
            if first == i:
                spans.append(at)
        return None if _overlap(spans) else tuple(out)


class Binder:
    """Substitutes a launch's tensor arguments for the traced ones in a trace's handles and commands."""

    def __init__(self, traced: Traced, leaves: Sequence[Handle]):
        self.t = traced
        self.memo: dict[int, Handle] = {id(a): b for a, b in zip(traced.leaves, leaves)}
        self.same = all(a is b for a, b in zip(traced.leaves, leaves))

    def handle(self, h: Any) -> Any:
        """``h`` made again from the bound arguments (``h`` itself when nothing it was made from moved)."""
        if h is None or self.same:
            return h
        memo = self.memo
        got = memo.get(id(h))
        if got is None:
            got = memo[id(h)] = self._make(h)
        return got

    def _make(self, h: Handle) -> Handle:
        t = self.t
        if h.__class__ is Handle:
            d = t.derived.get(id(h))
            if d is not None:
                parent = self.handle(d[1])
                return h if parent is d[1] else parent[d[2]]
            n = t.named_after.get(id(h))
            if n is not None:
                src = self.handle(n[1])
                if src is n[1]:
                    return h
                return Handle(src.name + n[2], h.space, h.addr, h.shape, h.dtype, h.pinned, h.origin, h.channel)
            return h
        # a loop handle: made again around its bound parts
        kind = h.kind
        if kind == "rows":
            root = self.handle(h.root)
            if root is h.root:
                return h
            return LoopHandle(_chained(root.name, h.chain), h.space, root.addr + (h.addr - h.root.addr), h.shape,
                              h.dtype, h.pinned, root.origin, root.channel, h.var, "rows", root, (), None, h.chain,
                              None, "")
        if kind == "named":
            root = self.handle(h.root)
            prefix = self.handle(h.prefix) if isinstance(h.prefix, Handle) else h.prefix
            if root is h.root and prefix is h.prefix:
                return h
            return LoopHandle(_chained(prefix.name + h.suffix, h.chain), h.space, h.addr, h.shape, h.dtype,
                              h.pinned, root.origin, root.channel, h.var, "named", root, (), None, h.chain, prefix,
                              h.suffix)
        slots = tuple([self.handle(s) for s in h.slots])
        if all(a is b for a, b in zip(slots, h.slots)):
            return h
        return LoopHandle(h.name, h.space, h.addr, h.shape, h.dtype, h.pinned, h.origin, h.channel, h.var, kind,
                          h.root, slots, h.slot, h.chain, h.prefix, h.suffix)

    def command(self, cmd: Any) -> Any:
        """``cmd`` with its handles bound (``cmd`` itself when none moved)."""
        hd = self.handle
        c = cmd.completion
        primary = hd(c.primary_out)
        if cmd.__class__ is DmaCmd:
            src, dst = hd(cmd.src), hd(cmd.dst)
            if src is cmd.src and dst is cmd.dst and primary is c.primary_out:
                return cmd
            # a default label names the source: rendered from the bound one
            label = cmd.label if cmd.auto_label is None else cmd.auto_label + src.name
            return DmaCmd(Completion(c.cmd, primary, c.origin, c.loop), src, dst, label, cmd.iter, cmd.auto_label)
        moved = False
        ops = []
        for op in cmd.ops:
            operands = {n: hd(x) for n, x in op.operands.items()}
            out = hd(op.out)
            if out is not op.out or any(operands[n] is not x for n, x in op.operands.items()):
                moved = True
                op = OpSpec(op.kind, op.scope, operands, op.extra, out)
            ops.append(op)
        rw = tuple([hd(x) for x in cmd.rw_handles])
        scratch = tuple([hd(x) for x in cmd.scratch])
        if not moved and primary is c.primary_out and all(a is b for a, b in zip(rw, cmd.rw_handles)) \
                and all(a is b for a, b in zip(scratch, cmd.scratch)):
            return cmd
        return CompositeCmd(Completion(c.cmd, primary, c.origin, c.loop), tuple(ops), rw, cmd.data_op, scratch,
                            cmd.label, cmd.iter)

    def segments(self) -> list:
        """The trace's segments bound (its loops' bodies bound once, as they were traced once)."""
        segs = []
        for s in self.t.trace.all_segments:
            if isinstance(s, Plain):
                segs.append(Plain(s.first_cmd, tuple([self.command(c) for c in s.commands])))
            else:
                segs.append(Loop(s.number, s.first_cmd, tuple([self.command(c) for c in s.body]), s.iterations,
                                 s.iters, s.waits, s.period, s.var))
        return segs


def _chained(name: str, chain: tuple) -> str:
    """A row slice's name: its root's, then each ``[lo:hi]`` of its chain (symbolic bounds as text)."""
    for lo, hi in chain:
        name = f"{name}[{getattr(lo, 'text', lo)}:{getattr(hi, 'text', hi)}]"
    return name
