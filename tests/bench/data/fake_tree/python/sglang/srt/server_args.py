# Stands in for a patched v0.5.9 tree: the ServerArgs fields the benchmark's configs name
# (bench.run.server.check_tree looks for speculative_disable_batch_size, bench.cli for the rest).
speculative_algorithm = None
speculative_num_steps = None
speculative_eagle_topk = None
speculative_num_draft_tokens = None
speculative_disable_batch_size = None
speculative_enable_batch_size = None
