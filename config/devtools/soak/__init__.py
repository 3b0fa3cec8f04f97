"""A fault-injection soak: real clusters, live learner traffic, real faults, then checks."""
