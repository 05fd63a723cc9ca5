"""The DeepSpeed follow-up "cluster-files" (a commit of the series, ``docs/issues/cluster-files.md``): a restart
from any checkpoint a job kept, after the job went on past cluster reshuffles, reads what the uninterrupted run read.

Upstream file: deepspeed/runtime/data_pipeline/data_sampling/data_sampler.py (DeepSpeed 0.19.8). The checkpoint names
each difficulty cluster's file under ``data_cluster_path`` and a position in it, and ``reshuffle_clusters()`` (lines
240-250) writes the reshuffled cluster over that file: a restart from a checkpoint older than the last reshuffle reads
a later permutation from the checkpoint's position. Tests marked ``regression("deepspeed", "cluster-files")`` fail on
the base plus the first two commits (consumed-samples, the #8787 fix) and pass with the third: restarts from every kept
checkpoint in any order, on every data-parallel rank; a checkpoint whose cluster file was rewritten since (by a run
with another global batch size, by a restore to the release and back) or deleted either resumes exactly or fails at
load with one line that names the file and what to do. The guards (pass on both) hold the fix to what the release does:
the files under ``data_cluster_path`` and the state do not grow with the run; the release's checkpoints load and go on
as the release goes on; the release loads the series' checkpoints and reads the cluster file from the saved position.
"""

import collections
import copy
import os
import pickle
import shutil

import numpy as np
import pytest
from deepspeed.runtime.data_pipeline.data_sampling.data_sampler import DeepSpeedDataSampler
from deepspeed.runtime.data_pipeline.data_sampling.utils import close_mmap_dataset_builder, create_mmap_dataset_builder

from tests.deepspeed.sampling import (
    cluster_files,
    first_divergence,
    make_sampler,
    pristine_sampler_class,
    take,
    take_until_second_reshuffle,
    through_checkpoint,
)
from tests.deepspeed.scenarios import ONE_EPOCH, SCENARIOS, SEVERAL_CLUSTERS, SINGLE_CLUSTER

pytestmark = pytest.mark.usefixtures("stub_collectives")

PASSES = 5  # a run of 5 passes over the dataset: past 4 reshuffles of a single cluster, more of several
NUM_BATCHES = PASSES * ONE_EPOCH // 4  # micro-batches of 4 on one rank
SAVE_EVERY = 3  # the run saves a checkpoint every 3 micro-batches


def died_run(tmp_path, metric, **kwargs):
    """A run that saves a checkpoint every ``SAVE_EVERY`` micro-batches (through ``torch.save`` / ``torch.load``,
    weights only) and dies after ``NUM_BATCHES``: its batches and its checkpoints by the batches before them."""
    sampler = make_sampler(tmp_path, "run", metric, **kwargs)
    batches, checkpoints = [], {}
    while len(batches) < NUM_BATCHES:
        checkpoints[len(batches)] = through_checkpoint(sampler.state_dict(), weights_only=True)
        batches += take(sampler, SAVE_EVERY)
    return batches, checkpoints


def restart(tmp_path, metric, checkpoint, count, run="run", **kwargs):
    """A new sampler on the ``data_cluster_path`` of ``run`` that loads ``checkpoint`` and yields ``count`` batches.

    It loads a copy: 0.19.8's sampler counts on in the lists and dicts it loaded."""
    sampler = make_sampler(tmp_path, run, metric, **kwargs)
    sampler.load_state_dict(copy.deepcopy(checkpoint))
    return take(sampler, count)


def restart_or_refusal(tmp_path, metric, checkpoint, count, **kwargs):
    """``restart()``'s batches, or the one-line message of the error with which the load refuses the checkpoint."""
    try:
        return restart(tmp_path, metric, checkpoint, count, **kwargs)
    except (FileNotFoundError, RuntimeError) as error:
        return str(error)


def assert_names_a_cluster_file_and_what_to_do(message, directory):
    assert "\n" not in message, f"the error is more than one line: {message!r}"
    assert str(directory) in message, f"the error names no file under {directory}: {message!r}"
    assert "restore" in message, f"the error does not say what to do: {message!r}"


@pytest.mark.regression("deepspeed", "cluster-files")
@pytest.mark.parametrize(
    ("scenario", "dp_rank", "dp_size", "micro_batch_size"),
    [
        pytest.param("single_cluster", 0, 1, 4, id="single_cluster"),
        pytest.param("several_clusters", 0, 1, 4, id="several_clusters"),
        pytest.param("several_clusters", 1, 3, 2, id="several_clusters-rank1of3"),
        pytest.param("several_clusters", 2, 3, 2, id="several_clusters-rank2of3"),
    ],
)
def test_restart_from_any_checkpoint_matches_uninterrupted_run(tmp_path, scenario, dp_rank, dp_size, micro_batch_size):
    """The run died after several reshuffles; the job restarts from its last checkpoint, then the user goes back to
    each older one in turn, then to the last again (every restart trains on with the same ``data_cluster_path``)."""
    metric = SCENARIOS[scenario]
    kwargs = {"dp_rank": dp_rank, "dp_size": dp_size, "micro_batch_size": micro_batch_size}
    expected = take(make_sampler(tmp_path, "uninterrupted", metric, **kwargs), NUM_BATCHES)
    batches, checkpoints = died_run(tmp_path, metric, **kwargs)
    assert batches[:NUM_BATCHES] == expected, "the run differs from the uninterrupted run before it died"
    diverged = []
    for saved_at in [*sorted(checkpoints, reverse=True), max(checkpoints)]:
        after = restart(tmp_path, metric, checkpoints[saved_at], NUM_BATCHES - saved_at, **kwargs)
        index = first_divergence(expected[saved_at:], after)
        if index is not None:
            diverged.append((saved_at, saved_at + index))
    assert not diverged, f"(restarted after batch, first batch that differs from the uninterrupted run): {diverged}"


@pytest.mark.regression("deepspeed", "cluster-files")
def test_restart_after_a_run_with_another_global_batch_size_is_exact_or_refused(tmp_path):
    """The user restarts from an early checkpoint with another gradient accumulation (another global batch size)
    on the same ``data_cluster_path``; that run builds the later clusters again, from its own random stream. Then
    the user goes back to the first run's checkpoints: each resumes exactly or is refused at load, naming the file."""
    metric = SEVERAL_CLUSTERS
    expected = take(make_sampler(tmp_path, "uninterrupted", metric), NUM_BATCHES)
    batches, checkpoints = died_run(tmp_path, metric)
    other = make_sampler(tmp_path, "run", metric, gradient_accumulation_steps=3)
    other.load_state_dict(checkpoints[0])
    take(other, NUM_BATCHES)
    outcomes = {  # the newest first: a restart from a checkpoint older than a cluster builds it again, as it was
        saved_at: restart_or_refusal(tmp_path, metric, checkpoints[saved_at], NUM_BATCHES - saved_at)
        for saved_at in sorted(checkpoints, reverse=True)
    }
    refused = {saved_at: message for saved_at, message in outcomes.items() if isinstance(message, str)}
    for message in refused.values():
        assert_names_a_cluster_file_and_what_to_do(message, tmp_path / "run")
    wrong = [
        saved_at for saved_at, after in outcomes.items() if saved_at not in refused and after != expected[saved_at:]
    ]
    assert not wrong, f"the checkpoints saved after batches {wrong} resume with other batches, silently"
    assert refused, "no checkpoint was refused: the other run rebuilt no cluster differently (the test tests nothing)"


def rewrite_with_another_permutation(path):
    builder = create_mmap_dataset_builder(path, np.uint8)
    builder.add_item_numpy(np.random.default_rng(1).permutation(ONE_EPOCH))
    close_mmap_dataset_builder(builder, path)


@pytest.mark.regression("deepspeed", "cluster-files")
@pytest.mark.parametrize("change", ["rewritten", "bin_deleted", "idx_deleted"])
def test_checkpoint_whose_cluster_file_changed_is_refused_at_load(tmp_path, change):
    sampler = make_sampler(tmp_path, "run", SINGLE_CLUSTER)
    take(sampler, 5)
    checkpoint = through_checkpoint(sampler.state_dict(), weights_only=True)
    path = str(tmp_path / "run" / checkpoint["data_cluster_paths"][0])
    if change == "rewritten":
        rewrite_with_another_permutation(path)
    else:
        os.remove(f"{path}.{change.split('_')[0]}")
    outcome = restart_or_refusal(tmp_path, SINGLE_CLUSTER, checkpoint, 1)
    assert isinstance(outcome, str), f"a checkpoint whose cluster file was {change} loads, silently"
    assert_names_a_cluster_file_and_what_to_do(outcome, path)


@pytest.mark.regression("deepspeed", "cluster-files")
def test_a_restore_to_the_release_and_back_never_reads_other_samples_silently(tmp_path):
    """The job is restored to 0.19.8 (from the series' last checkpoint) and trains past a reshuffle, which rewrites
    the cluster file; back on the series, every checkpoint of the series resumes exactly or is refused at load."""
    metric = SINGLE_CLUSTER
    expected = take(make_sampler(tmp_path, "uninterrupted", metric), NUM_BATCHES)
    batches, checkpoints = died_run(tmp_path, metric)
    release = make_sampler(tmp_path, "run", metric, sampler_class=pristine_sampler_class(tmp_path))
    release.load_state_dict(copy.deepcopy(checkpoints[max(checkpoints)]))
    take(release, 2 * ONE_EPOCH // 4)  # two passes: at least one reshuffle
    wrong = []
    for saved_at in sorted(checkpoints, reverse=True):
        outcome = restart_or_refusal(tmp_path, metric, checkpoints[saved_at], NUM_BATCHES - saved_at)
        if isinstance(outcome, str):
            assert_names_a_cluster_file_and_what_to_do(outcome, tmp_path / "run")
        elif outcome != expected[saved_at:]:
            wrong.append(saved_at)
    assert not wrong, f"after 0.19.8 ran, the checkpoints saved after batches {wrong} resume with other batches"


@pytest.mark.regression("deepspeed", "cluster-files")
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_an_upgrade_from_the_release_keeps_its_checkpoints_checked(tmp_path, scenario):
    """The job began on 0.19.8 and was upgraded to the series from a checkpoint of 0.19.8 (which holds no checksums),
    saved a checkpoint of the series, and was then restored to 0.19.8 from it, whose reshuffles rewrite the cluster
    files; back on the series, that checkpoint resumes as the series went on from it, or is refused at load."""
    metric, release_class = SCENARIOS[scenario], pristine_sampler_class(tmp_path)
    release = make_sampler(tmp_path, "run", metric, sampler_class=release_class)
    take(release, 5)
    upgraded = make_sampler(tmp_path, "run", metric)
    upgraded.load_state_dict(through_checkpoint(release.state_dict()))
    take(upgraded, ONE_EPOCH // 4)
    checkpoint = through_checkpoint(upgraded.state_dict(), weights_only=True)
    expected = take(upgraded, NUM_BATCHES)
    restored = make_sampler(tmp_path, "run", metric, sampler_class=release_class)
    restored.load_state_dict(copy.deepcopy(checkpoint))
    take(restored, 2 * ONE_EPOCH // 4)  # two passes: at least one reshuffle of every cluster then built
    outcome = restart_or_refusal(tmp_path, metric, checkpoint, NUM_BATCHES)
    if isinstance(outcome, str):
        assert_names_a_cluster_file_and_what_to_do(outcome, tmp_path / "run")
    else:
        index = first_divergence(expected, outcome)
        assert index is None, f"after 0.19.8 ran, the checkpoint resumes with other batches from batch {index}"


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_cluster_files_do_not_grow_with_the_run(tmp_path, scenario):
    """The files under ``data_cluster_path`` after two passes (every cluster built and reshuffled) and after ten: the
    cluster files (``.bin``, ``.idx``) those of the release, with the same names and sizes; besides them the series
    keeps at most one cache per cluster (``.npy``: a reshuffled cluster's sample ids and a header), of the same sizes
    after two and ten passes (the release keeps none)."""
    files, caches = {}, {}
    for label, sampler_class in (("release", pristine_sampler_class(tmp_path)), ("installed", None)):
        kwargs = {"sampler_class": sampler_class} if sampler_class else {}
        sampler = make_sampler(tmp_path, label, SCENARIOS[scenario], **kwargs)
        iterator = iter(sampler)
        for passes in (2, 10):
            while sampler.consumed_samples < passes * ONE_EPOCH:
                next(iterator)
            found = cluster_files(tmp_path / label)
            files[label, passes] = {name: len(data) for name, data in found.items() if not name.endswith(".npy")}
            caches[label, passes] = sorted(len(data) for name, data in found.items() if name.endswith(".npy"))
    assert files["installed", 10] == files["installed", 2], f"files after 2 and 10 passes: {files}"
    assert files["installed", 10] == files["release", 10], f"the files differ from the release's: {files}"
    assert caches["installed", 10] == caches["installed", 2], f"caches after 2 and 10 passes: {caches}"
    clusters = len([name for name in files["installed", 10] if name.endswith(".bin")])
    assert len(caches["installed", 10]) <= clusters, f"{clusters} clusters, caches {caches['installed', 10]}"


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_state_does_not_grow_with_the_run(tmp_path, scenario):
    """The checkpoint holds what a restart needs in bytes per cluster: its size after 10 passes is its size after 3
    (every cluster built and reshuffled; within a few bytes: Python ints grow with their value)."""
    sampler = make_sampler(tmp_path, "run", SCENARIOS[scenario])
    iterator, sizes = iter(sampler), {}
    for passes in (3, 10):
        while sampler.consumed_samples < passes * ONE_EPOCH:
            next(iterator)
        # Without numpy's global RandomState (624 words whatever the sampler does) and the rest of the current global
        # batch (up to a global batch of sample ids, as in 0.19.8)
        state = {k: v for k, v in sampler.state_dict().items() if k not in ("np_rng_state", "batch")}
        sizes[passes] = len(pickle.dumps(state))
    assert abs(sizes[10] - sizes[3]) <= 16, f"state bytes after 3 and 10 passes: {sizes}"


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_release_checkpoint_goes_on_as_the_release_goes_on(tmp_path, scenario):
    """A checkpoint of 0.19.8 saved after a reshuffle (its cluster file rewritten, as 0.19.8 does): the series reads
    what 0.19.8 itself reads after loading it, past the series' first reshuffle after the load (up to its second
    reshuffle of a cluster, see ``take_until_second_reshuffle``). Both restart the sampler's generator from the seed
    (0.19.8's checkpoint holds nothing of it)."""
    metric, release_class = SCENARIOS[scenario], pristine_sampler_class(tmp_path)
    writer = make_sampler(tmp_path, "run", metric, sampler_class=release_class)
    take(writer, ONE_EPOCH // 4 + 1)  # past the first reshuffle
    checkpoint = through_checkpoint(writer.state_dict())
    shutil.copytree(tmp_path / "run", tmp_path / "release")  # 0.19.8's reshuffles rewrite the files it reads
    expected = restart(tmp_path, metric, checkpoint, NUM_BATCHES, run="release", sampler_class=release_class)
    series = make_sampler(tmp_path, "run", metric)
    series.load_state_dict(copy.deepcopy(checkpoint))
    actual, reshuffled = take_until_second_reshuffle(series, NUM_BATCHES)
    assert reshuffled, "the batches compared include no reshuffle after the load"
    index = first_divergence(expected[: len(actual)], actual)
    assert index is None, f"batch {index} after the load differs from 0.19.8's: {actual[index]}, {expected[index]}"


def test_release_reads_a_series_checkpoint_from_the_saved_position(tmp_path):
    """0.19.8 loads a checkpoint of the series saved after a reshuffle and reads the cluster file's sample ids from the
    saved position (the series reads its own permutation of them): what a restore to the release does."""
    series = make_sampler(tmp_path, "run", SINGLE_CLUSTER)
    take(series, ONE_EPOCH // 4 + 3)  # past the first reshuffle, 12 samples into the second pass
    checkpoint = through_checkpoint(series.state_dict())
    pending = len(checkpoint["batch"]) // 4  # micro-batches left of the saved global batch
    position = checkpoint["data_cluster_current_position"][0]  # 0.19.8 then counts on in the loaded list itself
    release = make_sampler(tmp_path, "run", SINGLE_CLUSTER, sampler_class=pristine_sampler_class(tmp_path))
    release.load_state_dict(checkpoint)
    next_global_batch = sorted(i for batch in take(release, pending + 2)[pending:] for i in batch)
    file_ids = [int(i) for i in release.data_clusters[0][0][position : position + 8]]
    assert next_global_batch == sorted(file_ids), (
        f"0.19.8's next global batch {next_global_batch} is not the cluster file's ids {sorted(file_ids)} from the "
        f"saved position {position}"
    )


@pytest.mark.regression("deepspeed", "cluster-files")
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_a_sampler_that_ran_loads_a_checkpoint_as_a_new_one_does(tmp_path, scenario):
    """A job falls back to an older checkpoint in the same process (``engine.load_checkpoint()`` again, after its
    newest one turned out torn): the sampler, which holds clusters already, replaces them with the checkpoint's."""
    metric = SCENARIOS[scenario]
    expected = take(make_sampler(tmp_path, "uninterrupted", metric), NUM_BATCHES)
    batches, checkpoints = died_run(tmp_path, metric)
    sampler = make_sampler(tmp_path, "run", metric)
    sampler.load_state_dict(copy.deepcopy(checkpoints[max(checkpoints)]))
    take(sampler, 4)
    saved_at = sorted(checkpoints)[len(checkpoints) // 2]
    sampler.load_state_dict(copy.deepcopy(checkpoints[saved_at]))
    try:
        after = take(sampler, NUM_BATCHES - saved_at)
    except IndexError as error:  # 0.19.8 appends the checkpoint's clusters to those it holds
        raise AssertionError(f"after the second load the sampler holds other clusters: {error!r}") from error
    index = first_divergence(expected[saved_at:], after)
    assert index is None, f"after loading the checkpoint of batch {saved_at}, batch {saved_at + index} differs"


class FillingSampler(DeepSpeedDataSampler):
    """``get_sample_from_cluster()`` as the open PR #8520 describes it: a request larger than what is left of a
    cluster draws and reshuffles until it is filled, so one request can reshuffle a cluster several times."""

    def get_sample_from_cluster(self, cidx, num_samples):
        samples = []
        while len(samples) < num_samples:
            start = self.data_cluster_current_position[cidx]
            taken = [int(i) for i in self.data_clusters[cidx][0][start : start + num_samples - len(samples)]]
            samples += taken
            self.data_cluster_current_position[cidx] = start + len(taken)
            if len(samples) < num_samples:
                self.reshuffle_clusters(cidx)
                self.data_cluster_current_position[cidx] = 0
        return samples


@pytest.mark.regression("deepspeed", "cluster-files")
def test_restart_is_exact_when_a_request_reshuffles_a_cluster_several_times(tmp_path):
    """With #8520's loop and global batches of 32 from clusters of 12 and 24 samples, one request reshuffles a
    cluster twice or more: the state holds the generator's state of the last reshuffle, all that its permutation
    needs."""
    kwargs = {"micro_batch_size": 16, "sampler_class": FillingSampler}
    uninterrupted, reshuffles = make_sampler(tmp_path, "uninterrupted", SEVERAL_CLUSTERS, **kwargs), []

    def counting_reshuffle(cidx):
        reshuffles.append((uninterrupted.curriculum_step, cidx))
        FillingSampler.reshuffle_clusters(uninterrupted, cidx)

    uninterrupted.reshuffle_clusters = (
        counting_reshuffle  # an instance attribute: the sampler calls self.reshuffle_...
    )
    expected = take(uninterrupted, 40)
    assert max(collections.Counter(reshuffles).values()) >= 2, f"no request reshuffled a cluster twice: {reshuffles}"
    batches, checkpoints = [], {}
    sampler = make_sampler(tmp_path, "run", SEVERAL_CLUSTERS, **kwargs)
    while len(batches) < 40:
        checkpoints[len(batches)] = through_checkpoint(sampler.state_dict(), weights_only=True)
        batches += take(sampler, 3)
    diverged = []
    for saved_at in sorted(checkpoints, reverse=True):
        after = restart(tmp_path, SEVERAL_CLUSTERS, checkpoints[saved_at], 40 - saved_at, **kwargs)
        if after != expected[saved_at:40]:
            diverged.append(saved_at)
    assert not diverged, f"restarts from the checkpoints saved after batches {diverged} differ"
