"""What every command line that runs decode variants shares: the ``--variants`` type and the TCM hint.

``kbwork compare``, ``explain`` and ``run`` (:mod:`kbwork.cli`) and ``kbwork
step`` (:mod:`kbwork.model.cli`) name decode variants and may overflow the
TCM; they read the variants and word the way out of an overflow through the
functions here, so the two command lines say the same thing in the same
words (each in its own options). It ranks with ``decode``: the hint sizes a
TCM with :func:`kbwork.decode.tcm_bytes_that_fit`, and ``model/`` sits above.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable, Mapping, Sequence

from .config import MAX_TCM_BYTES
from .errors import KbworkError


def variant_list(text: str, least: int = 2) -> tuple[str, ...]:
    """An argparse type: ``least`` (default two) or more registered decode variants, comma-separated, none
    twice.

    Returns:
        The variant names, in the order given.

    Raises:
        argparse.ArgumentTypeError: an empty entry, a variant that is not registered, a variant named twice,
            or fewer than ``least``.
    """
    from .kernels.gqa_decode import VARIANTS

    names = tuple(x.strip() for x in text.split(","))
    if "" in names:
        raise argparse.ArgumentTypeError(f"{text!r} has an empty entry; list variants comma-separated, e.g. opt2,opt3")
    unknown = [x for x in names if x not in VARIANTS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    if len(names) < least or len(set(names)) != len(names):
        many = "two or more different variants" if least == 2 else "one or more different variants"
        raise argparse.ArgumentTypeError(f"expected {many}, comma-separated (e.g. opt2,opt3,a1), got {text!r}")
    return names


def one_or_more_variants(text: str) -> tuple[str, ...]:
    """An argparse type: one or more registered decode variants, comma-separated, none twice
    (:func:`variant_list` with ``least=1``).

    Raises:
        argparse.ArgumentTypeError: as :func:`variant_list`.
    """
    return variant_list(text, least=1)


variant_list.__name__ = one_or_more_variants.__name__ = "variants"  # argparse names the type in some messages


def tcm_hint(variants: Sequence[str], sizes: Callable[[], Mapping[str, Any]], *, file_flag: str,
             also: str = "", smaller: str) -> str:
    """What a command line can type for a TCM large enough, to follow a TCM overflow's message: the smallest
    power of two of bytes in which one tile of every variant in ``variants`` fits (a TCM holds what one tile
    needs, whatever the tile count), in that command's own options.

    Args:
        variants: the variants asked for.
        sizes: returns the keyword arguments of :func:`kbwork.decode.tcm_bytes_that_fit` other than the
            variants (tile, group, head_dim, topology, ...); called here, so a mistake it raises (a
            :class:`~kbwork.errors.KbworkError`) gives the hint in words instead of a size.
        file_flag: the option that takes a topology file (``--topology``, ``--device``).
        also: another way out, after the ``--set`` one (``", a smaller --tile"``).
        smaller: what to make smaller when no TCM kbwork allows is large enough.

    Returns:
        The hint, starting with a space: ``" On the command line: --set tcm_bytes=262144 (now 16384), or
        --topology FILE with that tcm_bytes."``.
    """
    from .decode import tcm_bytes_that_fit

    try:
        now, size = tcm_bytes_that_fit(variants, **sizes())
    except KbworkError:
        return f" On the command line: --set tcm_bytes=N{also}, or {file_flag} FILE with a larger tcm_bytes."
    if size is not None:
        return (f" On the command line: --set tcm_bytes={size} (now {now}){also}, or {file_flag} FILE with that "
                f"tcm_bytes.")
    return f" No TCM kbwork allows is large enough (the largest is --set tcm_bytes={MAX_TCM_BYTES}); use {smaller}."
