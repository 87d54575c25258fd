"""The simulator's calibration tooling, kept out of the installed package (it reads the real H200
runs under tests/data): the real runs (realruns), the engine steps recorded inside vLLM (steps),
their replay through the simulator's engine on a virtual clock (replay), the profile fit
(`python -m sim_calibration.fit`) and the offline timing table of docs/simulator.md
(`python -m sim_calibration.offline`). Run from the repository root."""
