"""`ccbench advise`: options ranked from measured parts, and the replays that check them."""
