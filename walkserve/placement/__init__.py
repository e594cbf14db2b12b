"""Placement: which nodes run on which ranks and devices (YAML -> validated plan, torch-free)."""

from walkserve.placement.plan import Placement, RankSpec, load_placement, parse_placement

__all__ = ["Placement", "RankSpec", "load_placement", "parse_placement"]
