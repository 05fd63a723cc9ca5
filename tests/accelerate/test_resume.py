"""A training job's restarts from ``accelerator.save_state()`` checkpoints, with Accelerate's stateful dataloaders on
2 processes: the follow-ups of #4204 that the Accelerate series' commits 2 to 4 fix.

The job (``accelerate_worker.resume_from_checkpoint``): ranks seeded differently, ``save_state()`` before the first
batch and after batch 2 of epoch 0, two epochs; each checkpoint is loaded with ``load_state()`` into a freshly
prepared loader, as a restarted job does. Configurations: ``DataLoaderShard`` and ``DataLoaderDispatcher``
(``dispatch_batches=True``, with and without ``split_batches``), a shuffled map-style dataset or an
``IterableDataset`` split between workers, ``num_workers`` 0 and 2, a checkpoint folder per rank or one shared by
the ranks (rank 1 writing last). What goes wrong on accelerate 1.16.0 (``src/accelerate/``):

- ``dispatcher-lookahead``: ``DataLoaderDispatcher`` records the state before each batch it fetches and
  ``DataLoaderAdapter.adjust_state_dict_for_prefetch`` (``data_loader.py`` line 458) subtracts ``num_processes - 1``
  batches: with ``split_batches`` a step is one batch (a batch read twice); with workers the state's layout has no
  such counts (a batch skipped).
- ``shared-checkpoint-folder``: every process writes ``dl_state_dict.bin`` (``checkpointing.py`` line 131), so in a
  shared folder the last writer's state is loaded into all processes; a dispatcher's rank 1 never reads data, and
  rank 0 then replays the epoch.
- ``shuffled-resume``: a dispatcher's ``RandomSampler`` has no generator of its own (``prepare_data_loader``, line
  1209, gives one only without ``dispatch_batches``), so the resumed loader redraws the epoch's order from the global
  RNG, which ``load_state()`` set back to the checkpoint's state, not the epoch's start.
- ``4204``: with workers, rank-seeded ``DataLoaderShard`` epochs are not a partition on the base (#4204 itself).

A test marked ``regression("accelerate", key)`` fails before the commit of that key and passes from it on (the gate
judges each commit); the others are guards and pass on the base too. Last, a dispatcher's state saved by one version
and loaded by the other (the release's ``data_loader.py`` beside the installed one). All read the suite's one launch
(``conftest.py``).
"""

import pytest

from tests.accelerate.accelerate_worker import RESUME_CONFIGS
from tests.launched import rank_results

pytestmark = pytest.mark.xdist_group("accelerate-launch")


def mid_epoch_key(config):
    """The key of the commit from which a restart from the mid-epoch checkpoint of ``config`` is exact (None: the
    base's already is)."""
    if not config["dispatch_batches"]:
        return 4204 if not config["iterable"] and config["num_workers"] else None
    if not config["iterable"]:
        return "shuffled-resume"
    if config["shared_folder"]:
        return "shared-checkpoint-folder"
    if (config["num_workers"] == 0) == config["split_batches"]:
        return "dispatcher-lookahead"
    return None


def before_first_batch_key(config):
    """The key of the commit from which a restart from the checkpoint before the first batch of ``config`` replays
    the epochs (None: the base's already does): the #4204 fix, for a shuffled loader with workers or a dispatcher."""
    shuffled = not config["iterable"]
    return 4204 if shuffled and (config["num_workers"] or config["dispatch_batches"]) else None


def params(key_of):
    """One param per configuration, marked ``regression`` with its key where it has one."""
    marked = []
    for name, config in RESUME_CONFIGS.items():
        key = key_of(config)
        marks = () if key is None else pytest.mark.regression("accelerate", key)
        marked.append(pytest.param(name, id=name, marks=marks))
    return marked


def ranks(launch_dir, name):
    return rank_results(launch_dir, 2, f"checkpointed-{name}")


@pytest.mark.parametrize("name", params(mid_epoch_key))
def test_restart_from_a_mid_epoch_checkpoint_reads_what_the_saving_run_read_next(launch_dir, name):
    """On every rank, the restart from the checkpoint after batch 2 reads the saving run's batches after it, and then
    the saving run's epoch 1."""
    for result in ranks(launch_dir, name):
        saved, restarted = result["saved"], result["step-2"]
        assert restarted[0] == saved[0][2:], (
            f"rank {result['rank']}: the restart reads {restarted[0]} in epoch 0, the saving run read {saved[0][2:]} "
            "after its checkpoint"
        )
        assert restarted[1] == saved[1], (
            f"rank {result['rank']}: the restart's epoch 1 is {restarted[1]}, the saving run's {saved[1]}"
        )


@pytest.mark.parametrize("name", params(before_first_batch_key))
def test_restart_from_a_checkpoint_before_the_first_batch_replays_the_epochs(launch_dir, name):
    """On every rank, the restart from the checkpoint before the first batch reads the saving run's two epochs."""
    for result in ranks(launch_dir, name):
        assert result["step-0"] == result["saved"], (
            f"rank {result['rank']}: the restart reads {result['step-0']}, the saving run read {result['saved']}"
        )


ACROSS_VERSIONS = [
    pytest.param(f"dispatcher-state-across-versions-{config}", id=config) for config in ("split-nw0", "nw2")
]


@pytest.mark.regression("accelerate", "dispatcher-lookahead")
@pytest.mark.parametrize("scenario", ACROSS_VERSIONS)
def test_release_resumes_a_dispatcher_state_of_the_series_at_the_next_step(launch_dir, scenario):
    """What the commit message says: 1.16.0 loading a dispatcher's state saved with the series (the same format,
    recorded at the steps yielded) reads what the saving dispatcher read next, on every rank; with ``split_batches``
    and with workers, where 1.16.0's own state is off by a batch."""
    for result in rank_results(launch_dir, 2, scenario):
        assert result["series-into-release"] == result["series-rest"], (
            f"rank {result['rank']}: the release reads {result['series-into-release']} from the series' state, the "
            f"saving dispatcher read {result['series-rest']}"
        )


@pytest.mark.parametrize("scenario", ACROSS_VERSIONS)
def test_a_dispatcher_state_of_the_release_loads_in_the_series_as_in_the_release(launch_dir, scenario):
    """A dispatcher's state saved by 1.16.0 (corrected for the look-ahead when it was saved) loads in the series as
    in 1.16.0: the same batches, on every rank."""
    for result in rank_results(launch_dir, 2, scenario):
        assert result["release-into-series"] == result["release-into-release"], (
            f"rank {result['rank']}: the series reads {result['release-into-series']} from the release's state, the "
            f"release {result['release-into-release']}"
        )
