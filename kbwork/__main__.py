"""The ``kbwork`` command's entry point: the ``kbwork`` script and ``python -m kbwork`` start here.

It sits above every other module (DESIGN §9): it routes ``kbwork bench`` to
the benchmark (:func:`kbwork.bench.main`, which ranks above the command line
and uses its parser) and every other subcommand to :func:`kbwork.cli.main`,
so ``cli`` never imports ``bench``.
"""

from __future__ import annotations

from . import bench, cli


def main(argv: list[str] | None = None) -> int:
    """Run the ``kbwork`` command: :func:`kbwork.cli.main` with the benchmark passed in.

    Returns:
        The exit status, as :func:`kbwork.cli.main` says.
    """
    return cli.main(argv, bench=bench.main)


if __name__ == "__main__":
    raise SystemExit(main())
