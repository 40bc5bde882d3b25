"""ccbench collectives: communicator, ring schedules and one module per variant."""
