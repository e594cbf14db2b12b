"""The paged-KV engine: block manager, KV pool, scheduler, model runner, KVCacheEngine."""
