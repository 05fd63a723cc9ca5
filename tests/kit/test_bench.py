"""scripts/bench/gate.py's report of the gate's stages: a stack's stages do not all run every upstream."""

from scripts.bench import gate as bench_gate


def test_stages_table_shows_a_stage_without_an_upstream():
    """The gate part of `make bench` raised KeyError on the DeepSpeed stack, whose last stages run DeepSpeed only."""
    stages = {"stage-0": {"wall_s": 10.0, "deepspeed kit tests": 3.0, "accelerate kit tests": 4.0},
              "stage-2": {"wall_s": 5.0, "deepspeed kit tests": 2.0}}
    table = bench_gate.stages_table(stages)
    assert table[0] == ("| stage | pytest wall s | deepspeed kit tests s | accelerate kit tests s "
                        "| start, imports, collection s |")
    assert table[2:] == ["| stage-0 | 10.0 | 3.0 | 4.0 | 3.0 |", "| stage-2 | 5.0 | 2.0 | - | 3.0 |"]
