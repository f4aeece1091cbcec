"""The PE side: hardware commands, tile plans, the scheduler and the timeline.

Nothing in this package imports the compiler side (``kbwork.triton_emu``) or
knows about recipes: it sees flat op lists only (ADR-0065 D5, D6.5).
"""
