"""Training jobs: their specs, where they go (placement), and who holds them (soft leases)."""
