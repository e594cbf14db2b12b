"""Placement planning: measured node costs (profile), candidate placements that fit memory, scored by a cost model."""
