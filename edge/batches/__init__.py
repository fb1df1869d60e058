"""The OpenAI Batch API, run by the edge itself: uploaded files (files.py), the lines of a batch and its
output (lines.py), the batches' records in the shared state store (records.py, batches.py), and the runner
that sends each line through the edge's own routes at the lowest priority (runner.py, inprocess.py)."""
