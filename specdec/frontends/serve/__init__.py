"""`specdec serve`: an OpenAI-compatible HTTP server with continuous batching (app.py: the
routes and wire format; scheduler.py: slots, queue and the batched step loop; metrics.py:
the Prometheus counters)."""
