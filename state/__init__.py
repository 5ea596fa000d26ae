"""The domain and its storage: sessions, workflows, the FSM, the migrator, the store,
the cache and the lock. Nothing in here imports Celery."""
