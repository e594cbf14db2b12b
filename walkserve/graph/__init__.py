"""The Walk Graph: what a model computes (torch-free).

A model author uses: GraphNode, GraphEdge, StreamingGraphEdge, Client, DROP,
Sequential, Parallel, Loop, DynamicLoop, LAST, ACCUMULATE, StopOnValue,
StopWhen, Walk, WalkStart, Playback, StateMachine, FunctionStateMachine, WalkGraph,
and the chunk policies FixedChunk, SlidingWindow, LeftContext.
"""

from walkserve.graph.compose import ACCUMULATE, LAST, DynamicLoop, Loop, Parallel, Sequential
from walkserve.graph.edge import DROP, MODALITIES, Client, GraphEdge, StreamingGraphEdge
from walkserve.graph.node import GraphNode
from walkserve.graph.plan import WalkPlan, compile_walk
from walkserve.graph.playback import Playback
from walkserve.graph.stop import StopOnValue, StopRule, StopWhen
from walkserve.graph.walk import FunctionStateMachine, StateMachine, Walk, WalkGraph, WalkStart
from walkserve.streaming.policy import FixedChunk, LeftContext, SlidingWindow

__all__ = [
    "ACCUMULATE",
    "DROP",
    "LAST",
    "MODALITIES",
    "Client",
    "DynamicLoop",
    "FixedChunk",
    "FunctionStateMachine",
    "GraphEdge",
    "GraphNode",
    "LeftContext",
    "Loop",
    "Parallel",
    "Playback",
    "Sequential",
    "SlidingWindow",
    "StateMachine",
    "StopOnValue",
    "StopRule",
    "StopWhen",
    "StreamingGraphEdge",
    "Walk",
    "WalkGraph",
    "WalkPlan",
    "WalkStart",
    "compile_walk",
]
