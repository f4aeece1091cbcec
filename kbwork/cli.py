"""The ``kbwork`` command: compare, run, golden, bench."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .errors import KbworkError


def _sim_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decode and topology options")
    g.add_argument("--kv-len", type=int, default=4096, help="KV length N (default 4096)")
    g.add_argument("--tile", type=int, default=128, help="KV tile T (default 128)")
    g.add_argument("--group", type=int, default=8, help="query rows per KV head G (default 8)")
    g.add_argument("--head-dim", type=int, default=128, help="head dimension d (default 128)")
    g.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"], help="storage dtype of q, k, v")
    g.add_argument("--mode", default="data", choices=["data", "timing"], help="data (numbers) or timing only")
    g.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    g.add_argument("--topology", default=None, help="topology name or .toml path (default ahbm-pe-v1)")
    g.add_argument("--fixed", type=int, default=None, help="dispatch FIXED cycles (default: topology)")
    g.add_argument("--r", type=float, default=None, help="dispatch R cycles/byte (default: topology)")
    g.add_argument("--hazard-policy", default=None, choices=["strict_fifo", "rw_aware"],
                   help="hazard policy (default: topology, strict_fifo)")


def _kwargs(a: argparse.Namespace) -> dict[str, Any]:
    kw: dict[str, Any] = dict(kv_len=a.kv_len, tile=a.tile, group=a.group, head_dim=a.head_dim, dtype=a.dtype,
                              mode=a.mode, seed=a.seed, topology=a.topology)
    if a.fixed is not None:
        kw["fixed_cycles"] = a.fixed
    if a.r is not None:
        kw["r_cycles_per_byte"] = a.r
    if a.hazard_policy is not None:
        kw["hazard_policy"] = a.hazard_policy
    return kw


def format_comparison(cmp: Any) -> str:
    """The human-readable report ``kbwork compare`` prints."""
    d = cmp.to_dict()
    p = d["params"]
    lines = [
        f"GQA decode, one KV head: kv_len={p['kv_len']} group={p['group']} head_dim={p['head_dim']} "
        f"tile={p['tile']} dtype={p['dtype']} mode={p['mode']}",
        f"topology {p['topology']}: FIXED={p['fixed_cycles']} cycles, R={p['r_cycles_per_byte']} cycles/byte, "
        f"hazards={p['hazard_policy']}",
        "",
        f"{'':28}{'opt2':>12}{'opt3':>12}",
        f"{'commands per tile':28}{d['commands_per_tile']['opt2']:>12}{d['commands_per_tile']['opt3']:>12}",
        f"{'dispatch cycles per tile':28}{d['dispatch_per_tile']['opt2']:>12}{d['dispatch_per_tile']['opt3']:>12}",
        f"{'  closed form':28}{d['closed_form_per_tile']['opt2']:>12}{d['closed_form_per_tile']['opt3']:>12}",
        f"{'end-to-end cycles':28}{d['cycles']['opt2']:>12}{d['cycles']['opt3']:>12}",
        f"{'end-to-end us':28}{d['us']['opt2']:>12.3f}{d['us']['opt3']:>12.3f}",
    ]
    errs = d["max_abs_err_vs_ref"]
    if errs is not None:
        lines.append(f"{'max |O - float64 ref|':28}{errs['opt2']:>12.3e}{errs['opt3']:>12.3e}")
    if d["ratio"] is None or d["closed_form_ratio"] is None:  # FIXED = R = 0 (DESIGN.md §7)
        ratio_line = (f"dispatch ratio opt3/opt2: undefined (opt2 dispatches 0 cycles per tile: every dispatch "
                      f"is free at FIXED={p['fixed_cycles']}, R={p['r_cycles_per_byte']})")
    else:
        ratio_line = f"dispatch ratio opt3/opt2: {d['ratio']:.4f} (closed form {d['closed_form_ratio']:.4f})"
    lines += [
        "",
        ratio_line,
        f"gate opt3 > 2 x opt2: {'PASS' if d['gate']['pass'] else 'FAIL'}",
        f"end-to-end: opt3 takes {d['speedup_opt3_over_opt2']:.3f}x the cycles of opt2",
    ]
    if errs is not None:
        diff = d["max_abs_diff_opt2_opt3"]
        lines += [
            f"max |opt2 - opt3|: m {diff['m']:.3e}, l {diff['l']:.3e}, O {diff['O']:.3e}",
            f"numerics: bound 2 x plain-attention error + 1e-6 = {errs['bound']:.3e} "
            f"(plain attention in {p['dtype']}: {errs['baseline']:.3e}): {'PASS' if errs['pass'] else 'FAIL'}",
        ]
    return "\n".join(lines)


def cmd_compare(a: argparse.Namespace) -> int:
    from . import decode

    cmp = decode.compare(**_kwargs(a))
    if a.json:
        print(json.dumps(cmp.to_dict(), indent=2))
    else:
        print(format_comparison(cmp))
    if a.gantt:
        from . import plots

        fig = plots.compare_gantt(cmp.opt2.op_log, cmp.opt3.op_log, tiles=a.gantt_tiles,
                                  clock_ghz=cmp.opt2.topology.clock_ghz)
        fig.savefig(a.gantt, dpi=120)
        print(f"wrote {a.gantt}", file=sys.stderr)
    return 0


def cmd_run(a: argparse.Namespace) -> int:
    from . import decode

    r = decode.run(a.variant, **_kwargs(a))
    print(r)
    ds = r.dispatch_per_tile
    print(f"dispatch cycles per tile: {int(ds.iloc[0])} (closed form {int(r.closed_form_per_tile.iloc[0])}); "
          f"end-to-end {r.cycles} cycles = {r.topology.cycles_to_us(r.cycles):.3f} us")
    if r.O is not None:
        print(f"max |O - float64 reference| = {r.error:.3e}")
    if a.oplog:
        r.to_csv(a.oplog)
        print(f"wrote {a.oplog}", file=sys.stderr)
    if a.npz:
        r.to_npz(a.npz)
        print(f"wrote {a.npz}", file=sys.stderr)
    if a.trace:
        r.to_perfetto(a.trace)
        print(f"wrote {a.trace} (open it in https://ui.perfetto.dev)", file=sys.stderr)
    if a.gantt:
        from . import plots

        ax = plots.gantt(r.op_log, window=plots.tile_window(r.op_log, range(min(3, r.n_tiles))),
                         clock_ghz=r.topology.clock_ghz, title=f"{a.variant}, first tiles")
        ax.figure.savefig(a.gantt, dpi=120)
        print(f"wrote {a.gantt}", file=sys.stderr)
    return 0


def cmd_golden(a: argparse.Namespace) -> int:
    from . import golden

    if a.update:
        changed = golden.update()
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

    c = sub.add_parser("compare", help="opt2 vs opt3: dispatch ratio, gate, cycles, numerics")
    _sim_options(c)
    c.add_argument("--json", action="store_true", help="print the comparison as JSON")
    c.add_argument("--gantt", type=Path, help="write a side-by-side Gantt of a few tiles to this PNG")
    c.add_argument("--gantt-tiles", type=int, default=3, help="tiles shown in --gantt (default 3)")
    c.set_defaults(fn=cmd_compare)

    r = sub.add_parser("run", help="simulate one decode variant")
    r.add_argument("--variant", required=True, choices=["opt2", "opt3"])
    _sim_options(r)
    r.add_argument("--oplog", type=Path, help="write the op_log CSV here")
    r.add_argument("--npz", type=Path, help="write inputs q, k, v and final m, l, O here (data mode)")
    r.add_argument("--trace", type=Path, help="write a Perfetto/Chrome-trace JSON here")
    r.add_argument("--gantt", type=Path, help="write a Gantt PNG of the first tiles here")
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
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        from .bench import main as bench_main

        return bench_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except KbworkError as exc:
        print(f"kbwork: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
