speculative_disable_batch_size = None  # the patch marker bench.server.check_tree looks for
