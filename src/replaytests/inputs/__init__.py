"""What a run is given: options, the contract and its gates, the cells, the CPU instruction set, the
platform, input integrity, banks, rollout dumps and conversations."""
