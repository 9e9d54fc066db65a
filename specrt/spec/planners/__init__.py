"""Planners: who drafts and how many tokens each round (`fixed`: one drafter, one K;
`adaptive`: method "auto"). `build_planner` makes the one a SpecConfig describes from explicit
parts: the draft-model drafter (if any) and a way to get calibrated costs."""
from __future__ import annotations

from typing import Callable

from specrt.errors import ConfigError
from specrt.spec.config import NEEDS_DRAFT, SpecConfig
from specrt.spec.costs import CostModel
from specrt.spec.drafters.base import Drafter
from specrt.spec.drafters.ngram import NgramDrafter
from specrt.spec.planners.base import PLAIN, Plan, Planner
from specrt.spec.planners.fixed import FixedPlanner

__all__ = ["PLAIN", "Plan", "Planner", "FixedPlanner", "build_planner"]


def build_planner(spec: SpecConfig | None, draft_model: Drafter | None,
                  costs: Callable[[int], CostModel]) -> Planner | None:
    """The planner for `spec` (None: plain decoding). costs(max_k) calibrates on first use."""
    if spec is None:
        return None
    k = spec.num_speculative_tokens
    if spec.method == "draft_model":
        if draft_model is None:
            raise ConfigError(NEEDS_DRAFT)
        return FixedPlanner(draft_model, k)
    ngram = NgramDrafter(spec.prompt_lookup_min, spec.prompt_lookup_max)
    if spec.method == "ngram":
        return FixedPlanner(ngram, k)
    from specrt.spec.planners.adaptive import AdaptivePlanner

    return AdaptivePlanner(k, costs(k), draft_model=draft_model, ngram=ngram)
