"""A model-parallel unit (Megatron's ``mpu`` interface, which ``deepspeed.initialize(mpu=...)`` takes) for the
model-parallel jobs of the kit's DeepSpeed suites: tensor-parallel size 2, data-parallel size 1, on 2 ranks."""

import torch.distributed as dist


class TensorParallelMPU:
    """Tensor-parallel group {0, 1}; each rank a data-parallel group of its own, {0} and {1}, as Megatron builds them.
    Made on both ranks at the same point (``new_group`` is a collective of every rank)."""

    def __init__(self):
        self.rank = dist.get_rank()
        self.tensor_group = dist.new_group([0, 1])
        self.data_groups = [dist.new_group([0]), dist.new_group([1])]

    def get_data_parallel_group(self):
        return self.data_groups[self.rank]

    def get_data_parallel_rank(self):
        return 0

    def get_data_parallel_world_size(self):
        return 1

    def get_model_parallel_group(self):
        return self.tensor_group

    def get_model_parallel_rank(self):
        return self.rank

    def get_model_parallel_world_size(self):
        return 2

    get_tensor_model_parallel_group = get_model_parallel_group
    get_tensor_model_parallel_rank = get_model_parallel_rank
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
