import pytest
import torch


@pytest.fixture
def tokens() -> torch.Tensor:
    return torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(1))
