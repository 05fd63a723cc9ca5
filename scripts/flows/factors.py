"""The flow table's factors: the ways a training job saves and restarts, per upstream, and which flows are run.

A flow is one training job that saves and restarts, named by one level of each factor of its upstream (a dict of
factor name to level, all strings). ``pairwise(name, kind)`` is the fixed covering array ``make test`` runs: every
pair of levels of two factors that can go together is in at least one flow (covertable's greedy algorithm,
deterministic); ``covering(name, kind, 3)`` holds every triple of levels (``make flows FULL=1``; every combination,
``full``, is 422,856 Accelerate resume flows). Combinations that do not exist are left out by rules, each with the
reason it cannot happen.

Each upstream has two kinds of flow: ``resume`` flows save and restart; ``order`` flows (reproducibility) run one
job uninterrupted and compare its order with a reference job the release already reads the same way.
"""

import hashlib
import itertools

import covertable

# Accelerate (2-process Gloo). Levels are words a reader of the report understands: FACTOR_WORDS says more.
ACCELERATE_RESUME = {
    "saver": ["own-folder", "shared-0-last", "shared-1-last", "main-only", "torch-save", "dcp"],
    "data": ["shuffled", "sequential", "iterable-generator", "iterable-iterator", "python-random-batches",
             "generator-batches", "weighted", "stateful-dataset"],
    "loader": ["shard", "dispatcher", "split-batches", "seedable", "skip-first-batches"],
    "processes": ["2-2", "2-1", "1-2", "2-4", "1-1"],
    "when": ["first-batch", "mid-epoch", "epoch-end"],
    "epoch": ["0", "1", "2"],
    "workers": ["0", "2", "2-persistent"],
    "seeding": ["one-seed", "per-process", "none", "own-generator"],
    "training": ["no-rng", "dropout"],
    "probe": ["none", "state-dict-first"],
    "versions": ["series", "rollback", "upgrade"],
}
ACCELERATE_ORDER = {
    "data": ["shuffled", "weighted", "iterable-generator", "python-random-batches"],
    "loader": ["shard", "dispatcher", "seedable"],
    "processes": ["1", "2"],
    "workers": ["0", "2"],
    "seeding": ["one-seed", "per-process", "own-generator"],
}
# Flows every selection holds first (the covering array is completed around them): the failing inputs handed to the
# project (named cNN) and the flows the issues name, in the table's words; the factors they leave out are chosen by
# the covering array.
_C46 = {"saver": "main-only", "data": "shuffled", "loader": "shard", "processes": "2-2", "when": "mid-epoch",
        "epoch": "0", "seeding": "one-seed", "probe": "none", "versions": "series"}
ACCELERATE_RESUME_PRESETS = [
    {**_C46, "workers": "0"},  # c46: save_state() on the main process only, load_state() on every process
    {**_C46, "workers": "2"},
    {**_C46, "saver": "shared-1-last", "processes": "2-4", "workers": "0"},  # saved by 2 processes, loaded by 4
    {**_C46, "saver": "shared-1-last", "workers": "0", "versions": "rollback"},  # saved by the series, loaded by 1.16
    {**_C46, "saver": "own-folder", "data": "iterable-iterator", "loader": "dispatcher", "when": "first-batch",
     "workers": "2"},  # an IterableDataset whose __iter__ returns an iterator, a step-0 save_state()
    {**_C46, "processes": "1-1", "when": "epoch-end", "workers": "0", "training": "dropout"},  # c50: epoch_0
    {**_C46, "processes": "1-1", "epoch": "1", "workers": "2", "training": "dropout"},  # c50: step_8, in epoch 1
    {**_C46, "saver": "torch-save", "workers": "2", "probe": "state-dict-first"},  # c11: state_dict() before the load
    {**_C46, "saver": "dcp", "workers": "2"},  # c41: torch.distributed.checkpoint into a fresh loader
    {**_C46, "saver": "own-folder", "data": "python-random-batches", "when": "first-batch", "workers": "2"},  # c30
    {**_C46, "saver": "torch-save", "data": "stateful-dataset", "processes": "1-1", "when": "first-batch",
     "workers": "0"},  # issue 40, item 2: a stateful dataset's state saved before the first batch
    {**_C46, "saver": "torch-save", "data": "stateful-dataset", "processes": "1-1", "when": "first-batch",
     "workers": "2"},
    # issue 40: a sampler with effects of its own, run by a state_dict() before the first batch
    {**_C46, "saver": "own-folder", "data": "generator-batches", "when": "first-batch", "workers": "2"},
    # issue 49, item 6: the shuffle seed of one process through torch.distributed.checkpoint into a fresh loader
    {**_C46, "saver": "dcp", "processes": "1-1", "epoch": "1", "workers": "0", "training": "dropout"},
]
ACCELERATE_ORDER_PRESETS = [
    {"data": "shuffled", "loader": "shard", "processes": "1", "workers": "0", "seeding": "one-seed"},  # one seed
    {"data": "shuffled", "loader": "shard", "processes": "1", "workers": "2", "seeding": "own-generator"},  # c25
]

# What each level means, per upstream, factor and level: the one place the reports (build/flows/, build/histories/)
# take their glossary from; it also holds the levels of the history search's configurations (scripts/histories/).
FACTOR_WORDS = {"accelerate": {
    "saver": {
        "own-folder": "every process save_state()s into a folder of its own",
        "shared-0-last": "every process save_state()s into one folder, process 0 last",
        "shared-1-last": "every process save_state()s into one folder, process 1 last",
        "main-only": "only the main process save_state()s (as diffusers' scripts do)",
        "torch-save": "every process torch.save()s the loader's state_dict() into a file of its own",
        "dcp": "torch.distributed.checkpoint of the loader's state_dict(), loaded in place",
    },
    "data": {
        "shuffled": "map-style, shuffle=True",
        "sequential": "map-style, shuffle=False",
        "iterable-generator": "IterableDataset whose __iter__ is a generator, shuffled per worker",
        "iterable-iterator": "IterableDataset whose __iter__ returns an iterator, shuffled per worker",
        "python-random-batches": "a batch_sampler shuffling with Python's random",
        "generator-batches": "a batch_sampler shuffling with a torch.Generator of its own, seeded once",
        "weighted": "WeightedRandomSampler (no replacement)",
        "stateful-dataset": "map-style, shuffle=True, a dataset with state_dict()/load_state_dict() (an offset the "
                            "saving job set; the restarted job builds it afresh)",
        "epoch-tagged": "map-style, shuffle=True, each sample read with the epoch set_epoch() gave the dataset "
                        "(as augmentations by epoch are)",
        "level-tagged": "map-style, shuffle=True, each sample read with a curriculum level registered with "
                        "register_for_checkpointing()",
        "own-random-batches": "a batch_sampler shuffling with a random.Random it holds (as aspect-ratio bucket "
                              "samplers do)",
    },
    "loader": {
        "shard": "DataLoaderShard",
        "dispatcher": "DataLoaderDispatcher (dispatch_batches=True)",
        "split-batches": "split_batches=True",
        "seedable": "use_seedable_sampler=True",
        "skip-first-batches": "no stateful loader: load_state() then skip_first_batches()",
    },
    "processes": {
        "2-2": "2 processes save, 2 load",
        "2-1": "2 processes save, 1 loads",
        "1-2": "1 process saves, 2 load",
        "2-4": "2 processes save, 4 load",
        "1-1": "1 process saves, 1 loads",
        "1": "one process",
        "2": "two processes (Gloo)",
    },
    "when": {
        "first-batch": "the checkpoint before the first batch of the epoch",
        "mid-epoch": "the checkpoint halfway through the epoch",
        "epoch-end": "the checkpoint after the last batch of the epoch",
    },
    "epoch": {"0": "the checkpoint in the first epoch", "1": "in the second epoch", "2": "in the third epoch"},
    "workers": {"0": "num_workers=0", "2": "num_workers=2", "2-persistent": "num_workers=2, persistent_workers=True"},
    "seeding": {
        "one-seed": "set_seed(1234) on every process",
        "per-process": "set_seed(1000 + rank): another seed on each process",
        "none": "nothing seeded: each process starts from a random state of its own (fixed here per process, so "
                "that runs repeat)",
        "own-generator": "set_seed(1234) and DataLoader(generator=a seeded torch.Generator)",
    },
    "naming": {"folders": "save_state(folder) into the folders the job names",
               "automatic": "ProjectConfiguration(automatic_checkpoint_naming=True, total_limit=2): save_state() "
                            "names its folders (the iteration set by the job after a restart) and keeps the newest 2, "
                            "load_state() finds the newest"},
    "training": {"no-rng": "a training step draws nothing from torch's RNG",
                 "dropout": "every step draws from torch's RNG"},
    "probe": {"none": "the restarted job loads at once",
              "state-dict-first": "the restarted job asks the loader for its state_dict() before loading"},
    "versions": {"series": "the stack saves and the stack loads", "rollback": "the stack saves, the release loads",
                 "upgrade": "the release saves, the stack loads"},
}}


def _counts(flow):
    saves, _, loads = flow["processes"].partition("-")
    return saves, loads or saves


# What cannot happen, per kind: (the factors a rule reads, the rule: True for a flow that cannot happen, why).
ACCELERATE_RESUME_IMPOSSIBLE = [
    (("saver", "processes"),
     lambda f: f["saver"] in ("own-folder", "torch-save", "dcp") and len(set(_counts(f))) > 1,
     "a file or folder of each process is loaded by as many processes as saved it"),
    (("saver", "processes"), lambda f: f["saver"].startswith("shared-") and _counts(f)[0] == "1",
     "two writers into one folder need two processes at save"),
    (("saver", "loader"), lambda f: f["saver"] in ("dcp", "torch-save") and f["loader"] == "skip-first-batches",
     "skip_first_batches is the resume of a save_state() without a stateful loader"),
    (("probe", "loader"), lambda f: f["probe"] != "none" and f["loader"] == "skip-first-batches",
     "a loader that is not stateful has no state_dict()"),
    (("loader", "data"), lambda f: f["loader"] == "seedable" and f["data"] != "shuffled",
     "use_seedable_sampler replaces a RandomSampler: only a shuffled map-style loader has one"),
    (("when", "epoch"), lambda f: f["when"] == "first-batch" and f["epoch"] != "0",
     "a checkpoint before the first batch of epoch e > 0 is the checkpoint at the end of epoch e - 1"),
    (("seeding", "data"),
     lambda f: f["seeding"] == "own-generator" and f["data"] not in ("shuffled", "sequential", "weighted",
                                                                      "stateful-dataset"),
     "a DataLoader's generator= is drawn from by its sampler; other data draw from the global RNG"),
]
ACCELERATE_ORDER_IMPOSSIBLE = [ACCELERATE_RESUME_IMPOSSIBLE[4], ACCELERATE_RESUME_IMPOSSIBLE[6]]

UPSTREAMS = {
    ("accelerate", "resume"): (ACCELERATE_RESUME, ACCELERATE_RESUME_IMPOSSIBLE, ACCELERATE_RESUME_PRESETS),
    ("accelerate", "order"): (ACCELERATE_ORDER, ACCELERATE_ORDER_IMPOSSIBLE, ACCELERATE_ORDER_PRESETS),
}


def register(upstream: str, kind: str, factors: dict, impossible: list[tuple], presets: list[dict]) -> None:
    """Add the factors of one kind of flow of an upstream, its rules of what cannot happen and its preset flows (as
    above)."""
    UPSTREAMS[(upstream, kind)] = (factors, impossible, presets)


def possible(upstream: str, kind: str, flow: dict) -> bool:
    """False for a flow that one of its kind's rules says cannot happen."""
    return not any(rule(flow) for _, rule, _ in UPSTREAMS[(upstream, kind)][1])


def flow_id(upstream: str, kind: str, flow: dict) -> str:
    """A short name of a flow that depends only on its factors: ``<upstream>-<kind>-<sha1 of the factors, 8 hex>``."""
    text = " ".join(f"{k}={flow[k]}" for k in sorted(flow))
    return f"{upstream}-{kind}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"


def _named(upstream: str, kind: str, combos, names) -> list[dict]:
    flows = [dict(zip(names, combo, strict=True)) for combo in combos]
    return [{"id": flow_id(upstream, kind, flow), "upstream": upstream, "kind": kind, "factors": flow}
            for flow in flows]


def covering(upstream: str, kind: str, strength: int = 2) -> list[dict]:
    """The covering array of one kind of flow: every possible combination of ``strength`` levels (of as many factors)
    in at least one flow, in a fixed order, the kind's presets first; ``strength=2`` is the pairwise set ``make test``
    runs.

    Returns a list of ``{"id", "upstream", "kind", "factors"}``. covertable builds it greedily with its ``hash``
    sorter (no randomness: the same factors give the same flows) under the kind's rules, and raises when a
    combination that can happen is left uncovered.
    """
    factors, impossible, presets = UPSTREAMS[(upstream, kind)]
    constraints = [{"operator": "fn", "requires": list(keys), "evaluate": lambda row, rule=rule: not rule(row)}
                   for keys, rule, _ in impossible]
    rows = covertable.make(factors, strength=strength, constraints=constraints, presets=presets)
    names = list(factors)
    return _named(upstream, kind, [[row[n] for n in names] for row in rows], names)


def pairwise(upstream: str, kind: str) -> list[dict]:
    """The pairwise covering array of one kind of flow (``covering`` with strength 2)."""
    return covering(upstream, kind, 2)


def full(upstream: str, kind: str) -> list[dict]:
    """Every possible combination of one kind of flow's levels (``make flows FULL=1``)."""
    factors = UPSTREAMS[(upstream, kind)][0]
    names = list(factors)
    combos = [c for c in itertools.product(*factors.values())
              if possible(upstream, kind, dict(zip(names, c, strict=True)))]
    return _named(upstream, kind, combos, names)


def uncovered_pairs(upstream: str, kind: str, flows: list[dict]) -> list[tuple]:
    """The pairs of levels that can go together (some possible flow holds them) but no flow of ``flows`` holds."""
    wanted, held = set(), set()
    for source, into in ((full(upstream, kind), wanted), (flows, held)):
        for flow in source:
            items = sorted(flow["factors"].items())
            into.update(itertools.combinations(items, 2))
    return sorted(wanted - held)


# DeepSpeed (curriculum data sampling, DeepSpeedDataSampler; 1 or 2 Gloo ranks): tests/flows/deepspeed_job.py runs
# them. A job checkpoints at optimizer step k, dies at step m > k and restarts from its checkpoint (issue 39).
DEEPSPEED_RESUME = {
    "ranks": ["1", "2"],
    "parallel": ["data", "tensor", "tensor-each", "pipeline"],
    "workers": ["0", "2"],
    "clusters": ["single", "schedule", "two-metrics", "shared-path"],
    "checkpoint": ["early", "late"],
    "path": ["sampler", "weights-only", "engine", "iterator-first", "module-only", "no-optimizer", "epoch-loop"],
    "keep": ["all", "last-2"],
    "versions": ["series", "rollback", "upgrade"],
}
DEEPSPEED_ORDER = {
    "ranks": ["1", "2"],
    "parallel": ["data", "tensor", "tensor-each", "pipeline"],
    "workers": ["0", "2"],
    "clusters": ["single", "schedule", "two-metrics"],
}
FACTOR_WORDS["deepspeed"] = {
    "ranks": {"1": "one rank", "2": "two ranks (Gloo processes), at save and at load"},
    "parallel": {
        "data": "the ranks are data-parallel",
        "tensor": "an mpu of tensor-parallel size 2 (data-parallel groups {0} and {1}), the loader on both ranks; "
                  "rank 0 reads it and broadcasts each micro-batch to rank 1 (Megatron's broadcast_data)",
        "tensor-each": "the same mpu, each rank reads its own loader",
        "pipeline": "a 2-stage PipelineModule (its grid: data-parallel groups {0} and {1}), engine.train_batch()",
    },
    "workers": {"0": "data_sampling.num_workers 0", "2": "data_sampling.num_workers 2 (the DataLoader prefetches)"},
    "clusters": {
        "single": "clustering_type single_cluster: one cluster of every sample",
        "schedule": "schedule_based percentile clusters: 16 samples, 8 more at step 4, the last 8 at step 7",
        "two-metrics": "two schedule_based metrics: clusters of the samples both allow, added over time",
        "shared-path": "value-based clusters (fixed_linear, difficulty_step 8) in a data_cluster_path where another "
                       "experiment (difficulty_step 16) left cluster files of the names of the steps that add no "
                       "samples here; the uninterrupted run has a path of its own",
    },
    "checkpoint": {
        "early": "the checkpoint before the first cluster reshuffle, the crash 3 steps later, after one",
        "late": "the checkpoint after cluster reshuffles, the crash 3 steps later, after more",
    },
    "path": {
        "sampler": "the sampler's state_dict() in the user's own file (torch.load weights_only=False), "
                   "load_state_dict() into the new engine's sampler",
        "weights-only": "as sampler, read with torch.load's default, weights-only (Fast and Decoupled checkpoint "
                        "engines)",
        "engine": "engine.save_checkpoint() / load_checkpoint(), the iterator built after the load",
        "iterator-first": "as engine, RepeatingLoader(the engine's training_dataloader) built before "
                          "load_checkpoint() (as the pipeline engine does)",
        "module-only": "load_checkpoint(load_module_only=True): a fine-tune whose data starts again, as a fresh run",
        "no-optimizer": "load_checkpoint(load_optimizer_states=False)",
        "epoch-loop": "as engine; the training loop leaves the loader by break every 3 optimizer steps (an epoch) and "
                      "iterates it again, in the saving run and in the restart",
    },
    "keep": {
        "all": "every checkpoint kept; the restart loads the newest (the engine's latest)",
        "last-2": "one more checkpoint after k, all but the last 2 deleted; the restart falls back to the older one",
    },
    "versions": FACTOR_WORDS["accelerate"]["versions"],
    "processes": {"1": "one data-parallel rank (the history search's name for ranks)",
                  "2": "two data-parallel ranks (Gloo processes)"},
}
_ONE_RANK = (("ranks", "parallel"), lambda f: f["ranks"] == "1" and f["parallel"] != "data",
             "model parallelism of size 2 needs two ranks")
DEEPSPEED_RESUME_IMPOSSIBLE = [
    _ONE_RANK,
    (("path", "parallel"), lambda f: f["path"] == "epoch-loop" and f["parallel"] == "pipeline",
     "the pipeline engine reads its own RepeatingLoader: the job has no loop over the loader to leave"),
    (("path", "versions"), lambda f: f["path"] == "module-only" and f["versions"] != "series",
     "a module-only load reads the model's weights alone, which 0.19.8 and the series write alike, and its data "
     "starts again on the loading code: no sampler state crosses versions"),
]
DEEPSPEED_ORDER_IMPOSSIBLE = [_ONE_RANK]
_C55 = {"ranks": "1", "clusters": "single", "checkpoint": "early", "path": "iterator-first", "keep": "all",
        "versions": "series"}
DEEPSPEED_RESUME_PRESETS = [
    # c24: the sampler's state in a checkpoint that torch.load reads weights-only (its default since torch 2.6)
    {"ranks": "1", "workers": "0", "clusters": "single", "checkpoint": "early", "path": "weights-only", "keep": "all",
     "versions": "series"},
    {"ranks": "1", "workers": "0", "clusters": "single", "checkpoint": "early", "path": "weights-only", "keep": "all",
     "versions": "rollback"},  # c24 with 0.19.8 loading the series' state
    {**_C55, "workers": "0"},  # c55: the iterator built before load_checkpoint(), no io workers
    {**_C55, "workers": "2"},  # c55: ... with 2 io workers, which prefetch from the fresh state
    # #8787 through the engine, and a restart from the older of the last 2 checkpoints past reshuffles with workers
    {"ranks": "1", "workers": "0", "clusters": "single", "checkpoint": "late", "path": "engine", "keep": "all",
     "versions": "series"},
    {"ranks": "2", "workers": "2", "clusters": "schedule", "checkpoint": "late", "path": "engine", "keep": "last-2",
     "versions": "series"},
]
_C61 = {"ranks": "2", "workers": "0", "clusters": "single", "checkpoint": "early", "path": "engine", "keep": "all",
        "versions": "series"}
DEEPSPEED_RESUME_PRESETS += [
    # c61: model-parallel jobs, each rank a data-parallel group of its own
    {**_C61, "parallel": "tensor"},  # the loader on both tensor-parallel ranks, rank 0 reads and broadcasts
    {**_C61, "parallel": "tensor-each"},  # each tensor-parallel rank reads its own loader
    {**_C61, "parallel": "pipeline"},  # a 2-stage pipeline
]
DEEPSPEED_RESUME_PRESETS += [
    # issue 50, item 2: an experiment in a data_cluster_path another experiment used, restarted past reshuffles
    {"ranks": "1", "workers": "0", "clusters": "shared-path", "checkpoint": "late", "path": "engine", "keep": "all",
     "versions": "series"},
    {"ranks": "2", "workers": "2", "clusters": "shared-path", "checkpoint": "early", "path": "sampler",
     "keep": "last-2", "versions": "series"},
]
DEEPSPEED_RESUME_PRESETS += [
    # issue 50, item 4: an epoch loop left by break and iterated again, io workers
    {"ranks": "1", "workers": "2", "clusters": "single", "checkpoint": "late", "path": "epoch-loop", "keep": "all",
     "versions": "series"},
    {"ranks": "2", "workers": "2", "clusters": "schedule", "checkpoint": "early", "path": "epoch-loop",
     "keep": "last-2", "versions": "series"},
]
DEEPSPEED_ORDER_PRESETS = [{"ranks": "1", "workers": "0", "clusters": "single"}]
register("deepspeed", "resume", DEEPSPEED_RESUME, DEEPSPEED_RESUME_IMPOSSIBLE, DEEPSPEED_RESUME_PRESETS)
register("deepspeed", "release-order", DEEPSPEED_ORDER, DEEPSPEED_ORDER_IMPOSSIBLE, DEEPSPEED_ORDER_PRESETS)
