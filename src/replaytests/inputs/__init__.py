"""What a run is given: options, the contract and its gates, the CPU instruction set, the
environment and platform, input integrity, banks and freezing."""
