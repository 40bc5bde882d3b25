"""`ccbench trace`: capture, build, show, convert, replay and check collective traces."""
