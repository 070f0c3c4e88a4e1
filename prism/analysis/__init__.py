"""What the records say: jobs, DP/PP pair types, step timelines and the diagnoses.

Pure functions and estimators over validated columns; no I/O beyond what they are handed, so the
offline replay and the daemon run the same analysis.
"""
