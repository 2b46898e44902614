"""horovod.common on Conflux: util (build queries), exceptions and process_sets, under Horovod's
module paths."""
