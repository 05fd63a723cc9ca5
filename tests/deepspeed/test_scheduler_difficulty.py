"""The DeepSpeed follow-up "scheduler-difficulty" (a commit of the series, ``docs/issues/scheduler-difficulty.md``): a
state loaded into a sampler that already read past it (a job that falls back to an older checkpoint in the same
process) reads what a new sampler that loads the same state reads.

Upstream file: deepspeed/runtime/data_pipeline/data_sampling/data_sampler.py (DeepSpeed 0.19.8): ``load_state_dict()``
sets ``current_difficulties`` but not the curriculum schedulers' own difficulty, and a scheduler stops updating once
it reaches its maximum. Tests marked ``regression("deepspeed", "scheduler-difficulty")`` fail on the base plus the
commits before it and pass with it, with one cluster and with several (where the difficulty decides which clusters
are built, so the batches differ too). The guard: a new sampler whose configuration has a lower maximum difficulty
than the state reads at that maximum, as the release's does.
"""

import copy

import pytest

from tests.deepspeed.sampling import first_divergence, make_sampler, pristine_sampler_class, through_checkpoint
from tests.deepspeed.scenarios import SCENARIOS, SINGLE_CLUSTER, with_index_to_sample

pytestmark = pytest.mark.usefixtures("stub_collectives")

NUM_BATCHES = 24  # micro-batches of 4, two a curriculum step: past the maximum difficulty (step 7) of both set-ups
LOAD_AT = 5  # the state after micro-batch 5: curriculum step 3, before the maximum


def read(sampler, count):
    """The next ``count`` micro-batches of ``sampler``, each with the difficulties of the state after it."""
    batches = iter(sampler)
    return [(next(batches), sampler.state_dict()["current_difficulties"]) for _ in range(count)]


def states_of_a_run(sampler, count):
    """The checkpoints (through ``torch.save``; the release's hold numpy arrays) after each of the next ``count``
    micro-batches of ``sampler``."""
    batches, states = iter(sampler), []
    for _ in range(count):
        next(batches)
        states.append(through_checkpoint(sampler.state_dict()))
    return states


@pytest.mark.regression("deepspeed", "scheduler-difficulty")
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_earlier_state_loaded_into_the_same_sampler_reads_what_a_new_sampler_reads(tmp_path, scenario):
    metric = with_index_to_sample(SCENARIOS[scenario], tmp_path)
    sampler = make_sampler(tmp_path, "run", metric)
    state = states_of_a_run(sampler, NUM_BATCHES)[LOAD_AT - 1]
    sampler.load_state_dict(copy.deepcopy(state))
    new = make_sampler(tmp_path, "run", metric)
    new.load_state_dict(copy.deepcopy(state))
    expected = read(new, NUM_BATCHES - LOAD_AT)
    actual = read(sampler, NUM_BATCHES - LOAD_AT)
    diverged = first_divergence(expected, actual)
    assert diverged is None, (
        f"{scenario}: the sampler that went back reads otherwise from micro-batch {LOAD_AT + 1 + diverged}"
    )


def test_new_sampler_with_a_lower_maximum_difficulty_reads_at_it_as_the_release_does(tmp_path):
    state = states_of_a_run(make_sampler(tmp_path, "run", SINGLE_CLUSTER), NUM_BATCHES)[-1]
    assert state["current_difficulties"] == {"difficulty": 3}
    lower = dict(SINGLE_CLUSTER, max_difficulty=2, schedule_config={"difficulty": [1, 2], "max_step": [3]})
    difficulties = {}
    # The series first: the release's reshuffles rewrite the cluster file, which the series' load then refuses.
    for name, sampler_class in (("series", None), ("release", pristine_sampler_class(tmp_path))):
        kwargs = {"sampler_class": sampler_class} if sampler_class else {}
        sampler = make_sampler(tmp_path, "run", lower, **kwargs)
        sampler.load_state_dict(copy.deepcopy(state))
        difficulties[name] = [difficulty for _, difficulty in read(sampler, 6)]
    assert difficulties["series"] == difficulties["release"] == [{"difficulty": 2}] * 6, difficulties
