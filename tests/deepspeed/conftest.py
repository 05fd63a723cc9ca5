"""Fixtures for the DeepSpeed regression suite (DeepSpeed issue #8787).

The curriculum data sampler calls two collectives, ``deepspeed.comm.barrier`` (after building a difficulty cluster) and
``deepspeed.comm.broadcast`` (to send each global batch from global rank 0; with the series, from the first rank of its
data-parallel group, which is global rank 0 without model parallelism or a process group). The sampler-level tests run
in one process without a process group and ask for ``stub_collectives``, which replaces both by no-ops for the duration
of each test. With ``global_rank=0`` the sampler draws the global batch itself and the broadcast has nothing to
deliver. The engine-level tests launch real processes and stub nothing."""

import numpy as np
import pytest


@pytest.fixture
def stub_collectives(monkeypatch):
    """Replace ``barrier`` and ``broadcast`` where the sampler module looks them up; monkeypatch restores them."""
    from deepspeed.runtime.data_pipeline.data_sampling import data_sampler

    def no_op(*args, **kwargs):
        return None

    # data_sampler.py does `import deepspeed.comm as dist` and calls `dist.barrier(...)` / `dist.broadcast(...)`,
    # so the names are resolved on the deepspeed.comm module at call time.
    monkeypatch.setattr(data_sampler.dist, "barrier", no_op)
    monkeypatch.setattr(data_sampler.dist, "broadcast", no_op)


@pytest.fixture(autouse=True)
def keep_global_numpy_rng():
    """Tests here seed and draw from numpy's global RNG; leave it to the next test as it was found."""
    saved = np.random.get_state()
    yield
    np.random.set_state(saved)
