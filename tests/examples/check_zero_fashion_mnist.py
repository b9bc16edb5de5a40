#!/usr/bin/env python3
"""Short runs of examples/02_zero_fashion_mnist at ZeRO stages 0-3 on 2000 Fashion-MNIST images.

Usage: check_zero_fashion_mnist.py ZERO_EXAMPLE [DDP_EXAMPLE]

What it checks (each failure is printed; the exit status is 1 when any check fails, 77 (skip)
when the Fashion-MNIST files are missing):
- equal arithmetic: on 2 ranks without accumulation every stage computes the same numbers as
  stage 0 (plain data parallelism), so the final parameters are bit-identical and the losses
  equal, for SGD with momentum on the 3-layer MLP and for Adam on the 6-layer one (--deep);
- with gradient accumulation and clipping (stages 2-3 reduce every micro-batch, stage 0 once per
  step, so the sums are rounded in another order) and on 3 ranks, the final parameters agree
  with stage 0 within 1e-5 relative (relative to the element, or to the parameters' root mean
  square for elements smaller than that), and the final train loss within 1e-5 relative;
- example 01 (DDP with the gradient reducer) on the same arguments ends with the same train
  and test loss as stage 0, within 1e-5 relative;
- memory: on every rank, the memory the runtime allocated, counted where it allocates
  (memory_allocated: the peak over the run), is the plan plus at most the step's scalars; and
  the memory it says it holds (memory_in_use) equals the plan in
  every category; the process heap grew by the planned model states (within 5%) while the
  runtime was built, and by the planned communication buffers (within 5%) during the first step;
  at stage 3 a rank's model states are at most 1/N of stage 0's plus the largest gather unit.
"""
import array
import json
import math
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from command_check import check, finish  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"
COMMON = ["--epochs", "1", "--train-subset", "2000", "--test-subset", "1000", "--no-progress"]


def run(exe, args, tmp, tag):
    """Runs the example; returns (metrics JSON, final parameters or None)."""
    js = os.path.join(tmp, tag + ".json")
    cmd = [exe] + args + ["--json", js]
    params = None
    if "zero_fashion_mnist" in os.path.basename(exe):
        params = os.path.join(tmp, tag + ".f32")
        cmd += ["--save-parameters", params]
    print("+ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    if p.returncode != 0:
        print(p.stdout)
        raise SystemExit(f"FAIL: {tag}: exit status {p.returncode}")
    with open(js) as f:
        metrics = json.load(f)
    values = None
    if params:
        values = array.array("f")
        with open(params, "rb") as f:
            values.frombytes(f.read())
    return metrics, values


def relative(a, b):
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


def compare_parameters(ref, got, tag, exact):
    if not check(len(ref) == len(got), f"{tag}: {len(got)} parameters, stage 0 has {len(ref)}"):
        return
    if exact:
        differ = sum(1 for a, b in zip(ref, got) if a != b)
        check(differ == 0, f"{tag}: {differ} of {len(ref)} final parameters differ from stage 0 (expected bit-identical)")
        return
    rms = math.sqrt(sum(float(a) * a for a in ref) / len(ref))
    worst, where = 0.0, 0
    for i, (a, b) in enumerate(zip(ref, got)):
        r = abs(a - b) / max(abs(a), rms)
        if r > worst:
            worst, where = r, i
    check(worst <= 1e-5, f"{tag}: parameter {where} differs from stage 0 by {worst:.3g} relative (> 1e-5): "
                         f"{got[where]!r} vs {ref[where]!r}")


def check_memory(m, tag):
    stage, ranks = m["config"]["stage"], m["config"]["ranks"]
    plan = m["plan"]["memory"]
    keys = ["parameters", "gradients", "master_weights", "optimizer_states", "communication_buffers"]
    check(len(m["memory"]) == ranks, f"{tag}: memory reported for {len(m['memory'])} ranks, not {ranks}")
    for r in m["memory"]:
        for k in keys:
            check(r["measured"][k] == plan[k],
                  f"{tag}: rank {r['rank']} holds {r['measured'][k]} bytes of {k}, the plan says {plan[k]}")
        # Counted where the runtime allocates (sharded_model::memory_allocated), the peaks of
        # every memory space added: the plan, plus at most the step's scalars (48 bytes each:
        # the device path's, and offload's copy), never more at any moment of the run.
        total = plan["total"]
        check(total <= r["allocated_now"] <= r["allocated_peak"] <= total + 2 * 48,
              f"{tag}: rank {r['rank']} allocated {r['allocated_peak']} bytes at the peak and holds "
              f"{r['allocated_now']}, the plan says {total} (plus at most 96 bytes of step scalars)")
        check(r["after_construction"]["model_states"] == plan["model_states"],
              f"{tag}: rank {r['rank']} built {r['after_construction']['model_states']} bytes of model states, "
              f"the plan says {plan['model_states']}")
    heap = m.get("heap_growth_per_rank")
    if heap is not None:
        # The runtime allocates everything (model states and its pooled communication buffers)
        # in its constructor; the first step allocates nothing large.
        states = plan["model_states"]
        built = states + plan["communication_buffers"]
        check(abs(heap["construction"] - built) <= 0.05 * built,
              f"{tag}: the heap grew by {heap['construction']:.0f} bytes per rank while the runtime was built, "
              f"not within 5% of the planned model states and communication buffers {built}")
        check(abs(heap["first_step"]) <= 0.05 * states,
              f"{tag}: the heap grew by {heap['first_step']:.0f} bytes per rank in the first step "
              f"(nothing large is allocated there)")
    # Stage 3 times its gathers on the streams (sharded_model_options::time_gathers): every unit is
    # gathered before its forward and its backward in every micro-batch, each waited for once or
    # more; the share hidden lies in [0, 1]. The other stages gather nothing.
    for e in m["epochs"]:
        t = e["gather_timing"]
        micro_batches = e["steps"] * m["config"].get("accumulate", 1)
        if stage == 3:
            check(t["gathers"] >= 2 * micro_batches and t["waits"] >= t["gathers"] and t["gather_seconds"] > 0
                  and 0 <= t["hidden_fraction"] <= 1,
                  f"{tag}: epoch {e['epoch']}: gather timing {t} for {micro_batches} micro-batches")
        else:
            check(t["gathers"] == 0 and t["waits"] == 0, f"{tag}: epoch {e['epoch']}: gathers timed at stage {stage}")
    if stage == 3:
        bound = m["stage0_plan_memory"]["model_states"] / ranks + m["largest_unit_bytes"]
        for r in m["memory"]:
            check(r["measured"]["model_states"] <= bound,
                  f"{tag}: rank {r['rank']} holds {r['measured']['model_states']} bytes of model states at stage 3, "
                  f"more than 1/{ranks} of stage 0's plus the largest unit ({bound:.0f})")


def stages(exe, tmp, name, args, stage_list, exact):
    """Runs `stage_list` (stage 0 first) and compares each with stage 0."""
    results = {}
    for s in stage_list:
        tag = f"{name}, stage {s}"
        slug = "".join(c if c.isalnum() else "_" for c in name)
        results[s] = run(exe, ["--stage", str(s)] + args, tmp, f"{slug}-stage{s}")
        check_memory(results[s][0], tag)
    ref_metrics, ref_params = results[0]
    for s in stage_list[1:]:
        tag = f"{name}, stage {s}"
        metrics, params = results[s]
        compare_parameters(ref_params, params, tag, exact)
        a, b = ref_metrics["final_train_loss"], metrics["final_train_loss"]
        if exact:
            check(a == b and ref_metrics["epochs"][-1]["test_loss"] == metrics["epochs"][-1]["test_loss"],
                  f"{tag}: train loss {b!r}, test loss {metrics['epochs'][-1]['test_loss']!r}; stage 0: {a!r}, "
                  f"{ref_metrics['epochs'][-1]['test_loss']!r}")
        else:
            check(relative(a, b) <= 1e-5, f"{tag}: train loss {b!r} vs stage 0's {a!r}")
    return results


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    exe = sys.argv[1]
    ddp = sys.argv[2] if len(sys.argv) > 2 else None
    if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
        print(f"skip: Fashion-MNIST is not installed in {DATA}")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        # --check-replicas 2: verify_replicas every 2 steps (examples 01 and 02) changes no number.
        sgd = ["--ranks", "2", "--batch-size", "100", "--optimizer", "sgd", "--check-replicas", "2"] + COMMON
        res = stages(exe, tmp, "2 ranks, sgd", sgd, [0, 1, 2, 3], exact=True)
        for s in [0, 1, 2, 3]:
            # Stages 0-2 compare the 6 replicated parameters; stage 3 replicates nothing between steps.
            want = "every 2 step(s) (6 tensors each): equal" if s < 3 else "every 2 step(s): nothing to compare"
            got = res[s][0].get("replica_checks", "")
            check(want in got, f"2 ranks, sgd, stage {s}: replica checks {got!r}, expected {want!r}")
        check(res[0][0]["final_test_accuracy"] > 0.5,
              f"2 ranks, sgd: test accuracy {res[0][0]['final_test_accuracy']} after 10 steps (it should learn)")
        if ddp:
            m, _ = run(ddp, sgd, tmp, "ddp")
            r = m["runs"][0]
            check("(6 tensors each): equal" in r.get("replica_checks", ""),
                  f"example 01 (DDP): replica checks {r.get('replica_checks')!r}")
            ref = res[0][0]
            check(relative(r["epochs"][-1]["train_loss"], ref["final_train_loss"]) <= 1e-5 and
                  relative(r["epochs"][-1]["test_loss"], ref["epochs"][-1]["test_loss"]) <= 1e-5,
                  f"example 01 (DDP): train loss {r['epochs'][-1]['train_loss']!r}, test loss "
                  f"{r['epochs'][-1]['test_loss']!r}; stage 0: {ref['final_train_loss']!r}, "
                  f"{ref['epochs'][-1]['test_loss']!r}")
        deep = ["--ranks", "2", "--batch-size", "100", "--deep", "--optimizer", "adam"] + COMMON
        stages(exe, tmp, "2 ranks, deep, adam", deep, [0, 1, 2, 3], exact=True)
        accumulate = ["--ranks", "2", "--batch-size", "50", "--deep", "--accumulate", "2", "--clip-norm", "0.5"] + COMMON
        stages(exe, tmp, "2 ranks, deep, accumulate 2, clip", accumulate, [0, 1, 2, 3], exact=False)
        three = ["--ranks", "3", "--batch-size", "100", "--optimizer", "adamw"] + COMMON
        stages(exe, tmp, "3 ranks, adamw", three, [0, 3], exact=False)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
