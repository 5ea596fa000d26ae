"""Getting tasks onto the broker. Clients and workers both enqueue, through the engines'
``Dispatcher`` protocol; the Celery implementation of it, the direct publisher that
skips ``send_task``'s per-message cost and the kombu transport it publishes through live
here so that the one path a message takes to the broker has one home, whoever sends it."""
