"""Recipes: named sets of defaults for a job spec's training knobs.

`accurate` (the default) is the spec's own defaults: eight epochs, batch 64, AdamW under a
cosine schedule, affine augmentation, label smoothing and a moving average of the weights
(99.6% on the full MNIST). `fast` is for one epoch: batch 256, AdamW at 1e-2 under a
one-cycle schedule, no augmentation and no moving average (which would still remember the
first steps' weights after one epoch): 99.0% or more on the full MNIST in one epoch.

A recipe fills only the knobs a spec leaves out; every knob stays in the spec, and the spec's
`recipe_filled` names the ones its recipe filled. See docs/api.md ("Recipes")."""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class Recipe(StrEnum):
    accurate = "accurate"
    fast = "fast"


# Each recipe sets the same knobs; accurate's values are the JobSpec fields' own defaults.
RECIPES: dict[Recipe, dict[str, Any]] = {
    Recipe.accurate: {
        "epochs": 8,
        "batch_size": 64,
        "lr": 1e-3,
        "scheduler": "cosine",
        "augment": "affine",
        "label_smoothing": 0.1,
        "ema_decay": 0.999,
    },
    Recipe.fast: {
        "epochs": 1,
        "batch_size": 256,
        "lr": 1e-2,
        "scheduler": "onecycle",
        "augment": "none",
        "label_smoothing": 0.1,
        "ema_decay": None,
    },
}
KNOBS = tuple(RECIPES[Recipe.accurate])


def with_recipe(raw: dict[str, Any]) -> dict[str, Any]:
    """A spec's fields as submitted, with its recipe's values for the knobs it left out and
    `recipe_filled` naming those. A spec that names `recipe_filled` itself (as a stored one
    does) keeps it, and JobSpec checks it against the recipe (recipe_problem)."""
    try:
        recipe = Recipe(raw.get("recipe", Recipe.accurate))
    except ValueError:
        return raw  # JobSpec says what recipes there are
    if "recipe_filled" in raw:
        return raw
    filled = [k for k in KNOBS if k not in raw]
    return {**{k: RECIPES[recipe][k] for k in filled}, **raw, "recipe_filled": filled}


def recipe_problem(recipe: Recipe, filled: tuple[str, ...], values: dict[str, Any]) -> str | None:
    """Why `filled` cannot be what `recipe` filled in a spec of these `values`; or None."""
    if len(set(filled)) != len(filled):
        return "recipe_filled: each knob at most once"
    for name in filled:
        if name not in RECIPES[recipe]:
            return f"recipe_filled: {name!r} is no knob a recipe sets ({', '.join(KNOBS)})"
        if values[name] != RECIPES[recipe][name]:
            return f"recipe_filled: {name} is not the {recipe} recipe's {RECIPES[recipe][name]!r}"
    return None
