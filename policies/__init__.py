"""Draft-length policies: pure stop/continue decisions and their state, and their registry."""

from policies.adaedl import AdaEDLPolicy
from policies.base import (
    FEATURE_NAMES,
    Decision,
    DraftPolicy,
    DraftStep,
    RequestContext,
    RoundOutcome,
)
from policies.batch_schedule import BatchAware, BatchSchedulePolicy
from policies.confidence import MaxConfidencePolicy
from policies.dynamic_threshold import (
    DynamicThresholdConfig,
    DynamicThresholdState,
    ThresholdPolicy,
    update_dynamic_threshold,
)
from policies.heuristic import HFHeuristicPolicy
from policies.ngram_match import NgramMatchPolicy
from policies.oracle import GreedyOraclePolicy
from policies.registry import POLICIES, make_policy, policy_parameters
from policies.specdecpp import SpecDecPPPolicy
from policies.static import StaticPolicy
from policies.svip import SVIPPolicy
from policies.thompson import BetaTSPolicy, CaliTSPolicy

__all__ = [
    "FEATURE_NAMES",
    "POLICIES",
    "AdaEDLPolicy",
    "BatchAware",
    "BatchSchedulePolicy",
    "BetaTSPolicy",
    "CaliTSPolicy",
    "Decision",
    "DraftPolicy",
    "DraftStep",
    "DynamicThresholdConfig",
    "DynamicThresholdState",
    "GreedyOraclePolicy",
    "HFHeuristicPolicy",
    "MaxConfidencePolicy",
    "NgramMatchPolicy",
    "RequestContext",
    "RoundOutcome",
    "SVIPPolicy",
    "SpecDecPPPolicy",
    "StaticPolicy",
    "ThresholdPolicy",
    "make_policy",
    "policy_parameters",
    "update_dynamic_threshold",
]
