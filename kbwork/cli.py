"""The ``kbwork`` command: compare, explain, run, golden, bench (``kbwork --version``; ``python -m kbwork``).

The command starts at :func:`kbwork.__main__.main`, which passes the
benchmark in: ``bench/`` ranks above this module (DESIGN §9; it uses
:class:`ArgumentParser`), so this module never imports it.

Every argument and every output path is checked before anything is
simulated, and in data mode so is whether the run fits in the TCM (a
one-tile timing run, milliseconds, before inputs of gigabytes are made). A
mistake ends with exit status 2 and one ``kbwork: error: ...`` line (for a
malformed argument too, with a "did you mean" for a misspelt option, command
or choice; the usage is in ``--help``), never a traceback: that covers every
:class:`~kbwork.errors.KbworkError` and an ``OSError`` while writing an
output. Outputs are written atomically to exactly the path given, which must
end in the suffix of its kind (``--oplog`` .csv, ``--trace`` .json, ``--npz``
.npz, ``--gantt`` .png); a wrong suffix is refused rather than silently
changed.

Any topology key can be set on every simulating subcommand: ``--topology
FILE`` for a whole file, ``--set key=value`` (repeatable) for one key, e.g.
``--set tcm_bytes=2097152``. Long work shows a progress bar of its phases on
stderr (``--quiet`` and ``--json`` turn it off).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn

from . import atomic
from .argtypes import file_path, float_range, int_range, nonnegative_int, positive_int, topology_setting
from .cliargs import one_or_more_variants, tcm_hint, variant_list
from .config import Topology, apply_settings, key_range, load_topology
from .errors import KbworkError, TcmOverflowError, ValidationError


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, whose error for an unknown option says which one was meant (``--kv_len``:
    "did you mean --kv-len?"), and whose every error is one line, ``kbwork: error: ...``, as every other
    mistake on the command line (the usage stays in ``--help``)."""

    def error(self, message: str) -> NoReturn:
        """Print ``kbwork: error: MESSAGE`` on stderr as one line and exit with status 2.

        Raises:
            SystemExit: always, with status 2.
        """
        text = " ".join(str(message).split())  # one line, whatever argparse wrapped
        self.exit(2, f"kbwork: error: {text}\n")

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        argv = sys.argv[1:] if args is None else list(args)
        refused = refused_before_parsing(argv, self)
        if refused is not None:
            refused[0].error(refused[1])
        ns, extras = self.parse_known_args(argv, namespace)
        if extras:
            parser: argparse.ArgumentParser = self
            for action in self._actions:
                if isinstance(action, argparse._SubParsersAction):
                    parser = action.choices.get(getattr(ns, action.dest, None), self)
            parser.error(unrecognized(extras, parser))
        return ns

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        """argparse's check of a value against its choices, with the choice meant by a misspelt one
        (``kbwork compre``: "did you mean 'compare'?"; ``--suite devic``: "did you mean 'device'?")."""
        choices = action.choices
        if choices is not None and isinstance(value, str) and value not in choices:
            scored = [(difflib.SequenceMatcher(None, value, c).ratio(), c) for c in choices if isinstance(c, str)]
            best = max((s for s, _ in scored), default=0.0)
            if best >= 0.6:  # difflib.get_close_matches' cutoff; equally close choices are all named
                meant = " or ".join(repr(c) for s, c in scored if s == best)
                raise argparse.ArgumentError(action, f"invalid choice: {value!r} (choose from "
                                                     f"{', '.join(map(repr, choices))}); did you mean {meant}?")
        super()._check_value(action, value)


def refused_before_parsing(argv: list[str], parser: argparse.ArgumentParser
                           ) -> tuple[argparse.ArgumentParser, str] | None:
    """Two mistakes argparse would report as another one, ``(subcommand's parser, message)`` or None: an option
    the subcommand does not know (``kbwork run --varaint opt3``: argparse says only that --variant is required),
    and decode variants given as bare words to a subcommand that takes them by an option (``kbwork run opt2``,
    ``kbwork compare opt2 opt3``)."""
    from .kernels.gqa_decode import VARIANTS

    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs or not argv or argv[0] not in subs[0].choices:
        return None
    sub = subs[0].choices[argv[0]]
    opts = sub._option_string_actions
    takes_value = False
    words = []
    rest = argv[1:]
    for i, tok in enumerate(rest):
        if takes_value:
            takes_value = False
            continue
        if tok == "--":
            break
        if tok.startswith("-"):
            name = tok.split("=", 1)[0]
            action = opts.get(name)
            if action is None and name.startswith("--") and not any(o.startswith(name) for o in opts) \
                    and meant_option(tok, sub) is not None:  # misspelt (a bare unknown one is argparse's to refuse)
                nxt = rest[i + 1] if i + 1 < len(rest) and "=" not in tok else "-"
                return sub, unrecognized([tok] if nxt.startswith("-") else [tok, nxt], sub)  # as argparse lists them
            takes_value = "=" not in tok and (action is None or action.nargs != 0)
            continue
        if all(part in VARIANTS for part in tok.split(",")):
            words.append(tok)
    flag = "--variant" if "--variant" in opts else "--variants" if "--variants" in opts else None
    if not words or flag is None or any(not a.option_strings for a in sub._actions):  # or it takes positionals
        return None
    value = ",".join(words) if flag == "--variants" else words[0]
    return sub, f"a variant is named with {flag}: write {flag} {value}, not {' '.join(words)} alone"


def unrecognized(extras: list[str], parser: argparse.ArgumentParser) -> str:
    """argparse's "unrecognized arguments" message, with the option meant by the first unknown one."""
    message = f"unrecognized arguments: {' '.join(extras)}"
    for arg in extras:
        meant = meant_option(arg, parser)
        if meant is not None:
            return f"{message} (did you mean {meant}?)"
    return message


def meant_option(arg: str, parser: argparse.ArgumentParser) -> str | None:
    """The long option of ``parser`` that ``arg`` (``--kv_len``, ``--varaint=3``) most likely means, or None (not
    an option, or nothing close)."""
    if not arg.startswith("-"):
        return None
    known = [o for o in parser._option_string_actions if o.startswith("--")]
    dashed = "--" + arg.split("=", 1)[0].lstrip("-").replace("_", "-")
    close = [dashed] if dashed in known else difflib.get_close_matches(dashed, known, n=1, cutoff=0.7)
    return close[0] if close else None




def _sim_options(p: argparse.ArgumentParser, mode: str = "data") -> None:
    g = p.add_argument_group("decode and topology options")
    g.add_argument("--kv-len", type=positive_int, default=4096, help="KV length N (default 4096)")
    g.add_argument("--tile", type=positive_int, default=128, help="KV tile T (default 128)")
    g.add_argument("--group", type=positive_int, default=8, help="query rows per KV head G (default 8)")
    g.add_argument("--head-dim", type=positive_int, default=128, help="head dimension d (default 128)")
    g.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"],
                   help="storage dtype of q, k, v (default bf16)")
    g.add_argument("--kv-dtype", default=None, choices=["bf16", "fp16", "fp32", "fp8"],
                   help="dtype of K and V (default: --dtype); fp8 is e4m3fn, 1 byte per element")
    g.add_argument("--out-dtype", default="fp32", choices=["fp32", "bf16"],
                   help="dtype O is stored in (default fp32; bf16 rounds it at the store). With --set "
                        "p_dtype=bf16, a bf16 kernel as a GPU computes it")
    g.add_argument("--mode", default=mode, choices=["data", "timing"],
                   help=f"data (numbers) or timing only (default {mode})")
    g.add_argument("--seed", type=nonnegative_int, default=0, help="input seed, >= 0 (default 0)")
    g.add_argument("--topology", default=None, metavar="NAME_OR_FILE",
                   help="topology name or .toml file (default ahbm-pe-v1)")
    g.add_argument("--set", action="append", default=[], type=topology_setting, metavar="KEY=VALUE",
                   dest="settings", help="set one topology key, e.g. --set tcm_bytes=2097152 or --set "
                                         "dma_channels=2 (repeatable; any key of the topology file)")
    g.add_argument("--fixed", type=int_range(*key_range("fixed_cycles")), default=None,
                   help="dispatch FIXED cycles (default: topology)")
    g.add_argument("--r", type=float_range(*key_range("r_cycles_per_byte")), default=None,
                   help="dispatch R cycles/byte (default: topology)")
    g.add_argument("--hazard-policy", default=None, choices=["strict_fifo", "rw_aware"],
                   help="hazard policy (default: topology, strict_fifo)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar on stderr")


_TOPOLOGY_KEYS = frozenset(f.name for f in dataclasses.fields(Topology)) - {"source"}
#: The flags that set a topology key themselves (``--set`` may not set it a second time).
_KEY_FLAGS = {"fixed_cycles": ("--fixed", "fixed"), "r_cycles_per_byte": ("--r", "r"),
              "hazard_policy": ("--hazard-policy", "hazard_policy")}


def _kwargs(a: argparse.Namespace) -> dict[str, Any]:
    """``decode.run``/``compare`` keyword arguments from the options; the topology and every key set on it
    checked now (an error names the flag that set it).

    Raises:
        ValidationError: a ragged kv length, a key set twice.
        ConfigError: a bad topology file or value (naming ``--set key=value`` for a ``--set``).
    """
    from .decode import MAX_TILES

    if a.kv_len % a.tile:  # decode.run says so too, in its own argument names
        near = max(1, round(a.kv_len / a.tile))
        if near > MAX_TILES:  # the nearest multiple would be refused in turn: suggest one that runs
            raise ValidationError(f"--kv-len {a.kv_len} is not a multiple of tile {a.tile} (--tile), and the nearest "
                                  f"multiple, {near} tiles, is beyond the {MAX_TILES} a run simulates; e.g. --kv-len "
                                  f"{MAX_TILES * a.tile}, or a larger --tile.")
        raise ValidationError(f"--kv-len {a.kv_len} is not a multiple of tile {a.tile} (--tile); e.g. "
                              f"--kv-len {near * a.tile}.")
    topo = load_topology(a.topology)
    overrides = apply_settings(topo, a.settings, {key: (flag, getattr(a, attr)) for key, (flag, attr)
                                                  in _KEY_FLAGS.items() if getattr(a, attr) is not None})
    topo.replace(**overrides)  # the flags' values too (they are range-checked already; this is the whole)
    return dict(kv_len=a.kv_len, tile=a.tile, group=a.group, head_dim=a.head_dim, dtype=a.dtype, mode=a.mode,
                seed=a.seed, topology=a.topology, kv_dtype=a.kv_dtype, out_dtype=a.out_dtype, **overrides)


def _before_simulating(kw: dict[str, Any], variants: tuple[str, ...]) -> None:
    """What can be refused before minutes of work, refused now: sizes beyond what a run may simulate, and
    in data mode inputs beyond :data:`kbwork.decode.MAX_DATA_BYTES` and a run that does not fit in the TCM.

    The TCM holds what one tile needs, whatever the tile count, so a one-tile timing run of each variant
    (milliseconds) finds an overflow that data mode would find only after making inputs of gigabytes.
    """
    from . import decode

    decode._check_sizes(where="--kv-len, --tile", kv_len=kw["kv_len"], group=kw["group"], head_dim=kw["head_dim"],
                        tile=kw["tile"])
    if kw["mode"] != "data":
        return  # timing mode makes no inputs: the run itself refuses as fast
    decode._check_data_bytes(kw["kv_len"], kw["group"], kw["head_dim"], where="--mode data")
    if kw["kv_len"] > kw["tile"]:
        for v in variants:
            decode.run(v, **{**kw, "kv_len": kw["tile"], "mode": "timing", "steady_state": False})


#: Seconds before a progress bar appears: a command that is done by then prints none.
PROGRESS_DELAY = 1.0


class _Phases:
    """A tqdm bar over the coarse phases of a command (on stderr, shown once it has taken
    :data:`PROGRESS_DELAY` seconds, cleared when done), its clock ticking while a phase runs."""

    def __init__(self, phases: list[str], enabled: bool):
        from tqdm import tqdm  # the command line is never a notebook: the plain bar

        self.bar = tqdm(total=len(phases), desc=phases[0] if phases else "", file=sys.stderr,
                        disable=not (enabled and phases),
                        delay=PROGRESS_DELAY, leave=False, dynamic_ncols=True,
                        bar_format="kbwork: {desc} |{bar}| {n_fmt}/{total_fmt} phases [{elapsed}]")
        self._done = threading.Event()
        self._ticker: threading.Thread | None = None
        if not self.bar.disable:
            self._ticker = threading.Thread(target=self._tick, name="kbwork-progress", daemon=True)
            self._ticker.start()

    def _tick(self) -> None:
        # tqdm redraws only when a phase ends; a phase of a minute would show a frozen clock
        while not self._done.wait(0.5):
            self._redraw()

    def _redraw(self) -> None:
        bar = self.bar
        if not bar.disable and bar._time() >= bar.start_t + bar.delay:
            bar.refresh()
            bar.last_print_t = bar._time()  # so close() knows there is a bar to clear

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Show ``name`` as the running phase for the ``with`` block; count it done at its end."""
        self.bar.set_description_str(name, refresh=False)
        self._redraw()
        yield
        self.bar.update()

    def __enter__(self) -> "_Phases":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        if self._ticker is not None:
            self._ticker.join()
        self.bar.close()


def _progress(a: argparse.Namespace, phases: list[str]) -> _Phases:
    return _Phases(phases, enabled=not (a.quiet or getattr(a, "json", False)))


def _tcm_hint(a: argparse.Namespace | None) -> str:
    """What to type for a TCM large enough (:func:`kbwork.cliargs.tcm_hint`), in the options of the subcommand
    ``a`` was parsed for."""
    if a is not None and callable(getattr(a, "tcm_hint", None)):
        return a.tcm_hint(a)  # a subcommand with other options (kbwork step) words it in its own
    if a is None or not hasattr(a, "kv_len"):
        return " On the command line: --set tcm_bytes=N, or --topology FILE with a larger tcm_bytes."

    def sizes() -> dict[str, Any]:
        kw = _kwargs(a)
        return dict(tile=kw["tile"], group=kw["group"], head_dim=kw["head_dim"], topology=kw["topology"],
                    dtype=kw["dtype"], **{k: v for k, v in kw.items() if k in _TOPOLOGY_KEYS})

    return tcm_hint(tuple(getattr(a, "variants", None) or (a.variant,)), sizes, file_flag="--topology",
                    smaller="smaller sizes (--head-dim, --group, --tile)")


def format_comparison(cmp: Any, bounds: dict[str, str] | None = None) -> str:
    """The human-readable report ``kbwork compare`` prints: one column per variant.

    ``bounds`` (variant -> ``analysis.Explanation.short``) adds the line saying what bounds each variant.
    """
    d = cmp.to_dict()
    p = d["params"]
    vs = d["variants"]
    width = max(12, *(len(v) + 2 for v in vs))

    def row(label: str, values: dict, fmt: str = "") -> str:
        return f"{label:28}" + "".join(f"{format(values[v], fmt):>{width}}" for v in vs)

    lines = [
        f"GQA decode, one KV head: kv_len={p['kv_len']} group={p['group']} head_dim={p['head_dim']} "
        f"tile={p['tile']} dtype={p['dtype']} mode={p['mode']}",
        f"topology {p['topology']}: FIXED={p['fixed_cycles']} cycles, R={p['r_cycles_per_byte']} cycles/byte, "
        f"hazards={p['hazard_policy']}",
        "",
        f"{'':28}" + "".join(f"{v:>{width}}" for v in vs),
        row("commands per tile", d["commands_per_tile"]),
        row("dispatch cycles per tile", d["dispatch_per_tile"]),
        row("  closed form", d["closed_form_per_tile"]),
        row("end-to-end cycles", d["cycles"]),
        row("end-to-end us", d["us"], ".3f"),
    ]
    errs = d["max_abs_err_vs_ref"]
    if errs is not None:
        lines.append(row("max |O - float64 ref|", errs, ".3e"))
    lines.append("")
    if d["gate"] is not None:
        if d["ratio"] is None or d["closed_form_ratio"] is None:  # FIXED = R = 0 (DESIGN.md §7)
            lines.append(f"dispatch ratio opt3/opt2: undefined (opt2 dispatches 0 cycles per tile: every dispatch "
                         f"is free at FIXED={p['fixed_cycles']}, R={p['r_cycles_per_byte']})")
        else:
            lines.append(f"dispatch ratio opt3/opt2: {d['ratio']:.4f} (closed form {d['closed_form_ratio']:.4f})")
    for g in d["gates"]:  # the headline gate first, as it always printed; the others with their ratio
        ratio = "" if g["rule"] == "opt3 > 2 x opt2" else \
            f" (ratio {'undefined' if g['ratio'] is None else format(g['ratio'], '.4f')})"
        lines.append(f"gate {g['rule']}: {'PASS' if g['pass'] else 'FAIL'}{ratio}")
    if d["speedup_opt3_over_opt2"] is not None:
        lines.append(f"end-to-end: opt3 takes {d['speedup_opt3_over_opt2']:.3f}x the cycles of opt2")
    fastest = min(vs, key=lambda v: (d["cycles"][v], vs.index(v)))
    if len(vs) > 2:
        lines.append(f"fastest end to end: {fastest} ({d['cycles'][fastest]} cycles)")
    if bounds:
        lines.append("what bounds each: " + "; ".join(f"{v} {bounds[v]}" for v in vs))
    if errs is not None:
        for pair, diff in d["max_abs_diff"].items():
            a, b = pair.split("-")
            lines.append(f"max |{a} - {b}|: m {diff['m']:.3e}, l {diff['l']:.3e}, O {diff['O']:.3e}")
        lines.append(f"numerics: bound 2 x plain-attention error + 1e-6 = {errs['bound']:.3e} "
                     f"(plain attention in {p['dtype']}: {errs['baseline']:.3e}): {'PASS' if errs['pass'] else 'FAIL'}")
    return "\n".join(lines)


#: ``--gantt-tiles all``.
ALL_TILES = "all"
#: The tiles ``--gantt`` draws when ``--gantt-tiles`` is not given.
GANTT_TILES = 3


def gantt_tiles(text: str) -> int | str:
    """An argparse type: a positive number of tiles, or ``all`` (:data:`ALL_TILES`)."""
    if text.strip().lower() == ALL_TILES:
        return ALL_TILES
    return positive_int(text)


gantt_tiles.__name__ = "tiles"


class _OutputError(KbworkError):
    """An output file could not be written (the CLI reports it like any other mistake)."""


def _check_outputs(a: argparse.Namespace, outputs: tuple[tuple[str, str, str], ...]) -> None:
    """Check every output path of ``a`` before simulating: ``(flag, attribute, suffix)`` each."""
    for flag, attr, suffix in outputs:
        path = getattr(a, attr, None)
        if path is not None:
            atomic.check_output_path(path, suffix=suffix, what=flag)


def _write(flag: str, path: Path, write: Callable[[Path], Any], note: str = "") -> None:
    """Run ``write(path)`` (atomic underneath) and say so; an OSError becomes a one-line error."""
    try:
        write(path)
    except OSError as exc:
        raise _OutputError(f"{flag}: could not write {str(path)!r}: {exc.strerror or exc}; "
                           f"any previous file there is unchanged.") from None
    print(f"wrote {path}{note}", file=sys.stderr)


#: The resolution of every PNG the command line writes (the Gantt's pixel budget is counted at it).
PNG_DPI = 120


def _save_png(fig: Any) -> Callable[[Path], Any]:
    def write(path: Path) -> None:
        import matplotlib.pyplot as plt

        try:
            atomic.write_with(path, lambda f: fig.savefig(f, format="png", dpi=PNG_DPI, bbox_inches="tight",
                                                          pad_inches=0.08))
        finally:
            plt.close(fig)
    return write


def _check_gantt_tiles(a: argparse.Namespace) -> None:
    if a.gantt_tiles is not None and a.gantt is None:
        raise ValidationError(f"--gantt-tiles {a.gantt_tiles} needs --gantt FILE.png (the Gantt it sizes); add "
                              f"--gantt, or drop --gantt-tiles.")


def _simulating(variants: tuple[str, ...] | list[str], mode: str) -> str:
    return (f"simulating {', '.join(variants)}" if mode != "data" else
            f"making the inputs and simulating {', '.join(variants)}")


def cmd_compare(a: argparse.Namespace) -> int:
    from . import analysis, decode

    _check_outputs(a, (("--gantt", "gantt", ".png"),))
    _check_gantt_tiles(a)
    kw = _kwargs(a)
    _before_simulating(kw, a.variants)
    data = kw["mode"] == "data"
    phases = [_simulating(a.variants, kw["mode"]) + (" and the float64 reference" if data else ""),
              "finding what bounds each variant"] + (["drawing the Gantt"] if a.gantt else [])
    with _progress(a, phases) as bar:
        with bar.phase(phases[0]):
            cmp = decode.compare(variants=a.variants, **kw)
        with bar.phase(phases[1]):
            bounds = {v: x.short for v, x in analysis.explain_all(cmp).items()}
        if a.gantt:
            from . import plots

            with bar.phase(phases[2]):
                first = next(iter(cmp.runs.values()))
                tiles = _gantt_tiles(a.gantt_tiles, first.n_tiles)
                fig = plots.compare_gantt(cmp, tiles=tiles, holds=True, critical_path=True, dpi=PNG_DPI)
    if a.json:
        print(json.dumps({**cmp.to_dict(), "bound": bounds}, indent=2))
    else:
        print(format_comparison(cmp, bounds))
    if a.gantt:
        _note_tiles(a.gantt_tiles, first.n_tiles)
        _note_utilization(fig.axes)
        _write("--gantt", a.gantt, _save_png(fig))
    return 0


def _gantt_tiles(asked: int | str | None, n_tiles: int) -> int:
    """The tiles ``--gantt`` draws: what was asked (default :data:`GANTT_TILES`), at most the run's."""
    if asked == ALL_TILES:
        return n_tiles
    return min(GANTT_TILES if asked is None else int(asked), n_tiles)


def _note_tiles(asked: int | str | None, n_tiles: int) -> None:
    """Say so when ``--gantt-tiles`` asked for more tiles than the run has."""
    if isinstance(asked, int) and asked > n_tiles:
        print(f"kbwork: note: the run has {n_tiles} tiles; --gantt draws {n_tiles}, not {asked}", file=sys.stderr)


def _note_utilization(axes: Any) -> None:
    if any(ax.get_gid() == "utilization" for ax in axes):
        print("kbwork: note: the window holds more stages than the image has pixels across; --gantt draws "
              "utilisation over time instead (fewer tiles with --gantt-tiles give a Gantt)", file=sys.stderr)


def format_explanations(explanations: dict[str, Any], params: dict[str, Any]) -> str:
    """The report ``kbwork explain`` prints: the run's parameters, then each variant's explanation."""
    p = params
    lines = [f"GQA decode, one KV head: kv_len={p['kv_len']} group={p['group']} head_dim={p['head_dim']} "
             f"tile={p['tile']} dtype={p['dtype']} mode={p['mode']}",
             f"topology {p['topology']}: FIXED={p['fixed_cycles']} cycles, R={p['r_cycles_per_byte']} cycles/byte, "
             f"hazards={p['hazard_policy']}", ""]
    for x in explanations.values():
        lines += [x.report(), ""]
    if len(explanations) > 1:
        fastest = min(explanations.values(), key=lambda x: x.cycles)
        others = [f"{x.name} {x.cycles / fastest.cycles:.3f}x" for x in explanations.values() if x is not fastest]
        lines.append(f"fastest end to end: {fastest.name} ({fastest.cycles} cycles); "
                     f"{others[0].replace(' ', ' takes ', 1)}{''.join(', ' + o for o in others[1:])} as long")
    return "\n".join(lines).rstrip()


def cmd_explain(a: argparse.Namespace) -> int:
    from . import analysis, decode

    _check_outputs(a, (("--png", "png", ".png"),))
    kw = _kwargs(a)
    _before_simulating(kw, a.variants)
    phases = [_simulating([v], kw["mode"]) for v in a.variants] + ["explaining where the time goes"]
    runs = {}
    with _progress(a, phases) as bar:
        for v, name in zip(a.variants, phases):
            with bar.phase(name):
                runs[v] = decode.run(v, **kw)  # the same seed: the same inputs for each
        with bar.phase(phases[-1]):
            explanations = analysis.explain_all(runs, top=a.top)
    params = next(iter(runs.values())).params
    if a.json:
        print(json.dumps({"params": dict(params), "variants": list(runs),
                          "explain": {v: x.to_dict() for v, x in explanations.items()}}, indent=2))
    else:
        print(format_explanations(explanations, params))
    if a.png:
        from . import plots

        fig = plots.attribution_figure(analysis.attribution_table(explanations), title=plots.describe(params))
        _write("--png", a.png, _save_png(fig))
    return 0


RUN_OUTPUTS = (("--oplog", "oplog", ".csv"), ("--npz", "npz", ".npz"), ("--trace", "trace", ".json"),
               ("--gantt", "gantt", ".png"))


def cmd_run(a: argparse.Namespace) -> int:
    from . import decode

    _check_outputs(a, RUN_OUTPUTS)
    _check_gantt_tiles(a)
    if a.npz is not None and a.mode != "data":
        raise ValidationError("--npz needs --mode data: a timing-mode run computes no numbers to save.")
    kw = _kwargs(a)
    _before_simulating(kw, (a.variant,))
    data = kw["mode"] == "data"
    needs_log = bool(a.oplog or a.trace or a.gantt)
    phases = ([_simulating([a.variant], kw["mode"])] + (["the float64 reference"] if data else [])
              + (["building the op_log"] if needs_log else []))
    with _progress(a, phases) as bar:
        with bar.phase(phases[0]):
            r = decode.run(a.variant, **kw)
        if data:
            with bar.phase("the float64 reference"):
                error = r.error
        if needs_log:
            with bar.phase("building the op_log"):
                _ = r.op_log  # built once here, under the bar, for every output that reads it
    print(r)
    ds = r.dispatch_per_tile
    print(f"dispatch cycles per tile: {int(ds.iloc[0])} (closed form {int(r.closed_form_per_tile.iloc[0])}); "
          f"end-to-end {r.cycles} cycles = {r.topology.cycles_to_us(r.cycles):.3f} us")
    if data:
        print(f"max |O - float64 reference| = {error:.3e}")
    if a.oplog:
        _write("--oplog", a.oplog, r.to_csv)
    if a.npz:
        _write("--npz", a.npz, r.to_npz)
    if a.trace:
        _write("--trace", a.trace, r.to_perfetto, " (open it in https://ui.perfetto.dev)")
    if a.gantt:
        from . import plots

        tiles = _gantt_tiles(a.gantt_tiles, r.n_tiles)
        _note_tiles(a.gantt_tiles, r.n_tiles)
        ax = plots.gantt_or_utilization(
            r.op_log, window=plots.tile_window(r.op_log, range(tiles)), dpi=PNG_DPI, clock_ghz=r.topology.clock_ghz,
            title=f"{a.variant}: first {tiles} of {r.n_tiles} tiles ({r.cycles:,} cycles in all)\n"
                  f"{plots.describe(r.params)}",
            holds=r.run.holds(), critical_path=r.run.critical_path())
        _note_utilization([ax])
        _write("--gantt", a.gantt, _save_png(ax.figure))
    return 0


def cmd_golden(a: argparse.Namespace) -> int:
    from . import golden

    if a.update:
        try:
            changed = golden.update()
        except OSError as exc:
            raise _OutputError(f"golden --update: could not write {exc.filename!r}: {exc.strerror or exc}; "
                               f"that golden is unchanged.") from None
        print("goldens rewritten: " + (", ".join(changed) if changed else "none changed"))
        return 0
    problems = golden.check()
    for pmsg in problems:
        print(pmsg)
    n = len(golden.golden_benches())
    print(f"{n - len(problems)}/{n} goldens match" + ("" if not problems else
                                                     " — if the change is intended, run `kbwork golden --update` "
                                                     "and say why in the commit message"))
    return 1 if problems else 0


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = ArgumentParser(prog="kbwork", description="AHBM PE kernel workbench.")
    p.add_argument("--version", action="version", version=f"kbwork {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    from .kernels.gqa_decode import DEFAULT_VARIANTS, VARIANTS, commands_per_tile

    def about(name: str) -> str:
        what = VARIANTS[name].doc
        return f"{name} ({commands_per_tile(name)} commands per tile" + (f": {what})" if what else ")")

    c = sub.add_parser("compare", help="opt2 vs opt3 (or any variants): dispatch ratio, gate, cycles, numerics")
    c.add_argument("--variants", type=variant_list, default=DEFAULT_VARIANTS,
                   help=f"variants to compare, comma-separated, two or more of {', '.join(VARIANTS)} "
                        f"(default {','.join(DEFAULT_VARIANTS)})")
    _sim_options(c)
    c.add_argument("--json", action="store_true", help="print the comparison as JSON")
    c.add_argument("--gantt", type=file_path, help="write a side-by-side Gantt of a few tiles to this .png file")
    c.add_argument("--gantt-tiles", type=gantt_tiles, default=None,
                   help=f"tiles shown in --gantt, at most the run's tiles, or 'all' (default {GANTT_TILES})")
    c.set_defaults(fn=cmd_compare)

    x = sub.add_parser("explain", help="where each variant's time goes: utilisation, critical path, waits, bound")
    x.add_argument("--variants", type=one_or_more_variants, default=DEFAULT_VARIANTS,
                   help=f"variants to explain, comma-separated, one or more of {', '.join(VARIANTS)} "
                        f"(default {','.join(DEFAULT_VARIANTS)})")
    _sim_options(x, mode="timing")
    x.add_argument("--json", action="store_true", help="print the explanations as JSON")
    x.add_argument("--png", type=file_path, help="write the critical-path attribution bar charts to this .png file")
    x.add_argument("--top", type=int_range(1, 100), default=5, help="how many of the largest waits to list (default 5)")
    x.set_defaults(fn=cmd_explain)

    r = sub.add_parser("run", help="simulate one decode variant")
    r.add_argument("--variant", required=True, choices=list(VARIANTS),
                   help="the decode variant to simulate: " + "; ".join(about(v) for v in VARIANTS))
    _sim_options(r)
    r.add_argument("--oplog", type=file_path, help="write the op_log CSV to this .csv file")
    r.add_argument("--npz", type=file_path, help="write inputs q, k, v and final m, l, O to this .npz file (data mode)")
    r.add_argument("--trace", type=file_path, help="write a Perfetto/Chrome-trace JSON to this .json file")
    r.add_argument("--gantt", type=file_path, help="write a Gantt of the first tiles to this .png file (utilisation "
                                              "over time when they hold more stages than the image has pixels)")
    r.add_argument("--gantt-tiles", type=gantt_tiles, default=None,
                   help=f"tiles shown in --gantt, at most the run's tiles, or 'all' (default {GANTT_TILES})")
    r.set_defaults(fn=cmd_run)

    g = sub.add_parser("golden", help="check or rewrite the golden op_logs in data/golden/")
    grp = g.add_mutually_exclusive_group(required=True)
    grp.add_argument("--check", action="store_true", help="compare every golden (exit 1 on a difference)")
    grp.add_argument("--update", action="store_true", help="rewrite every golden (on purpose only)")
    g.set_defaults(fn=cmd_golden)

    from .model.cli import add_parser as add_step

    add_step(sub).set_defaults(progress_bar=_progress)  # kbwork step: a model's decode step (DESIGN.md §15)

    b = sub.add_parser("bench", help="timing benchmark (stages simulated per second)", add_help=False)
    b.set_defaults(fn=None)
    return p


def main(argv: list[str] | None = None, *, bench: Callable[[list[str]], int] | None = None) -> int:
    """Run the ``kbwork`` command.

    Args:
        argv: the arguments (default ``sys.argv[1:]``).
        bench: what runs ``kbwork bench ...`` with the arguments after ``bench``
            (:func:`kbwork.bench.main`); the command's entry point,
            :func:`kbwork.__main__.main`, passes it in. Without it, ``bench``
            is refused with a pointer there.

    Returns:
        The exit status: 0 on success, 1 when ``golden --check`` finds a
        difference (or the bench a SimPy mismatch), 2 on a mistake in the
        arguments or a failed output write (after printing one
        ``kbwork: error: ...`` line to stderr).

    Raises:
        SystemExit: from argparse, with status 2 after one ``kbwork: error: ...``
            line, for a malformed argument (and 0 for ``--help``).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args: argparse.Namespace | None = None
    try:
        if argv[:1] == ["bench"]:
            if bench is None:
                raise KbworkError("bench: the benchmark runs from the kbwork command's entry point: "
                                  "`python -m kbwork bench ...` or `python -m kbwork.bench ...`; if the kbwork "
                                  "script says this, it predates kbwork.__main__: reinstall (pip install -e .).")
            return bench(argv[1:])
        args = build_parser().parse_args(argv)
        return args.fn(args)
    except TcmOverflowError as exc:
        print(f"kbwork: error: {exc}{_tcm_hint(args)}", file=sys.stderr)
        return 2
    except KbworkError as exc:
        print(f"kbwork: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kbwork: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`kbwork compare | head`): nothing is wrong, and Python must not
        # complain again when it flushes stdout at exit
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
