from __future__ import annotations

import pytest
import torch

from walkserve.models.pi0.files import load_policy_files
from walkserve.models.pi0.tiny import write_tiny_policy
from walkserve.models.pi0.weights import load_policy

torch.set_num_threads(1)


class Tiny:
    def __init__(self, kind: str, path):
        self.kind, self.path = kind, path
        self.policy = load_policy(path, progress=False)
        self.files = load_policy_files(path)


@pytest.fixture(scope="package")
def tiny_pi05(tmp_path_factory):
    return Tiny("pi05", write_tiny_policy("pi05", tmp_path_factory.mktemp("pi05"), seed=0))


@pytest.fixture(scope="package")
def tiny_pi0(tmp_path_factory):
    return Tiny("pi0", write_tiny_policy("pi0", tmp_path_factory.mktemp("pi0"), seed=1))
