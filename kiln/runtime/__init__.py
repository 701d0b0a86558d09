"""kiln/runtime: loading generated modules, the kernel cache, (later) autotuning and CUDA graphs."""
