"""A request's priority at Triton: the level it maps to on a model whose scheduler has priority levels
(1 the highest), and the llm service's backends sending it with the request."""

from __future__ import annotations

import pytest

from services.llm.backends import Sampling
from services.llm.fastertransformer import FasterTransformer
from services.llm.tensors import ModelInterface, triton_priority
from tests.support.fake_triton import FakeModel, FakeTriton
from tests.unit.test_llm_fastertransformer import ft_config, ft_response


@pytest.mark.parametrize(("priority", "level"), [(0, 0), (-100, 1), (-1, 5), (1, 6), (100, 10), (1000, 10)])
def test_priorities_spread_over_the_models_levels_and_batch_work_takes_the_lowest(priority: int, level: int) -> None:
    assert triton_priority(10, priority) == level


def test_a_model_without_levels_gets_its_default_level() -> None:
    assert triton_priority(0, -50) == 0
    assert ModelInterface({}).priority_levels == 0
    assert ModelInterface({"dynamic_batching": {"priority_levels": "4"}}).triton_priority(-100) == 1


async def test_the_backend_sends_the_level_with_the_request() -> None:
    config = {**ft_config(), "dynamic_batching": {"priority_levels": 3, "default_priority_level": 2}}
    async with FakeTriton({"m": FakeModel(config, [ft_response([7, 8, 9, 20], 8, [-1.0])])}) as triton:
        adapter = FasterTransformer(*await triton.calling("m"), "m")
        adapter.configure(config)
        for priority in (-100, 0, 1000):
            sampling = Sampling(max_new_tokens=2, greedy=True, priority=priority)
            assert [step async for step in adapter.stream([7, 8, 9], sampling, None)]
    assert [request.priority for request in triton.requests] == [1, 0, 3]
