"""GPU kernel time of kiln's outer reductions (a channels-last batch norm's statistics) against eager and a copy.

    python -m benchmarks.outer_reduction_probe [--settings "split_outer_target_programs=4096;welford_compensation=0"]
        [--out DIR]

A ResNet-50 training step at batch 64 spends over 1.2 ms in the first stages of its split batch-norm statistics
(welford over N x H x W per channel, channels-last; 2026-12-07_profile-train-resnet50-ded8935): about 450 GB/s
where a copy runs near 3 TB/s. Each program loops over its chunk one [64, 32] tile at a time, a load's latency
per step, which suggests too few programs doing too long a loop (or, second, the per-element work of its
compensated updates). This times, per setting in --settings (kiln config options, `;` between settings, `,`
between the options of one; `default` is the defaults), kiln's var_mean and sum over dims (0, 2, 3) of a channels-last bf16 activation of
ResNet-50's shapes, as the sum of the GPU kernels' own times per call (torch.profiler), against eager's
(torch.var_mean, ATen's reduction kernels) and a copy of the input (the memory ceiling). One process; each
setting compiles afresh (kiln.reset, the graph cache off).
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("KILN_GRAPH_CACHE", "0")

import torch  # noqa: E402

SHAPES = [(64, 64, 112, 112), (64, 256, 56, 56), (64, 512, 28, 28), (64, 1024, 14, 14)]


def kernel_us(call, device: str, calls: int = 20) -> tuple[float, list]:
    """Microseconds of GPU kernels per call, and the kernels (name, us per call), over `calls` calls (on a CPU,
    for a dry run of this script: the ops' own CPU time)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device == "cuda"
    for _ in range(3):
        call()
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            call()
        if cuda:
            torch.cuda.synchronize()
    kernels = [(event.key, (event.self_device_time_total if cuda else event.self_cpu_time_total) / calls)
               for event in prof.key_averages()
               if (event.self_device_time_total if cuda else event.self_cpu_time_total) > 0]
    return sum(us for _, us in kernels), sorted(kernels, key=lambda item: -item[1])


def main(argv=None) -> None:
    import kiln

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", default="default;split_outer_target_programs=4096;welford_compensation=0;"
                        "split_outer_target_programs=4096,welford_compensation=0",
                        help="kiln config settings to compare, ';' between settings")
    parser.add_argument("--device", default="cuda", help="cuda (a CPU: a dry run at a small shape)")
    parser.add_argument("--out", default=None, help="also write the table to DIR/outer_reduction_probe.md")
    args = parser.parse_args(argv)
    programs = {
        "var_mean": lambda x: torch.var_mean(x, dim=(0, 2, 3), correction=0),
        "sum": lambda x: x.sum(dim=(0, 2, 3), dtype=torch.float32),
    }
    cuda = args.device == "cuda"
    settings = [setting.strip() for setting in args.settings.split(";") if setting.strip()]
    lines = [f"device: {torch.cuda.get_device_name() if cuda else 'cpu'}; torch {torch.__version__}; kiln commit "
             f"{os.environ.get('KILN_GIT_COMMIT', 'unknown')}", "",
             "| shape (channels-last bf16) | program | eager us | copy us | " +
             " | ".join(f"kiln us, {setting}" for setting in settings) + " |",
             "|---|---|---|---|" + "---|" * len(settings)]
    for shape in SHAPES if cuda else [(2, 8, 6, 6)]:
        x = torch.randn(shape, device=args.device, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
        copy_us, _ = kernel_us(lambda: x.clone(), args.device)
        for name, program in programs.items():
            eager_us, _ = kernel_us(lambda: program(x), args.device)
            expected = program(x)
            cells = []
            for setting in settings:
                kiln.reset()
                options = {} if setting == "default" else {
                    name: int(value) for name, value in (item.split("=") for item in setting.split(","))}
                with torch.no_grad(), kiln.config.patch(**options):
                    compiled = kiln.compile(program)
                    got = compiled(x)
                    for value, want in zip(torch.utils._pytree.tree_leaves(got),
                                           torch.utils._pytree.tree_leaves(expected)):
                        torch.testing.assert_close(value.float(), want.float(), rtol=2e-3, atol=2e-3)
                    us, kernels = kernel_us(lambda: compiled(x), args.device)
                cells.append(f"{us:.1f}")
                print(f"{shape} {name} {setting}: {us:.1f} us; " +
                      ", ".join(f"{kernel[:40]} {k_us:.1f}" for kernel, k_us in kernels[:4]), flush=True)
            lines.append(f"| {'x'.join(map(str, shape))} | {name} | {eager_us:.1f} | {copy_us:.1f} | "
                         + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "outer_reduction_probe.md"), "w") as handle:
            handle.write(table + "\n")


if __name__ == "__main__":
    main()
