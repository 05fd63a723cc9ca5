"""``make bench`` items 1-3: what the two fixes cost, base and patched side by side.

1. Accelerate, one process, ``use_stateful_dataloader=True``, ``num_workers`` 0, 2, 6: wall time of
   ``accelerator.prepare(loader)`` and the worker processes alive right after it;
2. the same loaders: wall time of epoch 0, of prepare + epoch 0, and of epoch 1;
3. DeepSpeed's curriculum ``DeepSpeedDataSampler`` (``barrier``/``broadcast`` stubbed as no-ops): batches per
   second over ``--steps`` micro-batches, and ``state_dict()`` + ``load_state_dict()`` time.

Base and patched processes alternate (base first in even repetitions, patched first in odd ones); a ratio is the
median of the per-repetition ratios patched / base of adjacent processes, a figure the median over repetitions.
Which of these figures are targets, and how they are judged: scripts/bench/targets.py.
"""

import argparse

from scripts.bench.common import SIDES, Side, compare, cut_short, fmt, ratio_cell, run_child, side_order

NUM_WORKERS = (0, 2, 6)
DS_SCENARIOS = ("single_cluster", "several_clusters")


def repeated_runs(args: argparse.Namespace, sides: dict[str, Side], upstream: str, params: dict) -> dict:
    """{side: [one child's result per repetition]}: ``args.repeat`` repetitions of ``upstream``'s child on each side,
    the sides' order alternating; on Ctrl-C, what was measured so far (``cut_short``)."""
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    try:
        for repetition in range(args.repeat):
            for name in side_order(repetition):
                log = args.out / "logs" / f"{upstream}-{name}-{repetition}"
                runs[name].append(run_child(args, sides[name], upstream, params, log))
            print(f"bench: {upstream} repetition {repetition + 1}/{args.repeat}", flush=True)
    except KeyboardInterrupt:
        cut_short(args, upstream, runs, args.repeat)
    return runs


def bench_accelerate(args: argparse.Namespace, sides: dict[str, Side]) -> dict:
    """Items 1 and 2: {"settings", "by_workers": {nw: {metric: compare(...)}}, "versions"}; times in seconds."""
    params = {"num_workers": list(NUM_WORKERS), "samples": args.samples, "batch_size": args.batch_size,
              "features": 64, "inner": args.inner}
    runs = repeated_runs(args, sides, "accelerate", params)
    metrics = ("prepare_s", "workers_after_prepare", "epoch0_s", "prepare_epoch0_s", "epoch1_s")
    by_workers = {str(nw): {m: compare([r["by_workers"][str(nw)][m] for r in runs["base"]],
                                       [r["by_workers"][str(nw)][m] for r in runs["patched"]]) for m in metrics}
                  for nw in NUM_WORKERS}
    return {"settings": params, "by_workers": by_workers, "versions": runs["patched"][0]["versions"]}


def bench_deepspeed(args: argparse.Namespace, sides: dict[str, Side]) -> dict:
    """Item 3: {"settings", "by_scenario": {scenario: {metric: compare(...)}}, "versions"}; seconds, batches/s, and
    the time per micro-batch ``batch_s`` (wall) and ``batch_cpu_s`` (CPU), the inverses of the rates per process."""
    params = {"scenarios": list(DS_SCENARIOS), "steps": args.steps, "blocks": 5, "warmup": 20,
              "epoch_samples": 1000, "inner": args.roundtrips}
    runs = repeated_runs(args, sides, "deepspeed", params)
    metrics = ("batches_per_s", "batches_per_cpu_s", "state_dict_s", "load_state_dict_s", "state_roundtrip_s",
               "state_roundtrip_cpu_s")
    by_scenario = {s: {m: compare([r["by_scenario"][s][m] for r in runs["base"]],
                                  [r["by_scenario"][s][m] for r in runs["patched"]]) for m in metrics}
                   for s in DS_SCENARIOS}
    for s, rate, time in ((s, rate, time) for s in DS_SCENARIOS for rate, time in
                          (("batches_per_s", "batch_s"), ("batches_per_cpu_s", "batch_cpu_s"))):
        by_scenario[s][time] = compare([1 / r["by_scenario"][s][rate] for r in runs["base"]],
                                       [1 / r["by_scenario"][s][rate] for r in runs["patched"]])
    return {"settings": params, "by_scenario": by_scenario, "versions": runs["patched"][0]["versions"]}


def accelerate_markdown(acc: dict) -> list[str]:
    """The report's section of items 1 and 2."""
    md = []
    s, processes = acc["settings"], acc["by_workers"]["0"]["prepare_s"]["runs"]
    md += ["## Accelerate: prepare() and one epoch", "",
           f"One process, `DataLoaderConfiguration(use_stateful_dataloader=True)`, `DataLoader(TensorDataset("
           f"{s['samples']} x {s['features']}), batch_size={s['batch_size']}, shuffle=True)`; per process "
           f"{s['inner']} timed rounds after a warm-up round (median), {processes} processes per side. "
           "Every ratio is patched / base of a time: below 1 is faster. Epoch 0 on the patched side includes "
           "starting the workers, which the base does in prepare(), so it is shown, not judged; prepare + epoch 0 "
           "compares the same work (a target); epoch 1 runs code the patch does not change, so its ratio shows this "
           "run's noise floor (not a target).", "",
           "| num_workers | prepare base ms | prepare patched ms | ratio | workers after prepare base / patched | "
           "epoch 0 base ms | epoch 0 patched ms | ratio | prepare + epoch 0 ratio | epoch 1 ratio |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for nw, row in acc["by_workers"].items():
        p, w, e0, pe, e1 = (row[k] for k in ("prepare_s", "workers_after_prepare", "epoch0_s", "prepare_epoch0_s",
                                             "epoch1_s"))
        md.append(f"| {nw} | {fmt(p['base'], 1e3)} | {fmt(p['patched'], 1e3)} | {ratio_cell(p)} | "
                  f"{w['base']:g} / {w['patched']:g} | "
                  f"{fmt(e0['base'], 1e3, 0)} | {fmt(e0['patched'], 1e3, 0)} | {ratio_cell(e0)} | "
                  f"{ratio_cell(pe)} | {ratio_cell(e1)} |")
    md.append("")
    return md


def deepspeed_markdown(ds: dict) -> list[str]:
    """The report's section of item 3."""
    md = []
    s, processes = ds["settings"], ds["by_scenario"][DS_SCENARIOS[0]]["batches_per_s"]["runs"]
    md += ["## DeepSpeed: curriculum sampler", "",
           f"`DeepSpeedDataSampler`, micro-batch 4, gradient accumulation 2, one data-parallel rank, "
           f"{s['epoch_samples']} samples per epoch, `barrier`/`broadcast` stubbed as no-ops. Time per micro-batch "
           f"over {s['steps']} micro-batches after {s['warmup']}, median of {s['blocks']} blocks, by the wall clock "
           f"and in CPU time of the process (not inflated by waiting for a core: the CPU figures are the targets); "
           f"state_dict() of that sampler + load_state_dict() into a new one, median of {s['inner']}; {processes} "
           "processes per side. Every ratio is patched / base of a time: below 1 is faster.", "",
           "| scenario | per micro-batch base us | patched us | ratio (wall) | ratio (CPU) | state_dict + "
           "load_state_dict base us | patched us | ratio (wall) | ratio (CPU) | state_dict base / patched us | "
           "load_state_dict base / patched us |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for scenario, row in ds["by_scenario"].items():
        t, r = row["batch_s"], row["state_roundtrip_s"]
        sd, ld = row["state_dict_s"], row["load_state_dict_s"]
        md.append(f"| {scenario} | {fmt(t['base'], 1e6, 1)} | {fmt(t['patched'], 1e6, 1)} | {ratio_cell(t)} | "
                  f"{ratio_cell(row['batch_cpu_s'])} | {fmt(r['base'], 1e6, 1)} | "
                  f"{fmt(r['patched'], 1e6, 1)} | {ratio_cell(r)} | {ratio_cell(row['state_roundtrip_cpu_s'])} | "
                  f"{fmt(sd['base'], 1e6, 1)} / {fmt(sd['patched'], 1e6, 1)} | "
                  f"{fmt(ld['base'], 1e6, 1)} / {fmt(ld['patched'], 1e6, 1)} |")
    md.append("")
    return md
