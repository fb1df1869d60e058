"""Keys with names and rules: who may call which model, how often and how much (policy.py), kept hashed in
the shared state store with each key's rate levels, budget and usage (ring.py), and what a request's key
allows and counts on its way through the edge (limits.py)."""
