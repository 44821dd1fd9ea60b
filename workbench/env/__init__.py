"""The machine under the workbench: what is here (probe), getting Transformer Engine onto it (install),
why it does not work (doctor), and importing it safely (te). Runs, sweeps and benches read it; it reads
nothing of theirs."""
