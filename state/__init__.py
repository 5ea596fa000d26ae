"""The domain and its storage: sessions, workflows, the FSM, the migrator, the stores,
the cache and the lock. Nothing in here imports Celery. ``state/README.md`` maps the rooms
(``documents``, ``storage``, ``sessions``, ``turns``, ``workflows``, ``recovery``) and
the path of a turn through them."""
