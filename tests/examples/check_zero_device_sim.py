#!/usr/bin/env python3
"""Example 02 on the simulated device computes what it computes on the host, with and without offload.

Usage: check_zero_device_sim.py EXAMPLE [EXAMPLE_ARGS...]

For stages 0-3 and three configurations (SGD with momentum; AdamW with 2 micro-batches of
accumulation and gradient-norm clipping; --precision bfloat16 with AdamW and 2 micro-batches:
bfloat16 parameters and gradients, float32 master weights, the layers on float32 copies made on
the compute stream; and --precision bfloat16 --reduce-dtype float32 with SGD: float32 gradients
of bfloat16 parameters, FSDP2's reduce_dtype), trains with `--device cpu`, `--device sim` and
`--device sim --offload optimizer` (at stage 3 also `--offload parameters`: the parameter and
gradient shards in host memory) on 2 ranks with the same seed, data and batch, and requires
every epoch's training loss, test loss, test accuracy and gradient norm, the printed final
parameters' CRC-32 and the final parameters themselves (--save-parameters) to be the same bits,
and each rank's measured memory to be the plan's (for bfloat16 also the plan's parameters at
2 bytes and master weights at 4 bytes per element held, the gradients' type at stages 0-1, where
every rank holds them whole, and a test accuracy of at least 0.6). Also: `--offload optimizer` with `--device cpu`
is refused (exit 1, naming --device sim), so is `--offload parameters` below stage 3, and so is `--device sim`
on `--backend mpi`.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

RUNS = {"cpu": ["--device", "cpu"], "sim": ["--device", "sim"],
        "sim+offload": ["--device", "sim", "--offload", "optimizer"]}
CONFIGS = {"sgd": ["--optimizer", "sgd"],
           "adamw-accumulate": ["--optimizer", "adamw", "--accumulate", "2", "--clip-norm", "0.5"],
           "bfloat16-adamw": ["--precision", "bfloat16", "--optimizer", "adamw", "--accumulate", "2"],
           "bfloat16-float32-reduce": ["--precision", "bfloat16", "--reduce-dtype", "float32", "--optimizer", "sgd"]}


def run(cmd, bad, what):
    print("$", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        print(done.stdout, done.stderr)
        bad.append(f"{what}: exit status {done.returncode}")
        return None
    return done.stdout


def main() -> int:
    example, example_args = sys.argv[1], sys.argv[2:]
    bad = []
    with tempfile.TemporaryDirectory() as tmp:
        for config, config_args in CONFIGS.items():
            for stage in range(4):
                out, stdout_of = {}, {}
                runs = dict(RUNS)
                if stage == 3:
                    runs["sim+parameters"] = ["--device", "sim", "--offload", "parameters"]
                for name, device_args in runs.items():
                    tag = f"{config}-{stage}-{name}"
                    js, params = os.path.join(tmp, tag + ".json"), os.path.join(tmp, tag + ".f32")
                    cmd = [example, "--ranks", "2", "--stage", str(stage), "--json", js, "--save-parameters",
                           params] + device_args + example_args + config_args
                    stdout = run(cmd, bad, f"{config} stage {stage} {name}")
                    if stdout is None:
                        break
                    crc = re.findall(r"^final parameters crc32 ([0-9a-f]{8})$", stdout, re.M)
                    out[name] = (json.load(open(js)), open(params, "rb").read(), crc)
                    stdout_of[name] = stdout
                if len(out) != len(runs):
                    continue
                cpu, cpu_params, cpu_crc = out["cpu"]
                if len(cpu_crc) != 1 or cpu["parameter_crc32"] != cpu_crc[0]:
                    bad.append(f"{config} stage {stage}: cpu printed crc {cpu_crc}, JSON {cpu['parameter_crc32']}")
                if not cpu["epochs"] or not cpu_params:
                    bad.append(f"{config} stage {stage}: the cpu run trained nothing")
                want_precision = "bfloat16" if config.startswith("bfloat16") else "float32"
                memory, elements = cpu["plan"]["memory"], cpu["plan"]["parameter_elements"]
                if cpu["config"]["precision"] != want_precision:
                    bad.append(f"{config} stage {stage}: the JSON says precision {cpu['config']['precision']}")
                elif want_precision == "bfloat16":
                    # 2 ranks: stage 3 shards the parameters, stages 1-3 the master weights.
                    whole = elements + cpu["plan"]["padding_elements"]
                    held = (whole if stage < 3 else whole // 2, whole if stage == 0 else whole // 2)
                    if (memory["parameters"], memory["master_weights"]) != (2 * held[0], 4 * held[1]):
                        bad.append(f"{config} stage {stage}: planned memory {memory}, {whole} elements with padding")
                    want_reduce = "float32" if "float32-reduce" in config else "bfloat16"
                    if cpu["config"]["reduce_dtype"] != want_reduce:
                        bad.append(f"{config} stage {stage}: the JSON says reduce_dtype {cpu['config']['reduce_dtype']}")
                    if stage < 2 and memory["gradients"] != (4 if want_reduce == "float32" else 2) * whole:
                        bad.append(f"{config} stage {stage}: planned gradients {memory['gradients']} bytes, "
                                   f"{whole} elements of {want_reduce}")
                    if cpu["epochs"] and cpu["epochs"][-1]["test_accuracy"] < 0.6:
                        bad.append(f"{config} stage {stage}: test accuracy {cpu['epochs'][-1]['test_accuracy']} < 0.6")
                for name in (n for n in runs if n != "cpu"):
                    got, params, crc = out[name]
                    if got["config"]["device"] != "sim":
                        bad.append(f"{config} stage {stage} {name}: the JSON says device {got['config']['device']}")
                    if len(got["epochs"]) != len(cpu["epochs"]):
                        bad.append(f"{config} stage {stage} {name}: {len(got['epochs'])} epochs, cpu {len(cpu['epochs'])}")
                    for a, b in zip(cpu["epochs"], got["epochs"]):
                        for key in ("train_loss", "test_loss", "test_accuracy", "gradient_norm", "clipped_steps"):
                            if a[key] != b[key]:
                                bad.append(f"{config} stage {stage} epoch {a['epoch']} {key}: cpu {a[key]!r} but "
                                           f"{name} {b[key]!r}")
                    if crc != cpu_crc:
                        bad.append(f"{config} stage {stage}: printed parameter crc {name} {crc}, cpu {cpu_crc}")
                    if params != cpu_params:
                        bad.append(f"{config} stage {stage}: {name}'s final parameters differ from cpu's")
                    planned = got["plan"]["memory"]["total"]
                    measured = [r["measured"]["total"] for r in got["memory"]]
                    if measured != [planned, planned]:
                        bad.append(f"{config} stage {stage} {name}: measured memory {measured}, planned {planned} each")
                    if name == "sim+parameters":
                        host, model = got["plan"]["host_memory"], got["plan"]["memory"]
                        if host["parameters"] != model["parameters"] or host["gradients"] != model["gradients"]:
                            bad.append(f"{config} stage 3 {name}: host memory {host}, the shards are {model}")
                    if name != "sim":  # the text report splits the planned memory between the device and the host
                        plan = got["plan"]
                        device_kib = (plan["memory"]["total"] - plan["host_memory"]["total"]) / 1024
                        line = (f"planned memory per rank: {device_kib:.1f} KiB in the device's memory, "
                                f"{plan['host_memory']['total'] / 1024:.1f} KiB in host memory (the simulated "
                                "device's offload space)")
                        if line not in stdout_of[name]:
                            bad.append(f"{config} stage {stage} {name}: no line '{line}' in the report")
                last = cpu["epochs"][-1] if cpu["epochs"] else {}
                print(f"{config} stage {stage}: train loss {last.get('train_loss')!r}, test accuracy "
                      f"{last.get('test_accuracy')!r}, parameters crc32 {cpu['parameter_crc32']} on cpu; sim and "
                      f"offloads {'equal' if all(out[n][1] == cpu_params for n in runs if n != 'cpu') else 'DIFFERENT'}",
                      flush=True)
    refusals = [
        (["--device", "cpu", "--offload", "optimizer"], "--offload optimizer needs --device sim or --device cuda"),
        (["--device", "sim", "--stage", "2", "--offload", "parameters"], "--offload parameters needs --stage 3 (got --stage 2)"),
        (["--device", "sim", "--backend", "mpi"], "--device sim"),
    ]
    for args, text in refusals:
        done = subprocess.run([example] + args + example_args, capture_output=True, text=True, timeout=120)
        if done.returncode != 1 or text not in done.stderr:
            bad.append(f"{' '.join(args)}: exit {done.returncode}, stderr {done.stderr.strip()!r}")
    for b in bad:
        print("FAIL:", b)
    print("ok" if not bad else "FAILED")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
