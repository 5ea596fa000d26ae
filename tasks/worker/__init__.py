"""What runs inside a Celery worker (and beat). The task modules Celery imports, the
base class and message guard they rely on, the per-process runtime and start checks are
kept together so that nothing an app imports to send work pulls in the code that does
it, and so that the one launcher of real ``celery -A tasks`` processes sits next to the
code those processes run."""
