from gpufleet.cli.entry import run

run()
