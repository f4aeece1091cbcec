"""The ``kbwork`` command: compare, explain, run, golden, bench.

Every argument and every output path is checked before anything is
simulated. A mistake ends with exit status 2 and one ``kbwork: error: ...``
line (argparse's usage line too, for a malformed argument), never a
traceback: that covers every :class:`~kbwork.errors.KbworkError` and an
``OSError`` while writing an output. Outputs are written atomically to
exactly the path given, which must end in the suffix of its kind (``--oplog``
.csv, ``--trace`` .json, ``--npz`` .npz, ``--gantt`` .png); a wrong suffix is
refused rather than silently changed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable

from . import atomic
from .config import FLOAT_RANGES, MAX_INT
from .errors import KbworkError, ValidationError


# --- argument types: argparse reports their message as "argument --flag: <message>" -------------------
def int_range(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an int in ``[low, high]`` (no upper bound when ``high`` is None)."""
    what = (f"an integer between {low} and {high}" if high is not None else
            "a positive integer" if low == 1 else "a non-negative integer" if low == 0 else f"an integer >= {low}")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value

    parse.__name__ = "int"  # argparse names the type in some messages
    return parse


def float_range(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a finite float in ``[low, high]``."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number between {low:g} and {high:g}, got {text!r}") from None
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(f"expected a number between {low:g} and {high:g}, got {text!r}")
        return value

    parse.__name__ = "float"
    return parse


positive_int = int_range(1)
nonnegative_int = int_range(0)


def _sim_options(p: argparse.ArgumentParser, mode: str = "data") -> None:
    g = p.add_argument_group("decode and topology options")
    g.add_argument("--kv-len", type=positive_int, default=4096, help="KV length N (default 4096)")
    g.add_argument("--tile", type=positive_int, default=128, help="KV tile T (default 128)")
    g.add_argument("--group", type=positive_int, default=8, help="query rows per KV head G (default 8)")
    g.add_argument("--head-dim", type=positive_int, default=128, help="head dimension d (default 128)")
    g.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"], help="storage dtype of q, k, v")
    g.add_argument("--mode", default=mode, choices=["data", "timing"],
                   help=f"data (numbers) or timing only (default {mode})")
    g.add_argument("--seed", type=nonnegative_int, default=0, help="input seed, >= 0 (default 0)")
    g.add_argument("--topology", default=None, help="topology name or .toml path (default ahbm-pe-v1)")
    g.add_argument("--fixed", type=int_range(0, MAX_INT), default=None,
                   help="dispatch FIXED cycles (default: topology)")
    g.add_argument("--r", type=float_range(0.0, FLOAT_RANGES["r_cycles_per_byte"][1]), default=None,
                   help="dispatch R cycles/byte (default: topology)")
    g.add_argument("--hazard-policy", default=None, choices=["strict_fifo", "rw_aware"],
                   help="hazard policy (default: topology, strict_fifo)")


def _kwargs(a: argparse.Namespace) -> dict[str, Any]:
    if a.kv_len % a.tile:  # decode.run says so too, in its own argument names
        raise ValidationError(f"--kv-len {a.kv_len} is not a multiple of tile {a.tile} (--tile); e.g. "
                              f"--kv-len {max(1, round(a.kv_len / a.tile)) * a.tile}.")
    kw: dict[str, Any] = dict(kv_len=a.kv_len, tile=a.tile, group=a.group, head_dim=a.head_dim, dtype=a.dtype,
                              mode=a.mode, seed=a.seed, topology=a.topology)
    if a.fixed is not None:
        kw["fixed_cycles"] = a.fixed
    if a.r is not None:
        kw["r_cycles_per_byte"] = a.r
    if a.hazard_policy is not None:
        kw["hazard_policy"] = a.hazard_policy
    return kw


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


def variant_list(text: str, least: int = 2) -> tuple[str, ...]:
    """An argparse type: ``least`` (default two) or more registered decode variants, comma-separated, none
    twice."""
    from .kernels.gqa_decode import VARIANTS

    names = tuple(x.strip() for x in text.split(",") if x.strip())
    unknown = [x for x in names if x not in VARIANTS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    if len(names) < least or len(set(names)) != len(names):
        many = "two or more different variants" if least == 2 else "one or more different variants"
        raise argparse.ArgumentTypeError(f"expected {many}, comma-separated (e.g. opt2,opt3,a1), got {text!r}")
    return names


def one_or_more_variants(text: str) -> tuple[str, ...]:
    """An argparse type: one or more registered decode variants, comma-separated, none twice."""
    return variant_list(text, least=1)


one_or_more_variants.__name__ = "variants"


def gantt_tiles(text: str) -> int | None:
    """An argparse type: a positive number of tiles, or ``all`` (``None``)."""
    if text.strip().lower() == "all":
        return None
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


def cmd_compare(a: argparse.Namespace) -> int:
    from . import analysis, decode

    _check_outputs(a, (("--gantt", "gantt", ".png"),))
    cmp = decode.compare(variants=a.variants, **_kwargs(a))
    bounds = {v: x.short for v, x in analysis.explain_all(cmp).items()}
    if a.json:
        print(json.dumps({**cmp.to_dict(), "bound": bounds}, indent=2))
    else:
        print(format_comparison(cmp, bounds))
    if a.gantt:
        from . import plots

        first = next(iter(cmp.runs.values()))
        tiles = _gantt_tiles(a.gantt_tiles, first.n_tiles)
        fig = plots.compare_gantt(cmp, tiles=tiles, holds=True, critical_path=True, dpi=PNG_DPI)
        _note_utilization(fig.axes)
        _write("--gantt", a.gantt, _save_png(fig))
    return 0


def _gantt_tiles(asked: int | None, n_tiles: int) -> int:
    """The tiles ``--gantt`` draws: what was asked (``None``: all), at most the run's, with a note if fewer."""
    if asked is None:
        return n_tiles
    if asked > n_tiles:
        print(f"kbwork: note: the run has {n_tiles} tiles; --gantt draws {n_tiles}, not {asked}", file=sys.stderr)
    return min(asked, n_tiles)


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
    runs = {v: decode.run(v, **kw) for v in a.variants}  # the same seed: the same inputs for each
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
    if a.npz is not None and a.mode != "data":
        raise ValidationError("--npz needs --mode data: a timing-mode run computes no numbers to save.")
    r = decode.run(a.variant, **_kwargs(a))
    print(r)
    ds = r.dispatch_per_tile
    print(f"dispatch cycles per tile: {int(ds.iloc[0])} (closed form {int(r.closed_form_per_tile.iloc[0])}); "
          f"end-to-end {r.cycles} cycles = {r.topology.cycles_to_us(r.cycles):.3f} us")
    if r.O is not None:
        print(f"max |O - float64 reference| = {r.error:.3e}")
    if a.oplog:
        _write("--oplog", a.oplog, r.to_csv)
    if a.npz:
        _write("--npz", a.npz, r.to_npz)
    if a.trace:
        _write("--trace", a.trace, r.to_perfetto, " (open it in https://ui.perfetto.dev)")
    if a.gantt:
        from . import plots

        tiles = _gantt_tiles(a.gantt_tiles, r.n_tiles)
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
    p = argparse.ArgumentParser(prog="kbwork", description="AHBM PE kernel workbench.")
    sub = p.add_subparsers(dest="command", required=True)

    from .kernels.gqa_decode import DEFAULT_VARIANTS, VARIANTS

    c = sub.add_parser("compare", help="opt2 vs opt3 (or any variants): dispatch ratio, gate, cycles, numerics")
    c.add_argument("--variants", type=variant_list, default=DEFAULT_VARIANTS,
                   help=f"variants to compare, comma-separated, two or more of {', '.join(VARIANTS)} "
                        f"(default {','.join(DEFAULT_VARIANTS)})")
    _sim_options(c)
    c.add_argument("--json", action="store_true", help="print the comparison as JSON")
    c.add_argument("--gantt", type=Path, help="write a side-by-side Gantt of a few tiles to this .png file")
    c.add_argument("--gantt-tiles", type=gantt_tiles, default=3,
                   help="tiles shown in --gantt, at most the run's tiles, or 'all' (default 3)")
    c.set_defaults(fn=cmd_compare)

    x = sub.add_parser("explain", help="where each variant's time goes: utilisation, critical path, waits, bound")
    x.add_argument("--variants", type=one_or_more_variants, default=DEFAULT_VARIANTS,
                   help=f"variants to explain, comma-separated, one or more of {', '.join(VARIANTS)} "
                        f"(default {','.join(DEFAULT_VARIANTS)})")
    _sim_options(x, mode="timing")
    x.add_argument("--json", action="store_true", help="print the explanations as JSON")
    x.add_argument("--png", type=Path, help="write the critical-path attribution bar charts to this .png file")
    x.add_argument("--top", type=int_range(1, 100), default=5, help="how many of the largest waits to list (default 5)")
    x.set_defaults(fn=cmd_explain)

    r = sub.add_parser("run", help="simulate one decode variant")
    r.add_argument("--variant", required=True, choices=list(VARIANTS))
    _sim_options(r)
    r.add_argument("--oplog", type=Path, help="write the op_log CSV to this .csv file")
    r.add_argument("--npz", type=Path, help="write inputs q, k, v and final m, l, O to this .npz file (data mode)")
    r.add_argument("--trace", type=Path, help="write a Perfetto/Chrome-trace JSON to this .json file")
    r.add_argument("--gantt", type=Path, help="write a Gantt of the first tiles to this .png file (utilisation "
                                              "over time when they hold more stages than the image has pixels)")
    r.add_argument("--gantt-tiles", type=gantt_tiles, default=3,
                   help="tiles shown in --gantt, at most the run's tiles, or 'all' (default 3)")
    r.set_defaults(fn=cmd_run)

    g = sub.add_parser("golden", help="check or rewrite the golden op_logs in data/golden/")
    grp = g.add_mutually_exclusive_group(required=True)
    grp.add_argument("--check", action="store_true", help="compare every golden (exit 1 on a difference)")
    grp.add_argument("--update", action="store_true", help="rewrite every golden (on purpose only)")
    g.set_defaults(fn=cmd_golden)

    b = sub.add_parser("bench", help="timing benchmark (stages simulated per second)", add_help=False)
    b.set_defaults(fn=None)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the ``kbwork`` command.

    Returns:
        The exit status: 0 on success, 1 when ``golden --check`` finds a
        difference (or the bench a SimPy mismatch), 2 on a mistake in the
        arguments or a failed output write (after printing one
        ``kbwork: error: ...`` line to stderr).

    Raises:
        SystemExit: from argparse, with status 2 after its usage and error
            lines, for a malformed argument (and 0 for ``--help``).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["bench"]:
            from .bench import main as bench_main

            return bench_main(argv[1:])
        args = build_parser().parse_args(argv)
        return args.fn(args)
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
