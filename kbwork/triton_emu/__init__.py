"""The compiler analog: the ``tl`` kernel language (TLContext) and its recipes."""

from .tl_context import TLContext
from .tl_recipes import RECIPE_DESCRIPTORS, EngineOp, PrimaryOutSpec, RecipeDescriptor

__all__ = ["TLContext", "RECIPE_DESCRIPTORS", "RecipeDescriptor", "PrimaryOutSpec", "EngineOp"]
