"""Example 04 (libtorch GPT: ZeRO through integration/torch_zero.hpp, DDP through
integration/torch_ddp.hpp with torch::optim::AdamW), short runs of a small model:

- --strategy zero1, zero2, zero3 (and zero3 with --wrap layer and model, and with
  --reshard-after-forward none and except_last, and --wrap block --reshard-after-forward except_last
  --max-inflight-gathers 1) on 2 ranks give the same loss curve bit for bit (for 2 ranks every
  stage averages the same two gradients, (a + b) / 2, and the runtime's optimizer is element-wise,
  so the parameters stay identical; stage 3 only holds if autograd's saved tensors see the
  regathered parameters); zero1 is the reference;
- --strategy ddp (torch_ddp, torch's AdamW and clip_grad_norm_) gives zero1's curve within a
  relative 1e-5 (torch's AdamW and the runtime's round differently: tolerance below), each rank
  sends per step the all_reduce of its gradient buckets plus the step's few scalars;
- the 1-rank zero1 curve equals the 2-rank one within float32 rounding (tolerance below);
- at zero3 the memory per rank (parameter shard, gather buffers, gradient buckets, gradients,
  optimizer states) equals the plan that ringzero-plan makes for the same model (the example
  writes its parameter list), so peak parameter memory stays within the plan, and the runtime's
  allocations counted where they are made (memory_allocated) are the plan plus the step's 48
  bytes of scalars, at the peak too;
- --checkpoint (zero3, half the steps) then --resume (as zero3, and resharded as zero1) continues
  the straight run's losses and text bit for bit, and resumed as ddp continues zero1's curve within
  the tolerance; a ddp --checkpoint resumed as ddp continues the straight ddp run bit for bit (the
  reducer's bucket layout restored too), resumed as zero1 within the tolerance; a --resume past
  --steps is refused;
- zero3 with --quantize-weights int8 --quantize-gradients int8: the loss within 2% of the
  full-precision run after 50 steps, the bytes each rank sent per step (measured) those of the
  plan's collectives (quantized) plus the step's few scalars, 3.9x fewer than without; under
  mpirun -np 2 --backend mpi (where mpirun exists) the same losses bit for bit;
- zero3 --lora 4 (frozen backbone kept gathered): the loss falls, bytes sent per step are the
  plan's and under half of full fine-tuning's, memory equals ringzero-plan's with --keep-frozen
  all (and under the layer wrap gathering the backbone, without), zero1 and the layer wrap give
  the same losses bit for bit;
- zero3 --accumulation-steps 2, with and without --accumulate-unsharded: the one-micro-batch loss
  curve within float32 rounding, the plan's bytes sent, fewer with --accumulate-unsharded;
- the launcher refusal of examples 01 and 02, a bad --batch, and a ZeRO-only option with ddp.
Skipped (77) when Debian's fortunes package is not installed.

usage: check_libtorch_gpt.py LIBTORCH_GPT RINGZERO_PLAN
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

exe, plan_exe = sys.argv[1], sys.argv[2]
DATA = "/usr/share/games/fortunes"
STEPS = 50
SMALL = ["--steps", str(STEPS), "--layers", "2", "--embd", "32", "--heads", "2", "--context", "32",
         "--batch", "8", "--generate", "40", "--print-every", "25"]
# 1 rank against 2: the losses differ only through float32 reassociation (the 2-rank gradient is
# the average of two half-batch sums instead of one sum over the batch; the printed loss is the
# average of two half-batch means). Such differences are a few ulps per step (~1e-7 relative)
# and AdamW, whose update is smooth in the gradient, does not amplify them over these 50 steps
# of this seed: the largest relative difference measured was 5e-7. 1e-5 leaves a 20x margin,
# while a real fault (a gradient summed instead of averaged, a stale or wrong regathered
# parameter, a learning rate 1% off) moves the loss by 1e-3 or more within a few steps.
# ddp against zero1 on 2 ranks: the same gradients (bit for bit: both average the same two
# float32 sums), but torch::optim::AdamW and the runtime's AdamW (and torch's clip_grad_norm_ and
# the runtime's clipping) round differently, a few ulps per step: the largest relative difference
# measured over these 50 steps was 7.1e-8 (and 2.3e-7 over 300 steps, 2.9e-7 on 1 rank, 2.5e-7 on
# 4), so the same 1e-5 leaves a margin of over 100. Other seeds of this small model meet batches
# that amplify such rounding late in the run (1-rank zero1 against 2-rank as well as ddp against
# zero1: up to 1e-4 by step 50 for a few of 20 seeds tried), so the tolerance holds for this
# seed and model, which the check fixes.
RELATIVE_TOLERANCE = 1e-5
STEP_SCALARS = 48  # sizeof(ringzero::zero::step_scalars): the step's norm, decision and multiplier
failures = []
curves_sample = None
ddp_run = None

if not os.path.isdir(DATA):
    print(f"skip: {DATA} is missing (Debian: apt-get install fortunes)")
    sys.exit(77)

tmp = tempfile.mkdtemp(prefix="libtorch_gpt_check_")


def run(args, env=None):
    out = os.path.join(tmp, "run.json")
    r = subprocess.run([exe, *args, "--json", out], capture_output=True, text=True, errors="replace", timeout=300,
                       env={**os.environ, **(env or {})})
    if r.returncode != 0:
        failures.append(f"{' '.join(args)}: exit {r.returncode}: {r.stderr.strip()[-600:]}")
        return None
    with open(out) as f:
        return json.load(f)


def memory_matches_plan(run_json, label, reshard, extra=()):
    model_file = os.path.join(tmp, "model.json")
    with open(model_file, "w") as f:
        json.dump({"parameters": run_json["parameters"]}, f)
    r = subprocess.run([plan_exe, "--model-file", model_file, "--world-size", "2", "--stage", "3",
                        "--precision", "fp32", "--optimizer", "adamw", "--reshard-after-forward", reshard, *extra,
                        "--json"],
                       capture_output=True, text=True, errors="replace", timeout=60)
    if r.returncode != 0:
        failures.append(f"ringzero-plan for {label}: exit {r.returncode}: {r.stderr.strip()}")
        return
    planned = json.loads(r.stdout)["plans"][0]["memory_per_rank"]
    measured = run_json["memory_measured"]
    for k in ("parameters", "gradients", "master_weights", "optimizer_states", "communication_buffers"):
        if measured[k] != planned[k]:
            failures.append(f"{label}: {k} {measured[k]} B per rank, ringzero-plan says {planned[k]} B")
    peak = measured["parameters"] + measured["communication_buffers"]
    if peak > planned["parameters"] + planned["communication_buffers"]:
        failures.append(f"{label}: parameter memory {peak} B above the plan")
    # Counted where the runtime allocates (sharded_model::memory_allocated): the plan plus the
    # step's scalars (48 bytes, written by stream work), now and at the peak of the whole run.
    total = sum(planned[k] for k in ("parameters", "gradients", "master_weights", "optimizer_states",
                                     "communication_buffers")) + STEP_SCALARS
    # The process's resident memory (both ranks are threads of it) grew by at least what the two
    # runtimes allocated: the plan's bytes are memory the process touched, not only counted.
    resident = run_json["resident_memory"]
    if resident["peak"] and resident["peak"] - resident["start"] < 2 * total:
        failures.append(f"{label}: resident memory grew by {resident['peak'] - resident['start']} B, less than "
                        f"the two runtimes' {2 * total} B")
    allocated = run_json["memory_allocated"]
    if allocated["scratch"] != STEP_SCALARS:
        failures.append(f"{label}: {allocated['scratch']} B allocated outside the model state, expected the "
                        f"{STEP_SCALARS} B of step scalars")
    if allocated["now"] != total or allocated["peak"] != total:
        failures.append(f"{label}: the runtime allocated {allocated['peak']} B at the peak and holds "
                        f"{allocated['now']} B, ringzero-plan says {total - STEP_SCALARS} B + {STEP_SCALARS} B "
                        "of step scalars")


one = run(["--ranks", "1", "--strategy", "zero1", *SMALL])
curves = {}
# --reshard-after-forward and --max-inflight-gathers change when units are gathered, never the
# numbers: the same curve, and the memory of the plan made with the same settings (none holds every
# unit at the forward's end; a bound of 1 gathers no unit ahead, so one gather buffer less;
# with layer wrap, tests/examples/test_torch_zero.cpp checks the bound's memory).
for strategy, wrap, reshard, bound in (("ddp", "block", "all", ()), ("zero1", "block", "all", ()),
                                       ("zero2", "block", "all", ()), ("zero3", "block", "all", ()),
                                       ("zero3", "layer", "all", ()), ("zero3", "model", "all", ()),
                                       ("zero3", "block", "none", ()), ("zero3", "layer", "except_last", ()),
                                       ("zero3", "block", "except_last", ("--max-inflight-gathers", "1"))):
    label = (f"--strategy {strategy} --wrap {wrap}" + (f" --reshard-after-forward {reshard}" if reshard != "all" else "")
             + "".join(" " + a for a in bound))
    j = run(["--ranks", "2", "--strategy", strategy, "--wrap", wrap, "--reshard-after-forward", reshard, *bound,
             *SMALL])
    if j is None:
        continue
    curves[label] = j["losses"]
    if label == "--strategy zero1 --wrap block":
        curves_sample = j["sample"]
    if strategy == "ddp":
        ddp_run = j
    if len(j["losses"]) != STEPS:
        failures.append(f"{label}: {len(j['losses'])} losses, expected {STEPS}")
    if strategy == "zero3":
        memory_matches_plan(j, label, reshard, bound)
    if not j["sample"]:
        failures.append(f"{label}: no generated text")
two_rank_runs = len(curves)


def within_tolerance(label, losses, expected, against):
    """Fails when a loss of `losses` differs from `expected`'s by more than RELATIVE_TOLERANCE."""
    if len(losses) != len(expected):
        failures.append(f"{label}: {len(losses)} losses, {against} has {len(expected)}")
    for step, (a, b) in enumerate(zip(losses, expected)):
        if abs(a - b) > RELATIVE_TOLERANCE * abs(b):
            failures.append(f"{label}: step {step} loss {a!r}, {against} {b!r} (relative difference "
                            f"{abs(a - b) / abs(b):.2e}, tolerance {RELATIVE_TOLERANCE:.0e})")
            return


reference = curves.pop("--strategy zero1 --wrap block", None)
ddp_curve = curves.pop("--strategy ddp --wrap block", None)
if reference is not None:
    for label, losses in curves.items():
        if losses != reference:
            step = next(i for i, (a, b) in enumerate(zip(losses, reference)) if a != b)
            failures.append(f"{label}: step {step} loss {losses[step]!r}, zero1 on 2 ranks {reference[step]!r} "
                            "(expected bit-identical)")
    if reference[-1] >= reference[0]:
        failures.append(f"the loss did not fall: {reference[0]} -> {reference[-1]}")
    if ddp_curve is not None:
        within_tolerance("--strategy ddp (torch_ddp, torch::optim::AdamW)", ddp_curve, reference, "zero1")
        # Each rank sends the ring all_reduce of its gradient buckets, plus the loss's all_reduce
        # and the reducer's one rebuild (a few bytes per step over the run).
        sent, expected = ddp_run["sent_bytes_per_step"], ddp_run["planned_bytes_per_step"]
        if not 0 < expected <= sent <= expected + 100:
            failures.append(f"--strategy ddp: {sent} bytes sent per step, the all_reduce of the gradient buckets "
                            f"{expected}")
        if ddp_run["memory_allocated"]["now"] < ddp_run["memory_planned"]["gradients"]:
            failures.append(f"--strategy ddp: the reducer holds {ddp_run['memory_allocated']['now']} B, less than "
                            f"the {ddp_run['memory_planned']['gradients']} B of gradients")
if one is not None and reference is not None:
    within_tolerance("1 rank against 2 (zero1)", one["losses"], reference, "2 ranks")

# --checkpoint then --resume: half the steps saved at zero3, the rest resumed at zero3 and, resharded,
# at zero1 (on 2 ranks every stage computes the same bits), give the straight run's losses and
# text; resumed as ddp (the parameters and AdamW's states under the same names, torch's AdamW
# stepping on from the saved step count), zero1's losses within the tolerance. The zero1 resume
# loads into parameter memory the module's tensors view (refreshed after it). Then a ddp
# checkpoint (parameters, AdamW's states and step count, the reducer's bucket layout) resumed as
# ddp gives the straight ddp run's losses and text, and resumed as zero1, zero1's within the
# tolerance.
HALF = STEPS // 2
ddp_sample = ddp_run["sample"] if ddp_run is not None else None
for saved_as, resumes in (("zero3", ("zero3", "zero1", "ddp")), ("ddp", ("ddp", "zero1"))):
    ckpt = os.path.join(tmp, f"ckpt_{saved_as}")
    first = run(["--ranks", "2", "--strategy", saved_as, "--checkpoint", ckpt, "--checkpoint-every", "10", "--steps",
                 str(HALF), *SMALL[2:]] + (["--keep-checkpoints", "1"] if saved_as == "zero3" else []))
    kept = sorted(d for d in os.listdir(ckpt) if d.startswith("step-")) if os.path.isdir(ckpt) else []
    if saved_as == "zero3" and kept != [f"step-{HALF:08d}"]:  # saved after steps 10, 20 and HALF; one kept
        failures.append(f"--keep-checkpoints 1: the checkpoint root holds {kept}")
    for resumed_as in resumes:
        second = run(["--ranks", "2", "--strategy", resumed_as, "--resume", ckpt, *SMALL])
        label = f"--checkpoint at {saved_as}, --resume as {resumed_as}"
        if first is None or second is None or reference is None or ddp_curve is None:
            continue
        if second["first_step"] != HALF:
            failures.append(f"{label}: resumed after step {second['first_step']}, expected {HALF}")
        if (saved_as == "ddp") != (resumed_as == "ddp"):  # across the optimizers: zero1's curve, within the tolerance
            within_tolerance(label, second["losses"], reference[HALF:], "the straight zero1 run")
            continue
        straight, sample = (ddp_curve, ddp_sample) if saved_as == "ddp" else (reference, curves_sample)
        if second["losses"] != straight[HALF:]:
            failures.append(f"{label}: losses {second['losses'][:3]}..., the straight run's "
                            f"{straight[HALF:HALF + 3]}... (expected bit-identical)")
        if second["sample"] != sample:
            failures.append(f"{label}: another generated text than the straight run's")
r = subprocess.run([exe, "--steps", "5", "--resume", os.path.join(tmp, "ckpt_zero3"), *SMALL[2:]],
                   capture_output=True, text=True, errors="replace", timeout=120)
if r.returncode != 1 or "past --steps 5" not in r.stderr:
    failures.append(f"--resume past --steps: exit {r.returncode}, stderr {r.stderr.strip()[-300:]!r}")
# What the shapes do not show is recorded and checked: another --heads splits the same matrices.
heads = [a if SMALL[i - 1] != "--heads" else "4" for i, a in enumerate(SMALL)]
r = subprocess.run([exe, "--resume", os.path.join(tmp, "ckpt_zero3"), *heads], capture_output=True, text=True,
                   errors="replace", timeout=120)
if r.returncode != 1 or "the checkpoint was trained with --heads 2, this run has --heads 4" not in r.stderr:
    failures.append(f"--resume with another --heads: exit {r.returncode}, stderr {r.stderr.strip()[-300:]!r}")

# Quantized communication (zero3, int8 weights and gradients): the loss stays near the
# full-precision run's; the measured bytes per step are the plan's quantized ones plus the step's
# scalars (the loss's and the norm's all_reduce, the step's agreement record: under 100 bytes).
full = run(["--strategy", "zero3", *SMALL])
quantized = run(["--strategy", "zero3", "--quantize-weights", "int8", "--quantize-gradients", "int8", *SMALL])
if full and quantized:
    tail = lambda j: sum(j["losses"][-10:]) / 10
    if abs(tail(quantized) - tail(full)) > 0.02 * tail(full):
        failures.append(f"quantized zero3: loss {tail(quantized):.4f} against {tail(full):.4f} in full precision")
    sent, planned = quantized["sent_bytes_per_step"], quantized["planned_bytes_per_step"]
    if not planned <= sent <= planned + 100:
        failures.append(f"quantized zero3: {sent} bytes sent per step, the plan's collectives {planned}")
    if quantized["unquantized_bytes_per_step"] / planned < 3.9 or full["planned_bytes_per_step"] != full[
            "unquantized_bytes_per_step"]:
        failures.append(f"quantized zero3: {quantized['unquantized_bytes_per_step']} bytes without quantization, "
                        f"{planned} with")
    mpirun = shutil.which("mpirun")
    if mpirun:
        out = os.path.join(tmp, "mpi.json")
        r = subprocess.run([mpirun, "--oversubscribe", "-np", "2", exe, "--backend", "mpi", "--strategy", "zero3",
                            "--quantize-weights", "int8", "--quantize-gradients", "int8", *SMALL, "--json", out],
                           capture_output=True, text=True, errors="replace", timeout=300,
                           env={**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
        if r.returncode != 0:
            failures.append(f"quantized zero3 under mpirun: exit {r.returncode}: {r.stderr.strip()[-600:]}")
        else:
            with open(out) as f:
                mpi = json.load(f)
            if mpi["losses"] != quantized["losses"]:
                failures.append("quantized zero3: the losses under --backend mpi differ from the local backend's")

# --lora 4 at zero3: the backbone frozen (requires_grad false) and kept gathered, only the
# adapters train. The loss falls; each rank sends per step the plan's collectives plus the step's
# scalars, under half of what full fine-tuning sends (`full` above); the memory is ringzero-plan's
# for the written model (frozen parameters marked) with --keep-frozen all; zero1 gives the same
# losses bit for bit.
lora = run(["--strategy", "zero3", "--lora", "4", *SMALL])
lora_zero1 = run(["--strategy", "zero1", "--lora", "4", *SMALL])
if lora and full and lora_zero1:
    if lora["losses"][-1] >= lora["losses"][0]:
        failures.append(f"--lora 4: the loss did not fall: {lora['losses'][0]} -> {lora['losses'][-1]}")
    sent, planned = lora["sent_bytes_per_step"], lora["planned_bytes_per_step"]
    if not planned <= sent <= planned + 100:
        failures.append(f"--lora 4: {sent} bytes sent per step, the plan's collectives {planned}")
    if sent >= 0.5 * full["sent_bytes_per_step"]:
        failures.append(f"--lora 4: {sent} bytes sent per step, full fine-tuning {full['sent_bytes_per_step']}")
    if not 0 < lora["trainable_parameters"] < lora["parameters_total"] / 4 or lora["frozen_kept_bytes"] == 0:
        failures.append(f"--lora 4: {lora['trainable_parameters']} of {lora['parameters_total']} parameters "
                        f"trainable, {lora['frozen_kept_bytes']} frozen bytes kept gathered")
    if sum(1 for p in lora["parameters"] if p.get("trainable", True)) != 16:  # 2 blocks x 4 projections x A, B
        failures.append("--lora 4: the written parameter list does not mark 16 adapters trainable")
    memory_matches_plan(lora, "--lora 4", "all", ["--keep-frozen", "all"])
    if lora_zero1["losses"] != lora["losses"]:
        failures.append("--lora 4: zero1's losses differ from zero3's (expected bit-identical on 2 ranks)")
    # The adapters are the projections' own parameters: under the layer wrap they are gathered
    # with them (no unit inside another), so the memory is the plan's there too.
    lora_layer = run(["--strategy", "zero3", "--wrap", "layer", "--lora", "4", "--keep-frozen", "0", *SMALL])
    if lora_layer:
        memory_matches_plan(lora_layer, "--lora 4 --wrap layer --keep-frozen 0", "all")
        if lora_layer["losses"] != lora["losses"]:
            failures.append("--lora 4 --wrap layer: losses differ from the block wrap's (expected bit-identical)")

# --accumulation-steps 2 at zero3: the loss curve of one micro-batch per step within float32
# rounding; every micro-batch gathers and reduce_scatters, and with --accumulate-unsharded the
# gradients are reduced once per step: each rank sends the plan's bytes (plus the step's scalars)
# and the unsharded run sends exactly one gradient reduction less per step.
accumulated = run(["--strategy", "zero3", "--accumulation-steps", "2", *SMALL])
unsharded = run(["--strategy", "zero3", "--accumulation-steps", "2", "--accumulate-unsharded", *SMALL])
if full and accumulated and unsharded:
    for label, j in (("--accumulation-steps 2", accumulated), ("--accumulate-unsharded", unsharded)):
        for step, (a, b) in enumerate(zip(j["losses"], full["losses"])):
            if abs(a - b) > RELATIVE_TOLERANCE * abs(b):
                failures.append(f"{label}: step {step} loss {a!r}, one micro-batch {b!r}")
                break
        if not j["planned_bytes_per_step"] <= j["sent_bytes_per_step"] <= j["planned_bytes_per_step"] + 100:
            failures.append(f"{label}: {j['sent_bytes_per_step']} bytes sent per step, the plan's collectives "
                            f"{j['planned_bytes_per_step']}")
    # per step: one micro-batch's gathers G and reduction R; 2G + 2R; 2G + R
    one, two, once = (j["planned_bytes_per_step"] for j in (full, accumulated, unsharded))
    if two != 2 * one or not one < once < two:
        failures.append(f"planned bytes per step: {one} with one micro-batch, {two} with two, {once} with two "
                        "accumulated unsharded")

# The launcher refusal (as examples 01 and 02) and a global batch that does not split.
env = {k: v for k, v in os.environ.items() if k not in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS")}
r = subprocess.run([exe, "--steps", "1"], capture_output=True, text=True, errors="replace", timeout=60,
                   env={**env, "OMPI_COMM_WORLD_SIZE": "2"})
if r.returncode != 2 or "mpirun (Open MPI) as one of 2 processes" not in r.stderr or "--ranks 2" not in r.stderr:
    failures.append(f"launcher refusal: exit {r.returncode}, stderr {r.stderr.strip()!r}")
r = subprocess.run([exe, "--ranks", "2", "--batch", "3"], capture_output=True, text=True, errors="replace", timeout=60)
if r.returncode != 1 or "--batch must be a multiple of --ranks" not in r.stderr:
    failures.append(f"--batch 3 --ranks 2: exit {r.returncode}, stderr {r.stderr.strip()!r}")

r = subprocess.run([exe, "--strategy", "ddp", "--quantize-gradients", "int8", "--steps", "1"], capture_output=True,
                   text=True, errors="replace", timeout=60)
if r.returncode != 1 or "--quantize-gradients is an option of the ZeRO runtime" not in r.stderr:
    failures.append(f"--strategy ddp --quantize-gradients int8: exit {r.returncode}, stderr {r.stderr.strip()!r}")
r = subprocess.run([exe, "--strategy", "zero1", "--max-inflight-gathers", "2", "--steps", "1"], capture_output=True,
                   text=True, errors="replace", timeout=60)
if r.returncode != 1 or "--max-inflight-gathers is an option of ZeRO stage 3 (--strategy zero3)" not in r.stderr:
    failures.append(f"--strategy zero1 --max-inflight-gathers 2: exit {r.returncode}, stderr {r.stderr.strip()!r}")

for f in failures:
    print("FAIL:", f)
print(f"{'ok' if not failures else 'FAILED'}: {two_rank_runs} two-rank runs of {STEPS} steps against one rank")
sys.exit(1 if failures else 0)
