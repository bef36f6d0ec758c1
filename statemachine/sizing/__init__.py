"""What a model needs on a GPU, term by term, and how each engine lays out its KV cache; a
reservation beside the model's estimate and its measured footprint; what a failed start
says about its budget.

It must not import the ledger, the flags, planning, the lifecycle or the answers: only
the engines.
"""
